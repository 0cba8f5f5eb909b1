"""The GEMM core (fused/gemm.py, fused/gemm_configs.py): every path of the one K-loop under the
interpreter at tiny shapes (straight and swapped tiles, stream-K, B given transposed, odd K and N,
bf16/fp16/fp32), the config picker, the table format; on the GPU machine the same paths compiled, and
split-K inside CUDA graphs (its counters must come back to zero every launch). Kernels run in a
one-rank pool (the interpreter must be on before symmcoll is imported there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from symmcoll.fused import gemm, gemm_configs
from symmcoll.fused.gemm_configs import GemmConfig

DEVICE = os.environ.get("SYMMCOLL_TEST_DEVICE", "cpu")

SRC = Path(gemm.__file__).resolve().parent.parent

# (M, N, K, config, B given as W^T, shares tiles): every branch of k_loop and the scheduler, tiny enough
# for the interpreter (4 programs). Configs are explicit: the CPU default never swaps or splits.
CASES = [
    (33, 100, 72, None, False, False),                                    # odd M, N, K; pointer loads
    # 3 tiles of 32 k-steps (odd K) shared by 4 programs (24 each: ranges cross tiles)
    (5, 70, 1000, GemmConfig(16, 32, 32, 1, 3, True, 4, 1), False, True),   # swapped, stream-K
    (5, 70, 1000, GemmConfig(16, 32, 32, 1, 3, True, 4, 1), True, True),    # the same with W [N, K]
    (1, 48, 512, GemmConfig(16, 16, 16, 1, 4, True, 4, 1), False, True),    # M = 1, 3 tiles on 4 programs
    (40, 64, 100, GemmConfig(32, 32, 32, 2, 4, False, 4, 1), False, False),  # 4 tiles on 4 programs: none shared
    (40, 64, 96, GemmConfig(32, 32, 32, 2, 2, False, 4, 1), True, False),    # straight, W [N, K], no split
    (70, 40, 48, GemmConfig(32, 16, 16, 2, 1, False, 4, 1), False, False),   # narrow N, more tiles than programs
    # 13 tiles on 4 programs: 12 whole (the flattened loop), the 13th shared by 3 programs
    (416, 16, 512, GemmConfig(32, 16, 16, 2, 3, False, 4, 1, 1, True), False, True),
    # the same with the last full wave shared too: 5 tiles of 32 k-steps, 40 per program (a range holding
    # a whole tile stores it without a partial), straight and swapped
    (416, 16, 512, GemmConfig(32, 16, 16, 2, 3, False, 4, 1, 1, True, split_wave=True), False, True),
    (12, 208, 64, GemmConfig(16, 16, 16, 1, 4, True, 4, 1, split_wave=True), True, True),
    # 2 tiles of 2 k-steps: too short to share (each range would be under MIN_PART_STEPS)
    (20, 64, 40, GemmConfig(32, 32, 32, 1, 4, False, 4, 1), False, False),
]


def _operands(m, n, k, dtype, b_t, device, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=gen).to(dtype).to(device)
    if b_t:
        b = torch.randn((n, k), generator=gen).to(dtype).to(device).t()
    else:
        b = torch.randn((k, n), generator=gen).to(dtype).to(device)
    return a, b


def _rel_err(got, a, b):
    ref = a.double() @ b.double()
    return float((got.double() - ref).norm() / ref.norm())


# bf16 and fp32 for every case; fp16 shares bf16's code, so three cases of it suffice.
DTYPE_CASES = [(c, d) for c in CASES for d in (torch.bfloat16, torch.float32)] + \
    [(CASES[i], torch.float16) for i in (0, 2, 5)]


@pytest.mark.parametrize("case,dtype", DTYPE_CASES,
                         ids=lambda v: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else
                         f"{v[0]}x{v[1]}x{v[2]}-{v[3].label if v[3] else 'auto'}{'-bT' if v[4] else ''}"
                         f"{'-shared' if v[5] else ''}")
def test_matmul_matches_fp32(pools, case, dtype):
    pools(1).run(_matmul_matches_fp32, case, dtype)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _matmul_matches_fp32(case, dtype):
    m, n, k, config, b_t, shares = case
    used = (config or gemm_configs.CPU_CONFIG).for_itemsize(dtype.itemsize)
    programs = gemm.num_sms(torch.device(_device())) * used.occupancy
    if _device() == "cpu":  # the case covers the path it says it does
        assert gemm_configs.stream_split(used, gemm_configs.tiles_of(used, m, n), k, programs).shared == shares
    a, b = _operands(m, n, k, dtype, b_t, _device(), seed=m * 7 + n)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=_device())
    gemm.matmul(a, b, out=out, config=config)
    tolerance = 1e-5 if dtype == torch.float32 and _device() == "cpu" else 4e-3 if dtype != torch.float32 else 2e-3
    assert not out.isnan().any(), "an element of C was never written"
    assert _rel_err(out, a, b) < tolerance, f"{case}, {dtype}: {_rel_err(out, a, b)}"


def test_split_k_counters_return_to_zero_and_repeat_exactly(pools):
    pools(1).run(_split_k_counters)


def _split_k_counters():
    """Calls with fresh data: the counters are zero after each (the next launch, or graph replay,
    starts clean) and the sum does not depend on which part finished last (fixed order)."""
    config = GemmConfig(16, 32, 32, 1, 4, True, 4, 1)
    assert gemm_configs.stream_split(config, 2, 256, gemm.num_sms(torch.device(_device()))).shared
    counters = gemm.split_counters(torch.device(_device()))
    results = []
    for seed in (1, 2, 2):
        a, b = _operands(9, 64, 256, torch.bfloat16, False, _device(), seed)
        results.append(gemm.matmul(a, b, config=config))
        assert int(counters.abs().sum()) == 0
    assert torch.equal(results[1], results[2])
    assert not torch.equal(results[0], results[1])
    assert _rel_err(results[1], *_operands(9, 64, 256, torch.bfloat16, False, _device(), 2)) < 4e-3


def test_empty_and_degenerate_shapes(pools):
    pools(1).run(_empty_and_degenerate)


def _empty_and_degenerate():
    dev = _device()
    a = torch.randn(0, 8).to(dev)
    assert gemm.matmul(a, torch.randn(8, 4).to(dev)).shape == (0, 4)
    out = gemm.matmul(torch.randn(3, 0).to(dev), torch.randn(0, 5).to(dev))
    assert out.shape == (3, 5) and torch.equal(out, torch.zeros(3, 5, device=dev))
    with pytest.raises(ValueError, match="a \\[M, K\\] and b \\[K, N\\]"):
        gemm.matmul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(ValueError, match="b.dtype"):
        gemm.matmul(torch.randn(3, 4), torch.randn(4, 6).to(torch.bfloat16))


def test_only_the_core_calls_tl_dot():
    """One K-loop for the package: ``tl.dot`` appears in fused/gemm.py's ``mma`` and nowhere else."""
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if "tl.dot(" in p.read_text() and p.name != "gemm.py"]
    assert offenders == []
    assert gemm.__file__.endswith("gemm.py") and gemm.mma is not None


