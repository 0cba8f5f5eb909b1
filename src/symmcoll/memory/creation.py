"""How a workspace comes to exist: collectively, once per (group, device), as one symmetric allocation.

``create_workspace`` checks that the device and process group can have one (and that no CUDA graph is
being captured), lays out every declared region (regions.py) page-aligned in one allocation, agrees on
that layout with every rank (rendezvous.py), allocates through the backend that fits (cuda.py:
torch's symmetric memory or CUDA IPC; emulated.py: /dev/shm files on CPU; transport.py: NVSHMEM when
the group spans nodes), fills each region, and returns the ``Workspace`` (workspace.py). It is apart
from the workspace because it runs once per (group, device), before any kernel: the only code on the
way to a call that allocates memory or waits on other ranks.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .. import debug_switches, topology
from ..errors import SymmcollError
from .layout import MAX_WORLD, SIGNAL_PAD_INTS
from .regions import Geometry, RegionSpec, declare, declared
from .rendezvous import bounded_rendezvous, timeout_spins
from .transport import workspace_possible
from .workspace import STATUS_INTS, SymmetricRegion, Workspace

DEFAULT_BUFFER_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
_ALIGN = 4096

SIGNAL_PAD = declare(RegionSpec(
    "signal_pad", "workspace", lambda g: SIGNAL_PAD_INTS * 4,
    "barrier slots are written only by signals (CAS 0 -> descriptor) and emptied by the waiter; "
    "announce slots by program 0 of each call"))


def capturing(device: torch.device) -> bool:
    """Whether work on ``device`` is being captured into a CUDA graph now: no host read, synchronisation
    or new workspace may happen (a graph replays device work only)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def create_workspace(group, device: torch.device) -> Workspace:
    """This rank's workspace of ``group`` on ``device``, made with every other rank of the group."""
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"symmcoll: no symmetric memory for device type {device.type!r}")
    backend = str(dist.get_backend(group))
    if device.type == "cpu" and "gloo" not in backend:
        raise ValueError(f"symmcoll: got a CPU tensor but the process group's backend is {backend!r}; "
                         f"pass a tensor on this rank's GPU")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        # Ranks sharing a GPU run gloo groups: without this, a CPU tensor would reach a GPU compile.
        raise ValueError("symmcoll: got a CPU tensor, and symmcoll's kernels run on the CPU only under "
                         "TRITON_INTERPRET=1 (set before symmcoll is imported); pass a tensor on this rank's GPU")
    if capturing(device):
        raise SymmcollError(f"symmcoll: the workspace of group {group.group_name!r} on {device} does not exist "
                            f"yet and cannot be created during CUDA-graph capture (it is a rendezvous and an "
                            f"allocation): make one call of any symmcoll op on this group before capturing")
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    # ---- groups that span nodes (symmcoll.topology): kernels see one node's ranks at a time ----
    topo = topology.of_group(group)
    if not workspace_possible(topo, device):  # (plan.choose sends such groups to the process group's own)
        why = (f"it holds {world} of the job's {dist.get_world_size()} processes, and NVSHMEM's allocations (a "
               f"group that spans nodes; every group once NVSHMEM serves this process) are collective over all of "
               f"them" if not topo.whole_job else "it spans nodes and torch's NVSHMEM backend or NVSHMEM's device "
               "library is missing")
        raise SymmcollError(f"symmcoll: no workspace for group {group.group_name!r} on {device}: {why}")
    spans = topo.spans and topo.regular
    kernel_world = topo.ranks_per_node if spans else world
    if kernel_world > MAX_WORLD:
        raise ValueError(f"symmcoll: {kernel_world} ranks per node > {MAX_WORLD} is not supported by the kernels")
    if spans and topo.nodes > topology.MAX_NODES:
        raise ValueError(f"symmcoll: {topo.nodes} nodes > {topology.MAX_NODES} is not supported by the kernels")
    buffer_bytes = int(os.environ.get("SYMMCOLL_WORKSPACE_BYTES", DEFAULT_BUFFER_BYTES[device.type]))
    geometry = Geometry(kernel_world, buffer_bytes, device.type, topo.nodes if spans else 1)
    layout, total = _layout(geometry)
    states = [s for s in declared() if not s.symmetric]
    signature = f"bytes={buffer_bytes} regions={[(n, o, b) for n, o, b, _ in layout]} {topo.signature}"
    bounded_rendezvous(group, "workspace creation", signature)
    transport_, regions = None, None
    ipc = device.type == "cuda" and os.environ.get("SYMMCOLL_MEMORY") == "ipc"
    if spans and device.type == "cuda" and not ipc:
        from .transport import allocate_nvshmem
        local, bases, peers, keepalive, transport_ = allocate_nvshmem(group, total, device,
                                                                      lambda r: topo.same_node(r, rank))
    elif ipc:
        from .cuda import allocate_cuda_ipc
        local, bases, peers, keepalive = allocate_cuda_ipc(group, total, device)
    elif debug_switches.SEPARATE_REGIONS and not spans:
        regions, keepalive = _separate_regions(group, layout, device)
    elif device.type == "cuda":
        from .cuda import allocate_cuda
        local, bases, peers, keepalive = allocate_cuda(group, total, device)
    else:
        from .emulated import allocate_emulated
        local, bases, peers, keepalive = allocate_emulated(group, total)
    if spans and transport_ is None:
        # Emulated nodes over memory every rank mapped (CPU; ranks sharing a GPU): only the transport
        # holds cross-node bases, the address tables get 0 (a fault if a kernel uses them).
        from .transport import emulated
        transport_ = emulated(bases, device)
        bases = [b if topo.same_node(r, rank) else 0 for r, b in enumerate(bases)]
        peers = [p if topo.same_node(r, rank) else None for r, p in enumerate(peers)]
    # ---- end of the node split ----
    if regions is None:  # the regions of the one allocation
        regions = {name: _region(name, local[offset:offset + nbytes], fill, [b + offset if b else 0 for b in bases],
                                 [None if p is None else p[offset:offset + nbytes] for p in peers], device)
                   for name, offset, nbytes, fill in layout}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    # Every fill is done everywhere before anybody writes to a peer.
    bounded_rendezvous(group, "workspace initialisation", signature)
    state = {s.name: torch.zeros(s.size(geometry), dtype=torch.int32, device=device) for s in states}
    # The error record must be readable by the host without synchronising: pinned host memory, which
    # kernels reach through unified addressing.
    status = torch.zeros(STATUS_INTS, dtype=torch.int32)
    if device.type == "cuda":
        status = status.pin_memory()
    status_device = None
    if debug_switches.STATUS_ON_DEVICE:  # (CPU: an ordinary tensor, so that CPU tests run the switch)
        status_device = torch.zeros(STATUS_INTS, dtype=torch.int32, device=device)
    return Workspace(group=group, group_name=group.group_name, rank=rank, world_size=world, device=device,
                     geometry=geometry, regions=regions, state=state, status=status,
                     max_spins=timeout_spins(device.type), _keepalive=keepalive,
                     topology=topo if spans else None, transport=transport_, status_device=status_device)


