"""The GEMM core beside cuBLAS on one GPU: ``symmcoll bench --op gemm`` (the grid). Its tuning side,
``symmcoll tune --op gemm`` (the table ``gemm_tables.gemm_config`` reads), is bench/gemm_tune.py.

The grid: M in GRID_M x the (N, K) of the layers serving lives in (``SHAPES``: Llama-3-70B at TP 2, 4
and 8, Llama-3-405B at TP 8, DeepSeek-V3's experts), C = A @ B with B [K, N] the weights. Every cell:

* correctness first: rows of both results (ours and ``torch.matmul``'s, on the same data) against an
  fp32 reference, ``rel_err`` each; a cell whose result is off is reported and not timed; ours is
  checked again after the timed graph replays (``rel_err_after``);
* time: CUDA-graph replays, median per call, ours and cuBLAS interleaved in the same run (rounds planned
  from the cell's pace by bench/gemm_timing.py, at least 5, the order rotated each round): ``ratio`` is
  the median round of ours over cuBLAS's, ``ratio_paired`` the median of each round's ratio
  (``round_ratios``; the GPU's drift between rounds cancels), and the summary (geomean, worst, cells
  above 1.10x) uses the paired one where a row has it. Inputs
  rotate over enough sets that the weights come from HBM, not L2 (as in serving, where each layer's
  weights are read once per step);
* rates: TFLOP/s, and the weight-read rate (bytes of B / time) beside the SM read kernel's rate
  measured in the same run (bench/bandwidth.py): over 1 GiB, and at the decode cells (M <= 64, B of
  DECODE_MB or more) over the cell's own weight sets, one launch a read (``read_tbs_same_bytes``, the best
  of bandwidth.READ_VARIANTS: what streaming those bytes alone reaches, each launch's start and tail included);
* the GPU's state (``gpu_state``: SM clock, temperature, power, throttle reasons) before the cell's first
  round and after its last, where NVML is there (bench/gpu_state.py): whether a cell that drifted ran
  at its power cap or hot;
* each side's energy per call and SM clock in every round, and in energy windows where asked (bench/
  gemm_energy.py): whether the kernel that loses at the power cap spends more energy per GEMM.

The kernels are compiled ahead in parallel processes (``precompile``: a Triton compile takes seconds,
a timing milliseconds); the tune (bench/gemm_tune.py) compiles its candidates with the same jobs, so
they live here, beside the cells, checks and timings it measures with too.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import launcher
from ..fused import gemm
from ..fused.gemm_configs import GemmConfig, split_plan, tiles_of
from ..fused.gemm_tables import gpu_key
from . import bandwidth
from . import cublas_kernels as cublas_names
from . import gemm_energy, gpu_state
from .gemm_timing import time_pair
from .rounds import paired_ratio, paired_ratios
from .timing import frozen_heap, graph_us

GRID_M = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# (model and layer, N, K) of C[M, N] = A[M, K] @ W^T, W^T = B [K, N]
SHAPES = (
    ("70b-tp2 qkv", 5120, 8192), ("70b-tp2 o", 8192, 4096), ("70b-tp2 gate_up", 28672, 8192),
    ("70b-tp2 down", 8192, 14336),
    ("70b-tp4 qkv", 2560, 8192), ("70b-tp4 o", 8192, 2048), ("70b-tp4 gate_up", 14336, 8192),
    ("70b-tp4 down", 8192, 7168),
    ("70b-tp8 qkv", 1280, 8192), ("70b-tp8 o", 8192, 1024), ("70b-tp8 gate_up", 7168, 8192),
    ("70b-tp8 down", 8192, 3584),
    ("405b-tp8 qkv", 2304, 16384), ("405b-tp8 o", 16384, 2048), ("405b-tp8 gate_up", 13312, 16384),
    ("405b-tp8 down", 16384, 6656),
    ("dsv3-expert gate_up", 4096, 7168), ("dsv3-expert down", 7168, 2048),
)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Rotating input sets until A + B + C of all sets exceed this (twice an H200's 60 MB of L2 and more).
ROTATE_BYTES = 256 << 20
MAX_SETS = 16
CHECK_ROWS = 256
# Timed replays of each side of a cell: the command line's --iters (``replays``, default 10) times this,
# the 3 rounds of ``replays`` the grid timed until 2026-11-28; bench/gemm_timing.py plans them in rounds.
REPLAYS_PER_ITER = 3
# Decode cells whose weight-read rate issue 22 judges (M <= 64, B of at least this many MiB): the read
# kernel is timed over their weights too (``read_tbs_same_bytes``, once per weight size and set count).
DECODE_MB = 32
_READ_RATES: dict = {}
# A result further than this from fp32 (relative, Frobenius) is wrong, whatever cuBLAS's error.
MAX_REL_ERR = 2e-2


@dataclass
class Cell:
    """One (M, N, K) of the grid and its rotating input sets."""

    name: str
    m: int
    n: int
    k: int
    sets: list
    reference: torch.Tensor  # fp32 rows ``rows`` of A @ B for set 0
    rows: torch.Tensor

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def weight_bytes(self) -> int:
        return self.n * self.k * self.sets[0][1].element_size()


def make_cell(name: str, m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, seed: int = 0,
              rotate: bool = True) -> Cell:
    """The cell's input sets: enough to rotate through ``ROTATE_BYTES`` (every call reads its inputs from
    HBM, as a layer's weights are), or one (``rotate=False``: the same inputs every call, L2-warm where
    they fit -- how the fused ops' bench calls them)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_set = (m * k + k * n + m * n) * dtype.itemsize
    count = max(1, min(MAX_SETS, math.ceil(ROTATE_BYTES / per_set))) if rotate else 1
    sets = []
    for _ in range(count):
        a = torch.randn((m, k), device=device, dtype=torch.float32, generator=gen).to(dtype)
        b = (torch.randn((k, n), device=device, dtype=torch.float32, generator=gen) / math.sqrt(k)).to(dtype)
        sets.append((a, b, torch.empty((m, n), device=device, dtype=dtype)))
    rows = torch.randperm(m, device=device, generator=gen)[:CHECK_ROWS]
    a, b, _ = sets[0]
    return Cell(name, m, n, k, sets, a[rows].float() @ b.float(), rows)


