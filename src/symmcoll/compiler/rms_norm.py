"""all_reduce -> residual add -> RMSNorm  =>  symmcoll.all_reduce_rms_norm (the tail of a TP block).

    s = wait(all_reduce(x, "sum"))          (possibly reshaped to its own shape)
    h = residual + s                        (either order; h may have any users: it is new_residual)
    normed = RMSNorm(h) * weight            as one of
        aten.rms_norm(h, [H], weight, eps)
        aten._fused_rms_norm(h, [H], weight, eps)[0]            (its rstd unused)
        the decomposition: hf = h or h.float(); r = rsqrt(mean(hf ** 2 (or hf * hf), -1, keepdim) + eps);
                           (hf * r) [-> cast] * weight [-> cast]       (products in either order)

=> ``normed, new_residual = symmcoll.all_reduce_rms_norm(x, residual, weight, eps)``: normed
replaces the pattern's last node, new_residual replaces ``h``. The op computes in fp32 and rounds
once, where the graph may round the normalised rows before the weight product (Meta's Llama does):
the results agree within one rounding of x's dtype. Not fused when an intermediate (s, the squares,
the mean, rsqrt, the normalised rows, their casts) has another user, e.g. rsqrt saved for the
backward, or when normed would not be in x's dtype.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from .. import plan
from .graph import RESHAPES, aten, cast_to, is_call, only_user, static_shape, tensor_val
from .passes import DYNAMIC, Context, Fusion, Pattern, argument, functional, register

symmcoll = torch.ops.symmcoll
MULS = (aten.mul.Tensor,)
ADDS = (aten.add.Tensor, aten.add.Scalar)


def _other(node: Node, known: Node):
    """The operand of a binary node that is not ``known`` (None if ``known`` is not one)."""
    a, b = node.args[:2]
    return b if a is known else a if b is known else None


def _last_dim(dims, ndim: int) -> bool:
    return list(dims) in ([ndim - 1], [-1])


def _decomposed(h: Node, ndim: int):
    """(last node, weight, eps, intermediates) of the decomposed norm of ``h``, or a reason."""
    hf = next((u for u in h.users if cast_to(u) == torch.float32), h)
    square = next((u for u in hf.users if (is_call(u, aten.pow.Tensor_Scalar) and u.args[1] == 2)
                   or (is_call(u, *MULS) and u.args[:2] == (hf, hf))), None)
    if square is None:
        return "no RMSNorm follows the residual add"
    mean = only_user(square)
    if not (is_call(mean, aten.mean.dim) and _last_dim(mean.args[1], ndim) and
            (mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False))):
        return "the squares are not averaged over the last dim (keepdim)"
    add_eps = only_user(mean)
    eps = _other(add_eps, mean) if is_call(add_eps, *ADDS) else None
    if not isinstance(eps, (int, float)) or add_eps.kwargs:
        return "the mean of squares is not followed by + eps (a number)"
    rsqrt = only_user(add_eps)
    normalised = only_user(rsqrt) if is_call(rsqrt, aten.rsqrt.default) else None
    if not (is_call(normalised, *MULS) and _other(normalised, rsqrt) is hf):
        return "the rows are not multiplied by rsqrt(mean of squares + eps)"
    intermediates = [square, mean, add_eps, rsqrt, normalised] + ([hf] if hf is not h else [])
    node = normalised
    if cast_to(only_user(node) or node) is not None:
        node = only_user(node)
        intermediates.append(node)
    scaled = only_user(node)
    weight = _other(scaled, node) if is_call(scaled, *MULS) else None
    if weight is None or not isinstance(weight, Node):
        return "the normalised rows are not multiplied by a weight"
    last = scaled
    if len(scaled.users) == 1 and cast_to(only_user(scaled)) is not None:
        intermediates.append(scaled)
        last = only_user(scaled)
    return last, weight, float(eps), intermediates


def _norm_of(h: Node, ndim: int):
    """(last node, weight, eps, intermediates) of the RMSNorm of ``h``, or a reason."""
    for user in h.users:
        if is_call(user, aten.rms_norm.default, aten._fused_rms_norm.default):
            shape, weight = argument(user, "normalized_shape"), argument(user, "weight")
            if len(shape) != 1 or weight is None:
                return f"{user.name} normalises over {len(shape)} dims or has no weight"
            eps = argument(user, "eps")
            eps = torch.finfo(torch.float32).eps if eps is None else float(eps)
            if user.target is aten.rms_norm.default:
                return user, weight, eps, []
            outputs = {u.args[1]: u for u in user.users if is_call(u, operator.getitem)}
            if set(outputs) != {0} or len(user.users) != 1:
                return f"{user.name}'s rstd is used (saved for the backward?)"
            return outputs[0], weight, eps, [user]
    return _decomposed(h, ndim)


def match_all_reduce_rms_norm(ar: Node, ctx: Context):
    if argument(ar, "reduce_op") != "sum":
        return f"reduce op {argument(ar, 'reduce_op')!r}: the fused op sums"
    x = ar.args[0]
    xv = tensor_val(x)
    if static_shape(xv) is None:
        return DYNAMIC
    if xv.dtype not in plan.REDUCTION_DTYPES or xv.dim() == 0:
        return f"a {xv.dtype} tensor of {xv.dim()} dims: the fused op takes [..., H] bf16, fp16, fp32"
    total = ctx.wait_of(ar)
    if total is None:
        return "the result is used before its wait_tensor"
    links = [total]
    while len(total.users) == 1 and is_call(only_user(total), *RESHAPES) and \
            tensor_val(only_user(total)).shape == xv.shape:
        total = only_user(total)
        links.append(total)
    h = only_user(total)
    residual = _other(h, total) if is_call(h, aten.add.Tensor) and not h.kwargs else None
    if residual is None:
        return (f"the sum has {len(total.users)} users" if len(total.users) != 1 else
                "the sum is not added to a residual")
    rv = tensor_val(residual)
    if rv is None or rv.shape != xv.shape or rv.dtype != xv.dtype or tensor_val(h).dtype != xv.dtype:
        return "the residual does not have the sum's shape and dtype"
    found = _norm_of(h, xv.dim())
    if isinstance(found, str):
        return found
    last, weight, eps, intermediates = found
    wv = tensor_val(weight)
    if wv is None or tuple(wv.shape) != tuple(xv.shape[-1:]) or not wv.dtype.is_floating_point:
        return f"the weight is not a float vector of {xv.shape[-1]} elements"
    if tensor_val(last).dtype != xv.dtype:
        return f"the normalised rows come out as {tensor_val(last).dtype}, the fused op gives {xv.dtype}"
    inside = {*intermediates, last}
    busy = [n.name for n in intermediates if n is not last and not set(n.users) <= inside]
    if busy:
        return f"{', '.join(busy)} {'has' if len(busy) == 1 else 'have'} other users (saved for the backward?)"
    if not ctx.editor.hoist(weight, h, dry_run=True):
        return "the weight is computed after the residual add from more than views"

    def apply():
        editor = ctx.editor
        editor.hoist(weight, h)
        args = [editor.contiguous(t, before=h) for t in (x, residual, weight)]
        op = editor.call(symmcoll.all_reduce_rms_norm.default, (*args, eps, ctx.group(ar), "auto", ""), before=h)
        last.replace_all_uses_with(editor.call(operator.getitem, (op, 0), before=h))
        h.replace_all_uses_with(editor.call(operator.getitem, (op, 1), before=h))
        editor.erase_dead([last, *intermediates, h, *links[1:]])
        ctx.retire(ar, op)  # its wait_tensor has no user left

    return Fusion(apply, f"{ar.name} + {h.name} + RMSNorm ({last.name})")


register(Pattern("all_reduce_rms_norm", (functional.all_reduce.default,), match_all_reduce_rms_norm, 40))
