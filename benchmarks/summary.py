"""The README's summary: one table and one plot of symmcoll's default (algorithm="auto") against the
fastest baseline (NCCL, torch's symm_mem ops) measured in the same run, from result files only.

    python3 benchmarks/summary.py --plot docs/summary.png RESULT.json ...

For every (op, world size, size) the newest file that measured symmcoll:auto there is used, auto and
baselines from that one file, so a later partial re-run (e.g. two sizes) replaces only its sizes.
Prints the markdown table and the files each row came from.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from symmcoll.bench import results
from symmcoll.bench.sizes import format_size

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
TABLE_SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)
AUTO = "symmcoll:auto"


def _is_baseline(name: str) -> bool:
    return not name.startswith("symmcoll:")


def points(loaded: list[tuple[Path, results.BenchResult]]):
    """(op, world) -> {size: (auto us, best baseline us, best baseline name, file)}."""
    out: dict[tuple[str, int], dict[int, tuple]] = {}
    for path, result in sorted(loaded, key=lambda pr: pr[1].provenance.created_utc):  # newest last wins
        world = result.config.world_size
        for op in result.ops():
            rows = [m for m in result.measurements if m.op == op and m.ok]
            for size in sorted({m.size_bytes for m in rows}):
                at = [m for m in rows if m.size_bytes == size]
                auto = next((m for m in at if m.implementation == AUTO), None)
                others = [m for m in at if _is_baseline(m.implementation)]
                if auto is None or not others:
                    continue
                best = min(others, key=lambda m: m.median_us)
                out.setdefault((op, world), {})[size] = (auto.median_us, best.median_us, best.implementation, path)
    return out


def table(data) -> str:
    head = ["op, world size", *(format_size(s) for s in TABLE_SIZES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in OPS:
        for world in sorted({w for o, w in data if o == op}, reverse=True):
            row = data[(op, world)]
            cells = []
            for size in TABLE_SIZES:
                if size in row:
                    auto, best, _, _ = row[size]
                    cells.append(f"{auto:.2f} ({auto / best:.2f}x)")
                else:
                    cells.append("-")
            lines.append(f"| {op}, {world} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sources(data) -> str:
    lines = []
    for (op, world), row in sorted(data.items()):
        files = sorted({str(v[3]) for v in row.values()})
        lines.append(f"{op} ws{world}: {', '.join(files)}")
    return "\n".join(lines)


def plot(data, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.5, 4.8))
    colours = {op: plt.get_cmap("tab10")(i) for i, op in enumerate(OPS)}
    for (op, world), row in sorted(data.items(), key=lambda kv: (OPS.index(kv[0][0]), -kv[0][1])):
        sizes = sorted(row)
        ax.plot(sizes, [row[s][0] / row[s][1] for s in sizes], marker="o", markersize=3, color=colours[op],
                linestyle="-" if world == max(w for _, w in data) else "--", label=f"{op}, world size {world}")
    ax.axhline(1.0, color="gray", linewidth=1)
    ax.set(xscale="log", xlabel="size: bytes per rank (input; output for reduce_scatter)",
           ylabel="auto time / fastest baseline time",
           title="symmcoll algorithm=\"auto\" against the fastest of NCCL and torch's symm_mem ops\n"
                 "(below 1: symmcoll faster; H200, bf16, CUDA-graph replays)")
    ticks = sorted({s for row in data.values() for s in row})[::2]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(s) for s in ticks], rotation=45, fontsize=8)
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    args = parser.parse_args(argv)
    data = points([(p, results.load(p)) for p in args.results])
    print(table(data))
    print()
    print(sources(data))
    if args.plot:
        plot(data, args.plot)


if __name__ == "__main__":
    main()
