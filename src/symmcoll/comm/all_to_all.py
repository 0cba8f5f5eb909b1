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

    Split sizes: with ``splits`` given, the ranks first exchange them with a small gather kernel of
    this module over the same workspace (its barriers carry the call descriptor, so a peer whose rows
    have another size or dtype is reported on every rank), so every rank gets the W x W matrix. The host
    then reads it back to size the output: a variable-split all-to-all costs one device-to-host
    synchronisation, as the output's shape depends on the peers. Equal splits need no exchange.

    Chunking: when every rank's staged chunks fit in the workspace, one launch. Otherwise the chunks
    move in rounds: round t moves words [t*L, (t+1)*L) of every chunk, L the largest piece length for
    which every rank's staged pieces fit; all ranks derive L, the number of rounds and the grid from the
    split matrix, so they launch the same sequence. The own chunk is copied whole in round 0.

    Work split: program ``pid`` owns blocks pid, pid + P, ... of every chunk piece, both when staging
    and when reading, so program ``pid`` only waits on program ``pid`` of its peers.

    Wins at small and medium sizes (two barriers, one launch, no per-peer send/recv pairs), which is
    where MoE dispatch/combine with few tokens per expert sits.

The kernel moves words: any dtype of itemsize 1, 2, 4 or 8; other itemsizes fall back to the process
group's ``all_to_all_single`` (split sizes still exchanged through the workspace).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..language import MAX_WORLD, announce, block_barrier, copy_blocks, peer_ptr, tee_blocks
from ..launcher import launch
from ..plan import Algorithm, Plan, register, word_dtype_reason
from .common import as_words, config, meta, move_config


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
def all_to_all_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # tensors: rows_ptr is the int64 [WORLD, WORLD] split matrix (rows rank s sends to rank j)
    x_ptr, out_ptr, rows_ptr, row_numel,
    # this round: words [piece_start, piece_start + piece_len) of every chunk for a peer, and the
    # first self_len words of my own chunk (all of it in round 0, none afterwards)
    piece_start, piece_len, self_len,
    # ALIGN (a power of two <= 16) divides every chunk offset and length, in words
    WORLD: tl.constexpr, BLOCK: tl.constexpr, ALIGN: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    lanes = tl.arange(0, MAX_WORLD)
    valid = lanes < WORLD
    my_buf = peer_ptr(buffer_ptrs_dev, rank, elem)
    # Words I send to each rank, and this round's pieces I stage for peers (never for myself).
    sent = tl.load(rows_ptr + rank * WORLD + lanes, mask=valid, other=0) * row_numel
    staged = tl.where(lanes != rank, _piece(sent, piece_start, piece_len), 0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)

    for k in tl.static_range(1, WORLD):
        dest = (rank + k) % WORLD
        x_off = _aligned(tl.sum(tl.where(lanes < dest, sent, 0), axis=0), ALIGN)
        buf_off = _aligned(tl.sum(tl.where(lanes < dest, staged, 0), axis=0), ALIGN)
        n = _aligned(tl.sum(tl.where(lanes == dest, staged, 0), axis=0), ALIGN)
        copy_blocks(x_ptr + _aligned(x_off + piece_start, ALIGN), my_buf + buf_off, n, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        # Words I receive from each rank; the output holds them in source-rank order.
        recv = tl.load(rows_ptr + lanes * WORLD + rank, mask=valid, other=0) * row_numel
        x_self = _aligned(tl.sum(tl.where(lanes < rank, sent, 0), axis=0), ALIGN)
        out_self = _aligned(tl.sum(tl.where(lanes < rank, recv, 0), axis=0), ALIGN)
        copy_blocks(x_ptr + x_self, out_ptr + out_self, self_len, BLOCK)
        for k in tl.static_range(1, WORLD):
            src = (rank + k) % WORLD
            # src's chunks for peers, and where in its buffer src staged this round's piece for me
            theirs = tl.load(rows_ptr + src * WORLD + lanes, mask=valid & (lanes != src),
                             other=0) * row_numel
            pieces = _piece(theirs, piece_start, piece_len)
            buf_off = _aligned(tl.sum(tl.where(lanes < rank, pieces, 0), axis=0), ALIGN)
            n = _aligned(tl.sum(tl.where(lanes == rank, pieces, 0), axis=0), ALIGN)
            out_off = _aligned(tl.sum(tl.where(lanes < src, recv, 0), axis=0) + piece_start, ALIGN)
            copy_blocks(peer_ptr(buffer_ptrs_dev, src, elem) + buf_off, out_ptr + out_off, n, BLOCK)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


@triton.jit
def exchange_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # my splits (WORLD int64) -> row ``rank`` of the [WORLD, WORLD] matrix
    splits_ptr, matrix_ptr,
    WORLD: tl.constexpr,
):
    """Every rank's splits into every rank's matrix: copy in, barrier, read every peer, exit barrier."""
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    tee_blocks(splits_ptr, peer_ptr(buffer_ptrs_dev, rank, tl.int64), matrix_ptr + rank * WORLD, WORLD, MAX_WORLD)
    if block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD) == 0:
        for k in tl.static_range(1, WORLD):
            peer = (rank + k) % WORLD
            copy_blocks(peer_ptr(buffer_ptrs_dev, peer, tl.int64), matrix_ptr + peer * WORLD, WORLD, MAX_WORLD)
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


