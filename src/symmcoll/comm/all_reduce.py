"""All-reduce over symmetric memory.

one_shot
    Every rank copies its input into its own symmetric buffer, a barrier publishes it, then every rank
    reads the whole tensor from every peer and reduces it locally (fp32 accumulation, ranks summed in
    rank order so every rank gets bit-identical results). A second barrier keeps the next call from
    overwriting a buffer a peer is still reading.

    Traffic: each rank reads (W-1) * S bytes over NVLink. Wins where latency dominates (small sizes:
    two barriers, one launch, no intermediate stores); loses to two-shot once bandwidth dominates.

    Work split: program ``pid`` owns blocks pid, pid + P, pid + 2P, ... of the tensor on every rank,
    so the barrier of program ``pid`` only has to cover those blocks (it waits on program ``pid`` of
    each peer only).

two_shot
    Reduce-scatter then all-gather inside one kernel. The tensor is cut into W shards; rank r owns
    shard r. Each rank copies the W-1 shards it does not own into its buffer; after a barrier rank r
    reduces shard r (its own part straight from its input, the peers' from their buffers) into its
    output and into its "reduced" region; after a second barrier every rank pulls the other reduced
    shards from their owners' reduced regions into its output. No exit barrier is needed: the reduced
    region belongs to two_shot alone and is written only after the entry barrier of the next two_shot
    call, which a peer passes only after its pulls. (The shared buffer would not do: every other
    collective, and a two_shot of another size, writes it before its entry barrier.)

    Traffic: each rank reads 2 (W-1)/W * S over NVLink and copies (W-1)/W * S locally, against
    one-shot's (W-1) * S remote reads: wins from a few hundred KB up, where bandwidth dominates.

    Work split: program ``pid`` owns blocks pid, pid + P, ... of *every* shard, on every rank, so again
    program ``pid`` only waits on program ``pid`` of its peers.

push_copy_engine
    For large tensors: the reduce-scatter half is ``reduce_scatter.push`` (every rank stores shard s of
    its input into rank s's staging region, in rounds handed over by per-program barriers, and reduces
    its shard from local memory: no copy-in, no NVLink reads), writing its shard into its output and
    into its reduced region; a one-program barrier kernel then publishes the reduced shards and W-1
    ``copy_`` calls pull them with the copy engines (the link rate, above what SM loads reach)::

        push_kernel (TEE): shard s of x_r --store--> staging_s;  reduce shard r -> out[r], reduced_r
        barrier (one program)
        reduced_s --copy engine--> out[s]   for s = r+1, r+2, ...

    No exit barrier: a rank refills the staging regions and its reduced region only in its next call,
    after that call's first round barrier with every peer, and a peer enters its next call only after
    its copies. Traffic: 2 (W-1)/W * S per rank over NVLink, all by stores or copy engines.

Tensors larger than the workspace are reduced in workspace-sized pieces, one launch per piece.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import compile_check
from ..language import block_barrier, peer_ptr
from ..memory import register_op
from . import reduce_scatter
from ._common import (LaunchConfig, SizedConfigs, barrier, chunks, combine, copy_blocks, finalize, finish,
                      move_block, prepare_reduction)

ONE_SHOT = register_op("all_reduce.one_shot")
TWO_SHOT = register_op("all_reduce.two_shot")
PUSH_COPY_ENGINE = register_op("all_reduce.push_copy_engine")

# From benchmarks/sweep_configs.py on 4x H200 (benchmarks/results/2026-11-21-sweep/sweep.json).
GPU_ONE_SHOT = SizedConfigs(((256 << 10, LaunchConfig(4096, 64, 8)),
                             (1 << 20, LaunchConfig(4096, 64, 16)),
                             (1 << 40, LaunchConfig(4096, 132, 8))))
GPU_TWO_SHOT = SizedConfigs(((1 << 20, LaunchConfig(4096, 64, 8)),
                             (16 << 20, LaunchConfig(8192, 64, 16)),
                             (1 << 40, LaunchConfig(8192, 132, 16))))


@triton.jit
def _reduce_peers(buffer_ptrs_dev, offs, mask, ELEM: tl.constexpr, WORLD: tl.constexpr,
                  REDUCE_OP: tl.constexpr):
    """fp32 reduction of ``offs`` over every rank's buffer, in rank order (bit-identical everywhere)."""
    acc = tl.load(peer_ptr(buffer_ptrs_dev, 0, ELEM) + offs, mask=mask).to(tl.float32)
    for r in tl.static_range(1, WORLD):
        v = tl.load(peer_ptr(buffer_ptrs_dev, r, ELEM) + offs, mask=mask).to(tl.float32)
        acc = combine(acc, v, REDUCE_OP)
    return finalize(acc, REDUCE_OP, WORLD)


