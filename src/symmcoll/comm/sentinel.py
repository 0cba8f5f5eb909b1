"""The sentinel (Lamport) family: barrier-free all-reduce and reduce-scatter with a sentinel in the data.

Receive slots start out holding ``EMPTY`` (language/words.py), a word senders never write (``sanitize``).
A receiver polls its slots with volatile loads until no word is EMPTY (``wait_filled``): an aligned
4-byte word lands whole, so any other value is the sender's final value. No signal, no fence, no
barrier, and no flag inflating the data (low_latency.py doubles it). After reading, the receiver writes
EMPTY back into the slots it consumed.

all_reduce.sentinel_one_shot
    Every rank stores its (sanitised) input into its row of every peer's slots, then waits for every
    peer's row and reduces all ranks in rank order (fp32; bit-identical results everywhere). Traffic:
    (W-1) * S written per rank; latency one NVLink hop. Wins up to a few hundred KB.

all_reduce.sentinel_two_shot
    Reduce-scatter then all-gather, both by pushing: shard s of my input goes to rank s's scatter slots;
    rank s reduces its shard and pushes the result into every peer's gather slots; every rank copies the
    gathered shards into its output. Traffic: 2 (W-1)/W * S per rank, all remote stores. Wins from a few
    hundred KB to tens of MB.

reduce_scatter.sentinel
    Stages 0 and 1 of the two-shot kernel (``GATHER=False``): segment s of my input goes to rank s's
    slots, rank s reduces its segment into its output. Needs segments of whole 4-byte words (others run
    reduce_scatter.pull, decided by the resolver).

Rotating slot sets keep it graph-safe (language/slots.py: the layout, and why a set is EMPTY again
before anybody writes it again). Call descriptors travel in epoch-tagged headers at the start of each
region, polled by program 0 with its first block (``language.checks_headers``): a peer that made
another call is reported on every rank (what the other programs wrote meanwhile is undefined).

Peer tiles: the kernels handle all peers of a block as one [PEERS, BLOCK] tile (row i = rank i): one
store sends a block to every peer, one volatile load of every peer's row is polled with one block-wide
reduction. Per peer the loads and polls formed a dependent chain (two-shot 92 -> 81 us at 16 MB on 4
ranks). On 2 ranks the one-shot keeps its per-peer kernel (one peer: nothing to batch; measured faster).
Messages above the region's row go in pieces (one launch each).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import (WORD_FORMAT, combine, declare_slots, end_launch, finalize, open_slots, open_two_stage_slots,
                        pack, padded_words, peer_ptr, peer_rows, post_call, reduce_rows, sanitize, take, take_rows,
                        unpack)
from .. import debug_switches
from ..plan import Algorithm, LaunchConfig, Plan, SizedConfigs, reduction_dtype_reason, register
from .common import cdiv, chunks, config, launch_once, meta, next_power_of_2

# Largest message per launch (CPU: small, so that the multi-piece path runs in the CPU tests too).
MAX_BYTES = {"one_shot": {"cuda": 2 << 20, "cpu": 16 << 10},
             "two_shot": {"cuda": 16 << 20, "cpu": 32 << 10}}


def shard_words(n_words: int, world: int) -> int:
    """Two-shot shard of an n-word piece: ceil(n / W) rounded up to 4 words, so every shard starts
    16-byte aligned."""
    return cdiv(cdiv(n_words, world), 4) * 4


def row_words(kind: str, device_type: str, world: int) -> int:
    words = MAX_BYTES[kind][device_type] // 4
    return words if kind == "one_shot" else shard_words(words, world)


ONE_SHOT_SLOTS, ONE_SHOT_EPOCHS = declare_slots("sentinel.one_shot", "sentinel", 1,
                                               lambda device_type, world: row_words("one_shot", device_type, world))
TWO_SHOT_SLOTS, TWO_SHOT_EPOCHS = declare_slots("sentinel.two_shot", "sentinel", 2,
                                               lambda device_type, world: row_words("two_shot", device_type, world))

# Block = int32 words per program step. From benchmarks/sweep_configs.py (benchmarks/results/
# 2026-11-22-sweep; earlier rounds in 2026-11-21-sweep-2 and -3).
GPU_ONE_SHOT = SizedConfigs(((128 << 10, LaunchConfig(512, 128, 4)),
                             (256 << 10, LaunchConfig(256, 256, 4)),
                             (1 << 40, LaunchConfig(512, 128, 4))),
                            per_world=((2, ((64 << 10, LaunchConfig(256, 128, 4)),
                                            (128 << 10, LaunchConfig(256, 256, 4)),
                                            (1 << 40, LaunchConfig(128, 512, 4)))),))
GPU_TWO_SHOT = SizedConfigs(
    ((256 << 10, LaunchConfig(512, 132, 4)),
     (1 << 20, LaunchConfig(512, 528, 4)),
     (4 << 20, LaunchConfig(512, 264, 4)),
     (1 << 40, LaunchConfig(512, 528, 4))),
    per_world=((2, ((256 << 10, LaunchConfig(512, 132, 4)),
                    (1 << 20, LaunchConfig(512, 264, 4)),
                    (4 << 20, LaunchConfig(1024, 264, 4)),
                    (1 << 40, LaunchConfig(1024, 528, 4)))),))
# The reduce-scatter runs the two-shot kernel's first two stages over the same shards, keyed by its
# input bytes (= the all-reduce size of the same shards). Not swept on its own yet.
GPU_REDUCE_SCATTER = GPU_TWO_SHOT


@triton.jit
def _reduce_tile(tile, own, rows, rank, WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr):
    """Packed, sanitised op over every rank of a block: peers' words in ``tile``, mine in ``own``."""
    lo, hi = unpack(tl.where(rows[:, None] == rank, own[None, :], tile), FORMAT)
    valid = rows[:, None] < WORLD
    return sanitize(pack(reduce_rows(lo, valid, REDUCE_OP, WORLD), reduce_rows(hi, valid, REDUCE_OP, WORLD), FORMAT),
                    FORMAT)