def exchange_splits(plan: Plan, splits: list[int], device: torch.device) -> tuple[list[list[int]], torch.Tensor]:
    """Every rank's splits, as a host matrix and a device int64 [W, W] tensor (rows s -> j)."""
    ws, world = plan.ws, plan.world
    mine = torch.tensor(splits, dtype=torch.int64, device=device)
    matrix = torch.empty((world, world), dtype=torch.int64, device=device)
    launch(exchange_kernel, (1,), (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, mine, matrix),
           dict(WORLD=world, num_warps=1))
    if matrix.device.type == "meta":  # recording launches for the compile checks: nothing ran
        return [list(splits)] * world, matrix
    host = matrix.tolist()  # the host sync: the output's row count depends on the peers' splits
    ws.check()  # a peer with rows of another size or dtype made another call: raise before using it
    return host, matrix


def plan_rounds(words: list[list[int]], capacity: int, align: int = 1) -> tuple[int, int]:
    """(piece_len, rounds) for chunk sizes ``words[s][j]`` (words rank s sends to rank j).

    piece_len is the longest multiple of ``align`` such that every rank's staged pieces (its chunks
    for peers, each cut to piece_len) fit in ``capacity`` words; rounds covers the longest chunk.
    When every chunk is a multiple of ``align``, so is every piece and every offset."""
    world = len(words)
    peers = [[words[s][j] for j in range(world) if j != s] for s in range(world)]
    longest = max(max(p) for p in peers)

    def staged(length: int) -> int:
        return max(sum(min(n, length) for n in p) for p in peers)

    if staged(longest) <= capacity:
        piece = longest
    else:
        # In units of align: staged(lo * align) <= capacity < staged(hi * align).
        lo, hi = capacity // (world - 1) // align, -(-longest // align)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if staged(mid * align) <= capacity else (lo, mid)
        piece = lo * align
    piece = max(piece, align)
    return piece, max(1, -(-longest // piece))


def _all_to_all(plan: Plan, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    ws, world, rank = plan.ws, plan.world, plan.rank
    rows = x.shape[0]
    row_numel = math.prod(x.shape[1:])
    if plan.request.splits is None:
        matrix = [[rows // world] * world for _ in range(world)]
        rows_dev = plan.cache.get("rows_dev")
        if rows_dev is None:
            rows_dev = plan.cache["rows_dev"] = torch.full((world, world), rows // world, dtype=torch.int64,
                                                           device=x.device)
    else:
        matrix, rows_dev = exchange_splits(plan, list(plan.request.splits), x.device)
    received = [matrix[s][rank] for s in range(world)]
    if out is None:
        out = torch.empty((sum(received), *x.shape[1:]), dtype=x.dtype, device=x.device)
    elems = [[n * row_numel for n in line] for line in matrix]
    if not any(map(any, elems)):
        return out  # nothing moves anywhere: every rank knows it, none launches
    words, out_words = as_words(x), as_words(out)
    # Sized by the average bytes per rank of the whole exchange: the same number on every rank.
    cfg = move_config(x.element_size(), sum(map(sum, elems)) * x.element_size() // world, x.device.type)
    # Every chunk, piece and offset is a multiple of align words (16 when rows are a multiple of 16
    # words), which the kernel turns into vector accesses of up to 16 bytes.
    align = math.gcd(row_numel, 16)
    piece, rounds = plan_rounds(elems, ws.capacity(words.dtype), align)
    grid = cfg.grid(triton.cdiv(max(piece, max(elems[s][s] for s in range(world))), cfg.block))
    for t in range(rounds):
        launch(all_to_all_kernel, grid,
               (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, words, out_words, rows_dev, row_numel, t * piece, piece,
                elems[rank][rank] if t == 0 else 0),
               dict(WORLD=world, BLOCK=cfg.block, ALIGN=align, num_warps=cfg.num_warps))
    return out


register(Algorithm("all_to_all", "pull", 40, "all_to_all", _all_to_all,
                   "stage chunks for peers, barrier, read my chunk from every peer", None,
                   accepts=word_dtype_reason, instead="nccl"))
