"""The GEMM core's kernels, on which every fused op's GEMM is built: one K-loop, one tile scheduler, the
tile stores, and the plain ``matmul``'s persistent kernel (its host side, which launches it: gemm.py).

    k_loop          fp32 [BM, BN] tile of A[rows, k_lo:k_hi] @ B[k_lo:k_hi, cols]: TMA descriptor or
                    masked pointer loads, straight (acc += A B) or swapped (acc^T += B^T A^T: the
                    tokens on the tensor core's narrow side, for decode), B row-major [K, N] or given as
                    its transpose W [N, K] (nn.Linear's weight); with BN2 > 0 a tile BN + BN2 wide (no
                    power of two: GemmConfig.block_n2) as two accumulators fed by one A block. The only
                    K-loop of the package (``mma`` holds its only ``tl.dot``).
    grouped_tile    the persistent scheduler's tile order: GROUP_M row blocks sweep the columns
                    together, so a column block of B is reused from L2 (Triton tutorials 03/09).
    split path      the tiles of the last, partial wave shared along K -- stream-K or the wave
                    split -- and summed by their last part without a second kernel (gemm_split.py), or
                    (GemmConfig.sum_apart, either split) by ``split_sum_kernel`` after it, every SM a few rows.
    matmul_kernel   persistent: whole tiles round-robin over the programs, then each program's
                    stream-K range or wave-split parts (its body is ``persistent_matmul``, which
                    all_gather_matmul's kernel runs too); fused ops run their own kernels on ``k_loop``
                    and ``grouped_tile`` with whole tiles only.

With SYMMCOLL_PDL=1 (launcher.pdl_meta) ``matmul_kernel`` is launched with programmatic dependent
launch: it waits for the previous kernel (language/pdl.py) before building descriptors or touching
memory, and lets the next one launch once its first tile's K-loop is done. The plain GEMM's whole-tile
decode launches run with PDL whatever the switch, and release the next kernel right after their wait
(gemm.launch_meta). Under the interpreter
``mma`` upcasts to fp32 first (triton 3.6's interpreter adds bf16 bit patterns); the GPU path never does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import INTERPRETED, narrow, release_dependents, wait_prior_grid
from .gemm_split import (exchange_halves, pair_reduce, split_reduce, store_partial, stream_cut, stream_owner,
                         stream_range, wave_part)


@triton.jit
def mma(a, b, acc, PRECISION: tl.constexpr = "tf32"):
    """acc + a @ b in fp32 (tensor cores on GPU)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def grouped_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row block, column block) of ``tile`` in grouped order."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def row_block(logical, blocks_per_shard, rows_per_shard, rank, WORLD: tl.constexpr, BM: tl.constexpr):
    """Logical row block -> (owner rank, first row, rows in this block): my shard's blocks first, then
    rank+1's, ...; blocks never straddle two shards (a shard's last block may be short)."""
    owner = (rank + logical // blocks_per_shard) % WORLD
    first = (logical % blocks_per_shard) * BM
    return owner, owner * rows_per_shard + first, tl.minimum(rows_per_shard - first, BM)


@triton.jit
def load_tile(ptr, rows, cols, row_limit, col_limit, stride):
    """A [len(rows), len(cols)] tile of a row-major matrix, zeros outside the limits."""
    mask = (rows[:, None] < row_limit) & (cols[None, :] < col_limit)
    return tl.load(ptr + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_tile(c_ptr, acc, rows, cols, row_limit, col_limit, stride):
    mask = (rows[:, None] < row_limit) & (cols[None, :] < col_limit)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * stride + cols[None, :], narrow(acc, c_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def b_source(b_ptr, N, K, stride_b, BN: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr, B_T: tl.constexpr,
             HOST_DESC: tl.constexpr):
    """What ``k_loop`` loads B's [BK, BN] blocks from: a descriptor of B ([K, N], or W [N, K] if B_T)
    built here (TMA without HOST_DESC), else ``b_ptr`` itself (the host's descriptor, or the pointer)."""
    if TMA and not HOST_DESC:
        if B_T:
            return tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1], block_shape=[BN, BK])
        else:
            return tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1], block_shape=[BK, BN])
    else:
        return b_ptr


