"""Which part of the fused bench's small-shape figures at world size > 1 is the timer's, and which the op's.

On 4 H100s (2026-11-27) ``symmcoll bench --op all_reduce_rms_norm`` gave 20-25 us for the one-shot kernel at
1-6 tokens and 12.9 us for "symmcoll:all_reduce alone" at 8 KB, which the collective bench times at 3.7 us.
Until then the fused bench captured 3 calls per graph and isolated every replay (barrier, synchronize, replay,
synchronize); the collective bench captures 20 and replays back to back after one barrier. This probe times
the same thunks as the fused bench (bench/fused.py's all_reduce_rms_norm spec: torch add+RMSNorm on one GPU,
symmcoll.all_reduce alone, the unfused, one_shot, two_shot and auto variants), each checked against the fp32
reference first, four ways in one process per GPU:

  old       3 calls per graph, every replay isolated: the fused bench before the fix
  old_b2b   3 calls per graph, replays back to back after one barrier (3 warm-up replays)
  iso20     20 calls per graph, every replay isolated
  new       20 calls per graph, back to back: timing.time_graph, the collective bench's method and the fused
            bench's since the fix

Per (shape, implementation, method): every rank's median, p20 and p80 (us per call); the figure is the
slowest rank's median. old - new is the timer's floor; new(one_shot) against new(all_reduce alone) says
whether the fused kernel itself costs more than the all-reduce it contains.

    PYTHONPATH=src python3 benchmarks/fused_floor_probe.py --world-size 4 --out floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch

SHAPES = ("1x4096", "6x4096", "32x4096", "138x4096", "1x16384")
IMPLEMENTATIONS = ("torch add+RMSNorm (one GPU)", "symmcoll:all_reduce alone", "symmcoll:unfused",
                   "symmcoll:one_shot", "symmcoll:two_shot", "symmcoll:auto")
METHODS = {"old": (3, True), "old_b2b": (3, False), "iso20": (20, True), "new": (20, False)}  # calls, isolated
REPLAYS = 20


def _thunks(shape, device, rank, world, group):
    """(name, thunk, fp32 reference) of every implementation, as bench/fused.run_shape binds them."""
    from symmcoll.bench import fused
    spec = fused.SPECS["all_reduce_rms_norm"]
    dtype = torch.bfloat16
    for name in IMPLEMENTATIONS:
        if name == spec.local_name:
            inputs = spec.inputs(shape, dtype, 0, 1, 0, device)
            yield name, spec.local(shape, dtype, device), fused.memory_bound._norm_local_reference(inputs, group)
            continue
        inputs = spec.inputs(shape, dtype, rank, world, 0, device)
        if name in spec.baselines:
            thunk = spec.call(spec.baselines[name], inputs, group, shape=shape)
            want = spec.call(spec.baseline_references[name], inputs, group, shape=shape)
        else:
            algorithm = name.split(":", 1)[1]
            thunk = (lambda i=inputs, a=algorithm: spec.call(spec.run, a, i, group, shape=shape))
            want = spec.call(spec.reference, inputs, group, shape=shape)
        yield name, thunk, want


def _timed(thunk, calls: int, isolated: bool, group) -> list[float]:
    from symmcoll.bench import timing
    if not isolated:  # the collective bench's method, as the fused bench uses it now
        plan = timing.TimingPlan(mode="graph", warmup=3, iters=REPLAYS, min_iters=REPLAYS, calls_per_graph=calls,
                                 seconds_per_case=10.0)
        captured = timing.CapturedCalls(thunk, calls)
        return list(timing.time_graph(captured, plan, group).samples_us)
    graph, _ = timing.capture_steps(thunk, calls)  # the fused bench before the fix: one step, isolated replays
    graph.replay()
    return timing.event_times_us(graph.replay, REPLAYS, group=group, per=calls)


def _summary(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=5)
    return {"median": statistics.median(samples), "p20": q[0], "p80": q[3]}


def _rank_main(opts: dict) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    device = torch.device("cuda", torch.cuda.current_device())
    cases, start = [], time.monotonic()
    for text in opts["shapes"]:
        late = [None] * world
        dist.all_gather_object(late, time.monotonic() - start > opts["budget_s"], group=group)
        if any(late):
            cases.append({"shape": text, "error": "not run: --budget-s spent"})
            break
        shape = tuple(int(v) for v in text.split("x"))
        for name, thunk, want in _thunks(shape, device, rank, world, group):
            case = {"shape": text, "implementation": name}
            try:
                got = thunk()
                err = float((got.float() - want).norm() / want.norm().clamp_min(1e-30))
                case["rel_err"] = err
                if err > 2e-2:
                    raise AssertionError(f"relative error {err:.2e} before timing")
                torch.cuda.synchronize()
                for method, (calls, isolated) in METHODS.items():
                    case[method] = _summary(_timed(thunk, calls, isolated, group))
                    torch.cuda.synchronize()
                symmcoll.check()
            except Exception as exc:  # noqa: BLE001 - every rank reports it; the next case goes on
                case["error"] = f"rank {rank}: {type(exc).__name__}: {exc}"[:300]
                symmcoll.reset()
            errors = [None] * world
            dist.all_gather_object(errors, case.get("error"), group=group)
            if any(errors):
                case = {"shape": text, "implementation": name, "error": next(e for e in errors if e)}
            cases.append(case)
            torch.cuda.empty_cache()
    return {"rank": rank, "device": torch.cuda.get_device_name(device), "cases": cases}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=torch.cuda.device_count())
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--budget-s", type=float, default=90.0, help="no shape starts after this many seconds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # leave through the pool: no rank left spinning
    opts = {"shapes": args.shapes, "budget_s": args.budget_s}
    ranks = launch.run(_rank_main, args.world_size, opts, device="cuda", timeout=args.budget_s + 200)
    rows = []
    print(f"world size {args.world_size}, {ranks[0]['device']}: us per call, slowest rank's median "
          f"[its p20-p80]; per-rank medians for old and new")
    print(f"{'shape':>9} {'implementation':<28}" + "".join(f"{m:>20}" for m in METHODS) + "   per-rank old | new")
    for i, case in enumerate(ranks[0]["cases"]):
        every = [r["cases"][i] for r in ranks]
        row = {"shape": case["shape"], "implementation": case.get("implementation"), "error": case.get("error")}
        if not row["error"]:
            for method in METHODS:
                slowest = max((c[method] for c in every), key=lambda s: s["median"])
                row[method] = {**slowest, "per_rank_median": [c[method]["median"] for c in every]}
            row["rel_err"] = max(c["rel_err"] for c in every)
            cells = "".join(f"{row[m]['median']:>7.2f} [{row[m]['p20']:5.1f}-{row[m]['p80']:5.1f}]" for m in METHODS)
            ranks_text = " ".join(f"{v:.1f}" for v in row["old"]["per_rank_median"]) + " | " + \
                " ".join(f"{v:.1f}" for v in row["new"]["per_rank_median"])
            print(f"{row['shape']:>9} {row['implementation'][:28]:<28}{cells}   {ranks_text}")
        else:
            print(f"{row['shape']:>9} {str(row['implementation'])[:28]:<28} ERROR {row['error']}")
        rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"world_size": args.world_size, "git_sha": os.environ.get("SYMMCOLL_GIT_SHA"),
                   "device": ranks[0]["device"], "methods": {m: {"calls_per_graph": c, "isolated": i}
                                                              for m, (c, i) in METHODS.items()},
                   "replays": REPLAYS, "rows": rows}, f, indent=1)
    print(f"written {args.out}")
    return int(any(r["error"] for r in rows))


if __name__ == "__main__":
    sys.exit(main())
