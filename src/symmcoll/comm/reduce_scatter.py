"""Reduce-scatter over symmetric memory: dim-0 split, like ``reduce_scatter_tensor``.

The input of every rank is W segments along dim 0 (x.shape[0] must be divisible by W); rank r's
output is the reduction over all ranks of their segment r.

pull
    Every rank copies the segments its peers will reduce (all but its own) into its own symmetric
    buffer; a barrier publishes them; then every rank reads its segment from every peer's buffer,
    reduces in fp32 in rank order (its own contribution comes straight from its input) and stores its
    output. An exit barrier keeps the next call from overwriting a buffer a peer is still reading::

        rank r:   x_r[s] --copy--> buf_r[slot(s)]    for every s != r (local)
                  barrier                            (program pid with program pid of every peer)
                  out_r = op(x_0[r], ..., x_{W-1}[r]),  x_s[r] read from buf_s (NVLink) for s != r
                  barrier                            (exit)

    The buffer holds W-1 segment slots (own segment never staged): slot(s) = s - (s > r) in rank r's
    buffer, so a reader r finds its segment at slot r - (r > s) of peer s's buffer.

    Traffic: each rank reads (W-1) * S/W bytes over NVLink (S = input bytes), the minimum for a
    reduce-scatter, plus a local copy of (W-1)/W of its input. Wins at small and medium sizes (two
    barriers, one launch, no ring steps); at large sizes it is bound by NVLink read bandwidth.

    Work split: program ``pid`` owns blocks pid, pid + P, ... of each segment, both when staging and
    when reducing, so program ``pid`` only waits on program ``pid`` of its peers.

sentinel
    Barrier-free push (stages 0 and 1 of all_reduce_sentinel's two-shot kernel): every rank stores
    segment s of its input straight into its row of rank s's slots, and rank s polls them for the
    sentinel, reduces in rank order and writes its output. No staging copy and no barrier; remote
    stores are never waited on. Needs segments of whole 4-byte words; others go to ``pull``.

push
    For large inputs: no copy-in and no NVLink reads. Every rank stores segment s of its input straight
    into its slot of rank s's staging region (a symmetric region of its own, not the shared buffer:
    other collectives leave peers' buffers in use when they end). The work goes in rounds of one block
    per program; after each round a barrier between program pid of every rank hands the round over,
    and every rank reduces that round's block of its segment from its staging region (local reads,
    fp32, rank order; its own contribution straight from its input)::

        rank r, program p, round b:  x_r[s][b] --store--> staging_s[slot(r)][b]   for every s != r
                                     barrier (program p with program p of every peer)
                                     out_r[b] = op(staging_r[..][b], x_r[r][b])   (local)
                  after the last round: barrier (exit)

    Remote stores need no round trip per access, and the reduce of one round overlaps the other
    programs' pushes. Traffic: (W-1) * S/W bytes stored to peers per rank (S = input bytes), nothing
    copied locally. ``all_reduce.push_copy_engine`` runs the same kernel for its reduce-scatter half.

bf16/fp16/fp32 with fp32 accumulation; op sum/avg/max/min. Inputs whose segments exceed the workspace
are reduced in workspace-sized pieces of every segment, one launch per piece. Every rank must pass a
tensor of the same shape and dtype (as with torch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import compile_check
from ..language import block_barrier, peer_ptr
from ..memory import get_workspace, register_op
from . import all_reduce_sentinel
from ._common import (LaunchConfig, SizedConfigs, check_device, check_reduction_dtype, check_tensor, chunks,
                      combine, copy_blocks, finalize, finish, group_size, logger, reduce_op_code, resolve_config)

PULL = register_op("reduce_scatter.pull")
PUSH = register_op("reduce_scatter.push")

# Above 4 MB: bigger blocks, a program per SM (the trend of the all-reduce config sweep).
GPU_PULL = SizedConfigs(((4 << 20, LaunchConfig(block=4096, max_programs=64, num_warps=16)),
                         (1 << 40, LaunchConfig(block=8192, max_programs=132, num_warps=16))))


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
def _reduce_block(buffer_ptrs_dev, x_ptr, out_ptr, offs, mask, rank, numel, segment_stride,
                  WORLD: tl.constexpr, REDUCE_OP: tl.constexpr):
    """out[offs] = op over ranks of their part of my segment, fp32, in rank order."""
    src = _contribution(buffer_ptrs_dev, x_ptr, 0, rank, numel, segment_stride)
    acc = tl.load(src + offs, mask=mask).to(tl.float32)
    for r in tl.static_range(1, WORLD):
        src = _contribution(buffer_ptrs_dev, x_ptr, r, rank, numel, segment_stride)
        acc = combine(acc, tl.load(src + offs, mask=mask).to(tl.float32), REDUCE_OP)
    acc = finalize(acc, REDUCE_OP, WORLD)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_scatter_kernel(
    # symmetric workspace: per-rank address tables, error record, wait budget
    buffer_ptrs_dev, signal_pad_ptrs_dev, status_ptr, max_spins,
    # this launch's piece: numel elements of each segment; segment s starts at x_ptr + s * segment_stride
    x_ptr, out_ptr, numel, segment_stride,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    elem = x_ptr.dtype.element_ty
    my_buf = peer_ptr(buffer_ptrs_dev, rank, elem)

    for s in tl.static_range(WORLD):
        if s != rank:
            slot = s - tl.cast(s > rank, tl.int32)
            copy_blocks(x_ptr + tl.cast(segment_stride, tl.int64) * s,
                        my_buf + tl.cast(slot, tl.int64) * numel, numel, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
    if failed == 0:
        lane = tl.arange(0, BLOCK)
        for start in range(pid * BLOCK, numel, step):
            offs = start + lane
            # Whole blocks go unmasked (16-byte vector accesses); only the tail block is masked.
            if start + BLOCK <= numel:
                _reduce_block(buffer_ptrs_dev, x_ptr, out_ptr, offs, tl.full([BLOCK], 1, tl.int1),
                              rank, numel, segment_stride, WORLD, REDUCE_OP)
            else:
                _reduce_block(buffer_ptrs_dev, x_ptr, out_ptr, offs, offs < numel,
                              rank, numel, segment_stride, WORLD, REDUCE_OP)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


# By input bytes, from benchmarks/sweep_configs.py (rs_push; benchmarks/results/2026-11-21-sweep-2):
# two programs per SM win from 16 MB of output per rank (the round barriers of one overlap the other's
# stores); on 2 ranks bigger blocks.
GPU_PUSH = SizedConfigs(
    ((16 << 20, LaunchConfig(block=16384, max_programs=132, num_warps=16)),
     (1 << 40, LaunchConfig(block=8192, max_programs=264, num_warps=16))),
    per_world=((2, ((1 << 40, LaunchConfig(block=16384, max_programs=264, num_warps=8)),)),))
# The all-reduce's reduce-scatter half (all_reduce.push_copy_engine), by tensor bytes (same sweep).
GPU_PUSH_ALL_REDUCE = SizedConfigs(
    ((1 << 40, LaunchConfig(block=8192, max_programs=264, num_warps=16)),),
    per_world=((2, ((1 << 40, LaunchConfig(block=16384, max_programs=264, num_warps=16)),)),))


@triton.jit
def _segment_len(s, numel, seg_len, seg_stride):
    """Elements of segment ``s`` in this piece (an all-reduce's last shards may be short or empty)."""
    return tl.minimum(seg_len, numel - s * seg_stride)


@triton.jit
def _push_segment_block(x_ptr, buffer_ptrs_dev, staging_offset, offs, mask, s, rank, seg_len, seg_stride):
    """Store block ``offs`` of my segment ``s`` into my slot of rank s's staging region."""
    slot = rank - tl.cast(rank > s, tl.int32)
    dst = (peer_ptr(buffer_ptrs_dev, s, x_ptr.dtype.element_ty) + staging_offset
           + tl.cast(slot, tl.int64) * seg_len)
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
    result = finalize(acc, REDUCE_OP, WORLD).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offs, result, mask=mask)
    if TEE:
        tl.store(copy_ptr + offs, result, mask=mask)


