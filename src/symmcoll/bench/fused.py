"""``symmcoll bench --op all_gather_matmul ...``: fused ops beside their unfused baselines, by shape.
Memory-bound ops (bench/memory_bound.py: all_reduce_rms_norm, all_reduce_quantized, moe_dispatch,
moe_combine) get the roofline instead of FLOPs: bytes per rank, GB/s and % of the SM copy rate measured
at the start of the same run (bench/roofline.py).

Per shape, on every rank: every implementation binds inputs (random, seeded by rank), checks its result
against an fp32 reference (relative error; nothing is timed that does not match) and captures its CUDA
graph (eager where capture fails); then all are timed in interleaved rounds (bench/rounds.py: each round
every implementation in turn, the order rotated, the replays split over the rounds, as many rounds as
keep one round within ROUND_BUDGET_S unless ``--rounds`` says; the row's time is the median of all its
samples, slowest rank), and each is checked again on fresh data after timing. The same run times
cuBLAS on the full problem on one GPU (``torch.matmul`` of the whole A), the denominator of every
ratio: ``x_cublas`` (median over median, all samples) and ``x_cublas_paired`` (the median of the
per-round ratios ``x_cublas_per_round``: the GPU's drift between rounds cancels; the table shows it).
Result: one JSON per (op, world size), rows with time, TFLOP/s, ratios to cuBLAS and relative error.

A ``FusedSpec`` says, per op, how to make inputs, the reference, the FLOPs, the local GEMM and the
baselines outside symmcoll; symmcoll's variants are the op's registered algorithms (plus "auto").
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

import symmcoll
import symmcoll.reference
from symmcoll import plan

from . import fused_timing, memory_bound, provenance, roofline
from .fused_timing import Implementation
from .rounds import ROUND_BUDGET_S, ROUNDS, first_error, interleave, plan_rounds

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}


@dataclass(frozen=True)
class FusedSpec:
    op: str
    shapes: tuple                         # default shapes, e.g. (M, N, K)
    inputs: Callable                      # (shape, dtype, rank, world, call, device) -> tuple of tensors
    reference: Callable                   # (inputs, group) -> fp32 result (collective)
    run: Callable                         # (algorithm, inputs, group) -> result tensor
    flops: Callable                       # shape -> FLOPs per rank
    local: Callable                       # (shape, dtype, device) -> thunk: cuBLAS on the whole problem
    baselines: dict = field(default_factory=dict)  # name -> (inputs, group) -> thunk, or raises
    # A baseline that computes something else than the op (e.g. the all-reduce alone): its reference.
    baseline_references: dict = field(default_factory=dict)  # name -> (inputs, group) -> fp32 result
    local_name: str = "cublas (whole problem, one GPU)"
    # Memory-bound ops (bench/memory_bound.py): bytes(shape, dtype, world, algorithm, inputs, rank) -> the
    # bytes of this rank's memory the implementation must move (or None): rows get GB/s and % of the
    # copy rate measured in the same run.
    bytes: Callable | None = None
    # compare_rows(result, inputs, group, shape) -> the rows of the result that are defined (the check
    # compares those with as many rows of the reference); tolerance(shape, dtype) -> float or None.
    compare_rows: Callable | None = None
    tolerance: Callable | None = None
    # run, reference, baselines and baseline_references take the shape as their last argument
    shape_args: bool = False

    def call(self, fn: Callable, *args, shape):
        """``fn(*args)``, with the shape appended where this op's callables take it (``shape_args``)."""
        return fn(*args, shape) if self.shape_args else fn(*args)

    def checked_error(self, got: torch.Tensor, want: torch.Tensor, inputs, group, shape) -> float:
        """Relative error of ``got`` against the fp32 ``want``, over the rows ``compare_rows`` defines."""
        if self.compare_rows is not None:
            got = self.compare_rows(got, inputs, group, shape)
            want = want[:got.shape[0]]
        return _rel_err(got, want)


# ---- all_gather_matmul -----------------------------------------------------------------------------