@triton.jit
def operand_sources(a_ptr, b_ptr, M, N, K, stride_a, stride_b, BM: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr, TMA: tl.constexpr, B_T: tl.constexpr, HOST_DESC: tl.constexpr = False):
    """What ``k_loop`` loads from: tensor descriptors of A [M, K] and B ([K, N], or W [N, K] if B_T) --
    made by the host and passed as kernel parameters (HOST_DESC: no device work), or built here once
    per kernel -- or, without TMA, the pointers themselves."""
    if TMA and not HOST_DESC:
        a_src = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1], block_shape=[BM, BK])
    else:
        a_src = a_ptr
    return a_src, b_source(b_ptr, N, K, stride_b, BN, BK, TMA, B_T, HOST_DESC)


@triton.jit
def k_loop(a_src, b_src, row0, col0, k_lo, k_hi, row_limit, N, K, stride_a, stride_b,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr, SWAP_AB: tl.constexpr,
           B_T: tl.constexpr, PRECISION: tl.constexpr, BN2: tl.constexpr = 0, b2_src=None):
    """fp32 [BM, BN] = A[row0:row0+BM, k_lo:k_hi] @ B[k_lo:k_hi, col0:col0+BN] (k_lo a multiple of BK;
    k_hi a multiple of BK or K). Pointer loads read A rows below ``row_limit`` only (zeros beyond);
    TMA loads read whole blocks of A (rows past ``row_limit`` but inside A come in too: callers mask
    what they store).

    BN2 > 0 (GemmConfig.block_n2; not swapped): the tile is BN + BN2 columns wide -- a width no
    power-of-two ``tl.arange`` can hold -- computed as two accumulators from the same A block per
    k-step: returns ([BM, BN], [BM, BN2] of columns col0+BN ..), B's second part loaded through
    ``b2_src`` (a descriptor with blocks BN2 wide, or the same pointer as ``b_src``)."""
    rows = row0 + tl.arange(0, BM)
    cols = col0 + tl.arange(0, BN)
    if SWAP_AB:
        tl.static_assert(BN2 == 0, "a two-part tile is not swapped")
        acc_t = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    if BN2 > 0:
        cols2 = col0 + BN + tl.arange(0, BN2)
        acc2 = tl.zeros([BM, BN2], tl.float32)
    for k in tl.range(k_lo, k_hi, BK):
        if TMA:
            a = a_src.load([row0, k])
            if B_T:
                w = b_src.load([col0, k])
                if BN2 > 0:
                    w2 = b2_src.load([col0 + BN, k])
            else:
                b = b_src.load([k, col0])
                if BN2 > 0:
                    b2 = b2_src.load([k, col0 + BN])
        else:
            ks = k + tl.arange(0, BK)
            a = load_tile(a_src, rows, ks, row_limit, k_hi, stride_a)
            if B_T:
                w = load_tile(b_src, cols, ks, N, k_hi, stride_b)
                if BN2 > 0:
                    w2 = load_tile(b2_src, cols2, ks, N, k_hi, stride_b)
            else:
                b = load_tile(b_src, ks, cols, k_hi, N, stride_b)
                if BN2 > 0:
                    b2 = load_tile(b2_src, ks, cols2, k_hi, N, stride_b)
        if SWAP_AB:
            if B_T:
                acc_t = mma(w, tl.trans(a), acc_t, PRECISION)
            else:
                acc_t = mma(tl.trans(b), tl.trans(a), acc_t, PRECISION)
        else:
            if B_T:
                acc = mma(a, tl.trans(w), acc, PRECISION)
                if BN2 > 0:
                    acc2 = mma(a, tl.trans(w2), acc2, PRECISION)
            else:
                acc = mma(a, b, acc, PRECISION)
                if BN2 > 0:
                    acc2 = mma(a, b2, acc2, PRECISION)
    if SWAP_AB:
        acc = tl.trans(acc_t)
    if BN2 > 0:
        return acc, acc2
    else:
        return acc


