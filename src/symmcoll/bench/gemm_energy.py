"""Energy per GEMM call and the SM clock of each side of a GEMM-grid cell (bench/gemm.py), from NVML's
total energy counter (``nvmlDeviceGetTotalEnergyConsumption``: millijoules since the driver loaded,
Volta and later; bench/gpu_state.py ``Reader.meter``).

Why (issue 22, 2026-11-28-grid-gpu-state-h100): on one H100, 208 of the grid's 234 cells ended at the
700 W power cap, the SM clock fell to 1260-1575 MHz at M >= 8192, and from M = 1024 ours / cuBLAS is
1.013-1.025 (0.975 at M <= 64). The hypothesis: at the cap, the kernel that spends less energy per GEMM
(cuBLAS's Hopper kernels multicast operands by TMA over a CTA cluster: less L2 -> SM traffic, which
triton 3.6 cannot do) runs at a higher clock and wins. Recorded per cell and side:

* every round (``round_fields``): the counter and the SM clock read right before and right after the
  side's timed replays (bench/gemm_timing.py ``metered_replays``: after the synchronize that ends the
  warm-up replays, before the first timing event; after the synchronize that ends the timed replays),
  so a delta holds that side's timed replays and the few microseconds around them. Energy per call =
  delta / (timed replays x calls per graph); the side's clock is the mean of its two reads.
* The counter is not continuous: it steps every P (about 10 ms on a 2019 GPU, 20-100 ms on newer ones
  as published), so a delta over a window W is off by up to one step's energy, P / W of it. The run
  measures P first (``probe_counter``: the counter polled for PROBE_S while one kernel spins). A round's
  energy counts where its window is >= ROUND_PERIODS x P (error < 25%, ~10% one sigma, which a median
  over rounds shrinks) and the delta > 0 (0: no step inside; < 0: a counter that wrapped); else None,
  the raw delta and window kept (``energy_rounds``). On the 2026-11-28 grid a side's round lasted
  1.5-66 ms (median 9), so at P >= 17 ms no round counts: hence
* energy windows (``polled_window``; ``symmcoll bench --op gemm --energy-window-s S``, off by default):
  after a cell's rounds (its timings untouched), each side's graph replayed back to back for at least
  WINDOW_PERIODS steps while the host polls the counter. Its power is the energy between the counter's
  steps inside the window over the time between them (the first step's interval left out: it may hold
  the previous side's tail and the clock's settling), its time per call from CUDA events around the
  window, energy per call = power x time per call; the clock is read at every step.

Reading it: under a binding power cap both sides draw the cap, so energy per call is cap x time per call
and the energy ratio follows the time ratio whatever makes a kernel slower. The clock separates the
causes: ``cycles_ratio`` = time ratio x clock ratio (cycles per call, ours over cuBLAS's). A time ratio
above 1 with the clock ratio below 1 and cycles_ratio ~1 at the same power: our kernel spends more
energy per cycle and the cap takes it out of the clock (the hypothesis). Clock ratio ~1: ours needs
more cycles at the same clock (something else). Where the cap does not bind (small M), power differs
and the energy ratio speaks for itself.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

# A round's energy counts where its window lasts at least this many counter steps (error < 1/ROUND_PERIODS).
ROUND_PERIODS = 4
# The step assumed where the probe saw none: the coarsest published (Zeus: ~100 ms; PETSc: 20-100 ms).
DEFAULT_PERIOD_S = 0.1
# The probe polls this long: >= 6 steps of the coarsest period.
PROBE_S = 0.6
# Host pause between two polls: a step's time is known to about this plus one read (~tens of us), <= 1%
# of the >= 2 steps an energy window's power is taken over.
POLL_S = 2e-4
# An energy window lasts at least this many steps (the first interval left out: >= 3 intervals used).
WINDOW_PERIODS = 5
# An energy window's replays are launched in chunks of about CHUNK_S, IN_FLIGHT chunks queued, so the
# GPU never idles while the host polls, and the queue of launches stays short.
CHUNK_S, IN_FLIGHT = 0.02, 3
# The cells whose sides get energy windows when asked (``--energy-m``): two a band of M at most.
ENERGY_WINDOW_M = (16, 256, 1024, 4096, 16384)
# The summary's bands of M: (label, lowest M excluded, highest M included).
BANDS = (("<= 64", 0, 64), ("128-512", 64, 512), ("1024-4096", 512, 4096), (">= 8192", 4096, math.inf))


@dataclass(frozen=True)
class CounterProbe:
    """What the run learnt of the counter before the grid: the median time between its steps and the
    median step, how many steps it saw, what a read costs (``Reader.meter``: two NVML queries); or why
    it is not there (``unavailable``)."""

    period_s: float | None = None
    step_mj: float | None = None
    steps: int = 0
    read_us: float | None = None
    read_us_max: float | None = None
    unavailable: str | None = None

    @property
    def min_round_s(self) -> float:
        """The shortest round window whose energy counts."""
        return ROUND_PERIODS * (self.period_s or DEFAULT_PERIOD_S)

    def window_s(self, asked: float) -> float:
        """An energy window's length: ``asked``, at least WINDOW_PERIODS steps; 0 (none) where nothing was
        asked or there is no counter to poll."""
        if asked <= 0 or self.unavailable:
            return 0.0
        return max(asked, WINDOW_PERIODS * (self.period_s or DEFAULT_PERIOD_S))

    def as_dict(self) -> dict:
        return dict(asdict(self), min_round_s=self.min_round_s)


def probe_counter(meter: Callable[[], dict | None], seconds: float = PROBE_S,
                  busy: Callable[[float, int | None], Callable[[], object]] | None = None,
                  sleep: Callable[[float], object] = time.sleep) -> CounterProbe:
    """The counter polled for ``seconds`` (``busy(seconds, mhz)`` keeps the GPU working meanwhile and
    gives what waits for it): when it steps and by how much."""
    first = meter()
    if first is None:
        return CounterProbe(unavailable="no NVML")
    if first["mj"] is None:
        return CounterProbe(unavailable="NVML gives no total energy counter on this GPU")
    done = busy(seconds, first.get("sm_mhz")) if busy else None
    changes, costs = [first], []
    while True:
        reading = meter()
        costs.append(reading["read_us"])
        if reading["mj"] is not None and reading["mj"] != changes[-1]["mj"]:
            changes.append(reading)
        if reading["t_s"] - first["t_s"] >= seconds:
            break
        sleep(POLL_S)
    if done:
        done()
    steps = changes[1:]  # (the first change ends a step that began before the probe)
    gaps = [b["t_s"] - a["t_s"] for a, b in zip(steps, steps[1:])]
    sizes = [b["mj"] - a["mj"] for a, b in zip(steps, steps[1:])]
    return CounterProbe(period_s=statistics.median(gaps) if gaps else None,
                        step_mj=statistics.median(sizes) if sizes else None, steps=len(steps),
                        read_us=statistics.median(costs) if costs else None, read_us_max=max(costs, default=None))


def spin_gpu(seconds: float, mhz: int | None) -> Callable[[], object]:
    """One kernel spinning on the GPU for about ``seconds`` at ``mhz``; gives what waits for it."""
    import torch
    torch.cuda._sleep(int(seconds * (mhz or 1980) * 1e6))
    return torch.cuda.synchronize


def announce(unavailable: str | None, probe: CounterProbe, window_s: float, window_ms: Sequence[int]) -> str:
    """The bench's one line on energy: why nothing, or the counter's step, a read's cost and the windows."""
    if unavailable:
        return f"energy per GEMM and SM clock per side not recorded: {unavailable}"
    windows = (f"energy windows of {probe.window_s(window_s):.2f} s a side at M in {list(window_ms)}"
               if window_s > 0 else "no energy windows (--energy-window-s)")
    if probe.unavailable:
        return f"energy per GEMM not recorded: {probe.unavailable}; SM clock per side recorded"
    step = (f"steps every {probe.period_s * 1e3:.1f} ms ({probe.step_mj:g} mJ)" if probe.period_s
            else f"no two steps seen in {PROBE_S:g} s (assumed {DEFAULT_PERIOD_S * 1e3:g} ms)")
    return (f"energy counter {step}, read {probe.read_us:g} us (max {probe.read_us_max:g}); a round's energy "
            f"counts from {probe.min_round_s * 1e3:.0f} ms; {windows}")


