"""Symmetric workspaces: one per (process group, device), allocated once, up front, and reused.

A workspace holds, on every rank of the group, one symmetric allocation laid out as every declared
region (``regions.py``: the shared data buffer, the int32 signal pad, each algorithm's staging and slot
regions), with one address table per region (``region(name).ptrs_dev``: the int64 address of a table
of per-rank addresses, all a kernel needs to reach any peer), per-rank state tensors (launch-epoch
tables), and a small host-visible error record that kernels fill in when a wait fails.
``kernel_args`` is the tuple every kernel takes first: (signal pads, error record, wait budget, rank).

Creating a workspace is collective. Every host-side wait in it is bounded by ``SYMMCOLL_TIMEOUT_S``
(a store-based check that every rank arrived, naming the ranks that did not) and it refuses to run
during CUDA-graph capture: make one call of any symmcoll op before capturing.

``cuda.py`` allocates through ``torch.distributed._symmetric_memory``; ``emulated.py`` builds the same
thing for CPU runs (files in /dev/shm mapped into every rank process). Kernels cannot tell them apart.
``torch_buffers.py`` keeps the symmetric allocations torch's own symm_mem ops need (the benchmark's
baselines, the link measurement, the models' torch comparison); symmcoll's kernels never use them.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .. import debug_switches, topology
from ..errors import (SymmcollError, SymmcollMismatchError, SymmcollTimeoutError, argument_error_from_record,
                      error_from_record, not_initialized)
from .layout import ANNOUNCE_SLOT, MAX_PROGRAMS, MAX_WORLD, SIGNAL_PAD_INTS
from .persistent_state import persistent
from .regions import BUFFER, Geometry, RegionSpec, declare, declared

__all__ = ["Workspace", "SymmetricRegion", "get_workspace", "reset", "workspaces", "timeout_seconds",
           "MAX_PROGRAMS", "MAX_WORLD", "SIGNAL_PAD_INTS", "RegionSpec", "declare", "STATUS_INTS", "on_reset",
           "default_group", "bounded_rendezvous", "persistent"]

DEFAULT_BUFFER_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
# Spins per second of the fastest wait, to turn a timeout in seconds into a spin budget that gives up no
# sooner than SYMMCOLL_TIMEOUT_S. GPU: a sentinel poll of local slots spins in about 0.45 us (H100, two
# ranks sharing it: a budget of 3e6 spins ran out after 1.3 s, benchmarks/results/2026-11-24-random-calls-
# h100), so a peer still compiling for 1.4 s was reported as lost; slower spins (a system-scope CAS, a
# poll over NVLink, ~1 us) wait up to ~2.5x longer than asked. CPU: one interpreted iteration about 2 ms
# (measured on 2 cores).
SPINS_PER_SECOND = {"cuda": 2_500_000, "cpu": 500}
DEFAULT_TIMEOUT_S = 20.0
# Error record (language/signals.py): words 0..5 a failure that breaks the workspace, 6..7 the
# interpreter's wait clock (launcher), 8..13 argument reports.
STATUS_INTS = 16
STATUS_REPORTS = 8
_ALIGN = 4096

SIGNAL_PAD = declare(RegionSpec(
    "signal_pad", "workspace", lambda g: SIGNAL_PAD_INTS * 4,
    "barrier slots are written only by signals (CAS 0 -> descriptor) and emptied by the waiter; "
    "announce slots by program 0 of each call"))


def timeout_seconds() -> float:
    value = os.environ.get("SYMMCOLL_TIMEOUT_S", str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"SYMMCOLL_TIMEOUT_S must be a number of seconds, got {value!r}") from None
    if seconds <= 0:
        raise ValueError(f"SYMMCOLL_TIMEOUT_S must be > 0, got {value!r}")
    return seconds


def timeout_spins(device_type: str) -> int:
    return max(1, int(timeout_seconds() * SPINS_PER_SECOND[device_type]))


@dataclass
class SymmetricRegion:
    """One region of the workspace: this rank's bytes, the address table kernels take, and every
    rank's bytes as tensors of this process (peers' mapped memory: sources or targets for copy_,
    the copy engine on GPU)."""

    name: str
    local: torch.Tensor  # uint8
    ptrs_dev: int
    peers: list = field(default_factory=list, repr=False)
    table: torch.Tensor | None = field(default=None, repr=False)  # keeps ptrs_dev alive


@dataclass
class Workspace:
    group: dist.ProcessGroup
    group_name: str
    rank: int
    world_size: int
    device: torch.device
    geometry: Geometry
    regions: dict[str, SymmetricRegion]
    state: dict[str, torch.Tensor]
    status: torch.Tensor  # int32[STATUS_INTS], host-visible error record
    max_spins: int
    _keepalive: list = field(default_factory=list, repr=False)
    broken: bool = False
    reports_raised: int = 0  # argument reports already raised (the kernels only ever count up)
    # A group that spans nodes (symmcoll.topology): address tables map only this node's ranks, and the
    # transport (memory/transport.py) reaches the others. None within one node.
    topology: object = None
    transport: object = None
    # SYMMCOLL_DEBUG_STATUS_ON_DEVICE: the record the kernels write and poll, in device memory (the host
    # record above then stays clean: ``device_record`` reads this one). None otherwise.
    status_device: torch.Tensor | None = None

    def __post_init__(self):
        self.buffer = self.regions["buffer"].local
        self.buffer_ptrs_dev = self.regions["buffer"].ptrs_dev
        self.signal_pad = self.regions["signal_pad"].local.view(torch.int32)
        self.signal_pad_ptrs_dev = self.regions["signal_pad"].ptrs_dev
        self.status_ptr = (self.status if self.status_device is None else self.status_device).data_ptr()
        self.status_view = self.status.numpy()  # host reads of the error record without a tensor op
        # What every kernel takes first, built once.
        self.kernel_args = (self.signal_pad_ptrs_dev, self.status_ptr, self.max_spins, self.rank)

    def region(self, name: str) -> SymmetricRegion:
        try:
            return self.regions[name]
        except KeyError:
            raise KeyError(f"no region {name!r} in this workspace (declared: {sorted(self.regions)}); "
                           f"regions are declared at import by their owner module") from None

    def local_state(self, name: str) -> torch.Tensor:
        return self.state[name]

    def peer_buffer(self, peer: int) -> torch.Tensor:
        return self.regions["buffer"].peers[peer]

    @property
    def buffer_bytes(self) -> int:
        return self.buffer.numel()

    def capacity(self, dtype: torch.dtype) -> int:
        """How many elements of ``dtype`` fit in the shared buffer."""
        return self.buffer_bytes // dtype.itemsize

    def check(self) -> None:
        """Raise what a kernel of this rank recorded: a failure (timeout or mismatched call) once, after
        which the workspace is broken until ``symmcoll.reset()``; or an argument report (an output bound
        too small, device-side splits or routing that cannot be right: SymmcollArgumentError) once per
        report, the workspace staying usable."""
        if self.broken:
            raise SymmcollError("symmcoll: the workspace is broken by an earlier failure; call "
                                "symmcoll.reset() on every rank before the next call")
        record = self.status_view
        if record[STATUS_REPORTS] != self.reports_raised and record[0] == 0:
            new = int(record[STATUS_REPORTS]) - self.reports_raised
            self.reports_raised = int(record[STATUS_REPORTS])
            raise argument_error_from_record([int(v) for v in record], new)
        if record[0] != 0:
            self.broken = True
            record = [int(v) for v in self.status.tolist()]
            peer = record[3]
            # Across nodes: kernels of a node-local phase number ranks within the node (and announce
            # there); the cross-node kernels use group ranks and announce nothing.
            node_local = self.topology is not None and record[2] != self.rank
            announced = 0
            if 0 <= peer < self.geometry.world_size and (self.topology is None or node_local):
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                announced = int(self.signal_pad[ANNOUNCE_SLOT + peer])
                if record[1] != 2 and announced == record[4]:
                    # The peer waited for is in this call too, stuck behind another rank (a tree's
                    # neighbour, whose own wait failed): name a rank whose announced call differs.
                    peer, announced = self._other_caller(peer, record[4], record[2])
                    record[3] = peer
            if node_local:
                first = self.topology.first_rank(self.topology.node_of(self.rank))
                record[2], record[3] = record[2] + first, peer + first
            peer_global = dist.get_global_rank(self.group, record[3]) if 0 <= record[3] < self.world_size else None
            raise error_from_record(record, announced, peer_global)

    def device_record(self) -> list[int]:
        """The error record the kernels see, read after a synchronisation (the one of
        SYMMCOLL_DEBUG_STATUS_ON_DEVICE where it is set, else the host record)."""
        if self.status_device is None:
            return [int(v) for v in self.status.tolist()]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return [int(v) for v in self.status_device.tolist()]

    def _other_caller(self, peer: int, desc: int, me: int) -> tuple[int, int]:
        """(a rank whose last announced call is not ``desc``, its descriptor), in the numbering of the
        kernel that recorded (``me``: its rank); (``peer``, ``desc``) if every rank announced ``desc``
        (then nobody called differently: a timeout)."""
        for other in range(self.geometry.world_size):
            announced = int(self.signal_pad[ANNOUNCE_SLOT + other])
            if other != me and announced not in (0, desc):
                return other, announced
        return peer, desc


_WORKSPACES: dict[tuple, Workspace] = {}
# Host-side rendezvous are numbered per group: (generation, sequence number). Every rank counts the
# same sequence as long as the ranks make the same calls; after a failure they may not have (a rank
# absent from a workspace creation skipped its rendezvous), so ``reset`` starts a new generation and
# the numbering of every rank starts again from the same point. Keys of older generations are never
# looked at again, so a stale key cannot let a rank pass a rendezvous its peers have not reached.
_RESETS_ALL = 0  # reset() of every group
_RESETS: dict[str, int] = {}  # reset(group) per group name
_RENDEZVOUS_SEQ: dict[str, int] = {}


def capturing(device: torch.device) -> bool:
    """Whether work on ``device`` is being captured into a CUDA graph now: no host read, synchronisation
    or new workspace may happen (a graph replays device work only)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def default_group(group):
    if group is not None:
        return group
    if not dist.is_initialized():
        raise not_initialized()
    return dist.group.WORLD


