"""The barrier-based pull family: every rank copies its part into its own symmetric buffer, a barrier
publishes it, every rank pulls what it needs from its peers' buffers over NVLink, and an exit barrier
(or a region of its own) keeps the next call from overwriting what a peer still reads.

all_reduce.one_shot
    Every rank copies its input into its buffer; after a barrier every rank reads the whole tensor from
    every peer and reduces it (fp32, ranks in rank order: bit-identical results everywhere); an exit
    barrier. Traffic: (W-1) * S read per rank. Wins where latency dominates: two barriers, one launch.

all_reduce.two_shot
    Reduce-scatter then all-gather in one kernel. Rank r owns shard r of W. Each rank copies the W-1
    shards it does not own into its buffer; after a barrier rank r reduces shard r (its own part from
    its input, peers' from their buffers) into its output and its ``pull.reduced`` region; after a second
    barrier every rank pulls the other reduced shards from their owners' regions. No exit barrier: the
    reduced region is two_shot's alone and is rewritten only after the entry barrier of the next
    two_shot, which a peer passes only after its pulls. Traffic: 2 (W-1)/W * S read per rank.

reduce_scatter.pull
    Every rank stages the segments its peers reduce (all but its own) in its buffer, packed
    (slot(s) = s - (s > r) in rank r's buffer); after a barrier rank r reads segment r from every peer
    and reduces it; an exit barrier. Traffic: (W-1) * S/W read per rank (S = input bytes), the minimum.

Work split (all three): program ``pid`` owns blocks pid, pid + P, ... of every shard or segment, both
when staging and when reading, so program ``pid`` only waits on program ``pid`` of its peers. Inputs
larger than the workspace go in workspace-sized pieces, one launch each. Every barrier carries the call
descriptor: a peer in another call is reported, never reduced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import (announce, block_barrier, combine, copy_blocks, finalize, move_block, narrow, peer_ptr)
from ..memory.regions import RegionSpec, declare
from ..plan import Algorithm, LaunchConfig, Plan, SizedConfigs, reduction_dtype_reason, register
from .common import cdiv, chunks, config, launch_once, meta

REDUCED = declare(RegionSpec(
    "pull.reduced", "pull", lambda g: g.buffer_bytes // g.world_size + 1024,
    "two_shot writes its reduced shard here after its entry barrier and peers read it between its second "
    "barrier and their next two_shot's entry barrier; no other algorithm touches it"))

# From benchmarks/sweep_configs.py on 4x H200 (benchmarks/results/2026-11-21-sweep/sweep.json).
GPU_ONE_SHOT = SizedConfigs(((256 << 10, LaunchConfig(4096, 64, 8)),
                             (1 << 20, LaunchConfig(4096, 64, 16)),
                             (1 << 40, LaunchConfig(4096, 132, 8))))
GPU_TWO_SHOT = SizedConfigs(((1 << 20, LaunchConfig(4096, 64, 8)),
                             (16 << 20, LaunchConfig(8192, 64, 16)),
                             (1 << 40, LaunchConfig(8192, 132, 16))))
# Above 4 MB: bigger blocks, a program per SM (the trend of the all-reduce config sweep).
GPU_REDUCE_SCATTER = SizedConfigs(((4 << 20, LaunchConfig(block=4096, max_programs=64, num_warps=16)),
                                   (1 << 40, LaunchConfig(block=8192, max_programs=132, num_warps=16))))


@triton.jit
def _reduce_peers(buffer_ptrs_dev, offs, mask, ELEM: tl.constexpr, WORLD: tl.constexpr,
                  REDUCE_OP: tl.constexpr):
    """fp32 reduction of ``offs`` over every rank's buffer, in rank order (bit-identical everywhere)."""
    acc = tl.load(peer_ptr(buffer_ptrs_dev, 0, ELEM) + offs, mask=mask).to(tl.float32)
    for r in tl.static_range(1, WORLD):
        acc = combine(acc, tl.load(peer_ptr(buffer_ptrs_dev, r, ELEM) + offs, mask=mask).to(tl.float32),
                      REDUCE_OP)
    return finalize(acc, REDUCE_OP, WORLD)


@triton.jit
def _one_shot_block(buffer_ptrs_dev, out_ptr, offs, mask, WORLD: tl.constexpr, REDUCE_OP: tl.constexpr):
    elem = out_ptr.dtype.element_ty
    tl.store(out_ptr + offs, narrow(_reduce_peers(buffer_ptrs_dev, offs, mask, elem, WORLD, REDUCE_OP), elem),
             mask=mask)