# ---- the config picker ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(1, 1280, 8192), (16, 8192, 8192), (64, 4096, 7168), (128, 8192, 1024),
                                   (512, 1280, 8192), (4096, 28672, 8192), (16384, 8192, 8192)])
def test_untuned_rule_covers_the_regimes(m, n, k):
    config = gemm_configs.untuned_config(m, n, k, sms=132)
    tiles = gemm_configs.tiles_of(config, m, n)
    if m <= 64:
        assert config.swap_ab and m <= config.block_m <= 64
    assert config.smem_bytes(2) <= gemm_configs.SMEM_BYTES
    plan = gemm_configs.stream_split(config, tiles, k, 132)
    assert plan.whole_tiles % 132 == 0 or (plan.whole_tiles == tiles and not plan.shared)
    if plan.shared:
        assert tiles - plan.whole_tiles < plan.programs <= 132
    if tiles < 66 and k >= 4096:
        assert plan.shared, "few tiles and a long K: the SMs must share the K range"
    assert gemm_configs.untuned_config(m, n, k, 132, split=False).split_k == 1


S = gemm_configs.StreamSplit


@pytest.mark.parametrize("tiles,k,config,expect", [
    (80, 8192, GemmConfig(128, 128, 64, split_k=16), S(0, 132, 3)),        # 256x5120: 52 SMs idle without
    (160, 8192, GemmConfig(128, 128, 64, split_k=16), S(132, 132, 6)),     # one wave whole, 28 tiles shared
    (160, 8192, GemmConfig(128, 128, 64, split_k=16, split_wave=True), S(0, 132, 2)),
    (160, 8192, GemmConfig(128, 128, 64, split_k=4), S(132, 112, 5)),      # <= 4 programs a tile on average
    (128, 8192, GemmConfig(128, 128, 64, split_k=16), S(128)),             # 97% of a wave: not worth a split
    (20, 256, GemmConfig(64, 64, 128, split_k=8), S(20)),                  # 2 k-steps a tile: too short
    (264, 8192, GemmConfig(64, 64, 128, split_k=8), S(264)),               # whole waves
    (20, 8192, GemmConfig(64, 64, 128), S(20)),                            # split_k = 1
    (1, 64, GemmConfig(64, 64, 64, split_k=16), S(1)),                     # one k-step: nothing to share
])
def test_stream_split_shares_only_the_last_wave(tiles, k, config, expect):
    assert gemm_configs.stream_split(config, tiles, k, 132) == expect


