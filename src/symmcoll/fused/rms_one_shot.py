"""all_reduce_rms_norm's one-shot kernel (the host side, launch rules and op: fused/all_reduce_rms_norm.py;
the row math it shares with the two-shot kernel: fused/rms_rows.py).

Stage 1: rows of x into my row of every peer's one-shot slots (one tile store reaches every peer); stage 2,
per step of rows: every peer's words as one tile (polled until no word is EMPTY, emptied after reading),
summed in rank order with my own rows as values, + residual, rounded, normalised (+ fp8). (W-1) * S stored
per rank: for decode-sized inputs. Program p handles the same rows in both stages, so it waits only on
program p of its peers.

On one rank no peer code, no slots and no launch epoch are compiled in and one launch takes every row
("auto": this kernel); it may load the next step's first chunk before finishing a step (``AHEAD``;
whole rows then hold the weight in registers, loaded once), or, where its grid covers the rows, take one
step per program with no loop (``ONE_STEP``; with ``EVEN_H``, rows that fill their block, no masks; a
config with ``every_step`` makes the grid cover the rows past the programs' cap).
With SYMMCOLL_PDL=1 (launcher.pdl_meta) it is launched with programmatic dependent launch: it waits for
the previous kernel (language/pdl.py) before any global access and lets the next one launch at once (its
loads are the kernel).
"""

import triton
import triton.language as tl

from ..language import (end_launch, narrow, open_slots, peer_rows, post_call, release_dependents, take_rows,
                        wait_prior_grid)
from .rms_rows import (chunk_words, end_rows, end_step, load_chunk, own_values, rank_sum, row_weight, row_words,
                       step_lanes)