def rel_err(cell: Cell, out: torch.Tensor) -> float:
    got = out[cell.rows].float()
    return float((got - cell.reference).norm() / cell.reference.norm().clamp_min(1e-30))


def ours(cell: Cell, config: GemmConfig | None):
    return [lambda a=a, b=b, c=c: gemm.matmul(a, b, out=c, config=config) for a, b, c in cell.sets]


def cublas(cell: Cell):
    return [lambda a=a, b=b, c=c: torch.matmul(a, b, out=c) for a, b, c in cell.sets]


def check(cell: Cell, calls) -> float:
    """Relative error of the first call's result (poisoned output first: every element must be written)."""
    cell.sets[0][2].fill_(float("nan"))
    calls[0]()
    torch.cuda.synchronize()
    return rel_err(cell, cell.sets[0][2])


def timed_us(calls, replays: int, min_graph_us: float = 200.0) -> float:
    samples = graph_us(calls, replays, min_graph_us=min_graph_us)
    return sorted(samples)[len(samples) // 2]


def current_gpu() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


def gpu_facts() -> dict:
    import triton
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return dict(gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__, triton=triton.__version__,
                git=os.environ.get("SYMMCOLL_GIT_SHA") or _git_sha(), created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                                 time.gmtime()))


def _git_sha() -> str:
    from .provenance import git_sha
    return git_sha()


