"""The single oracle: what every symmcoll op must return, computed with torch / torch.distributed.

Reductions run in fp32 (as symmcoll accumulates) and are rounded once to the input dtype.
"""

from __future__ import annotations

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
