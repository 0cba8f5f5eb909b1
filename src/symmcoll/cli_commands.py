"""What each ``symmcoll`` subcommand does: the bodies behind cli.py's parser.

cli.py holds the command line itself (``main``, the argument parser and its subcommand table, whose
``--help`` is the user's reference); this module holds what runs once the arguments are parsed:
``bench_command`` (collectives, fused ops, the decoder and compiled blocks, the GEMM core),
``plot_command``, ``accuracy_command``, ``info_command`` and ``tune_command`` (the dispatch table, the
GEMM tile table). They are apart so that either half reads on its own: options here are read from the
``argparse.Namespace`` by the names cli.py gives them. Heavy imports (torch, the benchmarks) happen
inside each command, so ``symmcoll --help`` stays quick.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from .bench.metrics import OPS

TP_BLOCK = "tp_block"   # the decoder block of symmcoll.models (bench/tp_block.py)
BACKEND_BLOCK = "backend_block"   # a DTensor model compiled with and without symmcoll.backend (bench/backend_block.py)
GEMM = "gemm"           # the GEMM core beside cuBLAS on one GPU (bench/gemm.py)


def _console() -> Console:
    # Logs of GPU jobs are files, where rich would assume 80 columns and fold the tables; the tables
    # are laid out to fit 120 (bench.report).
    return Console() if sys.stdout.isatty() else Console(width=120)


def _without_gpu(console: Console, message: str) -> bool:
    """True, after saying ``message`` (in yellow), where no GPU is visible: the GPU-only commands stop."""
    import torch

    if torch.cuda.is_available():
        return False
    console.print(f"[bold yellow]{message}[/]")
    return True


def bench_command(args: argparse.Namespace) -> int:
    from .bench.driver import BenchOptions, run_bench

    status = 0
    if GEMM in args.op:
        status = _bench_gemm(args)
        args.op = [op for op in args.op if op != GEMM]
        if not args.op:
            return status
    if TP_BLOCK in args.op:
        status = _bench_tp_block(args)
        args.op = [op for op in args.op if op != TP_BLOCK]
        if not args.op:
            return status
    if BACKEND_BLOCK in args.op:
        status = max(status, _bench_backend_block(args))
        args.op = [op for op in args.op if op != BACKEND_BLOCK]
        if not args.op:
            return status
    fused_ops = [op for op in dict.fromkeys(args.op) if op in fused_op_names()]
    if fused_ops:
        status = max(status, _bench_fused(args, fused_ops))
        if len(fused_ops) == len(set(args.op)):
            return status
    ops = OPS if "all" in args.op else tuple(op for op in dict.fromkeys(args.op) if op not in fused_ops)
    options = BenchOptions(
        ops=ops, begin=args.minbytes, end=args.maxbytes, factor=args.stepfactor, dtype=args.dtype,
        algorithms=tuple(_split(args.algorithms)) or None,
        world_sizes=tuple(int(w) for w in _split(args.world_size)) or None,
        mode=args.mode, iters=args.iters, warmup=args.warmup, calls_per_graph=args.calls_per_graph,
        seconds_per_case=args.seconds_per_case, out_dir=Path(args.out), plot=args.plot, device=args.device,
        link_bytes=args.link_bytes, time_limit_s=args.time_limit)
    return max(status, run_bench(options, _console()))


def fused_op_names() -> tuple[str, ...]:
    """The fused ops the benchmark knows (bench/fused.py SPECS): bench and tune sweep them by shape."""
    from .bench.fused import SPECS
    return tuple(SPECS)


def _bench_fused(args: argparse.Namespace, ops: list[str]) -> int:
    """Fused ops are swept by shape (--shapes MxNxK,...), on GPUs only."""
    import torch

    from .bench import fused

    console = _console()
    if _without_gpu(console, f"{', '.join(ops)}: fused-op benchmarks need GPUs; skipped on this machine "
                             f"(the CPU tests check their results)"):
        return 0
    worlds = tuple(int(w) for w in _split(args.world_size)) or (torch.cuda.device_count(),)
    status = 0
    for op in ops:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in _split(args.shapes)] or \
            list(fused.SPECS[op].shapes)
        status = max(status, fused.run(op, shapes, worlds, args.dtype, tuple(_split(args.algorithms)) or None,
                                       Path(args.out), console, replays=args.iters or 20,
                                       calls_per_graph=args.calls_per_graph, rounds=_rounds(args)))
    return status


def _gemm_ms(args) -> tuple[int, ...]:
    from .bench.gemm import GRID_M
    return tuple(int(m) for m in _split(args.m)) or GRID_M


def _bench_gemm(args: argparse.Namespace) -> int:
    """The GEMM core against cuBLAS over the serving grid (--shapes: shape-name prefixes, --m: M values)."""
    console = _console()
    if _without_gpu(console, f"{GEMM}: the GEMM benchmark needs a GPU; skipped on this machine "
                             f"(tests/test_gemm.py checks the kernels on CPU)"):
        return 0
    from .bench import gemm

    dtype = args.dtype if args.dtype in gemm.DTYPES else "bf16"
    energy_ms = tuple(int(m) for m in _split(args.energy_m)) or gemm.gemm_energy.ENERGY_WINDOW_M
    path = gemm.run_bench(dtype, _gemm_ms(args), _split(args.shapes) or None, args.iters or 10, Path(args.out),
                          console, cublas_kernels=not args.no_cublas_kernels, energy_window_s=args.energy_window_s,
                          energy_ms=energy_ms)
    if args.plot:
        from .bench.plot import plot_gemm
        console.print(f"plot written: {plot_gemm(path)}", highlight=False)
    return 0


def _bench_tp_block(args: argparse.Namespace) -> int:
    """The decoder block of symmcoll.models in every mode (--algorithms: modes; --shapes: case names)."""
    import torch

    console = _console()
    if _without_gpu(console, f"{TP_BLOCK}: the decoder-block benchmark needs GPUs; skipped on this machine "
                             f"(tests/test_tp_block.py checks the block on CPU)"):
        return 0
    from .bench import tp_block
    from .models import MODES

    wanted = _split(args.shapes)
    cases = [c for c in tp_block.case_names() if not wanted or any(c.startswith(w) for w in wanted)]
    cases += [w for w in wanted if w not in cases and not any(c.startswith(w) for c in tp_block.case_names())]
    for case in cases:
        tp_block.parse_case(case)   # a typo fails here, before any GPU work
    modes = tuple(_split(args.algorithms)) or MODES
    if set(modes) - set(MODES):
        console.print(f"[bold red]{TP_BLOCK}: --algorithms takes modes {', '.join(MODES)}[/]")
        return 2
    worlds = tuple(int(w) for w in _split(args.world_size)) or (torch.cuda.device_count(),)
    return tp_block.run(worlds, cases, modes, args.dtype, args.iters or 20, Path(args.out), console,
                        rounds=_rounds(args))


def _rounds(args: argparse.Namespace) -> int | None:
    """--rounds, or None: the benches plan the rounds per shape (bench/rounds.py plan_rounds)."""
    if args.rounds is not None and args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    return args.rounds


def _bench_backend_block(args: argparse.Namespace) -> int:
    """The torchtitan-style DTensor block compiled plainly and with symmcoll.backend (--algorithms: modes
    inductor, symmcoll; --shapes: case-name prefixes; --time-limit: start no case after that; --profile:
    each timed mode profiled too)."""
    import torch

    console = _console()
    if _without_gpu(console, f"{BACKEND_BLOCK}: the compiled-block benchmark needs GPUs; skipped on this machine "
                             f"(tests/test_backend_block.py checks it on CPU, untimed)"):
        return 0
    from .bench import backend_block

    cases = backend_block.select_cases(_split(args.shapes))   # a typo fails here, before any GPU work
    modes = tuple(_split(args.algorithms)) or backend_block.MODES
    if set(modes) - set(backend_block.MODES):
        console.print(f"[bold red]{BACKEND_BLOCK}: --algorithms takes modes {', '.join(backend_block.MODES)}[/]")
        return 2
    worlds = tuple(int(w) for w in _split(args.world_size)) or (torch.cuda.device_count(),)
    return backend_block.run(worlds, cases, modes, args.iters or 20, Path(args.out), console, args.time_limit,
                             setup=backend_block.Setup(profile=args.profile))


def plot_command(args: argparse.Namespace) -> int:
    from .bench.plot import plot_files

    console = _console()
    for path in plot_files(args.results, args.out):
        console.print(f"plot written: {path}", highlight=False)
    return 0


def accuracy_command(args: argparse.Namespace) -> int:
    import json

    from .bench import accuracy

    console = _console()
    world_sizes = tuple(int(w) for w in _split(args.world_size)) or (2,)
    for path in accuracy.run(world_sizes, args.numel, args.dtype, Path(args.out), args.device):
        console.print(accuracy.format_table(json.loads(path.read_text())), highlight=False)
        console.print(f"result written: {path}", highlight=False)
    return 0


def info_command(args: argparse.Namespace) -> int:
    import torch
    import triton

    import symmcoll
    from .bench.provenance import nccl_version

    console = _console()
    console.print(f"symmcoll {symmcoll.__version__}, torch {torch.__version__}, triton {triton.__version__}, "
                  f"NCCL {nccl_version() or 'n/a'}", highlight=False)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    devices = [torch.cuda.get_device_name(i) for i in range(count)]
    console.print(f"GPUs: {count} {devices}" if count else "GPUs: none (CPU mode: Triton interpreter)",
                  highlight=False)
    for op, algorithms in symmcoll.ALGORITHMS.items():
        console.print(f"{op}: {', '.join(algorithms)} (and nccl: the process group's own)", highlight=False)
    from .comm import quantized
    console.print(f"all_reduce(x, quantize=int8|fp8|int4, group_size={'|'.join(map(str, quantized.GROUP_SIZES))}): "
                  f"{', '.join(symmcoll.ALGORITHMS[quantized.OP])}; the exact path below "
                  f"{quantized.min_bytes('cuda')} bytes on GPU", highlight=False)
    _print_dispatch(console)
    return 0


def _this_gpu():
    """The device whose dispatch table calls here would read (None without a GPU: the H200 table)."""
    import torch
    return torch.device("cuda") if torch.cuda.is_available() else None


def _print_dispatch(console: Console) -> None:
    from rich.table import Table as RichTable

    from . import dispatch
    from .bench.sizes import format_size

    table = dispatch.active_table(_this_gpu())
    view = RichTable(title=f"algorithm='auto' dispatch table: {table.source}", title_justify="left")
    for column in ("op", "world size", "dtype", "up to", "algorithm"):
        view.add_column(column)
    for r in sorted(table.rules, key=lambda r: (r.op, r.world_size, r.dtype, r.max_bytes)):
        view.add_row(r.op, str(r.world_size), r.dtype, format_size(r.max_bytes), r.algorithm)
    console.print(view)
    console.print("past the last size of a case its last rule holds; unknown world sizes use the nearest",
                  highlight=False)


def tune_command(args: argparse.Namespace) -> int:
    """Benchmark symmcoll's algorithms and the backend here; write the dispatch table they imply."""
    import tempfile

    from . import dispatch
    from .bench import results
    from .bench.driver import BenchOptions, run_bench

    console = _console()
    requested = tuple(_split(args.op)) or OPS
    if GEMM in requested:
        status = _tune_gemm(args, console)
        requested = tuple(op for op in requested if op != GEMM)
        if not requested:
            return status
    fused_ops = tuple(op for op in requested if op in fused_op_names())
    ops = tuple(op for op in requested if op not in fused_ops)
    fused_rules, status = _tune_fused(args, fused_ops, console) if fused_ops else ((), 0)
    if not ops:
        return _write_table(args, console, dispatch.Table(tuple(fused_rules), "symmcoll tune (fused ops)"),
                            fused_ops) or status
    with tempfile.TemporaryDirectory() as tmp:
        options = BenchOptions(
            ops=ops, begin=args.minbytes, end=args.maxbytes, factor=None, dtype=args.dtype,
            algorithms=("symmcoll:*", "nccl", "gloo"),
            world_sizes=tuple(int(w) for w in _split(args.world_size)) or None,
            mode=None, iters=None, warmup=None, calls_per_graph=20, seconds_per_case=None,
            out_dir=Path(tmp), plot=False, device=args.device, link_bytes=16 << 20)
        status = max(status, run_bench(options, console))
        found = [results.load(p) for p in sorted(Path(tmp).glob("*.json"))]
    if not found:
        console.print("[bold red]tune: no results, nothing written[/]")
        return 1
    prov = found[0].provenance
    table = dispatch.table_from_results(
        found, f"symmcoll tune, {prov.created_utc}, {prov.gpu_name or prov.device_type} x{prov.gpu_count}, "
               f"{args.dtype}, git {prov.git_sha}")
    table = dispatch.Table(table.rules + tuple(fused_rules), table.source)
    return max(status, _write_table(args, console, table, requested))


