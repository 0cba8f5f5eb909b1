"""The ``symmcoll`` command (also ``python -m symmcoll``).

    symmcoll bench [--op all_reduce|reduce_scatter|all_gather|all_to_all|all] [-b 4K -e 256M -f 2]
                   [--dtype bf16] [--algorithms NAME ...] [--world-size N[,N...]] [--graph | --eager]
                   [-n ITERS] [-w WARMUP] [--out DIR] [--plot]
    symmcoll bench --op tp_block [--world-size 2,4] [--shapes decode prefill:1x2048 ...] [--algorithms MODE ...]
    symmcoll bench --op backend_block [--world-size N] [--shapes decode prefill:4x4096:tp_sp ...] [--time-limit S]
    symmcoll plot RESULT.json [RESULT.json ...] [--out DIR]
    symmcoll accuracy [--world-size N[,N...]] [--numel N] [--dtype bf16] [--out DIR]
    symmcoll bench --op gemm [--shapes 70b-tp8 ...] [--m 1 16 ...] [--dtype bf16|fp16]
    symmcoll tune [--world-size N...] [--out FILE]
    symmcoll tune --op gemm [--shapes ...] [--m ...] [--out gemm_h200.json]
    symmcoll info
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from .bench.metrics import OPS
from .bench.plan import DTYPES
from .bench.sizes import parse_size

TP_BLOCK = "tp_block"   # the decoder block of symmcoll.models (bench/tp_block.py)
BACKEND_BLOCK = "backend_block"   # a DTensor model compiled with and without symmcoll.backend (bench/backend_block.py)
GEMM = "gemm"           # the GEMM core beside cuBLAS on one GPU (bench/gemm.py)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    return args.handler(args)


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


def _bench(args: argparse.Namespace) -> int:
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
    fused_ops = [op for op in dict.fromkeys(args.op) if op in _fused_ops()]
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


def _fused_ops() -> tuple[str, ...]:
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
    path = gemm.run_bench(dtype, _gemm_ms(args), _split(args.shapes) or None, args.iters or 10, Path(args.out),
                          console, cublas_kernels=not args.no_cublas_kernels)
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
    inductor, symmcoll; --shapes: case-name prefixes; --time-limit: start no case after that)."""
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
    return backend_block.run(worlds, cases, modes, args.iters or 20, Path(args.out), console, args.time_limit)


def _plot(args: argparse.Namespace) -> int:
    from .bench.plot import plot_files

    console = _console()
    for path in plot_files(args.results, args.out):
        console.print(f"plot written: {path}", highlight=False)
    return 0


def _accuracy(args: argparse.Namespace) -> int:
    import json

    from .bench import accuracy

    console = _console()
    world_sizes = tuple(int(w) for w in _split(args.world_size)) or (2,)
    for path in accuracy.run(world_sizes, args.numel, args.dtype, Path(args.out), args.device):
        console.print(accuracy.format_table(json.loads(path.read_text())), highlight=False)
        console.print(f"result written: {path}", highlight=False)
    return 0


def _info(args: argparse.Namespace) -> int:
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


