"""Emulated symmetric memory for CPU runs: one /dev/shm file per rank, mapped by every rank.

Each rank creates a zero-filled file (signal pad first, then the data buffer), the ranks agree on the
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

from . import SIGNAL_PAD_INTS, Workspace, timeout_spins

SHM_DIR = "/dev/shm"
_PAGE = 4096


def shm_prefix() -> str:
    return os.environ.get("SYMMCOLL_SHM_PREFIX", "symmcoll")


def create_emulated_workspace(group, buffer_bytes: int) -> Workspace:
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    pad_bytes = -(-SIGNAL_PAD_INTS * 4 // _PAGE) * _PAGE
    buffer_bytes = -(-buffer_bytes // _PAGE) * _PAGE
    total = pad_bytes + buffer_bytes

    tag = [f"{shm_prefix()}-{uuid.uuid4().hex[:12]}" if rank == 0 else None]
    dist.broadcast_object_list(tag, src=dist.get_global_rank(group, 0), group=group)
    paths = [os.path.join(SHM_DIR, f"{tag[0]}-r{r}") for r in range(world)]

    fd = os.open(paths[rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, total)  # a fresh file reads as zeros: pads start at 0
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

    views = [torch.frombuffer(m, dtype=torch.uint8) for m in maps]
    pads = [v[:pad_bytes].view(torch.int32)[:SIGNAL_PAD_INTS] for v in views]
    bufs = [v[pad_bytes:] for v in views]
    buffer_table = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    pad_table = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)
    return Workspace(
        group=group, rank=rank, world_size=world, device=torch.device("cpu"),
        buffer=bufs[rank], signal_pad=pads[rank],
        buffer_ptrs_dev=buffer_table.data_ptr(), signal_pad_ptrs_dev=pad_table.data_ptr(),
        status=torch.zeros(4, dtype=torch.int32), max_spins=timeout_spins("cpu"),
        _keepalive=[maps, views, buffer_table, pad_table],
    )


def leftover_files(prefix: str) -> list[str]:
    """Files in /dev/shm starting with ``prefix`` (for the launcher's clean-up and for tests)."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return [os.path.join(SHM_DIR, n) for n in names if n.startswith(prefix)]
