"""all_gather, broadcast, all_to_all: bit-exact against reference.py for every dtype the kernels move
(as integer words), rank-coded inputs, back-to-back calls with changing data and shapes (all_gather and
all_to_all: every dtype once, then only an (itemsize, shape) not moved yet), pads back to zero after
each call, variable splits (zero rows included), shape rules, the process-group fallback for itemsizes
with no kernel, and tensors larger than the workspace."""

import logging
import os
import random

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference
from symmcoll.plan import CPU_CONFIG

from rank_checks import (assert_bits_equal, assert_clean_finish, assert_pads_zero, device, dtype_coded,
                         with_workspace_bytes)

DEVICE = os.environ.get("SYMMCOLL_TEST_DEVICE", "cpu")

BLOCK = CPU_CONFIG.block
DTYPES = [torch.bfloat16, torch.float32, torch.int32, torch.int8, torch.uint8, torch.float8_e4m3fn,
          torch.int64, torch.bool, torch.complex64]
# Per-rank shapes: 0-dim, one row, odd and 2-d, a block plus a tail, ~10^4 elements, 3-d.
SHAPES = [(), (1,), (7, 3), (BLOCK + 3,), (5, 2001), (3, 5, 7)]


def _check(what, got, want, x, snapshot):
    assert_bits_equal(got, want, what)
    assert_bits_equal(x, snapshot, f"{what}: input must not change")
    assert_pads_zero(f"after {what}")


def _word_calls(dtypes, shape_of):
    """(dtype, shape, call) of each dtype's three calls, ``shape_of(d, call)`` the shape of dtype d's call,
    less the later calls whose (itemsize, shape) an earlier call already moved: the kernels move integer
    words of the itemsize whatever the dtype (comm/common.as_words), so such a call is the same launch with
    other bits in it. Every dtype keeps its first call."""
    moved = set()
    for d, dtype in enumerate(dtypes):
        for call in range(3):
            shape = shape_of(d, call)
            if call == 0 or (dtype.itemsize, shape) not in moved:
                moved.add((dtype.itemsize, shape))
                yield dtype, shape, call


def _all_gather(dtypes, algorithm="auto"):
    rank = dist.get_rank()
    for dtype, shape, call in _word_calls(dtypes, lambda d, call: SHAPES[(d + call) % len(SHAPES)]):
        x = dtype_coded(shape, dtype, rank, call)
        snapshot = x.clone()
        _check(f"all_gather {algorithm} {dtype} {shape} call {call}",
               symmcoll.all_gather(x, algorithm=algorithm), reference.all_gather(x), x, snapshot)


def _broadcast(dtypes):
    rank, world = dist.get_rank(), dist.get_world_size()
    for d, dtype in enumerate(dtypes):
        for call in range(3):
            shape = SHAPES[(d + call + 2) % len(SHAPES)]
            src = (d + call) % world
            x = dtype_coded(shape, dtype, rank, call)
            snapshot = x.clone()
            _check(f"broadcast {dtype} {shape} src {src} call {call}", symmcoll.broadcast(x, src),
                   reference.broadcast(x, src), x, snapshot)


def _all_to_all_equal(dtypes):
    rank, world = dist.get_rank(), dist.get_world_size()
    no_scalar = SHAPES[1:]
    for dtype, shape, call in _word_calls(dtypes, lambda d, call: no_scalar[(d + call + 4) % len(no_scalar)]):
        shape = (world * shape[0], *shape[1:])
        x = dtype_coded(shape, dtype, rank, call)
        snapshot = x.clone()
        _check(f"all_to_all {dtype} {shape} call {call}", symmcoll.all_to_all(x, algorithm="pull"),
               reference.all_to_all(x), x, snapshot)


def _variable_splits(rank, world, case):
    """Rows this rank sends to each rank, for a few patterns (zero rows included)."""
    if case == 0:
        return [(rank + 2 * j) % 4 for j in range(world)]           # some pairs send nothing
    if case == 1:
        return [5 + rank if j == 0 else 0 for j in range(world)]    # everything to rank 0
    if case == 2:
        return [0] * world if rank == 1 else [j + rank for j in range(world)]  # rank 1 sends nothing
    return [1000 * (j + 1) + 7 * rank for j in range(world)]        # large, uneven