def run_bench(dtype_name: str, ms: tuple[int, ...], shape_filter: list[str] | None, replays: int, out_dir: Path,
              console, workers: int = 12, cublas_kernels: bool = True, energy_window_s: float = 0.0,
              energy_ms: tuple[int, ...] = gemm_energy.ENERGY_WINDOW_M) -> Path:
    """The grid: every cell checked, then ours (``gemm_config``'s pick) and cuBLAS timed (``time_cell``);
    one JSON, rewritten after every cell (a run cut short keeps every cell it timed; its summary says how
    many of the planned cells that is). The kernels the grid runs are compiled first, in parallel
    processes; meanwhile (``cublas_kernels``) another process records which kernels cuBLAS runs in each
    cell (bench/cublas_kernels.py: ``cublas_kernels`` in the rows). Prints each shape's seconds and the
    total (``seconds`` and ``shape_seconds`` in the JSON; ``cell_s``, ``started_s`` (since the start) and
    ``planned_gpu_s`` in the rows). Energy windows (``energy_window_s`` > 0) at the M in ``energy_ms``."""
    started = time.time()
    device = current_gpu()
    dtype = DTYPES[dtype_name]
    facts = gpu_facts()
    shapes = grid_shapes(shape_filter)
    planned = len(shapes) * len(ms)
    profiling = cublas_names.start([(m, n, k) for _, n, k in shapes for m in ms], dtype_name,
                                   device.index) if cublas_kernels else None
    jobs = [compile_job(gemm.gemm_config(m, n, k, dtype, device), m, n, k, dtype_name, facts["sms"],
                        gpu_key(facts["gpu"]))
            for _, n, k in shapes for m in ms]
    failures = precompile(jobs, workers)
    compile_s = time.time() - started
    console.print(f"precompiled {len(set(jobs))} kernels in {compile_s:.0f} s"
                  f"{'; failed: ' + '; '.join(failures[:5]) if failures else ''}", highlight=False)
    found, seconds, error = cublas_names.collect(profiling) if profiling else ({}, None, None)
    names_note = dict(cells=len(found), seconds=seconds, error=error) if profiling else None
    if profiling:
        console.print(f"cuBLAS kernels of {len(found)} cells recorded ({time.time() - started:.0f} s since the "
                      f"start){'; ' + error if error else ''}", highlight=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"gemm-{gpu_key(facts['gpu']) or 'gpu'}-{dtype_name}-{facts['created_utc'].replace(':', '')}.json"
    rows, shape_seconds = [], {}
    summary = summarize(rows, planned)
    with frozen_heap():
        bw = bandwidth.measure(device)
        reader = gpu_state.reader_for(device)
        console.print(gpu_state.announce(reader), highlight=False)
        counter = gemm_energy.probe_counter(reader.meter, busy=gemm_energy.spin_gpu)
        console.print(gemm_energy.announce(reader.unavailable, counter, energy_window_s, energy_ms), highlight=False)
        console.print(f"{facts['gpu']}: SM copy kernel {bw.copy_tbs:.2f} TB/s (read + write), SM read kernel "
                      f"{bw.read_tbs:.2f} TB/s, graph-captured copy_ {bw.torch_copy_tbs:.2f} TB/s", highlight=False)
        for name, n, k in shapes:
            shape_started = time.time()
            for m in ms:
                cell_started = time.time()
                row = time_cell(name, m, n, k, dtype_name, device, replays, counter,
                                counter.window_s(energy_window_s) if m in energy_ms else 0.0)
                row.update(found.get((m, n, k), {}), cell_s=round(time.time() - cell_started, 2),
                           started_s=round(cell_started - started, 2))
                rows.append(row)
                console.print(_line(row), highlight=False)
                shape_seconds[name] = round(time.time() - shape_started, 1)
                summary = summarize(rows, planned)
                # (whole or not at all: the stage's timeout may land in the middle of a write)
                partial = path.with_suffix(".json.partial")
                partial.write_text(json.dumps(dict(provenance=facts, bandwidth=bw.as_dict(), summary=summary,
                                                   rows=rows, seconds=round(time.time() - started),
                                                   compile_s=round(compile_s), shape_seconds=shape_seconds,
                                                   cublas_kernels=names_note, energy_counter=counter.as_dict()),
                                              indent=1))
                os.replace(partial, path)
            console.print(f"-- {name}: {sum(r['shape'] == name for r in rows)} cells in {shape_seconds[name]:.1f} s "
                          f"(planned GPU time {_planned_s(r for r in rows if r['shape'] == name):.1f} s; "
                          f"{time.time() - started:.0f} s since the start)", highlight=False)
    console.print(json.dumps(summary), highlight=False)
    if summary["energy"]:
        console.print(gemm_energy.describe(summary["energy"]), highlight=False)
    console.print(f"grid: {summary['timed']} of {planned} planned cells timed in {time.time() - started:.0f} s "
                  f"(compiles {compile_s:.0f} s, planned GPU time of the cells {_planned_s(rows):.0f} s)",
                  highlight=False)
    console.print(f"result written: {path} ({time.time() - started:.0f} s)", highlight=False)
    return path


def _planned_s(rows) -> float:
    return sum(r.get("planned_gpu_s", 0.0) for r in rows)


def time_cell(name: str, m: int, n: int, k: int, dtype_name: str, device: torch.device, replays: int,
              counter: gemm_energy.CounterProbe | None = None, window_s: float = 0.0) -> dict:
    """One cell's row: both results checked against fp32, then ours and cuBLAS timed in paired rounds
    (bench/gemm_timing.py ``time_pair``; energy and clock metered given ``counter``), ours checked again."""
    dtype = DTYPES[dtype_name]
    cell = make_cell(name, m, n, k, dtype, device)
    config = gemm.gemm_config(m, n, k, dtype, device)
    row = dict(shape=name, m=m, n=n, k=k, dtype=dtype_name, config=config.label,
               weight_mb=cell.weight_bytes / 2 ** 20, sets=len(cell.sets))
    row["rel_err"], row["cublas_rel_err"] = check(cell, ours(cell, None)), check(cell, cublas(cell))
    bound = max(MAX_REL_ERR, 2 * row["cublas_rel_err"])
    if not row["rel_err"] <= bound:
        row["error"] = "result off the fp32 reference: not timed"
    else:
        reader = gpu_state.reader_for(device)
        meter = reader.meter if counter and not reader.unavailable else None
        pair = time_pair({"ours": ours(cell, None), "cublas": cublas(cell)}, len(cell.sets),
                         replays * REPLAYS_PER_ITER, observe=reader.read, meter=meter, window_s=window_s)
        plan = pair.plan
        if pair.around_rounds and pair.around_rounds["after"] is not None:
            row["gpu_state"] = pair.around_rounds
        row.update(calls_per_graph=plan.calls_per_graph, rounds=plan.rounds, replays_per_round=plan.per_round,
                   warmup_replays=plan.warmup,
                   planned_gpu_s=round(plan.gpu_seconds(list(pair.probe_us.values()), len(cell.sets)), 3))
        # and correct after the timed graph replays too (stream-K's counters back at zero)
        row["rel_err_after"] = check(cell, ours(cell, None))
        if m <= 64 and cell.weight_bytes >= DECODE_MB << 20:
            key = (device, cell.weight_bytes, len(cell.sets))
            if key not in _READ_RATES:
                _READ_RATES[key] = bandwidth.read_same_bytes_tbs([b for _, b, _ in cell.sets])
            row["read_tbs_same_bytes"], row["read_variants_tbs"] = _READ_RATES[key]
        if pair.measured.errors:  # (a side that raised in a round: no figure for the cell)
            row["error"] = "; ".join(f"{side}: {e}" for side, e in pair.measured.errors.items())
        else:
            row.update(cell_fields(cell, pair.round_medians("ours"), pair.round_medians("cublas")))
            if counter:
                row.update(gemm_energy.pair_fields(pair, counter, row))
            if not row["rel_err_after"] <= bound:
                row["error"] = "result off the fp32 reference after the timed replays"
    del cell
    torch.cuda.empty_cache()
    return row


def cell_fields(cell: Cell, mine: list[float], theirs: list[float]) -> dict:
    """A timed row's times, ratios and rates from each side's median per round (us per call): ``us`` and
    ``cublas_us`` the median round, ``ratio`` ours over cuBLAS's, ``ratio_paired`` the median of the
    per-round ratios."""
    us, cublas_us = statistics.median(mine), statistics.median(theirs)
    ratios = paired_ratios(mine, theirs)
    return dict(us=us, cublas_us=cublas_us, ratio=us / cublas_us, round_us=mine, round_cublas_us=theirs,
                round_ratios=ratios, ratio_paired=paired_ratio(ratios), tflops=cell.flops / us / 1e6,
                weight_tbs=cell.weight_bytes / us / 1e6, cublas_weight_tbs=cell.weight_bytes / cublas_us / 1e6)


def decided_ratio(row: dict) -> float:
    """The ratio a cell is judged by: the paired one (median of per-round ratios) where the row has it
    (results before 2026-11-28 have only ``ratio``)."""
    return row.get("ratio_paired") or row["ratio"]


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict], planned: int | None = None) -> dict:
    """Geometric mean, worst and cells above 1.10x of ours / cuBLAS (``decided_ratio``: paired where
    measured; ``*_pooled``: of the medians, as before); the weight-read rate at M <= 64 for B >= 32 MB;
    ``planned``: the cells the run set out to time (a run cut short has fewer ``cells``)."""
    right = [r for r in rows if "ratio" in r and "error" not in r]  # (a cell wrong after timing has a ratio)
    ratios, pooled = [decided_ratio(r) for r in right], [r["ratio"] for r in right]
    decode = [r["weight_tbs"] for r in right if r["m"] <= 64 and r["weight_mb"] >= DECODE_MB]
    streamed = [r for r in right if "read_tbs_same_bytes" in r]
    worst = max(right, key=decided_ratio, default=None)
    return dict(planned=planned or len(rows), cells=len(rows), timed=len(ratios), wrong=sum("error" in r for r in rows),
                ratio="paired rounds" if any("ratio_paired" in r for r in right) else "median over median",
                geomean_ratio=_geomean(ratios), worst_ratio=worst and decided_ratio(worst),
                worst_cell=worst and f"{worst['shape']} M={worst['m']}", above_1_10=sum(r > 1.10 for r in ratios),
                geomean_ratio_pooled=_geomean(pooled), above_1_10_pooled=sum(r > 1.10 for r in pooled),
                min_decode_weight_tbs=min(decode) if decode else None,
                decode_at_3_6_tbs=sum(rate >= 3.6 for rate in decode), decode_cells=len(decode),
                # decode cells whose B streams at least as fast as the read kernel over the same weights
                decode_at_read_rate=sum(r["weight_tbs"] >= r["read_tbs_same_bytes"] for r in streamed),
                decode_read_timed=len(streamed),
                gpu_state=gpu_state.count_ended_held(rows), energy=gemm_energy.summarize(right, decided_ratio))


