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
(``ALONE_CORE``: gemm.persistent_matmul with gemm.core_launch's config, split plan, grid and
descriptors; no epoch, no flag, no per-tile source choice), so one rank runs at the core's speed, and
naive_remote pulls no peer rows after its GEMM. (A copy kernel on a side stream beside the GEMM,
instead of the tiles' copies, ran 1.08-1.14x cuBLAS against the tiles' 1.06-1.08x on an H100:
2026-11-27-agmm-side-copy-h100.)
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .. import debug_switches, ops
from .. import plan as planner
from ..language import (EPOCH_SLOTS, announce, barrier_kernel, block_barrier, end_launch, launch_epoch, peer_ptr,
                        send_tile_flag, wait_tile_flag)
from ..launcher import launch
from ..memory.persistent_state import persistent
from ..plan import Algorithm, Plan
from . import gemm
from .gemm_tables import gemm_config

OP = "all_gather_matmul"
DTYPES = (torch.bfloat16, torch.float16)


# Where consumers read peers' rows of A (the variants' one difference inside the kernel).
PEER_BUFFERS: tl.constexpr = tl.constexpr(1)    # naive_remote: straight from the owners' buffers over NVLink
COPY_ENGINE: tl.constexpr = tl.constexpr(3)     # copy_engine_producer: from G once the copy engine flags a chunk
PRODUCERS: tl.constexpr = tl.constexpr(4)       # fused: from G once this kernel's producer programs flag a chunk


@triton.jit
def _copy_rows(src, dst, dst2, rows, K, src_stride, dst_stride, dst2_stride, ROWS: tl.constexpr, COLS: tl.constexpr,
               TEE: tl.constexpr):
    """dst[:rows, :K] (and dst2 if TEE) <- src[:rows, :K], in [ROWS, COLS] tiles (wide accesses)."""
    r = tl.arange(0, ROWS)
    for c0 in range(0, K, COLS):
        c = c0 + tl.arange(0, COLS)
        mask = (r[:, None] < rows) & (c[None, :] < K)
        v = tl.load(src + r[:, None].to(tl.int64) * src_stride + c[None, :], mask=mask)
        tl.store(dst + r[:, None].to(tl.int64) * dst_stride + c[None, :], v, mask=mask)
        if TEE:
            tl.store(dst2 + r[:, None].to(tl.int64) * dst2_stride + c[None, :], v, mask=mask)


@triton.jit
def _load_step(src, r, c0, rows, K, src_stride, COLS: tl.constexpr):
    c = c0 + tl.arange(0, COLS)
    return tl.load(src + r[:, None].to(tl.int64) * src_stride + c[None, :], mask=(r[:, None] < rows) & (c[None, :] < K))


@triton.jit
def _store_step(dst, dst2, v, r, c0, rows, K, dst_stride, dst2_stride, COLS: tl.constexpr, TEE: tl.constexpr):
    c = c0 + tl.arange(0, COLS)
    mask = (r[:, None] < rows) & (c[None, :] < K)
    tl.store(dst + r[:, None].to(tl.int64) * dst_stride + c[None, :], v, mask=mask)
    if TEE:
        tl.store(dst2 + r[:, None].to(tl.int64) * dst2_stride + c[None, :], v, mask=mask)


@triton.jit
def _move_rows(src, dst, dst2, rows, K, src_stride, dst_stride, dst2_stride, ROWS: tl.constexpr, COLS: tl.constexpr,
               TEE: tl.constexpr, AHEAD: tl.constexpr):
    """A producer's copy of one chunk, as _copy_rows, in [ROWS, COLS] steps. AHEAD: step i+1's loads are
    issued before step i's stores, so two steps of loads are in flight while a step is stored (a producer
    that waits for each step's loads before issuing the next moves one step per NVLink round trip);
    else one step at a time, loads then stores (the pull before 2026-11-27's change)."""
    if AHEAD:
        r = tl.arange(0, ROWS)
        v = _load_step(src, r, 0, rows, K, src_stride, COLS)
        for c0 in range(COLS, K, COLS):
            ahead = _load_step(src, r, c0, rows, K, src_stride, COLS)
            _store_step(dst, dst2, v, r, c0 - COLS, rows, K, dst_stride, dst2_stride, COLS, TEE)
            v = ahead
        _store_step(dst, dst2, v, r, tl.cdiv(K, COLS) * COLS - COLS, rows, K, dst_stride, dst2_stride, COLS, TEE)
    else:
        _copy_rows(src, dst, dst2, rows, K, src_stride, dst_stride, dst2_stride, ROWS, COLS, TEE)


