"""Matmuls beside collectives -> symmcoll's fused GEMM ops.

    all_gather(x) -> [chunks cat along d] -> [reshape to rows] -> mm(., B_i) for each i
        => symmcoll.all_gather_matmul(x as rows, [B_1, ..., B_n]): one gather, one call, n products
    mm(A, B) -> [reshape] -> [chunks along d cat along 0] -> reduce_scatter(sum)
        => symmcoll.matmul_reduce_scatter(A, B)
    mm(A, B) -> [reshape] -> all_reduce(sum)
        => symmcoll.matmul_all_reduce(A, B)

Gathers and scatters along another dim than 0 (sequence parallelism of [batch, seq, hidden]
activations: DTensor writes them as chunks + cat) are row permutations of the dim-0 ones, and a
matmul acts on rows: the gather's products are permuted back (a copy of C; none when the dims before
d are all 1), the scatter's A is permuted first (a copy of A, where the graph copied the product).

B is row-major [K, N] or, as ``nn.Linear`` multiplies, ``W.T``: the transposed view of a row-major W
[N, K], which the fused ops read as it is (their K-loop loads W's tiles and transposes them in
registers). ``copy_weights="always"`` copies such a B row-major first (the layout older releases
needed); "never" leaves such a matmul unfused. Backward graphs multiply by ``W`` itself. Everything
between the matmul and the collective must have no other user; the gathered rows may (the op
returns them too).
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import Node

from .. import plan
from .graph import RESHAPES, aten, is_call, only_user, static_shape, tensor_val, transposed_contiguous
from .passes import DYNAMIC, Context, Fusion, Pattern, argument, functional, register

symmcoll = torch.ops.symmcoll
MM = aten.mm.default
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)
GATHER_DTYPES = (torch.bfloat16, torch.float16)  # all_gather_matmul's


def split_cat(cat: Node):
    """``cat([split(source, ...)[0], ..., [n-1]], cat_dim)`` with equal pieces, each used once:
    (source, split dim, cat dim, pieces); None for anything else."""
    if not is_call(cat, aten.cat.default) or not cat.args[0]:
        return None
    pieces = cat.args[0]
    split = pieces[0].args[0] if is_call(pieces[0], operator.getitem) else None
    if split is None or not is_call(split, *SPLITS) or len(split.users) != len(pieces):
        return None
    for i, piece in enumerate(pieces):
        if not is_call(piece, operator.getitem) or piece.args != (split, i) or len(piece.users) != 1:
            return None
    source = split.args[0]
    shape = static_shape(tensor_val(source))
    if shape is None:
        return None
    ndim = len(shape)
    split_dim = (split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)) % ndim
    sizes = split.args[1]
    if isinstance(sizes, int):
        sizes = [sizes] * len(pieces)
    if len(sizes) != len(pieces) or len(set(sizes)) != 1 or sum(sizes) != shape[split_dim]:
        return None
    cat_dim = (cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)) % ndim
    return source, split_dim, cat_dim, len(pieces)


def product_of(node: Node):
    """``node`` = reshape*(mm(A, B)), every link used once: (mm node, the links); None otherwise."""
    links = []
    while is_call(node, *RESHAPES):
        if len(node.users) != 1:
            return None
        links.append(node)
        node = node.args[0]
    return (node, links) if is_call(node, MM) and len(node.users) == 1 else None


def weight_reason(b: Node, k: int, dtype: torch.dtype) -> str | None:
    """Why ``b`` cannot be a fused op's B [K, N], even copied row-major (None: it can)."""
    v = tensor_val(b)
    if v is None or v.dim() != 2 or v.shape[0] != k:
        return f"B is not a [K={k}, N] matrix"
    if v.dtype != dtype:
        return f"B is {v.dtype}, A is {dtype}"
    if not (v.is_contiguous() or transposed_contiguous(v)):
        return f"B has strides {tuple(v.stride())}; the fused ops take B row-major"
    return None


def copy_reason(ctx: Context, bs) -> str | None:
    """Why a fusion with the transposed weights among ``bs`` is declined (None: it is not):
    copy_weights="never" only ("auto" reads them as they are, "always" copies them row-major)."""
    if ctx.options.copy_weights == "never" and any(not tensor_val(b).is_contiguous() for b in bs):
        return "B is a transposed weight (x @ W.T) and copy_weights='never'"
    return None


def weight_operand(ctx: Context, b: Node, before: Node) -> Node:
    """B as the fused op takes it: as it is (row-major, or a transposed weight read in place), or
    copied row-major where copy_weights="always"."""
    if ctx.options.copy_weights == "always":
        return ctx.editor.contiguous(b, before=before)
    return b


