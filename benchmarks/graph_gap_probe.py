"""Why does the TP block's symmcoll mode idle between kernels? (issue 22 point 4, decode at world size 1)

A profiled decode step of the TP block (2026-11-27-tp-block-idle-h100) showed every kernel-to-kernel gap
of the symmcoll mode's graph at ~0.42 us against ~0.1 us in the NCCL mode's, torch's own kernels included,
and 24 us (not 5) before cuDNN's attention. This probe captures small graphs that differ in one thing
and prints the median gap between their kernels and the replay time:

  torch        40 torch adds
  +triton      the same with one Triton kernel (symmcoll's launcher, fast path) in the middle
  +triton-jit  the same, the Triton kernel launched through Triton's JIT (kernel[grid])
  +triton-x4   four Triton kernels spread over the chain (+torch-x4: a torch kernel of the same work;
               +triton-x4-w1: the Triton kernel with one warp a program)
  +sdpa        torch adds around torch's scaled_dot_product_attention (decode shape), without and with
               one Triton kernel

    python3 benchmarks/graph_gap_probe.py [--out gaps.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

from symmcoll.bench.kernel_share import trace_events
from symmcoll.launcher import launch


@triton.jit
def _add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def _replay_us(run, replays: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run()
    start.record()
    for _ in range(replays):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def _gaps(run, replays: int = 20, profile: bool = True) -> tuple[float, float, int]:
    """(median gap between consecutive kernels in us, replay time in us, kernels a replay); without
    ``profile`` only the replay time (no profiler session in the process)."""
    if not profile:
        return float("nan"), _replay_us(run, replays), 0
    trace = trace_events(run, replays)
    events = sorted((e for e in trace if e.get("ph") == "X" and e.get("cat") == "kernel"), key=lambda e: e["ts"])
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(events, events[1:])]
    gaps = [g for g in gaps if 0 <= g < 50]  # (between replays: host launches)
    return statistics.median(gaps), _replay_us(run, replays), len(events) // replays


def _graph(body):
    body()  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph.replay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-profile", action="store_true", help="replay times only (no profiler session)")
    parser.add_argument("--settle", action="store_true", help="bench.timing.settle_graphs() first (what every "
                        "symmcoll benchmark does before its first timed graph)")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="cases in this order, repeats allowed (does a graph's gap depend on what ran before?)")
    args = parser.parse_args()
    x = torch.zeros(8192, device="cuda", dtype=torch.float32)
    y = torch.zeros(1 << 20, device="cuda", dtype=torch.float32)
    q = torch.randn(1, 64, 1, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 64, 4096, 128, device="cuda", dtype=torch.bfloat16)

    def adds(n):
        for _ in range(n):
            x.add_(1)

    def ours():
        launch(_add_one, (triton.cdiv(y.numel(), 1024),), (y, y.numel()), dict(BLOCK=1024))

    def jit():
        _add_one[(triton.cdiv(y.numel(), 1024),)](y, y.numel(), BLOCK=1024)

    def sdpa():
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv)

    cases = {
        "torch": lambda: adds(40),
        "+triton": lambda: (adds(20), ours(), adds(20)),
        "+triton-jit": lambda: (adds(20), jit(), adds(20)),
        "+triton-x4": lambda: [(adds(10), ours()) for _ in range(4)],
        "+torch-x4": lambda: [(adds(10), y.add_(1)) for _ in range(4)],  # (the same work as a torch kernel)
        "+triton-x4-w1": lambda: [(adds(10), launch(_add_one, (triton.cdiv(y.numel(), 256),), (y, y.numel()),
                                                    dict(BLOCK=256, num_warps=1))) for _ in range(4)],
        "+sdpa": lambda: (adds(20), sdpa(), adds(20)),
        "+sdpa+triton": lambda: (adds(10), ours(), adds(10), sdpa(), adds(20)),
    }
    if args.settle:
        from symmcoll.bench.timing import settle_graphs
        settle_graphs()
    rows = []
    for name in args.cases or list(cases):
        body = cases[name]
        gap, us, kernels = _gaps(_graph(body), profile=not args.no_profile)
        rows.append({"case": name, "median_gap_us": gap, "replay_us": us, "kernels": kernels})
        print(f"{name:14s} median gap {gap:5.2f} us   replay {us:7.1f} us   {kernels} kernels", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
