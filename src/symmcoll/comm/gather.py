"""Data movement by pulls: all-gather (dim-0 concatenation, like ``all_gather_into_tensor``) and
broadcast. Kernels move words, not values: any dtype of itemsize 1, 2, 4 or 8 is viewed as the integer
type of that size (fp8, bool, ints, bf16, complex64, ...); other itemsizes go to the process group.

all_gather.pull
    Every rank copies its input into its own buffer (and, in the same pass, into its own slot of the
    output); a barrier publishes the buffers; every rank reads each peer's buffer into that peer's slot
    of the output, peers in the order rank+1, rank+2, ... (the ranks do not all read rank 0 first); an
    exit barrier keeps the next call from overwriting a buffer a peer still reads::

        rank r:   x_r --copy--> buf_r, out[r]   (local)
                  barrier                       (program pid with program pid of every peer)
                  buf_s --read--> out[s]        for every peer s (NVLink reads)
                  barrier                       (exit)

    Traffic: (W-1) * S read per rank, the minimum. Wins at small and medium sizes.

all_gather.copy_engine
    The same exchange with the copy engines instead of SMs: my input is copied into my buffer, a
    one-program barrier kernel publishes it, W-1 ``copy_`` calls pull each peer's buffer straight into
    the output, and a barrier kernel ends the call. A copy engine pulls at the link rate (357-368 GB/s
    measured) where SM loads reach 310-327 GB/s; the launches cost a few microseconds more: it pays off
    from tens of MB per rank. Graph-safe (copies between fixed addresses, self-resetting barriers).
    The local passes over the input are hidden behind the pulls: each chunk is staged in parts
    (``copy_engine_parts``) with a barrier each, part p is pulled on a side stream while the main stream
    stages part p+1, and the own slot is copied on the main stream while the last pulls run
    (``_copy_engine_overlapped``). On 2x H100 that took 256 MB from 1094 to 960 us and 16 MB from 86 to
    79 (benchmarks/results/2026-11-28-quant-agce-h100x2). SYMMCOLL_AG_CE_PARTS=N forces N parts, 0 the
    one-stream path before it (copy-in, own slot, barrier, pulls, barrier; ``_copy_engine_one_stream``).

broadcast.pull
    The source copies its input into its buffer (and its output); a barrier publishes it; every other
    rank reads the source's buffer into its output; an exit barrier. The source's NVLink ports carry
    (W-1) * S bytes; wins at small and medium sizes (at large sizes a pipelined ring spreads the load).

Work split: program ``pid`` owns blocks pid, pid + P, ... of the input on every rank, so program ``pid``
only waits on program ``pid`` of its peers. Inputs larger than the workspace go in pieces; a 0-dim
all-gather input counts as one element per rank (output shape ``[W]``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import debug_switches
from ..language import announce, block_barrier, copy_blocks, peer_ptr, tee_blocks
from ..plan import Algorithm, Plan, register, word_dtype_reason
from .common import as_words, byte_part, cdiv, chunks, config, launch_once, meta, move_configs, on_side, side_stream


@triton.jit
def all_gather_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # this piece: numel words of my input, gathered into out[s * out_rank_stride + ...]
    x_ptr, out_ptr, numel, out_rank_stride,
    WORLD: tl.constexpr, BLOCK: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    tee_blocks(x_ptr, peer_ptr(buffer_ptrs_dev, rank, elem), out_ptr + tl.cast(rank, tl.int64) * out_rank_stride,
               numel, BLOCK)
    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        for k in tl.static_range(1, WORLD):
            peer = (rank + k) % WORLD
            copy_blocks(peer_ptr(buffer_ptrs_dev, peer, elem), out_ptr + tl.cast(peer, tl.int64) * out_rank_stride,
                        numel, BLOCK)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


@triton.jit
def broadcast_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table; the root
    desc, buffer_ptrs_dev, src,
    # this piece (numel words; x is read on the source only)
    x_ptr, out_ptr, numel,
    WORLD: tl.constexpr, BLOCK: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    if rank == src:
        tee_blocks(x_ptr, peer_ptr(buffer_ptrs_dev, rank, elem), out_ptr, numel, BLOCK)
    failed = block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
    if failed == 0:
        if rank != src:
            copy_blocks(peer_ptr(buffer_ptrs_dev, src, elem), out_ptr, numel, BLOCK)
        # The source may not overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


def gather_words(plan: Plan, words: torch.Tensor, out_words: torch.Tensor) -> None:
    """Gather flat word tensors (the same numel on every rank) into ``out_words`` (W * numel), in
    workspace-sized pieces."""
    ws, cfg = plan.ws, config(plan)
    total = words.numel()
    for start, n in chunks(total, ws.capacity(words.dtype)):
        launch_once(plan, all_gather_kernel, cfg.grid(cdiv(n, cfg.block)), (*ws.kernel_args, plan.desc,
                    ws.buffer_ptrs_dev), words[start:], out_words[start:], (n, total), meta(plan, BLOCK=cfg.block),
                    whole=n == total)


def _all_gather(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    gather_words(plan, as_words(x), as_words(out))
    return out


# Parts a chunk is staged in, by its bytes a rank: 2 below 128 MB, 4 from there. Measured on 2x H100 (1 / 2 / 4
# parts, us): 16 MB 79.2 / 79.1 / 87.0, 32 MB 145.3 / 144.4 / 146.7, 64 MB 268.8 / 262.3 / 263.6, 128 MB
# 516.0 / 499.8 / 495.2, 256 MB 1012 / 975.8 / 960.5 (results/2026-11-28-quant-agce-h100x2).
PARTS_BY_BYTES = ((128 << 20, 2), (1 << 62, 4))


def copy_engine_parts(chunk_bytes: int) -> int:
    """Parts a chunk of ``chunk_bytes`` is staged in (SYMMCOLL_AG_CE_PARTS, else PARTS_BY_BYTES); 0: one stream."""
    if debug_switches.AG_CE_PARTS is not None:
        return debug_switches.AG_CE_PARTS
    return next(parts for below, parts in PARTS_BY_BYTES if chunk_bytes < below)


def _copy_engine(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    parts = copy_engine_parts(min(x.numel() * x.element_size(), plan.ws.buffer_bytes))
    if parts:
        return _copy_engine_overlapped(plan, x, out, parts)
    return _copy_engine_one_stream(plan, x, out)


def _copy_engine_one_stream(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Copy-in, own slot, barrier, pulls, barrier: everything on the caller's stream (SYMMCOLL_AG_CE_PARTS=0)."""
    ws, world, rank = plan.ws, plan.world, plan.rank
    src, dst = x.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8)
    total = src.numel()
    for start, n in chunks(total, ws.buffer_bytes):
        ws.buffer[:n].copy_(src[start:start + n])
        dst[rank * total + start:][:n].copy_(src[start:start + n])
        plan.barrier()
        for k in range(1, world):
            peer = (rank + k) % world
            dst[peer * total + start:][:n].copy_(ws.peer_buffer(peer)[:n])
        plan.barrier()  # nobody refills its buffer while a peer still copies from it
    return out


