"""The kernels of all_gather_matmul (fused/all_gather_matmul.py: the ladder of variants, the host side).

``ag_matmul_kernel`` is the one kernel of variants 1, 3 and 4 (naive_remote, copy_engine_producer,
fused); its SOURCE constexpr says where consumers read peers' rows of A. Programs [0, N_PRODUCERS) are
producers (fused only): each copies its chunks of my shard into my symmetric buffer (``_first_block``
deals the chunks round the producers the same way on every rank), meets program p of every peer in a
barrier, pulls the same chunks of every peer's shard into the gathered A (``_move_rows``) and flags
each chunk. The rest are consumers: the persistent GEMM over row blocks in ``_consumer_tile``'s order
(own shard first), waiting (bounded) on a peer chunk's flag before its tiles; a group of one that wants
no gathered A runs the GEMM core's persistent loop instead (ALONE_CORE). ``bump_kernel`` advances the
epoch and fills the ready table whose words the copy engine copies into the flags (copy_engine_producer).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import (announce, block_barrier, end_launch, launch_epoch, peer_ptr, send_tile_flag,
                        wait_tile_flag)
from . import gemm_kernel

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
    block, pid_n = gemm_kernel.grouped_tile(tile % per_shard, blocks_per_shard, num_n, GROUP_M)
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


@triton.jit(do_not_specialize=gemm_kernel.SPLIT_COUNTS)
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
    # WORLD == 1 without COPY_A: the GEMM core's persistent loop (gemm_kernel.persistent_matmul) with the
    # rest of the core's constexprs (gemm.core_launch's meta); see the kernel's first branch
    ALONE_CORE: tl.constexpr = False, SPLIT: tl.constexpr = False, FLATTEN: tl.constexpr = False,
    STREAM: tl.constexpr = False, REDUCE_LOADS: tl.constexpr = 1, PDL: tl.constexpr = False, BN2: tl.constexpr = 0,
    SUM_APART: tl.constexpr = False, PAIR: tl.constexpr = 0,
):
    if ALONE_CORE:
        # A group of one whose caller wants no gathered A has nothing to wait for and nothing to copy: its
        # consumers are the GEMM core's persistent tile loop itself (gemm_kernel.persistent_matmul, the body
        # of gemm_kernel.matmul_kernel), launched by _run_kernel with the core's config, split plan, grid and
        # host descriptors (gemm.core_launch). The loop below, compiled at WORLD = 1, is not: its tile loop is
        # not flattened (Triton 3.6 cannot flatten it around the per-tile source choice, flag waits and the
        # gathered-A copy), so each tile refills the TMA pipeline from empty (mbarrier init, the prologue
        # loads waited in full, the drain before the store) -- 8.5 us against the core's 6.8 at 1024^3 on an
        # H100 (2 tiles a program) -- and its tiles are whole only (no split of the last wave: 1.04-1.05x
        # cuBLAS at 16384x8192x8192 where the core's split tiles ran 1.00-1.02x).
        tl.static_assert(WORLD == 1 and not COPY_A, "the core's loop only where nothing is gathered")
        gemm_kernel.persistent_matmul(a_desc, b_desc, b2_desc, c_ptr, rows, N, K, stride_a, stride_b, stride_c,
                                      whole_tiles, sharing, slots, partials_ptr, counters_ptr, BM, BN, BK, GROUP_M,
                                      SWAP_AB, B_T, TMA, HOST_DESC, TMA_STORE, PRECISION, SPLIT, FLATTEN, STREAM,
                                      REDUCE_LOADS, C_HALVES, PDL, BN2, SUM_APART, PAIR=PAIR)
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
                owner, first, count = gemm_kernel.row_block(logical, blocks_per_shard, rows, rank, WORLD, BM)
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
                acc = gemm_kernel.k_loop(src, b_src, row, pid_n * BN, 0, K, src_rows, N, K, stride, stride_b, BM, BN,
                                         BK, TMA, SWAP_AB, B_T, PRECISION)
                if TMA_STORE:  # WORLD == 1: C's descriptor clips at its last row
                    gemm_kernel.store_result(c_ptr, acc, local_first, pid_n * BN, rows, N, stride_c, BM, BN, True,
                                             C_HALVES)
                elif budget > 0:
                    gemm_kernel.store_tile(c_ptr + tl.cast(owner * shard_stride + local_first, tl.int64) * stride_c,
                                           acc, tl.arange(0, BM), pid_n * BN + tl.arange(0, BN), count, N, stride_c)
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