@triton.jit
def _consumer_tile(tile, blocks_per_shard, num_n, GROUP_M: tl.constexpr):
    """Consumer tile -> (logical row block, column block): shard after shard (mine first, then
    rank+1's, ...), GROUP_M row blocks sweeping the columns together inside a shard, never across two
    shards. (Grouped over all W shards at once, a group larger than a shard -- 1024 x 8192 x 8192 on 4
    ranks: 2 row blocks a shard, GROUP_M 8 -- put every rank's rows into the first wave of tiles, so
    three quarters of the consumers began by waiting for peers' chunks, the last ones included.)"""
    per_shard = blocks_per_shard * num_n
    block, pid_n = gemm.grouped_tile(tile % per_shard, blocks_per_shard, num_n, GROUP_M)
    return (tile // per_shard) * blocks_per_shard + block, pid_n


@triton.jit
def _first_block(pid, owner, blocks_per_shard, N_PRODUCERS: tl.constexpr):
    """The first row block of ``owner``'s shard that producer ``pid`` moves (it then takes every
    N_PRODUCERS-th): block j of owner o belongs to producer (o * blocks_per_shard + j) % N_PRODUCERS,
    on every rank. The owner's producer p copies it into its buffer and every puller's producer p pulls
    it, so program p's barrier with program p of every peer orders the two (and the exit barrier the
    pull before the next call's copy). Numbered over all shards, the W * blocks_per_shard blocks go
    round all producers: at 1024 x 8192 x 8192 on 4 ranks (2 blocks a shard, 8 producers) each producer
    moves one block and 6 of them pull, where numbering within each shard (producer j % 8) left 6 of
    8 idle and 2 pulling every peer's blocks one after another."""
    return (pid + N_PRODUCERS - (owner * blocks_per_shard) % N_PRODUCERS) % N_PRODUCERS


@triton.jit(do_not_specialize=gemm.SPLIT_COUNTS)
def ag_matmul_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; buffer address table; int64 chunk flags and the int32 epoch table of this plan
    desc, buffer_ptrs_dev, flags_ptr, epoch_ptr,
    # A shard [rows, K] (my input), B [K, N] (or W = B^T [N, K] if B_T), C and gathered A (rows of owner s
    # start at s * shard_stride)
    a_ptr, b_ptr, c_ptr, g_ptr, rows, N, K, shard_stride, stride_a, stride_b, stride_c, stride_g,
    # HOST_DESC (a group of one, TMA): the host's tensor descriptors of A and B (no device work per tile)
    a_desc, b_desc,
    # ALONE_CORE only (gemm.CoreLaunch): B's second-part descriptor, the split plan's counts and buffers
    b2_desc, whole_tiles, sharing, slots, partials_ptr, counters_ptr,
    # SOURCE: PEER_BUFFERS, COPY_ENGINE or PRODUCERS; the first N_PRODUCERS programs pull (PRODUCERS only)
    WORLD: tl.constexpr, SOURCE: tl.constexpr, N_PRODUCERS: tl.constexpr, CONSUMERS: tl.constexpr,
    # the GEMM core's tile config (gemm_configs.GemmConfig.meta, split_k = 1)
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr,
    B_T: tl.constexpr, TMA: tl.constexpr, HOST_DESC: tl.constexpr, PRECISION: tl.constexpr, COPY_COLS: tl.constexpr,
    # WORLD == 1 only: c_ptr is C's host tensor descriptor (TMA_STORE), as the GEMM core's matmul_kernel
    # stores C (the tile loop is not flattened: Triton 3.6 cannot flatten it around the copy's own loop)
    TMA_STORE: tl.constexpr = False, C_HALVES: tl.constexpr = 1,
    # WORLD == 1 only: columns a tile's copy of A into the gathered A loads at once (see the consumer loop);
    # COPY_A False where the caller wants no gathered A (nothing is copied)
    SLICE_COLS: tl.constexpr = 64, COPY_A: tl.constexpr = True,
    # PRODUCERS only: the producers issue a step's loads before storing the step before (_move_rows)
    PULL_AHEAD: tl.constexpr = False,
    # WORLD == 1 without COPY_A: the GEMM core's persistent loop (gemm.persistent_matmul) with the rest of
    # the core's constexprs (gemm.core_launch's meta); see the kernel's first branch
    ALONE_CORE: tl.constexpr = False, SPLIT: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    STREAM: tl.constexpr = False, REDUCE_LOADS: tl.constexpr = 1, PDL: tl.constexpr = False, BN2: tl.constexpr = 0,
):
    if ALONE_CORE:
        # A group of one whose caller wants no gathered A has nothing to wait for and nothing to copy: its
        # consumers are the GEMM core's persistent tile loop itself (gemm.persistent_matmul, the body of
        # gemm.matmul_kernel), launched by _run_kernel with the core's config, split plan, grid and host
        # descriptors (gemm.core_launch). The loop below, compiled at WORLD = 1, is not: its tile loop is
        # not flattened (Triton 3.6 cannot flatten it around the per-tile source choice, flag waits and the
        # gathered-A copy), so each tile refills the TMA pipeline from empty (mbarrier init, the prologue
        # loads waited in full, the drain before the store) -- 8.5 us against the core's 6.8 at 1024^3 on an
        # H100 (2 tiles a program) -- and its tiles are whole only (no split of the last wave: 1.04-1.05x
        # cuBLAS at 16384x8192x8192 where the core's split tiles ran 1.00-1.02x).
        tl.static_assert(WORLD == 1 and not COPY_A, "the core's loop only where nothing is gathered")
        gemm.persistent_matmul(a_desc, b_desc, b2_desc, c_ptr, rows, N, K, stride_a, stride_b, stride_c, whole_tiles,
                               sharing, slots, partials_ptr, counters_ptr, BM, BN, BK, GROUP_M, SWAP_AB, B_T, TMA,
                               HOST_DESC, TMA_STORE, PRECISION, SPLIT, FLATTEN, STREAM, REDUCE_LOADS, C_HALVES, PDL,
                               BN2)
    else:
        pid = tl.program_id(0)
        if SOURCE == PRODUCERS:
            epoch = launch_epoch(epoch_ptr)
        else:
            epoch = tl.load(epoch_ptr)  # COPY_ENGINE: bumped by bump_kernel just before, on this stream
        ready = (epoch.to(tl.int64) << 32) | desc
        blocks_per_shard = tl.cdiv(rows, BM)
        budget = max_spins
        if pid < N_PRODUCERS:
            # ---- producer p: publish my chunks p, p+P, ..., then pull the same chunks of every peer ----
            announce(signal_pad_ptrs_dev, desc, rank, WORLD)
            my_buf = peer_ptr(buffer_ptrs_dev, rank, a_ptr.dtype.element_ty)
            my_g = g_ptr + tl.cast(rank * shard_stride, tl.int64) * stride_g
            for j in range(_first_block(pid, rank, blocks_per_shard, N_PRODUCERS), blocks_per_shard, N_PRODUCERS):
                # my rows go to my buffer and my gathered A
                _move_rows(a_ptr + j * BM * stride_a, my_buf + j * BM * K, my_g + tl.cast(j * BM, tl.int64) * stride_g,
                           tl.minimum(rows - j * BM, BM), K, stride_a, K, stride_g, BM, COPY_COLS, True, PULL_AHEAD)
            failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
            if failed == 0:
                for k in tl.static_range(1, WORLD):
                    owner = (rank + k) % WORLD
                    theirs = peer_ptr(buffer_ptrs_dev, owner, a_ptr.dtype.element_ty)
                    for j in range(_first_block(pid, owner, blocks_per_shard, N_PRODUCERS), blocks_per_shard,
                                   N_PRODUCERS):
                        dst = g_ptr + tl.cast(owner * shard_stride + j * BM, tl.int64) * stride_g
                        _move_rows(theirs + j * BM * K, dst, dst, tl.minimum(rows - j * BM, BM), K, K, stride_g,
                                   stride_g, BM, COPY_COLS, False, PULL_AHEAD)
                        send_tile_flag(flags_ptr + owner * blocks_per_shard + j, ready)
                # Nobody refills its buffer (next call) until every peer's program p has pulled from it.
                block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
        else:
            # ---- consumer: the persistent GEMM over row blocks, own rows first ----
            consumer = pid - N_PRODUCERS
            num_n = tl.cdiv(N, BN)
            b_src = b_ptr
            if TMA:
                if HOST_DESC:
                    b_src = b_desc
                elif B_T:
                    b_src = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1], block_shape=[BN, BK])
                else:
                    b_src = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1], block_shape=[BK, BN])
            for tile in tl.range(consumer, WORLD * blocks_per_shard * num_n, CONSUMERS):
                logical, pid_n = _consumer_tile(tile, blocks_per_shard, num_n, GROUP_M)
                owner, first, count = gemm.row_block(logical, blocks_per_shard, rows, rank, WORLD, BM)
                local_first = first - owner * rows
                if WORLD > 1:
                    if owner != rank:
                        if SOURCE != PEER_BUFFERS:
                            budget = wait_tile_flag(flags_ptr + owner * blocks_per_shard + local_first // BM, ready,
                                                    budget, status_ptr, rank, owner, desc)
                # One k-loop with unconditional loads (loads under a branch inside the pipelined loop gave
                # wrong results on an H200; one loop per source doubles the pipeline's shared memory): pick
                # the source per tile, and with TMA build its descriptor per tile (a few hundred ns against
                # a tile's microseconds).
                if owner == rank:
                    base = a_ptr
                    src_rows = rows
                    stride = stride_a
                    row = local_first
                elif SOURCE == PEER_BUFFERS:
                    base = peer_ptr(buffer_ptrs_dev, owner, a_ptr.dtype.element_ty)
                    src_rows = rows
                    stride = K
                    row = local_first
                else:
                    base = g_ptr
                    src_rows = WORLD * shard_stride
                    stride = stride_g
                    row = owner * shard_stride + local_first
                if TMA:
                    if HOST_DESC:  # WORLD == 1: every row is mine
                        a_src = a_desc
                    else:
                        a_src = tl.make_tensor_descriptor(base, shape=[src_rows, K], strides=[stride, 1],
                                                          block_shape=[BM, BK])
                    src = a_src
                else:
                    src = base
                    src_rows = row + count
                acc = gemm.k_loop(src, b_src, row, pid_n * BN, 0, K, src_rows, N, K, stride, stride_b, BM, BN, BK, TMA,
                                  SWAP_AB, B_T, PRECISION)
                if TMA_STORE:  # WORLD == 1: C's descriptor clips at its last row
                    gemm.store_result(c_ptr, acc, local_first, pid_n * BN, rows, N, stride_c, BM, BN, True, C_HALVES)
                elif budget > 0:
                    gemm.store_tile(c_ptr + tl.cast(owner * shard_stride + local_first, tl.int64) * stride_c, acc,
                                    tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), count, N, stride_c)
                # Alone (WORLD == 1) the gathered A is a copy of A that the tiles make after their K-loops:
                # tile (m, n) copies its 1/num_n slice of row block m's columns in one round trip (chunks
                # of SLICE_COLS). Measured on one H100 (2026-11-27): a copy of A's blocks inside the K-loop
                # (extra loads beside the pipeline, 248 registers) ran 1.16-1.24x cuBLAS at M >= 1024
                # against 1.04-1.13x this way; [BM, 64] chunks, a round trip each, ran 1.06-1.19x.
                if WORLD == 1 and COPY_A:
                    width = tl.cdiv(tl.cdiv(K, num_n), COPY_COLS) * COPY_COLS  # (whole vectors: aligned slices)
                    c_lo = pid_n * width
                    if c_lo < K:
                        _copy_rows(a_ptr + tl.cast(local_first, tl.int64) * stride_a + c_lo,
                                   g_ptr + tl.cast(local_first, tl.int64) * stride_g + c_lo, g_ptr, count,
                                   tl.minimum(width, K - c_lo), stride_a, stride_g, stride_g, BM, SLICE_COLS, False)
        if SOURCE == PRODUCERS:
            end_launch(epoch_ptr, epoch)


