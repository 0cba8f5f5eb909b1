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

FAMILIES = ("symmcoll", "backend", "torch_symm_mem")


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
    "torch_symm_mem".
    in_place: the result overwrites the input, so repeated calls (a graph of K calls) do not
    recompute the same answer and only eager calls can be checked.
    bind: (static input, group) -> Bound.
    """

    name: str
    op: str
    family: str
    in_place: bool
    bind: Callable[[torch.Tensor, object], Bound]

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