def _copy_note(ctx: Context, bs) -> str:
    """What a fusion's report says about its transposed Bs."""
    transposed = [b.name for b in bs if not tensor_val(b).is_contiguous()]
    if not transposed:
        return ""
    how = "copied row-major" if ctx.options.copy_weights == "always" else "read transposed (no copy)"
    return f"; {', '.join(transposed)} {how}"


# ---- all_gather -> matmul(s) ------------------------------------------------------------------------

def _gathered_layouts(wait: Node, shard_shape, world: int):
    """(node, d): ``wait`` itself (d = 0) and every cat of its chunks along another dim d."""
    layouts = [(wait, 0)]
    for split in wait.users:
        if not is_call(split, *SPLITS):
            continue
        for piece in split.users:
            cat = only_user(piece)
            found = split_cat(cat) if cat is not None else None
            if found and found[0] is wait and found[1] == 0 and found[3] == world and (cat, found[2]) not in layouts:
                layouts.append((cat, found[2]))
    return [(node, d) for node, d in layouts if d < len(shard_shape) - 1]


def _matmuls_of(layout: Node, k: int):
    """The mm nodes whose A is ``layout`` or a [rows, k] reshape of it."""
    found = []
    for user in layout.users:
        if is_call(user, MM) and user.args[0] is layout and tensor_val(layout).dim() == 2:
            found.append(user)
        elif is_call(user, *RESHAPES) and tensor_val(user).dim() == 2 and tensor_val(user).shape[1] == k:
            found += [mm for mm in user.users if is_call(mm, MM) and mm.args[0] is user]
    return found


