"""The link limit, measured in the same run as the collectives (rank side, CUDA only).

Every rank pulls ``nbytes`` from the next rank's symmetric buffer into local memory, all ranks at once
(so every GPU's links carry traffic in both directions, as during a collective), two ways:
  * copy engine: ``local.copy_(peer_view)`` (a device-to-device memcpy over NVLink, no SMs);
  * SM pull: a Triton kernel of plain loads from the peer address and stores to local memory.
Each is timed with CUDA events (median of a few repetitions); the reported figure is the slowest
rank's GB/s. A collective that moves b bytes per rank over its links cannot finish before b / that.
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from ..launcher import launch
from ..memory.torch_buffers import symmetric_view
from .timing import event_times_us

REPEATS = 5
PULL_BLOCK = 8192


@triton.jit
def pull_kernel(src_ptr, dst_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def pull(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst <- src (``src`` may be a peer's memory) with SM loads and stores."""
    numel = src.numel()
    launch(pull_kernel, (triton.cdiv(numel, PULL_BLOCK),), (src, dst, numel), dict(BLOCK=PULL_BLOCK, num_warps=8))


def peer_pull_gbps(group, nbytes: int) -> tuple[float | None, float | None, str | None]:
    """(copy engine GB/s, SM pull GB/s, note) on this rank; collective."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device())
    numel = nbytes // 2
    mine, handle = symmetric_view(group, device, numel, torch.bfloat16)
    mine.fill_(rank)
    torch.cuda.synchronize()
    dist.barrier(group)
    peer = handle.get_buffer((rank + 1) % world, (numel,), torch.bfloat16)
    local = torch.empty(numel, dtype=torch.bfloat16, device=device)

    copy_engine = _gbps(lambda: local.copy_(peer), nbytes, group)
    notes = []
    if not bool((local == (rank + 1) % world).all()):
        notes.append("copy-engine pull read wrong data")
    try:
        sm_pull = _gbps(lambda: pull(peer, local), nbytes, group)
    except Exception as exc:  # noqa: BLE001 - the copy-engine figure is still worth reporting
        sm_pull, notes = None, notes + [f"SM pull failed: {type(exc).__name__}: {exc}"]
    dist.barrier(group)  # nobody reuses the buffer while a peer still reads it
    return copy_engine, sm_pull, "; ".join(notes) or None


def _gbps(copy, nbytes: int, group) -> float:
    copy()  # warm-up (and the Triton compile)
    return nbytes / (statistics.median(event_times_us(copy, REPEATS, group=group)) * 1e-6) / 1e9
