"""symmcoll: collectives and fused compute+communication as Triton kernels over symmetric memory.

Public functions are shaped like torch.distributed's and return new tensors::

    out = symmcoll.all_reduce(x)                 # sum over the default group

``ALGORITHMS[op][name]`` lists every implementation of every collective by name (what
``algorithm=`` accepts and what ``symmcoll bench`` compares).
"""

from __future__ import annotations

import torch

from . import dispatch, memory
from .comm import all_reduce as _all_reduce
from .comm import all_reduce_low_latency as _all_reduce_ll
from .comm import all_reduce_sentinel as _all_reduce_sentinel
from .comm import all_reduce_tree as _all_reduce_tree
from .comm import all_gather as _all_gather
from .comm import all_to_all as _all_to_all
from .comm import broadcast as _broadcast
from .comm import reduce_scatter as _reduce_scatter
from .memory import SymmcollTimeoutError, get_workspace

__version__ = "0.1.0"

__all__ = ["ALGORITHMS", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
           "check", "reset", "get_workspace", "SymmcollTimeoutError", "__version__"]

ALGORITHMS: dict[str, dict] = {
    "all_reduce": {"one_shot": _all_reduce.one_shot, "two_shot": _all_reduce.two_shot,
                   "low_latency": _all_reduce_ll.low_latency, "tree": _all_reduce_tree.tree,
                   "sentinel_one_shot": _all_reduce_sentinel.sentinel_one_shot,
                   "sentinel_two_shot": _all_reduce_sentinel.sentinel_two_shot,
                   "push_copy_engine": _all_reduce.push_copy_engine},
    "reduce_scatter": {"pull": _reduce_scatter.pull, "sentinel": _reduce_scatter.sentinel,
                       "push": _reduce_scatter.push},
    "all_gather": {"pull": _all_gather.pull, "copy_engine": _all_gather.copy_engine},
    "all_to_all": {"pull": _all_to_all.pull},
    "broadcast": {"pull": _broadcast.pull},
}


def _pick(op: str, algorithm: str, x: torch.Tensor, group):
    """The function that runs ``op``: ``algorithm`` by name, or the dispatcher's choice for "auto";
    "nccl" is the process group's own collective (gloo on CPU)."""
    algorithms = ALGORITHMS[op]
    if algorithm == "auto" and isinstance(x, torch.Tensor):
        algorithm = dispatch.choose(op, x, group, algorithms)
        if algorithm == dispatch.FALLBACK and op not in dispatch.FALLBACKS:
            algorithm = "pull"
    if algorithm == dispatch.FALLBACK and op in dispatch.FALLBACKS:
        return dispatch.FALLBACKS[op]
    try:
        return algorithms[algorithm]
    except KeyError:
        names = sorted(algorithms) + ([dispatch.FALLBACK] if op in dispatch.FALLBACKS else [])
        raise ValueError(f"algorithm must be 'auto' or one of {names}, got {algorithm!r}") from None


def all_reduce(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Reduce ``x`` across ``group`` (default: the world group); returns a new tensor.

    op: "sum" | "avg" | "max" | "min"; bf16/fp16/fp32 inputs, fp32 accumulation.
    algorithm: "auto" (the dispatcher's table: ``symmcoll info``), "nccl" (the process group's own
    collective) or one of ``ALGORITHMS["all_reduce"]``.
    """
    return _pick("all_reduce", algorithm, x, group)(x, group, op=op)


def reduce_scatter(x: torch.Tensor, group=None, *, op: str = "sum",
                   algorithm: str = "auto") -> torch.Tensor:
    """Reduce ``x`` across ``group`` and keep this rank's segment of dim 0, like
    ``reduce_scatter_tensor``: output shape [x.shape[0] // W, *x.shape[1:]] (x.shape[0] % W == 0).

    op: "sum" | "avg" | "max" | "min"; bf16/fp16/fp32 inputs, fp32 accumulation.
    algorithm: "auto" or one of ``ALGORITHMS["reduce_scatter"]``.
    """
    return _pick("reduce_scatter", algorithm, x, group)(x, group, op=op)


def all_gather(x: torch.Tensor, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, like ``all_gather_into_tensor``: output shape
    [W * x.shape[0], *x.shape[1:]] (a 0-dim ``x`` gives shape [W]). Any dtype.

    algorithm: "auto" or one of ``ALGORITHMS["all_gather"]``.
    """
    return _pick("all_gather", algorithm, x, group)(x, group)


def all_to_all(x: torch.Tensor, group=None, *, splits=None, algorithm: str = "auto") -> torch.Tensor:
    """Send rows of ``x`` to every rank and return the rows received, in source-rank order.

    splits: None (x.shape[0] divisible by W, chunk j to rank j, like ``all_to_all_single``) or W ints,
    the rows this rank sends to each rank (summing to x.shape[0]); the output's row count is the sum of
    what the peers send here. Any dtype.
    algorithm: "auto" or one of ``ALGORITHMS["all_to_all"]``.
    """
    return _pick("all_to_all", algorithm, x, group)(x, group, splits=splits)


def broadcast(x: torch.Tensor, src: int, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """A new tensor equal to group rank ``src``'s ``x`` on every rank (other ranks' ``x`` gives only
    the shape and dtype). Any dtype.

    algorithm: "auto" or one of ``ALGORITHMS["broadcast"]``.
    """
    return _pick("broadcast", algorithm, x, group)(x, src, group)


def check(group=None) -> None:
    """Raise SymmcollTimeoutError if a kernel of this rank gave up waiting for a peer.

    On GPU kernels run asynchronously: synchronize first to see errors of calls still in flight."""
    for ws in memory.workspaces():
        if group is None or ws.group is group:
            ws.check()


def reset(group=None) -> None:
    """Drop the symmetric workspaces (after a timeout); every rank must call it together."""
    memory.reset(group)
