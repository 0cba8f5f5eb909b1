"""``symmcoll bench`` from the parent's side: resolve defaults for the machine, start the ranks (or join
torchrun's), sweep op x size x implementation with a progress bar, then print, write and plot.

Ranks are started with ``symmcoll.launch.RankPool`` (one process per GPU; on a machine without GPUs,
processes + gloo + the Triton interpreter at small sizes). Under torchrun (RANK and WORLD_SIZE set) the
sweep runs in-process on every rank and only rank 0 prints and writes. Either way the sweep is the same
loop over ``worker.run_case``, each case collective and answered identically on every rank.
"""

from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..launch import LaunchTimeout, RankError, RankPool, default_device_type
from . import results as results_io
from . import worker
from .metrics import OPS, count_for, link_percent
from .plan import Case, TimingPlan
from .report import print_report
from .results import QUANTIZED, SCHEMA, BenchResult, LinkLimit, Measurement, RunConfig
from .sizes import format_size, size_sweep

ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}

CPU_NOTICE = ("CPU mode: kernels run under the Triton interpreter over emulated symmetric memory and "
              "the baseline is gloo; these times check that the benchmark works and are NOT performance.")


@dataclass(frozen=True)
class MachineDefaults:
    """What ``symmcoll bench`` does on a machine when not told otherwise."""

    begin: int
    end: int
    factor: float
    warmup: int
    iters: int
    eager_iters: int
    seconds_per_case: float


DEFAULTS = {
    # Small and few: every op and algorithm in well under a minute on two cores.
    "cpu": MachineDefaults(begin=1 << 10, end=64 << 10, factor=4, warmup=1, iters=3, eager_iters=3,
                           seconds_per_case=60),
    # 50 replays of 20 calls, or what fits in half a second: 4K..256M of every op at two world sizes
    # stays within a few minutes.
    "cuda": MachineDefaults(begin=4 << 10, end=256 << 20, factor=2, warmup=3, iters=50, eager_iters=200,
                            seconds_per_case=0.5),
}


@dataclass(frozen=True)
class BenchOptions:
    """The command line of ``symmcoll bench``; ``None`` means "the machine's default"."""

    ops: tuple[str, ...]
    begin: int | None
    end: int | None
    factor: float | None
    dtype: str
    algorithms: tuple[str, ...] | None
    world_sizes: tuple[int, ...] | None
    mode: str | None            # "graph" | "eager" | None (graph on GPU; always "cpu" on CPU)
    iters: int | None
    warmup: int | None
    calls_per_graph: int
    seconds_per_case: float | None
    out_dir: Path
    plot: bool
    device: str                 # "auto" | "cpu" | "cuda"
    link_bytes: int
    time_limit_s: float | None = None  # start no case past this many seconds of the run (all world sizes)


@dataclass(frozen=True)
class Runner:
    """Runs a worker function on every rank; returns rank 0's answer."""

    call: Callable
    world_size: int
    device_type: str
    launcher: str               # "pool" | "torchrun"
    is_writer: bool             # prints and writes files (rank 0 / the parent)


def timing_plan(options: BenchOptions, device_type: str) -> TimingPlan:
    d = DEFAULTS[device_type]
    mode = "cpu" if device_type == "cpu" else (options.mode or "graph")
    default_iters = d.eager_iters if mode == "eager" else d.iters
    iters = options.iters if options.iters is not None else default_iters
    return TimingPlan(mode=mode, warmup=options.warmup if options.warmup is not None else d.warmup,
                      iters=iters, min_iters=min(iters, 5), calls_per_graph=options.calls_per_graph,
                      seconds_per_case=options.seconds_per_case or d.seconds_per_case)


def sweep_sizes(options: BenchOptions, device_type: str) -> list[int]:
    d = DEFAULTS[device_type]
    return size_sweep(options.begin or d.begin, options.end or d.end, options.factor or d.factor)


def selected(name: str, patterns: tuple[str, ...] | None) -> bool:
    """``--algorithms`` filter: a full name ("symmcoll:one_shot", "nccl"), a glob ("torch:*"), or the
    part after the colon ("one_shot" selects every one_shot)."""
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(name, p) or name.split(":")[-1] == p for p in patterns)


