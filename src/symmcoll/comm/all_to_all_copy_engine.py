"""all_to_all.copy_engine: the bandwidth variant. The copy engines move the data, in a staggered order
that keeps every rank's link busy with one peer at a time, and the local staging copy of the next step
overlaps the transfer of the current one.

The copy-engine probe (benchmarks/results/2026-11-22-probe) found that a copy engine pulling from one
peer reaches 337-363 GB/s, but four ranks each pulling from three peers at once get only 200-250 GB/s
per rank: an all-to-all must not have every rank read every peer at the same time. So the exchange goes
in W-1 steps; in step k rank r pulls from rank r+k, and is read only by rank r-k (a permutation: every
rank sends to one peer and receives from one peer per step)::

    rank r:  stage step 1:   x_r[chunk for r-1] --copy--> buf_r        (local)
             x_r[chunk r] --copy--> out_r[rows from r]                 (local)
             for k = 1 .. W-1:
               barrier kernel                                          (step k's chunks are staged everywhere)
               side stream:  buf_{r+k}[chunk for r] --copy engine--> out_r[rows from r+k]
               main stream:  stage step k+1: x_r[chunk for r-k-1] --copy--> buf_r
             join; barrier kernel (exit: nobody restages its buffer while a peer still copies from it)

Each step's chunk is staged while the previous step's chunk is in flight, so the staging copy (the one
local pass the input needs: it is not in symmetric memory) hides behind the link; on 2 ranks there is
one step, so its chunk is cut in SUBSTEPS parts to overlap the same way. The barriers are one-program
kernels carrying the call descriptor (graph-safe, bounded); the copies are stream operations between
fixed addresses, so the whole call can be captured in a CUDA graph.

Splits must be known on the host (equal or a list: copy sizes are host values); device-side splits run
``pull``. Chunks larger than the workspace move in rounds (``plan_rounds``: pieces of every chunk).
Traffic: each rank's received bytes over the link, once, by copy engines; its sent bytes copied once
locally. Costs W+1 barriers and 2W-1 copies per round: a large-message algorithm (tens of MB and up).
"""

from __future__ import annotations

import math

import torch

from ..plan import DEVICE_SPLITS, Algorithm, Plan, register
from .common import byte_part, on_side, side_stream
from .splits import plan_rounds, split_matrix

# Parts each step's chunk is cut into, by world size (2 ranks have one step: nothing to overlap it with
# unless it is cut). Untuned: to be measured on the GPU machine.
SUBSTEPS = {2: 2}


def _exclusive(values: list[int], upto: int, skip: int | None = None) -> int:
    return sum(v for i, v in enumerate(values[:upto]) if i != skip)


def _copy_engine(plan: Plan, x: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    ws, world, rank = plan.ws, plan.world, plan.rank
    matrix = split_matrix(plan, x)
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    received = [matrix[s][rank] for s in range(world)]
    if out is None:
        out = torch.empty((sum(received), *x.shape[1:]), dtype=x.dtype, device=x.device)
    nbytes = [[n * row_bytes for n in line] for line in matrix]
    if not any(map(any, nbytes)):
        return out  # nothing moves anywhere: every rank knows it, none launches
    src, dst = x.reshape(-1).view(torch.uint8), out.reshape(-1).view(torch.uint8)
    piece, rounds = plan_rounds(nbytes, ws.buffer_bytes, 16)
    sent, recv = nbytes[rank], [nbytes[s][rank] for s in range(world)]
    side = side_stream(plan, x.device)
    main = torch.cuda.current_stream(x.device) if side is not None else None
    substeps = SUBSTEPS.get(world, 1)

    for t in range(rounds):
        start = t * piece
        pieces = [[min(max(n - start, 0), piece) for n in line] for line in nbytes]  # this round's
        mine = pieces[rank]
        # Stage i = (step k, part p): staged before barrier i, pulled after it. Every rank has the same
        # stages, and both ends of a chunk cut it alike (from its length).
        stages = [(k, p) for k in range(1, world) for p in range(substeps)]

        def stage(i):
            k, p = stages[i]
            dest = (rank - k) % world
            a, n = byte_part(mine[dest], p, substeps)
            if n:
                at = _exclusive(mine, dest, skip=rank) + a
                ws.buffer[at:at + n].copy_(src[_exclusive(sent, dest) + start + a:][:n])

        def pull(i):
            k, p = stages[i]
            peer = (rank + k) % world
            theirs = pieces[peer]
            a, n = byte_part(theirs[rank], p, substeps)
            if n:
                at = _exclusive(theirs, rank, skip=peer) + a
                dst[_exclusive(recv, peer) + start + a:][:n].copy_(ws.peer_buffer(peer)[at:at + n])

        stage(0)
        if t == 0 and sent[rank]:
            dst[_exclusive(recv, rank):][:sent[rank]].copy_(src[_exclusive(sent, rank):][:sent[rank]])
        for i in range(len(stages)):
            plan.barrier()
            with on_side(side, main):
                pull(i)
            if i + 1 < len(stages):
                stage(i + 1)
        if side is not None:
            main.wait_stream(side)
        plan.barrier()  # exit: nobody restages its buffer while a peer still copies from it
    return out


def _host_splits(request, world: int) -> str | None:
    if request.splits == DEVICE_SPLITS:
        return "its copy sizes are host values (device-side splits run pull)"
    return None


register(Algorithm("all_to_all", "copy_engine", 43, "all_to_all_copy_engine", _copy_engine,
                   "copy-engine pulls in staggered steps (one peer per rank per step), staging overlapped", None,
                   accepts=_host_splits, instead="pull"))