@triton.jit
def bump_kernel(epoch_ptr, ready_ptr, desc, n, BLOCK: tl.constexpr):
    """This call's epoch = entry 0 of the epoch table + 1 (stored back), and its ready word
    (epoch << 32) | desc written into entries [0, n) of the ready table, which the copy engine copies
    into the flags of the chunks it has copied (copy_engine_producer). Runs before the GEMM on the main
    stream, so the side stream's copies never need an SM."""
    epoch = tl.load(epoch_ptr) + 1
    tl.store(epoch_ptr, epoch)
    ready = (epoch.to(tl.int64) << 32) | desc
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(ready_ptr + offs, tl.zeros([BLOCK], tl.int64) + ready, mask=offs < n)


# ---- host side --------------------------------------------------------------------------------------

def _shape_rule(request: planner.Request, world: int):
    if request.dtype not in DTYPES:
        raise ValueError(f"a_shard.dtype {request.dtype} is not supported (bf16, fp16)")
    if len(request.shape) != 2:
        raise ValueError(f"a_shard must be 2-D [M/W, K], got shape {request.shape}")
    rows, k = request.shape
    if not request.others:
        raise ValueError("b: give at least one matrix")
    for i, (shape, dtype, device) in enumerate(request.others):
        if len(shape) != 2 or shape[0] != k:
            raise ValueError(f"b[{i}] must be [K={k}, N], got shape {shape}")
        if dtype != request.dtype:
            raise ValueError(f"b[{i}].dtype {dtype} differs from a_shard.dtype {request.dtype}")
        if device != request.device:
            raise ValueError(f"b[{i}] is on {device}, a_shard on {request.device}")
    key = rows * 1_000_003 + k * 7919 + sum(s[1] for s, _, _ in request.others)
    return None, key  # outputs (C per B, and the gathered A) are allocated by the variant


