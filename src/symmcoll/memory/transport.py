"""The host side of the cross-node transport: what a kernel needs to reach a peer on another node.

Kernels reach cross-node peers only through ``language/transport.py`` (put with signal, get, signal,
bounded signal wait), given *their own* symmetric address of the remote object and the peer's group
rank -- NVSHMEM's convention: the same region sits at the same offset on every rank. What the device
functions need besides is one int64 per group rank, the transport table (``Transport.ptrs_dev``):

* ``EMULATED`` (CPU; also ranks sharing one GPU through CUDA IPC, SYMMCOLL_MEMORY=ipc, to check the
  protocols on a GPU): every rank's allocation base in this process. The workspace maps every rank's
  memory (nothing else could move the bytes), but only this table holds the cross-node bases: the
  address tables kernels index with ``peer_ptr`` hold 0 for them.
* ``NVSHMEM`` (GPU): every group rank's NVSHMEM PE (its global rank: torch's NVSHMEM backend
  initialises NVSHMEM over the default group). The allocation comes from torch's NVSHMEM symmetric
  memory backend; peers of the same node keep their NVLink pointers (``nvshmem_ptr``), cross-node
  entries are 0.

NVLink multicast stays off (NVSHMEM_DISABLE_NVLS=1, set with the others by ``cuda.disable_multicast_env``).
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# TRANSPORT constexpr values of the device functions.
EMULATED = 0
NVSHMEM = 1

_DEVICE_LIBRARY = "libnvshmem_device.bc"


@dataclass
class Transport:
    kind: int  # EMULATED | NVSHMEM
    table: torch.Tensor = field(repr=False)  # int64 per group rank: base address (emulated) or PE (NVSHMEM)

    @property
    def ptrs_dev(self) -> int:
        return self.table.data_ptr()

    def launch_options(self) -> dict:
        """Options every kernel that calls the transport is launched with (NVSHMEM: its device library)."""
        if self.kind == NVSHMEM:
            return {"extern_libs": extern_libs()}
        return {}


def emulated(bases: list[int], device: torch.device) -> Transport:
    return Transport(EMULATED, torch.tensor(bases, dtype=torch.int64, device=device))


def nvshmem_library() -> str | None:
    """Path of NVSHMEM's device bitcode (NVSHMEM_LIB_DIR, else the nvidia-nvshmem wheel), or None."""
    directories = [os.environ["NVSHMEM_LIB_DIR"]] if os.environ.get("NVSHMEM_LIB_DIR") else []
    directories.append(os.path.join(sysconfig.get_path("purelib"), "nvidia", "nvshmem", "lib"))
    for directory in directories:
        path = os.path.join(directory, _DEVICE_LIBRARY)
        if os.path.exists(path):
            return path
    return None


def extern_libs() -> tuple:
    path = nvshmem_library()
    if path is None:
        raise RuntimeError(f"symmcoll: groups that span nodes need NVSHMEM's device library ({_DEVICE_LIBRARY}): "
                           f"pip install nvidia-nvshmem-cu13 (or -cu12, matching torch's CUDA), or set "
                           f"NVSHMEM_LIB_DIR to the folder that holds it")
    return (("libnvshmem_device", path),)


_AVAILABLE: dict = {}


def available(device: torch.device) -> bool:
    """Whether a transport can serve a group that spans nodes on ``device``: always on CPU and for ranks
    sharing a GPU (emulated); on GPU, torch's NVSHMEM backend and NVSHMEM's device library. Without
    them, such groups keep going to the process group's collective (NCCL)."""
    if device.type != "cuda" or os.environ.get("SYMMCOLL_MEMORY") == "ipc":
        return True
    if "nvshmem" not in _AVAILABLE:
        try:
            import torch.distributed._symmetric_memory as symm_mem
            backend = getattr(symm_mem, "is_nvshmem_available", lambda: False)()
        except Exception:  # noqa: BLE001 - a torch without it
            backend = False
        _AVAILABLE["nvshmem"] = bool(backend) and nvshmem_library() is not None
    return _AVAILABLE["nvshmem"]


