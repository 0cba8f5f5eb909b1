"""A synthetic benchmark result for the report, plot and dispatch tests, and the GEMM grid with its GPU parts
faked (not a test module)."""

from symmcoll.bench import results
from symmcoll.bench.metrics import bandwidth, link_percent
from symmcoll.bench.plan import TimingPlan

PLAN = TimingPlan(mode="graph", warmup=3, iters=50, min_iters=5, calls_per_graph=20, seconds_per_case=0.5)
SIZES = (4096, 1 << 20)
# (implementation, family) -> time per call in us at each size; symmcoll:bad gives wrong results.
TIMES = {("nccl", "backend"): (12.0, 40.0), ("torch:one_shot", "torch_symm_mem"): (7.0, 30.0),
         ("symmcoll:one_shot", "symmcoll"): (6.0, 32.0), ("symmcoll:bad", "symmcoll"): (1.0, 1.0)}


def _measurement(name, family, size, time_us, wrong):
    bw = bandwidth("all_reduce", size, 4, time_us)
    return results.Measurement(
        op="all_reduce", implementation=name, family=family, size_bytes=size, count=size // 2, dtype="bf16",
        timing="graph", calls_per_sample=20, samples=50, median_us=time_us, p20_us=time_us * 0.99,
        p80_us=time_us * 1.01, per_rank_median_us=(time_us, time_us * 0.98, time_us * 0.97, time_us * 0.99),
        algbw_gbps=bw.algbw_gbps, busbw_gbps=bw.busbw_gbps, link_percent=link_percent(bw.busbw_gbps, 360.0),
        wrong_before=wrong, wrong_after=0, wrong=wrong, error=None, note=None)


def synthetic_result() -> results.BenchResult:
    rows = [_measurement(name, family, size, times[i], 7 if name == "symmcoll:bad" else 0)
            for (name, family), times in TIMES.items() for i, size in enumerate(SIZES)]
    provenance = results.Provenance(
        git_sha="0123456789abcdef", symmcoll_version="0.1.0", torch_version="2.11.0", triton_version="3.6.0",
        nccl_version="2.28.9", python_version="3.12.3", hostname="h", device_type="cuda",
        gpu_name="NVIDIA H200", gpu_count=4, backend="nccl", created_utc="2026-01-01T00:00:00Z")
    config = results.RunConfig(ops=("all_reduce",), sizes=SIZES, dtype="bf16", world_size=4, plan=PLAN,
                               algorithms=None, launcher="pool")
    link = results.LinkLimit(bytes=256 << 20, copy_engine_gbps=360.0, sm_pull_gbps=310.0, note=None)
    return results.BenchResult(results.SCHEMA, provenance, config, link, tuple(rows), ("a note",))




def gemm_grid_on_cpu(monkeypatch, time_cell) -> None:
    """bench/gemm.py's run_bench made to run here: a CPU device with an H100's facts, no compiles, a fixed
    bandwidth, ``time_cell`` in place of the GPU's (its signature: gemm.time_cell's)."""
    import torch

    from symmcoll.bench import gemm

    class Bandwidth:
        copy_tbs = read_tbs = torch_copy_tbs = 2.9

        def as_dict(self):
            return {}
    monkeypatch.setattr(gemm, "current_gpu", lambda: torch.device("cpu"))
    monkeypatch.setattr(gemm, "gpu_facts", lambda: dict(gpu="NVIDIA H100 80GB HBM3", sms=132,
                                                        created_utc="2026-11-28T00:00:00Z"))
    monkeypatch.setattr(gemm, "precompile", lambda jobs, workers: [])
    monkeypatch.setattr(gemm.bandwidth, "measure", lambda device: Bandwidth())
    monkeypatch.setattr(gemm, "time_cell", time_cell)
