"""all_to_all beyond what test_data_movement covers for pull: the sentinel and copy_engine algorithms
(equal and listed splits, words equal to the sentinel, multi-launch pieces), device-side splits
(every algorithm that takes them, against the reference; the received counts; max_rows too small and
invalid counts reported naming the argument, the workspace staying usable), what "auto" runs without a
table rule, and the fake implementation of the device-splits op. GPU-only: random splits over 200
calls and CUDA-graph replays with new splits and data."""

import os
import random

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import plan, reference
from symmcoll.launcher import LAUNCH_COUNTS

from rank_checks import assert_bits_equal, assert_clean_finish, assert_pads_zero, device, dtype_coded

EMPTY_WORD = -2147450880  # the sentinel's reserved word: data equal to it must still arrive


def _with_sentinel_words(x: torch.Tensor) -> torch.Tensor:
    """Plant the sentinel's bit pattern in every 7th 4-byte word of x."""
    words = x.reshape(-1).view(torch.uint8)
    words = words[:words.numel() // 4 * 4].view(torch.int32)
    words[::7] = EMPTY_WORD
    return x


def _listed(rank, world, case):
    if case == 0:
        return [(rank + 2 * j) % 4 * 30 for j in range(world)]  # up to 90 rows: several sentinel pieces
    return [0 if j == rank else j + 1 for j in range(world)]     # nothing to myself


# (dtype, row shape, splits): rows of whole 4-byte words (the sentinel's own path) and one of 3 bytes
# (the sentinel runs pull instead); equal and listed splits.
CASES = [(torch.int32, (16,), 0), (torch.bfloat16, (6,), None), (torch.float8_e4m3fn, (4, 2), 1),
         (torch.int64, (3,), None), (torch.uint8, (3,), 1)]


def _algorithm_cases(algorithm):
    rank, world = dist.get_rank(), dist.get_world_size()
    for call, (dtype, row, case) in enumerate(CASES):
        splits = None if case is None else _listed(rank, world, case)
        rows = world * 5 if splits is None else sum(splits)
        x = _with_sentinel_words(dtype_coded((rows, *row), dtype, rank, call))
        snapshot = x.clone()
        before = LAUNCH_COUNTS["sentinel_all_to_all_kernel"]
        got = symmcoll.all_to_all(x, splits=splits, algorithm=algorithm)
        assert_bits_equal(got, reference.all_to_all(x, splits=splits), f"{algorithm} {dtype} rows {row} splits {splits}")
        assert_bits_equal(x, snapshot, f"{algorithm}: input must not change")
        if algorithm == "sentinel" and case == 0:  # 90 rows of 16 words: 2 CPU pieces of 1024 words, 1 on a GPU
            pieces = 2 if x.device.type == "cpu" else 1
            assert LAUNCH_COUNTS["sentinel_all_to_all_kernel"] - before == pieces
    assert_pads_zero(f"after {algorithm}")
    return True


@pytest.mark.parametrize("algorithm", ["sentinel", "copy_engine"])
def test_algorithms_equal_and_listed_splits(pools, world_size, algorithm):
    assert pools(world_size).run(_algorithm_cases, algorithm) == [True] * world_size


def _device_case(rng, world, call):
    """Every rank's splits (zeros included), the common bound, rows of padding nobody sends."""
    splits = [[rng.choice([0, 0, 1, 3, 17]) for _ in range(world)] for _ in range(world)]
    max_rows = max(sum(column) for column in zip(*splits)) + call % 2
    return splits, max_rows, rng.randrange(3)


def _expected(inputs, all_splits, rank):
    """What ``rank`` receives, from every rank's input and splits (no communication)."""
    return torch.cat([inputs[s][sum(all_splits[s][:rank]):][:all_splits[s][rank]] for s in range(len(inputs))])


def _call_and_check(x, splits, max_rows, algorithm):
    """A device-splits call and the check that surfaces what its kernel reported (on CPU the call
    itself raises; on GPU the next check after a synchronisation does)."""
    symmcoll.all_to_all(x, splits=splits, max_rows=max_rows, algorithm=algorithm)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    symmcoll.check()


def _device_splits(algorithm):
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(11)  # the same cases on every rank
    for call, (dtype, row) in enumerate([(torch.bfloat16, (8,)), (torch.int32, (1,)), (torch.uint8, (12,)),
                                         (torch.int64, (2, 3))]):
        all_splits, max_rows, pad = _device_case(rng, world, call)
        mine = all_splits[rank]
        x = _with_sentinel_words(dtype_coded((sum(mine) + pad, *row), dtype, rank, call))
        counts = torch.tensor(mine, dtype=(torch.int32, torch.int64)[call % 2], device=device())
        out, received = symmcoll.all_to_all(x, splits=counts, max_rows=max_rows, algorithm=algorithm)
        what = f"{algorithm} device splits {all_splits} max_rows {max_rows} {dtype}"
        assert out.shape == (max_rows, *row) and received.dtype == torch.int64, what
        assert received.tolist() == [all_splits[s][rank] for s in range(world)], (what, received)
        want = reference.all_to_all(x[:sum(mine)].contiguous(), splits=mine)
        assert_bits_equal(out[:want.shape[0]], want, what)
    assert_pads_zero(f"after {algorithm} device splits")

    # Rank 0 is sent 3 rows by everyone, more than max_rows: it alone raises, naming max_rows; the
    # workspace stays usable. (Expected results are computed locally: the ranks' paths differ here.)
    splits = [3 if j == 0 else 1 for j in range(world)]
    inputs = [dtype_coded((sum(splits), 4), torch.int32, r, 7) for r in range(world)]
    if rank == 0:
        with pytest.raises(symmcoll.SymmcollArgumentError, match=rf"max_rows = {world + 1} is too small: {3 * world}"):
            _call_and_check(inputs[rank], torch.tensor(splits, device=device()), world + 1, algorithm)
    else:
        out, received = symmcoll.all_to_all(inputs[rank], splits=torch.tensor(splits, device=device()),
                                            max_rows=world + 1, algorithm=algorithm)
        assert_bits_equal(out[:world], _expected(inputs, [splits] * world, rank), f"{algorithm} beside an overflow")
    # Rank 1 asks for more rows than it has: it alone raises, naming splits; the others get what it has.
    inputs = [dtype_coded((2 * world - (r == 1), 4), torch.int32, r, 8) for r in range(world)]
    sent = [[min(2, max(0, x.shape[0] - 2 * j)) for j in range(world)] for x in inputs]
    splits = torch.tensor([2] * world, device=device())
    if rank == 1:
        with pytest.raises(symmcoll.SymmcollArgumentError, match="splits"):
            _call_and_check(inputs[rank], splits, 2 * world, algorithm)
    else:
        out, received = symmcoll.all_to_all(inputs[rank], splits=splits, max_rows=2 * world, algorithm=algorithm)
        assert received.tolist() == [sent[s][rank] for s in range(world)], received
        assert_bits_equal(out[:int(received.sum())], _expected(inputs, sent, rank), f"{algorithm} clamped")
    x = dtype_coded((world, 2), torch.int32, rank, 9)
    out, received = symmcoll.all_to_all(x, splits=torch.ones(world, dtype=torch.int64, device=device()),
                                        max_rows=world, algorithm=algorithm)
    assert_bits_equal(out, reference.all_to_all(x), f"{algorithm} after the reports")
    assert_clean_finish(f"after {algorithm} reports")
    return True


@pytest.mark.parametrize("algorithm", ["pull", "sentinel", "nccl"])
def test_device_splits(pools, world_size, algorithm):
    assert pools(world_size).run(_device_splits, algorithm) == [True] * world_size


def _argument_errors():
    world = dist.get_world_size()
    x = torch.ones(world, 2, device=device())
    good = torch.ones(world, dtype=torch.int64, device=device())
    for splits, max_rows, pattern in [(good, None, "max_rows is required"), (good, -1, "max_rows must be >= 0"),
                                      (good, 2.5, "max_rows must be an int"),
                                      (torch.ones(world + 1, dtype=torch.int64), 4, r"splits must be .* shape"),
                                      (torch.ones(world), 4, "splits must be an int32/int64"),
                                      (torch.ones(2, world, dtype=torch.int64).t()[0], 4, "splits must be contiguous"),
                                      (None, 4, "max_rows is only for splits given as a device tensor"),
                                      ([1] * world, 4, "max_rows is only for splits given as a device tensor")]:
        with pytest.raises(ValueError, match=pattern):
            symmcoll.all_to_all(x, splits=splits, max_rows=max_rows)
    # the fake implementation gives the real shapes (the row count is the caller's bound)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        out, received = torch.ops.symmcoll.all_to_all_splits(mode.from_tensor(x), mode.from_tensor(good), 9,
                                                             dist.group.WORLD.group_name, "auto")
    assert out.shape == (9, 2) and received.shape == (world,) and received.dtype == torch.int64
    return True