def _all_to_all_splits(dtypes):
    rank, world = dist.get_rank(), dist.get_world_size()
    row_shapes = [(3,), (), (2, 8), (2,)]  # (2, 8): rows of 16 elements, the 16-aligned path
    for case in range(4):
        dtype = dtypes[case % len(dtypes)]
        splits = _variable_splits(rank, world, case)
        x = dtype_coded((sum(splits), *row_shapes[case]), dtype, rank, case)
        snapshot = x.clone()
        got = symmcoll.all_to_all(x, splits=splits, algorithm="pull")
        _check(f"all_to_all {dtype} splits {splits} rows {row_shapes[case]} case {case}", got,
               reference.all_to_all(x, splits=splits), x, snapshot)


# "auto" runs one of these algorithms (on CPU pull, for every call of _all_gather): on CPU it repeated
# test_all_gather[pull] launch for launch, so it runs on a GPU only, where the tuned table picks per size.
# (The CPU runs still reach pull through "auto" in test_larger_than_workspace and the rejections test.)
ALL_GATHERS = sorted(symmcoll.ALGORITHMS["all_gather"]) + (["auto"] if DEVICE != "cpu" else [])


@pytest.mark.parametrize("algorithm", ALL_GATHERS)
def test_all_gather(pools, world_size, algorithm):
    pools(world_size).run(_all_gather, DTYPES, algorithm)


def test_broadcast(pools, world_size):
    pools(world_size).run(_broadcast, DTYPES)


def test_all_to_all_equal_splits(pools, world_size):
    pools(world_size).run(_all_to_all_equal, DTYPES)


def test_all_to_all_variable_splits(pools, world_size):
    pools(world_size).run(_all_to_all_splits, [torch.bfloat16, torch.int64, torch.uint8,
                                               torch.float8_e4m3fn])


def _nccl_all_to_all_counts_once():
    """The process group's all_to_all with equal splits compares the row counts with the peers' on a
    plan's first call only (later calls, and calls under CUDA-graph capture, move the data alone: no host
    read, so auto's NCCL choice can be captured); results stay bit-exact."""
    from symmcoll.comm import backend
    rank, world = dist.get_rank(), dist.get_world_size()
    exchanges = []
    real = dist.all_to_all_single

    def counting(*args, **kwargs):
        exchanges.append(1)
        return real(*args, **kwargs)

    dist.all_to_all_single = counting
    try:
        def calls(rows, call):
            exchanges.clear()
            x = dtype_coded((rows, 3), torch.float32, rank, call)
            got = symmcoll.all_to_all(x, algorithm="nccl")
            made = len(exchanges)  # before the reference's own exchange
            assert_bits_equal(got, reference.all_to_all(x), f"nccl all_to_all rows {rows} call {call}")
            return made
        assert calls(2 * world, 0) == 2  # the counts, then the data
        assert calls(2 * world, 1) == 1  # the same plan: the data alone
        assert calls(2 * world, 2) == 1
        assert calls(3 * world, 3) == 2  # a new shape: compared again
        real_capturing = backend.capturing
        backend.capturing = lambda device: True  # as under torch.cuda.graph: no host read may happen
        try:
            assert calls(4 * world, 4) == 1
        finally:
            backend.capturing = real_capturing
    finally:
        dist.all_to_all_single = real
    symmcoll.reset()


