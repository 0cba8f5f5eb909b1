"""MoE dispatch and combine: symmcoll against NCCL and torch, in one run (GPU machine).

    PYTHONPATH=src python3 benchmarks/moe_bench.py --world-size 2 --out $OUT/moe.json
        [--tokens 128 1024 4096] [--hidden 4096 7168] [--experts 8 64] [--topk 2 8] [--device cuda|cpu]

Per case (T tokens per rank, hidden H, E experts, top-k; bf16; random distinct experts per token, seeded
by rank) and implementation:

* ``symmcoll``: ``moe_dispatch`` (pull) and ``moe_combine`` (push), timed as CUDA-graph replays (10 calls
  per graph) and eagerly;
* ``nccl``: ``all_to_all_single`` with the counts exchanged first and read back to the host (the
  ``.tolist()`` every user of it pays), gather/scatter around it (``symmcoll.reference``); eager only
  (a host synchronisation cannot be captured);
* ``torch_vdev``: ``torch.ops.symm_mem.all_to_all_vdev_2d`` on NVSHMEM symmetric memory (rows sorted by
  expert first, one row per (token, expert): its traffic is per slot, not per token and rank), and
  ``all_to_all_vdev_2d_offset`` back for the combine; where this torch and machine run it (else a note).

Every implementation is checked against the oracle (``reference.moe_dispatch`` / ``moe_combine``) before
and after timing: ``wrong`` counts wrong elements (dispatch: the received rows, laid out by local expert
for symmcoll and nccl; torch's layout is compared as a multiset of rows per local expert; combine: the
result). Times are the slowest rank's median (us); ``gbps`` = bytes each rank sends to other ranks
(averaged over ranks: dispatch one row per token and remote owning rank, combine one row per remote
slot) / time. Results go to one JSON file with provenance (git sha, versions, GPUs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch, reference
from symmcoll.bench.plan import TimingPlan
from symmcoll.bench.provenance import collect
from symmcoll.bench.timing import CapturedCalls, time_eager, time_graph

# 24 cases x 3 implementations x 2 phases per world size: a second per timing keeps a world size
# within one 10-minute GPU call.
PLAN = TimingPlan(mode="graph", warmup=3, iters=30, min_iters=10, calls_per_graph=10, seconds_per_case=1.0)


def _inputs(tokens_n, hidden, experts, k, rank, device):
    """Rank- and token-coded rows (exact in bf16), random distinct experts per token, dyadic weights."""
    i = torch.arange(tokens_n * hidden, device=device).reshape(tokens_n, hidden)
    tokens = ((i * 7 + rank * 5) % 9 - 4).float()
    tokens[:, 0], tokens[:, 1] = rank, torch.arange(tokens_n, device=device) % 128
    rng = random.Random(1234 + rank)
    ids = torch.tensor([rng.sample(range(experts), k) for _ in range(tokens_n)], device=device)
    weights = torch.tensor([0.5, 0.25, 1.0, 2.0, 0.125, 0.75, 1.5, 0.375][:k], device=device).repeat(tokens_n, 1)
    return tokens.to(torch.bfloat16), ids, weights


def _sent_bytes(ids, experts, world, rank, row_bytes):
    """(dispatch, combine) bytes this rank's tokens move to or from other ranks."""
    owner = ids // (experts // world)
    ranks = torch.stack([(owner == d).any(dim=1) for d in range(world) if d != rank], dim=1) if world > 1 else None
    dispatch = int(ranks.sum()) * row_bytes if ranks is not None else 0
    return dispatch, int((owner != rank).sum()) * row_bytes


class Symmcoll:
    name, graph = "symmcoll", True

    def __init__(self, tokens, ids, weights, experts):
        self.tokens, self.ids, self.weights, self.experts = tokens, ids, weights, experts
        self.handle = None

    def dispatch(self):
        self.recv, self.counts, self.handle = symmcoll.moe_dispatch(self.tokens, self.ids, self.experts)
        return self.recv, self.counts, self.handle.row_origin

    def set_expert_out(self, expert_out):
        self.expert_out = expert_out

    def combine(self):
        return symmcoll.moe_combine(self.expert_out, self.weights, self.handle)


