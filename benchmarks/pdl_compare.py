"""Programmatic dependent launch off against on (scripts/gpu_check.sh's ``pdl`` stage): reads the tp_block
and GEMM results the stage wrote under ``DIR`` (tp_{off,on}_<round>/, gemm_{off,on}/) and prints, per
tensor-parallel block case, symmcoll mode's ms per step and its speed against NCCL mode of the same run,
round by round, and per GEMM cell ours / cuBLAS with PDL off and on. Writes DIR/pdl_compare.json.

    python3 benchmarks/pdl_compare.py DIR
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _tp_rows(root: Path) -> dict:
    """{(case, state): [(round, nccl ms, symmcoll ms, error), ...]} from tp_<state>_<round>/."""
    found: dict = {}
    for run in sorted(root.glob("tp_*_*")):
        if not run.is_dir():
            continue
        _, state, round_ = run.name.split("_")
        for path in sorted(run.glob("tp_block-ws1-*.json")):
            rows = json.loads(path.read_text())["rows"]
            by = {(r["case"], r["mode"]): r for r in rows}
            for case in sorted({r["case"] for r in rows}):
                nccl, ours = by.get((case, "nccl")), by.get((case, "symmcoll"))
                if nccl and ours:
                    found.setdefault((case, state), []).append(
                        (int(round_), nccl["ms_per_step"], ours["ms_per_step"], ours.get("error")))
    return found


def _gemm_rows(root: Path) -> dict:
    """{state: {(shape, m): row}} from every gemm_<state>/: off and on (and on_pf<KB>, the B prefetch of
    16e9d9e's stage, in results/2026-11-28-pdl-prefetch-h200)."""
    found = {}
    for run in sorted(root.glob("gemm_*")):
        if run.is_dir():
            for path in sorted(run.glob("gemm-*.json")):
                found[run.name[len("gemm_"):]] = {(r["shape"], r["m"]): r for r in json.loads(path.read_text())["rows"]}
    return found


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def main(root: Path) -> int:
    summary = {"tp_block": {}, "gemm": []}
    tp = _tp_rows(root)
    print("tp_block ws1: symmcoll ms/step and x nccl (same run), by round")
    for case in sorted({c for c, _ in tp}):
        line = {}
        for state in ("off", "on"):
            runs = sorted(tp.get((case, state), []))
            speeds = [n / s for _, n, s, err in runs if n and s and not err]
            line[state] = dict(rounds=[dict(round=r, nccl_ms=n, symmcoll_ms=s, x_nccl=(n / s if n and s else None),
                                            error=err) for r, n, s, err in runs],
                               mean_x_nccl=sum(speeds) / len(speeds) if speeds else None)
            cells = "  ".join(f"r{r}: {s:.4f} ms {n / s:.3f}x" if n and s else f"r{r}: {err}" for r, n, s, err in runs)
            print(f"  {case:10s} PDL {state:3s} {cells}")
        summary["tp_block"][case] = line
    gemm = _gemm_rows(root)
    ons = sorted(state for state in gemm if state != "off")
    if gemm.get("off") and ons:
        print("GEMM: ours / cuBLAS (B's TB/s at M <= 64), PDL off, then " + ", ".join(ons))
        ratios: dict = {state: [] for state in ons}
        for key, off in gemm["off"].items():
            cells = [off] + [gemm[state].get(key) or {} for state in ons]
            if any("ratio" not in c for c in cells):
                print(f"  {key}: " + "; ".join(str(c.get("error", "missing")) for c in cells if "ratio" not in c))
                continue
            row = dict(shape=key[0], m=key[1], ratio_off=off["ratio"], us_off=off["us"],
                       weight_tbs_off=off.get("weight_tbs"))
            for state, on in zip(ons, cells[1:]):
                ratios[state].append(on["us"] / off["us"])
                row.update({f"ratio_{state}": on["ratio"], f"us_{state}": on["us"],
                            f"weight_tbs_{state}": on.get("weight_tbs")})
            summary["gemm"].append(row)
            rate = lambda c: f" {c['weight_tbs']:.2f}TB/s" if key[1] <= 64 and c.get("weight_tbs") else ""
            print(f"  {key[0]:18s} M={key[1]:<4d} " + "  ".join(f"{c['ratio']:.3f} ({c['us']:.1f} us{rate(c)})"
                                                            for c in cells))
        for state in ons:
            summary[f"gemm_geomean_us_{state}_over_off"] = _geomean(ratios[state])
            if ratios[state]:
                print(f"  geomean of ours' time {state} / off: {_geomean(ratios[state]):.4f}")
    (root / "pdl_compare.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
