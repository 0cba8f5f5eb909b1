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

Where each part lives (the registry here; the rest in one module per concern, so each reads alone):
  __init__.py          the registry callers go through: ``get_workspace`` (one per (group, device),
                       made on first use), ``reset``, ``on_reset``, ``workspaces``, ``default_group``;
                       and the package's public names, re-exported from the modules below
  workspace.py         ``Workspace`` and ``SymmetricRegion``: what a made workspace holds; ``check``
                       turns the error record kernels wrote into the error the caller sees
  creation.py          ``create_workspace``: every declared region laid out in one allocation, the checks
                       and rendezvous around it, the choice of allocator; ``capturing``
  rendezvous.py        ``timeout_seconds`` (SYMMCOLL_TIMEOUT_S) and ``bounded_rendezvous``, numbered per
                       group in generations that ``reset`` restarts
  regions.py           the typed region registry; layout.py: sizes every layer agrees on
  cuda.py              allocates through ``torch.distributed._symmetric_memory`` (or CUDA IPC);
  emulated.py          the same for CPU runs (files in /dev/shm mapped into every rank process).
                       Kernels cannot tell the two apart.
  transport.py         reaches the ranks of other nodes when a group spans nodes
  persistent_state.py  device memory kept across calls, made outside any CUDA-graph pool
  torch_buffers.py     the symmetric allocations torch's own symm_mem ops need (the benchmark's
                       baselines, the link measurement, the models' torch comparison); symmcoll's
                       kernels never use them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import topology
from ..errors import SymmcollError, SymmcollMismatchError, SymmcollTimeoutError, not_initialized  # noqa: F401
from .creation import DEFAULT_BUFFER_BYTES, SIGNAL_PAD, capturing, create_workspace  # noqa: F401
from .layout import ANNOUNCE_SLOT, MAX_PROGRAMS, MAX_WORLD, SIGNAL_PAD_INTS  # noqa: F401
from .persistent_state import persistent
from .regions import BUFFER, Geometry, RegionSpec, declare, declared  # noqa: F401
from .rendezvous import (DEFAULT_TIMEOUT_S, SPINS_PER_SECOND, bounded_rendezvous, new_generation,  # noqa: F401
                         timeout_seconds, timeout_spins)
from .workspace import STATUS_INTS, STATUS_REPORTS, SymmetricRegion, Workspace

__all__ = ["Workspace", "SymmetricRegion", "get_workspace", "reset", "workspaces", "timeout_seconds",
           "MAX_PROGRAMS", "MAX_WORLD", "SIGNAL_PAD_INTS", "RegionSpec", "declare", "STATUS_INTS", "on_reset",
           "default_group", "bounded_rendezvous", "persistent"]

_WORKSPACES: dict[tuple, Workspace] = {}


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
            ws = persistent(device, lambda: create_workspace(group, torch.device(device)))
        except SymmcollTimeoutError as exc:
            if not op:
                raise
            raise SymmcollTimeoutError(op, exc.rank, exc.peers, f"{exc.detail} of {exc.op}") from None
        _WORKSPACES[key] = ws
    ws.check()
    return ws


_RESET_HOOKS: list = []


def on_reset(hook) -> None:
    """Call ``hook()`` whenever workspaces are dropped (the plan cache holds workspaces)."""
    _RESET_HOOKS.append(hook)


def reset(group=None) -> None:
    """Drop the workspaces of ``group`` (all groups if None); the next call rebuilds them.

    Collective when followed by a call: every rank must reset together."""
    names = None if group is None else {group.group_name}
    new_generation(None if group is None else group.group_name)
    for key in list(_WORKSPACES):
        if names is None or key[0] in names:
            _WORKSPACES.pop(key)
    topology.forget()
    for hook in _RESET_HOOKS:
        hook()


def workspaces() -> list[Workspace]:
    return list(_WORKSPACES.values())
