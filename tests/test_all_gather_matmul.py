"""all_gather_matmul: every variant of the ladder against an fp32 reference computed locally from every
rank's (deterministic) shard; M/W not a multiple of the tile, N and K not multiples of 16, a list of Bs
sharing one gather and a single B, the gathered A bit-exact, back-to-back calls with fresh data, shards larger than
the workspace (pieces), the fake implementation and torch.compile."""

import os
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import symmcoll
from symmcoll import launch
from symmcoll.fused import all_gather_matmul as agmm
from symmcoll.fused import all_gather_matmul_kernel as agmm_kernel
from symmcoll.fused import all_gather_matmul_rules as agmm_rules

from rank_checks import device, with_workspace_bytes

DEVICE = os.environ.get("SYMMCOLL_TEST_DEVICE", "cpu")
VARIANTS = sorted(symmcoll.ALGORITHMS["all_gather_matmul"]) + ["nccl", "auto"]
# Relative error of the result against the fp32 product of the same (rounded) inputs: one rounding of
# the output (2^-8 bf16, 2^-11 fp16) plus accumulation-order noise.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


def _shard(rank, call, rows, k, dtype):
    g = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randn(rows, k, generator=g).to(dtype).to(device())


def _weights(call, k, n, dtype, i=0):
    g = torch.Generator().manual_seed(77 + call * 10 + i)
    return (torch.randn(k, n, generator=g) / k ** 0.5).to(dtype).to(device())


def _check(algorithm, rows, k, ns, dtype, calls=2):
    rank, world = dist.get_rank(), dist.get_world_size()
    for call in range(calls):
        a = _shard(rank, call, rows, k, dtype)
        bs = [_weights(call, k, n, dtype, i) for i, n in enumerate(ns)]
        outs, gathered = symmcoll.all_gather_matmul(a, bs, algorithm=algorithm, return_gathered=True)
        want_a = torch.cat([_shard(r, call, rows, k, dtype) for r in range(world)])
        assert torch.equal(gathered, want_a), f"rank {rank} {algorithm}: gathered A differs (call {call})"
        for i, (b, out) in enumerate(zip(bs, outs)):
            assert out.shape == (world * rows, b.shape[1]) and out.dtype == dtype
            ref = want_a.float() @ b.float()
            err = float((out.float() - ref).norm() / ref.norm())
            assert err < TOLERANCE[dtype], f"rank {rank} {algorithm} B{i} call {call}: rel err {err:.2e}"
            bad = (out.float() - ref).abs() > 0.05 * ref.abs().max() + 1e-3
            assert not bool(bad.any()), f"rank {rank} {algorithm}: wrong rows {bad.any(1).nonzero()[:5].tolist()}"
    single = symmcoll.all_gather_matmul(a, bs[0], algorithm=algorithm)  # no gathered A wanted (alone: none made)
    assert isinstance(single, torch.Tensor) and single.shape == (world * rows, bs[0].shape[1])
    _, none = torch.ops.symmcoll.all_gather_matmul(a, [bs[0]], dist.group.WORLD.group_name, algorithm, False)
    assert none is None, f"rank {rank} {algorithm}: a gathered A returned with return_gathered=False"
    ref = want_a.float() @ bs[0].float()
    err = float((single.float() - ref).norm() / ref.norm())
    assert err < TOLERANCE[dtype], f"rank {rank} {algorithm} single B: rel err {err:.2e}"
    return True


@pytest.mark.parametrize("algorithm", VARIANTS)
def test_variants_at_every_world_size(pools, world_size, algorithm):
    # 13 rows per rank: not a multiple of the CPU tile (32); K and N not multiples of 16; two Bs
    assert pools(world_size).run(_check, algorithm, 13, 40, (24, 8), torch.bfloat16) == [True] * world_size


def test_group_of_one_copies_a_in_the_kernel():
    # A group of one: the GEMM's K-loops write the gathered A, each tile the k-steps of its column
    # block's turn (K = 100: 4 k-steps over 3 column blocks, 45 rows over two row blocks, the last short).
    for algorithm in ("naive_remote", "copy_engine_producer", "fused"):
        assert launch.run(_check, 1, algorithm, 45, 100, (70, 8), torch.bfloat16, 1, device=DEVICE) == [True]


