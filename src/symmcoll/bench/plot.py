"""PNG plots drawn from result files only (never from a live run): per op, latency against size
(log-log) and bus bandwidth against size (log-x), one line per implementation and run. Rows with wrong
results are drawn as red crosses, never as part of a line."""

from __future__ import annotations

from pathlib import Path

from .results import BenchResult, load
from .sizes import format_size

LINE_STYLES = ("-", "--", ":", "-.")


def plot_files(paths: list[str | Path], out_dir: str | Path | None = None) -> list[Path]:
    """One PNG per op found in the result files; returns the paths written."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no result files to plot")
    results = [load(p) for p in paths]
    out = Path(out_dir) if out_dir is not None else paths[0].parent
    prefix = paths[0].stem if len(paths) == 1 else "compare"
    return plot_results(results, out, prefix)


def plot_results(results: list[BenchResult], out_dir: Path, prefix: str) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on GPU hosts or CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    ops = list(dict.fromkeys(op for r in results for op in r.ops()))
    several = len(results) > 1
    written = []
    for op in ops:
        fig, (latency, busbw) = plt.subplots(1, 2, figsize=(13, 5))
        # One colour per implementation and one line style per run, so ws4 and ws2 of the same
        # implementation read as a pair.
        names = list(dict.fromkeys(name for r in results for name in r.implementations(op)))
        colours = {name: plt.get_cmap("tab10")(i % 10) for i, name in enumerate(names)}
        for index, result in enumerate(results):
            suffix = f" (ws{result.config.world_size})" if several else ""
            style = LINE_STYLES[index % len(LINE_STYLES)]
            for name in result.implementations(op):
                _draw(latency, busbw, result.rows(op, name), name + suffix, colours[name], style)
            bound = result.link.bound_gbps if result.link else None
            if bound:
                busbw.axhline(bound, linestyle=style, color="gray", linewidth=1)
                busbw.annotate(f"link {bound:.0f} GB/s{suffix}", (0.01 + 0.3 * index, bound),
                               xycoords=("axes fraction", "data"), fontsize=8, color="gray", va="bottom")
        first = results[0]
        fig.suptitle(f"{op}: {first.config.dtype}, {first.config.plan.mode}, "
                     f"{first.provenance.gpu_name or 'CPU (interpreter: not performance)'}")
        latency.set(xscale="log", yscale="log", xlabel="size (bytes, see convention)",
                    ylabel="time per call (us)")
        latency.yaxis.set_major_formatter(ScalarFormatter())  # 12.5 rather than 10^1 alone
        busbw.set(xscale="log", xlabel="size (bytes, see convention)", ylabel="busbw (GB/s)")
        for ax in (latency, busbw):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            _size_ticks(ax, [m.size_bytes for r in results for m in r.measurements if m.op == op])
        fig.tight_layout()
        path = out_dir / f"{prefix}-{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _draw(latency, busbw, rows, label: str, colour, style: str) -> None:
    good = [m for m in rows if m.ok]
    bad = [m for m in rows if not m.ok and m.median_us is not None]
    if good:
        sizes = [m.size_bytes for m in good]
        line = dict(marker="o", markersize=3, label=label, color=colour, linestyle=style)
        latency.plot(sizes, [m.median_us for m in good], **line)
        busbw.plot(sizes, [m.busbw_gbps for m in good], **line)
    if bad:
        latency.scatter([m.size_bytes for m in bad], [m.median_us for m in bad], marker="x", color="red",
                        label=f"{label}: wrong")
        busbw.scatter([m.size_bytes for m in bad], [m.busbw_gbps for m in bad], marker="x", color="red")


def _size_ticks(ax, sizes: list[int]) -> None:
    ticks = sorted(set(sizes))
    if len(ticks) > 10:  # every other power of two keeps labels readable
        ticks = ticks[::2]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(s) for s in ticks], rotation=45, fontsize=8)
    ax.minorticks_off()
