"""Launch-config sweep for the all-reduce and reduce-scatter kernels (GPU machine): which LaunchConfig per size.

    PYTHONPATH=src python3 benchmarks/sweep_configs.py --world-size 4 2 --out $OUT/sweep.json

Every config is checked against the exact sum of rank-coded inputs before it is timed (a wrong config
is reported, never timed); times are CUDA-graph replays (10 calls per graph), median of the replays,
slowest rank. The chosen configs go into the modules' size tables by hand, with this file's output
committed beside them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch
import torch.distributed as dist

from symmcoll import launch
from symmcoll.bench.plan import TimingPlan
from symmcoll.bench.timing import CapturedCalls, time_graph
from symmcoll.plan import LaunchConfig, resolve

CALLS_PER_GRAPH = 10
REPLAYS = 15


def _algorithm(op: str, name: str):
    """``fn(x, config)``: the production algorithm with a forced launch config (the resolver's only
    experiment knob)."""
    return lambda x, config: resolve(op, x, None, name, config=config).execute(x)


def _quantized(quantize: str):
    """The quantized all-reduce at the default group size with a forced launch config."""
    from symmcoll.comm.quantized import DEFAULT_GROUP_SIZE
    return lambda x, config: resolve("all_reduce_quantized", x, None, f"quantized_{quantize}", reduce_op="sum",
                                     config=config, options=(("group_size", DEFAULT_GROUP_SIZE),)).execute(x)


_QUANTIZED_SIZES = [1 << 20, 16 << 20, 64 << 20]
_QUANTIZED_CONFIGS = [LaunchConfig(b, p, w) for b, p, w in itertools.product((512, 1024, 2048), (132, 264, 528),
                                                                               (4, 8))]

_PUSH_SIZES = [4 << 20, 16 << 20, 64 << 20, 256 << 20]  # all-reduce: tensor bytes; rs_: output bytes
_PUSH_CONFIGS = [LaunchConfig(b, p, 16) for b, p in itertools.product((8192, 16384, 32768), (132, 264))] + [
    LaunchConfig(16384, 264, 8)]

# name -> (fn(x, config), sizes, configs). Earlier rounds (peer tiles against the per-peer kernels,
# push_copy_engine pieces) are in benchmarks/results/2026-11-2*-sweep*; their variants are gone.
SWEEPS = {
    "two_shot": (_algorithm("all_reduce", "two_shot"), [1 << 20, 16 << 20, 256 << 20],
                 [LaunchConfig(b, p, w) for b, p, w in itertools.product((2048, 4096, 8192), (32, 64, 132),
                                                                         (8, 16))]),
    "one_shot": (_algorithm("all_reduce", "one_shot"), [256 << 10, 1 << 20, 16 << 20],
                 [LaunchConfig(b, p, w) for b, p, w in itertools.product((2048, 4096), (16, 32, 64, 132),
                                                                         (8, 16))]),
    "low_latency": (_algorithm("all_reduce", "low_latency"), [4 << 10, 64 << 10, 256 << 10],
                    [LaunchConfig(b, p, w) for b, p, w in itertools.product((128, 256, 512, 1024),
                                                                            (128, 256), (2, 4, 8))]),
    "sentinel_one_shot": (_algorithm("all_reduce", "sentinel_one_shot"),
                          [4 << 10, 32 << 10, 128 << 10, 256 << 10, 1 << 20],
                          [LaunchConfig(b, p, w) for b, p, w in itertools.product((128, 256, 512, 1024),
                                                                                  (64, 128, 256, 512), (4, 8))]),
    "sentinel_two_shot": (_algorithm("all_reduce", "sentinel_two_shot"),
                          [128 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20],
                          [LaunchConfig(b, p, w) for b, p, w in itertools.product((512, 1024, 2048),
                                                                                  (132, 264, 528), (4, 8))]),
    "push_copy_engine": (_algorithm("all_reduce", "push_copy_engine"), _PUSH_SIZES, _PUSH_CONFIGS),
    "rs_push": (_algorithm("reduce_scatter", "push"), _PUSH_SIZES, _PUSH_CONFIGS),
    "rs_sentinel": (_algorithm("reduce_scatter", "sentinel"), [64 << 10, 1 << 20, 16 << 20],
                    [LaunchConfig(b, p, 4) for b, p in itertools.product((512, 1024), (132, 264, 528))]),
    # Lossy: checked bit for bit against reference.all_reduce_quantized instead of the exact sum.
    "quantized_int8": (_quantized("int8"), _QUANTIZED_SIZES, _QUANTIZED_CONFIGS),
    "quantized_fp8": (_quantized("fp8"), _QUANTIZED_SIZES, _QUANTIZED_CONFIGS),
    "quantized_int4": (_quantized("int4"), _QUANTIZED_SIZES, _QUANTIZED_CONFIGS),
}


# REPLAYS timed replays of a graph of CALLS_PER_GRAPH calls, after one untimed replay; ranks start together.
_PLAN = TimingPlan(mode="graph", warmup=1, iters=REPLAYS, min_iters=REPLAYS, calls_per_graph=CALLS_PER_GRAPH,
                   seconds_per_case=60.0)


def graph_us(step) -> float:
    """Median us per call of ``step`` over CUDA-graph replays (the bench's timing), slowest rank's."""
    step()  # compile and allocate before the capture
    timing = time_graph(CapturedCalls(step, CALLS_PER_GRAPH), _PLAN, dist.group.WORLD)
    median = torch.tensor([statistics.median(timing.samples_us)], device="cuda")
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return float(median)


def _sweep(algorithms: list[str]) -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for name in algorithms:
        fn, sizes, configs = SWEEPS[name]
        for nbytes in sizes:
            # Reduce-scatter sweeps (rs_*) take sizes as output bytes per rank, like the bench.
            numel = nbytes // 2 * (world if name.startswith("rs_") else 1)
            i = torch.arange(numel, device="cuda")
            x = ((i * 7 + rank * 13) % 17 - 8).to(torch.bfloat16)
            want = sum(((i * 7 + r * 13) % 17 - 8) for r in range(world)).to(torch.bfloat16)
            if name.startswith("rs_"):
                want = want.chunk(world)[rank]
            if name.startswith("quantized_"):
                from symmcoll import reference
                from symmcoll.comm.quantized import DEFAULT_GROUP_SIZE
                want = reference.all_reduce_quantized(x, None, "sum", name.split("_")[1], DEFAULT_GROUP_SIZE)
            for config in configs:
                row = {"algorithm": name, "bytes": nbytes, "world_size": world, "block": config.block,
                       "max_programs": config.max_programs, "num_warps": config.num_warps}
                wrong = torch.tensor([int((fn(x, config=config) != want).sum())], device="cuda")
                dist.all_reduce(wrong)
                row["wrong"] = int(wrong)
                row["us"] = graph_us(lambda: fn(x, config=config)) if row["wrong"] == 0 else None
                rows.append(row)
                if rank == 0:
                    print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", nargs="+", type=int, default=[4, 2])
    parser.add_argument("--algorithms", nargs="+", default=[n for n in SWEEPS if not n.startswith("quantized_")])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for world in args.world_size:
        rows += launch.run(_sweep, world, args.algorithms, device="cuda", timeout=500)[0]
        with open(args.out, "w") as f:  # after every world size: a later failure keeps these
            json.dump(rows, f, indent=0)
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["algorithm"], r["world_size"], r["bytes"])
        if r["us"] is not None and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
        if r["wrong"]:
            print("WRONG", r)
    for key, r in sorted(best.items()):
        print(f"{key}: best {r['us']:.2f} us block={r['block']} programs={r['max_programs']} "
              f"warps={r['num_warps']}")


if __name__ == "__main__":
    main()