@triton.jit
def one_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: its descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # this piece
    x_ptr, out_ptr, numel,
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    lane = tl.arange(0, BLOCK)
    full = tl.full([BLOCK], 1, tl.int1)  # whole blocks go unmasked (16-byte accesses)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    copy_blocks(x_ptr, peer_ptr(buffer_ptrs_dev, rank, x_ptr.dtype.element_ty), numel, BLOCK)
    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        for start in range(pid * BLOCK, numel, step):
            offs = start + lane
            if start + BLOCK <= numel:
                _one_shot_block(buffer_ptrs_dev, out_ptr, offs, full, WORLD, REDUCE_OP)
            else:
                _one_shot_block(buffer_ptrs_dev, out_ptr, offs, offs < numel, WORLD, REDUCE_OP)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


@triton.jit
def _two_shot_reduce_block(x_ptr, buffer_ptrs_dev, reduced_ptr, out_ptr, offs, in_shard, mask, rank,
                           WORLD: tl.constexpr, REDUCE_OP: tl.constexpr):
    """Reduce my shard's block (mine from x, the peers' from their buffers) into my output and my
    reduced region, where the peers pull it from."""
    elem = x_ptr.dtype.element_ty
    acc = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    for r in tl.static_range(WORLD):
        if r != rank:
            acc = combine(acc, tl.load(peer_ptr(buffer_ptrs_dev, r, elem) + offs, mask=mask).to(tl.float32),
                          REDUCE_OP)
    reduced = narrow(finalize(acc, REDUCE_OP, WORLD), elem)
    tl.store(reduced_ptr + in_shard, reduced, mask=mask)
    tl.store(out_ptr + offs, reduced, mask=mask)


@triton.jit
def two_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; address tables of the shared buffer and of the reduced shards
    desc, buffer_ptrs_dev, reduced_ptrs_dev,
    # this piece, cut into WORLD shards of shard_len elements (the last one short or empty)
    x_ptr, out_ptr, numel, shard_len,
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    blocks_per_shard = tl.cdiv(shard_len, BLOCK)
    elem = x_ptr.dtype.element_ty
    my_buf = peer_ptr(buffer_ptrs_dev, rank, elem)
    lane = tl.arange(0, BLOCK)
    full = tl.full([BLOCK], 1, tl.int1)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)

    # Copy in every shard but mine: shard s is reduced by rank s, which reads it from here.
    for b in range(pid, blocks_per_shard, nprog):
        for s in tl.static_range(WORLD):
            if s != rank:
                start = s * shard_len + b * BLOCK
                offs = start + lane
                if (b + 1) * BLOCK <= shard_len and start + BLOCK <= numel:
                    move_block(x_ptr, my_buf, offs, full)
                else:
                    move_block(x_ptr, my_buf, offs, (b * BLOCK + lane < shard_len) & (offs < numel))

    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        my_reduced = peer_ptr(reduced_ptrs_dev, rank, elem)
        for b in range(pid, blocks_per_shard, nprog):
            start = rank * shard_len + b * BLOCK
            offs = start + lane
            in_shard = b * BLOCK + lane
            if (b + 1) * BLOCK <= shard_len and start + BLOCK <= numel:
                _two_shot_reduce_block(x_ptr, buffer_ptrs_dev, my_reduced, out_ptr, offs, in_shard, full,
                                       rank, WORLD, REDUCE_OP)
            else:
                _two_shot_reduce_block(x_ptr, buffer_ptrs_dev, my_reduced, out_ptr, offs, in_shard,
                                       (in_shard < shard_len) & (offs < numel), rank, WORLD, REDUCE_OP)
        failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
        if failed == 0:
            # Pull every other reduced shard from its owner's reduced region.
            for b in range(pid, blocks_per_shard, nprog):
                for s in tl.static_range(WORLD):
                    if s != rank:
                        start = s * shard_len + b * BLOCK
                        in_shard = b * BLOCK + lane
                        owner = peer_ptr(reduced_ptrs_dev, s, elem)
                        if (b + 1) * BLOCK <= shard_len and start + BLOCK <= numel:
                            tl.store(out_ptr + start + lane, tl.load(owner + in_shard))
                        else:
                            mask = (in_shard < shard_len) & (start + lane < numel)
                            tl.store(out_ptr + start + lane, tl.load(owner + in_shard, mask=mask), mask=mask)


@triton.jit
def _contribution(buffer_ptrs_dev, x_ptr, r, rank, numel, segment_stride):
    """Where rank ``r``'s part of my segment lives: my own input when r is me, else the slot of my
    segment in r's buffer."""
    if r == rank:
        src = x_ptr + tl.cast(rank, tl.int64) * segment_stride
    else:
        slot = rank - tl.cast(rank > r, tl.int32)
        src = peer_ptr(buffer_ptrs_dev, r, x_ptr.dtype.element_ty) + tl.cast(slot, tl.int64) * numel
    return src


