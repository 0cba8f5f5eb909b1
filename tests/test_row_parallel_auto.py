"""What algorithm="auto" runs for the row-parallel GEMM ops where no measurement says otherwise (issue 22
point 4: never slower than the op's unfused variant), and that a measured table is found at all: no
GPU, no group -- plan.choose answers for a request on a given number of ranks."""

import pytest
import torch

from symmcoll import dispatch, plan
from symmcoll.fused import matmul_all_reduce as mmar
from symmcoll.fused.gemm_configs import GemmConfig

CUDA = torch.device("cuda")
BF16 = torch.bfloat16
# The decode tile of the H100 table at N = 8192, K = 7168: 128 tiles of 16 tokens x 64 columns.
DECODE_TILE = GemmConfig(16, 64, 128, group_m=1, swap_ab=True, num_stages=5)


def request(op, m, n, k, dtype=BF16, device=CUDA):
    """The request of ``op`` for A [m, k] @ B [k, n] (k: this rank's slice)."""
    return plan.Request(op, (m, k), dtype, device, others=(((k, n), dtype, device),))


@pytest.fixture
def no_table(monkeypatch):
    """No tuned rules (the built-in defaults; neither the shipped table nor a user's may leak in)."""
    monkeypatch.setattr(dispatch, "active_table", lambda device=None: dispatch.Table((), "test: none"))


@pytest.fixture
def shipped_table(monkeypatch):
    """The table that ships for the H200 (neither $SYMMCOLL_DISPATCH_FILE nor a user's table)."""
    monkeypatch.delenv("SYMMCOLL_DISPATCH_FILE", raising=False)
    monkeypatch.setattr(dispatch, "USER_TABLE", dispatch.PACKAGED_TABLE.with_name("no-such-table.json"))
    dispatch.active_table.cache_clear()
    yield
    dispatch.active_table.cache_clear()


@pytest.fixture
def decode_tile(monkeypatch):
    """The one-shot kernel's tiles fixed to DECODE_TILE, whatever the shipped tables say."""
    monkeypatch.setattr(mmar, "gemm_config", lambda *args, **kwargs: DECODE_TILE)


def choose(m, n=8192, k=7168, world=4, op="matmul_all_reduce", **kwargs):
    return plan.choose(request(op, m, n, k, **kwargs), world)


def test_one_shot_pays_only_for_a_small_exchange_over_full_waves():
    pays = mmar.one_shot_pays
    # 4 ranks, N = 8192 bf16: 16 rows exchange 3 x 256 KB = 768 KB; 32 rows 1.5 MB
    assert pays(16, 8192, 2, 4, DECODE_TILE, 132)
    assert not pays(32, 8192, 2, 4, DECODE_TILE, 132)
    # 2 ranks: 64 rows are 1 MB exactly; 8 ranks: 8 rows are 7 x 128 KB
    assert pays(64, 8192, 2, 2, DECODE_TILE, 132) and not pays(65, 8192, 2, 2, DECODE_TILE, 132)
    assert pays(8, 8192, 2, 8, DECODE_TILE, 132) and not pays(16, 8192, 2, 8, DECODE_TILE, 132)
    # fp32 doubles the exchange
    assert pays(16, 8192, 2, 4, DECODE_TILE, 132) and not pays(16, 8192, 4, 4, DECODE_TILE, 132)
    # one rank: nothing to hide
    assert not pays(1, 8192, 2, 1, DECODE_TILE, 132)
    # tiles that do not fill the SMs: N = 4096 makes 64 tiles on 132 SMs (but 64 fill a 64-SM GPU)
    assert not pays(16, 4096, 2, 4, DECODE_TILE, 132) and pays(16, 4096, 2, 4, DECODE_TILE, 64)


@pytest.mark.parametrize("m", [1, 8, 16])
def test_auto_runs_one_shot_at_decode_where_it_pays(no_table, decode_tile, m):
    assert choose(m) == "one_shot"


@pytest.mark.parametrize("m", [32, 128, 256, 512, 2048, 8192, 16384])
def test_auto_runs_unfused_past_decode(no_table, m):
    # Measured on 4x H100 (2026-11-27): one_shot 91 us vs unfused 70 at M = 128; two_shot 178 vs 126 at 512,
    # 559 vs 482 at 2048. The rule before ran one_shot up to 256 rows and two_shot above.
    assert choose(m) == "unfused"


@pytest.mark.parametrize("op, core", [("matmul_all_reduce", "two_shot"), ("matmul_reduce_scatter", "fused")])
def test_auto_on_one_rank_runs_the_core_where_its_table_beats_cublas(no_table, monkeypatch, op, core):
    """A group of one has nothing to hide: matmul_all_reduce's two_shot and matmul_reduce_scatter's fused kernel
    write the product in place there (the GEMM core), run where the GPU's GEMM table measured the core faster than
    cuBLAS at the very (M, N, K) (gemm.core_measured_faster), else unfused (cuBLAS and a copy) -- a cell measured
    slower, one without cuBLAS's time, one not measured, a CPU tensor (no table)."""
    from symmcoll.fused import gemm_tables
    monkeypatch.setattr(gemm_tables, "measured_cells",
                        lambda key: {(16, 8192, 7168): (0.93, 35.0), (128, 8192, 7168): (0.86, 40.0),
                                     (4096, 8192, 7168): (1.02, 400.0), (1, 8192, 7168): (0.95, None)})
    assert choose(16, world=1, op=op) == core and choose(128, world=1, op=op) == core
    for m in (4096, 1, 512):
        assert choose(m, world=1, op=op) == "unfused", m
    assert choose(16, world=1, op=op, device=torch.device("cpu")) == "unfused"
    assert choose(128, world=2, op=op) == "unfused"  # (several ranks: as before)


