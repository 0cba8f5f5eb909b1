"""all_to_all.sentinel: the barrier-free small-message all-to-all (the sentinel scheme of sentinel.py,
for data movement).

Every rank pushes chunk j of its input straight into its row of rank j's slots; receivers poll their
slots for the sentinel, copy what arrived into the output and reset the slots. No barrier, no signal,
no staging copy, no round trip waited on::

    rank r:  counts_j[phase][r] <-- (epoch, rows r sends to j)           every peer j (every program)
             slots_j[phase][r]  <-- x_r[chunk j], escaped, + mask words  every peer j (NVLink stores)
             poll counts_r[phase][s] (with the call headers)             every peer s
             poll slots_r[phase][s][: words from s], reset them -> out_r[rows from s]
             x_r[chunk r] --> out_r[rows from r]                          (local)

* Counts travel first, epoch-tagged (language/tagged.py): a receiver learns how many words to poll
  from each source, and the output offsets (source-rank order), on the device. That makes device-side
  splits free: ``all_to_all(x, splits=tensor, max_rows=R)`` reads nothing back. Every program of every
  rank waits for every peer's counts, so no rank gets more than one launch ahead of a peer: the slot
  set ``epoch % 3`` of a launch is empty again before anybody writes it again.
* Any bit pattern: words equal to the sentinel travel escaped (a mask word per 16 data words, 6.25%
  more traffic), so every dtype arrives bit-exact.
* Work split: block b of every source's piece is pushed by program b % P of the sender and polled by
  program b % P of the receiver, P the same on every rank (derived from sizes every rank knows).
* Pieces: a chunk longer than a slot row (ROW words) moves in several launches, piece t = words
  [t ROW, (t+1) ROW) of every chunk; the number of launches comes from the split matrix or, for device
  splits, from max_rows (every chunk holds at most max_rows rows).
* Rows must be whole 4-byte words (others run ``pull``). Traffic: what it sends, once, by remote stores
  (+6.25% mask words), plus a local reset store per word received. Where it should win: exchanges of a
  few KB to a few hundred KB (MoE decode), where a barrier's round trip is most of the time.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..language import (ARG_MAX_ROWS, EMPTY, EPOCH_SLOTS, ESCAPE_GROUP, MAX_WORLD, PHASES, announce, clamped_splits,
                        end_launch, escape, launch_epoch, peer_ptr, peer_rows, post_counts, post_header,
                        record_argument, wait_counts, wait_escaped)
from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..plan import CPU_CONFIG, DEVICE_SPLITS, Algorithm, LaunchConfig, Plan, register, word_dtype_reason
from .common import cdiv, next_power_of_2
from .splits import exchange_outputs, option, row_bytes, split_matrix

# int64 call headers [PHASES][MAX_WORLD], then int64 counts [PHASES][MAX_WORLD], then the slots (the
# PHASES slot sets rotate as language/slots.py says)
COUNT_BASE: tl.constexpr = tl.constexpr(PHASES.value * MAX_WORLD.value)  # in int64
DATA_BASE: tl.constexpr = tl.constexpr(4 * PHASES.value * MAX_WORLD.value)  # in int32 words
# Data words per source row of a slot set (CPU: small, so that the tests run the multi-launch path).
ROW_WORDS = {"cuda": 64 << 10, "cpu": 1 << 10}
# Device-side splits launch as many pieces as max_rows could need: beyond this many, pull runs instead.
MAX_DEVICE_SPLIT_LAUNCHES = 16


def _region_bytes(g) -> int:
    row = ROW_WORDS[g.device_type]
    return (DATA_BASE.value + PHASES.value * g.world_size * (row + row // ESCAPE_GROUP.value)) * 4


SLOTS = declare(RegionSpec(
    "all_to_all.sentinel.slots", "all_to_all_sentinel", _region_bytes,
    "rank s writes only its count, header and row of slot set epoch % 3 in each receiver; the receiver "
    "empties the slots it read; every launch waits for every peer's counts, so nobody is more than one "
    "launch ahead and a set is empty again before it is written again", fill_int32=EMPTY.value,
    header_words=DATA_BASE.value))
EPOCHS = declare(RegionSpec("all_to_all.sentinel.epochs", "all_to_all_sentinel", lambda g: EPOCH_SLOTS.value,
                            "this rank's launch-epoch table (kernels only)", symmetric=False))

# Block = words per source per program step. Untuned: from the all-reduce sentinel sweeps' trend (small
# blocks, many programs at small sizes); to be swept on the GPU machine.
GPU_CONFIGS = ((16 << 10, LaunchConfig(256, 64, 4)), (256 << 10, LaunchConfig(512, 128, 4)),
               (1 << 62, LaunchConfig(1024, 132, 8)))


@triton.jit
def sentinel_all_to_all_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # tensors as int32 words; my splits (WORLD ints, rows to each rank) and the rows received from each
    # rank (WORLD int64, written in the first launch); x has x_rows rows, out max_rows (= max_words
    # words), of row_words words
    x_ptr, out_ptr, splits_ptr, recv_ptr, x_rows, max_rows, max_words, row_words,
    # this launch moves words [piece_start, piece_start + ROW) of every chunk
    piece_start,
    # ROW = data words per source row; PEERS = WORLD rounded up to a power of two
    WORLD: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr, PEERS: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % PHASES
    lane = tl.arange(0, BLOCK)
    groups = tl.arange(0, BLOCK // ESCAPE_GROUP)
    rows = tl.arange(0, PEERS)
    in_world = rows < WORLD
    is_peer = in_world & (rows != rank)
    first = piece_start == 0
    sent_rows = clamped_splits(splits_ptr, rows, in_world, x_rows, first & (pid == 0), status_ptr, rank, desc)
    sent = sent_rows * row_words
    x_start = tl.cumsum(sent, axis=0) - sent
    lens = tl.minimum(tl.maximum(sent - piece_start, 0), ROW)
    data_set = DATA_BASE + phase * WORLD * ROW
    mask_set = DATA_BASE + PHASES * WORLD * ROW + phase * WORLD * (ROW // ESCAPE_GROUP)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    post_header(slot_ptrs_dev, phase, epoch, desc, rank, WORLD)
    post_counts(slot_ptrs_dev, COUNT_BASE + phase * MAX_WORLD, epoch, sent_rows, rows, is_peer, rank)

    # Push: block b of my piece for every peer at once, into my row of each peer's slot set.
    peers = peer_rows(slot_ptrs_dev, rows, is_peer, tl.int32)
    longest = tl.max(tl.where(is_peer, lens, 0), axis=0)
    for b in range(pid, tl.cdiv(longest, BLOCK), nprog):
        offs = b * BLOCK + lane
        valid = is_peer[:, None] & (offs[None, :] < lens[:, None])
        words = tl.load(x_ptr + (x_start + piece_start)[:, None] + offs[None, :], mask=valid, other=0)
        sent_words, masks = escape(words, EMPTY, BLOCK // ESCAPE_GROUP)
        tl.store(peers + data_set + rank * ROW + offs[None, :], sent_words, mask=valid)
        group = b * (BLOCK // ESCAPE_GROUP) + groups
        tl.store(peers + mask_set + rank * (ROW // ESCAPE_GROUP) + group[None, :], masks,
                 mask=is_peer[:, None] & (group[None, :] * ESCAPE_GROUP < lens[:, None]))

    # Receive: the counts first (they give what to poll and where it goes), then the data.
    region = peer_ptr(slot_ptrs_dev, rank, tl.int32)
    region64 = region.to(tl.pointer_type(tl.int64))
    counts, budget = wait_counts(region64 + COUNT_BASE + phase * MAX_WORLD, rows, is_peer, region64 + phase * MAX_WORLD,
                                 epoch, desc, max_spins, status_ptr, rank, WORLD)
    recv_rows = tl.where(rows == rank, sent_rows, counts)
    if first & (pid == 0) & (budget > 0):
        tl.store(recv_ptr + rows, recv_rows, mask=in_world)
        total = tl.sum(recv_rows, axis=0)
        if total > max_rows:
            record_argument(status_ptr, ARG_MAX_ROWS, total, max_rows, rank, desc)
    recv = recv_rows * row_words
    out_start = tl.cumsum(recv, axis=0) - recv
    recv_lens = tl.minimum(tl.maximum(recv - piece_start, 0), ROW)
    data = region + data_set + rows[:, None] * ROW
    masks_of = region + mask_set + rows[:, None] * (ROW // ESCAPE_GROUP)
    longest = tl.max(tl.where(is_peer, recv_lens, 0), axis=0)
    for b in range(pid, tl.cdiv(longest, BLOCK), nprog):
        offs = b * BLOCK + lane
        valid = is_peer[:, None] & (offs[None, :] < recv_lens[:, None])
        words, budget = wait_escaped(data + offs[None, :], masks_of + offs[None, :] // ESCAPE_GROUP, valid, rows, EMPTY,
                                     budget, status_ptr, rank, desc)
        tl.store(data + offs[None, :], tl.zeros_like(words) + EMPTY, mask=valid)
        tl.store(masks_of + offs[None, :] // ESCAPE_GROUP, tl.zeros_like(words) + EMPTY, mask=valid)
        dst = (out_start + piece_start)[:, None] + offs[None, :]
        if budget > 0:
            tl.store(out_ptr + dst, words, mask=valid & (dst < max_words))

    # My own chunk: straight from my input.
    own_len = tl.sum(tl.where(rows == rank, lens, 0), axis=0)
    own_x = tl.sum(tl.where(rows == rank, x_start, 0), axis=0) + piece_start
    own_out = tl.sum(tl.where(rows == rank, out_start, 0), axis=0) + piece_start
    for b in range(pid, tl.cdiv(own_len, BLOCK), nprog):
        offs = b * BLOCK + lane
        valid = (offs < own_len) & (own_out + offs < max_words)
        tl.store(out_ptr + own_out + offs, tl.load(x_ptr + own_x + offs, mask=valid), mask=valid)
    end_launch(epochs_ptr, epoch)


def _config(device_type: str, piece_bytes: int) -> LaunchConfig:
    """From a size every rank knows (the longest piece of the exchange)."""
    if device_type == "cpu":
        return CPU_CONFIG
    return next(cfg for limit, cfg in GPU_CONFIGS if piece_bytes <= limit)


def _words(t: torch.Tensor) -> torch.Tensor:
    flat = t.reshape(-1)
    if flat.data_ptr() % 4:  # a view starting inside a word: move a copy
        flat = flat.clone()
    return flat.view(torch.uint8).view(torch.int32)


def _sentinel(plan: Plan, x: torch.Tensor, out: torch.Tensor | None, splits_dev: torch.Tensor | None = None):
    ws, world = plan.ws, plan.world
    row_words = math.prod(x.shape[1:]) * x.element_size() // 4
    matrix = split_matrix(plan, x)
    out, recv, max_rows, splits_dev = exchange_outputs(plan, x, out, matrix, splits_dev)
    if matrix is None:  # device splits: every chunk holds at most max_rows rows
        longest = max_rows * row_words
    else:
        longest = max(map(max, matrix)) * row_words
        if longest == 0:
            return out  # nothing moves anywhere: every rank knows it, none launches
    row = ROW_WORDS[ws.device.type]
    cfg = _config(x.device.type, min(longest, row) * 4)
    grid = cfg.grid(cdiv(min(max(longest, 1), row), cfg.block))
    region, epochs = ws.region(SLOTS.name), ws.local_state(EPOCHS.name)
    src, dst = _words(x), out.reshape(-1).view(torch.uint8).view(torch.int32)
    for t in range(max(1, cdiv(longest, row))):
        launch(sentinel_all_to_all_kernel, grid,
               (*ws.kernel_args, plan.desc, region.ptrs_dev, epochs, src, dst, splits_dev, recv, x.shape[0], max_rows,
                max_rows * row_words, row_words, t * row),
               dict(WORLD=world, ROW=row, BLOCK=cfg.block, PEERS=next_power_of_2(world),
                    num_warps=cfg.num_warps))
    return (out, recv) if matrix is None else out


def _accepts(request, world: int) -> str | None:
    reason = word_dtype_reason(request, world)
    if reason is None and row_bytes(request) % 4:
        reason = f"rows of {row_bytes(request)} bytes are not whole 4-byte words"
    if reason is None and request.splits == DEVICE_SPLITS:
        bound = option(request, "max_rows") * row_bytes(request)
        if bound > MAX_DEVICE_SPLIT_LAUNCHES * ROW_WORDS[request.device.type] * 4:
            reason = f"max_rows bounds {bound} bytes per source, more than {MAX_DEVICE_SPLIT_LAUNCHES} launches' worth"
    return reason


register(Algorithm("all_to_all", "sentinel", 42, "all_to_all_sentinel", _sentinel,
                   "barrier-free: counts then chunks pushed into peers' slots, polled for a sentinel", None,
                   accepts=_accepts, instead="pull"))