class Nccl(Symmcoll):
    """all_to_all_single with host-side counts (symmcoll.reference): the baseline (not capturable)."""
    name, graph = "nccl", False

    def dispatch(self):
        self.recv, self.counts, self.origin, _ = reference.moe_dispatch(self.tokens, self.ids, self.experts)
        return self.recv, self.counts, self.origin

    def combine(self):
        return reference.moe_combine(self.expert_out, self.weights, self.ids, self.origin, self.experts)


class TorchVdev(Symmcoll):
    """torch's all_to_all_vdev_2d (NVSHMEM): rows sorted by global expert, one per (token, slot);
    the reply comes back with all_to_all_vdev_2d_offset and is weighted and summed per token."""
    name, graph = "torch_vdev", True

    def __init__(self, tokens, ids, weights, experts):
        super().__init__(tokens, ids, weights, experts)
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.set_backend("NVSHMEM")
        self.group = dist.group.WORLD.group_name
        world = dist.get_world_size()
        slots, hidden = ids.numel(), tokens.shape[1]
        self.capacity = slots * world  # every slot of every rank could come here
        self.inp = symm_mem.empty((slots, hidden), dtype=tokens.dtype, device=tokens.device)
        self.out = symm_mem.empty((self.capacity, hidden), dtype=tokens.dtype, device=tokens.device)
        self.back = symm_mem.empty((slots, hidden), dtype=tokens.dtype, device=tokens.device)
        self.in_splits = symm_mem.empty(experts, dtype=torch.int64, device=tokens.device)
        self.out_splits = symm_mem.empty((2, experts), dtype=torch.int64, device=tokens.device)
        self.back_splits = symm_mem.empty((2, experts), dtype=torch.int64, device=tokens.device)
        self.reply = symm_mem.empty((self.capacity, hidden), dtype=tokens.dtype, device=tokens.device)

    def dispatch(self):
        flat = self.ids.reshape(-1)
        self.order = torch.sort(flat, stable=True).indices  # slots by global expert
        self.inp.copy_(self.tokens[self.order // self.ids.shape[1]])
        self.in_splits.zero_().scatter_add_(0, flat, torch.ones_like(flat))  # no host sync (bincount has one)
        torch.ops.symm_mem.all_to_all_vdev_2d(self.inp, self.out, self.in_splits, self.out_splits, self.group)
        return self.out, self.out_splits[0], None

    def combine(self):
        self.reply.copy_(self.expert_out)
        # in_splits_offsets of the reply = what dispatch received (per local expert and source)
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(self.reply, self.back, self.out_splits, self.back_splits,
                                                     self.group)
        rows = torch.empty_like(self.back)
        rows[self.order] = self.back
        k = self.ids.shape[1]
        return (rows.float().reshape(-1, k, rows.shape[1]) * self.weights.float()[..., None]).sum(1).to(rows.dtype)


def _median_us(fn, graph: bool, device) -> tuple[float, str]:
    """Median per-call time (us) of the slowest rank, and the mode used."""
    if device.type == "cpu":
        samples = []
        for _ in range(3):
            dist.barrier()
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        mode = "cpu"
    else:
        failure = None
        if graph:
            try:
                captured = CapturedCalls(fn, PLAN.calls_per_graph)
            except Exception as exc:  # noqa: BLE001 - timed eagerly instead, and said so
                captured, failure = None, f"{type(exc).__name__}"
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, failure if graph else "not capturable")
        if all(f is None for f in flags):
            samples, mode = time_graph(captured, PLAN, dist.group.WORLD).samples_us, "graph"
        else:
            torch.cuda.synchronize()
            samples = time_eager(fn, PLAN, dist.group.WORLD).samples_us
            mode = "eager" if not graph else f"eager (graph capture failed: {next(f for f in flags if f)})"
    slowest = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest), mode


