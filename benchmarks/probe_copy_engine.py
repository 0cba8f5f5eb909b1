"""Copy-engine facts for the all-reduce's gather half (GPU machine).

    PYTHONPATH=src python3 benchmarks/probe_copy_engine.py --world-size 4 2 --out $OUT/probe.json

Measures, in CUDA graphs (sweep_configs.graph_us: 10 calls per graph, median of 15 replays, slowest rank):
* ``pull1``: every rank copies N bytes from the next rank's buffer (one copy, one stream);
* ``pull_serial`` / ``pull_parallel``: from each of the W-1 peers, N bytes each, on one stream / on
  W-1 streams; ``push_parallel``: N bytes into each peer's buffer, W-1 streams;
* ``barrier``: the one-program barrier kernel alone;
* ``rs_push`` + ``pull_parallel`` together (the push reduce-scatter kernel on the main stream while
  the copy engines pull on side streams) against each alone: do SM stores and copy engines add up?
* ``push_copy_engine`` and ``sentinel_two_shot`` at 4-128 MB, checked against the exact sum of
  rank-coded inputs before they are timed. (An earlier version also cut push_copy_engine into pieces
  and ran its copies on side streams: slower everywhere, benchmarks/results/2026-11-22-probe; gone.)
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch
from symmcoll.language import barrier_kernel
from symmcoll.launcher import launch as launch_kernel
from symmcoll.memory import get_workspace
from sweep_configs import graph_us  # benchmarks/ is on sys.path when run as a script

MB = 1 << 20


def _on_side_streams(streams, copies):
    """Run copies[i] on streams[i], forked from and joined back into the current stream."""
    main = torch.cuda.current_stream()
    for side, copy in zip(streams, copies):
        side.wait_stream(main)
        with torch.cuda.stream(side):
            copy()
    for side in streams:
        main.wait_stream(side)


def _probe() -> list[dict]:
    rank, world = dist.get_rank(), dist.get_world_size()
    ws = get_workspace()
    peers = [(rank + k) % world for k in range(1, world)]
    streams = [torch.cuda.Stream() for _ in range(world - 1)]
    rows = []

    def record(case, nbytes, us, **extra):
        row = {"case": case, "world_size": world, "bytes": nbytes, "us": us, **extra}
        if us is not None and nbytes:
            row["gbps"] = nbytes / us / 1e3
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)

    dst = torch.empty(64 * MB * (world - 1), dtype=torch.uint8, device="cuda")
    src = torch.randint(0, 255, (64 * MB,), dtype=torch.uint8, device="cuda")
    for n in (1 * MB, 4 * MB, 16 * MB, 64 * MB):
        record("pull1", n, graph_us(lambda: dst[:n].copy_(ws.peer_buffer(peers[0])[:n])))
    for n in (1 * MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB):
        pulls = [lambda p=p, i=i: dst[i * n:(i + 1) * n].copy_(ws.peer_buffer(p)[:n]) for i, p in enumerate(peers)]
        pushes = [lambda p=p: ws.peer_buffer(p)[rank * n:(rank + 1) * n].copy_(src[:n]) for p in peers]
        total = n * (world - 1)
        record("pull_serial", total, graph_us(lambda: [c() for c in pulls]))
        record("pull_parallel", total, graph_us(lambda: _on_side_streams(streams, pulls)))
        record("push_parallel", total, graph_us(lambda: _on_side_streams(streams, pushes)))
    record("barrier", 0, graph_us(lambda: launch_kernel(barrier_kernel, (1,), (*ws.kernel_args, 3),
                                                        dict(WORLD=world, num_warps=1))))

    # SM stores (push reduce-scatter of a 16 MB input) and copy-engine pulls at the same time.
    x = torch.randn(8 * MB, dtype=torch.bfloat16, device="cuda")
    n = 4 * MB
    # (reduce_scatter.push stages in its own region: the pulls from the shared buffer do not race it)
    pulls = [lambda p=p, i=i: dst[i * n:(i + 1) * n].copy_(ws.peer_buffer(p)[:n]) for i, p in enumerate(peers)]
    record("rs_push_16M", 16 * MB, graph_us(lambda: symmcoll.reduce_scatter(x, algorithm="push")))
    record("pull_parallel_4M", n * (world - 1), graph_us(lambda: _on_side_streams(streams, pulls)))

    def both():
        main = torch.cuda.current_stream()
        for side, copy in zip(streams, pulls):
            side.wait_stream(main)
            with torch.cuda.stream(side):
                copy()
        symmcoll.reduce_scatter(x, algorithm="push")
        for side in streams:
            main.wait_stream(side)
    record("rs_push_16M+pull_parallel_4M", 16 * MB + n * (world - 1), graph_us(both))

    # push_copy_engine and sentinel_two_shot, checked before timed.
    for nbytes in (4 * MB, 8 * MB, 16 * MB, 32 * MB, 64 * MB, 128 * MB):
        numel = nbytes // 2
        i = torch.arange(numel, device="cuda")
        xin = ((i * 7 + rank * 13) % 17 - 8).to(torch.bfloat16)
        want = sum(((i * 7 + r * 13) % 17 - 8) for r in range(world)).to(torch.bfloat16)
        for name in ("push_copy_engine", "sentinel_two_shot"):
            fn = lambda: symmcoll.all_reduce(xin, algorithm=name)
            wrong = torch.tensor([int((fn() != want).sum())], device="cuda")
            dist.all_reduce(wrong)
            record(name, nbytes, graph_us(fn) if int(wrong) == 0 else None, wrong=int(wrong))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", nargs="+", type=int, default=[4, 2])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for world in args.world_size:
        rows += launch.run(_probe, world, device="cuda", timeout=400)[0]
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=0)


if __name__ == "__main__":
    main()
