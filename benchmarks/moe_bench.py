"""MoE dispatch and combine: symmcoll against NCCL and torch, in one run (GPU machine).

    PYTHONPATH=src python3 benchmarks/moe_bench.py --world-size 2 --out $OUT/moe.json
        [--tokens 128 1024 4096] [--hidden 4096 7168] [--experts 8 64] [--topk 2 8] [--device cuda|cpu]
        [--implementations symmcoll nccl torch_vdev] [--nccl-diagnose]

Per case (T tokens per rank, hidden H, E experts, top-k; bf16; random distinct experts per token, seeded
by rank) and implementation:

* ``symmcoll``: ``moe_dispatch`` (pull) and ``moe_combine`` (push), timed as CUDA-graph replays (10 calls
  per graph) and eagerly;
* ``nccl``: the library's own lean eager layer around NCCL's ``all_to_all_single`` (the "nccl" algorithm,
  ``symmcoll/fused/moe_nccl.py`` lists each step), here with receive buffers sized to the rows received:
  dispatch = routing, counts and two narrow-key argsorts on the device, one all-gather of the
  [W, 1 + E/W] counts, ONE host read of them (the ``.tolist()`` every user of ``all_to_all_single`` with
  GPU-computed splits pays), one ``index_select`` by destination, one ``all_to_all_single`` of the rows
  with their source, token and expert ids packed behind them, then one argsort and ``index_select`` into
  the rows-by-local-expert layout symmcoll returns (with its row origins); combine = one
  ``index_select`` by source rank, one ``all_to_all_single`` back, and the oracle's weighted fp32 sum
  over each token's k slots. Eager only: the host read cannot be
  captured; its rows also give ``*_host_us``, host time per call queued on an idle GPU (``time_eager``),
  and ``--nccl-diagnose`` adds where its time goes (``moe_nccl_diagnose.py``: single-op host costs, its
  communication alone, one isolated call, a profile). On CUDA its host synchronisations are counted once per case (torch's sync debug mode): a
  dispatch with more than one, or a combine with any, is an error in its row. ``symmcoll.reference``
  (the oracle) is only the check, never timed;
* ``torch_vdev``: ``torch.ops.symm_mem.all_to_all_vdev_2d`` on NVSHMEM symmetric memory (rows sorted by
  expert first, one row per (token, expert): its traffic is per slot, not per token and rank), and
  ``all_to_all_vdev_2d_offset`` back for the combine (from the expert outputs already in its symmetric
  reply buffer, where the expert GEMM can write them: no copy in is timed); where this torch and machine
  run it, else its rows say why in ``error`` ("not run: ...").

torch_vdev runs in rank processes of its own, after symmcoll's and nccl's have exited: torch keeps one
symmetric-memory backend per process, and ``set_backend("NVSHMEM")`` raises "Backend can not be changed
after use." once the process has allocated symmetric memory, as symmcoll's workspace does
(``moe_torch_vdev.py`` says where torch decides it).

Every implementation is checked against the oracle (``reference.moe_dispatch`` / ``moe_combine``) before
and after timing: ``wrong`` counts wrong elements (dispatch: the received rows in the oracle's layout --
by local expert, then source rank, then token; torch_vdev's rows are taken from where its output offsets
put them -- and the per-expert counts; combine: the result). Times are the slowest rank's median (us);
``gbps`` = bytes each rank sends to other ranks (averaged over ranks: dispatch one row per token and remote
owning rank, combine one row per remote slot) / time. Results go to one JSON file with provenance (git
sha, versions, GPUs), rewritten after every set of ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
import warnings

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch, reference
from symmcoll.bench.plan import TimingPlan
from symmcoll.bench.provenance import collect
from symmcoll.bench.timing import CapturedCalls, time_eager, time_graph
from symmcoll.fused import moe_nccl

import moe_nccl_diagnose
from moe_torch_vdev import VDEV, TorchSymmMem, TorchVdev, VdevBuffers

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

    def in_oracle_layout(self, recv, counts):
        """(received rows, per-local-expert counts) laid out as reference.moe_dispatch lays them out."""
        return recv, counts

    def forget_outputs(self):
        """Before the check after timing: outputs that live on between calls are overwritten with junk,
        so that check sees what the last call wrote (symmcoll and nccl return new tensors)."""


class Nccl(Symmcoll):
    """symmcoll's "nccl" algorithm (fused/moe_nccl.py) around all_to_all_single: dispatch = one all-gather
    of the counts, one host read of them (.tolist()), one all_to_all_single of the rows and their ids;
    combine = one all_to_all_single back and the weighted fp32 sum. Not capturable (the host read)."""
    name, graph = "nccl", False

    def dispatch(self):
        self.recv, self.counts, origin, _, self.route = moe_nccl.dispatch(self.tokens, self.ids, self.experts)
        return self.recv, self.counts, origin

    def combine(self):
        return moe_nccl.combine(self.expert_out, self.weights, self.ids, self.experts, self.route)

    def check_host_syncs(self):
        """One host synchronisation per dispatch (the counts' .tolist()), none per combine."""
        if self.tokens.device.type != "cuda":
            return
        with HostSyncCount() as in_dispatch:
            self.dispatch()
        with HostSyncCount() as in_combine:
            self.combine()
        if dist.get_rank() == 0:
            print(f"nccl host syncs: dispatch {in_dispatch.count}, combine {in_combine.count}", flush=True)
        if in_dispatch.count > 1 or in_combine.count > 0:
            raise RuntimeError(f"nccl baseline synchronised with the host {in_dispatch.count} times in dispatch "
                               f"and {in_combine.count} in combine (expected 1 and 0)")


class HostSyncCount:
    """Synchronising CUDA calls in a ``with`` block, as torch's sync debug mode reports them
    (``torch.cuda.set_sync_debug_mode("warn")``: a D2H copy such as ``.tolist()``, ``.item()``, nonzero,
    a synchronous H2D copy, a stream or device synchronise). ``count`` is set on exit."""

    count: int | None = None

    def __enter__(self):
        self._caught = warnings.catch_warnings(record=True)
        self._records = self._caught.__enter__()
        warnings.simplefilter("always")
        self._previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(self._previous)
        self._caught.__exit__(*exc)
        self.count = sum("synchronizing CUDA operation" in str(w.message) for w in self._records)
        return False


def _median_us(fn, graph: bool, device) -> tuple[float, str, float | None]:
    """Median per-call time (us) of the slowest rank, the mode used, and for eager calls the slowest
    rank's host time per call (time_eager's host_us: calls queued on an idle GPU)."""
    host_us = None
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
            timing = time_eager(fn, PLAN, dist.group.WORLD)
            samples, host_us = timing.samples_us, timing.host_us
            mode = "eager" if not graph else f"eager (graph capture failed: {next(f for f in flags if f)})"
    slowest = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if host_us is not None:
        host = torch.tensor([host_us], dtype=torch.float64, device=device)
        dist.all_reduce(host, op=dist.ReduceOp.MAX)
        host_us = float(host)
    return float(slowest), mode, host_us


def _wrong_dispatch(impl, got, want, counts) -> int:
    """Wrong elements of a dispatch, in the oracle's layout: received rows (a missing row counts all its
    elements) and per-local-expert counts."""
    rows, counts = impl.in_oracle_layout(got, counts)
    n = int(want[1].sum())
    m = min(n, rows.shape[0])
    wrong = int((rows[:m].view(torch.int16) != want[0][:m].view(torch.int16)).sum()) + (n - m) * rows.shape[1]
    return wrong + int((counts != want[1]).sum())


def _row(case, world, name) -> dict:
    tokens_n, hidden, experts, k = case
    return {"tokens": tokens_n, "hidden": hidden, "experts": experts, "topk": k, "world_size": world,
            "dtype": "bf16", "implementation": name}


def _case(case, implementations, device_type, diagnose=False) -> list[dict]:
    """Rows of one case: every (class, extra constructor arguments) of ``implementations`` checked,
    timed and checked again; with ``diagnose``, the nccl row also carries moe_nccl_diagnose's findings."""
    tokens_n, hidden, experts, k = case
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
    for cls, extra in implementations:
        row = _row(case, world, cls.name)
        error = None
        try:
            impl = cls(tokens, ids, weights, experts, **extra)
            recv, counts, _ = impl.dispatch()
            wrong = _wrong_dispatch(impl, recv, want, counts)
            impl.set_expert_out(recv * 2)
            wrong += int((impl.combine().view(torch.int16) != want_combined.view(torch.int16)).sum())
            if isinstance(impl, Nccl):
                impl.check_host_syncs()
            for phase, fn, moved in (("dispatch", impl.dispatch, per_rank[0]), ("combine", impl.combine, per_rank[1])):
                us, mode, host_us = _median_us(fn, cls.graph, device)
                row[f"{phase}_us"], row[f"{phase}_mode"] = us, mode
                if host_us is not None:
                    row[f"{phase}_host_us"] = host_us
                row[f"{phase}_gbps"] = moved / us / 1e3 if us else None
                row[f"{phase}_bytes_per_rank"] = moved
            if diagnose and isinstance(impl, Nccl):
                row["nccl_diagnose"] = moe_nccl_diagnose.diagnose(impl, PLAN)
                if rank == 0:
                    print("\n".join(moe_nccl_diagnose.summary_lines(row["nccl_diagnose"])), flush=True)
            impl.forget_outputs()
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


def _run(cases, names, device_type, diagnose=False) -> dict:
    """symmcoll's and nccl's rows (one set of ranks: symmcoll's workspace is symmetric memory)."""
    implementations = [(cls, {}) for cls in (Symmcoll, Nccl) if cls.name in names]
    rows = []
    for case in cases:
        rows += _case(case, implementations, device_type, diagnose)
    return {"provenance": dataclasses.asdict(collect(device_type)), "world_size": dist.get_world_size(), "rows": rows}


def _run_torch_vdev(cases, device_type, api=None) -> dict:
    """torch_vdev's rows, in ranks where nothing else touches symmetric memory: NVSHMEM is selected
    before the first symmetric allocation; where it cannot be, every row says why."""
    api = api if api is not None else TorchSymmMem()
    world = dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")

    def agreed(reason):  # every rank takes the same path: the allocations are collective
        reasons = [None] * world
        dist.all_gather_object(reasons, reason)
        return next((r for r in reasons if r), None)

    reason = agreed(api.unavailable(device))
    if reason is None:
        try:
            api.select_nvshmem(device, VdevBuffers.heap_bytes(cases, world))
        except Exception as exc:  # noqa: BLE001 - said in every row
            reason = f"set_backend('NVSHMEM') failed: {type(exc).__name__}: {exc}".splitlines()[0][:300]
        reason = agreed(reason)
    rows = []
    if reason is None:
        buffers = VdevBuffers(api, cases, world, device)
        for case in cases:
            rows += _case(case, [(TorchVdev, {"buffers": buffers, "api": api})], device_type)
    else:
        rows = [dict(_row(case, world, VDEV), wrong=None, error=f"not run: {reason}") for case in cases]
        if dist.get_rank() == 0:
            print(json.dumps(rows[0]), flush=True)
    return {"provenance": dataclasses.asdict(collect(device_type)), "world_size": world, "rows": rows}


def _merge(results, cases, names) -> dict:
    """One world size's result from its sets of ranks: rows by case, then in ``names`` order."""
    by_key = {(r["tokens"], r["hidden"], r["experts"], r["topk"], r["implementation"]): r
              for result in results for r in result["rows"]}
    rows = [by_key[(*case, name)] for case in cases for name in names if (*case, name) in by_key]
    return {"provenance": results[0]["provenance"], "world_size": results[0]["world_size"], "rows": rows}


def measure(world, cases, names, device_type, vdev_api=None, on_partial=None, diagnose=False) -> dict:
    """Every implementation of ``names`` at one world size: symmcoll and nccl in one set of ranks, then
    torch_vdev in fresh ranks (module docstring); ``on_partial(result)`` after the first set; with
    ``diagnose``, the nccl rows carry moe_nccl_diagnose's findings."""
    results = []
    shared = [n for n in names if n != VDEV]
    if shared:
        results.append(launch.run(_run, world, cases, shared, device_type, diagnose, device=device_type,
                                  timeout=3000)[0])
        if on_partial is not None and VDEV in names:
            on_partial(_merge(results, cases, names))
    if VDEV in names:
        try:
            results.append(launch.run(_run_torch_vdev, world, cases, device_type, vdev_api, device=device_type,
                                      timeout=3000)[0])
        except (launch.RankError, launch.LaunchTimeout) as exc:  # a crash in torch/NVSHMEM: said in its rows
            failures = exc.failures if isinstance(exc, launch.RankError) else {}
            said = "; ".join(f"rank {r}: {[line for line in text.splitlines() if line.strip()][-1][:150]}"
                             for r, text in sorted(failures.items())) or str(exc)
            rows = [dict(_row(case, world, VDEV), wrong=None, error=f"ranks failed: {said}"[:400]) for case in cases]
            results.append({"provenance": results[0]["provenance"] if results else None, "world_size": world,
                            "rows": rows})
    return _merge(results, cases, names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", nargs="+", type=int, default=[2])
    parser.add_argument("--tokens", nargs="+", type=int, default=[128, 1024, 4096])
    parser.add_argument("--hidden", nargs="+", type=int, default=[4096, 7168])
    parser.add_argument("--experts", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--topk", nargs="+", type=int, default=[2, 8])
    parser.add_argument("--implementations", nargs="+", default=["symmcoll", "nccl", VDEV])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--nccl-diagnose", action="store_true",
                        help="after each nccl row: where its eager time goes (moe_nccl_diagnose.py)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cases = [(t, h, e, k) for t in args.tokens for h in args.hidden for e in args.experts for k in args.topk if k <= e]
    results = []

    def write(partial=None):  # after every set of ranks: a later failure keeps these
        with open(args.out, "w") as f:
            json.dump(results + ([partial] if partial else []), f, indent=1)

    for world in args.world_size:
        results.append(measure(world, cases, args.implementations, args.device, on_partial=write,
                               diagnose=args.nccl_diagnose))
        write()
    for result in results:
        for r in result["rows"]:
            if r["wrong"] or r["error"]:
                print("WRONG" if r["wrong"] else "NOT RUN" if r["error"].startswith("not run:") else "ERROR", r)


if __name__ == "__main__":
    main()
