import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference
from symmcoll.comm import low_latency, sentinel
from symmcoll.plan import CPU_CONFIG

from rank_checks import assert_close, assert_pads_zero, device, random_input, rank_coded, with_workspace_bytes

BLOCK = CPU_CONFIG.block
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
ALGORITHMS = sorted(symmcoll.ALGORITHMS["all_reduce"])
# int32 words per launch of the algorithms with their own slot rows, on a GPU (the others: the workspace)
GPU_ROW_WORDS = {"low_latency": low_latency.LL_MAX_WORDS["cuda"],
                 "sentinel_one_shot": sentinel.MAX_BYTES["one_shot"]["cuda"] // 4,
                 "sentinel_two_shot": sentinel.MAX_BYTES["two_shot"]["cuda"] // 4}


def _back_to_back(numel, dtype, algorithm, op, calls=2):
    rank = dist.get_rank()
    for call in range(calls):
        x = rank_coded(numel, dtype, rank, call)
        snapshot = x.clone()
        got = symmcoll.all_reduce(x, op=op, algorithm=algorithm)
        assert_close(got, reference.all_reduce(x, op=op), f"{algorithm} {op} numel={numel} call {call}",
                     exact=op != "avg")
        assert_close(x, snapshot, "input must not change", exact=True)
        assert_pads_zero(f"after {algorithm} call {call}")


def _random_data(numel, dtype, algorithm):
    rank = dist.get_rank()
    x = random_input(numel, dtype, rank, 7).reshape(-1, 4)
    got = symmcoll.all_reduce(x, algorithm=algorithm)
    assert got.shape == x.shape
    assert_close(got, reference.all_reduce(x), f"{algorithm} random numel={numel}")


# Every dtype and every size class (one element, odd, a block minus/plus one, many blocks), without the
# full cross product: each (dtype, size) pair exercises the same kernel paths as the others of its row.
CASES = [(torch.bfloat16, 1), (torch.float16, 7), (torch.float32, BLOCK - 1), (torch.bfloat16, BLOCK + 1),
         (torch.float16, 30011), (torch.float32, 30011)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype,numel", CASES, ids=lambda v: str(v))
def test_all_reduce_sum(pools, world_size, dtype, numel, algorithm):
    pools(world_size).run(_back_to_back, numel, dtype, algorithm, "sum")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", ["avg", "max", "min"])
def test_all_reduce_ops(pools, world_size, op, algorithm):
    # One call per size: the op is a constexpr of the same kernels, and what a call leaves for the next
    # (slots, epochs, pads) does not depend on it: back-to-back calls are test_all_reduce_sum's.
    pools(world_size).run(_back_to_back, BLOCK + 3, torch.bfloat16, algorithm, op, calls=1)
    pools(world_size).run(_back_to_back, 1001, torch.float32, algorithm, op, calls=1)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_random_data(pools, world_size, dtype, algorithm):
    pools(world_size).run(_random_data, 20000, dtype, algorithm)


def _rejects_bad_input():
    dev = device()
    with pytest.raises(ValueError, match="dtype"):
        symmcoll.all_reduce(torch.ones(4, dtype=torch.int32, device=dev), algorithm="one_shot")
    # "auto" sends what no kernel supports to the process group's collective: same answer.
    ints = torch.full((5,), dist.get_rank() + 1, dtype=torch.int32, device=dev)
    assert symmcoll.all_reduce(ints).tolist() == [sum(range(1, dist.get_world_size() + 1))] * 5
    with pytest.raises(ValueError, match="contiguous"):
        symmcoll.all_reduce(torch.ones(4, 4, device=dev).t())
    with pytest.raises(ValueError, match="algorithm"):
        symmcoll.all_reduce(torch.ones(4, device=dev), algorithm="nope")
    with pytest.raises(ValueError, match="op"):
        symmcoll.all_reduce(torch.ones(4, device=dev), op="prod")
    if dev.type == "cuda":
        with pytest.raises(ValueError, match="CPU tensor"):
            symmcoll.all_reduce(torch.ones(4))
    assert symmcoll.all_reduce(torch.ones(0, device=dev)).numel() == 0


def test_all_reduce_rejects_bad_input(pools):
    pools(2).run(_rejects_bad_input)


@pytest.mark.parametrize("world", range(1, 9))
def test_double_binary_tree_shape(world):
    from symmcoll.comm.tree import double_binary_tree
    trees = double_binary_tree(world)
    inner = []
    for parent, children in trees:
        roots = [r for r in range(world) if parent[r] < 0]
        assert len(roots) == 1
        assert all(len(c) <= 2 for c in children)
        for r in range(world):  # every rank reaches the root: one tree over all ranks
            seen, v = set(), r
            while parent[v] >= 0:
                assert v not in seen
                seen.add(v)
                v = parent[v]
            assert v == roots[0]
        inner.append({r for r in range(world) if children[r]})
    assert not inner[0] & inner[1], "a rank is an inner node of both trees"


def _sentinel_bit_patterns(algorithm):
    """Inputs made of the values the sentinel protocol must never send (negative zeros, and for fp32
    the EMPTY word itself) still arrive, and every slot is EMPTY again after the call."""
    from symmcoll.language import EMPTY
    from symmcoll.memory.regions import declared
    dev, world = device(), dist.get_world_size()
    for dtype in DTYPES:
        x = torch.full((BLOCK + 5,), -0.0, dtype=dtype, device=dev)
        x[1::2] = dist.get_rank() + 1
        got = symmcoll.all_reduce(x, algorithm=algorithm)
        want = torch.zeros_like(x)
        want[1::2] = world * (world + 1) / 2
        assert_close(got, want, f"{algorithm} {dtype} negative zeros", exact=True)
    empty_word = torch.full((999,), EMPTY.value, dtype=torch.int32, device=dev).view(torch.float32)
    got = symmcoll.all_reduce(empty_word, algorithm=algorithm)
    assert bool((got.abs() <= world * 5e-41).all()), f"{algorithm}: fp32 EMPTY words: {got[:4].tolist()}"
    if dev.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    ws = symmcoll.get_workspace()
    slot_regions = [spec for spec in declared() if spec.fill_int32 == EMPTY.value]
    assert len(slot_regions) >= 2, f"sentinel slot regions not found among the declared regions: {slot_regions}"
    for spec in slot_regions:
        name = spec.name
        region = ws.region(name)
        words = region.local[: region.local.numel() // 4 * 4].view(torch.int32)[spec.header_words:]
        left = (words != EMPTY.value).nonzero().reshape(-1)
        assert left.numel() == 0, f"rank {ws.rank}: {name}: slots not EMPTY at {left[:8].tolist()}"


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a.startswith("sentinel_")])
def test_sentinel_bit_patterns(pools, world_size, algorithm):
    pools(world_size).run(_sentinel_bit_patterns, algorithm)


# op="avg" of [2, 1, 1] in bf16: 4/3 = 1.0101010101...b rounds to nearest-even as 1.0101011b =
# 1.3359375 (what torch and the GPU give); truncation, triton 3.6's interpreter conversion, gives
# 1.328125. The mean is computed in fp32 and narrowed once (language.narrow), by every algorithm.
BF16_AVG_OF_2_1_1 = 1.3359375


def _bf16_avg_rounding():
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 3
    value = 2.0 if rank == 0 else 1.0
    got = {}
    for algorithm in ["nccl", *ALGORITHMS]:
        x = torch.full((5,), value, dtype=torch.bfloat16, device=device())
        got[f"all_reduce {algorithm}"] = symmcoll.all_reduce(x, op="avg", algorithm=algorithm).float().unique().tolist()
    for algorithm in ["nccl", *sorted(symmcoll.ALGORITHMS["reduce_scatter"])]:
        x = torch.full((3 * 5,), value, dtype=torch.bfloat16, device=device())
        out = symmcoll.reduce_scatter(x, op="avg", algorithm=algorithm)
        got[f"reduce_scatter {algorithm}"] = out.float().unique().tolist()
    return got


def test_bf16_avg_rounds_to_nearest_even_for_every_algorithm(pools):
    assert torch.tensor(4 / 3).to(torch.bfloat16).item() == BF16_AVG_OF_2_1_1  # torch's rounding
    for rank, got in enumerate(pools(3).run(_bf16_avg_rounding)):
        wrong = {name: values for name, values in got.items() if values != [BF16_AVG_OF_2_1_1]}
        assert not wrong, f"rank {rank}: {wrong}"


def _interleaved(calls):
    """two_shot between collectives that write the shared buffer before their entry barrier, with
    changing sizes: a rank that has finished must not overwrite what a slower peer still reads."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for call in range(calls):
        numel = [3 * BLOCK + 17, 2 * BLOCK, 5 * BLOCK + 1][call % 3]
        x = rank_coded(numel, torch.float32, rank, call)
        got = symmcoll.all_reduce(x, algorithm="two_shot")
        assert_close(got, reference.all_reduce(x), f"two_shot call {call}", exact=True)
        y = rank_coded(numel // 2 + call, torch.float32, rank, call + 100)
        other = [lambda: symmcoll.all_reduce(y, algorithm="one_shot"),
                 lambda: symmcoll.all_gather(y)][call % 2]()
        want = reference.all_reduce(y) if call % 2 == 0 else reference.all_gather(y)
        assert_close(other, want, f"collective after two_shot, call {call}", exact=True)


def test_two_shot_interleaved_with_other_collectives(pools, world_size):
    pools(world_size).run(_interleaved, 12)


def _larger_than_workspace(workspace_bytes):
    """Every algorithm on tensors larger than its piece (the workspace, or the algorithm's own slot
    rows): the launch counts prove that every chunked loop ran more than once."""
    from symmcoll.launcher import LAUNCH_COUNTS
    rank = dist.get_rank()
    assert symmcoll.get_workspace().buffer_bytes == workspace_bytes
    # 9005 fp32 words: more than the CPU slot rows of low_latency (4096 words) and the sentinel one-shot
    # (4096) and two-shot (8192), and than the 4096-byte workspace of the barrier-based algorithms. On
    # a GPU the slot rows are larger: those algorithms get a first message just past their GPU rows.
    for call, (numel, dtype, op) in enumerate([(9000 + 5, torch.float32, "sum"), (5001, torch.bfloat16, "max")]):
        for algorithm in ALGORITHMS:
            if call == 0 and device().type == "cuda":
                numel = GPU_ROW_WORDS.get(algorithm, 9000) + 5
            x = rank_coded(numel, dtype, rank, call)
            before = sum(LAUNCH_COUNTS.values())
            got = symmcoll.all_reduce(x, op=op, algorithm=algorithm)
            assert_close(got, reference.all_reduce(x, op=op), f"chunked {algorithm} {op} {dtype} call {call}",
                         exact=True)
            launches = sum(LAUNCH_COUNTS.values()) - before
            if call == 0:
                assert launches >= 2, f"{algorithm}: {launches} launch(es) for {numel * dtype.itemsize} bytes"


def test_all_reduce_larger_than_workspace(pools, world_size):
    pools(world_size).run(with_workspace_bytes, 4096, _larger_than_workspace, 4096)


def _changing_configs(algorithm, calls):
    """Barrier-free algorithms whose launch config changes from call to call (as the size-keyed GPU
    configs do): a slot is handled by different programs in different calls, so the slot-set rotation
    must not depend on which program handles it. The (config, slot set) sequence repeats every 3 calls
    for each algorithm (3 configs; low_latency and sentinel_one_shot launch 2 pieces a call into 2 and
    3 slot sets, sentinel_two_shot 1 piece into 3): 6 calls run it twice, the second time after state
    left by every other config."""
    from symmcoll.plan import LaunchConfig, resolve
    rank = dist.get_rank()
    configs = [LaunchConfig(256, 8, 4), LaunchConfig(1024, 2, 4), LaunchConfig(512, 3, 4)]
    for call in range(calls):
        x = rank_coded(6000 + 7 * call, torch.float32, rank, call)
        got = resolve("all_reduce", x, None, algorithm, config=configs[call % len(configs)]).execute(x)
        assert_close(got, reference.all_reduce(x), f"{algorithm} config {call % len(configs)} call {call}",
                     exact=True)


@pytest.mark.parametrize("algorithm", ["low_latency", "sentinel_one_shot", "sentinel_two_shot"])
def test_barrier_free_with_changing_configs(pools, world_size, algorithm):
    pools(world_size).run(_changing_configs, algorithm, 6)


def _push_copy_engine_graph(workspace_bytes):
    """push_copy_engine leaves short and empty shards and cuts tensors into workspace-sized pieces;
    back-to-back calls; on GPU also replays of a captured graph with fresh data."""
    rank = dist.get_rank()
    capacity = workspace_bytes // 2
    for call, numel in enumerate([1, 97, 4 * 16 * 3 + 5, capacity - 3, 2 * capacity + 333]):
        x = rank_coded(numel, torch.bfloat16, rank, call)
        got = symmcoll.all_reduce(x, algorithm="push_copy_engine")
        assert_close(got, reference.all_reduce(x), f"numel={numel} call {call}", exact=True)
    assert_pads_zero("after push_copy_engine")
    if x.device.type != "cuda":
        return
    static_x = rank_coded(capacity + 77, torch.bfloat16, rank, 0)
    symmcoll.all_reduce(static_x, algorithm="push_copy_engine")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [symmcoll.all_reduce(static_x, algorithm="push_copy_engine") for _ in range(2)]
    for replay in range(1, 6):
        static_x.copy_(rank_coded(static_x.numel(), torch.bfloat16, rank, replay))
        graph.replay()
        for i, out in enumerate(outs):
            assert_close(out, reference.all_reduce(static_x), f"replay {replay} call {i}", exact=True)
    assert_pads_zero("after push_copy_engine graph replays")


def test_push_copy_engine_pieces_and_graphs(pools, world_size):
    # Small workspace: the calls are cut into workspace-sized pieces.
    pools(world_size).run(with_workspace_bytes, 1 << 16, _push_copy_engine_graph, 1 << 16)


def _backend_split(calls):
    """algorithm="nccl" as reduce-scatter into my shard of out + all-gather in place (comm/backend.py), made to
    run here on gloo at small sizes: the sum / avg / max of every rank, input unchanged; sizes the group does
    not divide, and small ones, keep the copy + all_reduce."""
    from symmcoll.comm import backend
    rank, world = dist.get_rank(), dist.get_world_size()
    saved = backend.SPLIT_FROM_BYTES, backend.SPLIT_BACKENDS
    backend.SPLIT_FROM_BYTES, backend.SPLIT_BACKENDS = 64, ("nccl", "gloo")
    try:
        for call, (numel, dtype, op) in enumerate([(world * 40, torch.float32, "sum"), (world * 33, torch.bfloat16, "avg"),
                                                   (world * 16, torch.float16, "max"), (world * 40 + 1, torch.float32, "sum"),
                                                   (world, torch.float32, "sum")]):
            x = rank_coded(numel, dtype, rank, call)
            snapshot = x.clone()
            split = numel % world == 0 and numel * x.element_size() >= 64
            plan = symmcoll.plan.resolve("all_reduce", x, None, "nccl", reduce_op=op)
            assert backend.split_all_reduce(plan, x, torch.empty_like(x)) == split, (numel, dtype)
            got = symmcoll.all_reduce(x, op=op, algorithm="nccl")
            assert_close(got, reference.all_reduce(x, op=op), f"nccl split={split} {op} numel={numel}", exact=op != "avg")
            assert_close(x, snapshot, "input must not change", exact=True)
    finally:
        backend.SPLIT_FROM_BYTES, backend.SPLIT_BACKENDS = saved


def test_backend_all_reduce_runs_as_reduce_scatter_and_all_gather_without_a_copy(pools, world_size):
    pools(world_size).run(_backend_split, 1)
