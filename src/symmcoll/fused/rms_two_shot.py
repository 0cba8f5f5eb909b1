"""all_reduce_rms_norm's two-shot kernel (the host side, launch rules and op: fused/all_reduce_rms_norm.py;
the row math it shares with the one-shot kernel: fused/rms_rows.py).

W shards of ceil(T / W) whole rows. Stage 0: shard s of x to rank s's scatter slots; stage 1: my shard's
sums + residual, rounded: stored, normalised, and pushed to every peer's gather slots; stage 2: peers'
new residual rows stored and normalised here (the gather moves the residual only: 2 (W-1)/W * S per
rank). The new residual is sanitised before it is normalised here, so the owner and the peers that
gather it normalise the same bits. Program p handles the same rows in every stage, so it waits only on
program p of its peers.
"""

import triton
import triton.language as tl

from ..language import (end_launch, narrow, open_two_stage_slots, own_shard, peer_rows, post_call, sanitize_values,
                        take_rows, words_of)
from .rms_rows import (chunk_words, end_rows, end_step, load_chunk, load_weight, own_values, rank_sum, row_words,
                       step_lanes, word_values)


@triton.jit(do_not_specialize=["rows", "shard_rows", "eps"])
def rms_norm_two_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # inputs [rows, H] (weight [H], scale [1]) and outputs (scales [rows]) of this piece; shard s = rows
    # [s * shard_rows, (s + 1) * shard_rows) below ``rows``
    x_ptr, residual_ptr, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, rows, shard_rows, H, eps,
    WORLD: tl.constexpr, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
    CHUNK: tl.constexpr, SLOT_WORDS: tl.constexpr, PEERS: tl.constexpr, QUANT: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if WORLD > 1:
        epoch, scatter_base, gather_base, region, headers, pads, peer_headers = open_two_stage_slots(
            slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc, rank, WORLD, SLOT_WORDS)
    VALUES_PER_WORD: tl.constexpr = BLOCK_H // ROW_BLOCK
    WORDS: tl.constexpr = CHUNK // VALUES_PER_WORD
    lanes, in_step, peers, is_peer = step_lanes(rank, WORLD, ROWS, WORDS, PEERS)
    steps = tl.cdiv(shard_rows, ROWS)
    if WORLD > 1:
        to_peers = peer_rows(slot_ptrs_dev, peers, is_peer, tl.int32)
        # Stage 0: rows i of shard s of my x -> my row of rank s's scatter slots, every s at once.
        for step in range(pid, steps, nprog):
            in_shard = step * ROWS + in_step
            their_rows = peers[:, None] * shard_rows + in_shard[None, :]
            their_ok = is_peer[:, None] & (in_shard < shard_rows)[None, :] & (their_rows < rows)
            lane_rows = peers[:, None] * shard_rows + (step * ROWS + lanes // WORDS)[None, :]
            for start in range(0, BLOCK_H, CHUNK):
                word0, used = chunk_words(start, lanes, H, VALUES_PER_WORD, WORDS)
                words = row_words(x_ptr, tl.reshape(their_rows, [PEERS * ROWS]), tl.reshape(their_ok, [PEERS * ROWS]),
                                  H, start, FORMAT, WORDS, CHUNK)
                sent = is_peer[:, None] & used[None, :] & ((step * ROWS + lanes // WORDS) < shard_rows)[None, :] \
                    & (lane_rows < rows)
                tl.store(to_peers + scatter_base + rank * SLOT_WORDS + step * ROWS * ROW_BLOCK + word0 + lanes[None, :],
                         tl.reshape(words, [PEERS, ROWS * WORDS]), mask=sent)
        post_call(pads, peer_headers, epoch, desc, rank, WORLD)
    # Stage 1: my rows: sum, add, round; store, normalise, and push the new residual to every peer.
    budget = max_spins
    check = 1
    STEP_WEIGHT: tl.constexpr = CHUNK == BLOCK_H or QUANT == 2
    for step in range(pid, steps, nprog):
        _, my_rows, mine_ok = own_shard(step, ROWS, in_step, rank, shard_rows, rows)
        squares = tl.zeros([ROWS, CHUNK], tl.float32)
        peaks = tl.zeros([ROWS, CHUNK], tl.int32)
        x_next, residual_next, weight_next = load_chunk(x_ptr, residual_ptr, weight_ptr, my_rows, mine_ok, H, 0, CHUNK,
                                                        STEP_WEIGHT)
        for start in range(0, BLOCK_H, CHUNK):
            total, residual, weight = own_values(x_next, FORMAT), residual_next, weight_next
            if CHUNK < BLOCK_H:
                x_next, residual_next, weight_next = load_chunk(x_ptr, residual_ptr, weight_ptr, my_rows, mine_ok, H,
                                                                start + CHUNK, CHUNK, STEP_WEIGHT)
            if WORLD > 1:
                word0, used = chunk_words(start, lanes, H, VALUES_PER_WORD, WORDS)
                lane_in_shard = step * ROWS + lanes // WORDS
                lane_mine = used & (lane_in_shard < shard_rows) & (rank * shard_rows + lane_in_shard < rows)
                received = is_peer[:, None] & lane_mine[None, :]
                at = step * ROWS * ROW_BLOCK + word0 + lanes[None, :]
                tile, budget = take_rows(region + scatter_base + peers[:, None] * SLOT_WORDS + at, received, peers,
                                         rank, budget, status_ptr, desc, headers, epoch, check, WORLD)
                check = 0
                total = rank_sum(tile, total, peers, rank, WORLD, FORMAT, ROWS, WORDS, CHUNK)
            # The new residual as the peers will see it (rounded and sanitised alike).
            new_residual = sanitize_values(narrow(total + residual, residual_out_ptr.dtype.element_ty).to(tl.float32),
                                           FORMAT)
            if WORLD == 1 or budget > 0:  # (constexpr `or`: no branch at WORLD == 1)
                squares, peaks = end_step(new_residual, weight, squares, peaks, my_rows, mine_ok, start, weight_ptr,
                                          scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H, eps, QUANT, CHUNK,
                                          BLOCK_H)
                if WORLD > 1:
                    words = words_of(tl.reshape(new_residual, [ROWS * CHUNK]), FORMAT, ROWS * WORDS)
                    tl.store(to_peers + gather_base + rank * SLOT_WORDS + at,
                             tl.broadcast_to(words[None, :], (PEERS, ROWS * WORDS)), mask=received)
        if budget > 0:
            end_rows(squares, peaks, my_rows, mine_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr,
                     H, eps, QUANT, CHUNK, BLOCK_H)
    if WORLD > 1:
        # Stage 2: every peer's new residual rows from my gather slots; store and normalise them here.
        for step in range(pid, steps, nprog):
            in_shard = step * ROWS + in_step
            their_rows = tl.reshape(peers[:, None] * shard_rows + in_shard[None, :], [PEERS * ROWS])
            their_ok = tl.reshape(is_peer[:, None] & (in_shard < shard_rows)[None, :]
                                  & (peers[:, None] * shard_rows + in_shard[None, :] < rows), [PEERS * ROWS])
            lane_rows = peers[:, None] * shard_rows + (step * ROWS + lanes // WORDS)[None, :]
            squares = tl.zeros([PEERS * ROWS, CHUNK], tl.float32)
            peaks = tl.zeros([PEERS * ROWS, CHUNK], tl.int32)
            for start in range(0, BLOCK_H, CHUNK):
                word0, used = chunk_words(start, lanes, H, VALUES_PER_WORD, WORDS)
                received = is_peer[:, None] & used[None, :] \
                    & ((step * ROWS + lanes // WORDS) < shard_rows)[None, :] & (lane_rows < rows)
                tile, budget = take_rows(region + gather_base + peers[:, None] * SLOT_WORDS + step * ROWS * ROW_BLOCK
                                         + word0 + lanes[None, :], received, peers, rank, budget, status_ptr, desc,
                                         headers, epoch, 0, WORLD)
                new_residual = word_values(tl.reshape(tile, [PEERS * ROWS, WORDS]), FORMAT, WORDS, CHUNK)
                if budget > 0:
                    squares, peaks = end_step(new_residual, load_weight(weight_ptr, H, start, CHUNK), squares, peaks,
                                              their_rows, their_ok, start, weight_ptr, scale_ptr, normed_ptr,
                                              residual_out_ptr, scales_ptr, H, eps, QUANT, CHUNK, BLOCK_H)
            if budget > 0:
                end_rows(squares, peaks, their_rows, their_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr,
                         scales_ptr, H, eps, QUANT, CHUNK, BLOCK_H)
        end_launch(epochs_ptr, epoch)
