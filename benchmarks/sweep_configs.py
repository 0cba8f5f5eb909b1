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
from symmcoll.comm import all_reduce, all_reduce_low_latency, all_reduce_sentinel, reduce_scatter
from symmcoll.bench.plan import TimingPlan
from symmcoll.bench.timing import CapturedCalls, time_graph
from symmcoll.comm._common import LaunchConfig

CALLS_PER_GRAPH = 10
REPLAYS = 15

_PUSH_SIZES = [4 << 20, 16 << 20, 64 << 20, 256 << 20]  # all-reduce: tensor bytes; rs_: output bytes
_PUSH_CONFIGS = [LaunchConfig(b, p, 16) for b, p in itertools.product((8192, 16384, 32768), (132, 264))] + [
    LaunchConfig(16384, 264, 8)]

def _sentinel(kind: str, tiles: bool):
    """A sentinel all-reduce with the per-peer or the peer-tile kernel (all_reduce_sentinel.PEER_TILES; the
    two-shot has only the tile kernel since the 2026-11-22 sweep, which compared it with the per-peer one)."""
    fn = all_reduce_sentinel.sentinel_one_shot if kind == "one_shot" else all_reduce_sentinel.sentinel_two_shot

    def call(x, config):
        all_reduce_sentinel.PEER_TILES = tiles
        return fn(x, config=config)
    return call


_SENTINEL_ONE_SHOT_SIZES = [4 << 10, 32 << 10, 128 << 10, 256 << 10, 1 << 20]
_SENTINEL_TWO_SHOT_SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20, 32 << 20, 64 << 20]

SWEEPS = {
    "two_shot": (all_reduce.two_shot, [1 << 20, 16 << 20, 256 << 20],
                 [LaunchConfig(b, p, w) for b, p, w in itertools.product((2048, 4096, 8192), (32, 64, 132),
                                                                         (8, 16))]),
    "one_shot": (all_reduce.one_shot, [256 << 10, 1 << 20, 16 << 20],
                 [LaunchConfig(b, p, w) for b, p, w in itertools.product((2048, 4096), (16, 32, 64, 132),
                                                                         (8, 16))]),
    "low_latency": (all_reduce_low_latency.low_latency, [4 << 10, 64 << 10, 256 << 10],
                    [LaunchConfig(b, p, w) for b, p, w in itertools.product((128, 256, 512, 1024),
                                                                            (128, 256), (2, 4, 8))]),
    "sentinel_one_shot": (all_reduce_sentinel.sentinel_one_shot,
                          [4 << 10, 32 << 10, 128 << 10, 256 << 10, 1 << 20],
                          [LaunchConfig(b, p, w) for b, p, w in itertools.product((256, 512, 1024),
                                                                                  (64, 128, 256), (4, 8))]),
    "sentinel_two_shot": (all_reduce_sentinel.sentinel_two_shot,
                          [128 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20],
                          [LaunchConfig(b, p, w) for b, p, w in itertools.product((512, 1024, 2048, 4096),
                                                                                  (64, 132, 264), (4, 8, 16))]),
    # Focused re-sweeps of the sentinel kernels where the targets were missed (256 KB, 4 MB on 4 ranks).
    "sentinel_one_shot_small": (all_reduce_sentinel.sentinel_one_shot, [128 << 10, 256 << 10],
                                [LaunchConfig(b, p, w) for b, p, w in itertools.product(
                                    (256, 512, 1024), (64, 128, 256), (4, 8))]),
    "sentinel_two_shot_mid": (all_reduce_sentinel.sentinel_two_shot, [256 << 10, 1 << 20, 4 << 20, 16 << 20],
                              [LaunchConfig(b, p, w) for b, p, w in itertools.product(
                                  (512, 1024, 2048), (132, 264), (4, 8))]),
    # Push reduce-scatter (rounds of one block per program) alone and as the all-reduce's first half.
    "push_copy_engine": (all_reduce.push_copy_engine, _PUSH_SIZES, _PUSH_CONFIGS),
    "rs_push": (reduce_scatter.push, _PUSH_SIZES, _PUSH_CONFIGS),
    # Third round, where the perf-3 bench still missed: 256 KB and 16-64 MB (more programs per SM).
    "sentinel_one_shot_256k": (all_reduce_sentinel.sentinel_one_shot, [256 << 10],
                               [LaunchConfig(b, p, 4) for b, p in itertools.product((128, 256), (256, 384, 512))]),
    "sentinel_two_shot_large": (all_reduce_sentinel.sentinel_two_shot, [16 << 20, 32 << 20],
                                [LaunchConfig(1024, 264, 4), LaunchConfig(2048, 264, 8), LaunchConfig(1024, 396, 4),
                                 LaunchConfig(1024, 528, 4), LaunchConfig(2048, 396, 4), LaunchConfig(512, 528, 4)]),
    "push_copy_engine_mid": (all_reduce.push_copy_engine, [32 << 20, 64 << 20],
                             [LaunchConfig(16384, 264, 16), LaunchConfig(8192, 264, 16), LaunchConfig(32768, 264, 8),
                              LaunchConfig(16384, 396, 8), LaunchConfig(8192, 396, 8)]),
    # Peer tiles (one load/poll for all peers of a block) against the per-peer one-shot and its table.
    "sentinel_one_shot_tiles": (_sentinel("one_shot", True), _SENTINEL_ONE_SHOT_SIZES,
                                [LaunchConfig(b, p, 4) for b, p in ((128, 512), (256, 256), (256, 128), (512, 128),
                                                                    (128, 256))]),
    "sentinel_one_shot_base": (_sentinel("one_shot", False), _SENTINEL_ONE_SHOT_SIZES,
                               [LaunchConfig(256, 128, 4), LaunchConfig(256, 256, 4), LaunchConfig(128, 512, 4)]),
    "sentinel_two_shot_tiles": (_sentinel("two_shot", True), _SENTINEL_TWO_SHOT_SIZES,
                                [LaunchConfig(b, p, w) for b, p, w in ((512, 132, 4), (512, 264, 4), (512, 528, 4),
                                                                       (1024, 264, 4), (1024, 528, 4), (2048, 264, 8))]),
    # Larger blocks / more programs than the first sweep tried, where its trend had not flattened.
    "two_shot_large": (all_reduce.two_shot, [16 << 20, 64 << 20, 256 << 20],
                       [LaunchConfig(b, p, 16) for b, p in itertools.product((8192, 16384), (132, 264))]),
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
    parser.add_argument("--algorithms", nargs="+", default=list(SWEEPS))
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
