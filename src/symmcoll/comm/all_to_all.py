"""All-to-all over symmetric memory: rank s's chunk j goes to rank j (MoE token exchange).

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

    Split sizes: with ``splits`` given, the ranks first exchange (splits, row size, dtype) with the
    all-gather kernel over the same workspace, so every rank gets the matrix (and mismatched row sizes
    or dtypes raise ValueError on every rank). The host then reads it back to size the output: a
    variable-split all-to-all costs one device-to-host synchronisation, as the output's shape depends
    on the peers. Equal splits need no exchange.

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
import operator
import zlib

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .. import compile_check
from ..language import MAX_WORLD, block_barrier, peer_ptr
from ..memory import Workspace, get_workspace, register_op
from ._common import (GPU_MOVE_CONFIGS, LaunchConfig, as_words, check_device, check_tensor,
                      copy_blocks, finish, group_size, logger, move_config)
from .all_gather import gather_words

PULL = register_op("all_to_all.pull")


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
def _all_to_all_kernel(
    # symmetric workspace: per-rank address tables, error record, wait budget
    buffer_ptrs_dev, signal_pad_ptrs_dev, status_ptr, max_spins,
    # tensors: rows_ptr is the int64 [WORLD, WORLD] split matrix (rows rank s sends to rank j)
    x_ptr, out_ptr, rows_ptr, row_numel,
    # this round: words [piece_start, piece_start + piece_len) of every chunk for a peer, and the
    # first self_len words of my own chunk (all of it in round 0, none afterwards)
    piece_start, piece_len, self_len,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters: ALIGN (a power of two <= 16) divides every chunk offset and length, in words
    BLOCK: tl.constexpr, ALIGN: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    lanes = tl.arange(0, MAX_WORLD)
    valid = lanes < WORLD
    my_buf = peer_ptr(buffer_ptrs_dev, rank, elem)
    # Words I send to each rank, and this round's pieces I stage for peers (never for myself).
    sent = tl.load(rows_ptr + rank * WORLD + lanes, mask=valid, other=0) * row_numel
    staged = tl.where(lanes != rank, _piece(sent, piece_start, piece_len), 0)

    for k in tl.static_range(1, WORLD):
        dest = (rank + k) % WORLD
        x_off = _aligned(tl.sum(tl.where(lanes < dest, sent, 0), axis=0), ALIGN)
        buf_off = _aligned(tl.sum(tl.where(lanes < dest, staged, 0), axis=0), ALIGN)
        n = _aligned(tl.sum(tl.where(lanes == dest, staged, 0), axis=0), ALIGN)
        copy_blocks(x_ptr + _aligned(x_off + piece_start, ALIGN), my_buf + buf_off, n, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
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
        block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


def check_splits(splits, rows: int, world: int) -> list[int]:
    try:
        values = [operator.index(s) for s in splits]
    except TypeError:
        raise ValueError(f"splits must be a list of {world} ints (rows sent to each rank), "
                         f"got {splits!r}") from None
    if len(values) != world:
        raise ValueError(f"splits must have one entry per rank ({world}), got {len(values)}: {values}")
    if min(values) < 0:
        raise ValueError(f"splits must be >= 0, got {values}")
    if sum(values) != rows:
        raise ValueError(f"splits must sum to x.shape[0] = {rows}, got {values} (sum {sum(values)})")
    return values


def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


def exchange_splits(ws: Workspace, splits: list[int], row_numel: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[list[list[int]], torch.Tensor]:
    """Every rank's splits, as a host matrix and a device int64 [W, W] tensor (rows s -> j).

    Gathers (splits, row size, dtype) through the workspace; raises ValueError on every rank alike
    when the ranks' row sizes or dtypes differ."""
    world = ws.world_size
    payload = torch.tensor([*splits, row_numel, _dtype_code(dtype)], dtype=torch.int64, device=device)
    table = torch.empty(world * (world + 2), dtype=torch.int64, device=device)
    gather_words(ws, payload, table)
    table = table.view(world, world + 2)
    host = table.tolist()  # the host sync: the output's row count depends on the peers' splits
    for s, entry in enumerate(host):
        if entry[world] != row_numel:
            raise ValueError(f"x: rank {s} sends rows of {entry[world]} elements, rank {ws.rank} "
                             f"rows of {row_numel} (x.shape[1:] must match on every rank)")
        if entry[world + 1] != _dtype_code(dtype):
            raise ValueError(f"x.dtype differs between ranks {s} and {ws.rank} ({dtype} here)")
    return [entry[:world] for entry in host], table[:, :world].contiguous()


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