def _line(row: dict) -> str:
    head = f"{row['shape']:<20} M={row['m']:<6} {row['config']:<26}"
    if "error" in row:
        return (f"{head} WRONG ({row['error']}) rel_err {row['rel_err']:.2e}"
                f"{' then %.2e' % row['rel_err_after'] if 'rel_err_after' in row else ''} "
                f"(cuBLAS {row['cublas_rel_err']:.2e})")
    return (f"{head} {row['us']:9.1f} us  cuBLAS {row['cublas_us']:9.1f}  x{row['ratio']:.3f} "
            f"(paired rounds x{decided_ratio(row):.3f})  "
            f"{row['tflops']:6.1f} TF/s  B {row['weight_tbs']:.2f} TB/s (cuBLAS {row['cublas_weight_tbs']:.2f}"
            f"{', read kernel %.2f' % row['read_tbs_same_bytes'] if 'read_tbs_same_bytes' in row else ''})  "
            f"err {row['rel_err']:.1e}/{row['cublas_rel_err']:.1e}"
            f"{'  vs cuBLAS ' + cublas_names.describe(row) if _shows_cublas(row) else ''}"
            f"{'  ' + gpu_state.tag(row.get('gpu_state')) if _shows_gpu_state(row) else ''}"
            f"{'  ' + gemm_energy.tag(row) if gemm_energy.tag(row) else ''}")


