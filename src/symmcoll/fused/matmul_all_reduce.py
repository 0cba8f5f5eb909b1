"""matmul + all-reduce: the end of a row-parallel linear layer without sequence parallelism.

Every rank holds A [M, K] and B [K, N] (its K-slice of the layer); every rank returns the sum over
ranks of A @ B, [M, N], bit-identical on every rank.

one_shot (one persistent kernel, barrier-free; for decode-sized M)
    The sentinel (Lamport) scheme of comm/sentinel.py applied to GEMM tiles. Every rank computes every
    tile of its partial product; as soon as a tile is done it is packed into sanitised words (two
    bf16/fp16 or one fp32 per word; no word equals EMPTY) and stored into its row of every peer's slots;
    the rank keeps its own copy, rounded the same way, in ``out``. Then each program sums its tiles::

        tile j:  acc --words--> slots_d[phase][r][j]  for every peer d        (NVLink stores)
                 own words' values --> out[tile j]
        then:    out[tile j] = sum over ranks s in rank order of (s == r: out[tile j];
                               else: slots_r[phase][s][j] once no word is EMPTY, then reset to EMPTY)

    No flag, no fence, no barrier: a word that is not EMPTY is final (4-byte stores land whole). Every
    rank adds the same rounded partials in the same order: the results agree bit for bit. Tile j goes
    to program j % P on every rank, so program p polls only what program p of each peer sends.
    Slot sets rotate by launch epoch (epoch % 3, as the sentinel all-reduce: a rank is at most one
    launch ahead, and it has emptied what it read before it sends the next launch's tiles). Products
    larger than a slot row go in pieces of whole tiles (one launch each). Traffic: (W-1) x the product
    per rank, all stores issued while later tiles are still being computed. A group of one runs stage 1
    alone (its parked tiles are the result) in one launch.

    With SYMMCOLL_PDL=1 (launcher.pdl_meta) the kernel is launched with programmatic dependent launch:
    every program waits for the previous kernel's completion (language/pdl.py) before its first global
    access, so nothing a peer sees moves earlier; it lets the next kernel launch after stage 1.

two_shot (for large M)
    matmul_reduce_scatter's fused kernel over row shards of ceil(M / W) rows (the last may be short or
    empty; shards shorter than a tile are computed in one pass over B), then symmcoll.all_gather of the
    shards: 2 (W-1)/W of the product per rank. A group of one: the kernel's one shard written in place.

nccl / unfused
    torch.matmul, then the process group's all-reduce (NCCL) / symmcoll.all_reduce ("auto").
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .. import ops, plan
from ..language import (WORD_FORMAT, declare_slots, end_launch, open_slots, peer_ptr, post_call, release_dependents,
                        take, tile_values, tile_words, values_of, wait_prior_grid)
from ..launcher import launch, pdl_meta
from ..plan import Algorithm
from .gemm import b_layout, core_measured_faster, host_descriptors, precision, programs_for, use_tma
from .gemm_configs import GemmConfig, tiles_of
from .gemm_kernel import grouped_tile, k_loop, load_tile, operand_sources, store_tile
from .gemm_tables import device_facts, gemm_config
from .matmul_reduce_scatter import check_operands, layer_size, meta_launch_cases, run_tiles, size_key

OP = "matmul_all_reduce"
# int32 words per (phase, source) slot row; CPU rows are small, so the CPU tests run the multi-piece path.
SLOT_WORDS = {"cuda": 1 << 20, "cpu": 2048}
# "auto" where no measured rule exists (``choose_default``): the one-shot kernel where a rank stores at
# most this much into its peers' slots ((W-1) x M x N x itemsize) and the tiles of its GEMM fill at least
# ONE_SHOT_MIN_FILL of the SMs; torch.matmul + symmcoll.all_reduce ("unfused") everywhere else.
ONE_SHOT_MAX_EXCHANGE_BYTES = 1 << 20
ONE_SHOT_MIN_FILL = 0.9

SLOTS, EPOCHS = declare_slots(OP, f"fused.{OP}", 1, lambda device_type, world: SLOT_WORDS[device_type])


@triton.jit
def matmul_all_reduce_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # A [M, K], B [K, N] (or W = B^T [N, K] if B_T), out [M, N] (row strides given)
    a_ptr, b_ptr, out_ptr, M, N, K, stride_a, stride_b, stride_out,
    # this piece: tiles [first_tile, first_tile + piece_tiles) of the grouped tile order
    first_tile, piece_tiles,
    # FORMAT: words.py's; TILE_WORDS = BM * BN / values per word; SLOT_WORDS: words per source row
    WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr, B_T: tl.constexpr, TMA: tl.constexpr, HOST_DESC: tl.constexpr, PRECISION: tl.constexpr,
    FORMAT: tl.constexpr, TILE_WORDS: tl.constexpr, SLOT_WORDS: tl.constexpr,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (language/pdl.py, launcher.pdl_meta)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # PDL: the previous kernel done before anything global (epochs, slots, pads, operands): no peer sees
    # anything of this launch earlier than without PDL
    wait_prior_grid(PDL)
    epoch, base, region, headers, pads, peer_headers = open_slots(slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc,
                                                                  rank, WORLD, 1, SLOT_WORDS)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    lane = tl.arange(0, TILE_WORDS)
    WORDS_PER_ROW: tl.constexpr = TILE_WORDS // BM
    in_tile = tl.arange(0, BM)[:, None] * WORDS_PER_ROW + tl.arange(0, WORDS_PER_ROW)[None, :]
    a_src, b_src = operand_sources(a_ptr, b_ptr, M, N, K, stride_a, stride_b, BM, BN, BK, TMA, B_T, HOST_DESC)

    # Stage 1: my partial tiles, each sent to every peer as soon as it is done.
    for j in range(pid, piece_tiles, nprog):
        pid_m, pid_n = grouped_tile(first_tile + j, num_m, num_n, GROUP_M)
        acc = k_loop(a_src, b_src, pid_m * BM, pid_n * BN, 0, K, M, N, K, stride_a, stride_b, BM, BN, BK, TMA,
                     SWAP_AB, B_T, PRECISION)
        words = tile_words(acc, FORMAT)  # [BM, TILE_WORDS // BM], row-major: the flat words' order
        # Rows past M are not sent (decode: M = 1 in a 16-row tile moved 16x the product); their
        # words stay EMPTY, and stage 2 waits for none of them.
        sent = (pid_m * BM + tl.arange(0, BM) < M)[:, None]
        for r in tl.static_range(WORLD):
            if r != rank:
                tl.store(peer_ptr(slot_ptrs_dev, r, tl.int32) + base + rank * SLOT_WORDS + j * TILE_WORDS + in_tile,
                         words, mask=sent)
        # My own partial as the peers will see it (rounded and sanitised alike), parked in out.
        store_tile(out_ptr, tile_values(words, FORMAT), pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), M,
                   N, stride_out)
    post_call(pads, peer_headers, epoch, desc, rank, WORLD)
    # The next PDL kernel may launch now: it waits for our completion before it touches memory, and all
    # of our programs are resident by then (each issued this), so our stage-2 waits lose no SM to it.
    release_dependents(PDL)
    tl.debug_barrier()  # stage 2 reads back what other threads of this program parked in out

    # Stage 2: each of my tiles summed over ranks in rank order. A group of one has nothing to add: stage 1
    # left the result in out (reading it back and storing it again moved 2x the product for nothing).
    budget = max_spins
    check = 1
    for j in range(pid, piece_tiles if WORLD > 1 else 0, nprog):
        pid_m, pid_n = grouped_tile(first_tile + j, num_m, num_n, GROUP_M)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        total = tl.zeros([BM, BN], tl.float32)
        for src in tl.static_range(WORLD):
            if src == rank:
                part = load_tile(out_ptr, rows, cols, M, N, stride_out).to(tl.float32)
            else:
                words, budget = take(region + base + src * SLOT_WORDS + j * TILE_WORDS + lane,
                                     pid_m * BM + lane // WORDS_PER_ROW < M, src, rank, budget, status_ptr, desc,
                                     headers, epoch, check, WORLD)
                check = 0
                part = tl.reshape(values_of(words, FORMAT, TILE_WORDS), [BM, BN])
            total += part
        if budget > 0:
            store_tile(out_ptr, total, rows, cols, M, N, stride_out)
    end_launch(epochs_ptr, epoch)


def _one_shot(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ws, world = p.ws, p.world
    M, K = a.shape
    N = b.shape[1]
    b, b_t = b_layout(b, K)
    device_type = ws.device.type
    cfg = gemm_config(M, N, K, a.dtype, ws.device, split=False)
    tile_words = cfg.block_m * cfg.block_n * out.element_size() // 4
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    # A slot row holds SLOT_WORDS of a peer's tiles: pieces of that many tiles per launch. A group of one
    # sends nothing, so one launch takes every tile (no piece leaves SMs idle).
    per_piece = SLOT_WORDS[device_type] // tile_words if world > 1 else tiles
    region, epochs = ws.region(SLOTS.name), ws.local_state(EPOCHS.name)
    tma = use_tma(device_type, a, b)
    a_arg, b_arg = host_descriptors(cfg, a, b, b_t) if tma else (a, b)
    meta = dict(WORLD=world, B_T=b_t, TMA=tma, HOST_DESC=tma, PRECISION=precision(a.dtype),
                FORMAT=WORD_FORMAT[out.dtype], TILE_WORDS=tile_words, SLOT_WORDS=SLOT_WORDS[device_type], **cfg.meta(),
                **pdl_meta(ws.device))
    for first in range(0, tiles, per_piece):
        n = min(per_piece, tiles - first)
        launch(matmul_all_reduce_kernel, (max(1, min(programs_for(cfg, a.device), n)),),
               (*ws.kernel_args, p.desc, region.ptrs_dev, epochs, a_arg, b_arg, out, M, N, K, a.stride(0), b.stride(0),
                out.stride(0), first, n), meta)
    return out


def _two_shot(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if p.world == 1:  # the one shard is the whole product: the kernel writes it in place, nothing to gather
        return run_tiles(p, a, b, out, out.shape[0])
    rows = triton.cdiv(a.shape[0], p.world)
    shard = run_tiles(p, a, b, torch.empty((rows, b.shape[1]), dtype=out.dtype, device=out.device), rows)
    gather = plan.resolve("all_gather", shard, p.group, "auto")
    if rows * p.world == out.shape[0]:
        return gather.execute(shard, out)
    out.copy_(gather.execute(shard)[:out.shape[0]])
    return out


def _fused_or_empty(run):
    def guarded(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if out.numel() and a.shape[1]:
            return run(p, a, out, b)
        return out.zero_()
    return guarded


def _nccl(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch.matmul(a, b, out=out)
    dist.all_reduce(out, group=p.group)
    return out


def _unfused(p: plan.Plan, a: torch.Tensor, out: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    partial = torch.matmul(a, b)
    return plan.inner(p, "all_reduce", partial).execute(partial, out)


def _shape_rule(request: plan.Request, world: int):
    m, n, k = check_operands(request)
    return (m, n), size_key(m, n, k)


def one_shot_pays(m: int, n: int, itemsize: int, world: int, config: GemmConfig, sms: int) -> bool:
    """Whether the one-shot kernel is expected to beat torch.matmul + symmcoll.all_reduce, with no
    measurement to say so. Its GEMM runs whole tiles (no split along K: a tile is a message), and the
    exchange starts only as tiles finish: with one wave of tiles (decode), nothing hides it. It can win
    only where the all-reduce it saves costs more than its exchange, which it moves less well than the
    all-reduce kernels do. On 4x H100 (benchmarks/results/2026-11-27-multi-gpu-fix-h100x4, N = 8192,
    K = 7168 a rank, bf16): 16 rows (768 KB exchanged) 48.9 us against unfused 69.6; 128 rows (6 MB)
    91.3 against 70.2; 512 rows and more 2.5-3.9x unfused. So: several ranks (one rank has nothing
    to hide: the GEMM is cuBLAS's), an exchange of at most ONE_SHOT_MAX_EXCHANGE_BYTES, and tiles
    that fill the SMs (where they do not, cuBLAS splits K and our whole tiles read B with fewer SMs)."""
    exchange = (world - 1) * m * n * itemsize
    return (world > 1 and exchange <= ONE_SHOT_MAX_EXCHANGE_BYTES
            and tiles_of(config, m, n) >= ONE_SHOT_MIN_FILL * sms)


def choose_default(request: plan.Request, world: int) -> str:
    """What "auto" runs where the dispatch table has no rule of this op at this world size (or its rule says
    "default": the H200 table's, everywhere but two_shot at 4 ranks past M * N * K = 2048 x 8192 x 28672): never
    two_shot (on 4x H100 it lost to unfused at every M: at M <= 128 its row shards read B once per
    shard, at M >= 512 its all-gather costs more than the overlap saves -- benchmarks/NOTES.md), the
    one-shot kernel where ``one_shot_pays``, else unfused. The tiles are those the one-shot kernel
    would run on the GPU that ``request.device`` names (an H200's where none answers).

    One rank: two_shot -- its kernel writes the product in place there -- where the GPU's GEMM table measured
    the core faster than cuBLAS at this (M, N, K) (``gemm.core_measured_faster``), else unfused (cuBLAS, then
    the one-rank all-reduce's copy). On one H200 (results/2026-11-29-mar-alone-h200, N = 8192, K = 28672)
    two_shot read 0.859-1.009x cuBLAS over M = 1-16384 against unfused's 0.989-1.023x."""
    m, n, k = check_operands(request)
    if world == 1:
        return "two_shot" if core_measured_faster(m, n, k, request.dtype, request.device) else "unfused"
    gpu = request.device if request.device.type == "cuda" else torch.device("meta")
    config = gemm_config(m, n, k, request.dtype, gpu, split=False)
    _, sms = device_facts(gpu)
    return "one_shot" if one_shot_pays(m, n, request.dtype.itemsize, world, config, sms) else "unfused"


def matmul_all_reduce_impl(a: torch.Tensor, b: torch.Tensor, group_name: str, algorithm: str) -> torch.Tensor:
    return plan.resolve(OP, a, ops.resolve_group(group_name), algorithm, others=(b,)).execute(a, others=(b,))


def _fake(a, b, group_name, algorithm):
    return a.new_empty((a.shape[0], b.shape[1]))


SPEC = ops.declare(ops.OpSpec(
    OP, "(Tensor a, Tensor b, str group_name, str algorithm) -> Tensor", matmul_all_reduce_impl, _fake,
    inputs=("a", "b"), transposed=("b",), shape_rule=_shape_rule, default=choose_default, dispatch_size=layer_size,
    algorithms=(Algorithm(OP, plan.BACKEND, 74, "backend", _nccl, "torch.matmul + the process group's all-reduce"),
                Algorithm(OP, "unfused", 75, "fused", _unfused, "torch.matmul + symmcoll.all_reduce"),
                Algorithm(OP, "one_shot", 76, "fused", _fused_or_empty(_one_shot),
                          "persistent GEMM pushing each finished tile to every peer (sentinel words, no barrier); "
                          "every rank sums all tiles"),
                Algorithm(OP, "two_shot", 77, "fused", _fused_or_empty(_two_shot),
                          "matmul_reduce_scatter's fused kernel, then symmcoll.all_gather"))))

def compile_cases(make_workspace):
    """The one-shot kernel's launches on meta tensors (the two-shot launches matmul_reduce_scatter's
    kernel, checked there): decode-sized M, TMA and pointer loads, bf16/fp16/fp32, every world size, B
    given as nn.Linear's W.t()."""
    return meta_launch_cases(make_workspace, OP, "one_shot", _one_shot,
                             ((2, 1, torch.bfloat16, (1, 8192, 14336), False),
                              (4, 0, torch.bfloat16, (128, 8192, 7168), False),
                              (3, 1, torch.float16, (256, 8190, 1000), False),
                              (8, 1, torch.float32, (7, 96, 64), False),
                              (2, 0, torch.bfloat16, (16, 8192, 3584), True)),
                             out_rows=lambda m, world: m)
