"""Broadcast over symmetric memory: every rank gets a new tensor equal to rank ``src``'s input.

pull
    The source copies its input into its own symmetric buffer (and into its own output in the same
    pass); a barrier publishes it; every other rank reads the source's buffer into its output. An exit
    barrier keeps the source's next call from overwriting its buffer while a peer is still reading::

        rank src:  x --copy--> buf_src, x --> out        (local)
                   barrier                               (program pid with program pid of every peer)
        rank r:    buf_src --read--> out                 (NVLink read, every r != src)
                   barrier                               (exit)

    Traffic: the source's buffer is read W-1 times, once by each peer, all at once; the source's
    NVLink ports carry (W-1) * S bytes. Wins at small and medium sizes (two barriers, one launch, no
    tree or ring steps); at large sizes a pipelined ring (NCCL) spreads the load over every link.

    Work split: program ``pid`` owns blocks pid, pid + P, ... of the tensor, on the source when it
    copies in and on the readers, so program ``pid`` only waits on program ``pid`` of its peers.

Only ``x``'s shape and dtype matter on ranks other than ``src`` (every rank passes a tensor of the
same shape and dtype, as with ``torch.distributed.broadcast``). The kernel moves words: any dtype of
itemsize 1, 2, 4 or 8; other itemsizes fall back to the process group's broadcast. Tensors larger than
the workspace go in workspace-sized pieces, one launch per piece.
"""

from __future__ import annotations

import operator

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .. import compile_check
from ..language import block_barrier, peer_ptr
from ..memory import get_workspace, register_op
from ._common import (GPU_MOVE_CONFIGS, LaunchConfig, as_words, check_device, check_tensor, chunks,
                      copy_blocks, finish, group_size, logger, move_config, tee_blocks)

PULL = register_op("broadcast.pull")


@triton.jit
def _broadcast_kernel(
    # symmetric workspace: per-rank address tables, error record, wait budget
    buffer_ptrs_dev, signal_pad_ptrs_dev, status_ptr, max_spins,
    # this launch's piece (numel words; x is read on the source only)
    x_ptr, out_ptr, numel,
    # topology
    src, rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    BLOCK: tl.constexpr,
):
    elem = x_ptr.dtype.element_ty
    if rank == src:
        tee_blocks(x_ptr, peer_ptr(buffer_ptrs_dev, rank, elem), out_ptr, numel, BLOCK)

    failed = block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)
    if failed == 0:
        if rank != src:
            copy_blocks(peer_ptr(buffer_ptrs_dev, src, elem), out_ptr, numel, BLOCK)
        # The source may not overwrite its buffer (next call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


def pull(x: torch.Tensor, src: int, group=None, *, config: LaunchConfig | None = None) -> torch.Tensor:
    """Return a new tensor equal to group rank ``src``'s ``x`` on every rank of ``group``."""
    check_tensor(x, "x")
    check_device(x, "x")
    world = group_size(group)
    try:
        src = operator.index(src)
    except TypeError:
        raise ValueError(f"src must be an int (a rank of the group), got {type(src).__name__}") from None
    if not 0 <= src < world:
        raise ValueError(f"src must be a group rank in [0, {world}), got {src}")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel() == 0:
        return out
    if world == 1:
        return out.copy_(x)

    words = as_words(x)
    if words is None:
        logger.debug("symmcoll.broadcast: no symmetric-memory kernel for %s (itemsize %d); "
                     "using the process group's broadcast", x.dtype, x.element_size())
        if dist.get_rank(group) == src:
            out.copy_(x)
        dist.broadcast(out, src=dist.get_global_rank(group or dist.group.WORLD, src), group=group)
        return out

    ws = get_workspace(group, x.device)
    check_tensor(x, "x", ws.device.type)
    cfg = config or move_config(words, words.numel() * words.element_size())
    out_words = as_words(out)
    for start, n in chunks(words.numel(), ws.capacity(words.dtype)):
        grid = cfg.grid(triton.cdiv(n, cfg.block))
        _broadcast_kernel[grid](
            ws.buffer_ptrs_dev, ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins,
            words[start:], out_words[start:], n,
            src, ws.rank, PULL,
            WORLD=ws.world_size, BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
    finish(ws)
    return out


for _word, _world in ((1, 2), (2, 3), (4, 4), (8, 8)):
    _ty = {1: "u8", 2: "i16", 4: "i32", 8: "i64"}[_word]
    _cfg = GPU_MOVE_CONFIGS[_word]
    compile_check.register(
        _broadcast_kernel,
        {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": f"*{_ty}", "out_ptr": f"*{_ty}", "numel": "i32",
         "src": "i32", "rank": "i32", "op_code": "i32"},
        {"WORLD": _world, "BLOCK": _cfg.block}, num_warps=_cfg.num_warps, label=f"{_ty},")
compile_check.register(
    _broadcast_kernel,
    {**compile_check.WORKSPACE_SIGNATURE, "x_ptr": "*bf16", "out_ptr": "*bf16", "op_code": "i32"},
    {"numel": 1, "src": 1, "rank": 1, "WORLD": 2, "BLOCK": GPU_MOVE_CONFIGS[2].block},
    num_warps=GPU_MOVE_CONFIGS[2].num_warps, label="bf16,")