@triton.jit
def one_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # this piece, as int32 words
    x_ptr, out_ptr, n_words,
    # ROW = slots per source row; PEERS = WORLD rounded up to a power of two; PER_PEER: one peer at a
    # time (2 ranks: one peer, nothing to batch, measured faster) rather than [PEERS, BLOCK] tiles
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
    PEERS: tl.constexpr, PER_PEER: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    epoch, base, region, headers, pads, peer_headers = open_slots(slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc,
                                                                  rank, WORLD, 1, ROW)
    lane = tl.arange(0, BLOCK)
    rows = tl.arange(0, PEERS)
    is_peer = (rows < WORLD) & (rows != rank)
    to_peers = peer_rows(slot_ptrs_dev, rows, is_peer, tl.int32)
    # Push my words into my row of every peer's slots.
    for start in range(pid * BLOCK, n_words, step):
        offs = start + lane
        mask = offs < n_words
        words = sanitize(tl.load(x_ptr + offs, mask=mask), FORMAT)
        if PER_PEER:
            for r in tl.static_range(WORLD):
                if r != rank:
                    tl.store(peer_ptr(slot_ptrs_dev, r, tl.int32) + base + rank * ROW + offs, words, mask=mask)
        else:  # one store per peer, all in flight together
            tl.store(to_peers + base + rank * ROW + offs[None, :], tl.broadcast_to(words[None, :], (PEERS, BLOCK)),
                     mask=is_peer[:, None] & mask[None, :])
    post_call(pads, peer_headers, epoch, desc, rank, WORLD)

    budget = max_spins
    check = 1
    for start in range(pid * BLOCK, n_words, step):
        offs = start + lane
        mask = offs < n_words
        if PER_PEER:
            acc_lo = tl.zeros([BLOCK], tl.float32)
            acc_hi = tl.zeros([BLOCK], tl.float32)
            for src in tl.static_range(WORLD):
                if src == rank:
                    words = sanitize(tl.load(x_ptr + offs, mask=mask, other=0), FORMAT)
                else:
                    words, budget = take(region + base + src * ROW + offs, mask, src, rank, budget, status_ptr, desc,
                                         headers, epoch, check, WORLD)
                    check = 0
                lo, hi = unpack(words, FORMAT)
                if src == 0:
                    acc_lo, acc_hi = lo, hi
                else:
                    acc_lo, acc_hi = combine(acc_lo, lo, REDUCE_OP), combine(acc_hi, hi, REDUCE_OP)
        else:
            tile, budget = take_rows(region + base + rows[:, None] * ROW + offs[None, :],
                                     is_peer[:, None] & mask[None, :], rows, rank, budget, status_ptr, desc, headers,
                                     epoch, check, WORLD)
            check = 0
            own = sanitize(tl.load(x_ptr + offs, mask=mask, other=0), FORMAT)
        if budget > 0:
            if PER_PEER:
                tl.store(out_ptr + offs, sanitize(pack(finalize(acc_lo, REDUCE_OP, WORLD),
                                                       finalize(acc_hi, REDUCE_OP, WORLD), FORMAT), FORMAT), mask=mask)
            else:
                tl.store(out_ptr + offs, _reduce_tile(tile, own, rows, rank, WORLD, REDUCE_OP, FORMAT), mask=mask)
    end_launch(epochs_ptr, epoch)


