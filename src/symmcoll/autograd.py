"""Gradients of the collectives, for training with symmcoll in the graph.

    all_gather      backward: reduce-scatter (sum) of the gradient
    reduce_scatter  backward: all-gather of the gradient (divided by W for op="avg")
    all_reduce      backward: all-reduce of the gradient (op="sum": sum, op="avg": avg); with
                    quantize= the same exact all-reduce (straight-through)
    broadcast       backward: the sum of every rank's gradient on ``src``, zero elsewhere

These are the gradients of the sum over ranks of each rank's own loss, as in
``torch.distributed.nn.functional``: rank r's input contributes to every rank's output, so its
gradient gathers every rank's output gradient. (Megatron's tensor-parallel "reduce" region instead
treats the loss as computed once and replicated, and passes the gradient through unchanged: there, call
the all-reduce under ``torch.no_grad()`` inside your own autograd.Function, or divide accordingly.)
max/min reductions have no gradient here (backward raises). The public functions use these only when
``x.requires_grad`` and grad mode is on; otherwise they call the ops directly.
"""

from __future__ import annotations

import torch

_OPS = torch.ops.symmcoll


def _grad(g: torch.Tensor) -> torch.Tensor:
    return g.contiguous()


class AllReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group_name: str, reduce_op: str, algorithm: str):
        ctx.group_name, ctx.reduce_op = group_name, reduce_op
        return _OPS.all_reduce(x, group_name, reduce_op, algorithm)

    @staticmethod
    def backward(ctx, g):
        if ctx.reduce_op not in ("sum", "avg"):
            raise NotImplementedError(f"symmcoll.all_reduce: no gradient for op={ctx.reduce_op!r} (sum and avg have one)")
        return _OPS.all_reduce(_grad(g), ctx.group_name, ctx.reduce_op, "auto"), None, None, None


class AllReduceQuantized(torch.autograd.Function):
    """Quantized forward; the backward is the exact all-reduce of the gradient (a straight-through
    estimator: the quantization error is not differentiated)."""

    @staticmethod
    def forward(ctx, x, group_name: str, reduce_op: str, quantize: str, group_size: int):
        ctx.group_name, ctx.reduce_op = group_name, reduce_op
        return _OPS.all_reduce_quantized(x, group_name, reduce_op, quantize, group_size)

    @staticmethod
    def backward(ctx, g):
        return _OPS.all_reduce(_grad(g), ctx.group_name, ctx.reduce_op, "auto"), None, None, None, None


class ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group_name: str, reduce_op: str, algorithm: str):
        ctx.group_name, ctx.reduce_op = group_name, reduce_op
        return _OPS.reduce_scatter(x, group_name, reduce_op, algorithm)

    @staticmethod
    def backward(ctx, g):
        if ctx.reduce_op not in ("sum", "avg"):
            raise NotImplementedError(f"symmcoll.reduce_scatter: no gradient for op={ctx.reduce_op!r}")
        grad = _OPS.all_gather(_grad(g), ctx.group_name, "auto")
        if ctx.reduce_op == "avg":
            grad = grad / torch.distributed.get_world_size(_group(ctx.group_name))
        return grad, None, None, None


class AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group_name: str, algorithm: str):
        ctx.group_name, ctx.shape = group_name, x.shape
        return _OPS.all_gather(x, group_name, algorithm)

    @staticmethod
    def backward(ctx, g):
        return _OPS.reduce_scatter(_grad(g), ctx.group_name, "sum", "auto").reshape(ctx.shape), None, None


class Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, src: int, group_name: str, algorithm: str):
        ctx.src, ctx.group_name = src, group_name
        return _OPS.broadcast(x, src, group_name, algorithm)

    @staticmethod
    def backward(ctx, g):
        total = _OPS.all_reduce(_grad(g), ctx.group_name, "sum", "auto")
        group = _group(ctx.group_name)
        if torch.distributed.get_rank(group) != ctx.src:
            total = torch.zeros_like(total)
        return total, None, None, None


def _group(name: str):
    from .ops import resolve_group
    return resolve_group(name)