def _copy_engine_overlapped(plan: Plan, x: torch.Tensor, out: torch.Tensor, parts: int) -> torch.Tensor:
    """all_gather.copy_engine with the local copies hidden behind the pulls:
    each chunk is staged in ``parts`` parts, a barrier after each; a side stream pulls part p from every
    peer while the main stream stages part p+1 and, after the last part, copies my input into my own
    slot of the output. The main stream's work (two local passes over the input) is shorter than the
    side stream's (W-1 link transfers), so only the first part's staging and the barriers stay exposed.
    Safe as today's: a peer reads my part p only after barrier p, which I enter after staging it (same
    stream); parts are disjoint regions of my buffer; the exit barrier comes after my pulls are joined,
    so nobody restages its buffer (next chunk or call) while a peer still copies from it."""
    ws, world, rank = plan.ws, plan.world, plan.rank
    src, dst = x.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8)
    total = src.numel()
    side = side_stream(plan, x.device)  # None on CPU: the same operations, in order
    main = torch.cuda.current_stream(x.device) if side is not None else None

    def pull(start: int, at: int, length: int) -> None:
        for k in range(1, world):
            peer = (rank + k) % world
            dst[peer * total + start + at:][:length].copy_(ws.peer_buffer(peer)[at:at + length])

    for start, n in chunks(total, ws.buffer_bytes):
        for p in range(parts):
            # Every rank cuts the chunk alike (same n): the same parts, the same barriers.
            at, length = byte_part(n, p, parts)
            if length == 0:
                continue
            ws.buffer[at:at + length].copy_(src[start + at:][:length])
            plan.barrier()
            with on_side(side, main):
                pull(start, at, length)
        dst[rank * total + start:][:n].copy_(src[start:start + n])  # overlaps the pulls still in flight
        if side is not None:
            main.wait_stream(side)
        plan.barrier()  # exit: nobody refills its buffer while a peer still copies from it
    return out


def _broadcast(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg = plan.ws, config(plan)
    words, out_words = as_words(x), as_words(out)
    for start, n in chunks(words.numel(), ws.capacity(words.dtype)):
        launch_once(plan, broadcast_kernel, cfg.grid(cdiv(n, cfg.block)), (*ws.kernel_args, plan.desc,
                    ws.buffer_ptrs_dev, plan.request.src), words[start:], out_words[start:], (n,),
                    meta(plan, BLOCK=cfg.block), whole=n == words.numel())
    return out


register(Algorithm("all_gather", "pull", 30, "gather", _all_gather,
                   "copy in, barrier, read every peer's buffer into the output", move_configs,
                   accepts=word_dtype_reason, instead="nccl"))
register(Algorithm("all_gather", "copy_engine", 31, "gather", _copy_engine,
                   "copy in, barrier kernel, copy-engine pulls from every peer", None,
                   accepts=word_dtype_reason, instead="nccl"))
register(Algorithm("broadcast", "pull", 50, "gather", _broadcast,
                   "the source copies in, barrier, every rank reads the source's buffer", move_configs,
                   accepts=word_dtype_reason, instead="nccl"))
