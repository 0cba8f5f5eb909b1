"""symmcoll: collectives and fused compute+communication as Triton kernels over symmetric memory.

Public functions are shaped like torch.distributed's and return new tensors::

    out = symmcoll.all_reduce(x)                 # sum over the default group

``ALGORITHMS[op][name]`` lists every implementation of every collective by name (what
``algorithm=`` accepts and what ``symmcoll bench`` compares).
"""

from __future__ import annotations

import torch

from . import memory
from .comm import all_reduce as _all_reduce
from .memory import SymmcollTimeoutError, get_workspace

__version__ = "0.1.0"

__all__ = ["ALGORITHMS", "all_reduce", "check", "reset", "get_workspace", "SymmcollTimeoutError",
           "__version__"]

ALGORITHMS: dict[str, dict] = {
    "all_reduce": {"one_shot": _all_reduce.one_shot, "two_shot": _all_reduce.two_shot},
}


def _pick(op: str, algorithm: str, default: str):
    if algorithm == "auto":
        algorithm = default
    try:
        return ALGORITHMS[op][algorithm]
    except KeyError:
        raise ValueError(f"algorithm must be 'auto' or one of {sorted(ALGORITHMS[op])}, "
                         f"got {algorithm!r}") from None


def all_reduce(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Reduce ``x`` across ``group`` (default: the world group); returns a new tensor.

    op: "sum" | "avg" | "max" | "min"; bf16/fp16/fp32 inputs, fp32 accumulation.
    algorithm: "auto" or one of ``ALGORITHMS["all_reduce"]``.
    """
    return _pick("all_reduce", algorithm, "one_shot")(x, group, op=op)


def check(group=None) -> None:
    """Raise SymmcollTimeoutError if a kernel of this rank gave up waiting for a peer.

    On GPU kernels run asynchronously: synchronize first to see errors of calls still in flight."""
    for ws in memory.workspaces():
        if group is None or ws.group is group:
            ws.check()


def reset(group=None) -> None:
    """Drop the symmetric workspaces (after a timeout); every rank must call it together."""
    memory.reset(group)