def nvshmem_selected(device: torch.device) -> bool:
    """Whether this process's symmetric allocations on ``device`` are NVSHMEM's (torch cannot change that
    back once one was made)."""
    if device.type != "cuda":
        return False
    try:
        import torch.distributed._symmetric_memory as symm_mem
        return getattr(symm_mem, "get_backend", lambda d: None)(device) == "NVSHMEM"
    except Exception:  # noqa: BLE001 - a torch without symmetric memory backends
        return False


def workspace_possible(topo, device: torch.device) -> bool:
    """Whether a workspace can be made for a group laid out as ``topo`` (symmcoll.topology) on ``device``.
    NVSHMEM's allocations (nvshmem_malloc, and torch's rendezvous, which makes another) are collective over
    every process of the job: made by the ranks of a smaller group only, they wait forever for the others.
    So a group that is not the whole job gets none where NVSHMEM would allocate it -- a group that spans
    nodes on GPU, or any group once this process's symmetric memory is NVSHMEM's -- and a group that spans
    nodes gets one only where the transport is available. CPU and ranks sharing a GPU (emulated
    transport, mapped files or CUDA IPC) serve any group."""
    if device.type != "cuda" or os.environ.get("SYMMCOLL_MEMORY") == "ipc":
        return True
    if topo.spans and topo.regular:
        return topo.whole_job and available(device)
    return topo.whole_job or not nvshmem_selected(device)


_INITIALISED_KERNELS: set = set()


def prepare_nvshmem_kernel(kernel) -> None:
    """Have torch initialise NVSHMEM in the module of every compiled variant of ``kernel`` (the device
    library's state is per module; torch's post-compile hook does it for kernels it was told about)."""
    name = kernel.fn.__name__
    if name in _INITIALISED_KERNELS:
        return
    import triton
    from torch.distributed._symmetric_memory import _nvshmem_triton

    _nvshmem_triton.NvshmemKernelRegistry.register(name)
    triton.knobs.runtime.jit_post_compile_hook = _nvshmem_triton._nvshmem_init_hook
    _INITIALISED_KERNELS.add(name)


def select_nvshmem_backend(device: torch.device) -> None:
    """Make torch's NVSHMEM backend serve this process's symmetric allocations (multicast off). The first
    allocation after it initialises NVSHMEM over the default group: collective over every rank, through
    the default group's store (a unique id) and NVSHMEM's own bootstrap."""
    from .cuda import disable_multicast_env

    disable_multicast_env()
    import torch.distributed._symmetric_memory as symm_mem

    if hasattr(symm_mem, "set_backend") and getattr(symm_mem, "get_backend", lambda d: None)(device) != "NVSHMEM":
        try:
            symm_mem.set_backend("NVSHMEM")
        except Exception as exc:  # noqa: BLE001 - torch says why; we say what to do
            raise RuntimeError(f"symmcoll: a group that spans nodes needs torch's NVSHMEM symmetric-memory backend, "
                               f"which could not be selected ({exc}); make the first symmcoll call on such a group "
                               f"before any other symmetric allocation of this process") from exc


def allocate_nvshmem(group, nbytes: int, device: torch.device, same_node):
    """A zero-filled NVSHMEM symmetric allocation of ``nbytes`` on every rank of ``group`` (collective):
    (this rank's bytes, every rank's base address -- 0 for ranks on other nodes --, every rank's bytes
    as tensors -- None across nodes --, what keeps them alive, the transport). ``same_node(r)``: whether
    group rank r shares this rank's node."""
    import torch.distributed._symmetric_memory as symm_mem

    select_nvshmem_backend(device)
    local = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
    handle = symm_mem.rendezvous(local, group.group_name)
    local.zero_()
    world = handle.world_size
    bases = [int(p) if same_node(r) else 0 for r, p in enumerate(handle.buffer_ptrs)]
    peers = [local if r == handle.rank else handle.get_buffer(r, (nbytes,), torch.uint8) if same_node(r) else None
             for r in range(world)]
    pes = torch.tensor([dist.get_global_rank(group, r) for r in range(world)], dtype=torch.int64, device=device)
    return local, bases, peers, [handle], Transport(NVSHMEM, pes)


__all__ = ["Transport", "EMULATED", "NVSHMEM", "available", "nvshmem_selected", "workspace_possible", "emulated",
           "nvshmem_library", "extern_libs", "prepare_nvshmem_kernel", "select_nvshmem_backend", "allocate_nvshmem"]