@triton.jit
def push_kernel(
    # symmetric workspace: staging region's address table and where this launch's slots start in it
    # (elements), signals, error record, wait budget
    staging_ptrs_dev, staging_offset, signal_pad_ptrs_dev, status_ptr, max_spins,
    # this launch's piece: segment s is x[s * seg_stride + i] for i < seg_len and s * seg_stride + i <
    # numel (an all-reduce's last shard may be short or empty); my result goes to out[i] (and copy[i])
    x_ptr, out_ptr, copy_ptr, numel, seg_len, seg_stride,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr, TEE: tl.constexpr, EXIT_BARRIER: tl.constexpr,
):
    pid = tl.program_id(0)
    elem = x_ptr.dtype.element_ty
    my_staging = peer_ptr(staging_ptrs_dev, rank, elem) + staging_offset
    lane = tl.arange(0, BLOCK)
    full = tl.full([BLOCK], 1, tl.int1)
    # Every segment is whole in this block exactly when the last one is.
    last_seg_len = _segment_len(WORLD - 1, numel, seg_len, seg_stride)
    my_seg_len = _segment_len(rank, numel, seg_len, seg_stride)
    failed = 0
    for b in range(pid, tl.cdiv(seg_len, BLOCK), tl.num_programs(0)):
        offs = b * BLOCK + lane
        whole = (b + 1) * BLOCK <= last_seg_len
        # Peers in the order rank+1, rank+2, ...: the ranks do not all store into rank 0 first.
        for k in tl.static_range(1, WORLD):
            s = (rank + k) % WORLD
            if whole:
                _push_segment_block(x_ptr, staging_ptrs_dev, staging_offset, offs, full, s, rank, seg_len, seg_stride)
            else:
                s_len = _segment_len(s, numel, seg_len, seg_stride)
                _push_segment_block(x_ptr, staging_ptrs_dev, staging_offset, offs, offs < s_len, s, rank, seg_len,
                                    seg_stride)
        if failed == 0:
            failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
        if failed == 0:
            if whole:
                _reduce_staged_block(x_ptr, my_staging, out_ptr, copy_ptr, offs, full, rank, seg_len,
                                     seg_stride, WORLD, REDUCE_OP, TEE)
            else:
                _reduce_staged_block(x_ptr, my_staging, out_ptr, copy_ptr, offs, offs < my_seg_len, rank,
                                     seg_len, seg_stride, WORLD, REDUCE_OP, TEE)
    if EXIT_BARRIER:
        # Nobody may push into a staging region (next call) until its owner has reduced from it.
        if failed == 0:
            block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


