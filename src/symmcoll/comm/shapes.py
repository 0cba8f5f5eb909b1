"""Shape rules of the collectives: what each op returns and what it refuses (ValueError naming the
argument). Registered with the resolver (plan.register_op). Every rank's call agrees on x's shape and
dtype (plan.agreed_fields: the rules return None for that); all_to_all's rule, whose row counts may
differ between ranks, is in splits.py."""

from __future__ import annotations

from ..plan import Request, register_op


def _same_shape(request: Request, world: int):
    return request.shape, None


def _reduce_scatter(request: Request, world: int):
    shape = request.shape
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension to be split along dim 0 (got a 0-dim tensor)")
    if shape[0] % world:
        raise ValueError(f"x.shape[0] must be divisible by the world size: x has shape {shape}, world "
                         f"size {world}, so the output shape ({shape[0]}/{world}, ...) is not whole")
    return (shape[0] // world, *shape[1:]), None


def _all_gather(request: Request, world: int):
    rows = request.shape if request.shape else (1,)
    return (world * rows[0], *rows[1:]), None


register_op("all_reduce", _same_shape, reduces=True, default="two_shot")
register_op("reduce_scatter", _reduce_scatter, reduces=True)
register_op("all_gather", _all_gather)
register_op("broadcast", _same_shape)
