"""The mechanics of symmcoll's ops: one ``OpSpec`` per op, declared in the module that implements it,
becomes a ``torch.ops.symmcoll.<name>`` custom op (so torch.compile and CUDA graphs take it) and a
resolver op (``plan.register_op``) with its algorithms. Nothing here is specific to any op.

    SPEC = ops.declare(ops.OpSpec(
        "matmul_reduce_scatter", "(Tensor a, Tensor b, str group_name, str algorithm) -> Tensor",
        impl=matmul_reduce_scatter_impl, fake=_fake, inputs=("a", "b"), shape_rule=_shape_rule,
        default="fused", algorithms=(Algorithm(...), ...)))

    out = SPEC.call(a, b, group_name, algorithm)   # what symmcoll.matmul_reduce_scatter forwards to

Every op is functional (returns new tensors, like ``torch.distributed._functional_collectives``)
except ``all_reduce_``, which writes its result into its input. Each has a fake implementation
(shapes only), so Dynamo never traces symmcoll's Python or Triton code: a model calling
``symmcoll.all_reduce`` compiles with ``fullgraph=True``. Groups travel by name
(``group.group_name``), as in torch's functional collectives. Where each op is declared:

    comm/collectives.py   all_reduce, all_reduce_ (in place), reduce_scatter, all_gather, broadcast
    comm/splits.py        all_to_all, all_to_all_splits (device-side splits)
    comm/quantized.py     all_reduce_quantized
    fused/<op>.py         all_gather_matmul, matmul_reduce_scatter, matmul_all_reduce, all_reduce_rms_norm
    fused/moe.py          moe_dispatch, moe_combine

The ops are defined with ``torch.library.Library`` (not ``custom_op``) and without an autograd kernel:
a ``custom_op`` call costs about 4x more host time, and a registered autograd kernel runs Python on
every call, grad or not. Gradients come from ``symmcoll.autograd`` (the public functions use it only
when ``x.requires_grad``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from . import plan

_LIB = torch.library.Library("symmcoll", "DEF")
_GROUPS: dict[str, object] = {}
_SPECS: dict[str, "OpSpec"] = {}


@dataclass(frozen=True)
class OpSpec:
    """Everything about one op, in one place (docs/internals.md, "A fused op").

    name: ``torch.ops.symmcoll.<name>``; also the resolver's op unless ``shape_rule`` is None (a torch
    op over another op's plans: ``all_reduce_`` runs all_reduce's).
    schema: the torch schema without the name, e.g. "(Tensor x, str group_name, str algorithm) -> Tensor".
    impl(*schema args) -> outputs: the real-tensor implementation (usually ``plan.resolve(...).execute``).
    fake(*schema args) -> outputs: shapes only (torch.compile, FakeTensor).
    inputs: the public names of the op's tensor inputs (the main input first): errors and mismatch
    reports name them.
    shape_rule(request, world) -> (output shape or None, what the ranks agree on): validates (ValueError
    naming the argument) -- see ``plan.register_op`` for it and for reduces, default, dispatch_size,
    runs_when_empty, transposed.
    algorithms: the op's algorithms (others may add theirs with ``plan.register``: the comm families,
    the hierarchical algorithms).
    """

    name: str
    schema: str
    impl: Callable
    fake: Callable
    inputs: tuple[str, ...] = ("x",)
    shape_rule: Callable | None = None
    reduces: bool = False
    default: str | Callable | None = None
    dispatch_size: Callable | None = None
    runs_when_empty: Callable | None = None
    transposed: tuple[str, ...] = ()
    algorithms: tuple = ()
    # Positions of the schema's Tensor / Tensor? arguments (what ``call`` checks), from the schema.
    tensor_args: tuple[int, ...] = field(init=False, default=())
    # call(*schema args) -> outputs: run the op (what every public function forwards to; ``_forwarder``).
    call: Callable = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self):
        args = self.schema[1:self.schema.index(") ->")]
        types = [arg.split()[0] for arg in re.split(r",\s*", args)]
        object.__setattr__(self, "tensor_args", tuple(i for i, t in enumerate(types) if t in ("Tensor", "Tensor?",
                                                                                                 "Tensor(a!)")))
        object.__setattr__(self, "call", _forwarder(self.name, self.impl, self.tensor_args))

    def __call__(self, *args):
        """``self.call(*args)`` (the public functions call ``call`` itself: one Python frame less)."""
        return self.call(*args)


def _forwarder(name: str, impl: Callable, tensor_args: tuple[int, ...]) -> Callable:
    """An op's ``call``: its implementation directly where every tensor argument is a plain tensor outside
    tracing (skipping the dispatcher's few microseconds), else ``torch.ops.symmcoll.<name>`` (FakeTensor,
    functional tensors, Dynamo). A closure per op, its common case (one tensor argument, first) without a
    loop: this is on every eager call's path (host time per call, benchmarks/host_overhead.py)."""
    tensor, compiling = torch.Tensor, torch.compiler.is_compiling

    def dispatched(*args):
        return getattr(torch.ops.symmcoll, name)(*args)

    if tensor_args == (0,):
        def call(*args):
            if type(args[0]) is tensor and not compiling():
                return impl(*args)
            return dispatched(*args)
        return call

    def call(*args):
        if not compiling():
            for i in tensor_args:
                t = args[i]
                if type(t) is not tensor and t is not None:
                    break
            else:
                return impl(*args)
        return dispatched(*args)
    return call


def declare(spec: OpSpec) -> OpSpec:
    """Register ``spec``: the resolver's op and hooks (plan.register_op, unless ``shape_rule`` is None),
    its algorithms (plan.register), and ``torch.ops.symmcoll.<name>`` with its implementation and fake."""
    if spec.name in _SPECS:
        raise ValueError(f"op {spec.name!r} is declared twice")
    if spec.shape_rule is not None:
        plan.register_op(spec.name, spec.shape_rule, reduces=spec.reduces, default=spec.default,
                         dispatch_size=spec.dispatch_size, runs_when_empty=spec.runs_when_empty, inputs=spec.inputs,
                         transposed=spec.transposed)
    for algorithm in spec.algorithms:
        plan.register(algorithm)
    _LIB.define(spec.name + spec.schema)
    _LIB.impl(spec.name, spec.impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"symmcoll::{spec.name}", spec.fake, lib=_LIB)
    _SPECS[spec.name] = spec
    return spec


def specs() -> dict[str, OpSpec]:
    """Every declared op by name, in declaration order."""
    return dict(_SPECS)


def group_name(group) -> str:
    """The name an op takes for ``group`` (None: the default group)."""
    if group is None:
        group = dist.group.WORLD  # None before init_process_group (one lookup: every call passes here)
        if group is None:
            from .errors import not_initialized
            raise not_initialized()
    return group.group_name


def resolve_group(name: str):
    """The process group named ``name`` (cached: ``forget_groups`` drops the cache)."""
    group = _GROUPS.get(name)
    if group is None:
        from torch.distributed.distributed_c10d import _resolve_process_group
        group = _GROUPS[name] = _resolve_process_group(name)
    return group


def forget_groups() -> None:
    """Drop the name -> group cache (``symmcoll.reset``: groups may be destroyed and made again)."""
    _GROUPS.clear()


def world_size(group_name: str) -> int:
    """The size of the group named ``group_name`` (fake implementations need it for shapes)."""
    return dist.get_world_size(resolve_group(group_name))


__all__ = ["OpSpec", "declare", "specs", "group_name", "resolve_group", "forget_groups", "world_size"]