def _wrong_dispatch(impl, got, want, counts) -> int:
    """Wrong elements of a dispatch: symmcoll and nccl row by row (the same layout); torch_vdev, whose
    order within an expert is its own, as the multiset of received rows (by their bit patterns)."""
    n = int(want[1].sum())
    if impl.name == "torch_vdev":
        a = torch.sort(got[:n].view(torch.int16).long().sum(1) * 65536 + got[:n].view(torch.int16)[:, 1]).values
        b = torch.sort(want[0][:n].view(torch.int16).long().sum(1) * 65536 + want[0][:n].view(torch.int16)[:, 1]).values
        return int((a != b).sum()) if a.shape == b.shape else n
    return int((got[:n].view(torch.int16) != want[0][:n].view(torch.int16)).sum()) + int((counts != want[1]).sum())


def _case(tokens_n, hidden, experts, k, names, device_type) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    tokens, ids, weights = _inputs(tokens_n, hidden, experts, k, rank, device)
    want = reference.moe_dispatch(tokens, ids, experts)
    # The expert step is row * 2 (exact in bf16, and blind to the layout, which torch's differs in).
    want_combined = reference.moe_combine(want[0] * 2, weights, ids, want[2], experts)
    sent = torch.tensor(_sent_bytes(ids, experts, world, rank, hidden * tokens.element_size()), dtype=torch.float64,
                        device=device)
    dist.all_reduce(sent)
    per_rank = (sent / world).tolist()
    rows = []
    for cls in [c for c in (Symmcoll, Nccl, TorchVdev) if c.name in names]:
        row = {"tokens": tokens_n, "hidden": hidden, "experts": experts, "topk": k, "world_size": world,
               "dtype": "bf16", "implementation": cls.name}
        error = None
        try:
            if cls is TorchVdev and device.type != "cuda":
                raise RuntimeError("needs CUDA")
            impl = cls(tokens, ids, weights, experts)
            recv, counts, _ = impl.dispatch()
            wrong = _wrong_dispatch(impl, recv, want, counts)
            impl.set_expert_out(recv * 2)
            wrong += int((impl.combine().view(torch.int16) != want_combined.view(torch.int16)).sum())
            for phase, fn, moved in (("dispatch", impl.dispatch, per_rank[0]), ("combine", impl.combine, per_rank[1])):
                us, mode = _median_us(fn, cls.graph, device)
                row[f"{phase}_us"], row[f"{phase}_mode"] = us, mode
                row[f"{phase}_gbps"] = moved / us / 1e3 if us else None
                row[f"{phase}_bytes_per_rank"] = moved
            recv, counts, _ = impl.dispatch()  # after timing: fresh outputs, checked again
            wrong += _wrong_dispatch(impl, recv, want, counts)
            wrong += int((impl.combine().view(torch.int16) != want_combined.view(torch.int16)).sum())
            symmcoll.check()
        except Exception as exc:  # noqa: BLE001 - one implementation failing must not end the run
            error, wrong = f"{type(exc).__name__}: {exc}".splitlines()[0][:300], None
        errors = [None] * world
        dist.all_gather_object(errors, (error, wrong))
        row["wrong"] = None if any(e[1] is None for e in errors) else sum(e[1] for e in errors)
        row["error"] = next((e[0] for e in errors if e[0]), None)
        if row["error"] and cls is Symmcoll:
            symmcoll.reset()
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
    return rows


def _run(cases, names, device_type) -> dict:
    rows = []
    for case in cases:
        rows += _case(*case, names, device_type)
    return {"provenance": dataclasses.asdict(collect(device_type)), "world_size": dist.get_world_size(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", nargs="+", type=int, default=[2])
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 1024, 4096])
    parser.add_argument("--hidden", nargs="+", type=int, default=[4096, 7168])
    parser.add_argument("--experts", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--topk", nargs="+", type=int, default=[2, 8])
    parser.add_argument("--implementations", nargs="+", default=["symmcoll", "nccl", "torch_vdev"])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cases = [(t, h, e, k) for t in args.tokens for h in args.hidden for e in args.experts for k in args.topk if k <= e]
    results = []
    for world in args.world_size:
        results.append(launch.run(_run, world, cases, args.implementations, args.device, device=args.device,
                                  timeout=3000)[0])
        with open(args.out, "w") as f:  # after every world size: a later failure keeps these
            json.dump(results, f, indent=1)
    for result in results:
        for r in result["rows"]:
            if r["wrong"] or r["error"]:
                print("WRONG" if r["wrong"] else "ERROR", r)


if __name__ == "__main__":
    main()