# Cells slower than this x cuBLAS show cuBLAS's kernel beside our config on their bench line, and the
# GPU's clock, temperature and throttle reasons before and after their rounds.
SHOW_CUBLAS_ABOVE = 1.05


def _shows_cublas(row: dict) -> bool:
    return decided_ratio(row) > SHOW_CUBLAS_ABOVE and cublas_names.describe(row) is not None


def _shows_gpu_state(row: dict) -> bool:
    return decided_ratio(row) > SHOW_CUBLAS_ABOVE and gpu_state.tag(row.get("gpu_state")) is not None


def named(name: str, wanted: list[str] | None) -> bool:
    """Whether a shape's name is selected by the name prefixes ``wanted`` (None: every shape). A space in a
    name reads as '-' (a command line splits "fused 1024x1024" in two words, whose "fused" selects every
    fused shape; "fused-1024x1024" selects that one)."""
    return not wanted or any(name.replace(" ", "-").startswith(w.replace(" ", "-")) for w in wanted)


def grid_shapes(names: list[str] | None):
    return [s for s in SHAPES if named(s[0], names)]


# ---- compiling ahead (the grid's kernels; the tune's candidates, gemm_tune.py) ----------------------

def _warm_class(x: int) -> int:
    """A small size Triton specialises like ``x`` (== 1, multiple of 16, or neither)."""
    return 1 if x == 1 else (64 if x % 16 == 0 else 24)


