"""Data movement: all-to-all over symmetric memory, rank s's chunk j goes to rank j (MoE token exchange).

``x`` is cut along dim 0 into W chunks, chunk j for rank j: equal chunks (``splits=None``,
x.shape[0] divisible by W, like ``all_to_all_single`` without split sizes) or ``splits[j]`` rows for
rank j. The output is the chunks received, concatenated in source-rank order; its row count comes from
the peers' splits.

pull
    Every rank stages its chunks for peers in its own symmetric buffer, packed in destination order
    (its own chunk is never staged); a barrier publishes them; every rank then reads, from each peer
    s, the chunk s staged for it, straight into its slot of the output (peers taken in the order
    rank+1, rank+2, ...), and copies its own chunk from its input. An exit barrier keeps the next call
    from overwriting a buffer a peer is still reading::

        rank r:   x_r[j] --copy--> buf_r[off_r(j)]         for every j != r (local)
                  barrier                                  (program pid with program pid of every peer)
                  buf_s[off_s(r)] --read--> out_r[s]       for every s != r (NVLink), x_r[r] --> out_r[r]
                  barrier                                  (exit)

    off_s(j) = sum of s's staged chunk lengths for destinations below j: every rank computes it from
    the W x W split matrix, which every rank holds. Traffic: each rank reads exactly what it receives
    over NVLink (the minimum), and copies what it sends locally once.

    Split sizes: every rank publishes its (clamped) splits in its ``all_to_all.splits`` region in the
    kernel, before the entry barrier, and reads the peers' after it: the W x W matrix and every offset
    are computed on the device. That is all device-side splits need (the output is sized by the caller's
    ``max_rows``; rows beyond it are counted, reported and not written). A list of splits is first
    exchanged by ``splits.exchange_splits`` so that the host can size the output exactly (one
    device-to-host synchronisation); equal splits need no exchange.

    Chunking: when every rank's staged chunks fit in the workspace, one launch. Otherwise the chunks
    move in rounds: round t moves words [t*L, (t+1)*L) of every chunk, L the largest piece length for
    which every rank's staged pieces fit; all ranks derive L, the number of rounds and the grid from the
    split matrix (device splits: from max_rows, the bound of every chunk), so they launch the same
    sequence. The own chunk is copied whole in round 0.

    Work split: program ``pid`` owns blocks pid, pid + P, ... of every chunk piece, both when staging
    and when reading, so program ``pid`` only waits on program ``pid`` of its peers.

    Wins at small and medium sizes (two barriers, one launch, no per-peer send/recv pairs), which is
    where MoE dispatch/combine with few tokens per expert sits.

The kernel moves words: any dtype of itemsize 1, 2, 4 or 8; other itemsizes fall back to the process
group's ``all_to_all_single``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..language import MAX_WORLD, announce, block_barrier, clamped_splits, copy_blocks, peer_ptr, record_argument
from ..language.signals import ARG_MAX_ROWS
from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..plan import Algorithm, Plan, register, word_dtype_reason
from .common import as_words, cdiv, config, launch_once, move_config
from .splits import bounded_rounds, exchange_outputs, plan_rounds, split_matrix

SPLITS = declare(RegionSpec(
    "all_to_all.splits", "all_to_all", lambda g: 8 * MAX_WORLD.value,
    "rank r writes its own splits before its entry barrier; peers read them between entry and exit barrier"))


@triton.jit
def _piece(n, piece_start, piece_len):
    """Length of words [piece_start, piece_start + piece_len) of chunks of ``n`` words."""
    return tl.minimum(tl.maximum(n - piece_start, 0), piece_len)


@triton.jit
def _aligned(v, ALIGN: tl.constexpr):
    """``v`` (a word offset or length the host made a multiple of ALIGN), in a form from which the
    compiler can see it: rounding down is exact here and, unlike ``tl.multiple_of`` on a scalar,
    lets 16-byte vector accesses through."""
    if ALIGN > 1:
        v = v // ALIGN * ALIGN
    return v


@triton.jit
def _exclusive(values, lanes, below):
    """Sum of ``values`` over lanes < ``below``."""
    return tl.sum(tl.where(lanes < below, values, 0), axis=0)


@triton.jit
def all_to_all_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the address tables of the shared buffer and of the published splits
    desc, buffer_ptrs_dev, splits_ptrs_dev,
    # tensors: my splits (WORLD ints: rows I send to each rank, a device tensor) and the rows received
    # from each rank (WORLD int64, written here); x has x_rows rows, out max_rows (= max_words words),
    # of row_numel words
    x_ptr, out_ptr, splits_ptr, recv_ptr, x_rows, max_rows, max_words, row_numel,
    # this round: words [piece_start, piece_start + piece_len) of every chunk for a peer; my own chunk
    # (whole) in the first round (piece_start = 0)
    piece_start, piece_len,
    # ALIGN (a power of two <= 16) divides every chunk offset and length, in words
    WORLD: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    lanes = tl.arange(0, MAX_WORLD)
    valid = lanes < WORLD
    first_round = piece_start == 0
    my_buf = peer_ptr(buffer_ptrs_dev, rank, elem)
    # Rows I send to each rank: published for the peers (every program stores the same values, so a
    # peer's program pid reads what my program pid wrote before their barrier).
    sent_rows = clamped_splits(splits_ptr, lanes, valid, x_rows, first_round & (tl.program_id(0) == 0),
                               status_ptr, rank, desc)
    tl.store(peer_ptr(splits_ptrs_dev, rank, tl.int64) + lanes, sent_rows, mask=valid)
    sent = sent_rows * row_numel
    staged = tl.where(lanes != rank, _piece(sent, piece_start, piece_len), 0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)

    for k in tl.static_range(1, WORLD):
        dest = (rank + k) % WORLD
        x_off = _aligned(_exclusive(sent, lanes, dest), ALIGN)
        buf_off = _aligned(_exclusive(staged, lanes, dest), ALIGN)
        n = _aligned(tl.sum(tl.where(lanes == dest, staged, 0), axis=0), ALIGN)
        copy_blocks(x_ptr + _aligned(x_off + piece_start, ALIGN), my_buf + buf_off, n, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        # Rows each rank sends me: column ``rank`` of the published matrix.
        table = splits_ptrs_dev.to(tl.pointer_type(tl.uint64))
        columns = tl.load(table + lanes, mask=valid, other=0).to(tl.pointer_type(tl.int64))
        recv_rows = tl.load(columns + rank, mask=valid, other=0)
        total = tl.sum(recv_rows, axis=0)
        if first_round & (tl.program_id(0) == 0):
            tl.store(recv_ptr + lanes, recv_rows, mask=valid)
            if total > max_rows:
                record_argument(status_ptr, ARG_MAX_ROWS, total, max_rows, rank, desc)
        # The output holds them in source-rank order; nothing is written at or beyond max_rows.
        recv = recv_rows * row_numel
        out_self = _aligned(_exclusive(recv, lanes, rank), ALIGN)
        n_self = tl.minimum(tl.where(first_round, tl.sum(tl.where(lanes == rank, sent, 0), axis=0), 0),
                            tl.maximum(max_words - out_self, 0))
        copy_blocks(x_ptr + _aligned(_exclusive(sent, lanes, rank), ALIGN), out_ptr + out_self, _aligned(n_self, ALIGN),
                    BLOCK)
        for k in tl.static_range(1, WORLD):
            src = (rank + k) % WORLD
            # src's chunks for peers, and where in its buffer src staged this round's piece for me
            theirs = tl.load(peer_ptr(splits_ptrs_dev, src, tl.int64) + lanes, mask=valid & (lanes != src),
                             other=0) * row_numel
            pieces = _piece(theirs, piece_start, piece_len)
            buf_off = _aligned(_exclusive(pieces, lanes, rank), ALIGN)
            out_off = _aligned(_exclusive(recv, lanes, src) + piece_start, ALIGN)
            n = tl.minimum(tl.sum(tl.where(lanes == rank, pieces, 0), axis=0), tl.maximum(max_words - out_off, 0))
            copy_blocks(peer_ptr(buffer_ptrs_dev, src, elem) + buf_off, out_ptr + out_off, _aligned(n, ALIGN), BLOCK)
        # Nobody may overwrite its buffer or splits (next call) until every peer has read them.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


def _all_to_all(plan: Plan, x: torch.Tensor, out: torch.Tensor | None, splits_dev: torch.Tensor | None = None):
    ws, world = plan.ws, plan.world
    row_numel = math.prod(x.shape[1:])
    matrix = split_matrix(plan, x)
    words = as_words(x)
    align = math.gcd(row_numel, 16)
    capacity = ws.capacity(words.dtype)
    out, recv, max_rows, splits_dev = exchange_outputs(plan, x, out, matrix, splits_dev)
    if matrix is None:  # device splits: sizes only the device knows, bounded by max_rows
        piece, rounds = bounded_rounds(max_rows * row_numel, capacity, world, align)
        exchange_bytes = max_rows * row_numel * x.element_size()
        longest_self = piece
    else:
        elems = [[n * row_numel for n in line] for line in matrix]
        if not any(map(any, elems)):
            return out  # nothing moves anywhere: every rank knows it, none launches
        piece, rounds = plan_rounds(elems, capacity, align)
        # The average bytes per rank of the whole exchange: the same number on every rank.
        exchange_bytes = sum(map(sum, elems)) * x.element_size() // world
        longest_self = max(elems[s][s] for s in range(world))
    # Every chunk, piece and offset is a multiple of align words (16 when rows are a multiple of 16
    # words), which the kernel turns into vector accesses of up to 16 bytes.
    cfg = move_config(x.element_size(), exchange_bytes, x.device.type)
    grid = cfg.grid(cdiv(max(piece, longest_self), cfg.block))
    prefix = (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, ws.region(SPLITS.name).ptrs_dev)
    constexprs = dict(WORLD=world, BLOCK=cfg.block, ALIGN=align, num_warps=cfg.num_warps)
    if plan.request.splits is None and rounds == 1:
        # Equal splits in one round: all but the input and output is fixed by the plan (its splits
        # tensor and counts included), so on GPU later calls take the prepared launch (plan.fast).
        launch_once(plan, all_to_all_kernel, grid, prefix, words, as_words(out),
                    (splits_dev, recv, x.shape[0], max_rows, max_rows * row_numel, row_numel, 0, piece), constexprs,
                    whole=True)
        return out
    for t in range(rounds):
        launch(all_to_all_kernel, grid, (*prefix, words, as_words(out), splits_dev, recv, x.shape[0], max_rows,
                                         max_rows * row_numel, row_numel, t * piece, piece), constexprs)
    return (out, recv) if matrix is None else out


register(Algorithm("all_to_all", "pull", 40, "all_to_all", _all_to_all,
                   "stage chunks for peers, barrier, read my chunk from every peer", None,
                   accepts=word_dtype_reason, instead="nccl"))
