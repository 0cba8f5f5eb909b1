"""All-gather + matmul: C = all_gather(A_shard) @ B, the column-parallel linear of sequence parallelism.

A is row-sharded: rank r holds rows [r*Ms, (r+1)*Ms) of A [M, K] (Ms = M / W); B [K, N] (or a list of
Bs sharing one gather) is replicated; every rank returns C [M, N] (and the gathered A if asked).
Numbered variants of one op, from the unfused reference to one kernel (all correct before timed):

0 nccl                  NCCL all-gather into A, then torch.matmul per B (the reference).
1 naive_remote          my shard -> my symmetric buffer, barrier kernel, then ONE GEMM kernel whose A tiles
                        are loaded straight from the owner's buffer through peer pointers (no staging, no
                        reuse: every column block re-reads its rows over NVLink), exit barrier kernel.
2 gather_then_gemm      symmcoll.all_gather (the dispatcher's fastest), then the persistent GEMM.
2b gather_then_cublas   the same with torch.matmul (cuBLAS), which wins on small problems.
3 copy_engine_producer  my shard -> my buffer, barrier; a side stream pulls each peer's shard with the copy
                        engine, chunk by chunk, and marks each chunk ready by copying this call's epoch
                        into its flag; meanwhile the persistent GEMM computes my own rows (read from my
                        input) and then each peer's rows as their flags arrive; join, exit barrier.
4 fused                 ONE kernel, no side stream: programs [0, P) are producers, the rest consumers.
                        Chunks (BM rows of a shard) are numbered over all shards and dealt round the
                        producers the same way on every rank (_first_block). Producer p copies its
                        chunks of my shard into my buffer, meets program p of every peer in a barrier,
                        pulls its chunks of every peer's shard into the gathered A (peers in the order
                        rank+1, rank+2, ...; 64 KB of loads in flight a step), releasing a flag per
                        chunk, and meets program p of every peer again at the end (nobody refills its
                        buffer while a peer still reads it). Consumers run the persistent GEMM shard by
                        shard, own shard first, then rank+1's, ... (groups of GROUP_M row blocks never
                        straddle two shards), waiting (bounded) on each chunk's flag. Consumers wait only
                        on producers, which have lower program ids: they are scheduled first on the GPU
                        and run first under the interpreter.

Flags are int64 per chunk of BM rows, tagged with the call's epoch (a per-plan device counter), so
nothing is ever reset and graph replays need no host work. Chunks never straddle two ranks' rows.
Shards larger than the workspace buffer go in pieces of rows (every shard's rows [j*P, (j+1)*P)).
A group of one has nobody to gather from: variants 1, 3 and 4 run their kernel alone (no producers,
barriers or copies; host tensor descriptors; C stored by descriptor where the config says so), and
its tiles write the gathered A after their K-loops (tile (m, n) copies its 1/num_n slice of row block
m's columns) -- unless the caller does not want the gathered A (``return_gathered=False``, torch's
``return_A=False``): then the kernel's consumers are the GEMM core's own persistent loop
(``ALONE_CORE``: gemm_kernel.persistent_matmul with gemm.core_launch's config, split plan, grid and
descriptors; no epoch, no flag, no per-tile source choice), so one rank runs at the core's speed, and
naive_remote pulls no peer rows after its GEMM. (A copy kernel on a side stream beside the GEMM,
instead of the tiles' copies, ran 1.08-1.14x cuBLAS against the tiles' 1.06-1.08x on an H100:
2026-11-27-agmm-side-copy-h100.)

This file is the op: its outputs, the unfused variants, the host side of the kernel variants (pieces of
rows, flags and epochs, the copy-engine gather on a side stream, the kernel's launch), the op's
declaration and its compile checks. The kernels are in all_gather_matmul_kernel.py; the shape rule, the
dispatch key, "auto"'s default and the fused kernel's producer count in all_gather_matmul_rules.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton

from .. import debug_switches, ops
from .. import plan as planner
from ..comm.common import on_side, side_stream
from ..language import EPOCH_SLOTS
from ..launcher import launch
from ..memory.persistent_state import persistent
from ..plan import Algorithm, Plan
from . import gemm
from .all_gather_matmul_kernel import COPY_ENGINE, PEER_BUFFERS, PRODUCERS, ag_matmul_kernel, bump_kernel
from .all_gather_matmul_rules import FUSED_PRODUCERS, choose_default, dispatch_size, fused_producers, shape_rule
from .gemm_tables import gemm_config

OP = "all_gather_matmul"


def _outputs(plan: Plan, a: torch.Tensor, bs, gathered: bool):
    rows = plan.world * a.shape[0]
    outs = [torch.empty((rows, b.shape[1]), dtype=a.dtype, device=a.device) for b in bs]
    g = torch.empty((rows, a.shape[1]), dtype=a.dtype, device=a.device) if gathered else None
    return outs, g


def _wants_gathered(plan: Plan) -> bool:
    """Whether the caller takes the gathered A (the op's return_gathered): where not, a variant may skip
    making it (what it returns in its place is dropped by all_gather_matmul_impl)."""
    return dict(plan.request.options).get("return_gathered", True)


def _nccl(plan: Plan, a, _out, *bs):
    outs, _ = _outputs(plan, a, bs, False)
    g = torch.empty((plan.world * a.shape[0], a.shape[1]), dtype=a.dtype, device=a.device)
    dist.all_gather_into_tensor(g, a, group=plan.group)
    for b, out in zip(bs, outs):
        torch.matmul(g, b, out=out)
    return outs, g


def _gather(plan: Plan, a: torch.Tensor) -> torch.Tensor:
    """symmcoll's all-gather, carrying this call's descriptor (peers compare B's shape too); a group of
    one whose caller wants no gathered A reads A itself."""
    if plan.world == 1 and not _wants_gathered(plan):
        return a
    return planner.inner(plan, "all_gather", a).execute(a)


def _gather_then_gemm(plan: Plan, a, _out, *bs):
    g = _gather(plan, a)
    return [gemm.matmul(g, b) for b in bs], g


def _gather_then_cublas(plan: Plan, a, _out, *bs):
    g = _gather(plan, a)
    return [torch.matmul(g, b) for b in bs], g


def _config(plan: Plan, a: torch.Tensor, b: torch.Tensor):
    """The GEMM core's tile config for the whole product [W * rows, K] @ [K, N] (no split: a tile is
    finished in one program)."""
    return gemm_config(plan.world * a.shape[0], b.shape[1], a.shape[1], a.dtype, plan.ws.device, split=False)


def _piece_rows(plan: Plan, a: torch.Tensor, block_m: int) -> int:
    """Rows of every shard per launch: a piece of my shard must fit the workspace buffer."""
    fit = plan.ws.buffer_bytes // (a.shape[1] * a.element_size())
    if fit < 1:
        raise ValueError(f"a_shard rows of {a.shape[1] * a.element_size()} bytes do not fit the workspace buffer")
    return min(a.shape[0], fit // block_m * block_m if fit >= block_m else fit)


def _state(plan: Plan, chunks: int, device: torch.device):
    """This plan's int64 chunk flags, int32 epoch table and int64 ready table (device memory, made once
    per plan: a captured graph replays with the same tensors; epoch-tagged, so nothing is ever
    reset)."""
    if plan.cache.get("chunks", -1) < chunks:
        plan.cache["chunks"] = chunks
        plan.cache["flags"], plan.cache["epoch"], plan.cache["ready"] = persistent(device, lambda: (
            torch.zeros(chunks, dtype=torch.int64, device=device),
            torch.zeros(EPOCH_SLOTS.value, dtype=torch.int32, device=device),
            torch.zeros(chunks, dtype=torch.int64, device=device)))
    return plan.cache["flags"], plan.cache["epoch"], plan.cache["ready"]


# Columns of a producer's step when it issues the next step's loads before storing one (_move_rows).
AHEAD_COLS = 128


def _slice_cols(config, k: int, n: int) -> int:
    """Columns a tile copies at once after its K-loop (a group of one): its whole slice of
    ceil(K / column blocks) columns where at most 256 bytes a thread hold it, so the slice's loads are
    all in flight together (one round trip)."""
    width = triton.cdiv(k, triton.cdiv(n, config.block_n))
    cap = max(64, 128 * 32 * config.num_warps // config.block_m)
    return min(triton.next_power_of_2(max(64, width)), cap, 512)


def _copy_cols(alone: bool, source: int, on_gpu: bool, ahead: bool) -> int:
    """Columns of a [BM, COPY_COLS] copy step: alone, the own copy's (64); the fused kernel's producers
    pull 256 a step one step at a time (64 KB of loads in flight at BM 128; 128 -- 32 KB -- measured 7-16
    GB/s an SM on 4x H100, benchmarks/NOTES.md), AHEAD_COLS a step with the next step's loads issued
    before a step's stores (two [BM, 256] steps held at once spilled 548 bytes at 255 registers on
    sm_90); the other variants run no producer (their dead producer code keeps the old 128)."""
    if not on_gpu:
        return 32
    if source == PRODUCERS.value and not alone:
        return AHEAD_COLS if ahead else 256
    return 64 if alone else 128


def _run_kernel(plan: Plan, a, bs, source: int, producers: int = 0):
    """naive_remote, copy_engine_producer and fused: the first B through the variant's kernel (pieces of
    rows if the shard exceeds the buffer), the gathered A completed, further Bs by the GEMM core over
    it. A group of one has nobody to gather from: the kernel alone (no producers, barriers or copies)."""
    ws, world, rank = plan.ws, plan.world, plan.rank
    rows_total, K = a.shape
    alone = world == 1
    wanted = _wants_gathered(plan)
    # Alone and unwanted, there is no gathered A: A itself stands in for it (never written: COPY_A).
    outs, g = _outputs(plan, a, bs, wanted or not alone)
    if g is None:
        g = a
    if rows_total == 0 or K == 0:  # nothing to gather or multiply (the plan's handshake met the peers)
        return [out.zero_() for out in outs], g
    b, b_t = gemm.b_layout(bs[0], K)  # a transposed view of a row-major W [N, K] is read as it is
    if alone and not wanted and not debug_switches.AGMM_ALONE_OWN_LOOP:
        _run_alone_core(plan, a, b, b_t, outs[0], source)
        return _further_bs(g, bs, outs)
    config = _config(plan, a, bs[0])
    piece = rows_total if alone else _piece_rows(plan, a, config.block_m)  # alone: no buffer is used
    if alone:
        producers = 0
    elif producers and ws.device.type == "cuda":  # (every rank computes the same count: same grid)
        producers = fused_producers(gemm.programs_for(config, ws.device), world * triton.cdiv(piece, config.block_m),
                                    bs[0].shape[1], a.element_size())
    flags, epoch, ready = _state(plan, world * triton.cdiv(piece, config.block_m), a.device)
    on_gpu = ws.device.type == "cuda"  # (meta tensors when the compile checks record the launches)
    tma = source != PEER_BUFFERS.value and gemm.use_tma(ws.device.type, a, g, b)
    consumers = max(1, gemm.programs_for(config, ws.device) - producers)
    ahead = producers > 0 and not debug_switches.AGMM_PULL_SINGLE
    copies = source in (PEER_BUFFERS.value, COPY_ENGINE.value) and not alone
    for start in range(0, rows_total, piece):
        rows = min(piece, rows_total - start)
        a_piece = a[start:start + rows]
        if copies:
            ws.buffer[: rows * K * a.element_size()].view(a.dtype).view(rows, K).copy_(a_piece)
            plan.barrier()
        if source == COPY_ENGINE.value and not alone:
            launch(bump_kernel, (1,), (epoch, ready, plan.desc, ready.numel()), dict(BLOCK=256, num_warps=1))
            _copy_engine_gather(plan, a, g, flags, ready, start, rows, config.block_m)
        host_desc = alone and tma
        a_desc, b_desc = gemm.host_descriptors(config, a_piece, b, b_t) if host_desc else (a_piece, b)
        # Alone, C's rows are one shard's: its descriptor's clipping is the row limit (with peers a
        # shard's short last block would write into the next shard's rows).
        tma_store = host_desc and config.tma_store
        c = outs[0][start:]
        c_arg = gemm.c_descriptor(c, rows, config) if tma_store else c
        launch(ag_matmul_kernel, (producers + consumers,),
               (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, flags, epoch, a_piece, b, c_arg, g[start:],
                rows, bs[0].shape[1], K, rows_total, a.stride(0), b.stride(0), outs[0].stride(0), g.stride(0), a_desc,
                b_desc, None, 0, 0, 0, None, None),  # (no ALONE_CORE)
               dict(WORLD=world, SOURCE=source, N_PRODUCERS=producers, CONSUMERS=consumers, B_T=b_t, TMA=tma,
                    HOST_DESC=host_desc, PRECISION=gemm.precision(a.dtype),
                    COPY_COLS=_copy_cols(alone, source, on_gpu, ahead), TMA_STORE=tma_store, C_HALVES=config.c_halves,
                    SLICE_COLS=_slice_cols(config, K, bs[0].shape[1]) if on_gpu else 32, COPY_A=wanted,
                    PULL_AHEAD=ahead, **config.meta()))
        if source == COPY_ENGINE.value and not alone and a.is_cuda:
            torch.cuda.current_stream().wait_stream(plan.cache["side_stream"])
        if source == PEER_BUFFERS.value and (wanted or len(bs) > 1):  # the GEMM read peers' rows in place
            for k in range(1, world):
                owner = (rank + k) % world
                src = ws.peer_buffer(owner)[: rows * K * a.element_size()].view(a.dtype).view(rows, K)
                g[owner * rows_total + start:][:rows].copy_(src)
        if copies:
            plan.barrier()
    # Alone, the kernel's tiles copy A into the gathered A as they go (a copy by the copy engine on a
    # side stream during the GEMM slowed it by 6-13% at M = 16384 on an H200, run of 2026-11-24 06:54).
    if source != PRODUCERS.value and not alone and (wanted or len(bs) > 1):
        g[rank * rows_total:(rank + 1) * rows_total].copy_(a)
    return _further_bs(g, bs, outs)


def _further_bs(g, bs, outs):
    """(outs, g) with the products of the Bs after the first: the GEMM core over the gathered A ``g``."""
    for b2, out2 in zip(bs[1:], outs[1:]):
        gemm.matmul(g, b2, out=out2)
    return outs, g


def _run_alone_core(plan: Plan, a, b, b_t: bool, out, source: int) -> None:
    """A group of one that wants no gathered A: the variant's kernel runs the GEMM core's persistent loop
    (ALONE_CORE) with everything the core's own launch would have (gemm.core_launch: the GEMM table's
    config for the shape, split tiles included -- nothing waits on a tile here --, its grid, host
    descriptors, C by descriptor where the config says so), so at one rank the fused op runs at the
    core's speed; SYMMCOLL_AGMM_ALONE_OWN_LOOP=1 (debug_switches) runs the kernel's own consumer loop
    instead, to compare the two in one GPU run."""
    M, K = a.shape
    N = out.shape[1]
    if N == 0:
        return
    core = gemm.core_launch(a, b, b_t, out, gemm_config(M, N, K, a.dtype, a.device))  # (as gemm.matmul asks)
    flags, epoch, _ = _state(plan, 1, a.device)  # (never read: the core's loop waits on nothing)
    ws = plan.ws
    launch(ag_matmul_kernel, (core.grid,),
           (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, flags, epoch, a, b, core.c, a, M, N, K, M, *core.strides,
            a.stride(0), core.a, core.b, core.b2, core.whole_tiles, core.sharing, core.slots, core.partials,
            core.counters),
           dict(WORLD=1, SOURCE=source, N_PRODUCERS=0, CONSUMERS=core.grid, COPY_COLS=64, COPY_A=False,
                ALONE_CORE=True, **core.meta))
    gemm.launch_split_sum(core, out)  # (a config that sums its split tiles apart: the second kernel)


def _copy_engine_gather(plan: Plan, a, g, flags, ready, start: int, rows: int, block_m: int) -> None:
    """On a side stream: each peer's piece with the copy engine, then its chunks' flags (entries of the
    ready table copied into them: a small copy after the data copy on the same stream, so the flags
    say the rows are there). No SM is needed, so the persistent GEMM may occupy them all."""
    ws, world, rank = plan.ws, plan.world, plan.rank
    blocks = triton.cdiv(rows, block_m)
    K = a.shape[1]
    nbytes = rows * K * a.element_size()
    side = side_stream(plan, a.device)  # None on CPU: in order
    with on_side(side, torch.cuda.current_stream(a.device) if side is not None else None):
        for k in range(1, world):
            owner = (rank + k) % world
            g[owner * a.shape[0] + start:][:rows].copy_(ws.peer_buffer(owner)[:nbytes].view(a.dtype).view(rows, K))
            flags[owner * blocks:(owner + 1) * blocks].copy_(ready[:blocks])


def _naive_remote(plan, a, _out, *bs):
    return _run_kernel(plan, a, bs, PEER_BUFFERS.value)


def _copy_engine_producer(plan, a, _out, *bs):
    return _run_kernel(plan, a, bs, COPY_ENGINE.value)


def _fused(plan, a, _out, *bs):
    return _run_kernel(plan, a, bs, PRODUCERS.value, producers=FUSED_PRODUCERS[plan.ws.device.type])


def all_gather_matmul_impl(a_shard, bs, group_name: str, algorithm: str, return_gathered: bool = True):
    bs = tuple(bs)
    names = ("b",) if len(bs) == 1 else tuple(f"b[{i}]" for i in range(len(bs)))
    outs, gathered = planner.resolve(OP, a_shard, ops.resolve_group(group_name), algorithm, others=bs,
                                     options=(("return_gathered", bool(return_gathered)),),
                                     other_names=names).execute(a_shard, others=bs)
    return list(outs), gathered if return_gathered else None


def _fake(a_shard, bs, group_name, algorithm, return_gathered=True):
    rows = ops.world_size(group_name) * a_shard.shape[0]
    gathered = a_shard.new_empty((rows, a_shard.shape[1])) if return_gathered else None
    return [a_shard.new_empty((rows, b.shape[1])) for b in bs], gathered


# "auto" until `symmcoll tune` has measured this machine: our all-gather and cuBLAS (never slower than
# that pair, by construction; the single-kernel variants need multi-GPU measurements to be chosen).
SPEC = ops.declare(ops.OpSpec(
    OP, "(Tensor a_shard, Tensor[] bs, str group_name, str algorithm, bool return_gathered=True) -> (Tensor[], Tensor?)", all_gather_matmul_impl,
    _fake, inputs=("a_shard", "b"), shape_rule=shape_rule, default=choose_default, dispatch_size=dispatch_size,
    transposed=("b",),
    algorithms=tuple(Algorithm(OP, name, code, "all_gather_matmul", run, summary) for name, run, code, summary in (
        ("nccl", _nccl, 60, "NCCL all-gather, then torch.matmul"),
        ("naive_remote", _naive_remote, 61, "one GEMM kernel reading A tiles from the owners' buffers"),
        ("gather_then_gemm", _gather_then_gemm, 62, "symmcoll all-gather, then the persistent GEMM"),
        ("gather_then_cublas", _gather_then_cublas, 65, "symmcoll all-gather, then torch.matmul (cuBLAS)"),
        ("copy_engine_producer", _copy_engine_producer, 63, "copy-engine gather with chunk flags + persistent GEMM"),
        ("fused", _fused, 64, "one kernel: producer programs pull chunks, consumer programs compute")))))


def compile_cases(make_workspace):
    """The kernels' launches on meta tensors (tests/test_compile.py compiles them for sm_90)."""
    def case(world, rank, name, dtype, rows, k, n, b_t=False, gathered=True):
        def thunk():
            ws = make_workspace(world, rank)
            request = planner.Request(OP, (rows, k), dtype, torch.device("cuda"), others=(((k, n), dtype, None),),
                                      options=(("return_gathered", gathered),))
            p = Plan(request, "kernel", planner.algorithms(OP)[name], None, world, rank, ws, None, 3, None)
            a = torch.empty((rows, k), dtype=dtype, device="meta")
            b = (torch.empty((n, k), dtype=dtype, device="meta").t() if b_t
                 else torch.empty((k, n), dtype=dtype, device="meta"))
            planner.algorithms(OP)[name].run(p, a, None, b)
        return f"{OP}.{name} ws{world} {dtype} {rows}x{k}x{n}{' B^T' if b_t else ''}{'' if gathered else ' C'}", thunk
    return [*(case(w, r, name, dtype, rows, k, n)
              for name in ("naive_remote", "copy_engine_producer", "fused")
              for w, r, dtype, rows, k, n in ((2, 1, torch.bfloat16, 8192, 8192, 8192),
                                              (4, 0, torch.float16, 1000, 4096, 3584),
                                              (8, 3, torch.bfloat16, 100, 96, 200),
                                              (1, 0, torch.bfloat16, 4096, 8192, 8192))),
            case(2, 0, "fused", torch.bfloat16, 1024, 8192, 1280, b_t=True),
            case(1, 0, "fused", torch.bfloat16, 2048, 8192, 1280, b_t=True),  # host descriptors of A and W
            # alone: C's host descriptor (the table's 128x128/f/t; the tile loop stays unflattened), the
            # untuned rule's 64x64x128 tiles at 1024^3
            case(1, 0, "fused", torch.bfloat16, 16344, 1024, 8000),
            case(1, 0, "copy_engine_producer", torch.bfloat16, 1024, 1024, 1024),
            # alone, C only: the GEMM core's persistent loop (ALONE_CORE), flattened at 1024^3, split tiles at
            # 16384x8192x8192 (the tables' configs), pointer loads where B's rows are not 16-byte aligned
            case(1, 0, "fused", torch.bfloat16, 1024, 1024, 1024, gathered=False),
            case(1, 0, "copy_engine_producer", torch.bfloat16, 16384, 8192, 8192, gathered=False),
            case(1, 0, "naive_remote", torch.float16, 100, 96, 203, gathered=False)]
