"""What the benchmark measures: every implementation of an op behind one shape, and symmcoll's own.

An ``Implementation`` is bound once per (size, case) to a static input tensor; the binding owns every
buffer it needs, so a call touches no allocator outside of what the implementation itself does and a
CUDA graph can capture it. ``load`` puts fresh data where the call reads it (a copy into a symmetric
buffer for torch's ops, or into the static input), which is how checks run on new data without
re-binding or re-capturing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import symmcoll
from symmcoll import plan

from .metrics import REDUCTIONS
from .results import QUANTIZED

# QUANTIZED: the lossy all_reduce(x, quantize=...) -- never a candidate of the exact dispatch table, and
# run only when --algorithms names it (a pattern containing "quantized").
FAMILIES = ("symmcoll", "backend", "torch_symm_mem", "torch_copy_in", QUANTIZED)


@dataclass(frozen=True)
class Bound:
    """An implementation tied to its buffers.

    load: copy a new input (same shape as the static input) to where ``call`` reads it.
    call: run the collective once; returns the tensor that holds the result.
    """

    load: Callable[[torch.Tensor], None]
    call: Callable[[], torch.Tensor]


@dataclass(frozen=True)
class Implementation:
    """name: shown in tables ("symmcoll:one_shot", "nccl", "torch:two_shot").
    family: "symmcoll" | "backend" (the torch.distributed backend: NCCL, or gloo on CPU) |
    "torch_symm_mem" | "torch_copy_in" (the same ops with the caller's tensor copied in during the call) |
    QUANTIZED.
    in_place: the result overwrites the input, so repeated calls (a graph of K calls) do not
    recompute the same answer and only eager calls can be checked.
    bind: (static input, group) -> Bound.
    expected, count_wrong: for implementations that are not exact (None: the oracle's result and
    equality): (input, group) -> what to compare with (collective), and (result, that) -> #wrong.
    """

    name: str
    op: str
    family: str
    in_place: bool
    bind: Callable[[torch.Tensor, object], Bound]
    expected: Callable | None = None
    count_wrong: Callable | None = None

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")


def symmcoll_implementations(op: str) -> list[Implementation]:
    """Every kernel algorithm of ``op`` (empty if symmcoll has none), then "symmcoll:auto" (what users
    get) and "symmcoll:nccl" (the process group's collective as symmcoll calls it: out of place, one
    more copy than the backend row, which is what the dispatch table must weigh). All go through the
    public function, as a user's call does."""
    names = list(plan.algorithms(op))
    if not names:
        return []
    return [Implementation(f"symmcoll:{name}", op, "symmcoll", False, _symmcoll_binder(op, name))
            for name in [*names, "auto", plan.BACKEND]]


def _symmcoll_binder(op: str, algorithm: str) -> Callable[[torch.Tensor, object], Bound]:
    public = getattr(symmcoll, op)

    def bind(x: torch.Tensor, group) -> Bound:
        if op in REDUCTIONS:
            return Bound(load=x.copy_, call=lambda: public(x, group, op="sum", algorithm=algorithm))
        return Bound(load=x.copy_, call=lambda: public(x, group, algorithm=algorithm))
    return bind


def quantized_implementations(op: str) -> list[Implementation]:
    """``all_reduce(x, quantize=F, group_size=G)`` for every format and group size:
    "symmcoll:quantized_int8" (the default G), "symmcoll:quantized_int8_g32", ... A result counts as
    wrong where it leaves the documented error bound (bench/accuracy.py) of the exact sum."""
    if op != "all_reduce":
        return []
    from ..comm.quantized import DEFAULT_GROUP_SIZE, GROUP_SIZES, QUANTIZE_FORMATS
    found = []
    for quantize in QUANTIZE_FORMATS:
        for group_size in GROUP_SIZES:
            suffix = "" if group_size == DEFAULT_GROUP_SIZE else f"_g{group_size}"
            found.append(Implementation(f"symmcoll:quantized_{quantize}{suffix}", op, QUANTIZED, False,
                                        _quantized_binder(quantize, group_size),
                                        expected=_quantized_expected(quantize, group_size),
                                        count_wrong=_outside_bound))
    return found


def _quantized_binder(quantize: str, group_size: int) -> Callable[[torch.Tensor, object], Bound]:
    def bind(x: torch.Tensor, group) -> Bound:
        return Bound(load=x.copy_, call=lambda: symmcoll.all_reduce(x, group, quantize=quantize, group_size=group_size))
    return bind


def _quantized_expected(quantize: str, group_size: int) -> Callable:
    def expected(x: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
        from .. import reference
        from .accuracy import error_bound
        world = torch.distributed.get_world_size(group)
        parts = reference.all_gather(x.reshape(-1).float(), group).reshape(world, -1)
        return parts.double().sum(dim=0), error_bound(parts, quantize, group_size, "sum", x.dtype)
    return expected


def _outside_bound(got: torch.Tensor, want: tuple[torch.Tensor, torch.Tensor]) -> int:
    exact, bound = want
    if got.numel() != exact.numel():
        return max(got.numel(), exact.numel())
    within = (got.reshape(-1).double() - exact).abs() <= bound  # NaN is never within
    return int((~within).sum())
