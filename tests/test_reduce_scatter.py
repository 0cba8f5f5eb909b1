"""reduce_scatter: every op x dtype against reference.reduce_scatter, rank-coded small-integer inputs
(exact for sum/max/min, tolerance for avg), three back-to-back calls with changing data and shapes, pads
back to zero after each call, shape rules, and pieces larger than the workspace."""

import math
import os
import random

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference
from symmcoll.comm import sentinel
from symmcoll.plan import CPU_CONFIG

from rank_checks import (assert_clean_finish, assert_close, assert_pads_zero, device, random_input, rank_coded,
                         with_workspace_bytes)

BLOCK = CPU_CONFIG.block
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
OPS = ["sum", "avg", "max", "min"]
ALGORITHMS = sorted(symmcoll.ALGORITHMS["reduce_scatter"])
# Output shapes (x has W times as many rows): one element, odd and 2-d, a block plus a tail,
# ~10^4 elements, 3-d.
SHAPES = [(1,), (7, 3), (BLOCK + 3,), (5, 2001), (3, 5, 7)]


def _input(out_shape, dtype, rank, call, world):
    shape = (world * out_shape[0], *out_shape[1:])
    return rank_coded(math.prod(shape), dtype, rank, call).reshape(shape)


def _check(x, op, algorithm, what):
    snapshot = x.clone()
    got = symmcoll.reduce_scatter(x, op=op, algorithm=algorithm)
    assert_close(got, reference.reduce_scatter(x, op=op), what, exact=op != "avg")
    assert_close(x, snapshot, f"{what}: input must not change", exact=True)
    assert_pads_zero(f"after {what}")