@triton.jit
def _scatter_block(x_ptr, to_peers, b, lane, rows, is_peer, n_words, shard_words, x_stride, scatter_base, rank,
                   FORMAT: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr):
    """Stage 0 for block ``b`` of the shards: shard s of my input -> my row of rank s's scatter slots,
    every s at once (a block past the shard stores nothing)."""
    in_shard = b * BLOCK + lane
    offs = rows[:, None] * x_stride + in_shard[None, :]
    mask = is_peer[:, None] & (in_shard[None, :] < shard_words) & (offs < n_words)
    words = sanitize(tl.load(x_ptr + offs, mask=mask), FORMAT)
    tl.store(to_peers + scatter_base + rank * ROW + in_shard[None, :], words, mask=mask)


@triton.jit
def _reduce_block(x_ptr, out_ptr, to_peers, region, b, lane, rows, is_peer, n_words, shard_words, x_stride,
                  scatter_base, gather_base, rank, budget, check, status_ptr, desc, headers, epoch,
                  WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, ROW: tl.constexpr,
                  BLOCK: tl.constexpr, GATHER: tl.constexpr, PEERS: tl.constexpr):
    """Stage 1 for block ``b`` of my shard: wait for every peer's words, reduce them with mine, keep the
    result (and with GATHER push it into my row of every peer's gather slots). Returns spins left."""
    in_shard = b * BLOCK + lane
    offs = rank * x_stride + in_shard
    mask = (in_shard < shard_words) & (offs < n_words)
    tile_mask = is_peer[:, None] & mask[None, :]
    tile, budget = take_rows(region + scatter_base + rows[:, None] * ROW + in_shard[None, :], tile_mask, rows,
                             rank, budget, status_ptr, desc, headers, epoch, check, WORLD)
    words = _reduce_tile(tile, sanitize(tl.load(x_ptr + offs, mask=mask, other=0), FORMAT), rows, rank, WORLD,
                         REDUCE_OP, FORMAT)
    if budget > 0:
        if GATHER:
            tl.store(out_ptr + offs, words, mask=mask)
            tl.store(to_peers + gather_base + rank * ROW + in_shard[None, :],
                     tl.broadcast_to(words[None, :], (PEERS, BLOCK)), mask=tile_mask)
        else:
            tl.store(out_ptr + in_shard, words, mask=mask)
    return budget


