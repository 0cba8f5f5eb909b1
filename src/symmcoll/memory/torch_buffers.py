"""Symmetric allocations for torch's own symm_mem ops (CUDA only): the benchmark's baselines and link
measurement, and models.tp_comm's torch comparison. symmcoll's kernels use workspaces instead.

torch's ops find the symmetric allocation by the tensor's address, so every view handed out starts at
offset 0 of an allocation. Allocations only grow (doubling) and are never freed during a run: peers
may still have them mapped, and a sweep of increasing sizes then costs a handful of rendezvous (each
collective), not one per size.
"""

from __future__ import annotations

import warnings

import torch

_ALLOCATIONS: dict[tuple[str, str], list[tuple[torch.Tensor, object]]] = {}


def symmetric_view(group, device: torch.device, numel: int,
                   dtype: torch.dtype) -> tuple[torch.Tensor, object]:
    """(a tensor of ``numel`` ``dtype`` at offset 0 of a symmetric allocation, its handle).

    Collective when it has to allocate: every rank must ask for the same size at the same time."""
    nbytes = max(1, numel * dtype.itemsize)
    key = (group.group_name, str(device))
    allocations = _ALLOCATIONS.setdefault(key, [])
    if not allocations or allocations[-1][0].numel() < nbytes:
        previous = allocations[-1][0].numel() if allocations else 0
        allocations.append(_allocate(group, device, max(nbytes, 2 * previous)))
    buffer, handle = allocations[-1]
    return buffer[: numel * dtype.itemsize].view(dtype), handle


def _allocate(group, device: torch.device, nbytes: int) -> tuple[torch.Tensor, object]:
    import torch.distributed._symmetric_memory as symm_mem

    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # required before torch 2.9, deprecated since
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group.group_name)
    buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(buffer, group.group_name)
    return buffer, handle
