"""Shape rules of the collectives: what each op returns, what it refuses (ValueError naming the
argument), and the size key of its call descriptor. Registered with the resolver (plan.register_op)."""

from __future__ import annotations

import math
import operator

from ..plan import Request, register_op


def _same_shape(request: Request, world: int):
    return request.shape, request.nbytes


def _reduce_scatter(request: Request, world: int):
    shape = request.shape
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension to be split along dim 0 (got a 0-dim tensor)")
    if shape[0] % world:
        raise ValueError(f"x.shape[0] must be divisible by the world size: x has shape {shape}, world "
                         f"size {world}, so the output shape ({shape[0]}/{world}, ...) is not whole")
    return (shape[0] // world, *shape[1:]), request.nbytes


def _all_gather(request: Request, world: int):
    rows = request.shape if request.shape else (1,)
    return (world * rows[0], *rows[1:]), request.nbytes


def _all_to_all(request: Request, world: int):
    shape = request.shape
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension (rows are exchanged along dim 0), got a 0-dim tensor")
    row_bytes = math.prod(shape[1:]) * request.dtype.itemsize
    if request.splits is None:
        if shape[0] % world:
            raise ValueError(f"x.shape[0] must be divisible by the world size for equal splits: x has "
                             f"shape {shape}, world size {world} (or pass splits=)")
        return shape, request.nbytes
    _check_splits(request.splits, shape[0], world)
    return None, row_bytes | 1 << 40  # the output's rows come from the peers


def _check_splits(splits, rows: int, world: int) -> None:
    try:
        values = [operator.index(s) for s in splits]
    except TypeError:
        raise ValueError(f"splits must be a list of {world} ints (rows sent to each rank), got {splits!r}") from None
    if len(values) != world:
        raise ValueError(f"splits must have one entry per rank ({world}), got {len(values)}: {values}")
    if min(values) < 0:
        raise ValueError(f"splits must be >= 0, got {values}")
    if sum(values) != rows:
        raise ValueError(f"splits must sum to x.shape[0] = {rows}, got {values} (sum {sum(values)})")


register_op("all_reduce", _same_shape, reduces=True, default="two_shot")
register_op("reduce_scatter", _reduce_scatter, reduces=True)
register_op("all_gather", _all_gather)
register_op("all_to_all", _all_to_all)
register_op("broadcast", _same_shape)
