"""Emulated symmetric memory for CPU runs: one /dev/shm file per rank, mapped by every rank.

Each rank creates a zero-filled file per region (data buffer, signal pad, ...), the ranks agree on the
names over the (gloo) group, every rank maps every peer's file and builds its own address tables (the
same file sits at different virtual addresses in different processes, exactly as CUDA IPC mappings
do), and each rank unlinks its file as soon as all ranks have mapped it. From then on nothing is left in
/dev/shm, even if a rank crashes; a crash between creation and unlinking is cleaned up by the launcher,
which removes every file carrying its prefix (``SYMMCOLL_SHM_PREFIX``).
"""

from __future__ import annotations

import mmap
import os
import uuid

import torch
import torch.distributed as dist

from . import SymmetricRegion

SHM_DIR = "/dev/shm"
_PAGE = 4096


def shm_prefix() -> str:
    return os.environ.get("SYMMCOLL_SHM_PREFIX", "symmcoll")


def allocate_emulated(group, nbytes: int) -> SymmetricRegion:
    """A zero-filled region of ``nbytes`` on every rank of ``group`` (collective)."""
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    total = -(-max(nbytes, 1) // _PAGE) * _PAGE

    tag = [f"{shm_prefix()}-{uuid.uuid4().hex[:12]}" if rank == 0 else None]
    dist.broadcast_object_list(tag, src=dist.get_global_rank(group, 0), group=group)
    paths = [os.path.join(SHM_DIR, f"{tag[0]}-r{r}") for r in range(world)]

    fd = os.open(paths[rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, total)  # a fresh file reads as zeros
    finally:
        os.close(fd)
    dist.barrier(group)

    maps = []
    for path in paths:
        fd = os.open(path, os.O_RDWR)
        try:
            maps.append(mmap.mmap(fd, total))
        finally:
            os.close(fd)
    dist.barrier(group)
    os.unlink(paths[rank])

    views = [torch.frombuffer(m, dtype=torch.uint8)[:nbytes] for m in maps]
    table = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64)
    return SymmetricRegion(local=views[rank], ptrs_dev=table.data_ptr(), keepalive=[maps, views, table],
                           peers=views)


def leftover_files(prefix: str) -> list[str]:
    """Files in /dev/shm starting with ``prefix`` (for the launcher's clean-up and for tests)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [os.path.join(SHM_DIR, n) for n in names if n.startswith(prefix)]
