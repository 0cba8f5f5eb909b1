"""The process group's own collectives ("nccl": NCCL on GPU, gloo on CPU): the same results, for what
no kernel takes (dtypes without a word type, world sizes above MAX_WORLD) and where the tuned table says
the backend is faster."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..errors import SymmcollMismatchError
from ..memory import capturing
from ..plan import BACKEND, Algorithm, Plan, register


def _reduce_op(plan: Plan):
    """(torch ReduceOp, divide afterwards): avg is native on NCCL only."""
    op = plan.request.reduce_op or "sum"
    if op == "avg" and dist.get_backend(plan.group) == "nccl":
        return dist.ReduceOp.AVG, False
    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN}[op], op == "avg"


# torch 2.13 renamed reduce_scatter_tensor and all_gather_into_tensor (the old names warn once per
# process, i.e. once per rank); older torch has only the old names.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

# torch's all_reduce is in place and symmcoll's returns a new tensor: copying x into it first cost 171 us of
# NCCL's 1193 at 256 MB on 4x H100 (results/2026-11-28-allreduce-backend-h100x4: 1364 through symmcoll), enough
# for auto to keep slower kernels of ours there. From SPLIT_FROM_BYTES the process group's all-reduce runs as
# what a ring all-reduce is, a reduce-scatter from x into my shard of out and an all-gather in place over
# out, with no copy (one more launch: not below tens of MB). NOT measured yet on a GPU; NCCL only (gloo
# takes it where a test asks: SPLIT_BACKENDS).
SPLIT_FROM_BYTES = 32 << 20
SPLIT_BACKENDS = ("nccl",)


def split_all_reduce(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether this call runs as reduce-scatter + all-gather (contiguous, divisible by the group)."""
    return (x.numel() * x.element_size() >= SPLIT_FROM_BYTES and x.numel() % plan.world == 0
            and x.is_contiguous() and out.is_contiguous() and dist.get_backend(plan.group) in SPLIT_BACKENDS)