def pull(x: torch.Tensor, group=None, *, splits=None,
         config: LaunchConfig | None = None) -> torch.Tensor:
    """All-to-all of ``x``'s dim-0 chunks over ``group``; returns the received rows in rank order."""
    check_tensor(x, "x")
    check_device(x, "x")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (rows are exchanged along dim 0), "
                         "got a 0-dim tensor")
    world = group_size(group)
    rows = x.shape[0]
    if splits is None:
        if rows % world:
            raise ValueError(f"x.shape[0] must be divisible by the world size for equal splits: x has "
                             f"shape {tuple(x.shape)}, world size {world} (or pass splits=)")
    else:
        splits = check_splits(splits, rows, world)
    if world == 1:
        return x.clone()

    ws = get_workspace(group, x.device)
    check_tensor(x, "x", ws.device.type)
    row_numel = math.prod(x.shape[1:])
    if splits is None:
        matrix = [[rows // world] * world for _ in range(world)]
        rows_dev = torch.full((world, world), rows // world, dtype=torch.int64, device=x.device)
    else:
        matrix, rows_dev = exchange_splits(ws, splits, row_numel, x.dtype, x.device)
    received = [matrix[s][ws.rank] for s in range(world)]
    out = torch.empty((sum(received), *x.shape[1:]), dtype=x.dtype, device=x.device)
    elems = [[n * row_numel for n in line] for line in matrix]
    if not any(map(any, elems)):
        return out  # nothing moves anywhere: every rank knows it, none launches

    words = as_words(x)
    if words is None:
        logger.debug("symmcoll.all_to_all: no symmetric-memory kernel for %s (itemsize %d); "
                     "using the process group's all_to_all_single", x.dtype, x.element_size())
        dist.all_to_all_single(out, x, output_split_sizes=received,
                               input_split_sizes=matrix[ws.rank], group=group)
        return out

    # Sized by the average bytes per rank of the whole exchange: the same number on every rank.
    cfg = config or move_config(words, sum(map(sum, elems)) * words.element_size() // world)
    # Every chunk, piece and offset is a multiple of align words (16 when rows are a multiple of 16
    # words), which the kernel turns into vector accesses of up to 16 bytes.
    align = math.gcd(row_numel, 16)
    piece, rounds = plan_rounds(elems, ws.capacity(words.dtype), align)
    longest_self = max(elems[s][s] for s in range(world))
    grid = cfg.grid(triton.cdiv(max(piece, longest_self), cfg.block))
    out_words = as_words(out)
    for t in range(rounds):
        _all_to_all_kernel[grid](
            ws.buffer_ptrs_dev, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
            words, out_words, rows_dev, row_numel,
            t * piece, piece, elems[ws.rank][ws.rank] if t == 0 else 0,
            ws.rank, PULL,
            WORLD=world, BLOCK=cfg.block, ALIGN=align, num_warps=cfg.num_warps,
        )
    finish(ws)
    return out


for _word, _world in ((1, 2), (2, 3), (4, 4), (8, 8), (2, 8)):
    _ty = {1: "u8", 2: "i16", 4: "i32", 8: "i64"}[_word]
    _cfg = GPU_MOVE_CONFIGS[_word]
    compile_check.register(
        _all_to_all_kernel,
        {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": f"*{_ty}", "out_ptr": f"*{_ty}",
         "rows_ptr": "*i64", "row_numel": "i32", "piece_start": "i32", "piece_len": "i32",
         "self_len": "i32", "rank": "i32", "op_code": "i32"},
        {"WORLD": _world, "BLOCK": _cfg.block, "ALIGN": 16 if _world != 3 else 2},
        num_warps=_cfg.num_warps, label=f"{_ty},")
# Arguments equal to 1 are specialised as constexprs on GPU (rank 1, one-element rows and pieces).
compile_check.register(
    _all_to_all_kernel,
    {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": "*i32", "out_ptr": "*i32", "rows_ptr": "*i64",
     "piece_start": "i32", "op_code": "i32"},
    {"row_numel": 1, "piece_len": 1, "self_len": 1, "rank": 1, "WORLD": 4,
     "BLOCK": GPU_MOVE_CONFIGS[4].block, "ALIGN": 1},
    num_warps=GPU_MOVE_CONFIGS[4].num_warps, label="i32,")