@triton.jit
def two_shot_tiles_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # this piece, as int32 words: shard s of x = x[s * x_stride :][:shard_words], valid below n_words
    x_ptr, out_ptr, n_words, shard_words, x_stride,
    # ROW = slots per source row (>= shard_words); GATHER: all-reduce (out shaped like x) rather than
    # reduce-scatter (out = my reduced shard); PEERS = WORLD rounded up to a power of 2; LAG: 0 = stage 0
    # for every block of the program, then stage 1; LAG = k > 0 = one loop whose step pushes block i + k
    # and then reduces block i (the reduce-scatter only: the local reduce overlaps the pushes in flight)
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
    GATHER: tl.constexpr, PEERS: tl.constexpr, LAG: tl.constexpr = 0,
):
    tl.static_assert(LAG == 0 or not GATHER, "LAG: reduce-scatter only")
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch, scatter_base, gather_base, region, headers, pads, peer_headers = open_two_stage_slots(
        slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc, rank, WORLD, ROW)
    blocks = tl.cdiv(shard_words, BLOCK)
    lane = tl.arange(0, BLOCK)
    rows = tl.arange(0, PEERS)
    is_peer = (rows < WORLD) & (rows != rank)
    to_peers = peer_rows(slot_ptrs_dev, rows, is_peer, tl.int32)
    budget = max_spins
    check = 1
    if LAG == 0:
        # Stage 0 for all my blocks, then stage 1.
        for b in range(pid, blocks, nprog):
            _scatter_block(x_ptr, to_peers, b, lane, rows, is_peer, n_words, shard_words, x_stride, scatter_base,
                           rank, FORMAT, ROW, BLOCK)
        post_call(pads, peer_headers, epoch, desc, rank, WORLD)
        for b in range(pid, blocks, nprog):
            budget = _reduce_block(x_ptr, out_ptr, to_peers, region, b, lane, rows, is_peer, n_words, shard_words,
                                   x_stride, scatter_base, gather_base, rank, budget, check, status_ptr, desc,
                                   headers, epoch, WORLD, REDUCE_OP, FORMAT, ROW, BLOCK, GATHER, PEERS)
            check = 0
    else:
        # My first LAG blocks out, the call posted (before any wait), then push LAG blocks ahead of the reduce.
        for i in tl.static_range(LAG):
            _scatter_block(x_ptr, to_peers, pid + i * nprog, lane, rows, is_peer, n_words, shard_words, x_stride,
                           scatter_base, rank, FORMAT, ROW, BLOCK)
        post_call(pads, peer_headers, epoch, desc, rank, WORLD)
        for b in range(pid, blocks, nprog):
            _scatter_block(x_ptr, to_peers, b + LAG * nprog, lane, rows, is_peer, n_words, shard_words, x_stride,
                           scatter_base, rank, FORMAT, ROW, BLOCK)
            budget = _reduce_block(x_ptr, out_ptr, to_peers, region, b, lane, rows, is_peer, n_words, shard_words,
                                   x_stride, scatter_base, gather_base, rank, budget, check, status_ptr, desc,
                                   headers, epoch, WORLD, REDUCE_OP, FORMAT, ROW, BLOCK, GATHER, PEERS)
            check = 0

    # Stage 2: every other shard from my gather slots into my output.
    if GATHER:
        for b in range(pid, blocks, nprog):
            in_shard = b * BLOCK + lane
            offs = rows[:, None] * x_stride + in_shard[None, :]
            mask = is_peer[:, None] & (in_shard[None, :] < shard_words) & (offs < n_words)
            tile, budget = take_rows(region + gather_base + rows[:, None] * ROW + in_shard[None, :], mask, rows, rank,
                                     budget, status_ptr, desc, headers, epoch, 0, WORLD)
            if budget > 0:
                tl.store(out_ptr + offs, tile, mask=mask)
    end_launch(epochs_ptr, epoch)