def match_all_gather_matmul(ag: Node, ctx: Context):
    wait, x = ctx.wait_of(ag), ag.args[0]
    shard = tensor_val(x)
    shape = static_shape(shard)
    if wait is None:
        return "the gathered tensor is used before its wait_tensor"
    if shard.dtype not in GATHER_DTYPES:
        return f"dtype {shard.dtype}: all_gather_matmul takes bf16 and fp16"
    if shape is None:
        return DYNAMIC
    if len(shape) < 2:
        return "the shard is not an [..., K] tensor"
    world, k = argument(ag, "group_size"), shape[-1]
    rows = world * math.prod(shape[:-1])
    fused, declined = [], {}
    for layout, d in _gathered_layouts(wait, shape, world):
        for mm in _matmuls_of(layout, k):
            reason = weight_reason(mm.args[1], k, shard.dtype)
            if reason is None and not ctx.editor.hoist(mm.args[1], ag, dry_run=True):
                reason = "B is computed after the gather from more than views"
            if reason:
                declined.setdefault(reason, []).append(mm.name)
            else:
                fused.append((mm, d))
    reason = copy_reason(ctx, [mm.args[1] for mm, _ in fused])
    if reason:  # keep the matmuls whose B needs no copy
        declined.setdefault(reason, []).extend(mm.name for mm, _ in fused if not tensor_val(mm.args[1]).is_contiguous())
        fused = [(mm, d) for mm, d in fused if tensor_val(mm.args[1]).is_contiguous()]
    reasons = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in declined.items())
    if not fused:
        return reasons or "no matmul takes the gathered rows as its A"

    def apply():
        editor = ctx.editor
        bs = []
        for mm, _ in fused:
            editor.hoist(mm.args[1], ag)
            bs.append(weight_operand(ctx, mm.args[1], before=ag))
        a_shard = editor.reshape(editor.contiguous(x, before=ag), (rows // world, k), before=ag)
        op = editor.call(symmcoll.all_gather_matmul.default, (a_shard, bs, ctx.group(ag), "auto"), before=ag)
        outs = editor.call(operator.getitem, (op, 0), before=ag)
        gathered = editor.call(operator.getitem, (op, 1), before=ag)
        chain = []
        for i, (mm, d) in enumerate(fused):
            n = tensor_val(mm).shape[1]
            product = editor.call(operator.getitem, (outs, i), before=ag)
            mm.replace_all_uses_with(editor.move_axis(product, (world, *shape[:-1], n), 0, d, before=ag))
            chain += [mm, mm.args[0]]
        editor.erase_dead(chain)
        for layout, _ in _gathered_layouts(wait, shape, world)[1:]:
            editor.erase_dead([layout, *layout.args[0], layout.args[0][0].args[0]])
        unread = not wait.users and all(user is wait for user in ag.users)
        if wait.users:  # other users of the gathered rows read the op's copy of them
            wait.replace_all_uses_with(editor.reshape(gathered, tuple(tensor_val(wait).shape), before=ag))
        elif unread:  # nobody reads them: the op returns (and a group of one makes) none
            op.args = (*op.args, False)
        ctx.retire(ag, gathered)
        editor.erase_dead([gathered])
        return "; the gathered rows unread: none returned" if unread else None

    names = ", ".join(mm.name for mm, _ in fused)
    dims = sorted({d for _, d in fused if d})
    moved = f" (gathered along dim {dims[0]}: products permuted back)" if dims else ""
    copies = _copy_note(ctx, [mm.args[1] for mm, _ in fused])
    left = f"; not fused: {reasons}" if reasons else ""
    return Fusion(apply, f"{ag.name} + {names} ({len(fused)} B){moved}{copies}{left}")


# ---- matmul -> reduce_scatter / all_reduce -----------------------------------------------------------

def _operands(mm: Node, ctx: Context, rows_multiple: int):
    """Why ``mm`` cannot be a fused row-parallel product (None: it can)."""
    a, b = mm.args
    av = tensor_val(a)
    if av is None or av.dim() != 2:
        return "A is not a matrix"
    if av.dtype not in plan.REDUCTION_DTYPES:
        return f"dtype {av.dtype}: the fused ops take bf16, fp16 and fp32"
    shape = static_shape(av)
    if shape is None:
        return DYNAMIC
    if shape[0] % rows_multiple:
        return f"A's {shape[0]} rows are not a multiple of {rows_multiple}"
    return weight_reason(b, shape[1], av.dtype) or copy_reason(ctx, [b])


def match_matmul_reduce_scatter(rs: Node, ctx: Context):
    wait, y = ctx.wait_of(rs), rs.args[0]
    world = argument(rs, "group_size")
    if argument(rs, "reduce_op") != "sum":
        return f"reduce op {argument(rs, 'reduce_op')!r}: the fused op sums"
    if wait is None:
        return "the result is used before its wait_tensor"
    if static_shape(tensor_val(y)) is None:
        return DYNAMIC
    chunks = split_cat(y)
    rows_dim, links = None, []
    if chunks is not None:
        source, split_dim, cat_dim, pieces = chunks
        if cat_dim != 0 or pieces != world or split_dim == tensor_val(source).dim() - 1:
            return "the scattered chunks are not rows of the product"
        rows_dim, links = split_dim, [y, *y.args[0], y.args[0][0].args[0]]
        y = source
    found = product_of(y)
    if found is None:
        return "the reduce-scatter's input is not a matmul's product used only there"
    mm, reshapes = found
    if rows_dim is not None and tensor_val(y).shape[-1] != tensor_val(mm).shape[1]:
        return "the product is reshaped across its columns"
    reason = _operands(mm, ctx, world)
    if reason:
        return reason

    def apply():
        editor = ctx.editor
        a, b = mm.args
        a = editor.contiguous(a, before=mm)
        if rows_dim:  # rows in the order the chunks are scattered: rank-major
            lead = tuple(tensor_val(y).shape[:-1])
            view = (*lead[:rows_dim], world, lead[rows_dim] // world, *lead[rows_dim + 1:], tensor_val(a).shape[1])
            a = editor.move_axis(a, view, rows_dim, 0, before=mm)
        out = editor.call(symmcoll.matmul_reduce_scatter.default,
                          (a, weight_operand(ctx, b, before=mm), ctx.group(rs), "auto"), before=mm)
        ctx.retire(rs, editor.reshape(out, tuple(tensor_val(wait).shape), before=mm))
        editor.erase_dead([*links, *reshapes, mm])

    moved = f" (scattered along dim {rows_dim}: A's rows permuted)" if rows_dim else ""
    return Fusion(apply, f"{mm.name} + {rs.name}{moved}{_copy_note(ctx, [mm.args[1]])}")


def match_matmul_all_reduce(ar: Node, ctx: Context):
    if argument(ar, "reduce_op") != "sum":
        return f"reduce op {argument(ar, 'reduce_op')!r}: the fused op sums"
    wait = ctx.wait_of(ar)
    if wait is None:
        return "the result is used before its wait_tensor"
    found = product_of(ar.args[0])
    if found is None:
        return "the all-reduce's input is not a matmul's product used only there"
    mm, reshapes = found
    reason = _operands(mm, ctx, 1)
    if reason:
        return reason

    def apply():
        editor = ctx.editor
        a, b = editor.contiguous(mm.args[0], before=mm), weight_operand(ctx, mm.args[1], before=mm)
        out = editor.call(symmcoll.matmul_all_reduce.default, (a, b, ctx.group(ar), "auto"), before=mm)
        ctx.retire(ar, editor.reshape(out, tuple(tensor_val(wait).shape), before=mm))
        editor.erase_dead([*reshapes, mm])

    return Fusion(apply, f"{mm.name} + {ar.name}{_copy_note(ctx, [mm.args[1]])}")


register(Pattern("all_gather_matmul", (functional.all_gather_into_tensor.default,), match_all_gather_matmul, 10))
register(Pattern("matmul_reduce_scatter", (functional.reduce_scatter_tensor.default,), match_matmul_reduce_scatter, 20))
register(Pattern("matmul_all_reduce", (functional.all_reduce.default,), match_matmul_all_reduce, 30))
