"""Probe (issue 22, point 3): can a decode GEMM read its weights across the kernel boundary?

At M <= 64 the 32-40 MB weights (70b-tp4 qkv / o) read 2.5-3.3 TB/s where point 3 asks 3.6; an SM read kernel
over the same bytes reads 2.93-3.06 (results/2026-11-29-decode-narrow-h200). Every earlier try to move bytes
across the boundary between two decode GEMMs of a chain went through the plain-Triton core, whose software
pipeline cannot start before the PDL wait: B prefetched into L2 (14th stop), B's first k-steps loaded into
registers before the wait (16th), W's lines prefetched by the LSU (17th) -- none gained. Gluon (triton 3.6)
puts the ring in our hands: this kernel issues the TMA loads of its first STAGES k-steps of B (a weight,
which no kernel before writes) into shared memory BEFORE ``griddepcontrol.wait``, then waits, releases the
next launch, and loads A (the activations, which the kernel before may write) -- so a launch that became
resident under PDL's early release has its first ~200 KB of B in flight while the kernel before it drains.
The same kernel with PREFETCH off waits first (the core's order). Swapped tiles as the core's decode
configs: tokens on wgmma's narrow N side, 64 columns of B a program, whole K, one program per column block.
The kernel is now the package's (fused/gemm_gluon.py, which grew out of this probe; calls 2-4 of
results/2026-11-29-gluon-h200 ran the probe's own copy of it, git a0bd100-4570a4a).
Timed as the grid times decode cells (rotating weight sets, paired rounds, PDL-launched chains) beside the
core and cuBLAS, every side checked against fp32 first. Gluon does not run under the interpreter: a
measurement, not a core path.

    PYTHONPATH=src python3 benchmarks/gluon_decode_probe.py --out decode.json     # GPU
    PYTHONPATH=src python3 benchmarks/gluon_decode_probe.py --compile-only        # sm_90 build, no GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

from symmcoll.fused import gemm_gluon
from symmcoll.fused.gemm_configs import GemmConfig
from symmcoll.launcher import launch, pdl_meta

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import kernel_specs  # noqa: E402  (ptxas_usage: registers and spills of the sm_90a build)

BN = gemm_gluon.BLOCK_N


def tokens_tile(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


def config_of(m: int, bk: int, stages: int, parts: int) -> GemmConfig:
    """The package's Gluon decode config for ``m`` tokens (fused/gemm_gluon.py runs it)."""
    return GemmConfig(tokens_tile(m), BN, bk, 1, parts, True, 4, stages, gluon=True)


def decode_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bk: int = 256, stages: int = 5,
                  prefetch: bool = True, parts: int = 1) -> torch.Tensor:
    """C = A @ B (A [M <= 64, K], B [K, N], row-major) on the package's Gluon decode kernel, launched with PDL;
    ``prefetch`` False issues B's first k-steps after the wait (the Triton core's order)."""
    launch(gemm_gluon.decode_kernel, *gemm_gluon.launch_args(config_of(a.shape[0], bk, stages, parts), a, b, False, c,
                                                             pdl_meta(a.device, True), b_early=prefetch))
    return c


# (label, k-step, stages, prefetch, split): ~200 KB of shared memory at 16 tokens; "split": the column blocks'
# k-steps shared by 132 // blocks programs each (>= 2; else not run)
VARIANTS = (("g256p5", 256, 5, False, False), ("g256p5 pf", 256, 5, True, False), ("g256p5 split", 256, 5, False, True),
            ("g256p5 pf split", 256, 5, True, True), ("g128p10 pf", 128, 10, True, False))
CELLS = (("70b-tp4 qkv", 2560, 8192), ("70b-tp4 o", 8192, 2048), ("405b-tp8 qkv", 2304, 16384),
         ("dsv3-expert gate_up", 4096, 7168), ("70b-tp2 qkv", 5120, 8192), ("70b-tp2 gate_up", 28672, 8192))
MS = (1, 16, 32, 64)
SMS = 132


def variants_for(m: int, n: int):
    """(label, k-step, stages, prefetch, parts) of VARIANTS at ``m`` tokens and ``n`` columns: the ring cut to
    what fits shared memory (A's stage grows with the tokens tile; "@stages" in the label then)."""
    blocks = triton.cdiv(n, BN)
    for label, bk, stages, prefetch, split in VARIANTS:
        parts = SMS // blocks if split else 1
        if split and parts < 2:
            continue
        fitted = stages
        while (bk * BN + tokens_tile(m) * bk) * 2 * fitted > 220 * 1024:
            fitted -= 1
        yield (label.replace("split", f"s{parts}") + (f"@{fitted}" if fitted != stages else "")), bk, fitted, \
            prefetch, parts