@triton.jit(do_not_specialize=["rows", "eps"])
def rms_norm_one_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # inputs [rows, H] (weight [H], scale [1]) and outputs (scales [rows]) of this piece
    x_ptr, residual_ptr, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, rows, H, eps,
    # a row is ROW_BLOCK words in the slots (H values rounded up to a power of 2: BLOCK_H); ROWS rows per
    # step, CHUNK values of each at a time (CHUNK < BLOCK_H: one row, two passes); SLOT_WORDS per source;
    # PEERS = WORLD rounded up to a power of 2; QUANT: 0 none, 1 fp8 per tensor, 2 fp8 per token;
    # AHEAD (one rank only): the next step's first chunk is loaded before this step's last is finished;
    # one rank only: ONE_STEP, every program takes one step (the grid covers the rows: no loop, so no
    # barrier guarding the reduction's shared memory from the previous step's readers), EVEN_H, H ==
    # BLOCK_H (no column masks; the mean divides by a constant)
    WORLD: tl.constexpr, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, ROWS: tl.constexpr,
    CHUNK: tl.constexpr, SLOT_WORDS: tl.constexpr, PEERS: tl.constexpr, QUANT: tl.constexpr, AHEAD: tl.constexpr,
    ONE_STEP: tl.constexpr = False, EVEN_H: tl.constexpr = False,
    PDL: tl.constexpr = False,  # launched with programmatic dependent launch (language/pdl.py, launcher.pdl_meta)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # PDL: the previous kernel (the matmul that made x) done before anything global: rows, slots, epochs
    wait_prior_grid(PDL)
    # ... and the next PDL kernel may launch once every program of ours is here: it overlaps all of this
    # (a memory-bound pass: its loads are the whole kernel) and waits for our completion before it
    # touches memory; our programs are all resident by then, so no wait of ours loses an SM to it.
    # (Issued after the step's loads instead, it cost 9 registers at 2048 x 4096.)
    release_dependents(PDL)
    if WORLD > 1:  # one rank: nothing goes through the slots, no epoch to keep
        epoch, base, region, headers, pads, peer_headers = open_slots(slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev,
                                                                      desc, rank, WORLD, 1, SLOT_WORDS)
    steps = tl.cdiv(rows, ROWS)
    # A step is ROWS consecutive rows: ROWS * ROW_BLOCK consecutive slot words; a chunk of a row is
    # WORDS of them from word CHUNK / VALUES_PER_WORD * (chunk number) of the row.
    VALUES_PER_WORD: tl.constexpr = BLOCK_H // ROW_BLOCK
    WORDS: tl.constexpr = CHUNK // VALUES_PER_WORD
    lanes, in_step, peers, is_peer = step_lanes(rank, WORLD, ROWS, WORDS, PEERS)
    if WORLD > 1:
        # Stage 1: my rows into my row of every peer's slots (one tile store reaches every peer).
        to_peers = peer_rows(slot_ptrs_dev, peers, is_peer, tl.int32)
        for step in range(pid, steps, nprog):
            row_ids = step * ROWS + in_step
            for start in range(0, BLOCK_H, CHUNK):
                word0, used = chunk_words(start, lanes, H, VALUES_PER_WORD, WORDS)
                sent = used & (step * ROWS + lanes // WORDS < rows)
                words = row_words(x_ptr, row_ids, row_ids < rows, H, start, FORMAT, WORDS, CHUNK)
                tl.store(to_peers + base + rank * SLOT_WORDS + step * ROWS * ROW_BLOCK + word0 + lanes[None, :],
                         tl.broadcast_to(words[None, :], (PEERS, ROWS * WORDS)), mask=is_peer[:, None] & sent[None, :])
        post_call(pads, peer_headers, epoch, desc, rank, WORLD)
    # Stage 2: per step, every peer's words at once; sum in rank order, add, normalise.
    budget = max_spins
    check = 1
    LOCAL_STEP: tl.constexpr = ONE_STEP and WORLD == 1  # (nothing ahead of a program's only step)
    LOAD_AHEAD: tl.constexpr = AHEAD and WORLD == 1 and not LOCAL_STEP
    if EVEN_H and WORLD == 1:
        H = BLOCK_H  # a constexpr from here: masks on it fold away, the mean is a multiply
    # The weight: whole rows with loads ahead hold it through their steps (loaded once, after the first
    # step's x and residual: in flight with them); other whole rows load it with each step's, chunked
    # rows with each chunk's where per-token fp8 needs it in pass 1.
    HELD_WEIGHT: tl.constexpr = LOAD_AHEAD and CHUNK == BLOCK_H
    STEP_WEIGHT: tl.constexpr = (CHUNK == BLOCK_H and not HELD_WEIGHT) or (CHUNK < BLOCK_H and QUANT == 2)
    if LOAD_AHEAD:
        x_next, residual_next, weight_next = load_chunk(x_ptr, residual_ptr, weight_ptr, pid * ROWS + in_step,
                                                        pid * ROWS + in_step < rows, H, 0, CHUNK, STEP_WEIGHT)
    held_weight = row_weight(weight_ptr, H, BLOCK_H) if HELD_WEIGHT else tl.zeros([CHUNK], tl.float32)
    # (a loop of one constant trip when LOCAL_STEP: the compiler removes it)
    for i in range(0, 1 if LOCAL_STEP else steps - pid, 1 if LOCAL_STEP else nprog):
        step = pid + i
        row_ids = step * ROWS + in_step
        if LOCAL_STEP and ROWS == 1:
            row_ok = tl.full([ROWS], 1, tl.int1)  # the grid is the rows: every program's row exists
        else:
            row_ok = row_ids < rows
        squares = tl.zeros([ROWS, CHUNK], tl.float32)
        peaks = tl.zeros([ROWS, CHUNK], tl.int32)
        if not LOAD_AHEAD:
            x_next, residual_next, weight_next = load_chunk(x_ptr, residual_ptr, weight_ptr, row_ids, row_ok, H, 0,
                                                            CHUNK, STEP_WEIGHT)
        for start in range(0, BLOCK_H, CHUNK):
            # One rank, 16-bit rows: x is not sanitised (no -0 -> +0: no peer reads my words); the sum is
            # rounded, then + 0.0 makes -0 +0 as the reference's sum over ranks does (own_values(x) +
            # residual, value for value; fp32 rows keep own_values: the EMPTY pattern reads -0). The
            # compiler then adds 16-bit rows two values an instruction (fptrunc(fpext a + fpext b) is the
            # 16-bit add), and the residual stored is the one narrowed after the + 0.0: 288 -> 216 SASS
            # instructions a row of 4096 (torch.compile's kernel: about 240), at 512 tokens ~1.3 us of
            # instruction issue per SM.
            total = x_next if (WORLD == 1 and FORMAT != 2) else own_values(x_next, FORMAT)
            residual = residual_next
            weight = held_weight if HELD_WEIGHT else weight_next
            if LOAD_AHEAD:
                # After a step's last chunk, the next step's first: in flight through this step's norm.
                wrap = start + CHUNK >= BLOCK_H
                ahead_rows = row_ids + tl.where(wrap, nprog * ROWS, 0)
                x_next, residual_next, weight_next = load_chunk(x_ptr, residual_ptr, weight_ptr, ahead_rows,
                                                                ahead_rows < rows, H, tl.where(wrap, 0, start + CHUNK),
                                                                CHUNK, STEP_WEIGHT)
            elif CHUNK < BLOCK_H:
                x_next, residual_next, weight_next = load_chunk(x_ptr, residual_ptr, weight_ptr, row_ids, row_ok, H,
                                                                start + CHUNK, CHUNK, STEP_WEIGHT)
            if WORLD > 1:
                word0, used = chunk_words(start, lanes, H, VALUES_PER_WORD, WORDS)
                sent = used & (step * ROWS + lanes // WORDS < rows)
                slots = region + base + peers[:, None] * SLOT_WORDS + step * ROWS * ROW_BLOCK + word0 + lanes[None, :]
                tile, budget = take_rows(slots, is_peer[:, None] & sent[None, :], peers, rank, budget, status_ptr,
                                         desc, headers, epoch, check, WORLD)
                check = 0
                total = rank_sum(tile, total, peers, rank, WORLD, FORMAT, ROWS, WORDS, CHUNK)
            if WORLD == 1:
                rounded = narrow(total + residual, residual_out_ptr.dtype.element_ty).to(tl.float32)
                new_residual = narrow(rounded + 0.0, residual_out_ptr.dtype.element_ty).to(tl.float32)
            else:
                new_residual = narrow(total + residual, residual_out_ptr.dtype.element_ty).to(tl.float32)
            # WORLD == 1 is a constexpr that decides the `or`: no wait that can fail, so no branch between this
            # chunk and the next one's loads; otherwise the branch is on the budget.
            if WORLD == 1 or budget > 0:
                squares, peaks = end_step(new_residual, weight, squares, peaks, row_ids, row_ok, start, weight_ptr,
                                          scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H, eps, QUANT, CHUNK,
                                          BLOCK_H)
        if budget > 0:
            end_rows(squares, peaks, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr,
                     H, eps, QUANT, CHUNK, BLOCK_H)
    if WORLD > 1:
        end_launch(epochs_ptr, epoch)
