"""Symmetric workspaces: one per (process group, device), allocated once and reused by every call.

A workspace holds, on every rank of the group:
  * a data buffer of ``buffer_bytes`` (peers read and write it directly),
  * an int32 signal pad of ``SIGNAL_PAD_INTS`` slots, all zero between calls,
  * ``buffer_ptrs_dev`` / ``signal_pad_ptrs_dev``: int64 addresses of tables with one address per rank,
    which is all a kernel needs to reach any peer,
  * a small host-visible error record that kernels fill in when a wait times out.

``cuda.py`` builds it on ``torch.distributed._symmetric_memory``; ``emulated.py`` builds the same object
for CPU runs (files in /dev/shm mapped into every rank process). Kernels cannot tell them apart.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# Slot (pid, src) = pid * world + src: room for 1024 programs at world size 8.
MAX_PROGRAMS = 1024
SIGNAL_PAD_INTS = 8192

DEFAULT_BUFFER_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
# Rough cost of one spin iteration, to turn a timeout in seconds into a spin budget: a system-scope
# CAS on H200 takes about a microsecond; one interpreted iteration about 2 ms (measured on 2 cores).
SPINS_PER_SECOND = {"cuda": 1_000_000, "cpu": 500}
DEFAULT_TIMEOUT_S = 20.0


class SymmcollTimeoutError(RuntimeError):
    """A kernel stopped waiting for a peer's signal (the peer never arrived)."""

    def __init__(self, op: str, rank: int, peer: int):
        self.op, self.rank, self.peer = op, rank, peer
        super().__init__(
            f"symmcoll: {op} on rank {rank} timed out waiting for rank {peer} "
            f"(did rank {peer} call {op}? If it did, its own error names the rank it waited "
            f"for). The workspace is now inconsistent: call "
            f"symmcoll.reset() on every rank before the next collective."
        )


# Op codes written by kernels into the error record; the name is what the error message says.
OP_NAMES: dict[int, str] = {}


def register_op(name: str) -> int:
    """Give a kernel family a stable code for its timeout records."""
    code = len(OP_NAMES) + 1
    OP_NAMES[code] = name
    return code


@dataclass
class SymmetricRegion:
    """One symmetric allocation: this rank's bytes and the address of the per-rank address table."""

    local: torch.Tensor  # uint8
    ptrs_dev: int
    keepalive: list = field(default_factory=list, repr=False)
    # Every rank's bytes as a uint8 tensor of this process (peers' mapped memory), for copy-engine
    # copies (``Tensor.copy_``) straight from a peer.
    peers: list = field(default_factory=list, repr=False)


