"""Functional collectives -> symmcoll's ops, one for one: what ``symmcoll.backend`` does with a
collective no fused pattern took.

    _c10d_functional.all_reduce(x, op, g)                  -> symmcoll.all_reduce(x, g, op, "auto")
    _c10d_functional.all_reduce_(x, op, g)   (in place)    -> symmcoll.all_reduce_(x, g, op, "auto"); uses -> x
    _c10d_functional.all_gather_into_tensor(x, W, g)       -> symmcoll.all_gather(x, g, "auto")
    _c10d_functional.reduce_scatter_tensor(x, op, W, g)    -> symmcoll.reduce_scatter(x, g, op, "auto")
    _c10d_functional.all_to_all_single(x, out, in, g)      -> symmcoll.all_to_all(x, g, None, "auto")  (equal splits)
    _c10d_functional.broadcast(x, src, g)                  -> symmcoll.broadcast(x, src, g, "auto")

and the collective's ``wait_tensor`` goes: symmcoll's ops are ordered on the stream, their result is
ready for whatever comes next. Outputs keep the functional ops' layout (a new contiguous tensor);
an input that is not contiguous is copied first (symmcoll's ops take contiguous inputs). Served only
where symmcoll has kernels for the case (reductions of bf16/fp16/fp32 with sum/avg/max/min; data
movement of 1-, 2-, 4- and 8-byte elements); "auto" then picks the algorithm at run time, the
process group's own collective included.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from .. import plan
from ..language.blocks import REDUCE_OPS
from .graph import static_shape, tensor_val
from .passes import Context, argument, functional

symmcoll = torch.ops.symmcoll


def _reduction_reason(node: Node) -> str | None:
    reduce_op = argument(node, "reduce_op")
    if reduce_op not in REDUCE_OPS:
        return f"reduce op {reduce_op!r}: symmcoll reduces with {sorted(REDUCE_OPS)}"
    dtype = tensor_val(node.args[0]).dtype
    if dtype not in plan.REDUCTION_DTYPES:
        return f"dtype {dtype}: symmcoll's kernels reduce bf16, fp16 and fp32"
    return None


def _movement_reason(node: Node) -> str | None:
    itemsize = tensor_val(node.args[0]).dtype.itemsize
    if itemsize not in plan.WORD_DTYPES:
        return f"{itemsize}-byte elements: symmcoll's kernels move 1-, 2-, 4- and 8-byte elements"
    return None


def _plain(node: Node, name: str, world: int):
    """(why not or None, the symmcoll op, its arguments after x) for an out-of-place collective."""
    target, x = node.target, node.args[0]
    if target is functional.all_reduce.default:
        return _reduction_reason(node), symmcoll.all_reduce.default, (name, argument(node, "reduce_op"), "auto")
    if target is functional.all_gather_into_tensor.default:
        return _movement_reason(node), symmcoll.all_gather.default, (name, "auto")
    if target is functional.reduce_scatter_tensor.default:
        return _reduction_reason(node), symmcoll.reduce_scatter.default, (name, argument(node, "reduce_op"), "auto")
    if target is functional.all_to_all_single.default:
        shape = static_shape(tensor_val(x))
        even = [shape[0] // world] * world if shape and shape[0] % world == 0 else None
        sends, receives = argument(node, "input_split_sizes"), argument(node, "output_split_sizes")
        reason = _movement_reason(node)
        if reason is None and shape is None:
            reason = "dynamic shapes: the splits are not known to be even"
        elif reason is None and (even is None or list(sends) != even or list(receives) != even):
            reason = ("uneven splits: symmcoll's all_to_all with listed splits learns its output size at run "
                      "time, the graph has it fixed")
        return reason, symmcoll.all_to_all.default, (name, None, "auto")
    if target is functional.broadcast.default:
        return _movement_reason(node), symmcoll.broadcast.default, (argument(node, "src"), name, "auto")
    return "no symmcoll op for this collective (coalesced, out= and in-place broadcast_ are left)", None, ()


def rewrite_plain(node: Node, ctx: Context) -> tuple[str | None, str]:
    """Replace ``node`` by its symmcoll op: ``("symmcoll.<op>", "")``, or ``(None, why not)``."""
    name = ctx.group(node)
    editor, x = ctx.editor, node.args[0]
    if node.target is functional.all_reduce_.default:
        reason = _reduction_reason(node) or (None if tensor_val(x).is_contiguous() else
                                             "the in-place all_reduce_ of a non-contiguous tensor")
        if reason:
            return None, reason
        editor.call(symmcoll.all_reduce_.default, (x, name, argument(node, "reduce_op"), "auto"), before=node)
        ctx.retire(node, x)
        return "symmcoll.all_reduce_", ""
    reason, op, rest = _plain(node, name, ctx.world(name))
    if reason:
        return None, reason
    result = editor.call(op, (editor.contiguous(x, before=node), *rest), before=node)
    ctx.retire(node, result)
    return f"symmcoll.{str(op.overloadpacket).split('.')[-1]}", ""
