"""Shape rules of the collectives: what each op returns, what it refuses (ValueError naming the
argument), and the size key of its call descriptor. Registered with the resolver (plan.register_op).
all_to_all's rule, which knows its splits, is in splits.py."""

from __future__ import annotations

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


register_op("all_reduce", _same_shape, reduces=True, default="two_shot")
register_op("reduce_scatter", _reduce_scatter, reduces=True)
register_op("all_gather", _all_gather)
register_op("broadcast", _same_shape)