def test_nccl_all_to_all_counts_once(pools, world_size):
    pools(world_size).run(_nccl_all_to_all_counts_once)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _fallback_and_rejections():
    rank, world = dist.get_rank(), dist.get_world_size()
    # complex128 (itemsize 16): no kernel; the process group's collective, logged, same result
    logger = logging.getLogger("symmcoll")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    try:
        x = dtype_coded((world * 2, 3), torch.complex128, rank, 0)
        assert_bits_equal(symmcoll.all_gather(x), reference.all_gather(x), "all_gather complex128")
        assert_bits_equal(symmcoll.broadcast(x, world - 1), reference.broadcast(x, world - 1),
                    "broadcast complex128")
        assert_bits_equal(symmcoll.all_to_all(x), reference.all_to_all(x), "all_to_all complex128")
        splits = _variable_splits(rank, world, 0)
        x = dtype_coded((sum(splits), 2), torch.complex128, rank, 1)
        assert_bits_equal(symmcoll.all_to_all(x, splits=splits), reference.all_to_all(x, splits=splits),
                    "all_to_all complex128 splits")
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    fallbacks = [m for m in records.messages if "complex128" in m and m.endswith(": nccl")]
    assert len(fallbacks) == 4, records.messages

    # bad input: ValueError naming the argument, before anything is launched
    dev = device()
    x = torch.ones(world, 2, device=dev)
    for fn in (symmcoll.all_gather, lambda t: symmcoll.broadcast(t, 0), symmcoll.all_to_all):
        with pytest.raises(ValueError, match="contiguous"):
            fn(torch.ones(2, 2 * world).t())
        with pytest.raises(ValueError, match="x is on meta"):
            fn(torch.ones(world, device="meta"))
    with pytest.raises(ValueError, match="algorithm"):
        symmcoll.all_gather(x, algorithm="nope")
    with pytest.raises(ValueError, match="src"):
        symmcoll.broadcast(x, world)
    with pytest.raises(ValueError, match="src"):
        symmcoll.broadcast(x, "0")
    with pytest.raises(ValueError, match=rf"shape \({world + 1}, 2\)"):
        symmcoll.all_to_all(torch.ones(world + 1, 2, device=dev))
    with pytest.raises(ValueError, match="dimension"):
        symmcoll.all_to_all(torch.tensor(1.0, device=dev))
    for bad in ([1] * (world + 1), [-1] + [1] * (world - 1), [0] * world, [0.5] * world, 3):
        with pytest.raises(ValueError, match="splits"):
            symmcoll.all_to_all(x, splits=bad)
    # rows of different sizes on different ranks: every rank raises a mismatch, nobody hangs
    with pytest.raises(symmcoll.SymmcollMismatchError, match=r"x\.shape\[1:\]"):
        symmcoll.all_to_all(torch.ones(world, 2 + (rank == 0), device=dev), splits=[1] * world, algorithm="pull")
    symmcoll.reset()

    # empty: the right shape, nothing moved
    assert symmcoll.all_gather(torch.ones(0, 3, device=dev)).shape == (0, 3)
    assert symmcoll.all_gather(torch.ones(2, 0, device=dev)).shape == (2 * world, 0)
    assert symmcoll.broadcast(torch.ones(0, 3, device=dev), 0).shape == (0, 3)
    assert symmcoll.all_to_all(torch.ones(0, 3, device=dev)).shape == (0, 3)
    assert symmcoll.all_to_all(torch.ones(0, 3, device=dev), splits=[0] * world).shape == (0, 3)
    assert_pads_zero("after rejections")


def test_fallback_and_rejections(pools, world_size):
    pools(world_size).run(_fallback_and_rejections)