@triton.jit
def _one_shot_block(buffer_ptrs_dev, out_ptr, offs, mask, WORLD: tl.constexpr, REDUCE_OP: tl.constexpr):
    acc = _reduce_peers(buffer_ptrs_dev, offs, mask, out_ptr.dtype.element_ty, WORLD, REDUCE_OP)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _one_shot_kernel(
    # symmetric workspace: per-rank address tables, error record, wait budget
    buffer_ptrs_dev, signal_pad_ptrs_dev, status_ptr, max_spins,
    # this call's tensors
    x_ptr, out_ptr, numel,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    my_buf = peer_ptr(buffer_ptrs_dev, rank, x_ptr.dtype.element_ty)
    lane = tl.arange(0, BLOCK)
    # Whole blocks go unmasked (16-byte vector accesses); only the tail block is masked.
    full = tl.full([BLOCK], 1, tl.int1)

    copy_blocks(x_ptr, my_buf, numel, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
    if failed == 0:
        for start in range(pid * BLOCK, numel, step):
            offs = start + lane
            if start + BLOCK <= numel:
                _one_shot_block(buffer_ptrs_dev, out_ptr, offs, full, WORLD, REDUCE_OP)
            else:
                _one_shot_block(buffer_ptrs_dev, out_ptr, offs, offs < numel, WORLD, REDUCE_OP)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


@triton.jit
def _two_shot_reduce_block(x_ptr, buffer_ptrs_dev, reduced_ptr, out_ptr, offs, in_shard, mask, rank,
                           WORLD: tl.constexpr, REDUCE_OP: tl.constexpr):
    """Reduce my shard's block (mine from x, the peers' from their buffers); the result goes to my
    output and to my reduced region, where the peers pull it from."""
    elem = x_ptr.dtype.element_ty
    acc = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    for r in tl.static_range(WORLD):
        if r != rank:
            v = tl.load(peer_ptr(buffer_ptrs_dev, r, elem) + offs, mask=mask).to(tl.float32)
            acc = combine(acc, v, REDUCE_OP)
    reduced = finalize(acc, REDUCE_OP, WORLD).to(elem)
    tl.store(reduced_ptr + in_shard, reduced, mask=mask)
    tl.store(out_ptr + offs, reduced, mask=mask)


@triton.jit
def _two_shot_kernel(
    # symmetric workspace: per-rank address tables (buffer, signals, reduced shards), error record,
    # wait budget
    buffer_ptrs_dev, signal_pad_ptrs_dev, reduced_ptrs_dev, status_ptr, max_spins,
    # this call's tensors; the tensor is cut into WORLD shards of shard_len elements (last one short)
    x_ptr, out_ptr, numel, shard_len,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    blocks_per_shard = tl.cdiv(shard_len, BLOCK)
    elem = x_ptr.dtype.element_ty
    my_buf = peer_ptr(buffer_ptrs_dev, rank, elem)
    lane = tl.arange(0, BLOCK)
    full = tl.full([BLOCK], 1, tl.int1)

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

    failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
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

        failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
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


def _aligned_shard_len(n: int, world: int) -> int:
    """Elements per shard of an n-element piece: ceil(n / W) rounded up to a multiple of 16, which keeps
    every shard start aligned for 16-byte accesses (Triton specialises integer arguments divisible by
    16); the last shard may be short or empty."""
    return triton.cdiv(triton.cdiv(n, world), 16) * 16


def one_shot(x: torch.Tensor, group=None, *, op: str = "sum",
             config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place one-shot all-reduce of ``x`` over ``group``; returns a new tensor."""
    ws, code, cfg = prepare_reduction(x, group, op, config, GPU_ONE_SHOT)
    flat = x.reshape(-1)
    out = torch.empty_like(flat)
    for start, n in chunks(flat.numel(), ws.capacity(x.dtype)):
        grid = cfg.grid(triton.cdiv(n, cfg.block))
        _one_shot_kernel[grid](
            ws.buffer_ptrs_dev, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
            flat[start:], out[start:], n,
            ws.rank, ONE_SHOT,
            WORLD=ws.world_size, REDUCE_OP=code, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
    finish(ws)
    return out.view(x.shape)


def two_shot(x: torch.Tensor, group=None, *, op: str = "sum",
             config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place two-shot (reduce-scatter + all-gather) all-reduce; returns a new tensor."""
    ws, code, cfg = prepare_reduction(x, group, op, config, GPU_TWO_SHOT)
    # Room for the largest shard of any dtype: a buffer-sized piece's shard, plus alignment.
    reduced = ws.region("all_reduce.two_shot.reduced", ws.buffer_bytes // ws.world_size + 1024)
    flat = x.reshape(-1)
    out = torch.empty_like(flat)
    for start, n in chunks(flat.numel(), ws.capacity(x.dtype)):
        shard_len = _aligned_shard_len(n, ws.world_size)
        grid = cfg.grid(triton.cdiv(shard_len, cfg.block))
        _two_shot_kernel[grid](
            ws.buffer_ptrs_dev, ws.signal_pad_ptrs_dev, reduced.ptrs_dev, ws.status_ptr, ws.max_spins,
            flat[start:], out[start:], n, shard_len,
            ws.rank, TWO_SHOT,
            WORLD=ws.world_size, REDUCE_OP=code, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
    finish(ws)
    return out.view(x.shape)


def _side_streams(ws, n: int) -> list:
    """``n`` CUDA streams kept with the workspace, for copy-engine copies that run side by side."""
    streams = ws.extra.setdefault("all_reduce.side_streams", [])
    while len(streams) < n:
        streams.append(torch.cuda.Stream(ws.device))
    return streams[:n]


def push_copy_engine(x: torch.Tensor, group=None, *, op: str = "sum", config: LaunchConfig | None = None,
                     pieces: int = 1, parallel_copies: bool = False) -> torch.Tensor:
    """Out-of-place all-reduce: push reduce-scatter kernel, then a copy-engine all-gather.

    ``pieces`` cuts the tensor so that the gather of one piece overlaps the reduce-scatter of the next;
    ``parallel_copies`` puts the W-1 copies of a piece on W-1 streams. Both measured slower at every
    size from 4 to 128 MB on 2 and 4 ranks (benchmarks/results/2026-11-22-probe: W-1 copies side by
    side on 4 ranks 445 against 332 us at 64 MB), hence the defaults; kept for measuring."""
    if pieces < 1:
        raise ValueError(f"pieces must be >= 1, got {pieces}")
    ws, code, cfg = prepare_reduction(x, group, op, config, reduce_scatter.GPU_PUSH_ALL_REDUCE)
    world, rank = ws.world_size, ws.rank
    n_pieces = pieces
    staging = reduce_scatter.staging(ws)
    # Room for the largest shard of any dtype (plus alignment), whole 16-byte words for any dtype view.
    reduced = ws.region("all_reduce.push_copy_engine.reduced", (ws.buffer_bytes // world // 16 + 64) * 16)
    my_reduced = reduced.peers[rank].view(x.dtype)
    flat = x.reshape(-1)
    out = torch.empty_like(flat)
    on_gpu = ws.device.type == "cuda"
    main = torch.cuda.current_stream(ws.device) if on_gpu else None
    streams = _side_streams(ws, world - 1) if on_gpu and parallel_copies else []
    # Pieces are whole multiples of 16 * W elements: every shard of every piece stays 16-byte aligned.
    # With several pieces, leave room for that rounding (their staging slots and reduced shards follow
    # each other); one piece fits as it is (a workspace-sized tensor stays one launch).
    capacity = ws.capacity(x.dtype) - (n_pieces * world * 16 if n_pieces > 1 else 0)
    if capacity < world * 16:
        capacity, n_pieces = ws.capacity(x.dtype), 1
    for start, n in chunks(flat.numel(), capacity):
        piece = triton.cdiv(triton.cdiv(n, n_pieces), 16 * world) * 16 * world
        staging_offset = reduced_offset = 0
        for p_start in range(start, start + n, piece):
            m = min(piece, start + n - p_start)
            shard_len = _aligned_shard_len(m, world)
            grid = cfg.grid(triton.cdiv(shard_len, cfg.block))
            reduce_scatter.push_kernel[grid](
                staging.ptrs_dev, staging_offset, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
                flat[p_start:], out[p_start + rank * shard_len:], my_reduced[reduced_offset:],
                m, shard_len, shard_len,
                rank, PUSH_COPY_ENGINE,
                WORLD=world, REDUCE_OP=code, BLOCK=cfg.block, TEE=True, EXIT_BARRIER=False,
                num_warps=cfg.num_warps,
            )
            barrier(ws, PUSH_COPY_ENGINE)
            for k in range(1, world):
                peer = (rank + k) % world
                length = max(0, min(shard_len, m - peer * shard_len))
                if not length:
                    continue
                dst = out[p_start + peer * shard_len:][:length]
                src = reduced.peers[peer].view(x.dtype)[reduced_offset:][:length]
                if streams:
                    side = streams[k - 1]
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        dst.copy_(src)
                else:
                    dst.copy_(src)
            staging_offset += (world - 1) * shard_len
            reduced_offset += shard_len
        # The next workspace-sized piece refills the reduced region from its start: peers pass its
        # first round barrier only once every copy here is done.
        for side in streams:
            main.wait_stream(side)
    finish(ws)
    return out.view(x.shape)


for _dtype in ("bf16", "fp16", "fp32"):
    for _world in (2, 3, 4, 8):
        _tensors = {"x_ptr": f"*{_dtype}", "out_ptr": f"*{_dtype}", "numel": "i32"}
        _topology = {"rank": "i32", "op_code": "i32"}
        _meta = {"WORLD": _world, "REDUCE_OP": 0 if _world != 3 else 2}
        compile_check.register(
            _one_shot_kernel, {**compile_check.WORKSPACE_SIGNATURE, **_tensors, **_topology},
            {**_meta, "BLOCK": GPU_ONE_SHOT.largest.block}, num_warps=GPU_ONE_SHOT.largest.num_warps,
            label=f"{_dtype},")
        compile_check.register(
            _two_shot_kernel,
            {"buffer_ptrs_dev": "i64", "signal_pad_ptrs_dev": "i64", "reduced_ptrs_dev": "i64",
             "status_ptr": "i64", "max_spins": "i32", **_tensors, "shard_len": "i32", **_topology},
            {**_meta, "BLOCK": GPU_TWO_SHOT.largest.block}, num_warps=GPU_TWO_SHOT.largest.num_warps,
            label=f"{_dtype},")
