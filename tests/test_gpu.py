"""GPU-only checks (run by scripts/gpu_check.sh on the GPU machine; reported as NOT RUN elsewhere):
a long stress of back-to-back calls of every collective with random sizes and changing data, and
CUDA-graph replay of every all-reduce algorithm."""

import os
import random

import pytest
import torch
import torch.distributed as dist

import symmcoll

from rank_checks import assert_clean_finish, assert_close, assert_pads_zero, rank_coded

pytestmark = pytest.mark.gpu

STRESS_CALLS = int(os.environ.get("SYMMCOLL_STRESS_CALLS", "1000"))
MAX_BYTES = 64 << 20


def _expected_sum(numel, dtype, world, call):
    """The exact all-reduce of rank_coded inputs, computed locally (no communication)."""
    acc = rank_coded(numel, torch.float32, 0, call)
    for r in range(1, world):
        acc += rank_coded(numel, torch.float32, r, call)
    return acc.to(dtype)


def _expected(op, numel, dtype, world, rank, call, src):
    """The exact result of ``op`` on rank_coded inputs of every rank, computed locally."""
    inputs = [rank_coded(numel, dtype, r, call) for r in range(world)]
    if op == "all_reduce":
        return _expected_sum(numel, dtype, world, call)
    if op == "reduce_scatter":
        seg = numel // world
        return _expected_sum(numel, dtype, world, call)[rank * seg:(rank + 1) * seg]
    if op == "all_gather":
        return torch.cat(inputs)
    if op == "all_to_all":
        seg = numel // world
        return torch.cat([inputs[r][rank * seg:(rank + 1) * seg] for r in range(world)])
    return inputs[src]


def _mixed_stress(calls, seed):
    """Back-to-back calls of every collective and algorithm, random sizes and dtypes, new data."""
    rng = random.Random(seed)  # same sequence on every rank
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [("all_reduce", a) for a in sorted(symmcoll.ALGORITHMS["all_reduce"])] + [("all_reduce", "auto")]
    cases += [(op, "auto") for op in ("reduce_scatter", "all_gather", "all_to_all", "broadcast")]
    cases += [(op, a) for op in ("reduce_scatter", "all_gather") for a in sorted(symmcoll.ALGORITHMS[op])]
    wrong, per_op, total_bytes = 0, {}, 0
    for call in range(calls):
        op, algorithm = rng.choice(cases)
        dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32])
        nbytes = int(2 ** rng.uniform(1, 26))  # log-uniform, 2 B .. 64 MB
        numel = max(world, min(nbytes, MAX_BYTES) // dtype.itemsize // world * world)
        if op == "all_gather":
            numel = max(1, numel // world)
        src = rng.randrange(world)
        x = rank_coded(numel, dtype, rank, call)
        fn = getattr(symmcoll, op)
        got = fn(x, src, algorithm=algorithm) if op == "broadcast" else fn(x, algorithm=algorithm)
        bad = int((got != _expected(op, numel, dtype, world, rank, call, src)).sum())
        wrong += bad
        per_op[f"{op}:{algorithm}"] = per_op.get(f"{op}:{algorithm}", 0) + 1
        total_bytes += numel * dtype.itemsize
    assert_clean_finish("after stress")
    return wrong, per_op, total_bytes


@pytest.mark.parametrize("ws", [2, 4])
def test_mixed_collectives_stress(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    results = pools(ws).run(_mixed_stress, STRESS_CALLS, 1234 + ws, timeout=900)
    print(f"\nstress ws{ws}: {STRESS_CALLS} calls {results[0][1]}: wrong per rank="
          f"{[r[0] for r in results]}, bytes per rank={results[0][2]}")
    assert all(r[0] == 0 for r in results), results


def _graph_replay(algorithm, numel, replays):
    rank, world = dist.get_rank(), dist.get_world_size()
    static_x = rank_coded(numel, torch.bfloat16, rank, 0)
    symmcoll.all_reduce(static_x, algorithm=algorithm)  # workspace + compilation before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [symmcoll.all_reduce(static_x, algorithm=algorithm) for _ in range(3)]
    for replay in range(1, replays + 1):
        static_x.copy_(rank_coded(numel, torch.bfloat16, rank, replay))
        graph.replay()
        want = _expected_sum(numel, torch.bfloat16, world, replay)
        for i, out in enumerate(outs):
            assert_close(out, want, f"{algorithm} graph replay {replay} call {i}", exact=True)
    assert_pads_zero("after graph replays")
    return replays


@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("numel", [1, 4097, 3 << 20])
def test_all_reduce_cuda_graph(pools, ws, numel):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    for algorithm in sorted(symmcoll.ALGORITHMS["all_reduce"]):
        assert pools(ws).run(_graph_replay, algorithm, numel, 20) == [20] * ws