def _alone_core(split_k, sum_apart=False):
    """World size 1, C only, each kernel variant: one launch of ag_matmul_kernel (the variant's own
    kernel; no matmul_kernel launch) whose C equals the GEMM core's bit for bit on the same data and
    config -- with split_k > 1 the last wave's tiles split along K (45 x 70 in 32 x 32 tiles: 6 tiles on
    4 interpreted programs), which a fused op with peers never runs; a config that sums its split tiles
    apart adds the core's sum launch (gemm_kernel.split_sum_kernel)."""
    from symmcoll import launcher
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_configs import CPU_CONFIG
    config = replace(CPU_CONFIG, split_k=split_k, sum_apart=sum_apart)
    launches = {"ag_matmul_kernel": 1, **({"split_sum_kernel": 1} if sum_apart else {})}
    saved = agmm.gemm_config
    agmm.gemm_config = lambda *args, **kwargs: config
    try:
        for call, algorithm in enumerate(("naive_remote", "copy_engine_producer", "fused")):
            a = _shard(0, call, 45, 100, torch.bfloat16)
            b = _weights(call, 100, 70, torch.bfloat16)
            before = dict(launcher.LAUNCH_COUNTS)
            out = symmcoll.all_gather_matmul(a, b, algorithm=algorithm)
            ran = {k: v - before.get(k, 0) for k, v in launcher.LAUNCH_COUNTS.items() if v != before.get(k, 0)}
            assert ran == launches, f"{algorithm}: launches {ran}"
            assert torch.equal(out, gemm.matmul(a, b, config=config)), f"{algorithm}: C differs from the core's"
            ref = a.float() @ b.float()
            err = float((out.float() - ref).norm() / ref.norm())
            assert err < TOLERANCE[torch.bfloat16], f"{algorithm}: rel err {err:.2e}"
    finally:
        agmm.gemm_config = saved
    return True


@pytest.mark.parametrize("split_k, sum_apart", [(1, False), (2, False), (2, True)])
def test_group_of_one_without_gathered_a_runs_the_core_loop(split_k, sum_apart):
    assert launch.run(_alone_core, 1, split_k, sum_apart, device=DEVICE) == [True]


# Shapes of the fused bench's all_gather_matmul grid whose H100 table configs differ in kind: 64x64x128
# flattened (1024^3), 128x256 with the last wave split and C by descriptor (16384x8192x8192; whole tiles
# only with peers), 128x128 six stages (256x8192x8192), swapped decode tiles (16x8192x8192).
ALONE_SHAPES = [(1024, 1024, 1024), (16384, 8192, 8192), (256, 8192, 8192), (16, 8192, 8192)]


@pytest.mark.parametrize("algorithm", ["copy_engine_producer", "fused"])
@pytest.mark.parametrize("m, n, k", ALONE_SHAPES, ids=lambda v: str(v))
def test_group_of_one_launches_what_the_core_launches(m, n, k, algorithm):
    """The GEMM core's launch inside the variant's kernel: one ag_matmul_kernel launch with the core's
    grid, every constexpr and launch option of the core's (config, FLATTEN, SPLIT, TMA, HOST_DESC,
    TMA_STORE, ...), its split counts, and host descriptors of the same blocks for A, B and C."""
    from kernel_specs import recorded_alone_and_core
    (ours,), (core,) = recorded_alone_and_core(m, n, k, algorithm)
    assert ours.kernel is agmm_kernel.ag_matmul_kernel and ours.meta["ALONE_CORE"] and ours.meta["WORLD"] == 1
    assert ours.grid == core.grid
    assert {key: ours.meta[key] for key in core.meta} == core.meta
    names = [p.name for p in ours.kernel.params]
    mine = dict(zip(names, ours.args))
    theirs = dict(zip([p.name for p in core.kernel.params], core.args))
    for key in ("whole_tiles", "sharing", "slots", "N", "K", "stride_a", "stride_b", "stride_c"):
        assert mine[key] == theirs[key], key
    assert mine["rows"] == theirs["M"]
    for ag_name, core_name in (("a_desc", "a_ptr"), ("b_desc", "b_ptr"), ("b2_desc", "b2_ptr"), ("c_ptr", "c_ptr")):
        x, y = mine[ag_name], theirs[core_name]
        assert type(x) is type(y) and getattr(x, "block_shape", None) == getattr(y, "block_shape", None), ag_name


@pytest.mark.parametrize("algorithm", ["naive_remote", "copy_engine_producer", "fused"])
def test_fp16_and_whole_tiles(pools, algorithm):
    assert pools(2).run(_check, algorithm, 64, 32, (32,), torch.float16, 1) == [True, True]


