"""The tables a run prints (rich): one nccl-tests table per implementation, a side-by-side comparison
per op, and the link limit they are measured against. Everything is read from a ``BenchResult``, so a
stored result prints the same tables as the run that made it."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from .metrics import REDUCTIONS, SIZE_CONVENTION
from .results import QUANTIZED, BenchResult, Measurement
from .sizes import format_size

MISSING = "-"


def format_us(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def format_gbps(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}"


def format_percent(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def format_wrong(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def format_speedup(value: float | None) -> str:
    return MISSING if value is None else f"{value:.2f}x"


def headline(result: BenchResult) -> str:
    p, c = result.provenance, result.config
    device = f"{p.gpu_name} x{p.gpu_count}" if p.gpu_name else "CPU (Triton interpreter)"
    mode = f"graph, {c.plan.calls_per_graph} calls/graph" if c.plan.mode == "graph" else c.plan.mode
    versions = f"torch {p.torch_version}, triton {p.triton_version}"
    if p.nccl_version:
        versions += f", NCCL {p.nccl_version}"
    return (f"symmcoll bench: world size {c.world_size}, {device}, {mode}, {c.dtype}, {versions}, "
            f"git {p.git_sha[:12]}")


def link_line(result: BenchResult) -> str:
    link = result.link
    if link is None or link.bound_gbps is None:
        why = link.note if link is not None and link.note else "not measured"
        return f"Link limit: {why}; no '% link' figures."
    parts = [f"copy engine {format_gbps(link.copy_engine_gbps)} GB/s",
             f"SM pull {format_gbps(link.sm_pull_gbps)} GB/s"]
    line = (f"Link limit (this run: every rank pulls {format_size(link.bytes)} from the next rank, all at "
            f"once; slowest rank): {', '.join(parts)}; bound B = {format_gbps(link.bound_gbps)} GB/s. "
            f"'% link' = busbw / B (bound time = algbw bytes * busbw factor / B).")
    return line + (f" Note: {link.note}" if link.note else "")


def implementation_table(result: BenchResult, op: str, implementation: str) -> Table:
    rows = result.rows(op, implementation)
    c = result.config
    timing = sorted({m.timing for m in rows})
    table = Table(title=f"{op} | {describe_implementation(result, implementation)} | world size {c.world_size} | "
                        f"{c.dtype} | {'/'.join(timing)}",
                  caption=SIZE_CONVENTION[op] + "; time = slowest rank's median per call",
                  box=box.SIMPLE_HEAD, title_justify="left", caption_justify="left", pad_edge=False,
                  collapse_padding=True)
    for name in ("size", "count", "type", "redop", "time (us)", "p20-p80 (us)", "algbw (GB/s)",
                 "busbw (GB/s)", "% link", "#wrong"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("note", justify="left")
    for m in rows:
        spread = MISSING if m.p20_us is None else f"{m.p20_us:.2f}-{m.p80_us:.2f}"
        table.add_row(format_size(m.size_bytes), str(m.count), m.dtype, "sum" if op in REDUCTIONS else "none",
                      format_us(m.median_us), spread, format_gbps(m.algbw_gbps), format_gbps(m.busbw_gbps),
                      format_percent(m.link_percent), format_wrong(m.wrong), _row_note(m),
                      style="bold red" if _flagged(m) else None)
    return table


def _flagged(m: Measurement) -> bool:
    return m.error is not None or (m.wrong or 0) > 0


def _row_note(m: Measurement) -> str:
    notes = [m.note] if m.note else []
    if (m.wrong or 0) > 0:
        notes.insert(0, "WRONG RESULTS")
    if m.error:
        notes.append(m.error.splitlines()[0][:120])
    return "; ".join(notes)


# Words an implementation name is abbreviated by in the comparison table (the legend gives the names).
_NUMBER_WORDS = {"one": "1", "two": "2"}


def fallback_name() -> str:
    """symmcoll's process-group fallback as the bench names it ("symmcoll:nccl")."""
    from ..plan import BACKEND
    return f"symmcoll:{BACKEND}"


def is_symmcoll(m: Measurement) -> bool:
    """A symmcoll kernel (or "auto"); the fallback, symmcoll calling the process group's own
    collective, counts as the backend."""
    return m.family == "symmcoll" and m.implementation != fallback_name()


def backend_label(result: BenchResult) -> str:
    """The process group's backend in this run ("nccl", "gloo")."""
    return result.provenance.backend or "backend"


def describe_implementation(result: BenchResult, name: str) -> str:
    """The full name, saying what the fallback row is."""
    if name == fallback_name():
        return f"{name} ({backend_label(result)} called through symmcoll: the fallback, out of place)"
    return name