def _every_op(dtype, algorithm):
    rank, world = dist.get_rank(), dist.get_world_size()
    shift = DTYPES.index(dtype)
    for i, op in enumerate(OPS):
        for call in range(3):
            shape = SHAPES[(i + call + shift) % len(SHAPES)]
            x = _input(shape, dtype, rank, call, world)
            _check(x, op, algorithm, f"{algorithm} {op} {dtype} out{shape} call {call}")
    # random (non-integer) data: tolerance
    x = random_input(world * 2001, dtype, rank, 7).reshape(world * 3, 667)
    got = symmcoll.reduce_scatter(x, algorithm=algorithm)
    assert_close(got, reference.reduce_scatter(x), f"{algorithm} random {dtype}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_scatter(pools, world_size, dtype, algorithm):
    pools(world_size).run(_every_op, dtype, algorithm)


def _rejects_bad_input():
    world, dev = dist.get_world_size(), device()
    with pytest.raises(ValueError, match=rf"shape \({world + 1}, 2\)"):
        symmcoll.reduce_scatter(torch.ones(world + 1, 2, device=dev))
    with pytest.raises(ValueError, match="dimension"):
        symmcoll.reduce_scatter(torch.tensor(1.0, device=dev))
    with pytest.raises(ValueError, match="dtype"):
        symmcoll.reduce_scatter(torch.ones(world, dtype=torch.int32, device=dev), algorithm="pull")
    # "auto" sends what no kernel supports to the process group's collective: same answer.
    ints = torch.full((2 * world,), dist.get_rank() + 1, dtype=torch.int32, device=dev)
    assert symmcoll.reduce_scatter(ints).tolist() == [world * (world + 1) // 2] * 2
    with pytest.raises(ValueError, match="contiguous"):
        symmcoll.reduce_scatter(torch.ones(4, 2 * world, device=dev).t())
    with pytest.raises(ValueError, match="op"):
        symmcoll.reduce_scatter(torch.ones(world, device=dev), op="prod")
    with pytest.raises(ValueError, match="algorithm"):
        symmcoll.reduce_scatter(torch.ones(world, device=dev), algorithm="nope")
    with pytest.raises(ValueError, match="x is on meta"):
        symmcoll.reduce_scatter(torch.ones(world, device="meta"))
    # empty: the right shape, nothing launched
    assert symmcoll.reduce_scatter(torch.ones(0, 3, device=dev)).shape == (0, 3)
    assert symmcoll.reduce_scatter(torch.ones(2 * world, 0, device=dev)).shape == (2, 0)
    assert_pads_zero("after rejections")


def test_reduce_scatter_rejects_bad_input(pools, world_size):
    pools(world_size).run(_rejects_bad_input)


def _larger_than_workspace():
    """Segments larger than the workspace (and than the sentinel's slot rows): the launch counts prove
    that the chunked loops ran."""
    from symmcoll.launcher import LAUNCH_COUNTS
    rank, world = dist.get_rank(), dist.get_world_size()
    assert symmcoll.get_workspace().buffer_bytes == 4096
    # Segments of 36000 bytes; on a GPU the sentinel's segments go just past its GPU slot rows.
    for call, (dtype, op, shape) in enumerate([(torch.float32, "sum", (9000,)),
                                               (torch.bfloat16, "max", (700, 3)),
                                               (torch.float16, "avg", (2049,))]):
        for algorithm in ALGORITHMS:
            if call == 0 and algorithm == "sentinel" and device().type == "cuda":
                shape = (sentinel.row_words("two_shot", "cuda", world) + 5,)
            elif call == 0:
                shape = (9000,)
            x = _input(shape, dtype, rank, call, world)
            before = sum(LAUNCH_COUNTS.values())
            _check(x, op, algorithm, f"chunked {algorithm} {op} {dtype} out{shape} call {call}")
            launches = sum(LAUNCH_COUNTS.values()) - before
            if call == 0:
                assert launches >= 2, f"{algorithm}: {launches} launch(es) for segments of {4 * shape[0]} bytes"


def test_reduce_scatter_larger_than_workspace(pools, world_size):
    pools(world_size).run(with_workspace_bytes, 4096, _larger_than_workspace)


def _pipelined_sentinel(lag: int):
    """The sentinel with SYMMCOLL_RS_SENTINEL_LAG's push-ahead, several blocks per program (a forced small
    launch config: 256-word blocks, 2 programs), in pieces and not, tails, every op, three calls."""
    from symmcoll import debug_switches
    from symmcoll.plan import LaunchConfig, resolve
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = LaunchConfig(block=256, max_programs=2, num_warps=4)
    row = sentinel.row_words("two_shot", device().type, world)
    saved, debug_switches.RS_SENTINEL_LAG = debug_switches.RS_SENTINEL_LAG, lag
    try:
        # bf16 segments of 2 words (one block, one program), 7 blocks + a tail, and a row and a half (two
        # launches); fp32 a block plus one word.
        for call, (dtype, op, numel) in enumerate([(torch.bfloat16, "sum", 4), (torch.bfloat16, "max", 2 * 7 * 256 + 6),
                                                   (torch.bfloat16, "sum", 3 * row), (torch.float32, "min", 257)]):
            x = _input((numel,), dtype, rank, call, world)
            got = resolve("reduce_scatter", x, None, "sentinel", reduce_op=op, config=cfg).execute(x)
            assert_close(got, reference.reduce_scatter(x, op=op), f"sentinel lag {lag} {op} {dtype} {numel}",
                         exact=True)
            assert_pads_zero(f"after sentinel lag {lag} call {call}")
    finally:
        debug_switches.RS_SENTINEL_LAG = saved


@pytest.mark.parametrize("lag", [1, 2, 9])
def test_reduce_scatter_sentinel_pipelined(pools, world_size, lag):
    pools(world_size).run(_pipelined_sentinel, lag)


# --- GPU only (scripts/gpu_check.sh; reported as NOT RUN elsewhere) ---------------------------------

STRESS_CALLS = int(os.environ.get("SYMMCOLL_STRESS_CALLS", "200"))


def _expected(out_shape, dtype, op, world, rank, call):
    """The exact reduce-scatter of rank-coded small integers, computed locally (no communication)."""
    xs = [_input(out_shape, torch.float32, r, call, world) for r in range(world)]
    acc = xs[0]
    for x in xs[1:]:
        acc = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum}[op](acc, x)
    return acc[rank * out_shape[0]:(rank + 1) * out_shape[0]].to(dtype)


def _stress(calls, seed):
    rng = random.Random(seed)  # the same sequence on every rank
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = 0
    for call in range(calls):
        dtype, op = rng.choice(DTYPES), rng.choice(["sum", "max", "min"])
        row = rng.choice([1, 7, 4096])
        rows = max(1, int(2 ** rng.uniform(1, 26)) // (row * dtype.itemsize * world))
        x = _input((rows, row), dtype, rank, call, world)
        got = symmcoll.reduce_scatter(x, op=op, algorithm=rng.choice(["auto", *ALGORITHMS]))
        wrong += int((got != _expected((rows, row), dtype, op, world, rank, call)).sum())
    assert_clean_finish("after stress")
    return wrong


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
def test_reduce_scatter_gpu_stress(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    wrong = pools(ws).run(_stress, STRESS_CALLS, 5678 + ws, timeout=900)
    assert wrong == [0] * ws, wrong


def _graph_replay(out_shape, replays, algorithm):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = _input(out_shape, torch.bfloat16, rank, 0, world)
    symmcoll.reduce_scatter(x, algorithm=algorithm)  # workspace + compilation before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [symmcoll.reduce_scatter(x, op=op, algorithm=algorithm) for op in ("sum", "max")]
    for replay in range(1, replays + 1):
        x.copy_(_input(out_shape, torch.bfloat16, rank, replay, world))
        graph.replay()
        for op, out in zip(("sum", "max"), outs):
            assert_close(out, _expected(out_shape, torch.bfloat16, op, world, rank, replay),
                         f"{algorithm} {op} graph replay {replay}", exact=True)
    assert_pads_zero("after graph replays")
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("out_shape", [(1,), (4097,), (1024, 1024)])
@pytest.mark.parametrize("algorithm", ["auto", *ALGORITHMS])
def test_reduce_scatter_cuda_graph(pools, ws, out_shape, algorithm):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_graph_replay, out_shape, 10, algorithm) == [10] * ws