def _separate_regions(group, layout, device: torch.device) -> tuple[dict[str, SymmetricRegion], list]:
    """SYMMCOLL_DEBUG_SEPARATE_REGIONS: every region of ``layout`` its own symmetric allocation (how
    workspaces were built before 401756e), filled as ``create_workspace`` fills the one allocation."""
    if device.type == "cuda":
        from .cuda import allocate_cuda

        def allocate(nbytes):
            return allocate_cuda(group, nbytes, device)
    else:
        from .emulated import allocate_emulated

        def allocate(nbytes):
            return allocate_emulated(group, nbytes)
    regions, keepalive = {}, []
    for name, _, nbytes, fill in layout:
        local, bases, peers, handles = allocate(-(-max(nbytes, 1) // _ALIGN) * _ALIGN)
        regions[name] = _region(name, local[:nbytes], fill, bases, [p[:nbytes] for p in peers], device)
        keepalive += handles
    return regions, keepalive


def _region(name: str, view: torch.Tensor, fill: int, bases: list[int], peer_views: list, device) -> SymmetricRegion:
    """A region over this rank's bytes ``view`` (filled with int32 ``fill`` where nonzero), every rank's
    base address (0: not mapped here) in a device address table, and the peers' bytes as tensors here."""
    if fill:
        view[: view.numel() // 4 * 4].view(torch.int32).fill_(fill)
    table = torch.tensor(bases, dtype=torch.int64, device=device)
    return SymmetricRegion(name, view, table.data_ptr(), peer_views, table)


def _layout(geometry: Geometry) -> tuple[list[tuple[str, int, int, int]], int]:
    """(name, offset, bytes, fill) of every symmetric region, page-aligned, and the total bytes."""
    layout, offset = [], 0
    for spec in declared():
        if not spec.symmetric:
            continue
        nbytes = int(spec.size(geometry))
        layout.append((spec.name, offset, nbytes, spec.fill_int32))
        offset += -(-max(nbytes, 1) // _ALIGN) * _ALIGN
    return layout, offset
