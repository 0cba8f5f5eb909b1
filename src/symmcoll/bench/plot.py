"""PNG plots drawn from result files only (never from a live run): per op, latency against size
(log-log) and bus bandwidth against size (log-x), one line per implementation and run. Rows with wrong
results are drawn as red crosses, never as part of a line."""

from __future__ import annotations

from pathlib import Path

from .metrics import SIZE_CONVENTION
from .report import backend_label, fallback_name
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
    from matplotlib.lines import Line2D
    from matplotlib.ticker import ScalarFormatter

    out_dir.mkdir(parents=True, exist_ok=True)
    ops = list(dict.fromkeys(op for r in results for op in r.ops()))
    several = len(results) > 1
    written = []
    for op in ops:
        fig, (latency, busbw) = plt.subplots(1, 2, figsize=(15, 5.5))
        # One colour per implementation and one line style per run (world size), so ws4 and ws2 of the
        # same implementation read as a pair; one legend for the figure, outside the axes.
        names = list(dict.fromkeys(name for r in results for name in r.implementations(op)))
        palette = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
        colours = {name: palette(i % palette.N) for i, name in enumerate(names)}
        handles = {legend_label(results[0], name): Line2D([], [], color=colours[name], marker="o", markersize=3)
                   for name in names}
        wrong = False
        for index, result in enumerate(results):
            style = LINE_STYLES[index % len(LINE_STYLES)]
            if several:
                handles[f"world size {result.config.world_size}"] = Line2D([], [], color="gray", linestyle=style)
            for name in result.implementations(op):
                wrong |= _draw(latency, busbw, result.rows(op, name), colours[name], style)
            bound = result.link.bound_gbps if result.link else None
            if bound:
                busbw.axhline(bound, linestyle=style, color="gray", linewidth=1)
                busbw.annotate(f"link {bound:.0f} GB/s (ws{result.config.world_size})", (0.01 + 0.3 * index, bound),
                               xycoords=("axes fraction", "data"), fontsize=8, color="gray", va="bottom")
        if wrong:
            handles["wrong results"] = Line2D([], [], color="red", marker="x", linestyle="none")
        fig.suptitle(title(results, op))
        latency.set(xscale="log", yscale="log", xlabel=size_label(op), ylabel="time per call (us)")
        latency.yaxis.set_major_formatter(ScalarFormatter())  # 12.5 rather than 10^1 alone
        busbw.set(xscale="log", xlabel=size_label(op), ylabel=f"busbw (GB/s) = {busbw_formula(op)}")
        for ax in (latency, busbw):
            ax.grid(True, which="both", alpha=0.3)
            _size_ticks(ax, [m.size_bytes for r in results for m in r.measurements if m.op == op])
        fig.tight_layout(rect=(0, 0, 0.8, 1))
        fig.legend(list(handles.values()), list(handles), loc="center left", bbox_to_anchor=(0.8, 0.5),
                   fontsize=8, frameon=False)
        path = out_dir / f"{prefix}-{op}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def legend_label(result: BenchResult, name: str) -> str:
    """The implementation's name; the fallback is labelled as the backend it calls."""
    if name == fallback_name():
        return f"{backend_label(result)} through symmcoll (fallback)"
    return name


def _listed(values) -> str:
    values = [str(v) for v in dict.fromkeys(values)]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def title(results: list[BenchResult], op: str) -> str:
    """What the figure shows: op, world size(s), dtype(s), timing, machine."""
    worlds = _listed(r.config.world_size for r in results)
    sizes = "world sizes" if len({r.config.world_size for r in results}) > 1 else "world size"
    machines = _listed(f"{r.provenance.gpu_name} x{r.provenance.gpu_count}" if r.provenance.gpu_name
                       else "CPU (Triton interpreter: not performance)" for r in results)
    return (f"{op}, {sizes} {worlds}, {_listed(r.config.dtype for r in results)}, "
            f"{_listed(r.config.plan.mode for r in results)} timing, {machines}")


def size_label(op: str) -> str:
    """The x axis: what a size means for ``op`` (metrics.SIZE_CONVENTION)."""
    meaning = SIZE_CONVENTION[op].split(";")[0].removeprefix("size = ")
    return f"size: {meaning}"


def busbw_formula(op: str) -> str:
    return next(part.strip().removeprefix("busbw = ") for part in SIZE_CONVENTION[op].split(";")
                if part.strip().startswith("busbw"))


def _draw(latency, busbw, rows, colour, style: str) -> bool:
    """One implementation of one run: a line through its correct rows, red crosses where results were
    wrong. Returns whether any were."""
    good = [m for m in rows if m.ok]
    bad = [m for m in rows if not m.ok and m.median_us is not None]
    if good:
        sizes = [m.size_bytes for m in good]
        line = dict(marker="o", markersize=3, color=colour, linestyle=style)
        latency.plot(sizes, [m.median_us for m in good], **line)
        busbw.plot(sizes, [m.busbw_gbps for m in good], **line)
    if bad:
        latency.scatter([m.size_bytes for m in bad], [m.median_us for m in bad], marker="x", color="red")
        busbw.scatter([m.size_bytes for m in bad], [m.busbw_gbps for m in bad], marker="x", color="red")
    return bool(bad)


def _size_ticks(ax, sizes: list[int]) -> None:
    ticks = sorted(set(sizes))
    if len(ticks) > 10:  # every other power of two keeps labels readable
        ticks = ticks[::2]
    ax.set_xticks(ticks)
    ax.set_xticklabels([format_size(s) for s in ticks], rotation=45, fontsize=8)
    ax.minorticks_off()


def plot_gemm(path: str | Path, out: str | Path | None = None) -> Path:
    """GEMM core / cuBLAS time against M, one line per (N, K) shape, from a ``bench --op gemm`` result."""
    import json

    import matplotlib
    matplotlib.use("Agg")
    from .gemm import decided_ratio
    import matplotlib.pyplot as plt

    path = Path(path)
    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if "ratio" in r]
    fig, ax = plt.subplots(figsize=(11, 6))
    palette = plt.get_cmap("tab20")
    for i, shape in enumerate(dict.fromkeys(r["shape"] for r in rows)):
        points = sorted((r["m"], decided_ratio(r)) for r in rows if r["shape"] == shape)
        n, k = next((r["n"], r["k"]) for r in rows if r["shape"] == shape)
        ax.plot(*zip(*points), marker="o", markersize=3, color=palette(i % palette.N),
                linestyle=LINE_STYLES[i // palette.N % len(LINE_STYLES)], label=f"{shape} (N={n}, K={k})")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.10, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel(f"time / cuBLAS time ({data['summary'].get('ratio', 'median over median')}; lower is better)")
    prov = data["provenance"]
    summary = data["summary"]
    ax.set_title(f"symmcoll GEMM core vs cuBLAS, {prov['gpu']}, {rows[0]['dtype'] if rows else ''}: geomean "
                 f"{summary['geomean_ratio']:.3f}, worst {summary['worst_ratio']:.3f} (git {prov['git'][:10]})")
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    fig.tight_layout()
    target = Path(out) if out else path.with_suffix(".png")
    fig.savefig(target, dpi=120)
    plt.close(fig)
    return target