def test_argument_errors_and_fake_shapes(pools):
    assert pools(2).run(_argument_errors) == [True] * 2


def test_auto_without_a_table_rule(monkeypatch):
    """"auto" picks a kernel by size when the table has no rule for all_to_all, and never the backend
    (which would read device-side splits back to the host)."""
    from symmcoll import dispatch

    def request(rows, splits=None, max_rows=None):
        others = ((((4,), torch.int64, torch.device("cpu")),) if splits == plan.DEVICE_SPLITS else ())
        options = (("max_rows", max_rows),) if max_rows is not None else ()
        return plan.Request("all_to_all", (rows, 1024), torch.bfloat16, torch.device("cpu"), splits=splits,
                            others=others, options=options)

    monkeypatch.setattr(dispatch, "choose", lambda *args: None)
    assert plan.choose(request(64), 4, "auto") == "sentinel"             # 128 KB
    assert plan.choose(request(4096), 4, "auto") == "pull"               # 8 MB
    assert plan.choose(request(65536), 4, "auto") == "copy_engine"       # 128 MB
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 65536), 4, "auto") == "pull"
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 16), 4, "auto") == "sentinel"
    monkeypatch.setattr(dispatch, "choose", lambda *args: "nccl")
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 16), 4, "auto") == "sentinel"
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 16), 4, "nccl") == "nccl"  # asked for: it syncs
    assert plan.choose(request(8), 4, "auto") == "nccl"
    # an explicit algorithm that cannot take device splits runs its substitute; so does the sentinel
    # when max_rows would make it launch more than 16 pieces
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 16), 4, "copy_engine") == "pull"
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 16), 4, "sentinel") == "sentinel"
    assert plan.choose(request(8, plan.DEVICE_SPLITS, 65536), 4, "sentinel") == "pull"