@triton.jit
def store_piece(c_dst, acc, row0, col0, M, N, stride_c, BM: tl.constexpr, BN: tl.constexpr,
                TMA_STORE: tl.constexpr):
    """C[row0:row0+BM, col0:col0+BN] <- acc narrowed: through C's tensor descriptor (TMA_STORE: async,
    clipped at the edges) or masked stores."""
    if TMA_STORE:
        c_dst.store([row0, col0], narrow(acc, c_dst.dtype))
    else:
        store_tile(c_dst, acc, row0 + tl.arange(0, BM), col0 + tl.arange(0, BN), M, N, stride_c)


@triton.jit
def store_result(c_dst, acc, row0, col0, M, N, stride_c, BM: tl.constexpr, BN: tl.constexpr,
                 TMA_STORE: tl.constexpr, C_HALVES: tl.constexpr = 1, acc2=None, BN2: tl.constexpr = 0):
    """The [BM, BN] tile ``acc`` into C at (row0, col0), whole or (C_HALVES = 2) as its left and right
    column halves one after the other: a TMA store stages only half the tile in shared memory
    (GemmConfig.c_halves; C's descriptor then has blocks [BM, BN // 2]). BN2 > 0: a two-part tile
    (``k_loop``'s BN2), its second part ``acc2`` [BM, BN2] stored at columns col0+BN .. by masked
    stores (GemmConfig refuses TMA stores for two-part tiles)."""
    if C_HALVES == 2:
        left, right = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
        store_piece(c_dst, left, row0, col0, M, N, stride_c, BM, BN // 2, TMA_STORE)
        store_piece(c_dst, right, row0, col0 + BN // 2, M, N, stride_c, BM, BN // 2, TMA_STORE)
    else:
        store_piece(c_dst, acc, row0, col0, M, N, stride_c, BM, BN, TMA_STORE)
    if BN2 > 0:
        tl.static_assert(not TMA_STORE, "a two-part tile is stored by masked stores")
        store_piece(c_dst, acc2, row0, col0 + BN, M, N, stride_c, BM, BN2, TMA_STORE)


# The split plan's counts are not specialised (Triton would compile a kernel per value class of
# each: 0, 1, multiples of 16): one compiled kernel per config, which the tuner compiles ahead. Kernels
# that run ``persistent_matmul`` list them too (SPLIT_COUNTS).
SPLIT_COUNTS = ["whole_tiles", "sharing", "slots"]


@triton.jit(do_not_specialize=SPLIT_COUNTS)
def matmul_kernel(
    # C [M, N] = A [M, K] @ B (B [K, N] row-major, or W = B^T [N, K] row-major if B_T); row strides given.
    # HOST_DESC: a_ptr and b_ptr are the host's tensor descriptors of A and B; TMA_STORE: c_ptr is C's.
    # b2_ptr: B again for a two-part tile's second part (BN2 > 0): its descriptor with blocks BN2 wide
    # (HOST_DESC), else the same pointer as b_ptr; None when BN2 = 0.
    a_ptr, b_ptr, b2_ptr, c_ptr, M, N, K, stride_a, stride_b, stride_c,
    # split (gemm_configs.split_plan): tiles [0, whole_tiles) whole; the k-steps of the rest shared by
    # programs [0, sharing) (STREAM: stream-K) or cut into `sharing` parts a tile (the wave split);
    # fp32 partials [shared tiles, slots, BM, BN + BN2] and per-shared-tile counters (all zero)
    whole_tiles, sharing, slots, partials_ptr, counters_ptr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr,
    B_T: tl.constexpr, TMA: tl.constexpr, HOST_DESC: tl.constexpr, TMA_STORE: tl.constexpr,
    PRECISION: tl.constexpr, SPLIT: tl.constexpr, FLATTEN: tl.constexpr, STREAM: tl.constexpr,
    REDUCE_LOADS: tl.constexpr = 1,  # partial slots a shared tile's last part loads at once (gemm_split.reduce_loads)
    C_HALVES: tl.constexpr = 1,  # C's tile stored whole or in two column halves (GemmConfig.c_halves)
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (language/pdl.py, launcher.pdl_meta)
    BN2: tl.constexpr = 0,  # a tile's second column part (GemmConfig.block_n2): tiles BN + BN2 wide (no stream-K)
    SUM_APART: tl.constexpr = False,  # split tiles' partials summed by split_sum_kernel (GemmConfig.sum_apart)
    EARLY_RELEASE: tl.constexpr = False,  # PDL: the next kernel may launch right after our wait (gemm.launch_meta)
    PAIR: tl.constexpr = 0,  # the wave split's tiles in exactly two parts: 1 gemm_split.pair_reduce, 2 exchange_halves
):
    persistent_matmul(a_ptr, b_ptr, b2_ptr, c_ptr, M, N, K, stride_a, stride_b, stride_c, whole_tiles, sharing, slots,
                      partials_ptr, counters_ptr, BM, BN, BK, GROUP_M, SWAP_AB, B_T, TMA, HOST_DESC, TMA_STORE,
                      PRECISION, SPLIT, FLATTEN, STREAM, REDUCE_LOADS, C_HALVES, PDL, BN2, SUM_APART, EARLY_RELEASE,
                      PAIR)


@triton.jit
def persistent_matmul(a_ptr, b_ptr, b2_ptr, c_ptr, M, N, K, stride_a, stride_b, stride_c, whole_tiles, sharing, slots,
                      partials_ptr, counters_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      GROUP_M: tl.constexpr, SWAP_AB: tl.constexpr, B_T: tl.constexpr, TMA: tl.constexpr,
                      HOST_DESC: tl.constexpr, TMA_STORE: tl.constexpr, PRECISION: tl.constexpr, SPLIT: tl.constexpr,
                      FLATTEN: tl.constexpr, STREAM: tl.constexpr, REDUCE_LOADS: tl.constexpr, C_HALVES: tl.constexpr,
                      PDL: tl.constexpr, BN2: tl.constexpr, SUM_APART: tl.constexpr = False,
                      EARLY_RELEASE: tl.constexpr = False, PAIR: tl.constexpr = 0):
    """``matmul_kernel``'s whole body (its parameters, in its order): every program of the grid runs its
    whole tiles, then its parts of the split ones. A kernel that calls it compiles the GEMM core's
    tile loop itself -- all_gather_matmul's kernel does alone, where it has nothing to wait for.

    EARLY_RELEASE (with PDL): the next PDL kernel may launch right after our wait, not after our first
    tile's K-loop -- its programs are then resident (where an SM has room) or dispatched the moment an SM
    frees, and start the instant we complete (gemm.launch_meta: the whole-tile decode launches)."""
    # (GemmConfig refuses these; the kernel says so too)
    tl.static_assert(BN2 == 0 or not (STREAM or SWAP_AB or TMA_STORE),
                     "two-part tiles: whole or wave-split (no stream-K), straight, masked stores")
    tl.static_assert(not SUM_APART or BN2 == 0, "sum_apart: one-part tiles (wave split or stream-K)")
    tl.static_assert(not PAIR or not (STREAM or SUM_APART or BN2 > 0), "pair_reduce: the wave split, one-part tiles")
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN + BN2)
    tiles = num_m * num_n
    program = tl.program_id(0)
    # PDL: nothing global before this (a device-side descriptor is written to global scratch)
    wait_prior_grid(PDL)
    if EARLY_RELEASE:
        release_dependents(PDL)
    a_src, b_src = operand_sources(a_ptr, b_ptr, M, N, K, stride_a, stride_b, BM, BN, BK, TMA, B_T, HOST_DESC)
    if BN2 > 0:  # B's second column part, blocks BN2 wide
        b2_src = b_source(b2_ptr, N, K, stride_b, BN2, BK, TMA, B_T, HOST_DESC)
    if SPLIT:
        # one loop over my work: whole tiles program, program + P, ... below whole_tiles, then my parts
        # of the shared tiles (one k_loop call site: two would hold two sets of registers)
        steps = tl.cdiv(K, BK)
        whole = tl.cdiv(tl.maximum(whole_tiles - program, 0), tl.num_programs(0))
        if STREAM:  # my one range of the shared k-steps, and the shared tiles it meets
            least, longer = stream_cut((tiles - whole_tiles) * steps, sharing)
            first, end = stream_range(program, least, longer)
            if program < sharing:
                ranged = tl.cdiv(end, steps) - first // steps
            else:
                ranged = 0
        else:  # wave split: parts program, program + P, ... of the (tile, part) units
            ranged = tl.cdiv(tl.maximum((tiles - whole_tiles) * sharing - program, 0), tl.num_programs(0))
        for item in tl.range(0, whole + ranged, flatten=FLATTEN):
            in_whole = item < whole
            if STREAM:
                t = first // steps + item - whole  # (shared tile, where not in_whole)
                t_first = t * steps
            else:
                t, part, part_lo, part_hi = wave_part(program + (item - whole) * tl.num_programs(0), tiles - whole_tiles,
                                                       sharing, steps)
            tile = tl.where(in_whole, program + item * tl.num_programs(0), whole_tiles + t)
            if STREAM:
                lo = tl.where(in_whole, 0, tl.maximum(first, t_first) - t_first)
                hi = tl.where(in_whole, steps, tl.minimum(end, t_first + steps) - t_first)
            else:
                lo = tl.where(in_whole, 0, part_lo)
                hi = tl.where(in_whole, steps, part_hi)
            pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
            row0 = pid_m * BM
            col0 = pid_n * (BN + BN2)
            if BN2 > 0:
                acc, acc2 = k_loop(a_src, b_src, row0, col0, lo * BK, tl.minimum(K, hi * BK), M, N, K, stride_a,
                                   stride_b, BM, BN, BK, TMA, SWAP_AB, B_T, PRECISION, BN2, b2_src)
            else:
                acc = k_loop(a_src, b_src, row0, col0, lo * BK, tl.minimum(K, hi * BK), M, N, K, stride_a, stride_b,
                             BM, BN, BK, TMA, SWAP_AB, B_T, PRECISION)
                acc2 = None
            release_dependents(PDL)  # (the first call counts: the next kernel's launch overlaps what follows)
            if STREAM:
                opener = stream_owner(t_first, least, longer)
                parts = tl.where(in_whole, 1, stream_owner(t_first + steps - 1, least, longer) - opener + 1)
                part = program - opener
            else:
                parts = tl.where(in_whole, 1, sharing)
            if SUM_APART:  # a shared tile's part leaves its partial to split_sum_kernel
                if parts > 1:
                    store_partial(acc, partials_ptr, t, part, slots, BM, BN)
                is_last = parts == 1
            elif parts > 1:
                if PAIR == 2:  # (the plan's sharing is 2, one round of parts: gemm._core_shape) my half of C here
                    half = exchange_halves(acc, partials_ptr, counters_ptr, t, part, slots, BM, BN)
                    store_piece(c_ptr, half, row0, col0 + part * (BN // 2), M, N, stride_c, BM, BN // 2, TMA_STORE)
                    is_last = False
                elif PAIR == 1:  # (the plan's sharing is 2: gemm._core_shape)
                    is_last, acc = pair_reduce(acc, partials_ptr, counters_ptr, t, slots, BM, BN)
                elif BN2 > 0:  # both parts' partials, one counter bump; the last part sums each
                    is_last, acc, acc2 = split_reduce(acc, partials_ptr, counters_ptr, t, part, parts, slots, BM, BN,
                                                      REDUCE_LOADS, acc2, BN2)
                else:
                    is_last, acc = split_reduce(acc, partials_ptr, counters_ptr, t, part, parts, slots, BM, BN,
                                                REDUCE_LOADS)
            else:
                is_last = True
            if is_last:
                store_result(c_ptr, acc, row0, col0, M, N, stride_c, BM, BN, TMA_STORE, C_HALVES, acc2, BN2)
    else:
        for tile in tl.range(program, tiles, tl.num_programs(0), flatten=FLATTEN):
            pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
            row0 = pid_m * BM
            col0 = pid_n * (BN + BN2)
            if BN2 > 0:
                acc, acc2 = k_loop(a_src, b_src, row0, col0, 0, K, M, N, K, stride_a, stride_b, BM, BN, BK, TMA,
                                   SWAP_AB, B_T, PRECISION, BN2, b2_src)
            else:
                acc = k_loop(a_src, b_src, row0, col0, 0, K, M, N, K, stride_a, stride_b, BM, BN, BK, TMA,
                             SWAP_AB, B_T, PRECISION)
                acc2 = None
            release_dependents(PDL)  # (the first call counts: the next kernel's launch overlaps what follows)
            store_result(c_ptr, acc, row0, col0, M, N, stride_c, BM, BN, TMA_STORE, C_HALVES, acc2, BN2)


@triton.jit(do_not_specialize=SPLIT_COUNTS)
def split_sum_kernel(
    # GemmConfig.sum_apart: C's shared tiles [whole_tiles, tiles) of matmul_kernel's launch before this one
    # (one program row a tile: the grid's first dimension is their count), each the sum in part order of its
    # fp32 partials (slots [shared tile, slots, BM, BN], row-major: gemm_split.store_partial) -- the bits the
    # tile's last part would have summed (gemm_split.sum_slots). The plan's counts as matmul_kernel got them;
    # under stream-K a tile's parts follow from its cut of the shared k-steps (K / BK a tile).
    partials_ptr, c_ptr, M, N, K, stride_c, whole_tiles, sharing, slots,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    ROWS: tl.constexpr,  # rows of a tile per program: program (shared tile, row chunk)
    PARTS: tl.constexpr,  # the wave split: its parts a tile (the plan's sharing, <= MAX_SPLIT); stream-K: the slots
    STREAM: tl.constexpr = False,  # stream-K: a tile has 2..PARTS parts, as many as ranges meet it
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch: wait for matmul_kernel first
):
    t = tl.program_id(0)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BN)
    pid_m, pid_n = grouped_tile(whole_tiles + t, tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    if STREAM:
        steps = tl.cdiv(K, BK)
        least, longer = stream_cut(tl.num_programs(0) * steps, sharing)
        parts = stream_owner(t * steps + steps - 1, least, longer) - stream_owner(t * steps, least, longer) + 1
    else:
        parts = PARTS
    wait_prior_grid(PDL)
    release_dependents(PDL)  # (the next kernel still waits for all of this one before touching memory)
    base = partials_ptr + tl.cast(t, tl.int64) * slots * (BM * BN) + rows[:, None] * BN + cols[None, :]
    total = tl.zeros([ROWS, BN], tl.float32)
    # Unrolled: the parts' loads are independent, so all go out before the first add waits (a runtime loop
    # issued a part's load after the previous part's add). Same order of adds. On an H200 at 70b-tp8 qkv
    # M = 128 (16 parts): 2.6 -> 2.4 us -- the kernel's time is mostly its start after the GEMM's end
    # (cuBLAS's split-K reduce kernel there: 2.0-2.1 us); results/2026-11-28-pdl-prefetch-h200. A slot past
    # a stream-K tile's parts reads as zeros (adding 0.0 changes no sum: ``total`` starts at +0.0).
    for part in tl.static_range(PARTS):
        if STREAM:
            total += tl.load(base + part * (BM * BN), mask=part < parts, other=0.0, cache_modifier=".cg")
        else:
            total += tl.load(base + part * (BM * BN), cache_modifier=".cg")
    if parts > 1:  # (a stream-K tile one range covers whole was stored by its program: every plan has none)
        store_tile(c_ptr, total, pid_m * BM + rows, pid_n * BN + cols, M, N, stride_c)
