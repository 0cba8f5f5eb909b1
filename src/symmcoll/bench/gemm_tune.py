"""``symmcoll tune --op gemm``: the table ``gemm_tables.gemm_config`` reads (``data/gemm_<gpu>.json``).

For each cell -- the grid's shapes (bench/gemm.py) and ``FUSED_SHAPES`` at each M, or the cells a bench
result found slow (``cells_above``, worst first) -- it measures ``gemm_candidates.candidates`` and what
the base table answers today (``cell_candidates``), compiled ahead in worker processes
(``gemm.compile_job``), keeps the fastest correct config and the fastest without split-K, and writes the
table after every cell (``gemm_tables.write_table``); past a time budget no new cell starts.

Its own module beside the grid bench (bench/gemm.py, whose cells, checks, timings and compile jobs it
uses): the grid measures the configs the tables give, this writes the tables.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from pathlib import Path

import torch

from ..fused.gemm_candidates import candidates
from ..fused.gemm_configs import GemmConfig
from ..fused.gemm_tables import gpu_key, lookup, table_of, table_settings, write_table
from .gemm import (DTYPES, MAX_REL_ERR, check, compile_in_worker, compile_job, compile_pool, cublas, current_gpu,
                   decided_ratio, gpu_facts, grid_shapes, make_cell, named, ours, timed_us)

# Tuned beside the grid: the shapes of the fused ops' benchmarks (bench/fused.py) as plain GEMMs, so
# their configs are measured too (C [M, N] = all_gather(A) @ B; the 70B MLP's full down projection).
FUSED_SHAPES = (("fused 8192x28672", 8192, 28672), ("fused 8192x8192", 8192, 8192),
                ("fused 6656x16384", 6656, 16384), ("fused 3584x8192", 3584, 8192), ("fused 1024x1024", 1024, 1024))


def is_fused_shape(name: str) -> bool:
    """Whether ``name`` is one of ``FUSED_SHAPES`` (tuned L2-warm, as the fused ops' bench calls them)."""
    return any(name == fused for fused, _, _ in FUSED_SHAPES)


def cells_above(result: Path, above: float, ms: set[int] | None = None) -> list[tuple[str, int, int, int]]:
    """(shape, m, n, k) of a bench result's cells slower than ``above`` x cuBLAS (``decided_ratio``; or
    wrong), worst first; only those of M in ``ms`` if given. A gzipped result (``.json.gz``, as older ones
    are kept: benchmarks/results/README.md) reads the same."""
    raw = gzip.decompress(result.read_bytes()) if result.suffix == ".gz" else result.read_bytes()
    rows = json.loads(raw)["rows"]
    ratio = {id(r): decided_ratio(r) if "ratio" in r else math.inf for r in rows}
    slow = [r for r in rows if ratio[id(r)] > above and (ms is None or r["m"] in ms)]
    return [(r["shape"], r["m"], r["n"], r["k"]) for r in sorted(slow, key=lambda r: -ratio[id(r)])]


def tune(dtype_name: str, ms: tuple[int, ...], shape_filter: list[str] | None, replays: int, out: Path | None,
         console, workers: int = 12, base: Path | None = None, cells: list[tuple[str, int, int, int]] | None = None,
         budget_s: float | None = None) -> Path:
    """Measure every candidate of every cell (a quick pass of 3 replays each, then the best three
    again with ``replays``); write the table after every cell (a run cut short keeps what it
    measured), keeping the cells of ``base`` (an earlier table) that this run does not measure.
    ``cells`` (shape, m, n, k) replaces the grid (shapes x ms); past ``budget_s`` seconds no new cell
    starts (cells come worst first from ``cells_above``)."""
    started = time.time()
    device = current_gpu()
    dtype = DTYPES[dtype_name]
    facts = gpu_facts()
    sms = facts["sms"]
    if cells is None:
        shapes = grid_shapes(shape_filter) + [s for s in FUSED_SHAPES if named(s[0], shape_filter)]
        cells = [(name, m, n, k) for name, n, k in shapes for m in ms]
    base_table = json.loads(base.read_text()) if base and base.exists() else {}
    kept, settings = base_table.get("entries", []), table_settings(base_table)
    configs = {cell: cell_candidates(*cell[1:], sms, table_of(kept)) for cell in cells}
    key = gpu_key(facts["gpu"]) or "gpu"
    # Compiles run ahead in worker processes, cell by cell in tuning order, while the cells before
    # are measured (a cell waits only for its own kernels; those of cells the budget cuts are dropped).
    pool = compile_pool(workers)
    compiling: dict[tuple, object] = {}
    for (_, m, n, k), cell_configs in configs.items():
        for config in cell_configs:
            job = compile_job(config, m, n, k, dtype_name, sms, key)
            if job not in compiling:
                compiling[job] = pool.submit(compile_in_worker, job)
    entries, measured, failures = [], [], []
    path = out
    try:
        for index, (name, m, n, k) in enumerate(cells):
            if budget_s is not None and time.time() - started > budget_s:
                console.print(f"tune budget of {budget_s:.0f} s spent: {len(cells) - index} cells left as they "
                              f"were", highlight=False)
                break
            for config in configs[(name, m, n, k)]:
                try:
                    error = compiling[compile_job(config, m, n, k, dtype_name, sms, key)].result()
                except Exception as exc:  # noqa: BLE001 - a dead worker: the measurement compiles what it needs
                    error = f"{config.label}: {type(exc).__name__} in a compile worker"
                if error and error not in failures:
                    failures.append(error)
                    console.print(f"compile failed: {error}", highlight=False)
            entry = _tune_cell(name, m, n, k, dtype, device, configs[(name, m, n, k)], replays, measured)
            entries.append(dict(source=f"tune {facts.get('created_utc', '')[:10]} (git {str(facts.get('git'))[:7]})",
                                **entry))
            console.print(f"{name:<20} M={m:<6} best {entry['label']:<32} {entry['us']:9.1f} us  cuBLAS "
                          f"{entry['cublas_us']:9.1f}  x{entry['ratio']:.3f}  ({entry['candidates']} configs, "
                          f"{time.time() - started:.0f} s)", highlight=False)
            done = {(e["m"], e["n"], e["k"]) for e in entries}
            path = write_table(key, facts, [e for e in kept if (e["m"], e["n"], e["k"]) not in done] + entries, out,
                               settings)
            (path.parent / (path.stem + "-measurements.json")).write_text(json.dumps(dict(provenance=facts,
                                                                                           rows=measured)))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    console.print(f"GEMM table written: {path} ({len(entries)} of {len(cells)} cells measured now, the rest from "
                  f"{base or 'nothing'}; {len(compiling)} kernels queued) in {time.time() - started:.0f} s",
                  highlight=False)
    return path


def cell_candidates(m: int, n: int, k: int, sms: int, base: dict) -> list[GemmConfig]:
    """``candidates`` and what the base table answers for the cell today (its best and its config
    without split): a re-tune replaces a cell's config only with one measured faster in the same run."""
    found = candidates(m, n, k, sms)
    for split in (True, False):
        incumbent = lookup(base, m, n, k, split)
        if incumbent is not None:
            found.append(incumbent.fitted(2))
    return list(dict.fromkeys(found))


def fused_config(fastest_first: list[GemmConfig]) -> GemmConfig:
    """The fused ops' config of a cell (the table's "no_split"): the fastest of whole tiles of one part on the
    Triton core -- their kernels know no split, no second column part, and no Gluon kernel."""
    return next(c for c in fastest_first if c.split_k == 1 and not c.block_n2 and not c.gluon)


def _tune_cell(name, m, n, k, dtype, device, configs, replays, measured) -> dict:
    # The fused ops' cells in the regime their bench (bench/fused.py) calls them: the same inputs every call,
    # so a small one (1024^3: 6 MB) runs from L2 there, where another config can win than from HBM (2026-11-28,
    # H200: the config tuned from HBM at 0.965x cuBLAS ran 1.04x in the fused bench).
    cell = make_cell(name, m, n, k, dtype, device, rotate=not is_fused_shape(name))
    cublas_us = timed_us(cublas(cell), replays)
    results = []
    for config in configs:
        try:
            err = check(cell, ours(cell, config))
        except Exception as exc:  # noqa: BLE001 - a config that cannot run is skipped, not fatal
            measured.append(dict(m=m, n=n, k=k, config=config.label, error=f"{type(exc).__name__}"))
            continue
        if not err <= MAX_REL_ERR:
            measured.append(dict(m=m, n=n, k=k, config=config.label, rel_err=err, error="wrong"))
            continue
        us = timed_us(ours(cell, config), 3, min_graph_us=100.0)
        results.append((us, config))
        measured.append(dict(m=m, n=n, k=k, config=config.label, us=us, rel_err=err))
    results.sort(key=lambda r: r[0])
    # The best three again, longer: the choice should not rest on one short sample.
    final = sorted(((timed_us(ours(cell, c), replays), c) for _, c in results[:3]), key=lambda r: r[0])
    best_us, best = final[0]
    no_split = fused_config([c for _, c in final + results])
    del cell
    torch.cuda.empty_cache()
    entry = dict(m=m, n=n, k=k, shape=name, config=best.as_list(), no_split=no_split.as_list(), label=best.label,
                 us=best_us, cublas_us=cublas_us, ratio=best_us / cublas_us, candidates=len(results))
    if best.gluon:  # the Triton core's own best too (what a one-rank fused op's "auto" reads: gemm_tables.measured_cells)
        entry["core_ratio"] = min(us for us, c in final + results if not c.gluon) / cublas_us
    return entry