# --- GPU only (scripts/gpu_check.sh; reported as NOT RUN elsewhere) ---------------------------------

STRESS_CALLS = int(os.environ.get("SYMMCOLL_STRESS_CALLS", "200"))


def _device_splits_stress(calls, seed):
    """Random device-side splits (zeros, skew, padding), random algorithm and row size, new data every
    call; the expected output computed locally from every rank's (deterministic) input."""
    rng = random.Random(seed)  # the same sequence on every rank
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = 0
    for call in range(calls):
        algorithm = rng.choice(["auto", "pull", "sentinel"])
        row = rng.choice([2, 64, 4096, 7168])
        scale = rng.choice([1, 16, 256])
        all_splits = [[rng.randrange(scale) if rng.random() < 0.8 else 0 for _ in range(world)] for _ in range(world)]
        max_rows = max(sum(column) for column in zip(*all_splits)) + rng.randrange(4)
        inputs = [dtype_coded((sum(s) + 1, row), torch.bfloat16, r, call) for r, s in enumerate(all_splits)]
        counts = torch.tensor(all_splits[rank], dtype=torch.int32, device="cuda")
        out, received = symmcoll.all_to_all(inputs[rank], splits=counts, max_rows=max_rows, algorithm=algorithm)
        want = _expected(inputs, all_splits, rank)
        wrong += int((out[:want.shape[0]].view(torch.int16) != want.view(torch.int16)).sum())
        wrong += int((received.cpu() != torch.tensor([all_splits[s][rank] for s in range(world)])).sum())
    assert_clean_finish("after device-splits stress")
    return wrong


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
def test_device_splits_gpu_stress(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_device_splits_stress, STRESS_CALLS, 99 + ws, timeout=900) == [0] * ws


def _graph_replays(algorithm, row, replays):
    """Device-side splits captured in a CUDA graph: each replay takes new splits and new data."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = random.Random(5)
    max_rows = 64 * world
    x = torch.empty((64 * world, row), dtype=torch.bfloat16, device="cuda")
    counts = torch.zeros(world, dtype=torch.int64, device="cuda")
    symmcoll.all_to_all(x, splits=counts, max_rows=max_rows, algorithm=algorithm)  # workspace, compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, received = symmcoll.all_to_all(x, splits=counts, max_rows=max_rows, algorithm=algorithm)
    for replay in range(replays):
        all_splits = [[rng.randrange(65) for _ in range(world)] for _ in range(world)]  # sums within both bounds
        inputs = [dtype_coded((64 * world, row), torch.bfloat16, r, replay) for r in range(world)]
        x.copy_(inputs[rank])
        counts.copy_(torch.tensor(all_splits[rank]))
        graph.replay()
        want = _expected(inputs, all_splits, rank)
        assert received.tolist() == [all_splits[s][rank] for s in range(world)], (replay, received)
        assert_bits_equal(out[:want.shape[0]], want, f"{algorithm} graph replay {replay}")
    assert_clean_finish("after graph replays")
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("algorithm", ["pull", "sentinel"])
@pytest.mark.parametrize("row", [8, 4096])
def test_device_splits_cuda_graph(pools, ws, algorithm, row):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_graph_replays, algorithm, row, 20) == [20] * ws