def _agmm_inputs(shape, dtype, rank, world, call, device):
    M, N, K = shape
    g = torch.Generator(device=device).manual_seed(1000 * call + rank)
    a = torch.randn(M // world, K, generator=g, device=device, dtype=torch.float32).to(dtype)
    gb = torch.Generator(device=device).manual_seed(7 + call)
    b = (torch.randn(K, N, generator=gb, device=device, dtype=torch.float32) / K ** 0.5).to(dtype)
    return a, b


def _agmm_reference(inputs, group):
    a, b = inputs
    world = dist.get_world_size(group)
    full = torch.empty((world * a.shape[0], a.shape[1]), dtype=a.dtype, device=a.device)
    dist.all_gather_into_tensor(full, a, group=group)
    return full.float() @ b.float()


def _agmm_torch_fused(inputs, group):
    import torch.distributed._symmetric_memory as symm_mem  # noqa: F401
    a, b = inputs
    op = torch.ops.symm_mem.fused_all_gather_matmul
    name = group.group_name
    return lambda: op(a, [b], 0, name, return_A=False)[1][0]  # (C only, as symmcoll's call is made)


AGMM = FusedSpec(
    op="all_gather_matmul",
    shapes=((16384, 8192, 8192), (16384, 6656, 16384), (16384, 3584, 8192), (4096, 8192, 8192),
            (1024, 8192, 8192), (1024, 1024, 1024), (256, 8192, 8192), (64, 8192, 8192), (16, 8192, 8192)),
    inputs=_agmm_inputs,
    reference=_agmm_reference,
    run=lambda algorithm, inputs, group: symmcoll.all_gather_matmul(inputs[0], inputs[1], group, algorithm=algorithm),
    flops=lambda s: 2 * s[0] * s[1] * s[2],
    local=lambda s, dtype, device: _local_matmul(s, dtype, device),
    baselines={"torch:fused_all_gather_matmul": _agmm_torch_fused},
)



# ---- the row-parallel side: matmul + reduce-scatter / all-reduce, all-reduce + RMSNorm -----------------
# Shapes (M, N, K) give the whole layer's K: each of W ranks multiplies by its K / W slice (the issue's
# 70B-class MLP down-projection: N = 8192, K = 28672).

def _row_parallel_inputs(shape, dtype, rank, world, call, device):
    M, N, K = shape
    g = torch.Generator(device=device).manual_seed(1000 * call + rank)
    a = torch.randn(M, K // world, generator=g, device=device, dtype=torch.float32).to(dtype)
    b = (torch.randn(K // world, N, generator=g, device=device, dtype=torch.float32) / K ** 0.5).to(dtype)
    return a, b


def _local_rank_matmul(shape, dtype, device):
    """cuBLAS on one rank's part (A [M, K/W] @ B [K/W, N]): the GEMM the fused op hides its
    communication under."""
    a, b = _row_parallel_inputs(shape, dtype, 0, dist.get_world_size(), 0, device)
    out = torch.empty(shape[0], shape[1], device=device, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


def _torch_fused_matmul_reduce_scatter(inputs, group):
    import torch.distributed._symmetric_memory as symm_mem  # noqa: F401
    a, b = inputs
    return lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group.group_name)


MMRS = FusedSpec(
    op="matmul_reduce_scatter",
    shapes=tuple((m, 8192, 28672) for m in (16, 128, 512, 2048, 8192, 16384)),
    inputs=_row_parallel_inputs,
    reference=lambda inputs, group: symmcoll.reference.matmul_reduce_scatter(*inputs, group),
    run=lambda algorithm, inputs, group: symmcoll.matmul_reduce_scatter(*inputs, group, algorithm=algorithm),
    flops=lambda s: 2 * s[0] * s[1] * s[2] // dist.get_world_size(),
    local=_local_rank_matmul,
    baselines={"torch:fused_matmul_reduce_scatter": _torch_fused_matmul_reduce_scatter},
)

MMAR = FusedSpec(
    op="matmul_all_reduce",
    shapes=tuple((m, 8192, 28672) for m in (1, 16, 128, 512, 2048, 8192, 16384)),
    inputs=_row_parallel_inputs,
    reference=lambda inputs, group: symmcoll.reference.matmul_all_reduce(*inputs, group),
    run=lambda algorithm, inputs, group: symmcoll.matmul_all_reduce(*inputs, group, algorithm=algorithm),
    flops=lambda s: 2 * s[0] * s[1] * s[2] // dist.get_world_size(),
    local=_local_rank_matmul,
)


SPECS = {spec.op: spec for spec in (AGMM, MMRS, MMAR, *memory_bound.specs(FusedSpec))}


def _local_matmul(shape, dtype, device):
    """cuBLAS on the whole problem, with data drawn like the variants' (a GEMM's clock, and so its
    time, depends on the data: random inputs of the same scale on both sides)."""
    a, b = _agmm_inputs(shape, dtype, 0, 1, 0, device)  # world 1: the whole A
    out = torch.empty(shape[0], shape[1], device=device, dtype=dtype)
    return lambda: torch.matmul(a, b, out=out)


# ---- rank side ---------------------------------------------------------------------------------------

def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))


# Calls per graph when the command line does not say: the collective bench's (--calls-per-graph).
CALLS_PER_GRAPH = 20


def run_shape(op: str, shape: tuple, dtype_name: str, algorithms: tuple | None, replays: int,
              calls_per_graph: int, copy_gbps: float | None = None, rounds: int | None = None) -> list[dict]:
    """Every implementation of ``op`` at ``shape`` (collective; the same rows on every rank): each checked
    against the reference and captured, then all timed in interleaved rounds (bench/rounds.py:
    ``rounds`` of them, or as many as rounds.plan_rounds gives for the batch's pace when None), checked
    again on fresh data."""
    spec = SPECS[op]
    group = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    device = fused_timing.rank_device()
    dtype = TORCH_DTYPES[dtype_name]
    tolerance = (spec.tolerance and spec.tolerance(shape, dtype_name)) or TOLERANCE[dtype_name]

    def check_and_capture(impl: Implementation) -> None:
        error = None
        try:
            impl.inputs = spec.inputs(shape, dtype, rank, world, 0, device)
            impl.thunk = (lambda i=impl.inputs, w=impl.what: spec.call(spec.run, w, i, group, shape=shape)) \
                if impl.family == "symmcoll" else spec.call(impl.what, impl.inputs, group, shape=shape)
            reference = spec.baseline_references.get(impl.name, spec.reference)
            impl.err = spec.checked_error(impl.thunk(), spec.call(reference, impl.inputs, group, shape=shape),
                                          impl.inputs, group, shape)
            if impl.err > tolerance:
                raise AssertionError(f"relative error {impl.err:.2e} before timing")
            impl.prepared = fused_timing.prepare(impl.thunk, calls_per_graph, group)
        except Exception as exc:  # noqa: BLE001 - reported in the row; the sweep goes on
            error = f"{type(exc).__name__}: {exc}"
        fail(impl, first_error(error, group))

    def check_after(impl: Implementation) -> None:
        """Fresh data through the thunk, checked again: the timed replays left nothing wrong behind."""
        error = None
        try:
            reference = spec.baseline_references.get(impl.name, spec.reference)
            fresh = spec.inputs(shape, dtype, rank, world, 1, device)
            for dst, src in zip(impl.inputs, fresh):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            impl.err = max(impl.err, spec.checked_error(impl.thunk(), spec.call(reference, impl.inputs, group,
                                                                                shape=shape), impl.inputs, group, shape))
            impl.nbytes = spec.bytes(shape, dtype, world, impl.what if impl.family == "symmcoll" else impl.name,
                                     impl.inputs, rank) if spec.bytes else None
            symmcoll.check()
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"
        fail(impl, first_error(error, group))

    batch: list[Implementation] = []

    def fail(impl: Implementation, error: str | None) -> None:
        """An implementation's error (agreed: every rank calls this): it is out, and the workspaces are
        rebuilt (symmcoll.reset), so the batch's captured symmcoll graphs, which point into the old
        buffers, are checked and captured again."""
        if error is None:
            return
        impl.error, impl.prepared = error, None
        symmcoll.reset()
        for other in [b for b in batch if b.family == "symmcoll" and b.error is None and b is not impl]:
            other.prepared = None
            check_and_capture(other)

    def time_one(impl: Implementation, _round: int):
        plan = fused_timing.replay_plan(replays, impl.prepared.calls, rounds) if rounds else \
            fused_timing.planned_round(impl.per_round, impl.prepared)
        samples = fused_timing.time_round(impl.prepared, plan, group).samples_us
        if impl.family == "symmcoll":
            symmcoll.check()  # (a kernel's recorded failure belongs to this turn's implementation)
        return samples

    def time_batch() -> None:
        """The batch (and cuBLAS) in interleaved rounds, then each checked again on fresh data, then freed."""
        timed = [i for i in [local, *batch] if i is not None and i.error is None]
        count = rounds
        if not rounds:
            planned = plan_rounds([fused_timing.replay_seconds(i.prepared) for i in timed],
                                  [fused_timing.warmup_replays(i.prepared) for i in timed], replays)
            count = planned.rounds
            for impl in timed:
                impl.per_round = planned.per_round
        result = interleave(timed, count, time_one, agree=lambda e: first_error(e, group), on_failure=fail)
        offset = len(local.round_medians) if local is not None else 0
        for impl in timed:
            impl.samples += result.samples[impl]
            impl.local_rounds += [offset + k for k in range(len(result.round_medians[impl]))]
            impl.round_medians += result.round_medians[impl]
        for impl in batch:
            if impl.error is None:
                check_after(impl)
            impl.timed(replays, calls_per_graph)
        batch.clear()
        fused_timing.release()

    local = None
    if spec.local is not None:
        local = Implementation(spec.local_name, "local", thunk=spec.local(shape, dtype, device))
        local.prepared = fused_timing.prepare(local.thunk, calls_per_graph, group)
    names = [(f"symmcoll:{n}", "symmcoll", n) for n in [*plan.algorithms(op, kernels_only=False), "auto"]]
    names += [(name, "baseline", make) for name, make in spec.baselines.items()]
    impls = [Implementation(name, family, what) for name, family, what in names
             if not algorithms or any(p == name or name.endswith(":" + p) for p in algorithms)]
    impls += [Implementation(f"symmcoll:{p}", "symmcoll", p.partition("@")[0]) for p in repeats(op, algorithms)]
    for impl in impls:
        check_and_capture(impl)
        if impl.error is None:
            batch.append(impl)
            if fused_timing.free_share(group) < fused_timing.MIN_FREE_SHARE:
                time_batch()
    if batch or (local is not None and not local.samples):
        time_batch()

    if local is not None:
        local.timed(replays, calls_per_graph)
        fused_timing.release()
    rows = []
    local_us, local_rounds = None, []
    for impl in ([local] if local else []) + impls:
        # (every rank timed, or every rank reports the error: the summaries are gathered only then)
        spread = None if impl.error else fused_timing.slowest_rank(impl.samples, group, impl.round_medians)
        us = spread["median_us"] if spread else None
        if impl is local:
            local_us, local_rounds = us, spread["round_median_us"] if spread else []
        rows.append(_row(op, impl.name, impl.family, shape, dtype_name, world, us, local_us, spec.flops(shape),
                         impl.err, impl.mode, impl.error, impl.nbytes, copy_gbps,
                         fused_timing.timing_details(impl, spread, local_rounds) if spread else None))
    return rows



def repeats(op: str, algorithms) -> list[str]:
    """The "<algorithm>@<label>" entries of ``algorithms`` (e.g. ``unfused@2``): that algorithm of ``op`` once
    more, with inputs, graph and memory of its own, a row "symmcoll:unfused@2" -- how far two captures of one
    code differ in one run (at ws 1 auto runs unfused's code and read -3..+2.3% against it, 2026-11-28)."""
    known = {*plan.algorithms(op, kernels_only=False), "auto"}
    found = []
    for entry in algorithms or ():
        base, at, label = entry.partition("@")
        if at:
            if base not in known or not label:
                raise ValueError(f"--algorithms {entry!r}: a repeat is <algorithm>@<label> with an algorithm of {op} "
                                 f"({', '.join(sorted(known))})")
            found.append(entry)
    return found


def _row(op, name, family, shape, dtype, world, us, local_us, flops, err, mode, error, nbytes=None,
         copy_gbps=None, method: dict | None = None) -> dict:
    gbps = nbytes / us / 1e3 if us and nbytes else None
    return {"op": op, "implementation": name, "family": family, "shape": list(shape), "dtype": dtype,
            "world_size": world, "median_us": us, "tflops": flops / us / 1e6 if us and flops else None,
            "x_cublas": us / local_us if us and local_us else None, "rel_err": err, "timing": mode, "error": error,
            "bytes": nbytes, "gbps": gbps, "pct_copy": 100 * gbps / copy_gbps if gbps and copy_gbps else None,
            **(method or {})}


# ---- driver ------------------------------------------------------------------------------------------

def run(op: str, shapes: list[tuple], world_sizes: tuple, dtype: str, algorithms, out_dir: Path, console,
        replays: int = 20, calls_per_graph: int = CALLS_PER_GRAPH, rounds: int | None = None) -> int:
    from ..launch import RankPool
    status = 0
    written = []
    spec = SPECS[op]
    repeats(op, algorithms)  # (an unknown "<algorithm>@<label>" fails here, before any rank starts)
    for world in world_sizes:
        rows, info, copy = [], None, None
        with RankPool(world, device="cuda") as pool:
            info = pool.run(provenance.collect, "cuda")[0]
            if spec.bytes is not None:  # the roofline: every rank's SM copy rate, the slowest one counts
                copy = min(r["best"] for r in pool.run(_copy_rates))
                console.print(f"ws{world}: SM copy rate {copy:.0f} GB/s (read + write)", highlight=False)
            for shape in shapes:
                t0 = time.monotonic()
                rows += pool.run(run_shape, op, tuple(shape), dtype, algorithms, replays, calls_per_graph, copy,
                                 rounds, timeout=600)[0]
                console.print(f"ws{world} {op} {shape}: {time.monotonic() - t0:.0f} s", highlight=False)
        console.print(_table(op, world, dtype, rows, spec))
        status |= int(any(r["family"] == "symmcoll" and r["error"] is not None for r in rows))
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{op}-ws{world}-{info.created_utc.replace(':', '')}.json"
        written.append(path)
        path.write_text(json.dumps({"schema": "symmcoll.bench.fused/1", "provenance": asdict(info),
                                    "op": op, "dtype": dtype, "world_size": world, "replays": replays,
                                    "calls_per_graph": calls_per_graph, "copy_gbps": copy,
                                    "rounds": rounds or f"planned: at least {ROUNDS}, a round within "
                                                        f"{ROUND_BUDGET_S} s of GPU time (bench/rounds.py)",
                                    "rows": rows}, indent=1))
        console.print(f"result written: {path}", highlight=False)
    return status


def _copy_rates() -> dict:
    return roofline.copy_gbps(torch.device("cuda", torch.cuda.current_device()))


def _table(op: str, world: int, dtype: str, rows: list[dict], spec: FusedSpec):
    """GEMM ops: time, TFLOP/s and x cuBLAS; memory-bound ops: time, GB/s, % of the copy rate, x local."""
    from rich.table import Table
    roof = spec.bytes is not None
    table = Table(title=f"{op}, world size {world}, {dtype}, CUDA-graph replays (us per call, slowest rank)")
    # The ratio column: the paired ratio (median of per-round ratios) where the row has one.
    paired = any(r.get("x_cublas_paired") is not None for r in rows)
    ratio = ("x local" if roof else "x cuBLAS") + (" (paired rounds)" if paired else "")
    columns = ("shape", "implementation", "us", "GB/s", "% copy", ratio, "rel err", "note") if roof else \
        ("M x N x K", "implementation", "us", "TFLOP/s", ratio, "rel err", "note")
    for column in columns:
        table.add_column(column)
    for r in rows:
        rate = ((f"{r['gbps']:.0f}" if r["gbps"] else "-", f"{r['pct_copy']:.0f}" if r["pct_copy"] else "-")
                if roof else (f"{r['tflops']:.0f}" if r["tflops"] else "-",))
        table.add_row("x".join(map(str, r["shape"])), r["implementation"][:36],
                      f"{r['median_us']:.1f}" if r["median_us"] else "-", *rate,
                      _fmt_ratio(r, paired),
                      f"{r['rel_err']:.1e}" if r["rel_err"] is not None else "-",
                      (r["error"] or r["timing"] or "")[:40 if roof else 60])
    return table


def _fmt_ratio(row: dict, paired: bool) -> str:
    """The row's ratio to cuBLAS for the table: paired where the table's column says so."""
    value = row.get("x_cublas_paired") if paired else row["x_cublas"]
    return f"{value:.3f}" if value else "-"
