"""Symmetric memory on CUDA GPUs, on top of ``torch.distributed._symmetric_memory``.

The workspace is one symmetric allocation (its regions are laid out inside it); the handle's
``buffer_ptrs`` are every rank's base address, from which each region's address table is built.

NVLink multicast is never used (no multimem, no NVLS): see DESIGN.md.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from .rendezvous import bounded_rendezvous

_FORBIDDEN_MULTICAST = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0",
                        "NVSHMEM_DISABLE_NVLS": "1"}


def disable_multicast_env() -> None:
    """Force NVLink multicast off for torch symm_mem, NCCL and NVSHMEM in this process."""
    for key, value in _FORBIDDEN_MULTICAST.items():
        os.environ[key] = value


def allocate_cuda(group, nbytes: int, device: torch.device):
    """A zero-filled symmetric allocation of ``nbytes`` on every rank of ``group`` (collective): (this
    rank's bytes, every rank's base address, every rank's bytes as tensors here, the handle)."""
    disable_multicast_env()
    import torch.distributed._symmetric_memory as symm_mem

    name = group.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # required before torch 2.9, deprecated since
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(name)
    local = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(local, name)
    local.zero_()
    peers = [local if r == handle.rank else handle.get_buffer(r, (nbytes,), torch.uint8)
             for r in range(handle.world_size)]
    bases = [int(p) for p in handle.buffer_ptrs]
    return local, bases, peers, [handle]


def allocate_cuda_ipc(group, nbytes: int, device: torch.device):
    """The same, with plain CUDA IPC handles instead of torch's symmetric memory: for ranks that share
    one GPU (``launch`` device "cuda-shared", SYMMCOLL_MEMORY=ipc), which torch's allocator refuses.
    Each rank's bytes are an ordinary CUDA allocation; peers open its IPC handle (exchanged through the
    process group's store)."""
    import pickle

    from torch.distributed import distributed_c10d as c10d
    from torch.multiprocessing.reductions import reduce_tensor

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    local = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    store = c10d._get_default_store()
    tag = f"symmcoll/{group.group_name}/ipc/{id(local)}-{local.data_ptr()}"
    keys_key = f"symmcoll/{group.group_name}/ipc-key/{rank}"
    store.set(tag, pickle.dumps(reduce_tensor(local)))
    store.set(keys_key, tag)
    bounded_rendezvous(group, "workspace creation (IPC handles)")
    peers = []
    for r in range(world):
        if r == rank:
            peers.append(local)
            continue
        rebuild, args = pickle.loads(store.get(store.get(f"symmcoll/{group.group_name}/ipc-key/{r}").decode()))
        peers.append(rebuild(*args))
    torch.cuda.synchronize(device)
    return local, [p.data_ptr() for p in peers], peers, [peers]


__all__ = ["allocate_cuda", "allocate_cuda_ipc", "disable_multicast_env"]