def short_names(result: BenchResult, names: list[str]) -> dict[str, str]:
    """A column header of at most 5 characters per implementation, unique within ``names``:
    symmcoll's algorithms by their initials ("sentinel_two_shot" -> "s2s", "tree" -> "tree"), torch's
    ops behind "t:", the backend by its name and the fallback as the backend's name with a "*"."""
    backend = backend_label(result)
    codes: dict[str, str] = {}
    for name in names:
        prefix, _, algorithm = name.rpartition(":")
        if name == fallback_name():
            code = f"{backend[:4]}*"
        elif not prefix:
            code = name[:5]
        else:
            words = algorithm.split("_")
            initials = "".join(_NUMBER_WORDS.get(w, w[:1]) for w in words) if len(words) > 1 else algorithm[:4]
            code = initials if prefix == "symmcoll" else f"{prefix[:1]}:{initials}"[:5]
        base, n = code, 2
        while code in codes.values():
            code, n = f"{base[:4]}{n}", n + 1
        codes[name] = code
    return codes


def format_time_short(value: float) -> str:
    """At most 5 characters while the value is below 100000 us: 3.46, 81.29 -> 81.3, 1292.14 -> 1292."""
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}"
    return f"{value:.0f}"


def comparison_table(result: BenchResult, op: str) -> Table:
    """Rows = sizes; a time column per implementation (short names, legend below); the best correct,
    exact one; the backend's time over the best; the best non-symmcoll time over the best symmcoll one;
    and for each lossy (quantized) implementation its time over symmcoll:auto's (the exact path users
    get). Fits 120 columns with every implementation of today's largest op."""
    impls = result.implementations(op)
    by_key = {(m.implementation, m.size_bytes): m for m in result.measurements if m.op == op}
    families = {m.implementation: m.family for m in result.measurements if m.op == op}
    backend = next((name for name in impls if families[name] == "backend"), None)
    lossy = [name for name in impls if families[name] == QUANTIZED]
    codes = short_names(result, impls)
    base_label = codes[backend] if backend else "backend"
    legend = ", ".join(f"{code} = {describe_implementation(result, name)}" for name, code in codes.items()
                       if code != name)
    table = Table(title=f"{op}: time per call (us), world size {result.config.world_size}, {result.config.dtype}",
                  caption=f"{legend}. '!' = wrong results (never 'best'). {base_label}/best = {base_label} "
                          f"time / best time; sc vs others = best non-symmcoll time (backend, fallback, torch) / "
                          f"best symmcoll time (>1: symmcoll faster); best and both ratios count exact "
                          f"implementations only; X/auto = lossy X's time / symmcoll:auto's (<1: X faster). "
                          f"{SIZE_CONVENTION[op]}",
                  box=box.SIMPLE_HEAD, title_justify="left", caption_justify="left", pad_edge=False,
                  collapse_padding=True)
    table.add_column("size", justify="right", no_wrap=True, min_width=4)
    for name in impls:
        table.add_column(codes[name], justify="right", no_wrap=True)
    table.add_column("best", justify="right", no_wrap=True)
    table.add_column(f"{base_label}/\nbest", justify="right", no_wrap=True)
    table.add_column("sc vs\nothers", justify="right", no_wrap=True)
    table.add_column("%link", justify="right", no_wrap=True)
    for name in lossy:
        table.add_column(f"{codes[name]}/\nauto", justify="right", no_wrap=True)
    for size in sorted({m.size_bytes for m in by_key.values()}):
        row = [by_key.get((name, size)) for name in impls]
        good = [m for m in row if m is not None and m.ok and m.family != QUANTIZED]
        best = min(good, key=lambda m: m.median_us, default=None)
        base = by_key.get((backend, size))
        mine = min((m.median_us for m in good if is_symmcoll(m)), default=None)
        others = min((m.median_us for m in good if not is_symmcoll(m)), default=None)
        auto = by_key.get(("symmcoll:auto", size))
        ratios = []
        for name in lossy:
            m = by_key.get((name, size))
            ok = m is not None and m.ok and auto is not None and auto.ok
            ratios.append(f"{m.median_us / auto.median_us:.2f}" if ok else MISSING)
        table.add_row(
            format_size(size), *(_cell(m) for m in row),
            codes[best.implementation] if best else MISSING,
            format_speedup(base.median_us / best.median_us if best and base and base.ok else None),
            format_speedup(others / mine if mine and others else None),
            format_percent(best.link_percent if best else None), *ratios)
    return table


def _cell(m: Measurement | None) -> str:
    if m is None:
        return MISSING
    if m.median_us is None:
        return "err"
    return format_time_short(m.median_us) + ("!" if (m.wrong or 0) > 0 or m.error else "")


def print_report(result: BenchResult, console: Console) -> None:
    console.print(headline(result), highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    console.print(link_line(result), highlight=False)
    for op in result.ops():
        for implementation in result.implementations(op):
            console.print(implementation_table(result, op, implementation))
        console.print(comparison_table(result, op))