def dispatch_size(request: planner.Request, world: int) -> int:
    """What the tuned table keys this op by: M * N * K (N summed over the Bs)."""
    rows, k = request.shape
    return world * rows * k * sum(shape[1] for shape, _, _ in request.others)




# Gathered rows from which "auto" (without a table rule) overlaps the gather by the copy engines: on 4x H100
# (benchmarks/results/2026-11-27-multi-gpu-fix*-h100x4) copy_engine_producer beat every other variant and
# NCCL + cuBLAS at 4096 and 16384 rows (0.75-0.93x of auto's gather_then_cublas), and lost at 1024 rows and below.
COPY_ENGINE_FROM_ROWS = 4096


def choose_default(request: planner.Request, world: int) -> str:
    """What "auto" runs where the dispatch table has no rule for this op: the copy-engine producer for
    gathers of COPY_ENGINE_FROM_ROWS rows or more on several ranks, else the symmcoll all-gather then
    cuBLAS (one rank: the gather is a copy, nothing to overlap)."""
    rows = world * request.shape[0]
    return "copy_engine_producer" if world > 1 and rows >= COPY_ENGINE_FROM_ROWS else "gather_then_cublas"


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
        barrier = lambda: launch(barrier_kernel, (1,), (*ws.kernel_args, plan.desc), dict(WORLD=world, num_warps=1))
        if copies:
            ws.buffer[: rows * K * a.element_size()].view(a.dtype).view(rows, K).copy_(a_piece)
            barrier()
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
            barrier()
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