def _pieces(algorithm):
    # 2048-byte workspace: 16 rows of 64 bf16 per piece, 40 rows per shard -> 3 pieces
    assert symmcoll.get_workspace().buffer_bytes == 2048
    return _check(algorithm, 40, 64, (16,), torch.bfloat16, calls=1)


@pytest.mark.parametrize("algorithm", ["naive_remote", "copy_engine_producer", "fused"])
def test_shards_larger_than_the_workspace(pools, algorithm):
    assert pools(2).run(with_workspace_bytes, 2048, _pieces, algorithm) == [True, True]


def _errors_and_compile():
    rank, world = dist.get_rank(), dist.get_world_size()
    a = _shard(rank, 0, 5, 16, torch.bfloat16)
    with pytest.raises(ValueError, match=r"b\[0\] must be \[K=16"):
        symmcoll.all_gather_matmul(a, torch.ones(8, 4, dtype=torch.bfloat16, device=device()))
    with pytest.raises(ValueError, match="dtype"):
        symmcoll.all_gather_matmul(a.float(), torch.ones(16, 4, device=device()))
    with pytest.raises(ValueError, match="algorithm"):
        symmcoll.all_gather_matmul(a, torch.ones(16, 4, dtype=torch.bfloat16, device=device()), algorithm="nope")
    b = _weights(0, 16, 24, torch.bfloat16)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: symmcoll.all_gather_matmul(t, b, algorithm="fused") * 2, fullgraph=True,
                       backend="aot_eager")
    explanation = torch._dynamo.explain(lambda t: symmcoll.all_gather_matmul(t, b) * 2)(a)
    assert explanation.graph_break_count == 0
    assert torch.equal(fn(a), symmcoll.all_gather_matmul(a, b, algorithm="fused") * 2)
    return True


def test_errors_and_torch_compile(pools):
    assert pools(2).run(_errors_and_compile) == [True, True]


@triton.jit
def _consumer_tiles(out_ptr, tiles, blocks_per_shard, num_n, GROUP_M: tl.constexpr, BLOCK: tl.constexpr):
    """(logical row block, column block) of every consumer tile, as ag_matmul_kernel orders them."""
    t = tl.arange(0, BLOCK)
    logical, pid_n = agmm_kernel._consumer_tile(t, blocks_per_shard, num_n, GROUP_M)
    tl.store(out_ptr + 2 * t, logical, mask=t < tiles)
    tl.store(out_ptr + 2 * t + 1, pid_n, mask=t < tiles)