def staging(ws):
    """The push staging region (shared by reduce_scatter.push and all_reduce.push_copy_engine): as
    large as the shared buffer."""
    return ws.region("push.staging", ws.buffer_bytes)


def _segment_pieces(ws, dtype: torch.dtype, segment: int):
    """(start, length) pieces of every segment such that W-1 staged slots of a piece fit the buffer;
    lengths a multiple of 16 elements keep every slot aligned for 16-byte accesses."""
    return chunks(segment, ws.capacity(dtype) // (ws.world_size - 1) // 16 * 16)


def output_shape(x: torch.Tensor, world: int) -> tuple:
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to be split along dim 0 "
                         "(got a 0-dim tensor)")
    if x.shape[0] % world:
        raise ValueError(f"x.shape[0] must be divisible by the world size: x has shape "
                         f"{tuple(x.shape)}, world size {world}, so the output shape "
                         f"({x.shape[0]}/{world}, ...) is not whole")
    return (x.shape[0] // world, *x.shape[1:])


def _prepare(x: torch.Tensor, group, op: str):
    """Validate; the output, op code and workspace (None when there is nothing to exchange)."""
    check_tensor(x, "x")
    check_device(x, "x")
    check_reduction_dtype(x, "x")
    code = reduce_op_code(op)
    world = group_size(group)
    out = torch.empty(output_shape(x, world), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out, code, None
    if world == 1:
        return out.copy_(x), code, None  # a reduction over one rank, avg included
    ws = get_workspace(group, x.device)
    check_tensor(x, "x", ws.device.type)
    return out, code, ws


def sentinel(x: torch.Tensor, group=None, *, op: str = "sum",
             config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place barrier-free (push) reduce-scatter of ``x`` along dim 0."""
    out, code, ws = _prepare(x, group, op)
    if ws is None:
        return out
    if (out.numel() * out.element_size()) % 4:
        logger.debug("reduce_scatter.sentinel: segments of %d bytes are not whole words; using pull",
                     out.numel() * out.element_size())
        return pull(x, group, op=op, config=config)
    cfg = resolve_config(x, ws, config, all_reduce_sentinel.GPU_TWO_SHOT)
    all_reduce_sentinel.reduce_scatter_words(ws, x, out, code, cfg)
    return out


def push(x: torch.Tensor, group=None, *, op: str = "sum",
         config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place reduce-scatter of ``x`` along dim 0 by remote stores (see the module docstring)."""
    out, code, ws = _prepare(x, group, op)
    if ws is None:
        return out
    cfg = resolve_config(x, ws, config, GPU_PUSH)
    region = staging(ws)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    segment = out_flat.numel()
    world = ws.world_size
    for start, n in _segment_pieces(ws, x.dtype, segment):
        grid = cfg.grid(triton.cdiv(n, cfg.block))
        push_kernel[grid](
            region.ptrs_dev, 0, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
            flat[start:], out_flat[start:], out_flat[start:], world * segment - start, n, segment,
            ws.rank, PUSH,
            WORLD=world, REDUCE_OP=code, BLOCK=cfg.block, TEE=False, EXIT_BARRIER=True,
            num_warps=cfg.num_warps,
        )
    finish(ws)
    return out


def pull(x: torch.Tensor, group=None, *, op: str = "sum",
         config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place reduce-scatter of ``x`` along dim 0: shape [x.shape[0] // W, ...]."""
    out, code, ws = _prepare(x, group, op)
    if ws is None:
        return out
    cfg = resolve_config(x, ws, config, GPU_PULL)
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    segment = out_flat.numel()
    for start, n in _segment_pieces(ws, x.dtype, segment):
        grid = cfg.grid(triton.cdiv(n, cfg.block))
        _reduce_scatter_kernel[grid](
            ws.buffer_ptrs_dev, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
            flat[start:], out_flat[start:], n, segment,
            ws.rank, PULL,
            WORLD=ws.world_size, REDUCE_OP=code, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
    finish(ws)
    return out


for _dtype, _world, _op in (("bf16", 2, 0), ("bf16", 8, 1), ("fp16", 3, 2), ("fp32", 4, 3),
                            ("fp32", 8, 0)):
    compile_check.register(
        _reduce_scatter_kernel,
        {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": f"*{_dtype}", "out_ptr": f"*{_dtype}",
         "numel": "i32", "segment_stride": "i32", "rank": "i32", "op_code": "i32"},
        {"WORLD": _world, "REDUCE_OP": _op, "BLOCK": GPU_PULL.largest.block},
        num_warps=GPU_PULL.largest.num_warps, label=f"{_dtype},")
# Arguments equal to 1 are specialised as constexprs on GPU: rank 1, one-element segments.
compile_check.register(
    _reduce_scatter_kernel,
    {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": "*bf16", "out_ptr": "*bf16", "op_code": "i32"},
    {"numel": 1, "segment_stride": 1, "rank": 1, "WORLD": 4, "REDUCE_OP": 1, "BLOCK": GPU_PULL.largest.block},
    num_warps=GPU_PULL.largest.num_warps, label="bf16,")
for _dtype, _world, _op, _tee in (("bf16", 4, 0, False), ("fp32", 3, 1, True), ("fp16", 8, 2, True)):
    compile_check.register(
        push_kernel,
        {"staging_ptrs_dev": "i64", "staging_offset": "i32", "signal_pad_ptrs_dev": "i64", "status_ptr": "i64", "max_spins": "i32",
         "x_ptr": f"*{_dtype}", "out_ptr": f"*{_dtype}", "copy_ptr": f"*{_dtype}", "numel": "i32",
         "seg_len": "i32", "seg_stride": "i32", "rank": "i32", "op_code": "i32"},
        {"WORLD": _world, "REDUCE_OP": _op, "BLOCK": GPU_PUSH.largest.block, "TEE": _tee,
         "EXIT_BARRIER": not _tee},
        num_warps=GPU_PUSH.largest.num_warps, label=f"{_dtype},")
