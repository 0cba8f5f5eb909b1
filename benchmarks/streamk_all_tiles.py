"""Experiment (issue 22, 2026-11-28): stream-K over every tile where one wave of tiles leaves SMs idle.

Why: at M = 128-512 the QKV cells (N 1280-5120, K 8192) run 20-80 tiles of 64 x 128 on 132 SMs, whole
(stream-K shares a partial wave only when it is at most STREAM_K_MAX_TAIL = 1/3 of the programs, a rule
measured on an H100). Their time follows the bytes each SM keeps in flight (70b-tp2 qkv M = 128 on an
H200: 64 x 128 x 64 tiles 42.4 us at 4 stages, 29.1 at 8; cuBLAS 26.9), so the 52 idle SMs are load
bandwidth left unused. Here stream_split's tail limit is lifted (max_tail = 1: every tile shared over
every program) and each config is timed beside the table's config and cuBLAS on the same data, every
result checked against fp32 first.

    python3 benchmarks/streamk_all_tiles.py --out $OUT/streamk.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from symmcoll.bench.gemm import (DTYPES, MAX_REL_ERR, check, cublas, current_gpu, gpu_facts, make_cell, ours,
                                 timed_us)
from symmcoll.fused import gemm_configs
from symmcoll.fused.gemm_configs import GemmConfig, split_plan
from symmcoll.fused.gemm_tables import gemm_config
from symmcoll.fused.gemm import programs_for

CELLS = [("70b-tp2 qkv", m, 5120, 8192) for m in (128, 256)] + \
        [("70b-tp4 qkv", m, 2560, 8192) for m in (128, 256, 512)] + \
        [("70b-tp8 qkv", m, 1280, 8192) for m in (64, 128, 256, 512)] + [("70b-tp8 gate_up", 128, 7168, 8192)]


def configs() -> list[GemmConfig]:
    found = []
    for split in (2, 3, 4):
        for stages in (6, 8):
            found.append(GemmConfig(64, 128, 64, 8, split, num_warps=4, num_stages=stages, stream_k=True))
        found.append(GemmConfig(64, 64, 128, 8, split, num_warps=4, num_stages=6, stream_k=True))
        found.append(GemmConfig(128, 128, 64, 8, split, num_warps=8, num_stages=6, stream_k=True))
    return found


def run_probe(cells, candidates, out: Path, replays: int) -> None:
    """Each cell's table config, then ``candidates(cell)``, beside cuBLAS on the same data (each result
    checked against fp32 before it is timed); rows written to ``out`` (JSON) with the GPU's facts."""
    device = current_gpu()
    rows = []
    for name, m, n, k in cells:
        cell = make_cell(name, m, n, k, DTYPES["bf16"], device)
        cublas_us = timed_us(cublas(cell), replays)
        cublas_err = check(cell, cublas(cell))
        table = gemm_config(m, n, k, torch.bfloat16, device)
        for config in [table] + candidates((name, m, n, k)):
            fitted = config.fitted(2)
            tiles = math.ceil(m / fitted.block_m) * math.ceil(n / fitted.tile_n)
            plan = split_plan(fitted, tiles, k, programs_for(fitted, device))
            row = dict(shape=name, m=m, n=n, k=k, config=config.label, ran=fitted.label, table=config is table,
                       tiles=tiles, whole_tiles=plan.whole_tiles, sharing=plan.sharing, stream=plan.stream,
                       cublas_us=cublas_us, cublas_rel_err=cublas_err)
            try:
                err = check(cell, ours(cell, config))
            except Exception as exc:  # noqa: BLE001 - a config that cannot run is reported, not fatal
                rows.append(dict(row, error=f"{type(exc).__name__}: {exc}"[:300]))
                print(f"{name:<16} M={m:<4} {config.label:<30} {type(exc).__name__}", flush=True)
                continue
            row["rel_err"] = err
            if err <= MAX_REL_ERR:
                row["us"] = timed_us(ours(cell, config), replays)
                row["ratio"] = row["us"] / cublas_us
            rows.append(row)
            us, ratio = row.get("us", float("nan")), row.get("ratio", float("nan"))
            print(f"{name:<16} M={m:<4} {config.label:<30} tiles {tiles:<3} shared by {plan.sharing:<3} "
                  f"{us:7.1f} us  cuBLAS {cublas_us:7.1f}  x{ratio:.3f}"
                  f"  err {err:.1e}{'  (table)' if config is table else ''}", flush=True)
        del cell
        torch.cuda.empty_cache()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(provenance=gpu_facts(), rows=rows), indent=1))
    print(f"written: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args()
    # Every tile shared, whatever the partial wave's size (the default argument is read at each call).
    gemm_configs.stream_split.__defaults__ = (1.0,)
    run_probe(CELLS, lambda cell: configs(), args.out, args.replays)


if __name__ == "__main__":
    main()