def _tune_gemm(args, console) -> int:
    """The GEMM core's tile table for this GPU model (written to --out if it names a .json file, else
    to the package's data/gemm_<gpu>.json)."""
    if _without_gpu(console, f"tune: {GEMM} needs a GPU; not tuned here"):
        return 0
    from .bench import gemm_tune

    out = Path(args.out) if str(args.out).endswith(".json") and "dispatch" not in Path(args.out).name else None
    dtype = args.dtype if args.dtype in gemm_tune.DTYPES else "bf16"
    ms = {int(m) for m in _split(args.m)} or None
    cells = gemm_tune.cells_above(Path(args.cells_from), args.above, ms) if args.cells_from else None
    from .bench.timing import frozen_heap
    with frozen_heap():  # (each candidate's graph capture collects garbage first: ~0.1 s a full pass)
        gemm_tune.tune(dtype, _gemm_ms(args), _split(args.shapes) or None, args.iters or 10, out, console,
                       base=Path(args.base) if args.base else None, cells=cells, budget_s=args.budget_s)
    return 0


def _write_table(args, console, table, measured_ops) -> int:
    """Write ``table``; ops not measured now keep the rules of the table in use."""
    from . import dispatch
    in_use = dispatch.active_table(_this_gpu())
    kept = tuple(r for r in in_use.rules if r.op not in measured_ops)
    table = dispatch.Table(kept + table.rules, table.source + (
        f"; {', '.join(sorted({r.op for r in kept}))} from {in_use.source}" if kept else ""))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table.to_json() + "\n")
    console.print(f"dispatch table written: {out} ({len(table.rules)} rules)", highlight=False)
    return 0


def _tune_fused(args, ops, console):
    """Fused ops: the fused benchmark at their default shapes; rules keyed by M * N * K."""
    import json
    import tempfile

    import torch

    from . import dispatch
    from .bench import fused
    if _without_gpu(console, f"tune: {', '.join(ops)} need GPUs; not tuned here"):
        return (), 0
    worlds = tuple(int(w) for w in _split(args.world_size)) or (torch.cuda.device_count(),)
    rows, status = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for op in ops:
            status = max(status, fused.run(op, list(fused.SPECS[op].shapes), worlds, args.dtype, None, Path(tmp),
                                           console))
        for path in Path(tmp).glob("*.json"):
            rows += json.loads(path.read_text())["rows"]
    return dispatch.rules_from_fused_rows(rows), status


def _split(values: list[str] | None) -> list[str]:
    """Repeated and comma-separated values alike: ['a,b', 'c'] -> ['a', 'b', 'c']."""
    return [v for value in values or [] for v in value.split(",") if v]

