"""The quantized all-reduce's first kernel, kept for one GPU comparison (SYMMCOLL_QUANT_TILES=1,
``debug_switches``): every stage works on a [PEERS, BLOCK] tile, row i from rank i. comm/quantized.py
holds the protocol and the kernel that replaced it (one [BLOCK] row per rank); this file goes once the
GPU has decided (issue 18).

Why it was replaced (sm_90 SASS, int8, G 64, 16 MB bf16 at world 2, LaunchConfig(2048, 264, 8)): the
tile puts its rows in different warps (warpsPerCTA [2, 4]), so the rank-order sum extracts every row
through shared memory (66 STS + 66 LDS + 14 barriers per thread and step in stage 1's arithmetic),
each poll reduces across warps twice per spin (75 barriers in stage 1's waits, 76 in stage 2's), and
at world 2 stages 0 and 2 mask off half the tile: half the warps idle."""

import triton
import triton.language as tl

from ..language import (OP_AVG, dequantize_groups, end_launch, narrow, open_two_stage_slots, own_shard, pack_words,
                        peer_rows, post_call, quantize_groups, shard_geometry, take_rows, unpack_words)

_AVG: tl.constexpr = tl.constexpr(OP_AVG)


@triton.jit
def _send(row_ptrs, b, codes, scales, rows_mask, n_words, n_groups, SCALES_AT: tl.constexpr,
          WORDS: tl.constexpr, GROUPS: tl.constexpr, BITS: tl.constexpr, ROWS: tl.constexpr,
          BLOCK: tl.constexpr):
    """Pack block ``b``'s codes and store them with their scales at ``row_ptrs`` ([PEERS, 1])."""
    word = b * WORDS + tl.arange(0, WORDS)
    group = b * GROUPS + tl.arange(0, GROUPS)
    words = pack_words(codes, ROWS, BLOCK, BITS)
    tl.store(row_ptrs + word[None, :], words, mask=rows_mask & (word < n_words)[None, :])
    tl.store(row_ptrs + SCALES_AT + group[None, :], scales.to(tl.int32, bitcast=True),
             mask=rows_mask & (group < n_groups)[None, :])


@triton.jit
def _receive(row_ptrs, rows, is_peer, b, n_words, n_groups, budget, status_ptr, rank, desc, headers, epoch,
             check, WORLD: tl.constexpr, SCALES_AT: tl.constexpr, WORDS: tl.constexpr, GROUPS: tl.constexpr,
             BITS: tl.constexpr, PEERS: tl.constexpr, BLOCK: tl.constexpr):
    """Block ``b`` of every peer's row at ``row_ptrs`` ([PEERS, 1], row i from rank i) once filled,
    emptied for reuse and unpacked: (int32 codes [PEERS, BLOCK], fp32 scales [PEERS, GROUPS], spins left)."""
    word = b * WORDS + tl.arange(0, WORDS)
    group = b * GROUPS + tl.arange(0, GROUPS)
    words, budget = take_rows(row_ptrs + word[None, :], is_peer[:, None] & (word < n_words)[None, :], rows, rank,
                              budget, status_ptr, desc, headers, epoch, check, WORLD)
    scale_bits, budget = take_rows(row_ptrs + SCALES_AT + group[None, :],
                                   is_peer[:, None] & (group < n_groups)[None, :], rows, rank, budget, status_ptr, desc,
                                   headers, epoch, 0, WORLD)
    return unpack_words(words, PEERS, BLOCK, BITS), scale_bits.to(tl.float32, bitcast=True), budget


@triton.jit
def _reduce_in_rank_order(values, rows, REDUCE_OP: tl.constexpr, WORLD: tl.constexpr):
    """Sum (avg) over the rows of a [PEERS, BLOCK] fp32 tile as ((r0 + r1) + r2) + ...: the order the
    reference uses, whatever order a block reduction would take (extracting a row adds zeros: exact)."""
    acc = tl.sum(tl.where(rows[:, None] == 0, values, 0.0), axis=0)
    for r in tl.static_range(1, WORLD):
        acc += tl.sum(tl.where(rows[:, None] == r, values, 0.0), axis=0)
    if REDUCE_OP == _AVG:
        acc = tl.math.div_rn(acc, tl.zeros_like(acc) + WORLD)
    return acc