def _tune(args: argparse.Namespace) -> int:
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
    fused_ops = tuple(op for op in requested if op in _fused_ops())
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


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="symmcoll", description="symmcoll command-line tools")
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands")

    bench = commands.add_parser(
        "bench", help="benchmark every implementation beside NCCL and torch symm_mem ops",
        description="Sweep sizes for each op and implementation; print nccl-tests tables, a comparison "
                    "and the link limit; write one JSON result per world size. Without GPUs it runs in "
                    "CPU mode at small sizes (not performance). Defaults: GPU: world size = visible GPUs, "
                    "-b 4K -e 256M -f 2, graph mode; CPU: world size 2, -b 1K -e 64K -f 4.")
    bench.set_defaults(command="bench", handler=_bench)
    bench.add_argument("--shapes", nargs="+", default=None, metavar="MxNxK",
                       help="fused ops: shapes to measure (default: the op's list); tp_block, backend_block: "
                            "cases whose name starts with one of these (decode, decode:8, prefill:4x4096:compile, "
                            "prefill:4x4096:tp_sp, ...)")
    bench.add_argument("--op", nargs="+", default=["all"], choices=[*OPS, *_fused_ops(), TP_BLOCK, BACKEND_BLOCK, GEMM, "all"],
                       metavar="OP",
                       help=f"collectives: {', '.join(OPS)} or all (default: all); fused ops (GPU, by shape): "
                            f"{', '.join(_fused_ops())}; {TP_BLOCK}: a tensor-parallel decoder block, decode "
                            f"and prefill, in modes nccl, torch_async_tp and symmcoll (GPU; --algorithms "
                            f"picks modes); {BACKEND_BLOCK}: a torchtitan-style DTensor block compiled with "
                            f"torch.compile and with symmcoll.backend, decode and prefill (GPU); {GEMM}: the GEMM core beside cuBLAS on one GPU over the serving "
                            f"grid (--shapes: layer-name prefixes such as 70b-tp8, --m: M values)")
    bench.add_argument("--m", nargs="+", default=None, metavar="M", help=f"{GEMM}: M values (default: the grid)")
    bench.add_argument("-b", "--minbytes", type=_size, default=None, help="smallest size (4K, 1M, ...)")
    bench.add_argument("-e", "--maxbytes", type=_size, default=None, help="largest size")
    bench.add_argument("-f", "--stepfactor", type=float, default=None,
                       help="size multiplier (default: 2 on GPU, 4 on CPU)")
    bench.add_argument("--dtype", choices=DTYPES, default="bf16")
    bench.add_argument("--algorithms", nargs="+", default=None, metavar="NAME",
                       help="only these implementations: full names (symmcoll:one_shot, nccl, "
                            "torch:two_shot), globs (torch:*) or the part after ':' (one_shot)")
    bench.add_argument("--world-size", nargs="+", default=None, metavar="N",
                       help="ranks; several (4,2) run one after the other, one result file each")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--graph", dest="mode", action="store_const", const="graph",
                      help="time CUDA-graph replays (default on GPU)")
    mode.add_argument("--eager", dest="mode", action="store_const", const="eager", help="time eager calls")
    bench.set_defaults(mode=None)
    bench.add_argument("-n", "--iters", type=int, default=None,
                       help="timed samples: graph replays or eager calls (GPU default 50 / 200; CPU 3)")
    bench.add_argument("-w", "--warmup", type=int, default=None, help="untimed samples first")
    bench.add_argument("--calls-per-graph", type=int, default=20,
                       help="calls captured per CUDA graph, collectives and fused ops alike (a fused-op call "
                            "slower than 0.5 ms gets fewer: bench/timing.graph_calls)")
    bench.add_argument("--rounds", type=int, default=None,
                       help=f"fused ops and {TP_BLOCK}: interleaved timing rounds (every implementation in turn, "
                            "the order rotated, the samples split over the rounds; default: planned per shape, at least "
                            "3, more and shorter where a round of all of them would pass 0.15 s of GPU time)")
    bench.add_argument("--seconds-per-case", type=float, default=None,
                       help="time budget for one case's timed samples (GPU default 0.5; min 5 samples)")
    bench.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                       help="collectives, backend_block: start no case after this many seconds (all world sizes "
                            "together); what ran is printed and written, with a note naming what was left out")
    bench.add_argument("--out", default="bench-results",
                       help="directory for result files (default ./bench-results)")
    bench.add_argument("--plot", action="store_true", help="also draw PNGs from the result files")
    bench.add_argument("--no-cublas-kernels", action="store_true",
                       help=f"{GEMM}: do not record which cuBLAS kernels each cell runs (a profiling process "
                            f"beside the compile)")
    bench.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    bench.add_argument("--link-bytes", type=_size, default=256 << 20,
                       help="bytes per rank for the link measurement (default 256M)")

    plot = commands.add_parser("plot", help="draw PNGs (latency and busbw vs size) from result files")
    plot.set_defaults(command="plot", handler=_plot)
    plot.add_argument("results", nargs="+", help="result JSON files")
    plot.add_argument("--out", default=None, help="directory for PNGs (default: beside the first result)")

    accuracy = commands.add_parser(
        "accuracy", help="errors of the quantized all-reduce (every format and group size) and of the exact "
                         "path against an fp64 sum, on Gaussian, outlier and tensor-parallel MLP data",
        description="Runs symmcoll.all_reduce(x, quantize=...) for int8, fp8, int4 and G = 32, 64, 128 on "
                    "three kinds of data and writes relative and max errors (and elements outside the "
                    "documented bound) to one JSON file per world size.")
    accuracy.set_defaults(command="accuracy", handler=_accuracy)
    accuracy.add_argument("--world-size", nargs="+", default=None, metavar="N", help="ranks (default 2)")
    accuracy.add_argument("--numel", type=int, default=1 << 16,
                          help="elements per rank, a multiple of 1024 (default 65536)")
    accuracy.add_argument("--dtype", choices=DTYPES, default="bf16")
    accuracy.add_argument("--out", default="bench-results", help="directory for the result files")
    accuracy.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")

    tune = commands.add_parser(
        "tune", help="measure every algorithm here and write the algorithm='auto' dispatch table",
        description="Benchmark symmcoll's algorithms and the backend's collective on this machine "
                    "(same timing as bench) and write the fastest correct choice per (op, world size, "
                    "dtype, size) to a table that algorithm='auto' then uses.")
    tune.set_defaults(command="tune", handler=_tune)
    tune.add_argument("-b", "--minbytes", type=_size, default=None)
    tune.add_argument("-e", "--maxbytes", type=_size, default=None)
    tune.add_argument("--op", nargs="+", default=None, metavar="OP",  # collectives and fused ops
                      help=f"ops to measure: {', '.join(OPS)}, or fused ops ({', '.join(_fused_ops())}, GPU, by "
                           f"shape) (default: the collectives); the others keep "
                           f"the rules of the table in use; {GEMM}: the GEMM core's tile table for this GPU "
                           f"(written to --out FILE.json, default the package's data/gemm_<gpu>.json)")
    tune.add_argument("--dtype", choices=DTYPES, default="bf16")
    tune.add_argument("--shapes", nargs="+", default=None, help=f"{GEMM}: layer-name prefixes (default: all)")
    tune.add_argument("--m", nargs="+", default=None, metavar="M",
                      help=f"{GEMM}: M values (default: the grid; with --cells-from: only its cells of these M)")
    tune.add_argument("-n", "--iters", type=int, default=None, help=f"{GEMM}: graph replays per candidate")
    tune.add_argument("--base", default=None, help=f"{GEMM}: an earlier table whose cells this run does not measure "
                                                   f"are kept")
    tune.add_argument("--cells-from", default=None, metavar="RESULT.json",
                      help=f"{GEMM}: tune only the cells of this bench result slower than --above x cuBLAS, worst "
                           f"first (instead of --shapes x --m)")
    tune.add_argument("--above", type=float, default=1.05, help=f"{GEMM}: with --cells-from (default 1.05)")
    tune.add_argument("--budget-s", type=float, default=None,
                      help=f"{GEMM}: start no cell past this many seconds (the table keeps what was measured)")
    tune.add_argument("--world-size", nargs="+", default=None, metavar="N")
    tune.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    from .dispatch import USER_TABLE
    tune.add_argument("--out", default=str(USER_TABLE), help=f"table file (default {USER_TABLE})")

    info = commands.add_parser("info", help="versions, devices, algorithms, the dispatch table in use")
    info.set_defaults(command="info", handler=_info)
    return parser


if __name__ == "__main__":
    sys.exit(main())