@dataclass
class Workspace:
    group: dist.ProcessGroup
    rank: int
    world_size: int
    device: torch.device
    buffer: torch.Tensor  # uint8, this rank's part of the symmetric buffer
    signal_pad: torch.Tensor  # int32, this rank's pad
    buffer_ptrs_dev: int
    signal_pad_ptrs_dev: int
    status: torch.Tensor  # int32[4], host-visible: flag, op, rank, peer
    max_spins: int
    _keepalive: list = field(default_factory=list, repr=False)
    broken: bool = False
    extra: dict = field(default_factory=dict, repr=False)

    def peer_buffer(self, peer: int) -> torch.Tensor:
        """``peer``'s data buffer (uint8), mapped into this process: a source or target for
        ``copy_`` (the copy engine on GPU)."""
        return self._keepalive[0].peers[peer]

    def region(self, name: str, nbytes: int, fill_int32: int = 0) -> SymmetricRegion:
        """A named extra symmetric region, created collectively on first use; for algorithms that keep
        state in symmetric memory between calls. Every int32 word starts as ``fill_int32`` on every
        rank before any rank can write to a peer's copy."""
        reg = self.extra.get(name)
        if reg is None:
            reg = _allocate(self.group, nbytes, self.device)
            if fill_int32 != 0:
                reg.local[: nbytes // 4 * 4].view(torch.int32).fill_(fill_int32)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                dist.barrier(self.group)
            self.extra[name] = reg
        if reg.local.numel() < nbytes:
            raise ValueError(f"region {name!r} has {reg.local.numel()} bytes, asked for {nbytes}")
        return reg

    @property
    def buffer_bytes(self) -> int:
        return self.buffer.numel()

    @property
    def status_ptr(self) -> int:
        return self.status.data_ptr()

    def local_state(self, name: str, numel: int) -> torch.Tensor:
        """A named zero-initialised int32 tensor on this rank's device, kept across calls (per-rank
        counters that kernels update themselves, so graph replays need no host work)."""
        state = self.extra.get(name)
        if state is None:
            state = torch.zeros(numel, dtype=torch.int32, device=self.device)
            self.extra[name] = state
        return state

    def capacity(self, dtype: torch.dtype) -> int:
        """How many elements of ``dtype`` fit in the buffer."""
        return self.buffer_bytes // dtype.itemsize

    def view(self, dtype: torch.dtype, numel: int, offset_bytes: int = 0) -> torch.Tensor:
        """This rank's buffer (from ``offset_bytes``) seen as ``numel`` elements of ``dtype``."""
        end = offset_bytes + numel * dtype.itemsize
        if end > self.buffer_bytes:
            raise ValueError(f"workspace holds {self.buffer_bytes} bytes, asked for {end}")
        return self.buffer[offset_bytes:end].view(dtype)

    def check(self) -> None:
        """Raise SymmcollTimeoutError if a kernel on this rank recorded a timed-out wait."""
        if self.broken:
            raise RuntimeError("symmcoll: workspace is broken by an earlier timeout; call symmcoll.reset()")
        if int(self.status[0]) != 0:
            op, rank, peer = (int(v) for v in self.status[1:4])
            self.broken = True
            raise SymmcollTimeoutError(OP_NAMES.get(op, f"op#{op}"), rank, peer)


_WORKSPACES: dict[tuple, Workspace] = {}


def _default_group(group):
    if group is not None:
        return group
    if not dist.is_initialized():
        raise RuntimeError("symmcoll: torch.distributed is not initialized (use symmcoll.launch or "
                           "torch.distributed.init_process_group first)")
    return dist.group.WORLD


def timeout_spins(device_type: str) -> int:
    seconds = float(os.environ.get("SYMMCOLL_TIMEOUT_S", DEFAULT_TIMEOUT_S))
    return max(1, int(seconds * SPINS_PER_SECOND[device_type]))


def get_workspace(group=None, device: torch.device | None = None, min_bytes: int = 0) -> Workspace:
    """The workspace of (group, device), created collectively on first use.

    Every rank of the group must make the first call for a (group, device) together (it is a
    rendezvous), as with any collective. Create it before capturing a CUDA graph.
    """
    group = _default_group(group)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    device = torch.device(device)
    backend = str(dist.get_backend(group))
    if device.type == "cpu" and "gloo" not in backend:
        raise ValueError(f"symmcoll: got a CPU tensor but the process group's backend is {backend!r}; "
                         f"pass a tensor on this rank's GPU")
    key = (group.group_name, str(device))
    ws = _WORKSPACES.get(key)
    if ws is None:
        default = int(os.environ.get("SYMMCOLL_WORKSPACE_BYTES", DEFAULT_BUFFER_BYTES[device.type]))
        ws = _create(group, device, max(default, min_bytes))
        _WORKSPACES[key] = ws
    ws.check()
    return ws


def _allocate(group, nbytes: int, device: torch.device) -> SymmetricRegion:
    if device.type == "cuda":
        from .cuda import allocate_cuda
        return allocate_cuda(group, nbytes, device)
    if device.type == "cpu":
        from .emulated import allocate_emulated
        return allocate_emulated(group, nbytes)
    raise ValueError(f"symmcoll: no symmetric memory for device type {device.type!r}")


def _create(group, device: torch.device, buffer_bytes: int) -> Workspace:
    buffer = _allocate(group, buffer_bytes, device)
    pad = _allocate(group, SIGNAL_PAD_INTS * 4, device)
    # The error record must be readable by the host without synchronising: pinned host memory,
    # which kernels reach through unified addressing.
    status = torch.zeros(4, dtype=torch.int32)
    if device.type == "cuda":
        status = status.pin_memory()
    return Workspace(
        group=group, rank=dist.get_rank(group), world_size=dist.get_world_size(group), device=device,
        buffer=buffer.local, signal_pad=pad.local.view(torch.int32),
        buffer_ptrs_dev=buffer.ptrs_dev, signal_pad_ptrs_dev=pad.ptrs_dev,
        status=status, max_spins=timeout_spins(device.type), _keepalive=[buffer, pad],
    )


def reset(group=None) -> None:
    """Drop the workspaces of ``group`` (all groups if None); the next call rebuilds them.

    Collective when followed by a call: every rank must reset together.
    """
    names = None if group is None else {group.group_name}
    for key in list(_WORKSPACES):
        if names is None or key[0] in names:
            _WORKSPACES.pop(key)


def workspaces() -> list[Workspace]:
    return list(_WORKSPACES.values())