@triton.jit
def quantized_tile_kernel(signal_pad_ptrs_dev, status_ptr, max_spins, rank, desc, slot_ptrs_dev, epochs_ptr, x_ptr,
                          out_ptr, numel, shard_len, WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FMT: tl.constexpr,
                          BITS: tl.constexpr, G: tl.constexpr, ROW: tl.constexpr, SCALES_AT: tl.constexpr,
                          BLOCK: tl.constexpr, PEERS: tl.constexpr):
    """quantized.py's kernel's arguments, and PEERS: WORLD rounded up to a power of two (the tile's rows)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch, scatter_base, gather_base, region, headers, pads, peer_headers = open_two_stage_slots(
        slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc, rank, WORLD, ROW)
    blocks, n_words, n_groups = shard_geometry(shard_len, BLOCK, BITS, G)
    lane = tl.arange(0, BLOCK)
    rows = tl.arange(0, PEERS)
    is_peer = (rows < WORLD) & (rows != rank)
    peers = peer_rows(slot_ptrs_dev, rows, is_peer, tl.int32)
    elem = out_ptr.dtype.element_ty

    # Stage 0: shard s of my input, quantized, into my row of rank s's scatter slots (every s at once).
    for b in range(pid, blocks, nprog):
        in_shard = b * BLOCK + lane
        offs = rows[:, None] * shard_len + in_shard[None, :]
        x = tl.load(x_ptr + offs, mask=is_peer[:, None] & (offs < numel), other=0).to(tl.float32)
        codes, scales = quantize_groups(x, PEERS, BLOCK, G, FMT)
        _send(peers + scatter_base + rank * ROW, b, codes, scales, is_peer[:, None], n_words, n_groups, SCALES_AT,
              BLOCK * BITS // 32, BLOCK // G, BITS, PEERS, BLOCK)
    post_call(pads, peer_headers, epoch, desc, rank, WORLD)

    # Stage 1: my shard = my own values (exact) + every peer's decoded codes, in rank order; the
    # re-quantized sum is my output (decoded from the codes I send) and goes to every peer.
    budget = max_spins
    check = 1
    for b in range(pid, blocks, nprog):
        _, offs, mask = own_shard(b, BLOCK, lane, rank, shard_len, numel)
        codes, scales, budget = _receive(region + scatter_base + rows[:, None] * ROW, rows, is_peer, b, n_words,
                                         n_groups, budget, status_ptr, rank, desc, headers, epoch, check, WORLD,
                                         SCALES_AT, BLOCK * BITS // 32, BLOCK // G, BITS, PEERS, BLOCK)
        check = 0
        values = dequantize_groups(codes, scales, PEERS, BLOCK, G, FMT)
        own = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.float32)
        reduced = _reduce_in_rank_order(tl.where(rows[:, None] == rank, own[None, :], values), rows, REDUCE_OP,
                                        WORLD)
        codes, scales = quantize_groups(reduced[None, :], 1, BLOCK, G, FMT)
        if budget > 0:
            result = dequantize_groups(codes, scales, 1, BLOCK, G, FMT)
            tl.store(out_ptr + offs[None, :], narrow(result, elem), mask=mask[None, :])
            _send(peers + gather_base + rank * ROW, b, tl.broadcast_to(codes, (PEERS, BLOCK)),
                  tl.broadcast_to(scales, (PEERS, BLOCK // G)), is_peer[:, None], n_words, n_groups, SCALES_AT,
                  BLOCK * BITS // 32, BLOCK // G, BITS, PEERS, BLOCK)

    # Stage 2: every other reduced shard from my gather slots into my output.
    for b in range(pid, blocks, nprog):
        in_shard = b * BLOCK + lane
        codes, scales, budget = _receive(region + gather_base + rows[:, None] * ROW, rows, is_peer, b, n_words,
                                         n_groups, budget, status_ptr, rank, desc, headers, epoch, 0, WORLD,
                                         SCALES_AT, BLOCK * BITS // 32, BLOCK // G, BITS, PEERS, BLOCK)
        offs = rows[:, None] * shard_len + in_shard[None, :]
        if budget > 0:
            values = dequantize_groups(codes, scales, PEERS, BLOCK, G, FMT)
            tl.store(out_ptr + offs, narrow(values, elem),
                     mask=is_peer[:, None] & (in_shard < shard_len)[None, :] & (offs < numel))
    end_launch(epochs_ptr, epoch)
