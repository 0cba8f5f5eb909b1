"""matmul + reduce-scatter: the end of a row-parallel linear layer with sequence parallelism.

Every rank holds A [M, K] and B [K, N] (its K-slice of the layer); rank r returns rows
[r * M/W, (r+1) * M/W) of sum over ranks of A @ B, shape [M/W, N].

fused (one persistent kernel; one launch per piece)
    Row shard s of the product belongs to rank s. Each program computes its tiles shard by shard in
    the order rank+1, rank+2, ..., rank (peers' shards first, its own last), and every finished peer
    tile travels at once::

        tile of shard s != r:  acc --narrow, NVLink stores--> stage_s[phase][slot(r)][tile]
                               flag_s[phase][r][tile] = (epoch << 32) | desc     (release, system scope)
        tile of my shard:      acc (fp32, registers) + stage_r[phase][slot(src)][tile] for src in rank
                               order, each after flag_r[phase][src][tile] == (epoch, desc) (acquire)
                               --narrow--> out

    By the time a program reaches its own shard, its peers have been computing (and sending) tiles of
    it for one to W-1 shards' worth of GEMM: the communication hides under the remaining GEMM.
    Traffic: (W-1)/W of the product per rank, remote stores in the output dtype (the partial rounded
    once, as torch.matmul's output is); the owner accumulates in fp32 in a fixed order (its own
    partial, then the peers' in rank order) and rounds once.

    Which program computes a tile is the same on every rank: tile j of shard s (in the shard's
    grouped order, gemm_kernel.grouped_tile) goes to program (s * tiles + j) % P. So program p waits
    only on program p of its peers (graph-safe with no co-residency assumption; the interpreter, which
    runs programs one by one, cannot deadlock), and over all shards each program gets an equal share.

    Stage slots alternate between two phases by launch epoch (a per-rank device counter,
    language.polls.launch_epoch): a rank finishes launch e only with every peer's launch-e tiles,
    which a peer sends only after it finished launch e-1, so a rank is at most one launch ahead and
    a phase's slots are read before anybody writes them again. Flags carry (epoch, desc): never reset
    (graph replays need no host work), and a flag of this epoch naming another call is reported as a
    mismatch. Products larger than a slot go in pieces of whole tiles (one launch each).

fused, one pass over B (shards shorter than a tile: decode; ``tiling`` decides)
    Per-shard tiles make every shard's row blocks sweep all of B: with M = 16-128 rows on 4 ranks B
    (117 MB a rank at 8192 x 7168) came from DRAM ~W times. Where a shard is shorter than the tile
    of a plain GEMM over all W shards' rows and that GEMM has fewer row blocks than the shards
    together, the kernel tiles the whole [W * rows_per_shard, N] grid instead, a column's row blocks
    on neighbouring programs (one DRAM read of B's column block)::

        tile j (rows of owners o1..o2):  acc --rows of o, narrow--> stage_o[phase][slot(r)][j]
                                         flag_o[phase][r][j] = (epoch << 32) | desc  for each o != r
                                         if r in o1..o2: acc + stage_r[phase][slot(src)][j] (my rows)
                                         after flag_r[phase][src][j], src in rank order --> out

    The same slots, flags and order of the sum as per shard: an owner hears once per (source, tile)
    for every tile holding its rows, and every tile is computed by program j % P on every rank. A
    program adds right after it sends (its peers compute the same tile at the same time): at decode
    there is one wave of tiles, so nothing would hide the exchange anyway. A launch takes whole
    columns of row blocks, so every owner waits on every peer in every launch (the phase argument
    above). Shards of at least a tile's rows (large M) keep the per-shard tiles.

nccl / unfused
    torch.matmul, then the process group's reduce-scatter (NCCL) / symmcoll.reduce_scatter ("auto").

chunked (matmul_reduce_scatter_chunked.py: the protocol and why it is safe)
    cuBLAS on one peer's row chunk at a time (peers first, own chunk last) into a double-buffered slot
    of the shared buffer; after a barrier kernel the chunk's owner pulls it with the copy engine on a
    side stream while the next chunk's GEMM runs; then one kernel sums the W partials in fp32, rank
    order. torch's fused_matmul_reduce_scatter's idea on one GEMM stream, one barrier a step.

This file is the op: its regions, how the fused kernel cuts the product (``tiling``, ``pieces``) and
launches it (``run_tiles``, which matmul_all_reduce's two_shot uses too), the variants, the shape rule,
the op's declaration and its compile checks. The kernel is in matmul_reduce_scatter_kernel.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import triton

from .. import debug_switches, ops, plan
from ..language import EPOCH_SLOTS, MAX_WORLD
from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..plan import Algorithm
from . import matmul_reduce_scatter_chunked as chunked
from .gemm import b_layout, core_measured_faster, host_descriptors, precision, programs_for, use_tma
from .gemm_configs import GemmConfig
from .gemm_tables import gemm_config
from .matmul_reduce_scatter_kernel import STAGE_PHASES, matmul_reduce_scatter_kernel

OP = "matmul_reduce_scatter"
# Tiles per piece at most (the flag table's length per (phase, source)).
MAX_TILES = {"cuda": 8192, "cpu": 64}
# CPU slots are small, so that the CPU tests run the multi-piece path.
CPU_SLOT_BYTES = 8 << 10


def slot_bytes(device_type: str, buffer_bytes: int, world: int) -> int:
    """Bytes of one (phase, source) slot: a quarter of the shared buffer's size over W-1 sources on GPU
    (two phases: the stage region is half the buffer's size)."""
    if device_type != "cuda":
        return CPU_SLOT_BYTES
    return buffer_bytes // 4 // max(1, world - 1) // 4096 * 4096


def flag_bytes(device_type: str) -> int:
    return STAGE_PHASES.value * MAX_WORLD.value * MAX_TILES[device_type] * 8


STAGE = declare(RegionSpec(
    "matmul_reduce_scatter.stage", "fused.matmul_reduce_scatter",
    lambda g: flag_bytes(g.device_type) + STAGE_PHASES.value * max(1, g.world_size - 1)
    * slot_bytes(g.device_type, g.buffer_bytes, g.world_size),
    "int64 tile flags [phase][source][tile], then tile slots [phase][source slot][tile]: rank r writes only "
    "its slot and flags of phase epoch % 2 in the owner's region; the owner reads a tile after its flag; a "
    "phase is written again two launches later, after every peer finished reading it (one launch ahead at "
    "most); flags are epoch-tagged and never reset"))
EPOCHS = declare(RegionSpec("matmul_reduce_scatter.epochs", "fused.matmul_reduce_scatter",
                            lambda g: EPOCH_SLOTS.value, "this rank's launch-epoch table (kernels only)",
                            symmetric=False))


@dataclass(frozen=True)
class Tiling:
    """How the fused kernel cuts the product: ``one_pass`` tiles over all shards' rows (``tiles`` of
    the whole [W * rows_per_shard, N] grid) or per shard (``tiles`` of each shard); ``per_piece`` tiles
    a launch (one pass: whole columns of row blocks, so every owner hears from every peer in every
    launch -- what keeps a rank at most one launch ahead); ``unit`` tiles a launch takes whole (one pass:
    a column of row blocks; per shard: 1)."""
    config: GemmConfig
    one_pass: bool
    tiles: int
    per_piece: int
    unit: int = 1


def tiling(rows_per_shard: int, n: int, k: int, dtype: torch.dtype, device: torch.device, world: int,
           slot: int, itemsize: int, max_tiles: int) -> Tiling:
    """Per-shard tiles (the table's config for a plain GEMM [rows_per_shard, W * N]) unless one pass
    over B pays: where a shard is shorter than the whole grid's tile (gemm_config of [W * rows_per_shard,
    N]) and that grid has fewer row blocks than the shards together -- each row block sweeps all of B,
    so per-shard tiles at decode read B W times (4x H100, 16 and 128 x 8192 x 7168 a rank: fused
    113/118 us against 57/56 unfused)."""
    shard = gemm_config(rows_per_shard, world * n, k, dtype, device, split=False)
    shard_per_piece = min(slot // (shard.block_m * shard.block_n * itemsize), max_tiles)
    per_shard = Tiling(shard, False, triton.cdiv(rows_per_shard, shard.block_m) * triton.cdiv(n, shard.block_n),
                       shard_per_piece)
    if world == 1:
        return per_shard
    whole = gemm_config(world * rows_per_shard, n, k, dtype, device, split=False)
    row_blocks = triton.cdiv(world * rows_per_shard, whole.block_m)
    whole_columns = min(slot // (whole.block_m * whole.block_n * itemsize), max_tiles) // row_blocks
    if (rows_per_shard < whole.block_m and row_blocks < world * triton.cdiv(rows_per_shard, shard.block_m)
            and whole_columns > 0):
        return Tiling(whole, True, row_blocks * triton.cdiv(n, whole.block_n), whole_columns * row_blocks, row_blocks)
    return per_shard


def pieces(cut: Tiling) -> list[tuple[int, int]]:
    """(first tile, tiles) of each launch: as few launches as the slots allow (``per_piece`` tiles at
    most), of equal size in whole ``unit``s. Filling each launch to the slot and leaving the rest to the
    last wasted whole waves: on 4 ranks at M = 8192 (512 tiles of 128x256 a shard, 341 a slot) 341 + 171
    tiles a shard took 11 + 6 waves of 132 programs where 256 + 256 take 8 + 8 (one wave is ~87 us of
    GEMM, 2048 tiles / 132 SMs in cuBLAS's 1344 us); at M = 16384, 341 x 3 + 1 took 11 x 3 + 1 = 34 waves,
    4 x 256 take 32. SYMMCOLL_MRS_GREEDY_PIECES=1 (debug_switches) gives the filled pieces back, to time
    both in one GPU run."""
    # (plain integer ceilings: triton.cdiv goes through triton's constexpr machinery, ~12 Python calls an
    # eager call of the op -- tests/test_host_overhead.py counts them)
    if cut.tiles <= cut.per_piece:
        return [(0, cut.tiles)] if cut.tiles else []
    if debug_switches.MRS_GREEDY_PIECES:
        size = cut.per_piece
    else:
        count = -(-cut.tiles // cut.per_piece)
        size = -(-(cut.tiles // cut.unit) // count) * cut.unit
    return [(first, min(size, cut.tiles - first)) for first in range(0, cut.tiles, size)]


def run_tiles(p: plan.Plan, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, rows_per_shard: int) -> torch.Tensor:
    """The fused kernel, piece by piece: ``out`` [rows_per_shard, N] gets this rank's shard of the sum
    (shards past M are empty; matmul_all_reduce uses a last shard cut short by M). ``b`` [K, N] row-major
    or a transposed view of a row-major W [N, K] (read as it is)."""
    ws, world = p.ws, p.world
    M, K = a.shape
    N = b.shape[1]
    b, b_t = b_layout(b, K)
    device_type = ws.device.type
    slot = slot_bytes(device_type, ws.buffer_bytes, world)
    cut = tiling(rows_per_shard, N, K, a.dtype, ws.device, world, slot, out.element_size(), MAX_TILES[device_type])
    cfg = cut.config
    region, epochs = ws.region(STAGE.name), ws.local_state(EPOCHS.name)
    tma = use_tma(device_type, a, b)
    a_arg, b_arg = host_descriptors(cfg, a, b, b_t) if tma else (a, b)
    meta = dict(WORLD=world, B_T=b_t, TMA=tma, HOST_DESC=tma, PRECISION=precision(a.dtype),
                SLOT_ELEMS=slot // out.element_size(), MAX_TILES=MAX_TILES[device_type],
                DATA_OFFSET=flag_bytes(device_type), ONE_PASS=cut.one_pass, **cfg.meta())
    # per shard: a launch's tiles are those of every shard (W x n); one pass: n of the whole grid
    shards_per_tile = 1 if cut.one_pass else world
    for first, n in pieces(cut):
        launch(matmul_reduce_scatter_kernel, (max(1, min(programs_for(cfg, a.device), shards_per_tile * n)),),
               (*ws.kernel_args, p.desc, region.ptrs_dev, epochs, a_arg, b_arg, out, M, N, K, a.stride(0), b.stride(0),
                out.stride(0), rows_per_shard, first, n), meta)
    return out


def _fused(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if out.numel() and a.shape[1]:
        return run_tiles(p, a, b, out, out.shape[0])
    return out.zero_()


def _nccl(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    partial = torch.matmul(a, b)
    # torch 2.13 renamed reduce_scatter_tensor (and warns on every call); older torch has only that.
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    reduce_scatter(out, partial, group=p.group)
    return out


def _unfused(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    partial = torch.matmul(a, b)
    return plan.inner(p, "reduce_scatter", partial).execute(partial, out)


def _chunked(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not (out.numel() and a.shape[1]):
        return out.zero_()
    units = chunked.cut(out.shape[0], b.shape[1] * a.element_size(), p.ws.device.type, p.ws.buffer_bytes)
    if units is None:  # a row of the product exceeds a slot (half the shared buffer): the same sum, unfused
        return _unfused(p, a, out, b)
    return chunked.run(p, a, b, out, units)


def check_operands(request: plan.Request) -> tuple[int, int, int]:
    """(M, N, K) of a matmul request ``a`` [M, K] @ ``b`` [K, N]; ValueError naming the argument."""
    a_shape = request.shape
    (b_shape, b_dtype, b_device), = request.others
    if len(a_shape) != 2:
        raise ValueError(f"a must be a 2-D [M, K] matrix, got shape {a_shape}")
    if len(b_shape) != 2:
        raise ValueError(f"b must be a 2-D [K, N] matrix, got shape {b_shape}")
    if a_shape[1] != b_shape[0]:
        raise ValueError(f"b.shape[0] must equal a.shape[1] (K): a has shape {a_shape}, b has shape {b_shape}")
    if request.dtype not in plan.REDUCTION_DTYPES:
        raise ValueError(f"a.dtype must be bf16, fp16 or fp32, got {request.dtype}")
    if b_dtype != request.dtype:
        raise ValueError(f"b.dtype must equal a.dtype ({request.dtype}), got {b_dtype}")
    if b_device != request.device:
        raise ValueError(f"b is on {b_device}, a on {request.device}: both must be on this rank's device")
    return a_shape[0], b_shape[1], a_shape[1]


# "auto" where the dispatch table has no rule of this op at this world size: torch.matmul +
# symmcoll.reduce_scatter. On 4x H100 (benchmarks/results/2026-11-27-multi-gpu-fix-h100x4, N = 8192,
# K = 28672 / 4) the fused kernel lost to it at every M: 2x at M = 16-128 (each rank's row shards
# read B once per shard: W reads of the weights), 1.2x at 512, 1.03x at 2048-16384. With one pass over B
# where shards are shorter than a tile (``tiling``; benchmarks/results/2026-11-27-rowpar-branches-h100x4/mrs)
# it still lost by 5-13%: 52.2 / 57.6 / 113.6 / 1778.5 us against 46.1 / 53.2 / 105.9 / 1696.0 at M = 16 /
# 128 / 512 / 8192. (The H200's dispatch table has rules of this op since 2026-11-28: chunked past M * N * K =
# 1024 x 8192 x 28672 at 4 ranks and 512 x 8192 x 28672 at 2, 17-22% / 4-7% ahead of unfused there,
# benchmarks/results/2026-11-28-fused-ws4-h200x4; this default is what a table without them falls back to.)
AUTO_DEFAULT = "unfused"


def choose_default(request: plan.Request, world: int) -> str:
    """What "auto" runs where the dispatch table has no rule of this op at this world size: AUTO_DEFAULT; on one
    rank the fused kernel (the product written in place: nothing to scatter) where the GPU's GEMM table measured
    the core faster than cuBLAS at this (M, N, K) (``gemm.core_measured_faster``), else unfused (cuBLAS, then the
    one-rank reduce-scatter's copy)."""
    if world == 1:
        m, n, k = check_operands(request)
        return "fused" if core_measured_faster(m, n, k, request.dtype, request.device) else "unfused"
    return AUTO_DEFAULT


def layer_size(request: plan.Request, world: int) -> int:
    """What the tuned dispatch table keys the row-parallel ops by: M * N * K of the whole layer (K summed
    over the ranks' slices), as the fused bench reports a shape and ``dispatch.rules_from_fused_rows`` writes
    its rules (by input bytes, a rule written at M x N x K was never found)."""
    m, n, k = check_operands(request)
    return m * n * k * world


def size_key(m: int, n: int, k: int) -> int:
    return (m << 42) ^ (n << 21) ^ k


def _shape_rule(request: plan.Request, world: int):
    m, n, k = check_operands(request)
    if m % world:
        raise ValueError(f"a.shape[0] (M = {m}) must be divisible by the world size {world}: rank r returns "
                         f"rows [r * M/W, (r+1) * M/W) of the sum")
    return (m // world, n), size_key(m, n, k)


def matmul_reduce_scatter_impl(a: torch.Tensor, b: torch.Tensor, group_name: str, algorithm: str) -> torch.Tensor:
    return plan.resolve(OP, a, ops.resolve_group(group_name), algorithm, others=(b,)).execute(a, others=(b,))


def _fake(a, b, group_name, algorithm):
    world = ops.world_size(group_name)
    torch._check(a.shape[0] % world == 0, lambda: f"a.shape[0] must be divisible by the world size {world}")
    return a.new_empty((a.shape[0] // world, b.shape[1]))


SPEC = ops.declare(ops.OpSpec(
    OP, "(Tensor a, Tensor b, str group_name, str algorithm) -> Tensor", matmul_reduce_scatter_impl, _fake,
    inputs=("a", "b"), transposed=("b",), shape_rule=_shape_rule, default=choose_default, dispatch_size=layer_size,
    algorithms=(Algorithm(OP, plan.BACKEND, 70, "backend", _nccl, "torch.matmul + the process group's reduce-scatter"),
                Algorithm(OP, "unfused", 71, "fused", _unfused, "torch.matmul + symmcoll.reduce_scatter"),
                Algorithm(OP, "fused", 72, "fused", _fused,
                          "persistent GEMM, peers' row shards first; finished tiles stored into the owner's slots "
                          "with a flag each; the owner adds them to its own tiles"),
                Algorithm(OP, "chunked", 73, "fused", _chunked,
                          "cuBLAS on each peer's row chunk into a double-buffered slot, a barrier, the owner pulls it "
                          "with the copy engine under the next chunk's GEMM; own chunk last, then one fp32 sum"))))

def meta_launch_cases(make_workspace, op, algorithm, launch_fn, shapes, out_rows):
    """Compile cases of a fused GEMM launch on meta tensors, shared by the matmul + collective ops: for
    each (world, rank, dtype, (m, n, k), b_t) of ``shapes``, ``launch_fn(plan, a, out, b)`` with A [m, k],
    B [k, n] (or nn.Linear's W.t() when ``b_t``) and out [out_rows(m, world), n]."""
    cases = []
    for world, rank, dtype, (m, n, k), b_t in shapes:
        def thunk(world=world, rank=rank, dtype=dtype, m=m, n=n, k=k, b_t=b_t):
            a = torch.empty((m, k), dtype=dtype, device="meta")
            b = (torch.empty((n, k), dtype=dtype, device="meta").t() if b_t
                 else torch.empty((k, n), dtype=dtype, device="meta"))
            rows = out_rows(m, world)
            request = plan.Request(op, (m, k), dtype, torch.device("cuda"), others=(((k, n), dtype, a.device),))
            p = plan.Plan(request, "kernel", plan.algorithms(op)[algorithm], None, world, rank,
                          make_workspace(world, rank), None, 3, (rows, n))
            launch_fn(p, a, torch.empty((rows, n), dtype=dtype, device="meta"), b)
        cases.append((f"{op}.{algorithm} ws{world} {m}x{n}x{k}{' B^T' if b_t else ''}", thunk))
    return cases


def compile_cases(make_workspace):
    """The fused kernel's launches on meta tensors: TMA (aligned) and pointer (odd N) loads, decode-sized
    and large M, every world size, rank 1 somewhere, B given as nn.Linear's W.t() (TMA and pointers);
    chunked's (its barriers and its sum kernel) in each dtype, several units, odd N, a single value."""
    chunked_cases = meta_launch_cases(make_workspace, OP, "chunked", _chunked,
                                      ((4, 1, torch.bfloat16, (8192, 8192, 7168), False),
                                       (2, 0, torch.bfloat16, (16384, 16384, 14336), True),
                                       (3, 2, torch.float16, (96, 8190, 1000), False),
                                       (8, 5, torch.float32, (2048, 4095, 512), False),
                                       (2, 1, torch.bfloat16, (2, 1, 8), False)),  # one value: numel a constexpr
                                      out_rows=lambda m, world: m // world)
    return chunked_cases + meta_launch_cases(make_workspace, OP, "fused", _fused,
                             ((2, 0, torch.bfloat16, (8192, 8192, 14336), False),
                              (2, 1, torch.bfloat16, (16, 8192, 14336), False),
                              (4, 1, torch.float16, (512, 8190, 7168), False),
                              (3, 2, torch.float32, (96, 200, 64), False),
                              (2, 1, torch.float32, (4096, 4096, 1024), False),
                              (8, 1, torch.bfloat16, (2048, 8192, 3584), False),
                              (2, 1, torch.bfloat16, (4096, 8192, 3584), True),
                              (4, 0, torch.float16, (64, 1000, 1001), True),
                              # one pass over B (``tiling``): decode on 4 ranks (Llama-3-70B's down
                              # projection), a 128-row tile over 4 shards of 32, two shards a tile
                              (4, 1, torch.bfloat16, (16, 8192, 7168), False),
                              (4, 2, torch.bfloat16, (128, 8192, 7168), False),
                              (4, 3, torch.bfloat16, (256, 8192, 7168), True)),
                             out_rows=lambda m, world: m // world)