def _larger_than_workspace():
    from symmcoll.launcher import LAUNCH_COUNTS
    rank, world = dist.get_rank(), dist.get_world_size()
    ws_bytes = 4096
    assert symmcoll.get_workspace().buffer_bytes == ws_bytes
    before = dict(LAUNCH_COUNTS)
    for call in range(2):  # every call cut into several pieces (all_to_all: several rounds)
        x = dtype_coded((700, 2), torch.float32, rank, call)
        snapshot = x.clone()
        _check(f"chunked all_gather call {call}", symmcoll.all_gather(x), reference.all_gather(x),
               x, snapshot)
        _check(f"chunked all_gather copy_engine call {call}",
               symmcoll.all_gather(x, algorithm="copy_engine"), reference.all_gather(x), x, snapshot)
        x = dtype_coded((3 * ws_bytes + 5,), torch.uint8, rank, call)
        snapshot = x.clone()
        _check(f"chunked broadcast call {call}", symmcoll.broadcast(x, call % world),
               reference.broadcast(x, call % world), x, snapshot)
        x = dtype_coded((world * 400, 3), torch.int32, rank, call)
        snapshot = x.clone()
        _check(f"chunked all_to_all call {call}", symmcoll.all_to_all(x, algorithm="pull"),
               reference.all_to_all(x), x, snapshot)
        # one long chunk, some empty ones: rounds sized by the longest piece that fits; rows of 16
        # words (call 0: the 16-aligned path) or 1 word
        splits = [100 if j == (rank + 1 + call) % world else (j * rank) % 3 * 10 for j in range(world)]
        if call == 1:
            splits = [16 * n for n in splits]
        x = dtype_coded((sum(splits), 16) if call == 0 else (sum(splits),), torch.int64, rank, call)
        snapshot = x.clone()
        want = reference.all_to_all(x, splits=splits)
        _check(f"chunked all_to_all splits {splits} call {call}",
               symmcoll.all_to_all(x, splits=splits, algorithm="pull"), want, x, snapshot)
        if call == 0:
            # 40 rows of 16 words to the next rank (5120 bytes): copy_engine in two rounds, each a barrier
            # per stage (W-1 steps, cut in 2 on 2 ranks) and an exit barrier; device-side splits in
            # rounds sized by the bound max_rows
            splits = [40 if j == (rank + 1) % world else 0 for j in range(world)]
            x = dtype_coded((40, 16), torch.int64, rank, 5)
            snapshot, want = x.clone(), reference.all_to_all(x, splits=splits)
            barriers = LAUNCH_COUNTS["barrier_kernel"]
            _check("chunked all_to_all copy_engine", symmcoll.all_to_all(x, splits=splits, algorithm="copy_engine"),
                   want, x, snapshot)
            assert LAUNCH_COUNTS["barrier_kernel"] - barriers == 2 * ((world - 1) * (2 if world == 2 else 1) + 1)
            rounds_before = LAUNCH_COUNTS["all_to_all_kernel"]
            got, received = symmcoll.all_to_all(x, splits=torch.tensor(splits, device=device()), max_rows=40,
                                                algorithm="pull")
            _check("chunked all_to_all device splits", got, want, x, snapshot)
            assert LAUNCH_COUNTS["all_to_all_kernel"] - rounds_before >= 2
    launched = {k: LAUNCH_COUNTS[k] - before.get(k, 0) for k in LAUNCH_COUNTS}
    # per call: all_gather 5600 bytes in pieces of 4096, broadcast 12293 bytes, all_to_all several rounds
    assert launched["all_gather_kernel"] >= 2 * 2 and launched["broadcast_kernel"] >= 2 * 4, launched
    assert launched["all_to_all_kernel"] >= 2 * 2 * 2 + 2 and launched["barrier_kernel"] >= 2 * 2 * 2, launched


def test_larger_than_workspace(pools, world_size):
    pools(world_size).run(with_workspace_bytes, 4096, _larger_than_workspace)