def test_stream_split_counts_two_programs_on_one_sm_as_one_sm():
    """Two programs per SM share its throughput: 128 tiles on 264 programs are one round of whole tiles
    on 132 SMs, not half a round (sharing them would only add partials); 80 tiles still share."""
    two = GemmConfig(128, 128, 64, split_k=4, num_warps=8, num_stages=3, occupancy=2)
    assert gemm_configs.stream_split(two, 128, 1024, 264) == S(128)
    assert gemm_configs.stream_split(two, 80, 8192, 264).programs == 264


@pytest.mark.parametrize("tiles,steps,programs,cap,wave", [(80, 128, 132, 16, False), (160, 128, 132, 16, False),
                                                          (160, 128, 132, 16, True), (13, 4, 4, 3, False),
                                                          (13, 4, 4, 3, True), (3, 7, 4, 3, False),
                                                          (20, 64, 132, 16, False), (7, 5, 264, 16, False),
                                                          (290, 9, 132, 4, True), (133, 3, 132, 16, False)])
def test_stream_split_slots_hold_every_part_of_a_tile(tiles, steps, programs, cap, wave):
    """Cut the shared k-steps as the kernel's stream_range does (``least`` each, one more for the first
    ``longer``): every shared tile meets at most ``slots`` ranges, and every range is >= 2 k-steps."""
    plan = gemm_configs.stream_split(GemmConfig(16, 16, 16, split_k=cap, split_wave=wave), tiles, steps * 16,
                                     programs)
    if not plan.shared:
        return
    shared_steps = (tiles - plan.whole_tiles) * steps
    least, longer = divmod(shared_steps, plan.programs)
    assert least >= gemm_configs.MIN_PART_STEPS
    starts = [p * least + min(p, longer) for p in range(plan.programs + 1)]
    assert starts[-1] == shared_steps
    for t in range(tiles - plan.whole_tiles):
        meeting = [p for p in range(plan.programs) if starts[p] < (t + 1) * steps and starts[p + 1] > t * steps]
        assert 1 <= len(meeting) <= plan.slots


