"""The push family: remote stores instead of NVLink reads, for large tensors.

reduce_scatter.push
    No copy-in and no NVLink reads. Every rank stores segment s of its input straight into its slot of
    rank s's ``push.staging`` region. The work goes in rounds of one block per program; after each round
    a barrier between program pid of every rank hands the round over, and every rank reduces that
    round's block of its segment from its staging region (local reads, fp32, rank order; its own
    contribution straight from its input); an exit barrier ends the call::

        rank r, program p, round b:  x_r[s][b] --store--> staging_s[slot(r)][b]   for every s != r
                                     barrier (program p with program p of every peer)
                                     out_r[b] = op(staging_r[..][b], x_r[r][b])   (local)
                  after the last round: barrier (exit)

    Remote stores need no round trip per access, and the reduce of one round overlaps the other
    programs' pushes. Traffic: (W-1) * S/W stored to peers per rank (S = input bytes).

all_reduce.push_copy_engine
    The same kernel for the reduce-scatter half (``TEE``: the reduced shard also goes to this rank's
    ``push.reduced`` region), a one-program barrier kernel, then W-1 ``copy_`` calls pull the peers'
    reduced shards with the copy engines (the link rate, above what SM loads reach)::

        push_kernel (TEE): shard s of x_r --store--> staging_s;  reduce shard r -> out[r], reduced_r
        barrier (one program)
        reduced_s --copy engine--> out[s]   for s = r+1, r+2, ...

    No exit barrier: a rank refills the staging regions and its reduced region only in its next call,
    after that call's first round barrier with every peer, and a peer enters its next call only after
    its copies. Traffic: 2 (W-1)/W * S per rank over NVLink, all by stores or copy engines. Wins at the
    largest sizes (>= 128 MB measured). Inputs larger than the workspace go in pieces.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import announce, block_barrier, combine, finalize, narrow, peer_ptr
from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..plan import Algorithm, LaunchConfig, Plan, SizedConfigs, reduction_dtype_reason, register
from .common import cdiv, chunks, config, meta

STAGING = declare(RegionSpec(
    "push.staging", "push", lambda g: g.buffer_bytes,
    "rank r stores into its slot of peers' staging only within a round, before that round's barrier; the "
    "owner reduces it after the barrier; the next store into the slot is after the next barrier (next "
    "round, or the exit / first barrier of the next call)"))
REDUCED = declare(RegionSpec(
    "push.reduced", "push", lambda g: (g.buffer_bytes // g.world_size // 16 + 64) * 16,
    "push_copy_engine writes this rank's reduced shard after the round barriers; peers copy it after the "
    "barrier kernel and before their next push_copy_engine passes its first round barrier"))

# By input bytes, from benchmarks/sweep_configs.py (rs_push; benchmarks/results/2026-11-21-sweep-2): two
# programs per SM win from 16 MB of output per rank; on 2 ranks bigger blocks.
GPU_PUSH = SizedConfigs(
    ((16 << 20, LaunchConfig(block=16384, max_programs=132, num_warps=16)),
     (1 << 40, LaunchConfig(block=8192, max_programs=264, num_warps=16))),
    per_world=((2, ((1 << 40, LaunchConfig(block=16384, max_programs=264, num_warps=8)),)),))
# The all-reduce's reduce-scatter half, by tensor bytes (same sweep).
GPU_PUSH_ALL_REDUCE = SizedConfigs(
    ((1 << 40, LaunchConfig(block=8192, max_programs=264, num_warps=16)),),
    per_world=((2, ((1 << 40, LaunchConfig(block=16384, max_programs=264, num_warps=16)),)),))


@triton.jit
def _segment_len(s, numel, seg_len, seg_stride):
    """Elements of segment ``s`` in this piece (an all-reduce's last shards may be short or empty)."""
    return tl.minimum(seg_len, numel - s * seg_stride)


@triton.jit
def _push_segment_block(x_ptr, staging_ptrs_dev, offs, mask, s, rank, seg_len, seg_stride):
    """Store block ``offs`` of my segment ``s`` into my slot of rank s's staging region."""
    slot = rank - tl.cast(rank > s, tl.int32)
    dst = peer_ptr(staging_ptrs_dev, s, x_ptr.dtype.element_ty) + tl.cast(slot, tl.int64) * seg_len
    tl.store(dst + offs, tl.load(x_ptr + tl.cast(s, tl.int64) * seg_stride + offs, mask=mask), mask=mask)


@triton.jit
def _reduce_staged_block(x_ptr, my_staging, out_ptr, copy_ptr, offs, mask, rank, seg_len, seg_stride,
                         WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, TEE: tl.constexpr):
    """out[offs] (and copy[offs] if TEE) = op over ranks of their part of my segment: rank r's part
    from slot r - (r > rank) of my staging region, mine from my input; fp32, rank order."""
    acc = tl.zeros(offs.shape, tl.float32)
    for r in tl.static_range(WORLD):
        if r == rank:
            v = tl.load(x_ptr + tl.cast(rank, tl.int64) * seg_stride + offs, mask=mask)
        else:
            slot = r - tl.cast(r > rank, tl.int32)
            v = tl.load(my_staging + tl.cast(slot, tl.int64) * seg_len + offs, mask=mask)
        if r == 0:
            acc = v.to(tl.float32)
        else:
            acc = combine(acc, v.to(tl.float32), REDUCE_OP)
    result = narrow(finalize(acc, REDUCE_OP, WORLD), out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs, result, mask=mask)
    if TEE:
        tl.store(copy_ptr + offs, result, mask=mask)


@triton.jit
def push_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the staging region's address table
    desc, staging_ptrs_dev,
    # this piece: segment s is x[s * seg_stride + i] for i < seg_len and s * seg_stride + i < numel (an
    # all-reduce's last shard may be short or empty); my result goes to out[i] (and copy[i] if TEE)
    x_ptr, out_ptr, copy_ptr, numel, seg_len, seg_stride,
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr, TEE: tl.constexpr,
    EXIT_BARRIER: tl.constexpr,
):
    pid = tl.program_id(0)
    my_staging = peer_ptr(staging_ptrs_dev, rank, x_ptr.dtype.element_ty)
    lane = tl.arange(0, BLOCK)
    full = tl.full([BLOCK], 1, tl.int1)
    # Every segment is whole in this block exactly when the last one is.
    last_seg_len = _segment_len(WORLD - 1, numel, seg_len, seg_stride)
    my_seg_len = _segment_len(rank, numel, seg_len, seg_stride)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    failed = 0
    for b in range(pid, tl.cdiv(seg_len, BLOCK), tl.num_programs(0)):
        offs = b * BLOCK + lane
        whole = (b + 1) * BLOCK <= last_seg_len
        # Peers in the order rank+1, rank+2, ...: the ranks do not all store into rank 0 first.
        for k in tl.static_range(1, WORLD):
            s = (rank + k) % WORLD
            if whole:
                _push_segment_block(x_ptr, staging_ptrs_dev, offs, full, s, rank, seg_len, seg_stride)
            else:
                _push_segment_block(x_ptr, staging_ptrs_dev, offs, offs < _segment_len(s, numel, seg_len, seg_stride),
                                    s, rank, seg_len, seg_stride)
        if failed == 0:
            failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
        if failed == 0:
            if whole:
                _reduce_staged_block(x_ptr, my_staging, out_ptr, copy_ptr, offs, full, rank, seg_len, seg_stride,
                                     WORLD, REDUCE_OP, TEE)
            else:
                _reduce_staged_block(x_ptr, my_staging, out_ptr, copy_ptr, offs, offs < my_seg_len, rank, seg_len,
                                     seg_stride, WORLD, REDUCE_OP, TEE)
    if EXIT_BARRIER:
        # Nobody may push into a staging region (next call) until its owner has reduced from it.
        if failed == 0:
            block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