def compile_job(config: GemmConfig, m: int, n: int, k: int, dtype_name: str, sms: int,
                key: str | None = "h200") -> tuple:
    """What ``precompile`` needs to compile the kernel ``config`` runs at (m, n, k) on GPU model ``key``: the
    config, the size classes Triton specialises on, whether the launch shares tiles (another kernel) and
    whether it runs with PDL and early release (gemm.launch_pdl: by the real shape, not the tiny one's), how
    it sums tiles in two parts (gemm.launch_pair_mode: 0, 1 or 2, by the real shape) and whether it runs with
    the small products' PDL instead (gemm.launch_pdl too)."""
    programs = sms * config.occupancy
    shared = split_plan(config, tiles_of(config, m, n), k, programs).shared
    itemsize = DTYPES[dtype_name].itemsize
    early, small = gemm.launch_pdl(m, n, k, itemsize, shared, config.occupancy, key)
    pair = gemm.launch_pair_mode(config, m, n, k, itemsize, programs)
    return (tuple(config.as_list()), _warm_class(m), _warm_class(n), _warm_class(k), dtype_name, shared, early, pair,
            small)


def warm_launch(job) -> tuple[GemmConfig, int, int, int, int | None]:
    """(config, m, n, k, programs) of a tiny launch that compiles ``job``'s kernel: its size classes;
    a sharing launch is made to share the same way (its tiles on four times as many programs, 64
    k-steps each: a wave split and stream-K both split there; in two parts where the real launch sums
    pairs -- one round of them, which compile_in_worker's PAIR_REDUCE then caps at the real mode), a
    whole-tile one not to."""
    config_list, m, n, k, _, shared, _, pair, _ = job
    config = GemmConfig.from_list(config_list)
    if shared:
        if pair:
            config = replace(config, split_k=2)
        return config, m, n, 64 * config.block_k + k % 16, 4 * tiles_of(config, m, n)
    return replace(config, split_k=1), m, n, k, None


def compile_in_worker(job) -> str:
    """Worker process: compile one (config, specialisation) into Triton's cache from a launch on meta
    tensors (launcher.warming: nothing runs on the GPU the parent is timing); the parent's launch of
    the real shape then loads it from the cache."""
    config, m, n, k, programs = warm_launch(job)
    dtype = DTYPES[job[4]]
    a = torch.empty((m, k), device="meta", dtype=dtype)
    b = torch.empty((k, n), device="meta", dtype=dtype)
    try:
        with launcher.warming(), gemm.decode_pdl_switched(job[6], job[8]), gemm.pair_reduce_switched(job[7]):
            gemm.matmul(a, b, config=config, programs=programs)
        return ""
    except Exception as exc:  # noqa: BLE001 - reported by the parent, which skips the config
        return f"{config.label}: {type(exc).__name__}: {str(exc)[:200]}"


def compile_pool(workers: int) -> ProcessPoolExecutor:
    import multiprocessing
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def precompile(jobs: list[tuple], workers: int) -> list[str]:
    with compile_pool(workers) as pool:
        return [e for e in pool.map(compile_in_worker, list(dict.fromkeys(jobs))) if e]
