"""Emulated symmetric memory for CPU runs: one /dev/shm file per rank, mapped by every rank.

Each rank creates a zero-filled file for the workspace's allocation, the ranks agree on the names
through the process group's store, every rank maps every peer's file and builds its own address table
(the same file sits at different virtual addresses in different processes, exactly as CUDA IPC
mappings do), and each rank unlinks its file as soon as all ranks have mapped it. From then on nothing
is left in /dev/shm, even if a rank crashes; a crash between creation and unlinking is cleaned up by
the launcher, which removes every file carrying its prefix (``SYMMCOLL_SHM_PREFIX``). Every wait is a
bounded rendezvous (SYMMCOLL_TIMEOUT_S).
"""

from __future__ import annotations

import mmap
import os
import uuid

import torch
import torch.distributed as dist

from .rendezvous import bounded_rendezvous

SHM_DIR = "/dev/shm"
_PAGE = 4096


def shm_prefix() -> str:
    return os.environ.get("SYMMCOLL_SHM_PREFIX", "symmcoll")


def allocate_emulated(group, nbytes: int):
    """A zero-filled allocation of ``nbytes`` on every rank of ``group`` (collective): (this rank's
    bytes, every rank's base address in this process, every rank's bytes, what keeps them alive)."""
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    total = -(-max(nbytes, 1) // _PAGE) * _PAGE
    # Every rank makes a tag of its own; the names use rank 0's (agreed through the store).
    tag = f"{shm_prefix()}-{uuid.uuid4().hex[:12]}"
    from torch.distributed import distributed_c10d as c10d
    store = c10d._get_default_store()
    if rank == 0:
        store.set(f"symmcoll/{group.group_name}/shm-tag", tag)
    bounded_rendezvous(group, "workspace creation (shared-memory names)")
    tag = store.get(f"symmcoll/{group.group_name}/shm-tag").decode()
    paths = [os.path.join(SHM_DIR, f"{tag}-r{r}") for r in range(world)]

    fd = os.open(paths[rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, total)  # a fresh file reads as zeros
    finally:
        os.close(fd)
    bounded_rendezvous(group, "workspace creation (files created)")

    maps = []
    for path in paths:
        fd = os.open(path, os.O_RDWR)
        try:
            maps.append(mmap.mmap(fd, total))
        finally:
            os.close(fd)
    bounded_rendezvous(group, "workspace creation (files mapped)")
    os.unlink(paths[rank])

    views = [torch.frombuffer(m, dtype=torch.uint8)[:nbytes] for m in maps]
    bases = [v.data_ptr() for v in views]
    return views[rank], bases, views, [maps, views]


def leftover_files(prefix: str) -> list[str]:
    """Files in /dev/shm starting with ``prefix`` (for the launcher's clean-up and for tests)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [os.path.join(SHM_DIR, n) for n in names if n.startswith(prefix)]