@pytest.mark.parametrize("m,n,k", [(1, 1280, 8192), (128, 8192, 3584), (16384, 28672, 8192)])
def test_candidates_fit_and_include_the_rule(m, n, k):
    found = gemm_configs.candidates(m, n, k, 132)
    assert gemm_configs.untuned_config(m, n, k, 132) in found
    assert all(c.smem_bytes(2) <= gemm_configs.SMEM_BYTES for c in found)
    assert len(found) == len(set(found)) and len(found) <= 80
    if 64 < m <= 2048:  # stream-K candidates where a wave is partial
        assert any(c.split_k > 1 and gemm_configs.stream_split(c, gemm_configs.tiles_of(c, m, n), k,
                                                               132 * c.occupancy).shared for c in found)


def test_fp32_halves_the_k_step_and_cpu_gets_small_tiles():
    config = gemm_configs.gemm_config(4096, 8192, 8192, torch.float32, torch.device("meta"))
    assert config.smem_bytes(4) <= gemm_configs.SMEM_BYTES
    assert gemm_configs.gemm_config(4096, 8192, 8192, torch.bfloat16, torch.device("cpu")) == gemm_configs.CPU_CONFIG


def test_table_lookup_round_trip(tmp_path, monkeypatch):
    """A written table is what gemm_config reads: exact (N, K), the smallest measured M >= M, the
    no-split entry for fused ops; other shapes fall back to the rule."""
    best = GemmConfig(16, 64, 256, 1, 6, True, 4, 4)
    plain = GemmConfig(16, 32, 256, 1, 1, True, 4, 4)
    big = GemmConfig(128, 256, 64, 8, 1, False, 8, 3)
    rows = [dict(m=16, n=1280, k=8192, config=best.as_list(), no_split=plain.as_list()),
            dict(m=8192, n=1280, k=8192, config=big.as_list(), no_split=big.as_list())]
    monkeypatch.setattr(gemm_configs, "DATA", tmp_path)
    gemm_configs.write_table("h200", dict(gpu="NVIDIA H200"), rows)
    try:
        assert json.loads((tmp_path / "gemm_h200.json").read_text())["gpu"] == "NVIDIA H200"
        pick = lambda m, n, k, split=True: gemm_configs.gemm_config(m, n, k, torch.bfloat16, torch.device("meta"),
                                                                    split)
        assert pick(9, 1280, 8192) == best
        assert pick(9, 1280, 8192, split=False) == plain
        assert pick(1000, 1280, 8192) == big
        assert pick(9, 1280, 4096) == best, "the nearest measured (N, K) within 2x answers"
        assert pick(9, 1280, 2048) == gemm_configs.untuned_config(9, 1280, 2048)
    finally:
        gemm_configs.load_table.cache_clear()


def test_config_list_round_trip_reads_older_tables():
    config = GemmConfig(128, 128, 64, 8, 16, False, 8, 3, 2, True, True, True)
    assert GemmConfig.from_list(config.as_list()) == config
    assert GemmConfig.from_list([64, 128, 64, 8, 4, 0, 4, 4]) == GemmConfig(64, 128, 64, 8, 4, False, 4, 4)
    assert "s16+" in config.label and "s16+" not in GemmConfig(128, 128, 64, split_k=16).label


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="block_n"):
        GemmConfig(16, 48, 64)
    with pytest.raises(ValueError, match="split_k"):
        GemmConfig(16, 64, 64, split_k=0)


def test_bench_summary_flags_targets():
    from symmcoll.bench.gemm import summarize
    rows = [dict(shape="a", m=16, ratio=0.9, weight_tbs=3.8, weight_mb=64.0),
            dict(shape="b", m=16, ratio=1.2, weight_tbs=2.9, weight_mb=40.0),
            dict(shape="c", m=16, error="wrong", rel_err=1.0, cublas_rel_err=1e-3),
            dict(shape="d", m=16, ratio=0.5, weight_tbs=9.0, weight_mb=64.0, error="wrong after the timed replays")]
    s = summarize(rows)
    assert s["timed"] == 2 and s["wrong"] == 2 and s["above_1_10"] == 1 and s["worst_cell"] == "b M=16"
    assert abs(s["geomean_ratio"] - (0.9 * 1.2) ** 0.5) < 1e-12 and s["min_decode_weight_tbs"] == 2.9