def _overlapped_copy_engine(parts):
    """all_gather copy_engine with SYMMCOLL_AG_CE_PARTS=parts (staging in parts, pulls on a side stream, own
    slot last): bit-exact for sizes of one byte to three chunks of a 4096-byte workspace, input unchanged,
    pads zero; one barrier per non-empty part of each chunk plus its exit barrier (the one-stream path,
    SYMMCOLL_AG_CE_PARTS=0: two per chunk; unset: the size rule's 2 parts); on GPU also graph replays with fresh data (the side stream forked and joined inside the capture)."""
    from symmcoll import debug_switches
    from symmcoll.comm.common import byte_part, chunks
    from symmcoll.launcher import LAUNCH_COUNTS
    rank = dist.get_rank()
    ws_bytes = symmcoll.get_workspace().buffer_bytes
    assert ws_bytes == 4096
    saved, debug_switches.AG_CE_PARTS = debug_switches.AG_CE_PARTS, parts
    try:
        for call, (shape, dtype) in enumerate([((1,), torch.uint8), ((7, 3), torch.bfloat16), ((1024,), torch.float32),
                                               ((700, 2), torch.float32), ((3 * ws_bytes + 5,), torch.uint8)]):
            x = dtype_coded(shape, dtype, rank, call)
            snapshot = x.clone()
            nbytes = x.numel() * x.element_size()
            want_barriers = sum(1 + sum(byte_part(n, p, parts)[1] > 0 for p in range(parts))
                                for _, n in chunks(nbytes, ws_bytes))
            barriers = LAUNCH_COUNTS["barrier_kernel"]
            _check(f"copy_engine parts={parts} {dtype} {shape}", symmcoll.all_gather(x, algorithm="copy_engine"),
                   reference.all_gather(x), x, snapshot)
            assert LAUNCH_COUNTS["barrier_kernel"] - barriers == want_barriers, (shape, dtype)
        if x.device.type == "cuda":
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = [symmcoll.all_gather(x, algorithm="copy_engine") for _ in range(2)]
            for replay in range(1, 4):
                x.copy_(dtype_coded(x.shape, x.dtype, rank, 10 + replay))
                graph.replay()
                for i, out in enumerate(outs):
                    assert_bits_equal(out, reference.all_gather(x), f"parts={parts} graph replay {replay} call {i}")
            assert_pads_zero("after copy_engine graph replays")
        # 0: the one-stream path, two barriers per chunk; unset: the size rule (2 parts below 128 MB: three)
        x = dtype_coded((3 * ws_bytes + 5,), torch.uint8, rank, 99)
        staged_in_two = sum(1 + sum(byte_part(n, p, 2)[1] > 0 for p in range(2)) for _, n in chunks(x.numel(), ws_bytes))
        for switch, want_barriers in ((0, 2 * 4), (None, staged_in_two)):
            debug_switches.AG_CE_PARTS = switch
            snapshot, barriers = x.clone(), LAUNCH_COUNTS["barrier_kernel"]
            _check(f"copy_engine switch {switch}", symmcoll.all_gather(x, algorithm="copy_engine"),
                   reference.all_gather(x), x, snapshot)
            assert LAUNCH_COUNTS["barrier_kernel"] - barriers == want_barriers, switch
    finally:
        debug_switches.AG_CE_PARTS = saved


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_all_gather_copy_engine_overlapped(pools, world_size, parts):
    pools(world_size).run(with_workspace_bytes, 4096, _overlapped_copy_engine, parts)


