"""symmcoll's collectives as ``torch.ops.symmcoll.*`` custom ops, so torch.compile and CUDA graphs take them.

Every op is functional (returns a new tensor, like ``torch.distributed._functional_collectives``) except
``all_reduce_``, which writes its result into its input. Each has a fake implementation (shapes only),
so Dynamo never traces symmcoll's Python or Triton code: a model calling ``symmcoll.all_reduce`` compiles
with ``fullgraph=True``. Groups travel by name (``group.group_name``), as in torch's functional
collectives.

    torch.ops.symmcoll.all_reduce(x, group_name, reduce_op, algorithm) -> Tensor
    torch.ops.symmcoll.all_reduce_(x, group_name, reduce_op, algorithm) -> ()        (in place)
    torch.ops.symmcoll.all_reduce_quantized(x, group_name, reduce_op, quantize, group_size) -> Tensor
    torch.ops.symmcoll.reduce_scatter(x, group_name, reduce_op, algorithm) -> Tensor
    torch.ops.symmcoll.all_gather(x, group_name, algorithm) -> Tensor
    torch.ops.symmcoll.all_to_all(x, group_name, splits: int[]?, algorithm) -> Tensor
    torch.ops.symmcoll.all_to_all_splits(x, splits: Tensor, max_rows, group_name, algorithm) -> (Tensor, Tensor)
    torch.ops.symmcoll.broadcast(x, src, group_name, algorithm) -> Tensor
    torch.ops.symmcoll.all_gather_matmul(a_shard, bs, group_name, algorithm) -> (Tensor[], Tensor)
    torch.ops.symmcoll.moe_dispatch(tokens, topk_ids, num_experts, max_recv_rows, group_name, algorithm)
        -> (recv, expert_counts, row_origin, self_rows)
    torch.ops.symmcoll.moe_combine(expert_out, topk_weights, topk_ids, expert_counts, row_origin, self_rows,
        num_experts, group_name, algorithm) -> Tensor

The ops are defined with ``torch.library.Library`` (not ``custom_op``) and without an autograd kernel:
a ``custom_op`` call costs about 4x more host time, and a registered autograd kernel runs Python on
every call, grad or not. Gradients come from ``symmcoll.autograd`` (the public functions use it only
when ``x.requires_grad``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import plan

_LIB = torch.library.Library("symmcoll", "DEF")
_GROUPS: dict[str, object] = {}


def group_name(group) -> str:
    """The name an op takes for ``group`` (None: the default group)."""
    if group is None:
        if not dist.is_initialized():
            from .errors import not_initialized
            raise not_initialized()
        group = dist.group.WORLD
    return group.group_name


def resolve_group(name: str):
    group = _GROUPS.get(name)
    if group is None:
        from torch.distributed.distributed_c10d import _resolve_process_group
        group = _GROUPS[name] = _resolve_process_group(name)
    return group


def _forget_groups() -> None:
    _GROUPS.clear()


def _world(name: str) -> int:
    return dist.get_world_size(resolve_group(name))


# ---- implementations (real tensors) -------------------------------------------------------------------

def all_reduce_impl(x, group_name: str, reduce_op: str, algorithm: str):
    return plan.resolve("all_reduce", x, resolve_group(group_name), algorithm, reduce_op=reduce_op).execute(x)


def all_reduce_inplace_impl(x, group_name: str, reduce_op: str, algorithm: str) -> None:
    p = plan.resolve("all_reduce", x, resolve_group(group_name), algorithm, reduce_op=reduce_op)
    if p.kind == "kernel" and p.algorithm.family != "backend":
        p.execute(x, x)  # every all-reduce kernel reads a block of x before it writes that block of out
    else:
        x.copy_(p.execute(x))


QUANTIZE_FORMATS = ("int8", "fp8", "int4")


def all_reduce_quantized_impl(x, group_name: str, reduce_op: str, quantize: str, group_size: int):
    if quantize not in QUANTIZE_FORMATS:
        raise ValueError(f"quantize must be None or one of {QUANTIZE_FORMATS}, got {quantize!r}")
    return plan.resolve("all_reduce_quantized", x, resolve_group(group_name), f"quantized_{quantize}",
                        reduce_op=reduce_op, options=(("quantize", quantize), ("group_size", group_size))).execute(x)


def reduce_scatter_impl(x, group_name: str, reduce_op: str, algorithm: str):
    return plan.resolve("reduce_scatter", x, resolve_group(group_name), algorithm, reduce_op=reduce_op).execute(x)


def all_gather_impl(x, group_name: str, algorithm: str):
    return plan.resolve("all_gather", x, resolve_group(group_name), algorithm).execute(x)


def all_to_all_impl(x, group_name: str, splits, algorithm: str):
    return plan.resolve("all_to_all", x, resolve_group(group_name), algorithm,
                        splits=None if splits is None else tuple(splits)).execute(x)


def all_to_all_splits_impl(x, splits, max_rows: int, group_name: str, algorithm: str):
    """Device-side splits: (out [max_rows, ...], rows received from each rank [W] int64)."""
    return plan.resolve("all_to_all", x, resolve_group(group_name), algorithm, splits=plan.DEVICE_SPLITS,
                        others=(splits,), options=(("max_rows", max_rows),), other_names=("splits",)).execute(
                            x, others=(splits,))


def broadcast_impl(x, src: int, group_name: str, algorithm: str):
    return plan.resolve("broadcast", x, resolve_group(group_name), algorithm, src=src).execute(x)


def all_gather_matmul_impl(a_shard, bs, group_name: str, algorithm: str):
    from .fused import all_gather_matmul  # noqa: F401  (registers the op)
    bs = tuple(bs)
    names = ("b",) if len(bs) == 1 else tuple(f"b[{i}]" for i in range(len(bs)))
    outs, gathered = plan.resolve("all_gather_matmul", a_shard, resolve_group(group_name), algorithm, others=bs,
                                  x_name="a_shard", other_names=names).execute(a_shard, others=bs)
    return list(outs), gathered


def moe_dispatch_impl(tokens, topk_ids, num_experts: int, max_recv_rows: int, group_name: str, algorithm: str):
    return plan.resolve("moe_dispatch", tokens, resolve_group(group_name), algorithm, others=(topk_ids,),
                        options=(("num_experts", num_experts), ("max_rows", max_recv_rows)),
                        other_names=("topk_ids",), x_name="tokens").execute(tokens, others=(topk_ids,))


def moe_combine_impl(expert_out, topk_weights, topk_ids, expert_counts, row_origin, self_rows, num_experts: int,
                     group_name: str, algorithm: str):
    others = (topk_weights, topk_ids, expert_counts, row_origin, self_rows)
    return plan.resolve("moe_combine", expert_out, resolve_group(group_name), algorithm, others=others,
                        options=(("num_experts", num_experts),),
                        other_names=("topk_weights", "topk_ids", "handle.expert_counts", "handle.row_origin",
                                     "handle.self_rows"), x_name="expert_out").execute(expert_out, others=others)


# ---- fake implementations (shapes only) ---------------------------------------------------------------

def _all_reduce_fake(x, group_name, reduce_op, algorithm):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _all_reduce_inplace_fake(x, group_name, reduce_op, algorithm):
    return None


def _all_reduce_quantized_fake(x, group_name, reduce_op, quantize, group_size):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _reduce_scatter_fake(x, group_name, reduce_op, algorithm):
    world = _world(group_name)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to be split along dim 0 (got a 0-dim tensor)")
    torch._check(x.shape[0] % world == 0,
                 lambda: f"x.shape[0] must be divisible by the world size {world}: x has shape {tuple(x.shape)}")
    return x.new_empty((x.shape[0] // world, *x.shape[1:]))


def _all_gather_fake(x, group_name, algorithm):
    rows = x.shape if x.dim() else (1,)
    return x.new_empty((_world(group_name) * rows[0], *rows[1:]))


def _all_to_all_fake(x, group_name, splits, algorithm):
    if splits is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    rows = torch.library.get_ctx().new_dynamic_size()  # what the peers send: known only at run time
    return x.new_empty((rows, *x.shape[1:]))


def _all_to_all_splits_fake(x, splits, max_rows, group_name, algorithm):
    return x.new_empty((max_rows, *x.shape[1:])), splits.new_empty((_world(group_name),), dtype=torch.int64)


def _moe_dispatch_fake(tokens, topk_ids, num_experts, max_recv_rows, group_name, algorithm):
    local_experts = num_experts // _world(group_name)
    return (tokens.new_empty((max_recv_rows, tokens.shape[1])), topk_ids.new_empty((local_experts,), dtype=torch.int64),
            topk_ids.new_empty((max_recv_rows,), dtype=torch.int64),
            topk_ids.new_empty(topk_ids.shape, dtype=torch.int64))


def _moe_combine_fake(expert_out, topk_weights, topk_ids, expert_counts, row_origin, self_rows, num_experts,
                      group_name, algorithm):
    return expert_out.new_empty((topk_ids.shape[0], expert_out.shape[1]))


def _broadcast_fake(x, src, group_name, algorithm):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _all_gather_matmul_fake(a_shard, bs, group_name, algorithm):
    rows = _world(group_name) * a_shard.shape[0]
    return [a_shard.new_empty((rows, b.shape[1])) for b in bs], a_shard.new_empty((rows, a_shard.shape[1]))


_SCHEMAS = {
    "all_reduce": ("(Tensor x, str group_name, str reduce_op, str algorithm) -> Tensor", all_reduce_impl,
                   _all_reduce_fake),
    "all_reduce_": ("(Tensor(a!) x, str group_name, str reduce_op, str algorithm) -> ()", all_reduce_inplace_impl,
                    _all_reduce_inplace_fake),
    "all_reduce_quantized": ("(Tensor x, str group_name, str reduce_op, str quantize, int group_size) -> Tensor",
                             all_reduce_quantized_impl, _all_reduce_quantized_fake),
    "reduce_scatter": ("(Tensor x, str group_name, str reduce_op, str algorithm) -> Tensor", reduce_scatter_impl,
                       _reduce_scatter_fake),
    "all_gather": ("(Tensor x, str group_name, str algorithm) -> Tensor", all_gather_impl, _all_gather_fake),
    "all_to_all": ("(Tensor x, str group_name, int[]? splits, str algorithm) -> Tensor", all_to_all_impl,
                   _all_to_all_fake),
    "all_to_all_splits": ("(Tensor x, Tensor splits, int max_rows, str group_name, str algorithm) -> (Tensor, Tensor)",
                          all_to_all_splits_impl, _all_to_all_splits_fake),
    "moe_dispatch": ("(Tensor tokens, Tensor topk_ids, int num_experts, int max_recv_rows, str group_name, "
                     "str algorithm) -> (Tensor, Tensor, Tensor, Tensor)", moe_dispatch_impl, _moe_dispatch_fake),
    "moe_combine": ("(Tensor expert_out, Tensor topk_weights, Tensor topk_ids, Tensor expert_counts, "
                    "Tensor row_origin, Tensor self_rows, int num_experts, str group_name, str algorithm) -> Tensor",
                    moe_combine_impl,
                    _moe_combine_fake),
    "broadcast": ("(Tensor x, int src, str group_name, str algorithm) -> Tensor", broadcast_impl, _broadcast_fake),
    "all_gather_matmul": ("(Tensor a_shard, Tensor[] bs, str group_name, str algorithm) -> (Tensor[], Tensor)",
                          all_gather_matmul_impl, _all_gather_matmul_fake),
}

for _name, (_schema, _impl, _fake) in _SCHEMAS.items():
    _LIB.define(_name + _schema)
    _LIB.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"symmcoll::{_name}", _fake, lib=_LIB)


def is_plain(x) -> bool:
    """A real tensor outside any tracing: the public functions may call the implementation directly
    (skipping the dispatcher's few microseconds); anything else (FakeTensor, functional tensors,
    Dynamo) goes through the op."""
    return type(x) is torch.Tensor and not torch.compiler.is_compiling()


def define(name: str, schema: str, impl, fake) -> None:
    """Define ``torch.ops.symmcoll.<name>`` (schema without the name) with its implementation and fake
    implementation, as the loop above does for the collectives; fused ops call it from their modules."""
    _LIB.define(name + schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"symmcoll::{name}", fake, lib=_LIB)


def world_size(group_name: str) -> int:
    return _world(group_name)


__all__ = ["group_name", "resolve_group", "is_plain", "define", "world_size"]