def _reduce_scatter(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg, world = plan.ws, config(plan), plan.world
    staging = ws.region(STAGING.name)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    segment = out_flat.numel()
    # W-1 staged slots of a piece fit the staging region; lengths a multiple of 16 keep slots aligned.
    for start, n in chunks(segment, ws.capacity(x.dtype) // (world - 1) // 16 * 16):
        launch(push_kernel, cfg.grid(cdiv(n, cfg.block)),
               (*ws.kernel_args, plan.desc, staging.ptrs_dev, flat[start:], out_flat[start:], out_flat[start:],
                world * segment - start, n, segment),
               meta(plan, REDUCE_OP=plan.reduce_code, BLOCK=cfg.block, TEE=False, EXIT_BARRIER=True))
    return out


def _aligned_shard_len(n: int, world: int) -> int:
    return cdiv(cdiv(n, world), 16) * 16


def _push_copy_engine(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg, world, rank = plan.ws, config(plan), plan.world, plan.rank
    staging, reduced = ws.region(STAGING.name), ws.region(REDUCED.name)
    my_reduced = reduced.local.view(x.dtype)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    for start, n in chunks(flat.numel(), ws.capacity(x.dtype)):
        shard = _aligned_shard_len(n, world)
        launch(push_kernel, cfg.grid(cdiv(shard, cfg.block)),
               (*ws.kernel_args, plan.desc, staging.ptrs_dev, flat[start:], out_flat[start + rank * shard:],
                my_reduced, n, shard, shard),
               meta(plan, REDUCE_OP=plan.reduce_code, BLOCK=cfg.block, TEE=True, EXIT_BARRIER=False))
        plan.barrier()
        for k in range(1, world):
            peer = (rank + k) % world
            length = max(0, min(shard, n - peer * shard))
            if length:
                out_flat[start + peer * shard:][:length].copy_(reduced.peers[peer].view(x.dtype)[:length])
    return out


register(Algorithm("reduce_scatter", "push", 22, "push", _reduce_scatter,
                   "remote stores into peers' staging in rounds, local reduce", GPU_PUSH,
                   accepts=reduction_dtype_reason))
register(Algorithm("all_reduce", "push_copy_engine", 7, "push", _push_copy_engine,
                   "push reduce-scatter, then copy-engine all-gather", GPU_PUSH_ALL_REDUCE,
                   accepts=reduction_dtype_reason))
