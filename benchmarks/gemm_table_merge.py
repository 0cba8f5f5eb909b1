"""One-off, no GPU: install the entries of a GEMM tune into a shipped table where the bench measured
them clearly faster than what the cell ran before (issue 22, round 3).

The tune of 2026-11-27 (one H100, git 50c1510) measured only stream-K and unsplit candidates; the
shipped table's entries and the grid they gave (2026-11-24) were measured with the wave split. A newer
entry replaces what a cell ran only where both of its measurements -- the tune's and the grid bench's
(the grid ran every tuned cell's entry) -- are below the older grid's ratio to cuBLAS at that cell by
``--margin``; the others stay as they were. Every written entry says where it was measured
(``source``); lists are written out in full, so each keeps the meaning it was measured with.

``--expected-grid`` also writes what the bench should show with the merged table: for every cell of
the grid, the config ``gemm_config`` answers and its ratio as one of the two grids measured that very
config at that cell (the wave split or unsplit in the older one, stream-K or unsplit in the newer);
a cell neither measured is an error. ``symmcoll tune --cells-from`` reads it like a bench result.

    PYTHONPATH=src python3 benchmarks/gemm_table_merge.py --shipped <gemm_h100.json of git d0f5e4d> \\
        --shipped-source "tune 2026-11-24 (git b49928c)" \\
        --old-grid benchmarks/results/2026-11-24-gemm-h100/gemm-h100-bf16-2026-11-24T060217Z.json \\
        --tuned benchmarks/results/2026-11-27-gemm-streamk-h100/gemm_h100.json \\
        --tuned-source "tune 2026-11-27 (git 50c1510)" \\
        --new-grid benchmarks/results/2026-11-27-gemm-streamk-h100/gemm-h100-bf16-2026-11-27T015446Z.json \\
        --out src/symmcoll/data/gemm_h100.json \\
        --expected-grid benchmarks/results/2026-11-27-gemm-streamk-h100/expected-grid-after-fix.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from symmcoll.bench.gemm import GRID_M, SHAPES, summarize
from symmcoll.fused.gemm_configs import GemmConfig, untuned_config
from symmcoll.fused.gemm_tables import lookup, table_of, table_settings, write_table


def cells_of(path: Path) -> dict:
    return {(r["m"], r["n"], r["k"]): r for r in json.loads(path.read_text())["rows"]}


def ran_as(config: GemmConfig) -> str:
    """The label a run before this round wrote for ``config`` (each had one kind of split: s<n>)."""
    return config.label.replace("/sk", "/s")


def merged_entries(shipped: dict, tuned: dict, old_grid: dict, new_grid: dict, args) -> dict:
    shipped_rows = {(e["m"], e["n"], e["k"]): e for e in shipped["entries"]}
    entries = {cell: {"source": args.shipped_source, **e} for cell, e in shipped_rows.items()}
    for row in tuned["entries"]:
        cell = (row["m"], row["n"], row["k"])
        if row == shipped_rows.get(cell):
            continue  # kept from the shipped table by that tune (--base)
        config, ran = GemmConfig.from_list(row["config"]), new_grid[cell]
        assert ran_as(config.fitted(2)) == ran["config"], f"the grid ran another config at {cell}"
        before = old_grid[cell]["ratio"]
        verdict = "installed" if max(row["ratio"], ran["ratio"]) < before - args.margin else "kept as it was"
        print(f"{row['shape']:<20} M={row['m']:<6} {config.label:<30} tune x{row['ratio']:.3f} grid "
              f"x{ran['ratio']:.3f} | before {old_grid[cell]['config']:<30} x{before:.3f}: {verdict}")
        if verdict == "installed":
            entries[cell] = {"source": args.tuned_source, **row}
    return entries


def expected_grid(table: dict, old_grid: dict, new_grid: dict, args) -> None:
    rows = []
    for shape, n, k in SHAPES:
        for m in GRID_M:
            config = (lookup(table, m, n, k, True) or untuned_config(m, n, k)).for_itemsize(2)
            older, newer = old_grid[(m, n, k)], new_grid[(m, n, k)]
            if not config.stream_k and older["config"] == ran_as(config):
                measured, source = older, args.old_grid
            elif (config.stream_k or config.split_k == 1) and newer["config"] == ran_as(config):
                measured, source = newer, args.new_grid
            else:
                raise SystemExit(f"{shape} M={m}: {config.label} was measured in neither grid")
            rows.append(dict(shape=shape, m=m, n=n, k=k, config=config.label, ratio=measured["ratio"],
                             us=measured["us"], cublas_us=measured["cublas_us"], weight_tbs=measured["weight_tbs"],
                             weight_mb=measured["weight_mb"], measured_in=source.name))
    summary = summarize(rows)
    args.expected_grid.write_text(json.dumps(dict(
        note="not a run: what the bench should show with the merged table, each cell's ratio as measured for "
             "the same config at the same cell in one of two grids (benchmarks/gemm_table_merge.py)",
        summary=summary, rows=rows), indent=1) + "\n")
    print(f"expected grid: geomean {summary['geomean_ratio']:.4f}, {summary['above_1_10']} cells above 1.10x, "
          f"worst {summary['worst_ratio']:.3f} ({summary['worst_cell']}); "
          f"{sum(r['measured_in'] == args.new_grid.name for r in rows)} cells as the newer grid measured them "
          f"-> {args.expected_grid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("shipped", "old-grid", "tuned", "new-grid", "out"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument("--shipped-source", required=True)
    parser.add_argument("--tuned-source", required=True)
    parser.add_argument("--margin", type=float, default=0.03)
    parser.add_argument("--expected-grid", type=Path)
    args = parser.parse_args()
    tuned = json.loads(args.tuned.read_text())
    old_grid, new_grid = cells_of(args.old_grid), cells_of(args.new_grid)
    shipped = json.loads(args.shipped.read_text())
    entries = merged_entries(shipped, tuned, old_grid, new_grid, args)
    provenance = dict(tuned["provenance"], merged=f"{args.shipped_source} + {args.tuned_source} where faster "
                                                  f"by > {args.margin} x cuBLAS (benchmarks/gemm_table_merge.py)")
    path = write_table("h100", provenance, sorted(entries.values(), key=lambda e: (e["n"], e["k"], e["m"])),
                       args.out, table_settings(shipped))
    print(f"written: {path} ({len(entries)} entries)")
    if args.expected_grid:
        expected_grid(table_of(list(entries.values())), old_grid, new_grid, args)


if __name__ == "__main__":
    main()
