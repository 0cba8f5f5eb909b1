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

# Importing an op's module declares it (ops.OpSpec: its torch op, resolver hooks and algorithms) and
# its regions; every public function below forwards to its op's spec.
from .comm import collectives as _collectives, quantized as _quantized, splits as _splits
from .fused import all_gather_matmul as _all_gather_matmul
from .fused import matmul_reduce_scatter as _matmul_reduce_scatter
from .fused import matmul_all_reduce as _matmul_all_reduce
from .fused import all_reduce_rms_norm as _all_reduce_rms_norm
from .fused import moe as _moe
from .fused import moe_hierarchical as _moe_hierarchical  # noqa: F401  (moe's algorithms across nodes)
from . import memory, plan
from . import ops as _ops
from . import autograd as _autograd
from .compiler import backend
from .errors import SymmcollArgumentError, SymmcollError, SymmcollMismatchError, SymmcollTimeoutError
from .memory import get_workspace

__version__ = "0.2.0"

__all__ = ["ALGORITHMS", "all_reduce", "all_reduce_", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
           "all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce", "all_reduce_rms_norm", "moe_dispatch",
           "moe_combine", "MoEHandle", "backend", "check", "reset", "get_workspace", "SymmcollError",
           "SymmcollTimeoutError", "SymmcollMismatchError", "SymmcollArgumentError", "__version__"]


class _Algorithms(dict):
    """op -> {name: summary} of the registered kernel algorithms of every op, collectives and fused ops
    (live view of symmcoll.registry; "nccl", the process group's own, is not listed)."""

    @staticmethod
    def _ops():
        return [op for op in plan.registered_ops() if plan.algorithms(op)]

    def __getitem__(self, op):
        return {name: a.summary for name, a in plan.algorithms(op).items()}

    def get(self, op, default=None):
        return self[op] if op in self else default

    def __iter__(self):
        return iter(self._ops())

    def __contains__(self, op):
        return bool(plan.algorithms(op))

    def keys(self):
        return self._ops()

    def items(self):
        return [(op, self[op]) for op in self._ops()]

    def __len__(self):
        return len(self._ops())

    def __repr__(self):
        return repr(dict(self.items()))


ALGORITHMS = _Algorithms()


def _tensor(x, name: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    # Here, not only in the resolver: a meta tensor that goes through the custom op (requires_grad)
    # would get the fake implementation's empty result instead of an error.
    plan.check_device(x)
    return x


def _wants_grad(x: torch.Tensor) -> bool:
    return x.requires_grad and torch.is_grad_enabled()


def all_reduce(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto", quantize: str | None = None,
               group_size: int | None = None) -> torch.Tensor:
    """Reduce ``x`` across ``group`` (default: the world group); returns a new tensor.

    op: "sum" | "avg" | "max" | "min"; bf16/fp16/fp32 inputs, fp32 accumulation (other dtypes: the
    process group's collective). algorithm: "auto" (the dispatcher's table: ``symmcoll info``), "nccl"
    (the process group's own collective) or one of ``ALGORITHMS["all_reduce"]``.
    quantize: None (exact; the default) or "int8" | "fp8" | "int4": both hops of a two-shot carry
    codes with one scale per ``group_size`` values (32, 64 or 128; default 64), lossy within the
    bound docs/algorithms.md states, deterministic; op "sum" or "avg" only; below about 1 MB the
    exact path runs instead (quantizing does not pay there). Differentiable for op sum and avg
    (the quantized path passes the gradient through an exact all-reduce).
    """
    name = _ops.group_name(group)
    if quantize is not None:
        return _all_reduce_quantized(x, name, op, algorithm, quantize, group_size)
    if group_size is not None:
        raise ValueError(f"group_size applies only with quantize= (got group_size={group_size!r}, quantize=None)")
    if _wants_grad(_tensor(x)):
        return _autograd.AllReduce.apply(x, name, op, algorithm)
    return _collectives.ALL_REDUCE.call(x, name, op, algorithm)


def _all_reduce_quantized(x, name: str, op: str, algorithm: str, quantize, group_size) -> torch.Tensor:
    if algorithm != "auto":
        raise ValueError(f"algorithm={algorithm!r} names an exact algorithm; with quantize= leave algorithm='auto'")
    if quantize not in _quantized.QUANTIZE_FORMATS:
        raise ValueError(f"quantize must be None or one of {_quantized.QUANTIZE_FORMATS}, got {quantize!r}")
    group_size = _quantized.DEFAULT_GROUP_SIZE if group_size is None else group_size
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"group_size must be an int (32, 64 or 128), got {group_size!r}")
    if _wants_grad(_tensor(x)):
        return _autograd.AllReduceQuantized.apply(x, name, op, quantize, group_size)
    return _quantized.SPEC.call(x, name, op, quantize, group_size)


