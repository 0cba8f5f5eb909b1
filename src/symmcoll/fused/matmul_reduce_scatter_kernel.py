"""The kernel of matmul_reduce_scatter's fused variant (fused/matmul_reduce_scatter.py: the algorithm in
its docstring, the regions, the tiling and the launches; matmul_all_reduce's two_shot runs it too).

``matmul_reduce_scatter_kernel`` is one persistent GEMM over the GEMM core's ``k_loop``. Per shard (the
default): a program computes its tiles of each row shard in the order rank+1, ..., rank, sends a peer's
tile to its owner as soon as it is done (``_send_tile``: my slot of the owner's stage, then a flag) and
adds the peers' tiles to each tile of its own shard once their flags arrive (``_add_peer_tiles``, in
rank order). ONE_PASS (shards shorter than a tile: decode): ``_one_pass_tiles`` tiles all W shards'
rows at once, sending each owner its rows of a tile, so B is read from DRAM once. ``_region_at`` turns
the stage region's address table into a typed pointer into any rank's region.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..language import MAX_WORLD, announce, end_launch, launch_epoch, narrow, send_tile_flag, wait_tile_flag
from .gemm_kernel import grouped_tile, k_loop, operand_sources, store_tile

# Stage slots and flags alternate between two phases by launch epoch (epoch % 2).
STAGE_PHASES: tl.constexpr = tl.constexpr(2)


@triton.jit
def _region_at(ptrs_dev, peer, byte_offset, ELEM: tl.constexpr):
    """Typed pointer ``byte_offset`` bytes into ``peer``'s region (offsets are multiples of 16)."""
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    return tl.multiple_of((tl.load(table + peer) + byte_offset).to(tl.pointer_type(ELEM)), 16)


@triton.jit
def _send_tile(acc, mask, owner, j, rank, phase, ready, stage_ptrs_dev, in_tile, WORLD: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, SLOT_ELEMS: tl.constexpr, MAX_TILES: tl.constexpr,
               DATA_OFFSET: tl.constexpr, ELEM: tl.constexpr):
    """Tile j's rows for ``owner`` (``mask``: [BM, 1] of its rows, or None for the whole tile), rounded to
    ELEM, into my slot of its stage, then its flag of (source me, tile j)."""
    slot = rank - tl.cast(rank > owner, tl.int32)
    peer_slots = _region_at(stage_ptrs_dev, owner, DATA_OFFSET, ELEM)
    tile = peer_slots + (phase * (WORLD - 1) + slot).to(tl.int64) * SLOT_ELEMS + j * (BM * BN)
    tl.store(tile + in_tile, narrow(acc, ELEM), mask=mask)
    peer_flags = _region_at(stage_ptrs_dev, owner, 0, tl.int64)
    send_tile_flag(peer_flags + (phase * MAX_WORLD + rank) * MAX_TILES + j, ready)


@triton.jit
def _add_peer_tiles(acc, mask, other, j, rank, my_flags, my_slots, ready, budget, status_ptr, desc, in_tile,
                    WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SLOT_ELEMS: tl.constexpr,
                    MAX_TILES: tl.constexpr):
    """``acc`` + every peer's tile j in my slots, in rank order, each once its flag arrived (``mask`` /
    ``other``: [BM, 1] of my rows and 0.0, or None for the whole tile); (acc, budget left)."""
    for src in tl.static_range(WORLD):
        if src != rank:
            budget = wait_tile_flag(my_flags + src * MAX_TILES + j, ready, budget, status_ptr, rank, src, desc)
            slot = src - tl.cast(src > rank, tl.int32)
            acc += tl.load(my_slots + slot * SLOT_ELEMS + j * (BM * BN) + in_tile, mask=mask, other=other).to(tl.float32)
    return acc, budget