def _tile_order():
    """Consumers take the shards in turn -- mine, rank+1's, ... -- whatever GROUP_M: a group larger
    than a shard's row blocks (1024 x 8192 x 8192 on 4 ranks: 2 blocks a shard, GROUP_M 8) must not
    pull the next shards' rows into the first tiles (it did: tile t was row block t % 8, so 3/4 of
    the first wave waited on peers' chunks). Every tile once; inside a shard, groups as gemm's."""
    for world, blocks, num_n, group_m in ((4, 2, 32, 8), (4, 1, 5, 8), (3, 5, 3, 2), (2, 7, 4, 4), (1, 9, 2, 8)):
        tiles = world * blocks * num_n
        out = torch.full((tiles, 2), -1, dtype=torch.int32)
        _consumer_tiles[(1,)](out, tiles, blocks, num_n, group_m, BLOCK=triton.next_power_of_2(tiles))
        pairs = [tuple(x) for x in out.tolist()]
        assert sorted(pairs) == [(m, n) for m in range(world * blocks) for n in range(num_n)], "a tile twice or never"
        shards = [m // blocks for m, _ in pairs]
        assert shards == sorted(shards), f"W{world} {blocks} blocks GROUP_M {group_m}: shards taken out of turn"
        for t, (m, n) in enumerate(pairs):  # inside a shard: groups of min(GROUP_M, blocks left) rows
            within = t % (blocks * num_n)
            first = within // (group_m * num_n) * group_m
            size = min(group_m, blocks - first)
            assert (m % blocks, n) == (first + within % (group_m * num_n) % size,
                                       within % (group_m * num_n) // size), (t, m, n)
    return True


def _auto_choices():
    from symmcoll import plan
    world, dev = dist.get_world_size(), device()
    b = torch.zeros(64, 32, dtype=torch.bfloat16, device=dev)

    def chosen(rows):
        a = torch.zeros(rows, 64, dtype=torch.bfloat16, device=dev)
        return plan.resolve("all_gather_matmul", a, None, "auto", others=(b,)).name
    small, large = agmm_rules.COPY_ENGINE_FROM_ROWS // world - 1, agmm_rules.COPY_ENGINE_FROM_ROWS // world
    return chosen(small), chosen(large)


def test_auto_overlaps_large_gathers_by_the_copy_engines(pools):
    # Without a table rule: the symmcoll all-gather then cuBLAS for small gathers, the copy-engine producer
    # from COPY_ENGINE_FROM_ROWS gathered rows on several ranks (4x H100, 2026-11-27); one rank never.
    assert pools(2).run(_auto_choices) == [("gather_then_cublas", "copy_engine_producer")] * 2
    request = lambda rows: symmcoll.plan.Request("all_gather_matmul", (rows, 64), torch.bfloat16,
                                                 torch.device("cpu"), others=(((64, 32), torch.bfloat16, None),))
    assert agmm_rules.choose_default(request(1 << 20), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(1024), 4) == "copy_engine_producer"
    assert agmm_rules.choose_default(request(1023), 4) == "gather_then_cublas"


def test_auto_on_one_rank_runs_the_core_where_its_table_beats_cublas(monkeypatch):
    """One rank: the GEMM core where the GPU's table measured it < CORE_FASTER_BELOW x cuBLAS at the exact
    (M, N, K) of every B (one H100: 16384x8192x8192 at 0.983) on a cell cuBLAS took >= CORE_FROM_CUBLAS_US
    for or whose core launch takes the small products' PDL, else cuBLAS -- a B not in the table, one at 1.008, a
    6 us cell at 0.965, a table without cuBLAS's time, or a CPU tensor (no table)."""
    from symmcoll.fused import gemm_tables
    monkeypatch.setattr(gemm_tables, "measured_cells",
                        lambda key: {(16384, 8192, 8192): (0.983, 3300.0), (16384, 3584, 8192): (1.008, 1400.0),
                                     (16384, 1024, 8192): (0.95, 400.0), (1024, 1024, 8192): (0.965, 6.9),
                                     (16384, 2048, 8192): (0.95, None), (1024, 1024, 1024): (0.96, 5.5),
                                     (1024, 2048, 1024): (0.96, 9.0)})

    def request(rows, *ns, dev="meta"):
        return symmcoll.plan.Request("all_gather_matmul", (rows, 8192), torch.bfloat16, torch.device(dev),
                                     others=tuple(((8192, n), torch.bfloat16, None) for n in ns))
    assert agmm_rules.choose_default(request(16384, 8192), 1) == "gather_then_gemm"
    assert agmm_rules.choose_default(request(16384, 8192, 1024), 1) == "gather_then_gemm"
    assert agmm_rules.choose_default(request(16384, 3584), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(16384, 8192, 3584), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(4096, 8192), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(1024, 1024), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(16384, 2048), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(16384, 8192, dev="cpu"), 1) == "gather_then_cublas"
    assert agmm_rules.choose_default(request(4096, 8192), 4) == "copy_engine_producer"   # (several ranks: as before)
    # a 5.5 us cell whose core launch takes the small products' PDL (gemm.takes_small_pdl: 1024^3, 2 MB of B on
    # the H200) runs the core; one of 4 MB of B (past the rule) does not
    small = lambda n: symmcoll.plan.Request("all_gather_matmul", (1024, 1024), torch.bfloat16, torch.device("meta"),
                                            others=(((1024, n), torch.bfloat16, None),))
    assert agmm_rules.choose_default(small(1024), 1) == "gather_then_gemm"
    assert agmm_rules.choose_default(small(2048), 1) == "gather_then_cublas"
    # the shipped H100 table holds that cell as measured, with cuBLAS's time
    entry = {(e["m"], e["n"], e["k"]): e for e in gemm_tables.read_table("h100")["entries"]}[(16384, 8192, 8192)]
    assert entry["ratio"] < 0.99 and entry["cublas_us"] >= agmm_rules.CORE_FROM_CUBLAS_US


def test_consumers_take_shards_in_turn(pools):
    assert pools(1).run(_tile_order) == [True]


@triton.jit
def _producer_blocks(taker_ptr, count_ptr, world, blocks_per_shard, N_PRODUCERS: tl.constexpr):
    """For every (owner, row block): which producer moves it (copies it in on the owner, pulls it on
    every other rank: the same function of the owner), and how many producers took it."""
    pid = tl.program_id(0)
    for owner in range(0, world):
        first = agmm_kernel._first_block(pid, owner, blocks_per_shard, N_PRODUCERS)
        for j in range(first, blocks_per_shard, N_PRODUCERS):
            tl.store(taker_ptr + owner * blocks_per_shard + j, pid)
            tl.atomic_add(count_ptr + owner * blocks_per_shard + j, 1)


def _producer_deal():
    """Every row block of every shard moved by exactly one producer, the same one on every rank (its
    barrier with that program of every peer is what orders the owner's copy-in before the pull), and
    the pulls spread over the producers: none pulls more than ceil(W * blocks / P) blocks. Dealt per
    shard (block j -> producer j % P), 1024 x 8192 x 8192 on 4 ranks (2 blocks a shard, 8 producers)
    had producers 0 and 1 pull all 6 peer blocks (3 each) and 6 producers idle."""
    for world, blocks, producers in ((4, 2, 8), (4, 32, 8), (4, 1, 8), (3, 5, 4), (2, 3, 8), (4, 13, 8)):
        taker = torch.full((world * blocks,), -1, dtype=torch.int32)
        count = torch.zeros(world * blocks, dtype=torch.int32)
        _producer_blocks[(producers,)](taker, count, world, blocks, producers)
        assert count.tolist() == [1] * (world * blocks), f"W{world} {blocks} blocks P{producers}: {count.tolist()}"
        most = -(-world * blocks // producers)
        for rank in range(world):
            pulled = [int(taker[o * blocks + j]) for o in range(world) if o != rank for j in range(blocks)]
            loads = [pulled.count(p) for p in range(producers)]
            assert max(loads) <= most, f"W{world} {blocks} blocks P{producers} rank {rank}: pulls per producer {loads}"
        if (world, blocks, producers) == (4, 2, 8):
            assert sorted(loads) == [0, 0, 1, 1, 1, 1, 1, 1], loads
    return True


def test_producers_share_the_pulls(pools):
    assert pools(1).run(_producer_deal) == [True]


def _several_producers(rows):
    """The fused kernel with 3 producer programs (1 on CPU otherwise): shards of 1-3 row blocks dealt
    round them, own copies and pulls by different programs, every chunk's flag awaited."""
    agmm_rules.FUSED_PRODUCERS["cpu"] = 3
    try:
        return _check("fused", rows, 40, (24,), torch.bfloat16, calls=2)
    finally:
        agmm_rules.FUSED_PRODUCERS["cpu"] = 1


@pytest.mark.parametrize("rows", [13, 70])
def test_fused_with_several_producers(pools, world_size, rows):
    assert pools(world_size).run(_several_producers, rows) == [True] * world_size


def test_gpu_producer_count_follows_the_flops_per_pulled_byte(monkeypatch):
    """On 132 SMs (bf16): 8 producers where the GEMM hides the pull (N = 8192: 9), more where it is thin
    (N = 3584: 18), never more than the chunks there are (a 512-row gather on 4 ranks: 4), a cap of
    FUSED_PRODUCERS_MAX, and SYMMCOLL_AGMM_PRODUCERS's fixed count (still capped by the chunks)."""
    from symmcoll import debug_switches
    monkeypatch.setattr(debug_switches, "AGMM_PRODUCERS", None)
    assert agmm_rules.fused_producers(132, 128, 8192, 2) == 9
    assert agmm_rules.fused_producers(132, 128, 3584, 2) == 18
    assert agmm_rules.fused_producers(132, 128, 1 << 16, 2) == agmm_rules.FUSED_PRODUCERS["cuda"]
    assert agmm_rules.fused_producers(132, 4, 3584, 2) == 4
    assert agmm_rules.fused_producers(132, 512, 256, 2) == agmm_rules.FUSED_PRODUCERS_MAX
    monkeypatch.setattr(debug_switches, "AGMM_PRODUCERS", 24)
    assert agmm_rules.fused_producers(132, 128, 8192, 2) == 24
    assert agmm_rules.fused_producers(132, 8, 8192, 2) == 8


# --- GPU only (scripts/gpu_check.sh; reported as NOT RUN elsewhere) ---------------------------------

def _gpu_stress(algorithm, calls, replays):
    """Fresh random data over back-to-back calls, then replays of a captured graph with fresh data."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # rows not a multiple of the tile; 5 row blocks a shard (64-row tiles on an H100/H200), so the fused
    # kernel's 8 producers are dealt blocks across shards (block j of owner o: producer (5o + j) % 8)
    rows, k, n = 300, 512, 384
    worst = 0.0
    for call in range(calls):
        a = _shard(rank, call, rows, k, torch.bfloat16)
        b = _weights(call, k, n, torch.bfloat16)
        out = symmcoll.all_gather_matmul(a, b, algorithm=algorithm)
        ref = torch.cat([_shard(r, call, rows, k, torch.bfloat16) for r in range(world)]).float() @ b.float()
        worst = max(worst, float((out.float() - ref).norm() / ref.norm()))
    a = _shard(rank, 0, rows, k, torch.bfloat16)
    b = _weights(0, k, n, torch.bfloat16)
    symmcoll.all_gather_matmul(a, b, algorithm=algorithm)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, gathered = symmcoll.all_gather_matmul(a, b, algorithm=algorithm, return_gathered=True)
    for replay in range(1, replays + 1):
        a.copy_(_shard(rank, 1000 + replay, rows, k, torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        full = torch.cat([_shard(r, 1000 + replay, rows, k, torch.bfloat16) for r in range(world)])
        assert torch.equal(gathered, full), f"rank {rank}: gathered A differs in replay {replay}"
        ref = full.float() @ b.float()
        worst = max(worst, float((out.float() - ref).norm() / ref.norm()))
    symmcoll.check()
    return worst


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [1, 2, 4])
@pytest.mark.parametrize("algorithm", ["naive_remote", "gather_then_gemm", "copy_engine_producer", "fused"])
def test_gpu_back_to_back_and_graph_replays(pools, ws, algorithm):
    """World size 1 takes the group-of-one path (host tensor descriptors); on a one-GPU machine
    (cuda-shared) the ranks of larger groups share the GPU."""
    if ws > torch.cuda.device_count() and DEVICE != "cuda-shared":
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    worst = pools(ws).run(_gpu_stress, algorithm, 50, 20, timeout=600)
    assert max(worst) < TOLERANCE[torch.bfloat16], worst


def _gpu_alone_epilogues():
    """World size 1 where the table's config stores C through its tensor descriptor (16344x8000x1024:
    the H100 and H200 tables' 128x128/f/t; rows and columns not multiples of the tile, so the
    descriptor clips), at 1024^3 (the untuned rule's 64x64x128 tiles) and
    with K not a multiple of the k-step: C against fp32 and the gathered A exact, twice each; asked for C
    only, the kernel runs the GEMM core's loop (ALONE_CORE) and C is the core's bit for bit."""
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_tables import gemm_config
    configs = []
    for m, n, k in ((16344, 8000, 1024), (1024, 1024, 1024), (1000, 384, 520)):
        configs.append(gemm_config(m, n, k, torch.bfloat16, torch.device("cuda"), split=False))
        for call in range(2):
            a = _shard(0, call, m, k, torch.bfloat16)
            b = _weights(call, k, n, torch.bfloat16)
            for algorithm in ("fused", "copy_engine_producer"):
                out, gathered = symmcoll.all_gather_matmul(a, b, algorithm=algorithm, return_gathered=True)
                assert torch.equal(gathered, a), f"{algorithm} {m}x{n}x{k}: gathered A differs"
                ref = a.float() @ b.float()
                err = float((out.float() - ref).norm() / ref.norm())
                assert err < TOLERANCE[torch.bfloat16], f"{algorithm} {m}x{n}x{k}: rel err {err:.2e}"
                bad = (out.float() - ref).abs() > 0.05 * ref.abs().max() + 1e-3
                assert not bool(bad.any()), f"{algorithm} {m}x{n}x{k}: wrong rows {bad.any(1).nonzero()[:5].tolist()}"
                c_only = symmcoll.all_gather_matmul(a, b, algorithm=algorithm)
                assert torch.equal(c_only, gemm.matmul(a, b)), f"{algorithm} {m}x{n}x{k}: C only is not the core's"
    assert any(c.tma_store for c in configs), [c.label for c in configs]
    return True


@pytest.mark.gpu
def test_gpu_world_one_stores_c_by_descriptor_and_copies_a(pools):
    assert pools(1).run(_gpu_alone_epilogues, timeout=300) == [True]