def all_reduce_(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """In-place all-reduce: the result overwrites ``x`` (returned). For users who hold the buffer;
    not differentiable (like torch's in-place collectives)."""
    name = _ops.group_name(group)
    _collectives.ALL_REDUCE_INPLACE.call(_tensor(x), name, op, algorithm)
    return x


def reduce_scatter(x: torch.Tensor, group=None, *, op: str = "sum", algorithm: str = "auto") -> torch.Tensor:
    """Reduce ``x`` across ``group`` and keep this rank's segment of dim 0, like ``reduce_scatter_tensor``:
    output shape [x.shape[0] // W, *x.shape[1:]] (x.shape[0] % W == 0). Differentiable (sum, avg)."""
    name = _ops.group_name(group)
    if _wants_grad(_tensor(x)):
        return _autograd.ReduceScatter.apply(x, name, op, algorithm)
    return _collectives.REDUCE_SCATTER.call(x, name, op, algorithm)


def all_gather(x: torch.Tensor, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0, like ``all_gather_into_tensor``: output shape
    [W * x.shape[0], *x.shape[1:]] (a 0-dim ``x`` gives shape [W]). Any dtype. Differentiable."""
    name = _ops.group_name(group)
    if _wants_grad(_tensor(x)):
        return _autograd.AllGather.apply(x, name, algorithm)
    return _collectives.ALL_GATHER.call(x, name, algorithm)


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
        return _splits.ALL_TO_ALL_SPLITS.call(x, splits, max_rows, name, algorithm)
    if max_rows is not None:
        raise ValueError("max_rows is only for splits given as a device tensor (with equal or listed splits the "
                         "output is sized exactly)")
    if splits is not None and not isinstance(splits, (list, tuple)):
        raise ValueError(f"splits must be a list of ints or an int tensor (rows sent to each rank), got {splits!r}")
    return _splits.ALL_TO_ALL.call(x, name, None if splits is None else list(splits), algorithm)


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
    return _collectives.BROADCAST.call(x, src, name, algorithm)


def all_gather_matmul(a_shard: torch.Tensor, b, group=None, *, algorithm: str = "auto",
                      return_gathered: bool = False):
    """``all_gather(a_shard) @ b`` with the communication inside the GEMM (fused/all_gather_matmul.py).

    a_shard: this rank's rows [M/W, K] of A; b: [K, N] (replicated), or a list of them sharing one
    gather; each b contiguous or the transpose of a contiguous [N, K] (``linear.weight.t()``, read as
    it is: no copy). Returns C [M, N] (a list for a list of Bs), and the gathered A [M, K] too if
    ``return_gathered`` (as torch's ``fused_all_gather_matmul(..., return_A=...)``; without it no
    gathered A is returned, and a group of one makes none). bf16/fp16, fp32 accumulation. algorithm: "auto" or one of
    ``ALGORITHMS["all_gather_matmul"]`` (nccl, naive_remote, gather_then_gemm, copy_engine_producer, fused).
    """
    name = _ops.group_name(group)
    bs = [b] if isinstance(b, torch.Tensor) else list(b)
    if not bs or not all(isinstance(t, torch.Tensor) for t in bs):
        raise ValueError(f"b must be a tensor or a non-empty list of tensors, got {type(b).__name__}")
    outs, gathered = _all_gather_matmul.SPEC.call(_tensor(a_shard), bs, name, algorithm, bool(return_gathered))
    result = outs[0] if isinstance(b, torch.Tensor) else list(outs)
    return (result, gathered) if return_gathered else result


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """This rank's row shard of sum over ranks of ``a @ b``: a [M, K], b [K, N] (each rank's own;
    contiguous, or the transpose of a contiguous [N, K] such as ``linear.weight.t()``: no copy), output
    [M / W, N] (rows [r * M/W, (r+1) * M/W) on rank r; M % W == 0). bf16/fp16/fp32, fp32 accumulation.
    algorithm: "auto", "fused" (one kernel: tiles travel as they finish), "chunked" (torch.matmul per
    destination's row chunk, each pulled by its owner with the copy engine under the next chunk's GEMM),
    "unfused" (torch.matmul + symmcoll.reduce_scatter) or "nccl" (torch.matmul + the process group's).
    Not differentiable."""
    name = _ops.group_name(group)
    return _matmul_reduce_scatter.SPEC.call(_tensor(a, "a"), _tensor(b, "b"), name, algorithm)


def matmul_all_reduce(a: torch.Tensor, b: torch.Tensor, group=None, *, algorithm: str = "auto") -> torch.Tensor:
    """sum over ranks of ``a @ b``: a [M, K], b [K, N] (each rank's own; contiguous, or the transpose of a
    contiguous [N, K] such as ``linear.weight.t()``: no copy), output [M, N], the same bits
    on every rank. bf16/fp16/fp32, fp32 accumulation. algorithm: "auto" (the tuned table's rule;
    without one: one_shot where the exchange is small -- decode -- else unfused), "one_shot" (one kernel pushing finished tiles to every peer), "two_shot" (the
    fused matmul + reduce-scatter, then an all-gather), "unfused" (torch.matmul + symmcoll.all_reduce)
    or "nccl" (torch.matmul + the process group's). Not differentiable."""
    name = _ops.group_name(group)
    return _matmul_all_reduce.SPEC.call(_tensor(a, "a"), _tensor(b, "b"), name, algorithm)


def all_reduce_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group=None, *,
                        algorithm: str = "auto", quant: str | None = None, scale: torch.Tensor | None = None):
    """The tail of a tensor-parallel block in one kernel: returns ``(normed, new_residual)`` with
    new_residual = residual + all_reduce(x) (rounded to x.dtype) and normed = RMSNorm(new_residual) *
    weight over the last dim. x and residual [..., H] (residual the same on every rank), weight [H].

    quant: None (normed in x.dtype); "fp8_per_tensor" (normed / ``scale``, a one-element fp32 tensor,
    as float8_e4m3fn); "fp8_per_token" (a scale per row, max |row| / 448: returns ``(normed, new_residual,
    scales)`` with scales [..., 1] fp32). algorithm: "auto", "one_shot", "two_shot" (sentinel
    all-reduces over whole rows), "unfused" (symmcoll.all_reduce + torch) or "nccl". Not differentiable."""
    name = _ops.group_name(group)
    _tensor(x), _tensor(residual, "residual"), _tensor(weight, "weight")
    if scale is not None:
        _tensor(scale, "scale")
    normed, new_residual, scales = _all_reduce_rms_norm.SPEC.call(x, residual, weight, float(eps), name, algorithm,
                                                             quant or "", scale)
    return (normed, new_residual, scales) if quant == "fp8_per_token" else (normed, new_residual)


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
    recv, counts, origin, self_rows = _moe.DISPATCH.call(_tensor(tokens), topk_ids, num_experts, max_recv_rows, name,
                                                    algorithm)
    return recv, counts, MoEHandle(name, num_experts, topk_ids, counts, origin, self_rows)


def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, handle: MoEHandle, *,
                algorithm: str = "auto") -> torch.Tensor:
    """[T, H]: for every token this rank dispatched, sum over its k slots of topk_weights[t, j] * (that
    expert's row of ``expert_out``), in fp32, rounded once to expert_out's dtype (bf16/fp16/fp32).
    expert_out is laid out like the dispatch output (max_recv_rows rows by local expert)."""
    if not isinstance(handle, MoEHandle):
        raise ValueError(f"handle must be the MoEHandle moe_dispatch returned, got {type(handle).__name__}")
    return _moe.COMBINE.call(_tensor(expert_out), topk_weights, handle.topk_ids, handle.expert_counts, handle.row_origin,
                        handle.self_rows, handle.num_experts, handle.group_name, algorithm)


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
    _ops.forget_groups()
