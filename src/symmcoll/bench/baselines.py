"""What symmcoll is compared against, in the same run (rank side).

* the torch.distributed backend: NCCL on GPU (gloo on CPU), named by the backend actually in use;
  ``dist.all_reduce`` (in place), ``reduce_scatter_tensor``, ``all_gather_into_tensor``,
  ``all_to_all_single`` into preallocated outputs;
* torch's symmetric-memory ops, only on CUDA and only those the installed torch has, all fed from a
  symmetric buffer (where they are fastest, as ANCHORS.md measured them):
  all_reduce: ``one_shot_all_reduce`` (out of place), ``two_shot_all_reduce_`` (in place);
  reduce_scatter: ``reduce_scatter_out``, ``_low_contention_reduce_scatter``;
  all_gather: ``_low_contention_all_gather`` (copy engines, no SMs).
  Each also as ``torch:<name>_copy_in`` (family TORCH_COPY_IN, run only when an ``--algorithms`` pattern names
  "copy_in"): the same op with the caller's tensor copied into the symmetric buffer inside the timed call, which
  is what a caller holding an ordinary tensor pays, and what symmcoll's own times include.
  Multimem ops are left out (NVLink multicast is forbidden on our hosts); the all-to-all ops need the
  NVSHMEM backend, which we do not set up.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm.backend import all_gather_single, reduce_scatter_single
from .impls import Bound, Implementation
from ..memory.torch_buffers import symmetric_view


def backend_implementation(op: str, group) -> Implementation:
    name = str(dist.get_backend(group)).lower()
    return Implementation(name, op, "backend", op == "all_reduce", _BACKEND_BINDERS[op])


def _bind_backend_all_reduce(x: torch.Tensor, group) -> Bound:
    buffer = x.clone()

    def call():
        dist.all_reduce(buffer, group=group)
        return buffer
    return Bound(load=buffer.copy_, call=call)


def _bind_backend_reduce_scatter(x: torch.Tensor, group) -> Bound:
    out = x.new_empty(x.numel() // dist.get_world_size(group))

    def call():
        reduce_scatter_single(out, x, group=group)
        return out
    return Bound(load=x.copy_, call=call)


def _bind_backend_all_gather(x: torch.Tensor, group) -> Bound:
    out = x.new_empty(x.numel() * dist.get_world_size(group))

    def call():
        all_gather_single(out, x, group=group)
        return out
    return Bound(load=x.copy_, call=call)


def _bind_backend_all_to_all(x: torch.Tensor, group) -> Bound:
    out = torch.empty_like(x)

    def call():
        dist.all_to_all_single(out, x, group=group)
        return out
    return Bound(load=x.copy_, call=call)


_BACKEND_BINDERS = {"all_reduce": _bind_backend_all_reduce, "reduce_scatter": _bind_backend_reduce_scatter,
                    "all_gather": _bind_backend_all_gather, "all_to_all": _bind_backend_all_to_all}


TORCH_COPY_IN = "torch_copy_in"


def copy_in(binder):
    """``binder``'s op as a caller with a tensor of its own runs it: that tensor copied into the op's symmetric
    input inside the call. Never in place (each call starts from the caller's tensor again)."""
    def bind(x: torch.Tensor, group) -> Bound:
        inner = binder(x, group)
        user = x.clone()

        def call():
            inner.load(user)
            return inner.call()
        return Bound(load=user.copy_, call=call)
    return bind


def torch_symm_mem_implementations(op: str, device: torch.device) -> tuple[list[Implementation], list[str]]:
    """(torch's symmetric-memory ops for ``op`` that this torch has, each fed from a symmetric buffer and, as
    ``..._copy_in``, from the caller's tensor; the names of those it lacks); nothing off CUDA."""
    if device.type != "cuda":
        return [], []
    try:
        import torch.distributed._symmetric_memory  # noqa: F401  (registers torch.ops.symm_mem)
    except ImportError:
        return [], ["torch.distributed._symmetric_memory"]
    found, missing = [], []
    for name, op_of, symm_op, in_place, binder in _TORCH_SYMM_MEM:
        if op_of != op:
            continue
        if hasattr(torch.ops.symm_mem, symm_op):
            found.append(Implementation(f"torch:{name}", op, "torch_symm_mem", in_place, binder))
            found.append(Implementation(f"torch:{name}_copy_in", op, TORCH_COPY_IN, False, copy_in(binder)))
        else:
            missing.append(f"torch.ops.symm_mem.{symm_op}")
    return found, missing


def _symmetric_input(x: torch.Tensor, group) -> torch.Tensor:
    buffer, _ = symmetric_view(group, x.device, x.numel(), x.dtype)
    buffer.copy_(x)
    return buffer


def _bind_one_shot(x: torch.Tensor, group) -> Bound:
    symm = _symmetric_input(x, group)
    return Bound(load=symm.copy_,
                 call=lambda: torch.ops.symm_mem.one_shot_all_reduce(symm, "sum", group.group_name))


def _bind_two_shot(x: torch.Tensor, group) -> Bound:
    symm = _symmetric_input(x, group)
    return Bound(load=symm.copy_,
                 call=lambda: torch.ops.symm_mem.two_shot_all_reduce_(symm, "sum", group.group_name))


def _bind_reduce_scatter_out(x: torch.Tensor, group) -> Bound:
    symm = _symmetric_input(x, group)
    out = x.new_empty(x.numel() // dist.get_world_size(group))
    return Bound(load=symm.copy_,
                 call=lambda: torch.ops.symm_mem.reduce_scatter_out(symm, group.group_name, False, out))


def _bind_low_contention_reduce_scatter(x: torch.Tensor, group) -> Bound:
    symm = _symmetric_input(x, group)

    def call():
        out = torch.ops.symm_mem._low_contention_reduce_scatter(symm, "sum", group.group_name)
        # The op runs on torch's backend stream; this joins it back into the current one.
        return torch.ops._c10d_functional.wait_tensor(out)
    return Bound(load=symm.copy_, call=call)


def _bind_low_contention_all_gather(x: torch.Tensor, group) -> Bound:
    symm = _symmetric_input(x, group)

    def call():
        out = torch.ops.symm_mem._low_contention_all_gather(symm, group.group_name)
        return torch.ops._c10d_functional.wait_tensor(out)
    return Bound(load=symm.copy_, call=call)


# (table name, op, torch.ops.symm_mem name, in place, binder)
_TORCH_SYMM_MEM = (
    ("one_shot", "all_reduce", "one_shot_all_reduce", False, _bind_one_shot),
    ("two_shot", "all_reduce", "two_shot_all_reduce_", True, _bind_two_shot),
    ("reduce_scatter_out", "reduce_scatter", "reduce_scatter_out", False, _bind_reduce_scatter_out),
    ("low_contention", "reduce_scatter", "_low_contention_reduce_scatter", False,
     _bind_low_contention_reduce_scatter),
    ("low_contention", "all_gather", "_low_contention_all_gather", False, _bind_low_contention_all_gather),
)