def _all_reduce(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    reduce_op, divide = _reduce_op(plan)
    if split_all_reduce(plan, x, out):
        flat = out.view(-1)
        shard = flat.numel() // plan.world
        mine = flat[plan.rank * shard:(plan.rank + 1) * shard]
        reduce_scatter_single(mine, x.reshape(-1), op=reduce_op, group=plan.group)
        all_gather_single(flat, mine, group=plan.group)  # in place: my shard is already where it belongs
    else:
        out.copy_(x)
        dist.all_reduce(out, op=reduce_op, group=plan.group)
    if divide:
        out /= plan.world
    return out


def _reduce_scatter(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    reduce_op, divide = _reduce_op(plan)
    reduce_scatter_single(out, x, op=reduce_op, group=plan.group)
    if divide:
        out /= plan.world
    return out


def _all_gather(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # As bytes: gloo gathers no fp8, bool or complex tensors (out is contiguous: rank r's bytes are
    # the r-th 1/W of it).
    all_gather_single(out.reshape(-1).view(torch.uint8), x.reshape(-1).view(torch.uint8), group=plan.group)
    return out


def _broadcast(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.copy_(x)
    # As bytes: gloo broadcasts no fp8, bool or complex tensors.
    dist.broadcast(out.reshape(-1).view(torch.uint8), src=dist.get_global_rank(plan.group, plan.request.src),
                   group=plan.group)
    return out


def _all_to_all(plan: Plan, x: torch.Tensor, out: torch.Tensor | None, splits_dev: torch.Tensor | None = None):
    world = plan.world
    if splits_dev is not None:
        return _all_to_all_device_splits(plan, x, out, splits_dev)
    splits = plan.request.splits
    send = list(splits) if splits is not None else [x.shape[0] // world] * world
    if splits is None and (plan.cache.get("equal_splits_checked") or capturing(x.device)):
        # Equal splits: the counts were compared with the peers' on this plan's first call, or the call is
        # being captured into a CUDA graph, where no host read can happen: a graph replays the data
        # exchange alone (as torch's all_to_all_single, which compares nothing). Without this, every call
        # paid a counts exchange and a host read, and auto's NCCL choice for small all_to_all could not be
        # captured at all (2026-11-27, 4x H100: 390-650 us eager against NCCL's 12.5 in a graph). Under
        # auto, the descriptor handshake in front of this call (Plan.handshake) still compares every call's
        # shape; with algorithm="nccl" asked for by name, a later mismatch is the caller's, as with torch.
        recv = send
    else:
        recv = _exchange_counts(plan, send, x.device)
        if splits is None and recv == send:
            plan.cache["equal_splits_checked"] = True
    if splits is None and recv != send:
        # Equal splits: every peer must send as many rows as this rank does. Checked on the counts
        # every rank has just exchanged, so every rank raises before any data moves (otherwise the
        # backend raises on some ranks and waits forever on others).
        peer = next(s for s in range(world) if recv[s] != send[s])
        raise SymmcollMismatchError(f"all_to_all.{BACKEND}", plan.rank, peer, ["x.shape"],
                                    f"{send[peer]} rows for rank {peer} here, {recv[peer]} rows for this rank there")
    if out is None:
        out = torch.empty((sum(recv), *x.shape[1:]), dtype=x.dtype, device=x.device)
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    if row_bytes:  # as bytes: gloo moves no complex, bool or fp8 tensors
        dist.all_to_all_single(out.reshape(-1).view(torch.uint8), x.reshape(-1).view(torch.uint8),
                               output_split_sizes=[r * row_bytes for r in recv],
                               input_split_sizes=[s * row_bytes for s in send], group=plan.group)
    return out


def _exchange_counts(plan: Plan, send: list[int], device: torch.device) -> list[int]:
    """Every peer's row count for this rank (one exchange of the counts and one host read)."""
    send_t = torch.tensor(send, dtype=torch.int64, device=device)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t, group=plan.group)
    return recv_t.tolist()


def _all_to_all_device_splits(plan: Plan, x: torch.Tensor, out: torch.Tensor, splits_dev: torch.Tensor):
    """Device-side splits on the process group: read back to the host (the synchronisation the kernels
    avoid), clamped as the kernels clamp them, exchanged, and what is wrong raised afterwards (every rank
    takes part in the exchange first, so nobody is left waiting)."""
    from ..errors import SymmcollArgumentError
    wanted = [int(v) for v in splits_dev.tolist()]
    ends = [min(sum(max(w, 0) for w in wanted[:j + 1]), x.shape[0]) for j in range(len(wanted))]
    send = [end - (ends[j - 1] if j else 0) for j, end in enumerate(ends)]
    send_t = torch.tensor(send, dtype=torch.int64, device=x.device)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t, group=plan.group)
    received = torch.empty((int(recv_t.sum()), *x.shape[1:]), dtype=x.dtype, device=x.device)
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    if row_bytes:
        dist.all_to_all_single(received.reshape(-1).view(torch.uint8), x[:sum(send)].reshape(-1).view(torch.uint8),
                               output_split_sizes=[r * row_bytes for r in recv_t.tolist()],
                               input_split_sizes=[s * row_bytes for s in send], group=plan.group)
    kept = min(received.shape[0], out.shape[0])
    out[:kept].copy_(received[:kept])
    if min(wanted) < 0 or sum(max(w, 0) for w in wanted) > x.shape[0]:
        raise SymmcollArgumentError("all_to_all.nccl", plan.rank, "splits",
                                    f"splits (a device tensor) asks for {sum(wanted)} rows but x has {x.shape[0]} "
                                    f"rows, or holds a negative count: only the rows x holds were sent")
    if received.shape[0] > out.shape[0]:
        raise SymmcollArgumentError("all_to_all.nccl", plan.rank, "max_rows",
                                    f"max_rows = {out.shape[0]} is too small: {received.shape[0]} rows arrived in one "
                                    f"call; only the first {out.shape[0]} were written")
    return out, recv_t


for _op, _fn, _code in (("all_reduce", _all_reduce, 9), ("reduce_scatter", _reduce_scatter, 23),
                        ("all_gather", _all_gather, 32), ("all_to_all", _all_to_all, 41),
                        ("broadcast", _broadcast, 51)):
    register(Algorithm(_op, BACKEND, _code, "backend", _fn, "the process group's own collective (NCCL / gloo)"))
