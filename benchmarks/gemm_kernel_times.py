"""Where a GEMM call's time goes, kernel by kernel (issue 22, written 2026-11-28 for the next GPU session).

Why: on the H200, 70b-tp8 qkv (128 x 1280 x 8192) runs 12.0-12.8 us against cuBLAS's 10.9 with 20 tiles of
64 x 128 in 6 parts summed apart, while 10 tiles of 128 x 128 in 13 parts -- B read once, half the bytes per
SM -- ran 15.7 us (results/2026-11-28-sum-apart-h200). The graph-replay time alone does not say whether the
main kernel, the sum kernel or the gap between them costs it. Here each config (and cuBLAS) is checked against fp32,
its calls on every input set of the cell are captured in one CUDA graph (the weights come from HBM, as in the
grid), and REPLAYS replays are traced with torch.profiler (CUDA activities): per kernel its median duration,
and per call the replay's span (first kernel's start to last one's end) and idle time between kernels. The
decode cells (32-72 MB weights read below 3.6 TB/s) ask whether that time is inside the kernel or between. Run in a process of its own (the profiler stays attached to it).

    python3 benchmarks/gemm_kernel_times.py --out $OUT/kernel_times.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from symmcoll.bench.gemm import DTYPES, MAX_REL_ERR, check, cublas, current_gpu, gpu_facts, make_cell, ours
from symmcoll.bench.kernel_share import KERNEL_CATEGORIES, trace_events
from symmcoll.fused import gemm
from symmcoll.fused.gemm_configs import GemmConfig
from symmcoll.fused.gemm_tables import gemm_config

REPLAYS = 20
# (shape, m, n, k, configs beside the table's)
CELLS = [
    # (seventeenth stop) dsv3-expert gate_up M = 256: the one grid cell at 1.09-1.11x (64 x 128 p9, 128 tiles, 27.0-27.8
    # us against cuBLAS 25.0-25.6). cuBLAS's kernel name (its tile and cluster), and whether fewer bytes a program
    # from L2 -- 128 x 128 tiles in 2 parts (1.84 MB a program against 2.75), 128 x 256 in 4 -- pays once the
    # parts are summed apart (the in-kernel sum of two 64 KB partials costs ~1.3 us on one SM).
    # (eighteenth stop) split configs in two parts run every way the launch allows: halves exchanged
    # (gemm_split.exchange_halves: both parts store and load 32 KB at once), pairs (pair_reduce: one 64 KB partial
    # stored, then loaded) and split_reduce (two stored, both loaded by the last part).
    ("dsv3-expert gate_up", 256, 4096, 7168, [GemmConfig(128, 128, 64, 8, 2, False, 8, 6, sum_apart=True),
                                              GemmConfig(128, 128, 64, 8, 2, False, 8, 7),
                                              GemmConfig(128, 256, 64, 8, 4, False, 8, 4, sum_apart=True),
                                              GemmConfig(64, 128, 64, 4, 1, False, 4, 9)]),
    # decode cells under the decode PDL rule (whole tiles, early release): how much of a call is the kernel now
    ("70b-tp4 o", 1, 8192, 2048, []),
    ("70b-tp4 qkv", 16, 2560, 8192, []),
    # the fused ops' 1024^3 (all_gather_matmul at world size 1 and the core alone: 5.5 us in the kernel against
    # cuBLAS's 5.3, sixteenth stop): L2-warm as the fused bench calls it (``WARM``), cuBLAS's kernel name
    ("fused 1024x1024", 1024, 1024, 1024, [GemmConfig(128, 64, 64, 8, 1, False, 4, 4),
                                           GemmConfig(128, 64, 128, 8, 1, False, 4, 4),
                                           GemmConfig(128, 64, 64, 8, 1, False, 8, 5),
                                           GemmConfig(128, 128, 64, 8, 2, False, 8, 4),
                                           GemmConfig(64, 128, 64, 8, 2, False, 4, 6),
                                           # (eighteenth stop, call5) why 128 x 128 in two parts runs 8.8 us here
                                           # against 5.7 for whole 64 x 128 tiles: the split K-loop alone (summed
                                           # apart: the main kernel's time), whole 128 x 128 tiles (64 SMs), deeper
                                           # k-steps, four warps
                                           GemmConfig(128, 128, 64, 8, 2, False, 8, 4, sum_apart=True),
                                           GemmConfig(128, 128, 64, 8, 1, False, 8, 4),
                                           GemmConfig(128, 128, 128, 8, 2, False, 8, 3),
                                           GemmConfig(128, 128, 64, 8, 2, False, 4, 4),
                                           GemmConfig(128, 128, 64, 8, 2, False, 8, 2)]),
]
# Cells measured as the fused bench calls them (gemm_tune.FUSED_SHAPES): one input set, L2-warm, three calls a replay.
WARM = ("fused ",)
WARM_CALLS = 3


# How a two-part split config's tiles are summed (gemm.PAIR_REDUCE's modes): each mode the launch allows is timed.
MODE_LABELS = {2: "+halves", 1: "+pair", 0: "-pair"}


def replay_times(events: list[dict]) -> dict:
    """Per kernel name its median duration (us); per replay the span and the idle time between kernels,
    replays told apart by gaps over 20 us (each replay is launched 1 ms after the last finished: ``traced``)."""
    kernels = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATEGORIES),
                     key=lambda e: float(e["ts"]))
    durations: dict[str, list[float]] = {}
    for e in kernels:
        durations.setdefault(e["name"], []).append(float(e["dur"]))
    replays, current = [], []
    for e in kernels:
        if current and float(e["ts"]) - max(float(c["ts"]) + float(c["dur"]) for c in current) > 20.0:
            replays.append(current)
            current = []
        current.append(e)
    if current:
        replays.append(current)
    spans = [max(float(e["ts"]) + float(e["dur"]) for e in r) - float(r[0]["ts"]) for r in replays]
    busy = [sum(float(e["dur"]) for e in r) for r in replays]
    return dict(kernels={name: statistics.median(d) for name, d in durations.items()},
                kernel_counts={name: len(d) for name, d in durations.items()}, replays=len(replays),
                span_us=statistics.median(spans), idle_us=statistics.median(s - b for s, b in zip(spans, busy)))


def traced(calls) -> dict:
    """REPLAYS replays of a CUDA graph of every input set's call in turn (the weights come from HBM, as in
    the grid), each replay after the previous finished (a sleep between them), traced; ``call_us`` and
    ``call_idle_us`` are a replay's span and idle time per call."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()

    def replay_and_wait():
        graph.replay()
        time.sleep(0.001)  # (a gap the replays are told apart by)

    times = replay_times(trace_events(replay_and_wait, REPLAYS))
    return dict(times, calls=len(calls), call_us=times["span_us"] / len(calls), call_idle_us=times["idle_us"] / len(calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cells", nargs="*", default=None, help="only the cells whose name holds one of these")
    args = parser.parse_args()
    device = current_gpu()
    rows = []
    for name, m, n, k, extra in CELLS:
        if args.cells and not any(part in name for part in args.cells):
            continue
        warm = name.startswith(WARM)
        cell = make_cell(name, m, n, k, DTYPES["bf16"], device, rotate=not warm)
        repeat = WARM_CALLS if warm else 1
        sides = [("cublas", None, cublas(cell) * repeat, gemm.PAIR_REDUCE)]
        for config in [gemm_config(m, n, k, torch.bfloat16, device)] + extra:
            best = gemm.launch_pair_mode(config, m, n, k, 2, gemm.programs_for(config, device), "cuda", 2)
            for mode in range(best, -1, -1) if best else (gemm.PAIR_REDUCE,):
                label = config.label + ("" if not best else MODE_LABELS[mode])
                sides.append((label, config, ours(cell, config) * repeat, mode))
        for label, config, calls, pair in sides:
            with gemm.pair_reduce_switched(pair):
                err = check(cell, calls)
                row = dict(shape=name, m=m, n=n, k=k, side=label, rel_err=err)
                if err <= MAX_REL_ERR:
                    row.update(traced(calls))
            rows.append(row)
            kernels = ", ".join(f"{kname[:40]} {us:.1f}" for kname, us in row.get("kernels", {}).items())
            print(f"{name:<12} M={m:<4} {label:<30} per call {row.get('call_us', float('nan')):6.1f} us  "
                  f"idle {row.get('call_idle_us', float('nan')):5.1f} ({row.get('calls', 0)} calls a replay)  "
                  f"[{kernels}]  err {err:.1e}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(provenance=gpu_facts(), rows=rows), indent=1))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
