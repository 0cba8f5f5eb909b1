"""The low-latency (LL) protocol: an all-reduce with no barrier and no signal at all.

all_reduce.low_latency
    Every rank pushes its input straight into every rank's slots (its own included); each 4-byte data
    word travels in one 8-byte store together with a flag, ``(epoch << 32) | word``. A receiver polls
    its slots until every slot carries this launch's epoch, reduces (fp32, rank order) and writes its
    output. Data and flag arrive in one single-copy-atomic store, so there is no fence and no exit
    barrier, and a stale slot (an older epoch) never matches.

    Traffic: 2 * (W-1) * S bytes written to peers per rank (data + flags), nothing read remotely. Wins
    at small sizes (a few KB up to ~256 KB), where a barrier's round trip dominates; the 2x inflation
    and the polling lose at larger sizes. Messages above ``LL_MAX_WORDS`` go in pieces.

Graph safety: the epoch lives on the device in a per-rank table that every launch advances once
(``launch_epoch`` / ``end_launch``). Every rank makes the same launches, so the counters agree. Two slot
sets alternate by epoch parity: a rank can be at most one launch ahead of a peer still reading (it
cannot finish launch k+1 before every peer has started it), so launch k+1 never overwrites launch k's
slots. Call descriptors travel in epoch-tagged headers (``post_header_at``), polled by program 0 with its
first block (``language.checks_headers``): a peer that made another call is reported on every rank.

Region ``low_latency.slots`` on every rank: headers [2 phases][MAX_WORLD] int64, then slots
[2 phases][W sources][LL_MAX_WORDS] int64; the source rank writes its row in every receiver's region.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import (EPOCH_SLOTS, MAX_WORLD, WORD_FORMAT, announce_at, checks_headers, combine, end_launch,
                        finalize, launch_epoch, pack, padded_words, peer_ptr, post_header_at, program0_peer_bases,
                        unpack, wait_flagged)
from ..memory.regions import RegionSpec, declare
from ..plan import Algorithm, LaunchConfig, Plan, SizedConfigs, reduction_dtype_reason, register
from .common import cdiv, chunks, config, launch_once, meta

# Largest piece per launch (CPU: small, so that the multi-piece path runs in the CPU tests too).
LL_MAX_WORDS = {"cuda": (512 << 10) // 4, "cpu": (16 << 10) // 4}
HEADER_WORDS = 2 * MAX_WORLD.value  # int64 headers before the slots

SLOTS = declare(RegionSpec(
    "low_latency.slots", "low_latency",
    lambda g: (HEADER_WORDS + 2 * g.world_size * LL_MAX_WORDS[g.device_type]) * 8,
    "rank s writes only its row (and header) of phase epoch % 2 in every receiver; a receiver only polls; "
    "a phase is rewritten two launches later, after every receiver has read it"))
EPOCHS = declare(RegionSpec("low_latency.epochs", "low_latency", lambda g: EPOCH_SLOTS.value,
                            "this rank's launch-epoch table (kernels only)", symmetric=False))

# Block = int32 words per program step. From benchmarks/sweep_configs.py on 4x H200.
GPU_LL = SizedConfigs(((8 << 10, LaunchConfig(256, 256, 2)),
                       (64 << 10, LaunchConfig(256, 128, 4)),
                       (1 << 40, LaunchConfig(512, 256, 4))))


@triton.jit
def low_latency_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the LL region's address table; this rank's launch-epoch table
    desc, ll_ptrs_dev, epochs_ptr,
    # this piece, as int32 words
    x_ptr, out_ptr, n_words,
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, SLOTS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % 2
    flag = epoch.to(tl.int64) << 32
    lane = tl.arange(0, BLOCK)
    # Every address first, program 0's announce and header after the push (language.open_slots says why).
    pads = program0_peer_bases(signal_pad_ptrs_dev, rank, WORLD, tl.int32)
    peer_headers = program0_peer_bases(ll_ptrs_dev, rank, WORLD, tl.int64)
    region = peer_ptr(ll_ptrs_dev, rank, tl.int64)
    slots_base = 2 * MAX_WORLD  # int64 slots after the headers

    # Push: my words, flagged with this epoch, into my row of every rank's region (mine included).
    my_row = slots_base + (phase * WORLD + rank) * SLOTS
    for start in range(pid * BLOCK, n_words, nprog * BLOCK):
        offs = start + lane
        mask = offs < n_words
        slots = flag | tl.load(x_ptr + offs, mask=mask).to(tl.uint32).to(tl.int64)
        for r in tl.static_range(WORLD):
            tl.store(peer_ptr(ll_ptrs_dev, r, tl.int64) + my_row + offs, slots, mask=mask)
    announce_at(pads, desc, rank, WORLD)
    post_header_at(peer_headers, phase, epoch, desc, rank, WORLD)

    # Receive: poll every source row of my own region (and, program 0 with its first block, the
    # headers: language.checks_headers), reduce in rank order.
    headers = region + phase * MAX_WORLD
    mine = region + slots_base + phase * WORLD * SLOTS
    budget = max_spins
    check = checks_headers(1)
    for start in range(pid * BLOCK, n_words, nprog * BLOCK):
        offs = start + lane
        mask = offs < n_words
        slots, budget = wait_flagged(mine + offs, mask, epoch, budget, status_ptr, rank, 0, desc, headers, check,
                                     WORLD)
        check = 0
        acc_lo, acc_hi = unpack(slots.to(tl.int32), FORMAT)
        for src in tl.static_range(1, WORLD):
            slots, budget = wait_flagged(mine + src * SLOTS + offs, mask, epoch, budget, status_ptr, rank, src,
                                         desc, headers, 0, WORLD)
            lo, hi = unpack(slots.to(tl.int32), FORMAT)
            acc_lo = combine(acc_lo, lo, REDUCE_OP)
            acc_hi = combine(acc_hi, hi, REDUCE_OP)
        if budget > 0:
            tl.store(out_ptr + offs, pack(finalize(acc_lo, REDUCE_OP, WORLD), finalize(acc_hi, REDUCE_OP, WORLD),
                                          FORMAT), mask=mask)
    end_launch(epochs_ptr, epoch)


def _low_latency(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg = plan.ws, config(plan)
    region, epochs = ws.region(SLOTS.name), ws.local_state(EPOCHS.name)
    flat, padded = padded_words(x)
    result = torch.empty_like(flat) if padded else out.reshape(-1)
    src_words, out_words = flat.view(torch.int32), result.view(torch.int32)
    piece = LL_MAX_WORDS[ws.device.type]
    for start, n in chunks(src_words.numel(), piece):
        launch_once(plan, low_latency_kernel, cfg.grid(cdiv(n, cfg.block)),
                    (*ws.kernel_args, plan.desc, region.ptrs_dev, epochs), src_words[start:], out_words[start:], (n,),
                    meta(plan, REDUCE_OP=plan.reduce_code, FORMAT=WORD_FORMAT[x.dtype], SLOTS=piece, BLOCK=cfg.block),
                    whole=not padded and n == src_words.numel())
    if padded:
        out.reshape(-1).copy_(result[:-1])
    return out


register(Algorithm("all_reduce", "low_latency", 4, "low_latency", _low_latency,
                   "barrier-free: every word pushed with an epoch flag (LL protocol)", GPU_LL,
                   accepts=reduction_dtype_reason))