def test_tune_cells_from_a_bench_result_worst_first(tmp_path):
    from symmcoll.bench.gemm import cells_above
    rows = [dict(shape="a", m=16, n=1280, k=8192, ratio=1.02), dict(shape="b", m=256, n=5120, k=8192, ratio=1.35),
            dict(shape="c", m=512, n=2560, k=8192, ratio=1.2), dict(shape="d", m=8, n=64, k=64, error="wrong")]
    result = tmp_path / "gemm.json"
    result.write_text(json.dumps(dict(rows=rows)))
    assert cells_above(result, 1.05) == [("d", 8, 64, 64), ("b", 256, 5120, 8192), ("c", 512, 2560, 8192)]
    assert cells_above(result, 1.3) == [("d", 8, 64, 64), ("b", 256, 5120, 8192)]


# ---- on the GPU machine --------------------------------------------------------------------------------

GPU_CONFIGS = [None, GemmConfig(16, 64, 128, 1, 4, True, 4, 5), GemmConfig(64, 128, 64, 8, 2, False, 4, 4),
               GemmConfig(128, 256, 64, 8, 1, False, 8, 3), GemmConfig(32, 128, 256, 1, 8, True, 4, 3)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c.label if c else "auto")
@pytest.mark.parametrize("shape", [(1, 1280, 8192), (37, 4096, 7160), (300, 2304, 1000), (2048, 8192, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("b_t", [False, True], ids=["B", "W^T"])
def test_gpu_matmul_configs(config, shape, b_t):
    m, n, k = shape
    a, b = _operands(m, n, k, torch.bfloat16, b_t, "cuda", seed=m + k)
    got = gemm.matmul(a, b, config=config)
    want = torch.matmul(a, b)
    assert _rel_err(got, a, b) <= max(1.25 * _rel_err(want, a, b), 5e-3)


@pytest.mark.gpu
def test_gpu_split_k_in_graph_replays_with_fresh_data():
    config = GemmConfig(16, 64, 128, 1, 8, True, 4, 5)
    a = torch.empty((16, 8192), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((8192, 1280), dtype=torch.bfloat16, device="cuda")
    a.normal_()
    gemm.matmul(a, b, config=config)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemm.matmul(a, b, config=config)
    for _ in range(5):
        a.normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(out, a, b) < 5e-3
    assert int(gemm.split_counters(a.device).abs().sum()) == 0


@pytest.mark.parametrize("config,m,n,k", [
    (GemmConfig(128, 128, 64, 8, 16, False, 8, 4), 256, 5120, 8192),                 # shares: SPLIT kernel
    (GemmConfig(128, 128, 64, 8, 16, False, 8, 4, split_wave=True), 512, 5120, 8192),
    (GemmConfig(16, 64, 256, 1, 4, True, 4, 5), 1, 1280, 8192),                       # M = 1 specialised
    (GemmConfig(128, 128, 64, 8, 16, False, 8, 4), 256, 8192, 1024),                 # 128 tiles: whole
    (GemmConfig(128, 256, 64, 8, 1, False, 8, 3), 16384, 8192, 8192),
])
def test_precompile_warms_the_kernel_the_cell_runs(config, m, n, k):
    """The tiny launch a precompile worker makes compiles what the real cell launches: the same
    constexprs (SPLIT included) and the same argument specialisation."""
    from symmcoll import launcher
    from symmcoll.bench.gemm import compile_job, warm_launch

    def recorded(cfg, mm, nn, kk, programs):
        with launcher.recording() as launches:
            a = torch.empty((mm, kk), dtype=torch.bfloat16, device="meta")
            gemm.matmul(a, torch.empty((kk, nn), dtype=torch.bfloat16, device="meta"), config=cfg, programs=programs)
        (rec,) = launches
        specialised = tuple((v == 1, v % 16 == 0) for v, param in zip(rec.args, rec.kernel.params)
                            if isinstance(v, int) and not param.do_not_specialize)
        return rec.meta, specialised

    job = compile_job(config, m, n, k, "bf16", 132)
    assert recorded(*warm_launch(job)) == recorded(config, m, n, k, 132)


WARM_SCRIPT = """
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class NoGpu:  # what JITFunction.warmup asks of the driver; nothing is launched
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("meta")
    def get_device_interface(self): return torch.cuda


driver.set_active(NoGpu())
from symmcoll.bench.gemm import _compile_job, compile_job
from symmcoll.fused.gemm_configs import GemmConfig
for m in (16, 1):  # a stream-K launch, then M = 1 (a whole-tile launch of the same config)
    print(repr(_compile_job(compile_job(GemmConfig(16, 64, 128, 1, 4, True, 4, 3), m, 1280, 8192, "bf16", 132))))
"""


@pytest.mark.skipif(DEVICE != "cpu", reason="compiles on the CPU machine (sm_90 target, no GPU)")
def test_compile_worker_fills_the_cache_without_a_gpu(tmp_path):
    """The tuner's compile workers warm Triton's cache from meta tensors (launcher.warming): the
    kernels a cell runs are compiled, nothing runs."""
    import subprocess
    import sys
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(SRC.parent))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", WARM_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["''", "''"], done.stdout
    assert len(list(tmp_path.rglob("matmul_kernel.cubin"))) == 2  # SPLIT and whole-tile kernels


def test_tune_loop_keeps_the_base_writes_every_cell_and_stops_at_the_budget(tmp_path, monkeypatch):
    """The tuner's bookkeeping without a GPU (the measurement of a cell stubbed): cells in the order
    given, the table rewritten after each (the base's other cells kept), no cell started past the
    budget, a failed compile reported and not fatal."""
    from concurrent.futures import ThreadPoolExecutor
    from rich.console import Console
    from symmcoll.bench import gemm as bench_gemm

    measured_order = []

    def tune_cell(name, m, n, k, *rest):
        measured_order.append((m, n, k))
        config = GemmConfig(128, 128, 64, split_k=16)
        return dict(m=m, n=n, k=k, shape=name, config=config.as_list(), no_split=config.as_list(),
                    label=config.label, us=1.0, cublas_us=1.0, ratio=1.0, candidates=3)

    monkeypatch.setattr(bench_gemm, "_gpu", lambda: torch.device("cpu"))
    monkeypatch.setattr(bench_gemm, "gpu_facts", lambda: dict(gpu="NVIDIA H200", sms=132))
    monkeypatch.setattr(bench_gemm, "_tune_cell", tune_cell)
    monkeypatch.setattr(bench_gemm, "_compile_pool", lambda workers: ThreadPoolExecutor(2))
    monkeypatch.setattr(bench_gemm, "_compile_job", lambda job: "" if job[1] != 1 else "T16: failed")
    base = tmp_path / "base.json"
    old = GemmConfig(64, 64, 128).as_list()
    base.write_text(json.dumps(dict(entries=[dict(m=m, n=1280, k=8192, config=old, no_split=old) for m in (1, 256)])))
    cells = [("qkv", 256, 1280, 8192), ("qkv", 1, 1280, 8192), ("o", 512, 8192, 1024)]
    out = tmp_path / "gemm_h200.json"
    console = Console(file=open(os.devnull, "w"))
    try:
        bench_gemm.tune("bf16", (), None, 3, out, console, base=base, cells=cells)
        entries = {(e["m"], e["n"], e["k"]): e for e in json.loads(out.read_text())["entries"]}
        assert measured_order == [c[1:] for c in cells]
        assert set(entries) == {c[1:] for c in cells} and entries[(256, 1280, 8192)]["config"] != old
        measured_order.clear()
        bench_gemm.tune("bf16", (), None, 3, out, console, base=base, cells=cells, budget_s=0.0)
        assert measured_order == [] and json.loads(out.read_text())["entries"]  # nothing started, table kept
    finally:
        gemm_configs.load_table.cache_clear()
