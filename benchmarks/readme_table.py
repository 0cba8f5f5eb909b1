"""Markdown comparison tables for the README, from result files only.

    python3 benchmarks/readme_table.py benchmarks/results/<run>/*.json > table.md

Per op and world size: NCCL, torch's symm_mem ops, symmcoll's algorithm="auto" (what users get) and
symmcoll's fastest algorithm, and the ratio auto / best non-symmcoll (< 1: symmcoll faster).
"""

from __future__ import annotations

import sys

from symmcoll.bench import results
from symmcoll.bench.sizes import format_size


def table(result, op: str) -> str:
    rows = [m for m in result.measurements if m.op == op]
    impls = list(dict.fromkeys(m.implementation for m in rows))
    anchors = [i for i in impls if not i.startswith("symmcoll:")]
    # symmcoll's algorithms; "symmcoll:nccl" is the process group's collective called through symmcoll
    ours = [i for i in impls if i.startswith("symmcoll:") and i not in ("symmcoll:auto", "symmcoll:nccl")]
    by = {(m.implementation, m.size_bytes): m for m in rows}
    sizes = sorted({m.size_bytes for m in rows})
    head = ["size", *anchors, "symmcoll auto", "fastest symmcoll algorithm", "auto / best other"]
    lines = [f"**{op}, world size {result.config.world_size}** (us per call, CUDA-graph replays, "
             f"slowest rank's median; #wrong = 0 everywhere unless marked)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for size in sizes:
        def us(name):
            m = by.get((name, size))
            return m.median_us if m is not None and m.ok else None
        best_other = min((t for t in map(us, anchors) if t is not None), default=None)
        auto = us("symmcoll:auto")
        auto_row = by.get(("symmcoll:auto", size))
        # a row missing from the file was not run (e.g. cut by --time-limit); one present but not ok is wrong
        # or failed; a row timed eagerly because its graph capture failed says so
        auto_cell = ("not run" if auto_row is None else "WRONG/failed" if auto is None
                     else f"{auto:.2f}" + (" (eager: capture failed)" if auto_row.timing == "eager" else ""))
        fastest = min(((us(n), n) for n in ours if us(n) is not None), default=(None, "-"))
        cells = [format_size(size), *(f"{us(a):.2f}" if us(a) else "-" for a in anchors),
                 auto_cell,
                 f"{fastest[1].split(':')[1]} {fastest[0]:.2f}" if fastest[0] else "-",
                 f"{auto / best_other:.2f}" if auto and best_other else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(paths: list[str]) -> None:
    loaded = [results.load(p) for p in paths]
    for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
        for result in loaded:
            if any(m.op == op for m in result.measurements):
                print(table(result, op), end="\n\n")


if __name__ == "__main__":
    main(sys.argv[1:])