def run(out_path: str | None, rounds: int, replays: int, cells, ms) -> dict:
    from symmcoll.bench import bandwidth
    from symmcoll.bench import gemm as grid
    from symmcoll.bench.provenance import collect
    from symmcoll.bench.rounds import interleave, paired_ratio, paired_ratios
    from symmcoll.bench.timing import graph_us
    device = torch.device("cuda")
    rows = []
    result = {"provenance": dataclasses.asdict(collect("cuda")), "rows": rows}
    started = time.time()
    for name, n, k in cells:
        read_tbs = None
        for m in ms:
            cell = grid.make_cell(name, m, n, k, torch.bfloat16, device)
            sides = {"cublas": grid.cublas(cell), "core": grid.ours(cell, None)}
            for label, bk, stages, prefetch, parts in variants_for(m, n):
                sides[label] = [lambda a=a, b=b, c=c, bk=bk, s=stages, p=prefetch, q=parts:
                                decode_matmul(a, b, c, bk, s, p, q) for a, b, c in cell.sets]
            errors = {side: grid.check(cell, calls) for side, calls in sides.items()}
            wrong = [s for s, e in errors.items() if not e <= max(2 * errors["cublas"], 1e-2)]
            timed = [s for s in sides if s not in wrong]
            # rotated paired rounds (bench/rounds.py), each round's median over cuBLAS's of the same round
            per_round = interleave(timed, rounds, lambda side, _: graph_us(sides[side], replays)).round_medians
            if read_tbs is None:
                read_tbs = bandwidth.read_same_bytes_tbs([b for _, b, _ in cell.sets])[0]
            us = {s: statistics.median(v) for s, v in per_round.items()}
            row = {"shape": name, "m": m, "n": n, "k": k, "sets": len(cell.sets), "weight_mb": cell.weight_bytes / 2**20,
                   "core_config": grid.gemm.gemm_config(m, n, k, torch.bfloat16, device).label, "rel_err": errors,
                   "wrong": wrong, "us": us, "round_us": per_round,
                   "ratio_to_cublas": {s: paired_ratio(paired_ratios(v, per_round["cublas"]))
                                       for s, v in per_round.items()},
                   "weight_tbs": {s: cell.weight_bytes / u / 1e6 for s, u in us.items()},
                   "read_tbs_same_bytes": read_tbs,
                   "rel_err_after": {s: grid.check(cell, sides[s]) for s in timed}}
            rows.append(row)
            print(f"{name:20s} M={m:3d} {row['weight_mb']:6.1f} MB read {read_tbs:.2f}  " + "  ".join(
                f"{s} {us[s]:.2f}us {row['weight_tbs'][s]:.2f}TB/s" for s in timed)
                + (f"  WRONG {wrong} {errors}" if wrong else "") + f"  [{time.time() - started:.0f}s]", flush=True)
            if out_path:
                Path(out_path).write_text(json.dumps(result, indent=1))
            del cell, sides
            torch.cuda.empty_cache()
    result["summary"] = summary(rows)
    print("summary:", json.dumps(result["summary"]), flush=True)
    if out_path:
        Path(out_path).write_text(json.dumps(result, indent=1))
    return result


def summary(rows: list[dict], target_tbs: float = 3.6) -> dict:
    """Cells whose weights are read at >= target_tbs: cuBLAS, the core, the best Gluon variant, the best of the
    core and every variant (what a table choosing among them would reach)."""
    gluon = lambda row: max((v for s, v in row["weight_tbs"].items() if s not in ("cublas", "core")), default=0.0)
    best = lambda row: max(v for s, v in row["weight_tbs"].items() if s != "cublas")
    return {"cells": len(rows), "target_tbs": target_tbs,
            "cublas": sum(r["weight_tbs"].get("cublas", 0.0) >= target_tbs for r in rows),
            "core": sum(r["weight_tbs"].get("core", 0.0) >= target_tbs for r in rows),
            "best_gluon": sum(gluon(r) >= target_tbs for r in rows),
            "best_of_core_and_gluon": sum(best(r) >= target_tbs for r in rows),
            "wrong": sum(bool(r["wrong"]) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=6)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--all-decode", action="store_true",
                        help="every grid shape with >= 32 MB of weights (bench/gemm.py's SHAPES, DECODE_MB) at M = 1-64")
    args = parser.parse_args()
    if args.compile_only:
        for bt in (16, 64):
            for label, bk, stages, prefetch, _ in variants_for(bt, 2560):
                kernel = gemm_gluon.compile_sm90(config_of(bt, bk, stages, 1), False)
                regs, spills = kernel_specs.ptxas_usage(kernel.asm["ptx"])
                print(f"tokens {bt} {label}: smem {kernel.metadata.shared} B, registers {regs}, spills {spills}")
        return
    if args.all_decode:
        from symmcoll.bench import gemm as grid
        cells = [(name, n, k) for name, n, k in grid.SHAPES if n * k * 2 >= grid.DECODE_MB * 2**20]
        run(args.out, args.rounds, args.replays, cells, (1, 8, 16, 32, 64))
    else:
        run(args.out, args.rounds, args.replays, CELLS, MS)


if __name__ == "__main__":
    sys.exit(main())
