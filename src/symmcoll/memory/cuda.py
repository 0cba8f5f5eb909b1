"""Symmetric workspace on CUDA GPUs, on top of ``torch.distributed._symmetric_memory``.

Two symmetric allocations: the data buffer (uint8) and our own int32 signal pad (so its size is ours to
choose, whatever the installed torch's default pad size). Their handles' ``buffer_ptrs_dev`` are the two
address tables the kernels take. The error record is pinned host memory, which kernels reach through
unified addressing and the host reads without synchronising the device.

NVLink multicast is never used (no multimem, no NVLS): see DESIGN.md.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from . import SIGNAL_PAD_INTS, Workspace, timeout_spins

_FORBIDDEN_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
                        "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast_env() -> None:
    """Force NVLink multicast off for torch symm_mem, NCCL and NVSHMEM in this process."""
    for key, value in _FORBIDDEN_MULTICAST.items():
        os.environ[key] = value


def create_cuda_workspace(group, device: torch.device, buffer_bytes: int) -> Workspace:
    disable_multicast_env()
    import torch.distributed._symmetric_memory as symm_mem

    name = group.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(name)

    buffer = symm_mem.empty(buffer_bytes, dtype=torch.uint8, device=device)
    buffer_handle = symm_mem.rendezvous(buffer, name)
    pad = symm_mem.empty(SIGNAL_PAD_INTS, dtype=torch.int32, device=device)
    pad.zero_()
    pad_handle = symm_mem.rendezvous(pad, name)
    torch.cuda.synchronize(device)
    dist.barrier(group)  # every pad is zero before anybody signals

    status = torch.zeros(4, dtype=torch.int32).pin_memory()
    return Workspace(
        group=group, rank=dist.get_rank(group), world_size=dist.get_world_size(group),
        device=device, buffer=buffer, signal_pad=pad,
        buffer_ptrs_dev=buffer_handle.buffer_ptrs_dev, signal_pad_ptrs_dev=pad_handle.buffer_ptrs_dev,
        status=status, max_spins=timeout_spins("cuda"),
        _keepalive=[buffer_handle, pad_handle],
    )
