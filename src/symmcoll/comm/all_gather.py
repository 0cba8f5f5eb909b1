"""All-gather over symmetric memory: dim-0 concatenation, like ``all_gather_into_tensor``.

pull
    Every rank copies its input into its own symmetric buffer (and, in the same pass, into its own
    slot of the output); a barrier publishes the buffers; then every rank reads each peer's buffer into
    that peer's slot of the output, peers taken in the order rank+1, rank+2, ... so that the ranks do
    not all read rank 0 first. An exit barrier keeps the next call from overwriting a buffer that a
    peer is still reading::

        rank r:   x_r --copy--> buf_r        (local)
                  barrier                    (program pid with program pid of every peer)
                  buf_s --read--> out[s]     for every peer s (NVLink reads), x_r --> out[r]
                  barrier                    (exit)

    Traffic: each rank reads (W-1) * S bytes over NVLink (S = input bytes per rank), the minimum for a
    gather. Wins at small and medium sizes (two barriers, one launch); at large sizes it is bound by
    NVLink read bandwidth like NCCL's ring, without the ring's W-1 pipeline steps.

    Work split: program ``pid`` owns blocks pid, pid + P, ... of the input on every rank, both when it
    copies in and when it reads peers, so program ``pid`` only waits on program ``pid`` of its peers.

copy_engine
    The same exchange with the GPU's copy engines instead of SMs, for large inputs: my input is copied
    into my buffer, a one-program barrier kernel publishes it, then W-1 ``copy_`` calls pull each
    peer's buffer straight into the output (peers in the order rank+1, rank+2, ...), and an exit
    barrier follows. A copy engine pulls from a peer at the link rate (357-368 GB/s measured) where SM
    loads reach 310-327 GB/s, and the launches cost a few microseconds more: it pays off from tens of
    MB per rank. Graph-safe (copies between fixed addresses, self-resetting barrier slots).

The kernel moves words, not values: any dtype of itemsize 1, 2, 4 or 8 is viewed as the integer type
of that size (fp8, bool, ints, bf16, complex64 ...). Other itemsizes fall back to the process group's
own all-gather. Inputs larger than the workspace are gathered in workspace-sized pieces, one launch per
piece. Every rank must pass a tensor of the same shape and dtype (as with torch); a 0-dim input is
gathered as one element per rank (output shape ``[W]``), as ``all_gather_into_tensor`` does.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .. import compile_check
from ..language import block_barrier, peer_ptr
from ..memory import Workspace, get_workspace, register_op
from ._common import (GPU_MOVE_CONFIGS, LaunchConfig, as_words, barrier, check_device, check_tensor,
                      chunks, copy_blocks, finish, group_size, logger, move_config, tee_blocks)

PULL = register_op("all_gather.pull")
COPY_ENGINE = register_op("all_gather.copy_engine")


@triton.jit
def _all_gather_kernel(
    # symmetric workspace: per-rank address tables, error record, wait budget
    buffer_ptrs_dev, signal_pad_ptrs_dev, status_ptr, max_spins,
    # this launch's piece: numel words of my input, gathered into out[s * out_rank_stride + ...]
    x_ptr, out_ptr, numel, out_rank_stride,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    my_out = out_ptr + tl.cast(rank, tl.int64) * out_rank_stride
    tee_blocks(x_ptr, peer_ptr(buffer_ptrs_dev, rank, elem), my_out, numel, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
    if failed == 0:
        for k in tl.static_range(1, WORLD):
            peer = (rank + k) % WORLD
            copy_blocks(peer_ptr(buffer_ptrs_dev, peer, elem),
                        out_ptr + tl.cast(peer, tl.int64) * out_rank_stride, numel, BLOCK)
        # Nobody may overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


def gather_words(ws: Workspace, words: torch.Tensor, out_words: torch.Tensor,
                 config: LaunchConfig | None = None) -> None:
    """Gather flat word tensors (same numel on every rank) into ``out_words`` (W * numel), in
    workspace-sized pieces. Also used by all_to_all to exchange its split sizes."""
    cfg = config or move_config(words, words.numel() * words.element_size())
    total = words.numel()
    for start, n in chunks(total, ws.capacity(words.dtype)):
        grid = cfg.grid(triton.cdiv(n, cfg.block))
        _all_gather_kernel[grid](
            ws.buffer_ptrs_dev, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
            words[start:], out_words[start:], n, total,
            ws.rank, PULL,
            WORLD=ws.world_size, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
    finish(ws)


def _prepare(x: torch.Tensor, group):
    """Validate; returns (out, words of x or None when out is already complete)."""
    check_tensor(x, "x")
    check_device(x, "x")
    world = group_size(group)
    shape = tuple(x.shape) if x.dim() > 0 else (1,)
    out = torch.empty((world * shape[0], *shape[1:]), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out, None
    if world == 1:
        return out.copy_(x.reshape(shape)), None
    words = as_words(x)
    if words is None:
        logger.debug("symmcoll.all_gather: no symmetric-memory kernel for %s (itemsize %d); "
                     "using the process group's all_gather", x.dtype, x.element_size())
        dist.all_gather(list(out.chunk(world)), x.reshape(shape), group=group)  # fills out in place
        return out, None
    return out, words


def pull(x: torch.Tensor, group=None, *, config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place all-gather of ``x`` along dim 0 over ``group``: shape [W * x.shape[0], ...]."""
    out, words = _prepare(x, group)
    if words is None:
        return out
    ws = get_workspace(group, x.device)
    check_tensor(x, "x", ws.device.type)
    gather_words(ws, words, as_words(out), config)
    return out


def copy_engine(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather like ``pull``, the data moved by ``copy_`` (copy engines on GPU)."""
    out, words = _prepare(x, group)
    if words is None:
        return out
    ws = get_workspace(group, x.device)
    check_tensor(x, "x", ws.device.type)
    src, dst = x.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8)
    total = src.numel()
    for start, n in chunks(total, ws.buffer_bytes):
        ws.buffer[:n].copy_(src[start:start + n])
        dst[ws.rank * total + start:][:n].copy_(src[start:start + n])
        barrier(ws, COPY_ENGINE)
        for k in range(1, ws.world_size):
            peer = (ws.rank + k) % ws.world_size
            dst[peer * total + start:][:n].copy_(ws.peer_buffer(peer)[:n])
        barrier(ws, COPY_ENGINE)  # nobody refills its buffer while a peer still copies from it
    finish(ws)
    return out


for _word, _world in ((1, 2), (2, 3), (4, 4), (8, 8)):
    _ty = {1: "u8", 2: "i16", 4: "i32", 8: "i64"}[_word]
    _cfg = GPU_MOVE_CONFIGS[_word]
    compile_check.register(
        _all_gather_kernel,
        {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": f"*{_ty}", "out_ptr": f"*{_ty}",
         "numel": "i32", "out_rank_stride": "i32", "rank": "i32", "op_code": "i32"},
        {"WORLD": _world, "BLOCK": _cfg.block}, num_warps=_cfg.num_warps, label=f"{_ty},")
# Arguments equal to 1 are specialised as constexprs on GPU: rank 1, one-element tensors.
compile_check.register(
    _all_gather_kernel,
    {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": "*i64", "out_ptr": "*i64", "op_code": "i32"},
    {"numel": 1, "out_rank_stride": 1, "rank": 1, "WORLD": 3, "BLOCK": GPU_MOVE_CONFIGS[8].block},
    num_warps=GPU_MOVE_CONFIGS[8].num_warps, label="i64,")