def _side_stream(plan: Plan, device: torch.device) -> torch.cuda.Stream:
    """This plan's side stream for copy-engine copies (made once)."""
    if "side_stream" not in plan.cache:
        plan.cache["side_stream"] = torch.cuda.Stream(device)
    return plan.cache["side_stream"]


def _copy_engine_gather(plan: Plan, a, g, flags, ready, start: int, rows: int, block_m: int) -> None:
    """On a side stream: each peer's piece with the copy engine, then its chunks' flags (entries of the
    ready table copied into them: a small copy after the data copy on the same stream, so the flags
    say the rows are there). No SM is needed, so the persistent GEMM may occupy them all."""
    ws, world, rank = plan.ws, plan.world, plan.rank
    blocks = triton.cdiv(rows, block_m)
    K = a.shape[1]
    nbytes = rows * K * a.element_size()
    if a.is_cuda:
        side = _side_stream(plan, a.device)
        side.wait_stream(torch.cuda.current_stream(a.device))
        context = torch.cuda.stream(side)
    else:
        import contextlib
        context = contextlib.nullcontext()
    with context:
        for k in range(1, world):
            owner = (rank + k) % world
            g[owner * a.shape[0] + start:][:rows].copy_(ws.peer_buffer(owner)[:nbytes].view(a.dtype).view(rows, K))
            flags[owner * blocks:(owner + 1) * blocks].copy_(ready[:blocks])