def _one_shot(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg, world = plan.ws, config(plan), plan.world
    region, epochs = ws.region(ONE_SHOT_SLOTS.name), ws.local_state(ONE_SHOT_EPOCHS.name)
    row = row_words("one_shot", ws.device.type, world)
    flat, padded = padded_words(x)
    result = torch.empty_like(flat) if padded else out.reshape(-1)
    src, dst = flat.view(torch.int32), result.view(torch.int32)
    for start, n in chunks(src.numel(), row):
        launch_once(plan, one_shot_kernel, cfg.grid(cdiv(n, cfg.block)), (*ws.kernel_args, plan.desc,
                    region.ptrs_dev, epochs), src[start:], dst[start:], (n,),
                    meta(plan, REDUCE_OP=plan.reduce_code, FORMAT=WORD_FORMAT[x.dtype], ROW=row, BLOCK=cfg.block,
                         PEERS=next_power_of_2(world), PER_PEER=world == 2),
                    whole=not padded and n == src.numel())
    if padded:
        out.reshape(-1).copy_(result[:-1])
    return out


def _launch_two_shot(plan: Plan, x_words, out_words, n_words: int, shard: int, stride: int, gather: bool,
                     whole: bool) -> None:
    ws, cfg, world = plan.ws, config(plan), plan.world
    # The reduce-scatter's push-ahead (0: main's two passes); SYMMCOLL_RS_SENTINEL_LAG, debug_switches.
    lag = 0 if gather else (debug_switches.RS_SENTINEL_LAG or 0)
    region, epochs = ws.region(TWO_SHOT_SLOTS.name), ws.local_state(TWO_SHOT_EPOCHS.name)
    # Pushing ahead holds two blocks' tiles: 141-143 registers a thread at world 4 (sm_90, 4 warps) where
    # main's kernel takes 122-124, which would leave room for 3 programs per SM instead of 4 (528 programs,
    # the large-size config, in two waves). Capped at 128, ptxas fits it in 116-117 with no spill.
    limits = dict(maxnreg=128) if lag and ws.device.type == "cuda" else {}
    launch_once(plan, two_shot_tiles_kernel, cfg.grid(cdiv(shard, cfg.block)),
                (*ws.kernel_args, plan.desc, region.ptrs_dev, epochs), x_words, out_words, (n_words, shard, stride),
                meta(plan, REDUCE_OP=plan.reduce_code, FORMAT=WORD_FORMAT[plan.request.dtype],
                     ROW=row_words("two_shot", ws.device.type, world), BLOCK=cfg.block, GATHER=gather,
                     PEERS=next_power_of_2(world), LAG=lag, **limits), whole)


def _two_shot(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    flat, padded = padded_words(x)
    result = torch.empty_like(flat) if padded else out.reshape(-1)
    src, dst = flat.view(torch.int32), result.view(torch.int32)
    for start, n in chunks(src.numel(), MAX_BYTES["two_shot"][plan.ws.device.type] // 4):
        shard = shard_words(n, plan.world)
        _launch_two_shot(plan, src[start:], dst[start:], n, shard, shard, gather=True,
                         whole=not padded and n == src.numel())
    if padded:
        out.reshape(-1).copy_(result[:-1])
    return out


def _reduce_scatter(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    x_words, out_words = x.reshape(-1).view(torch.int32), out.reshape(-1).view(torch.int32)
    segment = out_words.numel()
    for start, n in chunks(segment, row_words("two_shot", plan.ws.device.type, plan.world)):
        _launch_two_shot(plan, x_words[start:], out_words[start:], (plan.world - 1) * segment + n, n, segment,
                         gather=False, whole=n == segment)
    return out


def _whole_words(request, world: int) -> str | None:
    reason = reduction_dtype_reason(request, world)
    if reason is None and (request.nbytes // world) % 4:
        reason = f"segments of {request.nbytes // world} bytes are not whole 4-byte words"
    return reason


register(Algorithm("all_reduce", "sentinel_one_shot", 5, "sentinel", _one_shot,
                   "barrier-free one-shot: data pushed to every peer, polled for a sentinel", GPU_ONE_SHOT,
                   accepts=reduction_dtype_reason))
register(Algorithm("all_reduce", "sentinel_two_shot", 6, "sentinel", _two_shot,
                   "barrier-free two-shot: push reduce-scatter, push all-gather", GPU_TWO_SHOT,
                   accepts=reduction_dtype_reason))
register(Algorithm("reduce_scatter", "sentinel", 21, "sentinel", _reduce_scatter,
                   "barrier-free push reduce-scatter (the two-shot's first half)", GPU_REDUCE_SCATTER,
                   accepts=_whole_words, instead="pull"))