def run_bench(options: BenchOptions, console: Console) -> int:
    """Run the benchmark; returns the exit status (1 if a symmcoll implementation failed or was wrong,
    or the run was cut short)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import torch.distributed as dist
        started_here = not dist.is_initialized()
        runner = _torchrun_runner(options, console)
        if runner is not None:
            try:
                return _finish([_sweep(runner, options, console, _deadline(options))], options, console,
                               runner.is_writer)
            finally:
                if started_here:
                    dist.destroy_process_group()
    device_type = default_device_type() if options.device == "auto" else options.device
    if device_type == "cuda":
        import torch
        world_sizes = options.world_sizes or (torch.cuda.device_count(),)
    else:
        world_sizes = options.world_sizes or (2,)
    done, could_not_start = [], False
    deadline = _deadline(options)
    for world_size in world_sizes:
        if deadline is not None and _clock() >= deadline:
            console.print(f"[bold yellow]world size {world_size}: not run (--time-limit {options.time_limit_s:g} s "
                          f"spent)[/]")
            continue
        try:
            with RankPool(world_size, device=device_type) as pool:
                runner = Runner(partial(_rank0_answer, pool), world_size, device_type, "pool", True)
                done.append(_sweep(runner, options, console, deadline))
        except (RankError, LaunchTimeout, ValueError) as exc:  # ranks did not start: try the next size
            console.print(f"[bold red]world size {world_size}: {exc}[/]")
            could_not_start = True
    return max(_finish(done, options, console, True), int(could_not_start))


def _clock() -> float:
    return time.monotonic()


def _deadline(options: BenchOptions) -> float | None:
    """The monotonic time past which no case starts (``--time-limit``), or None."""
    return None if options.time_limit_s is None else _clock() + options.time_limit_s


def _rank0_answer(pool: RankPool, fn: Callable, *args):
    # A case is seconds at most; ten minutes means a rank hangs, and the pool then names it.
    return pool.run(fn, *args, timeout=600)[0]


def _torchrun_runner(options: BenchOptions, console: Console) -> Runner | None:
    """A runner over torchrun's ranks (RANK and WORLD_SIZE are set); None if torch.distributed cannot
    start from that environment."""
    import torch
    import torch.distributed as dist

    from ..memory.cuda import disable_multicast_env
    disable_multicast_env()
    on_gpu = options.device != "cpu" and torch.cuda.is_available()
    if not dist.is_initialized():
        try:
            if on_gpu:
                local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
                torch.cuda.set_device(local)
                dist.init_process_group("nccl", device_id=local)
            else:
                dist.init_process_group("gloo")
        except Exception as exc:  # noqa: BLE001 - not a usable torchrun environment: launch our own
            console.print(f"note: RANK/WORLD_SIZE set but torch.distributed could not start ({exc}); "
                          f"starting ranks with symmcoll.launch instead")
            return None
    world = dist.get_world_size()
    if options.world_sizes and options.world_sizes != (world,):
        raise SystemExit(f"--world-size {options.world_sizes} contradicts torchrun's WORLD_SIZE={world}")
    if not on_gpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("CPU ranks under torchrun need TRITON_INTERPRET=1 set before Python starts")
    return Runner(lambda fn, *args: fn(*args), world, "cuda" if on_gpu else "cpu", "torchrun",
                  dist.get_rank() == 0)


def _sweep(runner: Runner, options: BenchOptions, console: Console, deadline: float | None = None) -> BenchResult:
    """One world size: the link limit, then every case in order (op, size, implementation), each on
    every rank. Past ``deadline`` no case starts: the result holds the cases done and a note saying
    how many were left (a run under ``timeout`` still prints and writes what it measured)."""
    plan = timing_plan(options, runner.device_type)
    sizes = sweep_sizes(options, runner.device_type)
    out = console if runner.is_writer else Console(quiet=True)
    if runner.device_type == "cpu":
        out.print(f"[bold yellow]{CPU_NOTICE}[/]")
    info: worker.RankInfo = runner.call(worker.describe, options.ops)
    notes = [CPU_NOTICE] if runner.device_type == "cpu" else []
    notes += list(info.notes)
    for note in info.notes:
        out.print(f"note: {note}", highlight=False)
    cases, skipped = _cases(info, options, plan, sizes, runner.world_size)
    notes += skipped
    for note in skipped:
        if note.startswith("--algorithms"):
            out.print(f"[bold yellow]note: {note}[/]", highlight=False)
    link, measurements = None, []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=out, disable=not runner.is_writer) as progress:
        task = progress.add_task(f"ws{runner.world_size} link", total=len(cases) + 1)
        try:
            link = runner.call(worker.measure_link, options.link_bytes)
            progress.advance(task)
            for index, case in enumerate(cases):
                if deadline is not None and _clock() >= deadline:
                    note = (f"cut by --time-limit {options.time_limit_s:g} s: {index} of {len(cases)} cases run, "
                            f"the first left out {case.op} {format_size(case.size_bytes)} {case.implementation}")
                    notes.append(note)
                    out.print(f"[bold yellow]{note}[/]", highlight=False)
                    break
                progress.update(task, description=f"ws{runner.world_size} {case.op} "
                                                  f"{format_size(case.size_bytes)} {case.implementation}")
                measurements.append(runner.call(worker.run_case, case))
                progress.advance(task)
        except (RankError, LaunchTimeout) as exc:
            notes.append(f"run aborted: {exc}")
            out.print(f"[bold red]run aborted (partial results follow): {exc}[/]")
    config = RunConfig(ops=tuple(options.ops), sizes=tuple(sizes), dtype=options.dtype,
                       world_size=runner.world_size, plan=plan, algorithms=options.algorithms,
                       launcher=runner.launcher)
    return BenchResult(SCHEMA, info.provenance, config, link, tuple(_with_link(measurements, link)),
                       tuple(notes))


def _cases(info: worker.RankInfo, options: BenchOptions, plan: TimingPlan, sizes: list[int],
           world: int) -> tuple[list[Case], list[str]]:
    cases, notes = [], []
    for op in options.ops:
        names = [name for name, family in info.implementations.get(op, ())
                 if selected(name, options.algorithms) and _wanted(family, options.algorithms)]
        if op in info.implementations and not names:
            notes.append(f"{op}: no implementation matches --algorithms {' '.join(options.algorithms or ())}")
        for size in sizes:
            count = count_for(op, size, ITEMSIZE[options.dtype], world)
            if count == 0:
                notes.append(f"{op}: size {format_size(size)} holds no whole element per rank; skipped")
                continue
            cases += [Case(op, name, size, count, options.dtype, plan) for name in names]
    # A pattern that selects nothing is a typo or a quoting slip ("a b" as one word): say so instead of
    # timing fewer implementations than asked for.
    known = [name for op in options.ops for name, _ in info.implementations.get(op, ())]
    for pattern in options.algorithms or ():
        if not any(selected(name, (pattern,)) for name in known):
            notes.append(f"--algorithms {pattern!r} matches no implementation of {' '.join(options.ops)}: ignored "
                         f"(several names are separate words or comma-separated)")
    return cases, notes


# Families that run only when a pattern asks for them by a word of their names: the lossy implementations
# ("quantized_int8", "symmcoll:quantized_*") and torch's ops timed with the copy-in ("torch:*_copy_in").
ASKED_FOR = {QUANTIZED: "quantized", "torch_copy_in": "copy_in"}


def _wanted(family: str, patterns: tuple[str, ...] | None) -> bool:
    """Whether ``family`` runs under ``patterns``: ASKED_FOR's families never as part of "everything",
    "symmcoll:*" or "torch:*"."""
    word = ASKED_FOR.get(family)
    return word is None or any(word in p for p in patterns or ())


def _with_link(measurements: list[Measurement], link: LinkLimit | None) -> list[Measurement]:
    bound = link.bound_gbps if link is not None else None
    if not bound:
        return measurements
    return [replace(m, link_percent=link_percent(m.busbw_gbps, bound)) if m.busbw_gbps else m
            for m in measurements]


def _finish(done: list[BenchResult], options: BenchOptions, console: Console, is_writer: bool) -> int:
    written = []
    for result in done:
        if is_writer:
            print_report(result, console)
            path = _unused(options.out_dir / results_io.default_filename(result))
            written.append(results_io.write(result, path))
            console.print(f"result written: {path}", highlight=False)
    if options.plot and written:
        from .plot import plot_files
        for png in plot_files(written, options.out_dir):
            console.print(f"plot written: {png}", highlight=False)
    return 1 if any(failed(r) for r in done) else 0


def failed(result: BenchResult) -> bool:
    """A run that ``symmcoll bench`` reports as failed (exit status 1): aborted, or a symmcoll row with an
    error or wrong elements."""
    aborted = any(n.startswith("run aborted") for n in result.notes)
    # symmcoll's own rows (quantized ones and the fallback "symmcoll:nccl", labelled as the backend in the
    # tables, included)
    return aborted or any((m.implementation.startswith("symmcoll:") or m.family == QUANTIZED)
                          and (m.error is not None or (m.wrong or 0) > 0)
                          for m in result.measurements)


def _unused(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        candidate, n = path.with_name(f"{path.stem}-{n}{path.suffix}"), n + 1
    return candidate


__all__ = ["BenchOptions", "DEFAULTS", "OPS", "run_bench", "selected", "sweep_sizes", "timing_plan"]
