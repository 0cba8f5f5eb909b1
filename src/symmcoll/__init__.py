"""symmcoll: collectives and fused compute+communication as Triton kernels over symmetric memory.

Public functions are shaped like torch.distributed's and return new tensors::

    out = symmcoll.all_reduce(x)                 # sum over the default group

``ALGORITHMS[op]`` names every kernel implementation of every collective (what ``algorithm=`` accepts
besides "auto" and "nccl", and what ``symmcoll bench`` compares).
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch

from . import comm as _comm  # noqa: F401  (registers every algorithm and region)
from .fused import moe as _moe  # noqa: F401  (registers moe_dispatch / moe_combine)
from . import memory, plan
from . import ops as _ops
from . import autograd as _autograd
from .errors import SymmcollArgumentError, SymmcollError, SymmcollMismatchError, SymmcollTimeoutError
from .memory import get_workspace

__version__ = "0.2.0"

__all__ = ["ALGORITHMS", "all_reduce", "all_reduce_", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
           "check", "reset", "get_workspace", "moe_dispatch", "moe_combine", "MoEHandle", "SymmcollError",
           "SymmcollTimeoutError", "SymmcollMismatchError", "SymmcollArgumentError", "__version__"]


class _Algorithms(dict):
    """op -> {name: summary} of the registered kernel algorithms (live view of symmcoll.plan)."""

    def __getitem__(self, op):
        return {name: a.summary for name, a in plan.algorithms(op).items()}

    def get(self, op, default=None):
        return self[op] if op in plan.OPS or plan.algorithms(op) else default

    def __iter__(self):
        return iter(plan.OPS)

    def __contains__(self, op):
        return bool(plan.algorithms(op))

    def keys(self):
        return list(plan.OPS)

    def items(self):
        return [(op, self[op]) for op in plan.OPS]

    def __len__(self):
        return len(plan.OPS)

    def __repr__(self):
        return repr(dict(self.items()))


ALGORITHMS = _Algorithms()


def _tensor(x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    return x


def _wants_grad(x: torch.Tensor) -> bool:
    return x.requires_grad and torch.is_grad_enabled()


def all_reduce(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Reduce ``x`` across ``group`` (default: the world group); returns a new tensor.

    op: "sum" | "avg" | "max" | "min"; bf16/fp16/fp32 inputs, fp32 accumulation (other dtypes: the
    process group's collective). algorithm: "auto" (the dispatcher's table: ``symmcoll info``), "nccl"
    (the process group's own collective) or one of ``ALGORITHMS["all_reduce"]``.
    Differentiable for op sum and avg (``symmcoll.autograd``).
    """
    name = _ops.group_name(group)
    if _wants_grad(_tensor(x)):
        return _autograd.AllReduce.apply(x, name, op, algorithm)
    if _ops.is_plain(x):
        return _ops.all_reduce_impl(x, name, op, algorithm)
    return torch.ops.symmcoll.all_reduce(x, name, op, algorithm)