@pytest.mark.parametrize("device", [CUDA, torch.device("cpu")])
def test_auto_never_two_shot(no_table, device):
    for world in (1, 2, 3, 4, 8):
        for m in (1, 7, 16, 64, 100, 256, 1000, 4096, 16384):
            assert choose(m, n=8190, k=1000, world=world, device=device) in ("one_shot", "unfused"), (world, m)


def test_matmul_reduce_scatter_auto_is_unfused(no_table):
    for m in (16, 128, 512, 2048, 8192, 16384):
        assert choose(m, world=4, op="matmul_reduce_scatter") == "unfused", m


@pytest.mark.parametrize("world, unfused_to", [(4, 1024), (2, 512)])
def test_shipped_h200_table_runs_chunked_matmul_reduce_scatter_past_its_crossover(shipped_table, world, unfused_to):
    # dispatch_h200.json from the fused bench on 4x H200 (benchmarks/results/2026-11-28-fused-ws4-h200x4):
    # chunked 17-22% faster than unfused at 4 ranks from M = 2048 (N = 8192, K = 28672), 4-7% at 2 ranks from
    # 1024; unfused at 512 and below (chunked 162 against 105 us at 4 ranks).
    k = 28672 // world
    for m in (16, 128, 512, unfused_to):
        assert choose(m, k=k, world=world, op="matmul_reduce_scatter") == "unfused", m
    for m in (2 * unfused_to, 8192, 16384):
        assert choose(m, k=k, world=world, op="matmul_reduce_scatter") == "chunked", m


def test_shipped_h200_table_runs_two_shot_matmul_all_reduce_only_at_large_m_on_4_ranks(shipped_table, decode_tile):
    # dispatch_h200.json (benchmarks/results/2026-11-28-fused-ws4-h200x4, call1, call5, call6): two_shot 4-9% ahead of
    # unfused from M = 4096 at 4 ranks (N = 8192, K = 28672), behind at 2048; below its rule "default" keeps the
    # shape-dependent decode rule (one_shot), and 2 / 8 ranks keep the default at every size.
    assert choose(16, k=7168, world=4) == "one_shot"
    for m in (128, 2048):
        assert choose(m, k=7168, world=4) == "unfused", m
    for m in (4096, 8192, 16384, 32768):
        assert choose(m, k=7168, world=4) == "two_shot", m
    for world in (2, 8):
        for m in (16384, 32768):
            assert choose(m, k=28672 // world, world=world) == "unfused", (world, m)


def _bench_row(op, name, shape, us, world):
    return {"family": "symmcoll", "error": None, "median_us": us, "implementation": f"symmcoll:{name}",
            "shape": list(shape), "op": op, "world_size": world, "dtype": "bf16"}


@pytest.mark.parametrize("op, fused", [("matmul_all_reduce", "one_shot"), ("matmul_reduce_scatter", "fused")])
def test_tuned_rules_are_found_by_the_whole_layers_mnk(monkeypatch, op, fused):
    # Rules as `symmcoll tune` writes them from fused-bench rows: shapes (M, N, K of the whole layer).
    rows = [_bench_row(op, fused, (16, 8192, 28672), 40.0, 4), _bench_row(op, "unfused", (16, 8192, 28672), 50.0, 4),
            _bench_row(op, fused, (512, 8192, 28672), 150.0, 4),
            _bench_row(op, "unfused", (512, 8192, 28672), 120.0, 4)]
    table = dispatch.Table(tuple(dispatch.rules_from_fused_rows(rows)), "test")
    monkeypatch.setattr(dispatch, "active_table", lambda device=None: table)
    # a rank's A is [M, 28672 / 4]: keyed by A's bytes (as before), M = 512 fell under the M = 16 rule
    assert choose(16, k=7168, world=4, op=op) == fused
    assert choose(512, k=7168, world=4, op=op) == "unfused"


def test_one_rank_takes_no_rule_measured_on_several(monkeypatch, decode_tile):
    table = dispatch.Table((dispatch.Rule("matmul_all_reduce", 2, "bf16", 1 << 60, "one_shot"),), "test")
    monkeypatch.setattr(dispatch, "active_table", lambda device=None: table)
    assert table.choose("matmul_all_reduce", 1, "bf16", 1) is None
    assert table.choose("matmul_all_reduce", 4, "bf16", 1) == "one_shot"  # nearest world size, as before
    assert choose(128, world=1) == "unfused"
    assert choose(128, world=2) == "one_shot"  # measured: the table wins over the rule
