"""Host-side waits of the workspace, all bounded by SYMMCOLL_TIMEOUT_S.

``timeout_seconds`` reads the one timeout every wait honours (host rendezvous here, the kernels' spin
budgets through ``timeout_spins``, the launcher's watchdog, the launch helper's process timeout).
``bounded_rendezvous`` is the store-based check that every rank of a group reached the same point with
the same value, naming the ranks that did not arrive; the allocators (cuda.py, emulated.py) and
creation.py use it. It is a module of its own because its numbering (generations and sequence numbers
per group) is the one piece of state that ``symmcoll.memory.reset`` must restart beside dropping the
workspaces (``new_generation``).
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist

from ..errors import SymmcollMismatchError, SymmcollTimeoutError

# Spins per second of the fastest wait, to turn a timeout in seconds into a spin budget that gives up no
# sooner than SYMMCOLL_TIMEOUT_S. GPU: a sentinel poll of local slots spins in about 0.45 us (H100, two
# ranks sharing it: a budget of 3e6 spins ran out after 1.3 s, benchmarks/results/2026-11-24-random-calls-
# h100), so a peer still compiling for 1.4 s was reported as lost; slower spins (a system-scope CAS, a
# poll over NVLink, ~1 us) wait up to ~2.5x longer than asked. CPU: one interpreted iteration about 2 ms
# (measured on 2 cores).
SPINS_PER_SECOND = {"cuda": 2_500_000, "cpu": 500}
DEFAULT_TIMEOUT_S = 20.0

# Host-side rendezvous are numbered per group: (generation, sequence number). Every rank counts the
# same sequence as long as the ranks make the same calls; after a failure they may not have (a rank
# absent from a workspace creation skipped its rendezvous), so ``reset`` starts a new generation and
# the numbering of every rank starts again from the same point. Keys of older generations are never
# looked at again, so a stale key cannot let a rank pass a rendezvous its peers have not reached.
_RESETS_ALL = 0  # reset() of every group
_RESETS: dict[str, int] = {}  # reset(group) per group name
_RENDEZVOUS_SEQ: dict[str, int] = {}


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


def new_generation(group_name: str | None) -> None:
    """Restart the numbering of ``group_name``'s rendezvous (every group's if None): ``reset`` on every
    rank, so that all ranks count from the same point again."""
    global _RESETS_ALL
    if group_name is None:
        _RESETS_ALL += 1
        _RENDEZVOUS_SEQ.clear()
    else:
        _RESETS[group_name] = _RESETS.get(group_name, 0) + 1
        _RENDEZVOUS_SEQ.pop(group_name, None)