# ---- per round: the reads around each side's timed replays ------------------------------------------

def side_round(before: dict | None, after: dict | None, calls: int, min_window_s: float) -> dict:
    """One side's round from its two reads: the raw delta (``mj``), the wall time between them (``s``),
    the calls in it, the clock at each read, their mean, and energy per call where it counts."""
    def get(reading, key):
        return None if reading is None else reading.get(key)
    mj = after["mj"] - before["mj"] if get(before, "mj") is not None and get(after, "mj") is not None else None
    s = after["t_s"] - before["t_s"] if before is not None and after is not None else None
    counts = mj is not None and mj > 0 and s is not None and s >= min_window_s
    clocks = [get(before, "sm_mhz"), get(after, "sm_mhz")]
    known = [c for c in clocks if c is not None]
    return dict(mj=mj, s=None if s is None else round(s, 6), calls=calls, sm_mhz=clocks,
                mean_mhz=sum(known) / len(known) if known else None, mj_per_call=mj / calls if counts else None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


ROUND_KEYS = ("energy_rounds", "round_mj_per_call", "round_cublas_mj_per_call", "round_sm_mhz",
              "round_cublas_sm_mhz", "mj_per_call", "cublas_mj_per_call", "sm_mhz", "cublas_sm_mhz",
              "round_energy_ratios", "energy_ratio", "round_clock_ratios", "clock_ratio", "cycles_ratio")


def round_fields(meters: dict | None, calls: int, min_window_s: float, round_us: Sequence[float],
                 round_cublas_us: Sequence[float]) -> dict:
    """A timed row's energy and clock fields from each side's (before, after) reads per round
    (``meters``: side -> [(before, after), ...], aligned with the round medians ``round_us`` and
    ``round_cublas_us``): per round and side energy per call and mean clock, their medians, and the
    medians of the per-round ratios ours / cuBLAS (energy, clock, and time x clock: ``cycles_ratio``).
    Every field None without a read (no NVML)."""
    if not meters or not any(r is not None for pair in meters.get("ours", ()) for r in pair):
        return dict.fromkeys(ROUND_KEYS)
    ours = [side_round(b, a, calls, min_window_s) for b, a in meters["ours"]]
    theirs = [side_round(b, a, calls, min_window_s) for b, a in meters["cublas"]]
    energy, cublas_energy = [w["mj_per_call"] for w in ours], [w["mj_per_call"] for w in theirs]
    clock, cublas_clock = [w["mean_mhz"] for w in ours], [w["mean_mhz"] for w in theirs]
    energy_ratios = [_ratio(a, b) for a, b in zip(energy, cublas_energy)]
    clock_ratios = [_ratio(a, b) for a, b in zip(clock, cublas_clock)]
    cycles = [t * f if t is not None and f is not None else None
              for t, f in zip((_ratio(a, b) for a, b in zip(round_us, round_cublas_us)), clock_ratios)]
    return dict(energy_rounds=dict(ours=ours, cublas=theirs, min_window_s=min_window_s),
                round_mj_per_call=energy, round_cublas_mj_per_call=cublas_energy, round_sm_mhz=clock,
                round_cublas_sm_mhz=cublas_clock, mj_per_call=_median(energy),
                cublas_mj_per_call=_median(cublas_energy),
                sm_mhz=_median(clock), cublas_sm_mhz=_median(cublas_clock), round_energy_ratios=energy_ratios,
                energy_ratio=_median(energy_ratios), round_clock_ratios=clock_ratios, clock_ratio=_median(clock_ratios),
                cycles_ratio=_median(cycles))


# ---- energy windows: one side replayed back to back, the counter polled -----------------------------

def polled_window(replay: Callable[[], None], calls_per_replay: int, replay_s: float, seconds: float,
                  meter: Callable[[], dict | None], new_event=None, synchronize=None,
                  sleep: Callable[[float], object] = time.sleep) -> dict | None:
    """``replay`` (one graph replay: ``calls_per_replay`` calls, about ``replay_s``) back to back for
    about ``seconds`` while the host polls ``meter``: the GPU time per call (events around all replays),
    the counter's steps inside, the power between the second and the last (None with fewer than 3),
    energy per call = power x time per call, and the mean clock at those steps."""
    if new_event is None or synchronize is None:
        import torch
        new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        synchronize = synchronize or torch.cuda.synchronize
    per_chunk = max(1, math.ceil(CHUNK_S / max(replay_s, 1e-7)))
    chunks = max(IN_FLIGHT, math.ceil(seconds / (per_chunk * max(replay_s, 1e-7))))
    synchronize()
    changes = [meter()]
    if changes[0] is None:
        return None
    start, end, pending = new_event(), new_event(), []
    start.record()
    for launched in range(1, chunks + 1):
        for _ in range(per_chunk):
            replay()
        if launched == chunks:
            end.record()
        pending.append(new_event())
        pending[-1].record()
        while len(pending) >= IN_FLIGHT or (launched == chunks and pending):
            if pending[0].query():
                pending.pop(0)
                continue
            reading = meter()
            if reading["mj"] is not None and reading["mj"] != changes[-1]["mj"]:
                changes.append(reading)
            sleep(POLL_S)
    end.synchronize()
    calls = chunks * per_chunk * calls_per_replay
    us_per_call = start.elapsed_time(end) * 1e3 / calls
    steps = changes[2:]  # (the first change closes a step begun before the window; the next interval left out)
    watts = ((steps[-1]["mj"] - steps[0]["mj"]) / (steps[-1]["t_s"] - steps[0]["t_s"]) / 1e3
             if len(steps) >= 2 and steps[-1]["t_s"] > steps[0]["t_s"] else None)
    clocks = [r["sm_mhz"] for r in steps if r.get("sm_mhz") is not None]
    return dict(s=round(us_per_call * calls * 1e-6, 4), calls=calls, us_per_call=us_per_call, steps=len(changes) - 1,
                watts=watts, mj_per_call=None if watts is None else watts * us_per_call * 1e-3,
                sm_mhz=sum(clocks) / len(clocks) if clocks else None)


def window_fields(windows: dict) -> dict:
    """A cell's energy windows (side -> ``polled_window``) with the ratios ours / cuBLAS: time per call,
    power, energy per call, clock, and time x clock (``cycles_ratio``)."""
    ours, theirs = windows.get("ours") or {}, windows.get("cublas") or {}

    def ratio(key):
        return _ratio(ours.get(key), theirs.get(key))
    time_ratio, clock_ratio = ratio("us_per_call"), ratio("sm_mhz")
    return dict(ours=ours or None, cublas=theirs or None, time_ratio=time_ratio, power_ratio=ratio("watts"),
                energy_ratio=ratio("mj_per_call"), clock_ratio=clock_ratio,
                cycles_ratio=time_ratio * clock_ratio if time_ratio and clock_ratio else None)


def pair_fields(pair, counter: CounterProbe, row: dict) -> dict:
    """A timed row's energy fields from its ``gemm_timing.PairTiming``: ``round_fields`` (the row's
    ``round_us`` / ``round_cublas_us`` already in it) and ``energy_window`` where windows ran."""
    plan = pair.plan
    fields = round_fields(pair.meters, plan.per_round * plan.calls_per_graph, counter.min_round_s, row["round_us"],
                          row["round_cublas_us"])
    return dict(fields, energy_window=window_fields(pair.windows)) if pair.windows else fields


# ---- the grid's summary and a cell's log line ---------------------------------------------------------

def _geomean(values: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _correlation(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Pearson's r of the logs of ``pairs`` (None with fewer than 3 or no spread)."""
    if len(pairs) < 3:
        return None
    try:
        return statistics.correlation([math.log(a) for a, _ in pairs], [math.log(b) for _, b in pairs])
    except statistics.StatisticsError:
        return None


def _within_cells(cells: Sequence[Sequence[tuple[float, float]]]) -> float | None:
    """Pearson's r of per-round log ratios, each cell's mean taken out (the rounds' co-movement, not the
    cells' differences)."""
    xs, ys = [], []
    for pairs in (c for c in cells if len(c) >= 2):
        logs = [(math.log(a), math.log(b)) for a, b in pairs]
        mx, my = statistics.fmean(x for x, _ in logs), statistics.fmean(y for _, y in logs)
        xs += [x - mx for x, _ in logs]
        ys += [y - my for _, y in logs]
    try:
        return statistics.correlation(xs, ys) if len(xs) >= 3 else None
    except statistics.StatisticsError:
        return None


def _round_pairs(row: dict, key: str) -> list[tuple[float, float]]:
    """(time ratio, ``key``'s ratio) of each round where both are known."""
    times = [_ratio(a, b) for a, b in zip(row.get("round_us") or (), row.get("round_cublas_us") or ())]
    return [(t, e) for t, e in zip(times, row.get(key) or ()) if t and e]


def summarize(rows: Sequence[dict], ratio_of: Callable[[dict], float]) -> dict | None:
    """By band of M (BANDS): the geomean time ratio of the band's timed rows (``ratio_of``) beside the
    geomean energy, clock and cycles ratios of those that have them (rounds; ``window_*``: energy
    windows), and the correlation of the per-round time ratio with the energy ratio and with the clock
    ratio (all rounds pooled; ``*_within_cells``: each cell's mean out). None where no row was metered."""
    metered = [r for r in rows if r.get("energy_rounds")]
    if not metered:
        return None

    def geo(band, get):
        values = [v for v in map(get, band) if v]
        return dict(cells=len(values), geomean=_geomean(values))
    bands = []
    for label, low, high in BANDS:
        band = [r for r in rows if low < r["m"] <= high]
        window = [r.get("energy_window") or {} for r in band]
        bands.append(dict(m=label, cells=len(band), time_ratio=_geomean([ratio_of(r) for r in band]),
                          energy_ratio=geo(band, lambda r: r.get("energy_ratio")),
                          clock_ratio=geo(band, lambda r: r.get("clock_ratio")),
                          cycles_ratio=geo(band, lambda r: r.get("cycles_ratio")),
                          **{f"window_{key}": geo(window, lambda w, key=key: w.get(key))
                             for key in ("time_ratio", "energy_ratio", "clock_ratio", "cycles_ratio")}))
    energy = [_round_pairs(r, "round_energy_ratios") for r in metered]
    clock = [_round_pairs(r, "round_clock_ratios") for r in metered]
    return dict(bands=bands, metered_cells=len(metered), rounds=sum(len(r.get("round_us") or ()) for r in metered),
                energy_rounds=sum(map(len, energy)), time_energy_correlation=_correlation(sum(energy, [])),
                time_energy_correlation_within_cells=_within_cells(energy),
                time_clock_correlation=_correlation(sum(clock, [])),
                time_clock_correlation_within_cells=_within_cells(clock))


def describe(summary: dict | None) -> str:
    """The summary's bands in one line: 'energy by M: <= 64 time x0.975 E x0.981 f x1.000 cycles x0.975
    (E of 18/18 cells, window E x0.98 f x1.00 of 4) | ...'."""
    if not summary:
        return "energy by M: not recorded"

    def x(value: float | None) -> str:
        return "-" if value is None else f"x{value:.3f}"
    bands = [f"{b['m']} time {x(b['time_ratio'])} E {x(b['energy_ratio']['geomean'])} "
             f"f {x(b['clock_ratio']['geomean'])} cycles {x(b['cycles_ratio']['geomean'])} "
             f"(E of {b['energy_ratio']['cells']}/{b['cells']} cells, "
             f"window E {x(b['window_energy_ratio']['geomean'])} f {x(b['window_clock_ratio']['geomean'])} "
             f"of {b['window_energy_ratio']['cells']})"
             for b in summary["bands"] if b["cells"]]
    r = summary.get("time_energy_correlation")
    return (f"energy by M: {' | '.join(bands)}; per-round time vs energy ratio r = {'-' if r is None else f'{r:.2f}'}"
            f" ({summary['energy_rounds']} of {summary['rounds']} rounds)")


def tag(row: dict) -> str | None:
    """A cell's energy and clock for its log line: 'E x1.031 f x0.982', the energy window's after 'window'."""
    def part(fields: dict) -> list[str]:
        return [f"{name} x{fields[key]:.3f}" for name, key in (("E", "energy_ratio"), ("f", "clock_ratio"))
                if fields.get(key)]
    window = part(row.get("energy_window") or {})
    return " ".join(part(row) + (["window"] + window if window else [])) or None
