"""Symmetric workspace on CUDA GPUs, on top of ``torch.distributed._symmetric_memory``.

Every region (data buffer, our own int32 signal pad -- so its size is ours to choose, whatever the
installed torch's default pad size -- and any extra region) is one symmetric allocation; its handle's
``buffer_ptrs_dev`` is the address table kernels take.

NVLink multicast is never used (no multimem, no NVLS): see DESIGN.md.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from . import SymmetricRegion

_FORBIDDEN_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
                        "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast_env() -> None:
    """Force NVLink multicast off for torch symm_mem, NCCL and NVSHMEM in this process."""
    for key, value in _FORBIDDEN_MULTICAST.items():
        os.environ[key] = value


def allocate_cuda(group, nbytes: int, device: torch.device) -> SymmetricRegion:
    """A zero-filled symmetric region of ``nbytes`` on every rank of ``group`` (collective)."""
    disable_multicast_env()
    import torch.distributed._symmetric_memory as symm_mem

    name = group.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(name)
    local = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(local, name)
    local.zero_()
    torch.cuda.synchronize(device)
    dist.barrier(group)  # zero everywhere before anybody writes to a peer
    peers = [local if r == handle.rank else handle.get_buffer(r, (nbytes,), torch.uint8)
             for r in range(handle.world_size)]
    return SymmetricRegion(local=local, ptrs_dev=handle.buffer_ptrs_dev, keepalive=[handle], peers=peers)