def get_workspace(group=None, device: torch.device | None = None, op: str = "") -> Workspace:
    """The workspace of (group, device), created collectively on first use.

    Every rank of the group must make its first call for a (group, device) together (it is a
    rendezvous, bounded by SYMMCOLL_TIMEOUT_S). Not during CUDA-graph capture. ``op``: the call that
    needs it (named by a failed creation's error instead of the creation step)."""
    group = default_group(group)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    key = (group.group_name, device)
    ws = _WORKSPACES.get(key)
    if ws is None:
        try:
            # kept until reset(): made outside any CUDA-graph pool (persistent_state.py)
            ws = persistent(device, lambda: _create(group, torch.device(device)))
        except SymmcollTimeoutError as exc:
            if not op:
                raise
            raise SymmcollTimeoutError(op, exc.rank, exc.peers, f"{exc.detail} of {exc.op}") from None
        _WORKSPACES[key] = ws
    ws.check()
    return ws


def bounded_rendezvous(group, what: str, value: str = "") -> None:
    """Wait until every rank of ``group`` reached this point (through the process group's store),
    at most SYMMCOLL_TIMEOUT_S: raise SymmcollTimeoutError naming the ranks that did not arrive, or
    SymmcollMismatchError if they arrived with a different ``value`` (e.g. another workspace size)."""
    from torch.distributed import distributed_c10d as c10d

    name = group.group_name
    seq = _RENDEZVOUS_SEQ.get(name, 0) + 1
    _RENDEZVOUS_SEQ[name] = seq
    store = c10d._get_default_store()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    generation = f"{_RESETS_ALL}.{_RESETS.get(name, 0)}"
    keys = [f"symmcoll/{name}/{generation}/{seq}/{r}" for r in range(world)]
    store.set(keys[rank], value)
    seconds = timeout_seconds()
    try:
        store.wait(keys, datetime.timedelta(seconds=seconds))
    except Exception:  # noqa: BLE001 - the store says only that it timed out: find out who is missing
        missing = [r for r in range(world) if not store.check([keys[r]])]
        if not missing:
            raise
        raise SymmcollTimeoutError(what, rank, missing,
                                   detail=f"after {seconds:g} s (SYMMCOLL_TIMEOUT_S) at the host-side "
                                          f"rendezvous") from None
    values = [store.get(k).decode() for k in keys]
    for r, v in enumerate(values):
        if v != value:
            raise SymmcollMismatchError(what, rank, r, ["workspace"], f"{value!r} here, {v!r} there")


def _create(group, device: torch.device) -> Workspace:
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
    workspaces were built before 401756e), filled as ``_create`` fills the one allocation."""
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


_RESET_HOOKS: list = []


def on_reset(hook) -> None:
    """Call ``hook()`` whenever workspaces are dropped (the plan cache holds workspaces)."""
    _RESET_HOOKS.append(hook)


def reset(group=None) -> None:
    """Drop the workspaces of ``group`` (all groups if None); the next call rebuilds them.

    Collective when followed by a call: every rank must reset together."""
    global _RESETS_ALL
    names = None if group is None else {group.group_name}
    if names is None:
        _RESETS_ALL += 1
        _RENDEZVOUS_SEQ.clear()
    else:
        _RESETS[group.group_name] = _RESETS.get(group.group_name, 0) + 1
        _RENDEZVOUS_SEQ.pop(group.group_name, None)
    for key in list(_WORKSPACES):
        if names is None or key[0] in names:
            _WORKSPACES.pop(key)
    topology.forget()
    for hook in _RESET_HOOKS:
        hook()


def workspaces() -> list[Workspace]:
    return list(_WORKSPACES.values())
