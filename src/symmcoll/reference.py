"""The single oracle: what every symmcoll op must return, computed with torch / torch.distributed.

Reductions run in fp32 (as symmcoll accumulates) and are rounded once to the input dtype. Data movement
(all-gather, all-to-all, broadcast) moves the tensors' bytes, so every dtype is compared bit-exactly.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
             "min": dist.ReduceOp.MIN}


def all_reduce(x: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    acc = x.float().clone()
    dist.all_reduce(acc, op=_DIST_OPS[op], group=group)
    if op == "avg":
        acc /= dist.get_world_size(group)
    return acc.to(x.dtype)



def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a contiguous tensor: gloo does not move bf16/fp8/bool, bytes are bytes."""
    return t.reshape(-1).view(torch.uint8)


def reduce_scatter(x: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    """Segment ``rank`` (of W along dim 0) of the fp32 all-reduce of ``x``, rounded once."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    acc = x.float().clone()
    dist.all_reduce(acc, op=_DIST_OPS[op], group=group)
    if op == "avg":
        acc /= world
    rows = x.shape[0] // world
    return acc[rank * rows:(rank + 1) * rows].to(x.dtype)


def all_gather(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0 (a 0-dim ``x`` counts as one element)."""
    world = dist.get_world_size(group)
    shape = tuple(x.shape) or (1,)
    out = torch.empty((world * shape[0], *shape[1:]), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    mine = _as_bytes(x.contiguous())
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return torch.cat(parts).view(x.dtype).reshape(out.shape)


def all_to_all(x: torch.Tensor, group=None, splits=None) -> torch.Tensor:
    """Rows ``splits[j]`` of ``x`` (equal chunks if None) go to rank j; the rows received come back
    concatenated in source-rank order."""
    world = dist.get_world_size(group)
    send = list(splits) if splits is not None else [x.shape[0] // world] * world
    send_t = torch.tensor(send, dtype=torch.int64, device=x.device)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t, group=group)
    recv = recv_t.tolist()
    out = torch.empty((sum(recv), *x.shape[1:]), dtype=x.dtype, device=x.device)
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    if row_bytes:
        dist.all_to_all_single(_as_bytes(out), _as_bytes(x.contiguous()),
                               output_split_sizes=[r * row_bytes for r in recv],
                               input_split_sizes=[s * row_bytes for s in send], group=group)
    return out


def broadcast(x: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """A new tensor equal to group rank ``src``'s ``x``, on every rank."""
    out = x.clone(memory_format=torch.contiguous_format)
    if out.numel():
        root = dist.get_global_rank(group or dist.group.WORLD, src)
        dist.broadcast(_as_bytes(out), src=root, group=group)
    return out
