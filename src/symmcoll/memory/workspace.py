"""What a workspace is, once made: its regions, address tables, state and the error record it reads.

A ``Workspace`` holds this rank's view of one symmetric allocation laid out as every declared region
(``SymmetricRegion``: this rank's bytes, the int64 address of the per-rank address table kernels take,
the peers' bytes as tensors here), per-rank state tensors (launch-epoch tables), and the host-visible
error record kernels fill in when a wait fails; ``check`` turns that record into the error a caller
sees. It is apart from how a workspace comes to exist (creation.py: the collective allocation) and
from the per-(group, device) registry callers go through (``symmcoll.memory.get_workspace``), since
every launch reads a workspace and only the first call of a group makes one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..errors import SymmcollError, argument_error_from_record, error_from_record
from .layout import ANNOUNCE_SLOT
from .regions import Geometry

# Error record (language/signals.py): words 0..5 a failure that breaks the workspace, 6..7 the
# interpreter's wait clock (launcher), 8..13 argument reports.
STATUS_INTS = 16
STATUS_REPORTS = 8


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
