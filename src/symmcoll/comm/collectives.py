"""The collectives' op declarations (ops.OpSpec): schema, implementation, fake, shape rule, "auto"
default and dispatch size of all_reduce (and its in-place form), reduce_scatter, all_gather and
broadcast. Their algorithms register in their protocol families' modules (pull.py, sentinel.py, ...);
all_to_all is declared in splits.py, all_reduce_quantized in quantized.py.

Shape rules say what each op returns and what it refuses (ValueError naming the argument). Every rank's
call agrees on x's shape and dtype (plan.agreed_fields: the rules return None for that) and, for
broadcast, on ``src`` (the descriptor carries it).
"""

from __future__ import annotations

import operator

import torch

from .. import plan
from ..ops import OpSpec, declare, resolve_group, world_size
from ..plan import Request


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


def _broadcast(request: Request, world: int):
    try:
        src = operator.index(request.src)
    except TypeError:
        raise ValueError(f"src must be an int (a rank of the group), got {type(request.src).__name__}") from None
    if not 0 <= src < world:
        raise ValueError(f"src must be a group rank in [0, {world}), got {src}")
    return request.shape, None


def _output_bytes(request: Request, world: int) -> int:
    """reduce_scatter's tables are keyed as `symmcoll bench` reports its sizes: output bytes per rank."""
    return request.nbytes // world


# ---- implementations (real tensors) and fakes (shapes only) ------------------------------------------

def all_reduce_impl(x, group_name: str, reduce_op: str, algorithm: str):
    return plan.resolve("all_reduce", x, resolve_group(group_name), algorithm, reduce_op=reduce_op).execute(x)


def all_reduce_inplace_impl(x, group_name: str, reduce_op: str, algorithm: str) -> None:
    p = plan.resolve("all_reduce", x, resolve_group(group_name), algorithm, reduce_op=reduce_op)
    if p.kind == "kernel" and p.algorithm.family != "backend":
        p.execute(x, x)  # every all-reduce kernel reads a block of x before it writes that block of out
    else:
        x.copy_(p.execute(x))


def reduce_scatter_impl(x, group_name: str, reduce_op: str, algorithm: str):
    return plan.resolve("reduce_scatter", x, resolve_group(group_name), algorithm, reduce_op=reduce_op).execute(x)


def all_gather_impl(x, group_name: str, algorithm: str):
    return plan.resolve("all_gather", x, resolve_group(group_name), algorithm).execute(x)


def broadcast_impl(x, src: int, group_name: str, algorithm: str):
    return plan.resolve("broadcast", x, resolve_group(group_name), algorithm, src=src).execute(x)


def _like_x(x, *args):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _reduce_scatter_fake(x, group_name, reduce_op, algorithm):
    world = world_size(group_name)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to be split along dim 0 (got a 0-dim tensor)")
    torch._check(x.shape[0] % world == 0,
                 lambda: f"x.shape[0] must be divisible by the world size {world}: x has shape {tuple(x.shape)}")
    return x.new_empty((x.shape[0] // world, *x.shape[1:]))


def _all_gather_fake(x, group_name, algorithm):
    rows = x.shape if x.dim() else (1,)
    return x.new_empty((world_size(group_name) * rows[0], *rows[1:]))


ALL_REDUCE = declare(OpSpec(
    "all_reduce", "(Tensor x, str group_name, str reduce_op, str algorithm) -> Tensor", all_reduce_impl, _like_x,
    shape_rule=_same_shape, reduces=True, default="two_shot"))
ALL_REDUCE_INPLACE = declare(OpSpec(  # runs all_reduce's plans
    "all_reduce_", "(Tensor(a!) x, str group_name, str reduce_op, str algorithm) -> ()", all_reduce_inplace_impl,
    lambda *args: None))
REDUCE_SCATTER = declare(OpSpec(
    "reduce_scatter", "(Tensor x, str group_name, str reduce_op, str algorithm) -> Tensor", reduce_scatter_impl,
    _reduce_scatter_fake, shape_rule=_reduce_scatter, reduces=True, dispatch_size=_output_bytes))
ALL_GATHER = declare(OpSpec(
    "all_gather", "(Tensor x, str group_name, str algorithm) -> Tensor", all_gather_impl, _all_gather_fake,
    shape_rule=_all_gather))
BROADCAST = declare(OpSpec(
    "broadcast", "(Tensor x, int src, str group_name, str algorithm) -> Tensor", broadcast_impl, _like_x,
    shape_rule=_broadcast))