@triton.jit
def _reduce_segment_block(buffer_ptrs_dev, x_ptr, out_ptr, offs, mask, rank, numel, segment_stride,
                          WORLD: tl.constexpr, REDUCE_OP: tl.constexpr):
    """out[offs] = op over ranks of their part of my segment, fp32, in rank order."""
    acc = tl.load(_contribution(buffer_ptrs_dev, x_ptr, 0, rank, numel, segment_stride) + offs,
                  mask=mask).to(tl.float32)
    for r in tl.static_range(1, WORLD):
        src = _contribution(buffer_ptrs_dev, x_ptr, r, rank, numel, segment_stride)
        acc = combine(acc, tl.load(src + offs, mask=mask).to(tl.float32), REDUCE_OP)
    tl.store(out_ptr + offs, narrow(finalize(acc, REDUCE_OP, WORLD), out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def reduce_scatter_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # this piece: numel elements of each segment; segment s starts at x_ptr + s * segment_stride
    x_ptr, out_ptr, numel, segment_stride,
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    my_buf = peer_ptr(buffer_ptrs_dev, rank, x_ptr.dtype.element_ty)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    for s in tl.static_range(WORLD):
        if s != rank:
            slot = s - tl.cast(s > rank, tl.int32)
            copy_blocks(x_ptr + tl.cast(segment_stride, tl.int64) * s, my_buf + tl.cast(slot, tl.int64) * numel,
                        numel, BLOCK)
    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        lane = tl.arange(0, BLOCK)
        for start in range(pid * BLOCK, numel, step):
            offs = start + lane
            if start + BLOCK <= numel:  # whole blocks go unmasked (16-byte accesses)
                _reduce_segment_block(buffer_ptrs_dev, x_ptr, out_ptr, offs, tl.full([BLOCK], 1, tl.int1),
                                      rank, numel, segment_stride, WORLD, REDUCE_OP)
            else:
                _reduce_segment_block(buffer_ptrs_dev, x_ptr, out_ptr, offs, offs < numel,
                                      rank, numel, segment_stride, WORLD, REDUCE_OP)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


def aligned_shard_len(n: int, world: int) -> int:
    """Elements per shard of an n-element piece: ceil(n / W) rounded up to a multiple of 16, which keeps
    every shard start aligned for 16-byte accesses; the last shard may be short or empty."""
    return cdiv(cdiv(n, world), 16) * 16


def _one_shot(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg = plan.ws, config(plan)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    for start, n in chunks(flat.numel(), ws.capacity(x.dtype)):
        launch_once(plan, one_shot_kernel, cfg.grid(cdiv(n, cfg.block)), (*ws.kernel_args, plan.desc,
                    ws.buffer_ptrs_dev), flat[start:], out_flat[start:], (n,),
                    meta(plan, REDUCE_OP=plan.reduce_code, BLOCK=cfg.block), whole=n == flat.numel())
    return out


def _two_shot(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg = plan.ws, config(plan)
    reduced = ws.region(REDUCED.name)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    for start, n in chunks(flat.numel(), ws.capacity(x.dtype)):
        shard_len = aligned_shard_len(n, plan.world)
        launch_once(plan, two_shot_kernel, cfg.grid(cdiv(shard_len, cfg.block)),
                    (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, reduced.ptrs_dev), flat[start:], out_flat[start:],
                    (n, shard_len), meta(plan, REDUCE_OP=plan.reduce_code, BLOCK=cfg.block), whole=n == flat.numel())
    return out


def _reduce_scatter(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg = plan.ws, config(plan)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    segment = out_flat.numel()
    # W-1 staged slots of a piece fit the buffer; lengths a multiple of 16 keep every slot aligned.
    for start, n in chunks(segment, ws.capacity(x.dtype) // (plan.world - 1) // 16 * 16):
        launch_once(plan, reduce_scatter_kernel, cfg.grid(cdiv(n, cfg.block)), (*ws.kernel_args, plan.desc,
                    ws.buffer_ptrs_dev), flat[start:], out_flat[start:], (n, segment),
                    meta(plan, REDUCE_OP=plan.reduce_code, BLOCK=cfg.block), whole=n == segment)
    return out


register(Algorithm("all_reduce", "one_shot", 2, "pull", _one_shot,
                   "copy in, barrier, every rank reduces the whole tensor from every peer", GPU_ONE_SHOT,
                   accepts=reduction_dtype_reason))
register(Algorithm("all_reduce", "two_shot", 3, "pull", _two_shot,
                   "reduce-scatter then all-gather by pulls, in one kernel", GPU_TWO_SHOT,
                   accepts=reduction_dtype_reason))
register(Algorithm("reduce_scatter", "pull", 20, "pull", _reduce_scatter,
                   "stage peers' segments, barrier, reduce my segment from every peer", GPU_REDUCE_SCATTER,
                   accepts=reduction_dtype_reason))