def test_plan_rounds():
    from symmcoll.comm.splits import plan_rounds

    def staged(words, piece):
        return max(sum(min(n, piece) for j, n in enumerate(row) if j != s) for s, row in enumerate(words))

    assert plan_rounds([[0, 5], [7, 0]], 100) == (7, 1)  # everything fits: one round
    assert plan_rounds([[9, 5], [7, 9]], 12) == (7, 1)   # own chunks are never staged
    words = [[0, 1000, 10], [5, 0, 0], [0, 0, 0]]
    piece, rounds = plan_rounds(words, 64)
    assert staged(words, piece) <= 64 < staged(words, piece + 1) and rounds == -(-1000 // piece)
    words = [[0, 160, 32], [16, 0, 0], [0, 0, 0]]
    assert plan_rounds(words, 100, align=16) == (64, 3)


# --- GPU only (scripts/gpu_check.sh; reported as NOT RUN elsewhere) ---------------------------------

STRESS_CALLS = int(os.environ.get("SYMMCOLL_STRESS_CALLS", "200"))
STRESS_DTYPES = [torch.uint8, torch.bfloat16, torch.float32, torch.int64, torch.float8_e4m3fn]


def _expected(op, shape, dtype, world, rank, call, src, all_splits):
    """What ``op`` returns on ``rank``, from every rank's (deterministic) input: no communication."""
    if op == "all_gather":
        return torch.cat([dtype_coded(shape, dtype, r, call).reshape(-1, *shape[1:]) for r in range(world)])
    if op == "broadcast":
        return dtype_coded(shape, dtype, src, call)
    parts = []
    for s, splits in enumerate(all_splits):
        x = dtype_coded((sum(splits), *shape[1:]), dtype, s, call)
        start = sum(splits[:rank])
        parts.append(x[start:start + splits[rank]])
    return torch.cat(parts)


def _stress(calls, seed):
    rng = random.Random(seed)  # the same sequence on every rank
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = 0
    for call in range(calls):
        op = rng.choice(["all_gather", "broadcast", "all_to_all", "all_to_all_splits"])
        dtype = rng.choice(STRESS_DTYPES)
        row = rng.choice([1, 3, 16, 4096])
        rows = max(1, int(2 ** rng.uniform(0, 24)) // (row * dtype.itemsize * world))
        src = rng.randrange(world)
        all_splits = [[rows if op == "all_to_all" else rng.randrange(2 * rows) for _ in range(world)]
                      for _ in range(world)]
        shape = (sum(all_splits[rank]) if op.startswith("all_to_all") else rows, row)
        algorithm = rng.choice(["auto", "pull", "sentinel", "copy_engine"])  # all_to_all only
        x = dtype_coded(shape, dtype, rank, call)
        if op == "all_gather":
            got = symmcoll.all_gather(x)
        elif op == "broadcast":
            got = symmcoll.broadcast(x, src)
        else:
            got = symmcoll.all_to_all(x, splits=all_splits[rank] if op == "all_to_all_splits" else None,
                                      algorithm=algorithm)
        want = _expected(op.replace("_splits", ""), shape, dtype, world, rank, call, src, all_splits)
        wrong += int((got.reshape(-1).view(torch.uint8) != want.reshape(-1).view(torch.uint8)).sum())
    assert_clean_finish("after stress")
    return wrong


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
def test_data_movement_gpu_stress(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    wrong = pools(ws).run(_stress, STRESS_CALLS, 4321 + ws, timeout=900)
    assert wrong == [0] * ws, wrong


def _graph_replay(numel, replays):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = dtype_coded((world * numel,), torch.bfloat16, rank, 0)
    y = dtype_coded((2 * world, 2 * numel), torch.bfloat16, rank, 0)  # rows of whole words: the sentinel's own path
    calls = [lambda: symmcoll.all_gather(x), lambda: symmcoll.broadcast(x, world - 1),
             lambda: symmcoll.all_to_all(x), lambda: symmcoll.all_gather(x, algorithm="copy_engine"),
             lambda: symmcoll.all_to_all(y, algorithm="sentinel"),
             lambda: symmcoll.all_to_all(y, algorithm="copy_engine")]
    for fn in calls:  # workspace + compilation before capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn() for fn in calls]
    for replay in range(1, replays + 1):
        x.copy_(dtype_coded((world * numel,), torch.bfloat16, rank, replay))
        y.copy_(dtype_coded((2 * world, 2 * numel), torch.bfloat16, rank, replay))
        graph.replay()
        words = reference.all_to_all(y)
        for name, out, want in zip(("all_gather", "broadcast", "all_to_all", "all_gather copy_engine",
                                    "all_to_all sentinel", "all_to_all copy_engine"),
                                   outs, (reference.all_gather(x), reference.broadcast(x, world - 1),
                                          reference.all_to_all(x), reference.all_gather(x), words, words)):
            assert_bits_equal(out, want, f"{name} graph replay {replay}")
    assert_pads_zero("after graph replays")
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("numel", [1, 4097, 1 << 20])
def test_data_movement_cuda_graph(pools, ws, numel):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_graph_replay, numel, 10) == [10] * ws


def _launch_sizes_agree():
    """Every rank must launch the same grid (program p waits on program p of its peers): the size a
    data-movement launch config is chosen from must be the same on every rank, also when the ranks'
    inputs differ in size (variable splits)."""
    from symmcoll.comm import all_to_all as a2a
    rank, world = dist.get_rank(), dist.get_world_size()
    seen = []
    original = a2a.move_config

    def recording(itemsize, nbytes, device_type):
        seen.append(nbytes)
        return original(itemsize, nbytes, device_type)

    a2a.move_config = recording
    try:
        splits = _variable_splits(rank, world, 3)  # ranks send different amounts
        x = dtype_coded((sum(splits), 3), torch.bfloat16, rank, 0)
        assert_bits_equal(symmcoll.all_to_all(x, splits=splits, algorithm="pull"), reference.all_to_all(x, splits=splits),
                    "all_to_all variable splits")
    finally:
        a2a.move_config = original
    everyone = [None] * world
    dist.all_gather_object(everyone, seen)
    assert all(s == everyone[0] for s in everyone), f"ranks chose configs from different sizes: {everyone}"
    assert x.numel() != 0 and len(seen) == 1
    return True


def test_launch_config_size_is_rank_independent(pools):
    assert pools(3).run(_launch_sizes_agree) == [True] * 3