@triton.jit
def _one_pass_tiles(
    a_src, b_src, out_ptr, M, N, K, stride_a, stride_b, stride_out, rows_per_shard, first_tile, piece_tiles, rank,
    stage_ptrs_dev, my_flags, my_slots, phase, ready, budget, status_ptr, desc,
    WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP_AB: tl.constexpr,
    B_T: tl.constexpr, TMA: tl.constexpr, PRECISION: tl.constexpr, SLOT_ELEMS: tl.constexpr,
    MAX_TILES: tl.constexpr, DATA_OFFSET: tl.constexpr,
):
    """The kernel's tiles where shards are shorter than a tile (``one_pass_tiles``): the grid is
    [WORLD * rows_per_shard, N] in BM-row blocks, tile j of the piece = (row block, column block) of
    first_tile + j in column-major order (a column's row blocks on neighbouring programs: B's block
    comes from DRAM once), computed by program j % P on every rank. A tile's rows belong to owners
    first_row // rows_per_shard .. last_row // rows_per_shard: each peer owner gets its rows (at their
    place in the tile) in my slot of its stage and one flag, exactly as a per-shard tile; if I own rows
    of it, I add every peer's rows of it in rank order once their flags arrive, and store mine."""
    ELEM: tl.constexpr = out_ptr.dtype.element_ty
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    grid_rows = WORLD * rows_per_shard
    num_rows = tl.cdiv(grid_rows, BM)
    in_tile = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    for j in range(pid, piece_tiles, nprog):
        row0 = ((first_tile + j) % num_rows) * BM
        col0 = ((first_tile + j) // num_rows) * BN
        acc = k_loop(a_src, b_src, row0, col0, 0, K, M, N, K, stride_a, stride_b, BM, BN, BK, TMA, SWAP_AB, B_T,
                     PRECISION)
        rows = row0 + tl.arange(0, BM)
        first_owner = row0 // rows_per_shard
        last_owner = (tl.minimum(row0 + BM, grid_rows) - 1) // rows_per_shard
        for owner in range(first_owner, last_owner + 1):
            if owner != rank:
                owned = (rows >= owner * rows_per_shard) & (rows < (owner + 1) * rows_per_shard)
                _send_tile(acc, owned[:, None], owner, j, rank, phase, ready, stage_ptrs_dev, in_tile, WORLD, BM, BN,
                           SLOT_ELEMS, MAX_TILES, DATA_OFFSET, ELEM)
        if (first_owner <= rank) & (rank <= last_owner):
            local = rows - rank * rows_per_shard  # my shard's rows; outside [0, rows_per_shard): a peer's
            mine = (local >= 0) & (local < rows_per_shard)
            acc, budget = _add_peer_tiles(acc, mine[:, None], 0.0, j, rank, my_flags, my_slots, ready, budget,
                                          status_ptr, desc, in_tile, WORLD, BM, BN, SLOT_ELEMS, MAX_TILES)
            if budget > 0:
                # rows of my shard below M (a short last shard of matmul_all_reduce ends early)
                kept = mine & (local < M - rank * rows_per_shard)
                cols = col0 + tl.arange(0, BN)
                tl.store(out_ptr + local[:, None].to(tl.int64) * stride_out + cols[None, :],
                         narrow(acc, ELEM), mask=kept[:, None] & (cols[None, :] < N))


@triton.jit
def matmul_reduce_scatter_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the stage region's address table; this rank's launch-epoch table
    desc, stage_ptrs_dev, epochs_ptr,
    # A [M, K], B [K, N] (or W = B^T [N, K] if B_T; row strides given); out: my shard [rows_per_shard, N]
    a_ptr, b_ptr, out_ptr, M, N, K, stride_a, stride_b, stride_out,
    # shard s = rows [s * rows_per_shard, min(M, (s + 1) * rows_per_shard)); this piece = tiles
    # [first_tile, first_tile + piece_tiles) of every shard's grouped tile order (ONE_PASS: of the
    # whole grid's column-major order, whole columns)
    rows_per_shard, first_tile, piece_tiles,
    # SLOT_ELEMS: elements per (phase, source) slot; DATA_OFFSET: bytes of the flag table
    WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    SWAP_AB: tl.constexpr, B_T: tl.constexpr, TMA: tl.constexpr, HOST_DESC: tl.constexpr, PRECISION: tl.constexpr,
    SLOT_ELEMS: tl.constexpr, MAX_TILES: tl.constexpr, DATA_OFFSET: tl.constexpr,
    ONE_PASS: tl.constexpr = False,  # tiles over all W shards' rows at once (``one_pass_tiles``)
):
    ELEM: tl.constexpr = out_ptr.dtype.element_ty
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % STAGE_PHASES
    ready = (epoch.to(tl.int64) << 32) | desc
    num_m = tl.cdiv(rows_per_shard, BM)
    num_n = tl.cdiv(N, BN)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    a_src, b_src = operand_sources(a_ptr, b_ptr, M, N, K, stride_a, stride_b, BM, BN, BK, TMA, B_T, HOST_DESC)
    in_tile = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    my_flags = _region_at(stage_ptrs_dev, rank, 0, tl.int64) + phase * (MAX_WORLD * MAX_TILES)
    my_slots = _region_at(stage_ptrs_dev, rank, DATA_OFFSET, ELEM) + phase * (WORLD - 1) * SLOT_ELEMS
    budget = max_spins
    if ONE_PASS:
        _one_pass_tiles(a_src, b_src, out_ptr, M, N, K, stride_a, stride_b, stride_out, rows_per_shard, first_tile,
                        piece_tiles, rank, stage_ptrs_dev, my_flags, my_slots, phase, ready, budget, status_ptr, desc,
                        WORLD, BM, BN, BK, SWAP_AB, B_T, TMA, PRECISION, SLOT_ELEMS, MAX_TILES, DATA_OFFSET)
    else:
        for k in range(1, WORLD + 1):
            owner = (rank + k) % WORLD  # k == WORLD: my own shard, last
            first_row = owner * rows_per_shard
            shard_rows = tl.minimum(rows_per_shard, M - first_row)
            # My tiles of this shard: j with (owner * piece_tiles + j) % nprog == pid.
            for j in range((pid + nprog - (owner * piece_tiles) % nprog) % nprog, piece_tiles, nprog):
                pid_m, pid_n = grouped_tile(first_tile + j, num_m, num_n, GROUP_M)
                acc = k_loop(a_src, b_src, first_row + pid_m * BM, pid_n * BN, 0, K, first_row + shard_rows, N, K,
                             stride_a, stride_b, BM, BN, BK, TMA, SWAP_AB, B_T, PRECISION)
                if owner != rank:
                    _send_tile(acc, None, owner, j, rank, phase, ready, stage_ptrs_dev, in_tile, WORLD, BM, BN,
                               SLOT_ELEMS, MAX_TILES, DATA_OFFSET, ELEM)
                else:
                    acc, budget = _add_peer_tiles(acc, None, None, j, rank, my_flags, my_slots, ready, budget,
                                                  status_ptr, desc, in_tile, WORLD, BM, BN, SLOT_ELEMS, MAX_TILES)
                    if budget > 0:
                        store_tile(out_ptr, acc, pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN),
                                   shard_rows, N, stride_out)
    end_launch(epochs_ptr, epoch)