def _naive_remote(plan, a, _out, *bs):
    return _run_kernel(plan, a, bs, PEER_BUFFERS.value)


def _copy_engine_producer(plan, a, _out, *bs):
    return _run_kernel(plan, a, bs, COPY_ENGINE.value)


# Producer programs of the fused kernel: on CPU exactly FUSED_PRODUCERS["cpu"] (the tests raise it); on a
# GPU fused_producers' rule, at least FUSED_PRODUCERS["cuda"] and at most FUSED_PRODUCERS_MAX.
FUSED_PRODUCERS = {"cuda": 8, "cpu": 1}
FUSED_PRODUCERS_MAX = 32
# The rule's rates: what one producer pulls over NVLink (bytes/s; 7-16 GB/s fitted to the one-step pull on
# 4x H100, benchmarks/NOTES.md, "all_gather_matmul at world size 4") and what one SM multiplies (flop/s:
# cuBLAS's ~730 TFLOP/s on 132 H100 SMs).
PRODUCER_PULL_RATE = 10e9
SM_FLOP_RATE = 5.5e12
# Columns of a producer's step when it issues the next step's loads before storing one (_move_rows).
AHEAD_COLS = 128


def fused_producers(programs: int, chunks: int, n: int, itemsize: int) -> int:
    """Producer programs of the fused kernel on a GPU of ``programs`` persistent programs, for ``chunks``
    row blocks in all W shards and B's ``n`` columns. Consumers multiply my shard first (1/W of the
    tiles, no wait) and then the peers' shards in the order the producers pull them, so every chunk
    arrives in time when the pull of the W-1 peers' shards takes at most (W-1)/W of the GEMM time:
    (W-1)/W * M*K*e / (P*r) <= (W-1)/W * 2*M*N*K / ((S-P)*f), i.e. P >= S / (1 + 2*N*r / (e*f)), which
    depends on N only (the flops per pulled byte): 9 at N = 8192, 18 at N = 3584 (132 SMs, bf16). More
    producers than chunks would have nothing to move, and each one takes an SM from the GEMM.
    SYMMCOLL_AGMM_PRODUCERS (debug_switches) fixes the count to compare designs in one GPU run."""
    if debug_switches.AGMM_PRODUCERS is not None:
        wanted = debug_switches.AGMM_PRODUCERS
    else:
        wanted = max(FUSED_PRODUCERS["cuda"], math.ceil(
            programs / (1 + 2 * n * PRODUCER_PULL_RATE / (itemsize * SM_FLOP_RATE))))
    return max(1, min(wanted, FUSED_PRODUCERS_MAX, chunks, programs - 1))


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
    _fake, inputs=("a_shard", "b"), shape_rule=_shape_rule, default=choose_default, dispatch_size=dispatch_size,
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