def all_reduce_(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """In-place all-reduce: the result overwrites ``x`` (returned). For users who hold the buffer;
    not differentiable (like torch's in-place collectives)."""
    name = _ops.group_name(group)
    if _ops.is_plain(_tensor(x)):
        _ops.all_reduce_inplace_impl(x, name, op, algorithm)
    else:
        torch.ops.symmcoll.all_reduce_(x, name, op, algorithm)
    return x


def reduce_scatter(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Reduce ``x`` across ``group`` and keep this rank's segment of dim 0, like ``reduce_scatter_tensor``:
    output shape [x.shape[0] // W, *x.shape[1:]] (x.shape[0] % W == 0). Differentiable (sum, avg)."""
    name = _ops.group_name(group)
    if _wants_grad(_tensor(x)):
        return _autograd.ReduceScatter.apply(x, name, op, algorithm)
    if _ops.is_plain(x):
        return _ops.reduce_scatter_impl(x, name, op, algorithm)
    return torch.ops.symmcoll.reduce_scatter(x, name, op, algorithm)


def all_gather(x: torch.Tensor, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, like ``all_gather_into_tensor``: output shape
    [W * x.shape[0], *x.shape[1:]] (a 0-dim ``x`` gives shape [W]). Any dtype. Differentiable."""
    name = _ops.group_name(group)
    if _wants_grad(_tensor(x)):
        return _autograd.AllGather.apply(x, name, algorithm)
    if _ops.is_plain(x):
        return _ops.all_gather_impl(x, name, algorithm)
    return torch.ops.symmcoll.all_gather(x, name, algorithm)


def all_to_all(x: torch.Tensor, group=None, *, splits=None, max_rows: int | None = None, algorithm: str = "auto"):
    """Send rows of ``x`` to every rank and return the rows received, in source-rank order.

    splits:
      * None: x.shape[0] divisible by W, chunk j to rank j (like ``all_to_all_single``); returns a tensor
        shaped like x.
      * W ints (a list): the rows this rank sends to each rank, summing to x.shape[0]; returns exactly
        the rows received (their count is read back to the host: one synchronisation).
      * an int32/int64 tensor of W counts on x's device, with ``max_rows`` (the same on every rank: the
        most rows this rank can receive): nothing is read back to the host, so the call can be captured
        in a CUDA graph (like torch's ``all_to_all_vdev``). Returns ``(out, received)``: ``out`` has
        max_rows rows, of which the first ``received.sum()`` hold the rows from rank 0, then rank 1, ...;
        ``received`` is an int64 tensor [W], rows received from each rank. The counts may sum to less
        than x.shape[0] (the rest is not sent). Errors only the device can see are raised by the next
        symmcoll call on this rank, or by ``symmcoll.check()`` after a synchronisation, as
        ``SymmcollArgumentError`` naming the argument: more rows arriving than max_rows (the first
        max_rows are written, ``received`` stays exact), counts asking for more rows than x has.
    Any dtype."""
    name = _ops.group_name(group)
    _tensor(x)
    if isinstance(splits, torch.Tensor):
        if max_rows is None:
            raise ValueError("max_rows is required when splits is a tensor: the output is allocated with max_rows "
                             "rows (the most this rank can receive), since the host does not read the counts")
        if _ops.is_plain(x):
            return _ops.all_to_all_splits_impl(x, splits, max_rows, name, algorithm)
        return torch.ops.symmcoll.all_to_all_splits(x, splits, max_rows, name, algorithm)
    if max_rows is not None:
        raise ValueError("max_rows is only for splits given as a device tensor (with equal or listed splits the "
                         "output is sized exactly)")
    if splits is not None and not isinstance(splits, (list, tuple)):
        raise ValueError(f"splits must be a list of ints or an int tensor (rows sent to each rank), got {splits!r}")
    if _ops.is_plain(x):
        return _ops.all_to_all_impl(x, name, splits, algorithm)
    return torch.ops.symmcoll.all_to_all(x, name, None if splits is None else list(splits), algorithm)


def broadcast(x: torch.Tensor, src: int, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """A new tensor equal to group rank ``src``'s ``x`` on every rank (other ranks' ``x`` gives only
    the shape and dtype). Any dtype. Differentiable."""
    name = _ops.group_name(group)
    try:
        src = operator.index(src)
    except TypeError:
        raise ValueError(f"src must be an int (a rank of the group), got {type(src).__name__}") from None
    if _wants_grad(_tensor(x)):
        return _autograd.Broadcast.apply(x, src, name, algorithm)
    if _ops.is_plain(x):
        return _ops.broadcast_impl(x, src, name, algorithm)
    return torch.ops.symmcoll.broadcast(x, src, name, algorithm)


class MoEHandle(NamedTuple):
    """What ``moe_combine`` needs from ``moe_dispatch`` (device tensors; nothing is on the host).

    row_origin[i]: for row i of the dispatch output, (source rank * T + token) * k + slot (-1 past the rows
    received); self_rows[t, j]: the row of this rank's own token t for its local expert in slot j (-1 for
    other slots). ``topk_ids`` is the dispatch's own tensor: do not change it before the combine."""

    group_name: str
    num_experts: int
    topk_ids: torch.Tensor
    expert_counts: torch.Tensor
    row_origin: torch.Tensor
    self_rows: torch.Tensor


def moe_dispatch(tokens: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, group=None, *,
                 max_recv_rows: int | None = None, algorithm: str = "auto"):
    """Send every token once to each rank that owns one of its experts (expert e on rank e // (E / W)).

    tokens [T, H] (any dtype), topk_ids [T, k] (int32/int64; ids outside [0, E) are ignored); every rank
    passes the same T, H, k, num_experts and max_recv_rows. Returns ``(recv, expert_counts, handle)``:
    recv [max_recv_rows, H] holds the rows received by local expert (expert 0's ``expert_counts[0]`` rows
    first, then expert 1's, ...; within an expert by source rank, token, slot), expert_counts [E / W]
    int64. max_recv_rows defaults to the worst case W * T * min(k, E / W); rows past it are counted,
    not written, and reported by the rank that received them (SymmcollArgumentError naming max_rows, at
    its next check): the combine of such a call is undefined for the tokens whose rows were dropped.
    No host synchronisation: graph-capturable. Not differentiable."""
    name = _ops.group_name(group)
    world = _group_size(group)
    if max_recv_rows is None:
        local = num_experts // world if isinstance(num_experts, int) and num_experts >= world else 1
        k = topk_ids.shape[1] if isinstance(topk_ids, torch.Tensor) and topk_ids.dim() == 2 else 1
        max_recv_rows = world * _tensor(tokens).shape[0] * min(k, local)
    if _ops.is_plain(_tensor(tokens)):
        recv, counts, origin, self_rows = _ops.moe_dispatch_impl(tokens, topk_ids, num_experts, max_recv_rows, name,
                                                                 algorithm)
    else:
        recv, counts, origin, self_rows = torch.ops.symmcoll.moe_dispatch(tokens, topk_ids, num_experts,
                                                                          max_recv_rows, name, algorithm)
    return recv, counts, MoEHandle(name, num_experts, topk_ids, counts, origin, self_rows)


def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, handle: MoEHandle, *,
                algorithm: str = "auto") -> torch.Tensor:
    """[T, H]: for every token this rank dispatched, sum over its k slots of topk_weights[t, j] * (that
    expert's row of ``expert_out``), in fp32, rounded once to expert_out's dtype (bf16/fp16/fp32).
    expert_out is laid out like the dispatch output (max_recv_rows rows by local expert)."""
    if not isinstance(handle, MoEHandle):
        raise ValueError(f"handle must be the MoEHandle moe_dispatch returned, got {type(handle).__name__}")
    args = (expert_out, topk_weights, handle.topk_ids, handle.expert_counts, handle.row_origin, handle.self_rows,
            handle.num_experts, handle.group_name, algorithm)
    if _ops.is_plain(_tensor(expert_out)):
        return _ops.moe_combine_impl(*args)
    return torch.ops.symmcoll.moe_combine(*args)


def _group_size(group) -> int:
    import torch.distributed as dist
    return dist.get_world_size(memory.default_group(group))


def check(group=None) -> None:
    """Raise the error a kernel of this rank recorded (SymmcollTimeoutError, SymmcollMismatchError).

    On GPU kernels run asynchronously: synchronize first to see errors of calls still in flight."""
    for ws in memory.workspaces():
        if group is None or ws.group is group:
            ws.check()


def reset(group=None) -> None:
    """Drop the symmetric workspaces (after a failure); every rank must call it together."""
    memory.reset(group)
    _ops._forget_groups()
