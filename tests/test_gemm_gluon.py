"""The GEMM core's Gluon decode kernel (fused/gemm_gluon.py): configs, candidates and tables on CPU (where a gluon
config runs the Triton core's twin); on the GPU machine the kernel itself -- its answers at odd shapes, its split
parts' counters, and a chain of it in a CUDA graph whose activations each launch reads after their writer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from symmcoll import launcher
from symmcoll.bench.gemm_tune import fused_config
from symmcoll.fused import gemm, gemm_gluon, gemm_tables
from symmcoll.fused.gemm_candidates import candidates, gluon_candidates
from symmcoll.fused.gemm_configs import SMEM_BUDGET, GemmConfig

WHOLE = GemmConfig(16, 64, 256, 1, 1, True, 4, 5, gluon=True)
SPLIT = GemmConfig(64, 64, 256, 1, 3, True, 4, 3, gluon=True)
A_RING = GemmConfig(64, 64, 128, 1, 3, True, 4, 9, gluon=True, a_stages=3)  # A's ring its own depth


def _operands(m, n, k, dtype, b_t, device, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=gen).to(dtype).to(device)
    b = (torch.randn((n, k), generator=gen).to(dtype).to(device).t() if b_t
         else torch.randn((k, n), generator=gen).to(dtype).to(device))
    return a, b


def _rel_err(got, a, b):
    ref = a.double() @ b.double()
    return float((got.double() - ref).norm() / ref.norm())


def test_a_gluon_config_is_a_swapped_decode_tile_and_round_trips_through_a_table():
    assert WHOLE.label == "T16x64x256/g1/s1/w4/p5/G" and SPLIT.label.endswith("/s3/w4/p3/G")
    for config in (WHOLE, SPLIT):
        assert GemmConfig.from_list(config.as_list()) == config and len(config.as_list()) == 16
    assert A_RING.label.endswith("/G/a3") and GemmConfig.from_list(A_RING.as_list()) == A_RING
    assert len(A_RING.as_list()) == 17 and GemmConfig.from_list(A_RING.as_list()[:16]).a_stages == 0
    # the rings' bytes: B's 9 stages of 64 x 128 and A's 3 of 64 x 128 (bf16)
    assert A_RING.smem_bytes(2) == (9 * 64 + 3 * 64) * 128 * 2 and WHOLE.smem_bytes(2) == 5 * (64 + 16) * 256 * 2
    for bad in (dict(a_stages=1), dict(gluon=False)):
        with pytest.raises(ValueError, match="a_stages"):
            replace(A_RING, **bad)
    # a table row written before the field: the Triton core
    assert not GemmConfig.from_list(WHOLE.as_list()[:15]).gluon
    assert GemmConfig.from_list(replace(WHOLE, gluon=False).as_list()) == replace(WHOLE, gluon=False)
    assert A_RING.core_twin == GemmConfig(64, 64, 128, 1, 3, True, 4, 9) and WHOLE.core_twin.fitted(2).num_stages == 5
    assert A_RING.core_twin.fitted(2).num_stages == 7  # (7 x 32 KB = 224 KB: SMEM_BYTES)
    for bad in (dict(swap_ab=False), dict(block_n=128), dict(block_m=128, num_warps=8), dict(num_warps=8),
                dict(stream_k=True), dict(sum_apart=True), dict(occupancy=2), dict(tma_store=True)):
        with pytest.raises(ValueError, match="gluon"):
            replace(WHOLE, **bad)


def _runs_the_triton_twin(config, b_t):
    from symmcoll import launcher
    from symmcoll.fused import gemm, gemm_gluon
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # (on the GPU machine: more tokens than the config's tile -- a table bucket's config asked at a larger M)
    m = 5 if device == "cpu" else config.block_m + 3
    a, b = _operands(m, 200, 520, torch.bfloat16, b_t, device, seed=3)
    assert not gemm_gluon.runs_here(config, a, b)
    before = launcher.LAUNCH_COUNTS["decode_kernel"]
    got = gemm.matmul(a, b, config=config)
    assert launcher.LAUNCH_COUNTS["decode_kernel"] == before
    assert torch.equal(got, gemm.matmul(a, b, config=config.core_twin))
    assert _rel_err(got, a, b) < 5e-3


@pytest.mark.parametrize("b_t", [False, True], ids=["B", "W^T"])
@pytest.mark.parametrize("config", [WHOLE, SPLIT, A_RING], ids=lambda c: c.label)
def test_where_the_gluon_kernel_does_not_run_the_triton_core_runs_the_tile(pools, config, b_t):
    """On CPU (the interpreter), and on the GPU for more tokens than the tile holds, the Gluon kernel does not run:
    the config's tile runs on the Triton core (its twin: no flag, A's ring B's depth, fitted again -- B's 9 stages
    of 64 x 128 beside A's 3 would not fit as 9 of both), the same bits as the twin, within cuBLAS-class error of
    the fp32 product."""
    pools(1).run(_runs_the_triton_twin, config, b_t)


def test_gluon_candidates_at_decode_only_and_never_the_fused_ops_config():
    """The tune measures the Gluon tiles at M <= 64 (whole, and split over the SMs where the column blocks leave
    them idle: 405b-tp8 qkv's 36 blocks in 3 parts), fitted to the candidates' budget; the table's config for the
    fused ops (their own Triton kernels) is never one."""
    labels = [c.label for c in gluon_candidates(16, 2304, 16384)]
    assert labels == ["T16x64x256/g1/s1/w4/p5/G", "T16x64x256/g1/s3/w4/p5/G", "T16x64x128/g1/s1/w4/p10/G",
                      "T16x64x128/g1/s3/w4/p10/G"]
    assert [c.split_k for c in gluon_candidates(1, 28672, 8192)] == [1, 1]  # 448 blocks: nothing to split
    # past 16 tokens also A in its own ring, B's fitted to what is left: 64 tokens, B 4 stages of 256 (3 sharing one)
    at_64 = {c.label for c in gluon_candidates(64, 8192, 2048)}
    assert {"T64x64x256/g1/s1/w4/p3/G", "T64x64x256/g1/s1/w4/p4/G/a2", "T64x64x128/g1/s1/w4/p9/G/a3"} <= at_64
    assert not any(c.a_stages for c in gluon_candidates(16, 8192, 2048))
    assert gluon_candidates(128, 2560, 8192) == [] and not any(c.gluon for c in candidates(128, 2560, 8192))
    for m in (1, 16, 32, 64):
        found = gluon_candidates(m, 8192, 2048)
        assert found and all(c.smem_bytes(2) <= SMEM_BUDGET and c.block_m >= m for c in found)
        assert set(found) <= set(candidates(m, 8192, 2048))
    core_whole = GemmConfig(16, 64, 256, 1, 1, True, 4, 5)
    assert fused_config([WHOLE, SPLIT, replace(core_whole, split_k=4), core_whole]) == core_whole


def test_cells_won_by_the_gluon_kernel_are_not_the_cores_measurements(monkeypatch):
    """A one-rank fused op's "auto" reads the table's ratio as the Triton core's (gemm.core_measured_faster): a
    cell whose best config is the Gluon kernel (the plain matmul's alone) gives the core's own best where the tune
    kept it ("core_ratio"), else nothing."""
    rows = [dict(m=16, n=8192, k=2048, config=WHOLE.as_list(), no_split=replace(WHOLE, gluon=False).as_list(),
                 ratio=0.85, cublas_us=11.0),
            dict(m=1, n=8192, k=2048, config=WHOLE.as_list(), no_split=replace(WHOLE, gluon=False).as_list(),
                 ratio=0.80, core_ratio=0.93, cublas_us=11.0),
            dict(m=2048, n=8192, k=8192, config=GemmConfig(128, 256, 64, 8, 1, False, 8, 3).as_list(),
                 no_split=GemmConfig(128, 256, 64, 8, 1, False, 8, 3).as_list(), ratio=0.98, cublas_us=300.0)]
    monkeypatch.setattr(gemm_tables, "read_table", lambda key, kind="gemm": {"entries": rows})
    gemm_tables.measured_cells.cache_clear()
    try:
        assert gemm_tables.measured_cells("h200") == {(1, 8192, 2048): (0.93, 11.0), (2048, 8192, 8192): (0.98, 300.0)}
    finally:
        gemm_tables.measured_cells.cache_clear()


def test_the_table_loader_reads_a_gluon_row(tmp_path):
    row = dict(m=16, n=2304, k=16384, config=replace(WHOLE, split_k=3).as_list(),
               no_split=replace(WHOLE, gluon=False).as_list(), label="x")
    (tmp_path / "t.json").write_text(json.dumps({"entries": [row]}))
    table = gemm_tables.table_of(json.loads((tmp_path / "t.json").read_text())["entries"])
    best, no_split = table[(16, 2304, 16384)]
    assert best.gluon and best.split_k == 3 and not no_split.gluon
    assert gemm_tables.lookup(table, 16, 2304, 16384, split=True) == best
    assert not gemm_tables.lookup(table, 16, 2304, 16384, split=False).gluon


# ---- on the GPU machine --------------------------------------------------------------------------------

GPU_GLUON = [WHOLE, SPLIT, GemmConfig(32, 64, 128, 1, 4, True, 4, 9, gluon=True), A_RING]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_GLUON, ids=lambda c: c.label)
@pytest.mark.parametrize("shape", [(1, 1280, 8192), (16, 1000, 4104), (37, 4096, 7160), (64, 2304, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("b_t", [False, True], ids=["B", "W^T"])
def test_gpu_gluon_decode_kernel(config, shape, b_t):
    """The kernel runs where the tokens fit its tile (else the Triton core does) and answers within cuBLAS's error:
    odd N (a masked last column block), K not a multiple of the k-step (TMA's zero fill), the split's parts summed
    by the last, which leaves its counters zero."""
    m, n, k = shape
    a, b = _operands(m, n, k, torch.bfloat16, b_t, "cuda", seed=m + k)
    before = launcher.LAUNCH_COUNTS["decode_kernel"]
    got = gemm.matmul(a, b, config=config)
    torch.cuda.synchronize()
    assert launcher.LAUNCH_COUNTS["decode_kernel"] - before == (1 if m <= config.block_m else 0)
    assert _rel_err(got, a, b) <= max(1.25 * _rel_err(torch.matmul(a, b), a, b), 5e-3)
    assert int(gemm.split_counters(a.device).abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("config", [WHOLE, replace(WHOLE, split_k=4)], ids=lambda c: c.label)
def test_gpu_gluon_chain_in_a_graph_reads_each_activation_after_its_writer(config, dtype):
    """Three decode GEMMs, each reading the last one's output (B loaded before the PDL wait, A after it), captured
    into a CUDA graph and replayed on fresh inputs: the bits of the same chain run eagerly, within cuBLAS-class
    error of the fp32 chain."""
    x = torch.randn(16, 2048, device="cuda", dtype=dtype)
    ws = [(torch.randn(2048, 2048, device="cuda") / 2048 ** 0.5).to(dtype) for _ in range(3)]

    def chain():
        y = x
        for w in ws:
            y = gemm.matmul(y, w, config=config)
        return y

    chain()  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain()
    for _ in range(3):
        x.normal_()
        graph.replay()
        want = chain()
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        ref = x.double()
        for w in ws:
            ref = ref @ w.double()
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-2
