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

The parser and its subcommand table live here (what ``symmcoll --help`` shows); what each subcommand
does lives in cli_commands.py.
"""

from __future__ import annotations

import argparse
import sys

from .bench.metrics import OPS
from .bench.plan import DTYPES
from .bench.sizes import parse_size
from .cli_commands import (BACKEND_BLOCK, GEMM, TP_BLOCK, accuracy_command, bench_command, fused_op_names, info_command,
                           plot_command, tune_command)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    return args.handler(args)



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
    bench.set_defaults(command="bench", handler=bench_command)
    bench.add_argument("--shapes", nargs="+", default=None, metavar="MxNxK",
                       help="fused ops: shapes to measure (default: the op's list); tp_block, backend_block: "
                            "cases whose name starts with one of these (decode, decode:8, prefill:4x4096:compile, "
                            "prefill:4x4096:tp_sp, ...)")
    bench.add_argument("--op", nargs="+", default=["all"], choices=[*OPS, *fused_op_names(), TP_BLOCK, BACKEND_BLOCK, GEMM, "all"],
                       metavar="OP",
                       help=f"collectives: {', '.join(OPS)} or all (default: all); fused ops (GPU, by shape): "
                            f"{', '.join(fused_op_names())}; {TP_BLOCK}: a tensor-parallel decoder block, decode "
                            f"and prefill, in modes nccl, torch_async_tp and symmcoll (GPU; --algorithms "
                            f"picks modes); {BACKEND_BLOCK}: a torchtitan-style DTensor block compiled with "
                            f"torch.compile and with symmcoll.backend, decode and prefill (GPU); {GEMM}: the GEMM core beside cuBLAS on one GPU over the serving "
                            f"grid (--shapes: layer-name prefixes such as 70b-tp8, --m: M values)")
    bench.add_argument("--m", nargs="+", default=None, metavar="M", help=f"{GEMM}: M values (default: the grid)")
    bench.add_argument("--energy-window-s", type=float, default=0.0, metavar="SECONDS",
                       help=f"{GEMM}: after each cell's rounds, each side replayed this long (at least 5 steps of "
                            f"NVML's energy counter) while the counter is polled: its energy per call and clock "
                            f"(default 0: off; bench/gemm_energy.py)")
    bench.add_argument("--energy-m", nargs="+", default=None, metavar="M",
                       help=f"{GEMM}: the M values whose cells get energy windows (default 16 256 1024 4096 16384)")
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
    bench.add_argument("--profile", action="store_true",
                       help=f"{BACKEND_BLOCK}: also profile every timed mode (torch.profiler: GPU kernels by name, "
                            f"us and calls a step; busy, idle and host time a step)")
    bench.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    bench.add_argument("--link-bytes", type=_size, default=256 << 20,
                       help="bytes per rank for the link measurement (default 256M)")

    plot = commands.add_parser("plot", help="draw PNGs (latency and busbw vs size) from result files")
    plot.set_defaults(command="plot", handler=plot_command)
    plot.add_argument("results", nargs="+", help="result JSON files")
    plot.add_argument("--out", default=None, help="directory for PNGs (default: beside the first result)")

    accuracy = commands.add_parser(
        "accuracy", help="errors of the quantized all-reduce (every format and group size) and of the exact "
                         "path against an fp64 sum, on Gaussian, outlier and tensor-parallel MLP data",
        description="Runs symmcoll.all_reduce(x, quantize=...) for int8, fp8, int4 and G = 32, 64, 128 on "
                    "three kinds of data and writes relative and max errors (and elements outside the "
                    "documented bound) to one JSON file per world size.")
    accuracy.set_defaults(command="accuracy", handler=accuracy_command)
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
    tune.set_defaults(command="tune", handler=tune_command)
    tune.add_argument("-b", "--minbytes", type=_size, default=None)
    tune.add_argument("-e", "--maxbytes", type=_size, default=None)
    tune.add_argument("--op", nargs="+", default=None, metavar="OP",  # collectives and fused ops
                      help=f"ops to measure: {', '.join(OPS)}, or fused ops ({', '.join(fused_op_names())}, GPU, by "
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
    info.set_defaults(command="info", handler=info_command)
    return parser


if __name__ == "__main__":
    sys.exit(main())
