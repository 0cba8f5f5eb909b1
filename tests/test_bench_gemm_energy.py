"""Energy per GEMM call and SM clock of each side of a GEMM-grid cell (bench/gemm_energy.py) on a fake
NVML and a simulated GPU (no GPU here): where the counter is read in a round, the fields a row gets,
what is None and why, the energy windows' polling, the counter's probe and the grid's summary by band."""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace

import pytest
import torch
from bench_fixtures import gemm_grid_on_cpu

from symmcoll.bench import gemm, gemm_energy, gemm_timing, gpu_state
from symmcoll.bench.gemm_energy import CounterProbe, round_fields, side_round

REPLAYS = 10 * gemm.REPLAYS_PER_ITER


class SimulatedGpu:
    """A GPU that runs one side at a time at that side's power and clock: its NVML energy counter steps
    every ``step_s`` (None: continuous), holding the energy at the last step."""

    def __init__(self, step_s: float | None):
        self.now, self.energy_mj, self.reported_mj, self.step_s = 0.0, 1e6, 1e6, step_s
        self.mhz, self.log = 1980, []

    def run(self, seconds: float, watts: float, mhz: int) -> None:
        self.mhz = mhz
        while seconds > 1e-12:
            to_step = seconds
            if self.step_s:
                to_step = (math.floor(self.now / self.step_s + 1e-9) + 1) * self.step_s - self.now
            part = min(seconds, to_step)
            self.now, self.energy_mj, seconds = self.now + part, self.energy_mj + watts * part * 1e3, seconds - part
            if not self.step_s or part == to_step:
                self.reported_mj = self.energy_mj


class FakeNvml:
    """What gpu_state.Reader asks of pynvml, answered from a SimulatedGpu (``energy=False``: the total
    energy counter NotSupported)."""

    NVML_CLOCK_SM = 1

    def __init__(self, gpu: SimulatedGpu, energy: bool = True):
        self.gpu, self.energy = gpu, energy

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.energy:
            raise RuntimeError("NVMLError_NotSupported")
        self.gpu.log.append("read")
        return int(round(self.gpu.reported_mj))

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == self.NVML_CLOCK_SM
        return self.gpu.mhz


# ours: 10.5 ms a call at 1400 MHz, cuBLAS 10.0 ms at 1470 MHz, both at the 700 W cap (issue 22's hypothesis)
SIDES = {"o": (10_500.0, 700.0, 1400), "c": (10_000.0, 700.0, 1470)}


def _simulated_pair(monkeypatch, step_s: float | None, energy: bool = True, window_s: float = 0.0):
    """time_pair with the counter read around every side's timed replays, on a SimulatedGpu."""
    gpu = SimulatedGpu(step_s)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpu, energy))
    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", lambda device: device.index)
    monkeypatch.setattr(gpu_state, "time", SimpleNamespace(perf_counter=lambda: gpu.now))
    reader = gpu_state.open_reader(torch.device("cuda", 0))

    class Captured:
        def __init__(self, side, calls):
            self.side, self.calls = side, calls

        def replay(self):
            us, watts, mhz = SIDES[self.side]
            gpu.log.append(f"replay {self.side}")
            gpu.run(us * self.calls * 1e-6, watts, mhz)

    def timed(step, samples, per, isolated):
        assert not isolated
        gpu.log.append("events")
        for _ in range(samples):
            step()
        return [SIDES[step.__self__.side][0]] * samples
    monkeypatch.setattr(gemm_timing, "eager_pass_us", lambda calls: SIDES[calls[0]()][0] * len(calls))
    monkeypatch.setattr(gemm_timing, "capture_passes", lambda calls, passes: Captured(calls[0](), passes * len(calls)))
    monkeypatch.setattr(gemm_timing, "event_times_us", timed)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: gpu.log.append("sync"))
    pair = gemm_timing.time_pair({"ours": [lambda: "o"], "cublas": [lambda: "c"]}, 1, REPLAYS, meter=reader.meter,
                                 window_s=window_s)
    return gpu, pair


def test_gemm_energy_is_read_around_each_sides_timed_replays_and_fills_the_row(monkeypatch):
    """Every turn of every round: the warm-up replays, a synchronize, a read, the timed replays (events),
    a read -- nothing else between the reads. Energy per call from the deltas (700 W x 10.5 / 10.0 ms),
    the clocks, their medians and the ratios ours / cuBLAS: energy 1.05, clock 1400/1470, cycles 1.0."""
    gpu, pair = _simulated_pair(monkeypatch, step_s=None)
    plan = pair.plan
    assert plan.calls_per_graph == 1 and plan.warmup == 1 and plan.rounds == 5
    turn = ["replay {s}", "sync", "read", "events"] + ["replay {s}"] * plan.per_round + ["read"]
    sides = ["o", "c", "c", "o", "o", "c", "c", "o", "o", "c"]
    assert gpu.log == [step.format(s=s) for s in sides for step in turn]
    assert [len(pair.meters[side]) for side in ("ours", "cublas")] == [plan.rounds] * 2
    calls = plan.per_round * plan.calls_per_graph
    row = gemm.cell_fields(SimpleNamespace(flops=1.0, weight_bytes=1), pair.round_medians("ours"),
                           pair.round_medians("cublas"))
    row.update(gemm_energy.pair_fields(pair, CounterProbe(period_s=0.01), row))
    assert "energy_window" not in row and pair.windows is None
    assert row["round_mj_per_call"] == pytest.approx([7350.0] * 5) and row["mj_per_call"] == pytest.approx(7350.0)
    assert row["cublas_mj_per_call"] == pytest.approx(7000.0)
    assert row["round_sm_mhz"] == [1400] * 5 and row["cublas_sm_mhz"] == 1470
    assert row["energy_ratio"] == pytest.approx(1.05) and row["round_energy_ratios"] == pytest.approx([1.05] * 5)
    assert row["clock_ratio"] == pytest.approx(1400 / 1470) and row["cycles_ratio"] == pytest.approx(1.05 * 1400 / 1470)
    raw = row["energy_rounds"]["ours"][0]
    assert raw["mj"] == pytest.approx(7350.0 * calls) and raw["s"] == pytest.approx(0.0105 * calls)
    assert raw["calls"] == calls and raw["sm_mhz"] == [1400, 1400]
    assert json.loads(json.dumps(row))["energy_ratio"] == pytest.approx(1.05)
    assert gemm_energy.tag(row) == "E x1.050 f x0.952"


def test_gemm_energy_windows_follow_the_rounds_in_the_next_rounds_order(monkeypatch):
    """With window_s, after the last round each side's captured graph goes to polled_window, the side
    the next round would start with first, its replay's length from the rounds (10.5 / 10.0 ms a call);
    the row gets both windows and their ratios."""
    calls = []

    def polled(replay, calls_per_replay, replay_s, seconds, meter):
        calls.append((replay.__self__.side, calls_per_replay, replay_s, seconds, meter.__name__))
        us = 1e6 * replay_s / calls_per_replay
        return dict(us_per_call=us, watts=700.0, mj_per_call=700.0 * us * 1e-3, sm_mhz={"o": 1400, "c": 1470}[
            replay.__self__.side])
    monkeypatch.setattr(gemm_energy, "polled_window", polled)
    _, pair = _simulated_pair(monkeypatch, step_s=None, window_s=0.5)
    assert pair.plan.rounds == 5 and list(pair.windows) == ["cublas", "ours"]  # (round 5 of 0-4: cuBLAS first)
    assert calls == [("c", 1, pytest.approx(0.010), 0.5, "meter"), ("o", 1, pytest.approx(0.0105), 0.5, "meter")]
    row = dict(round_us=pair.round_medians("ours"), round_cublas_us=pair.round_medians("cublas"))
    window = gemm_energy.pair_fields(pair, CounterProbe(period_s=0.01), row)["energy_window"]
    assert window["energy_ratio"] == pytest.approx(1.05) and window["clock_ratio"] == pytest.approx(1400 / 1470)
    assert window["power_ratio"] == 1.0 and window["cycles_ratio"] == pytest.approx(1.05 * 1400 / 1470)


def test_gemm_energy_is_none_where_the_counter_cannot_tell(monkeypatch):
    """A counter that steps every 25 ms: the rounds' windows (60-63 ms) are shorter than 4 steps, so no
    round's energy counts -- the raw deltas are kept, the clocks still give their ratio. A delta of 0 (no
    step inside), a negative one (a counter that wrapped), a missing read: None. No counter at all
    (NotSupported): energy None, clock kept; no NVML: every field None."""
    gpu, pair = _simulated_pair(monkeypatch, step_s=0.025)
    probe = CounterProbe(period_s=0.025)
    calls = pair.plan.per_round
    row = round_fields(pair.meters, calls, probe.min_round_s, pair.round_medians("ours"), pair.round_medians("cublas"))
    assert probe.min_round_s == pytest.approx(0.1)
    assert row["round_mj_per_call"] == [None] * 5 and row["mj_per_call"] is None and row["energy_ratio"] is None
    assert all(w["mj"] in (35000, 52500) for w in row["energy_rounds"]["ours"])  # (2 or 3 steps of 700 W x 25 ms)
    assert row["clock_ratio"] == pytest.approx(1400 / 1470) and gemm_energy.tag(row) == "f x0.952"
    at = dict(t_s=1.0, mj=5000, sm_mhz=1500)
    assert side_round(at, dict(at, t_s=2.0), 10, 0.1)["mj_per_call"] is None  # no step in a second
    assert side_round(at, dict(at, t_s=2.0, mj=4000), 10, 0.1)["mj_per_call"] is None  # wrapped
    assert side_round(at, dict(at, t_s=2.0, mj=6000), 10, 0.1)["mj_per_call"] == 100.0
    assert side_round(None, dict(at, t_s=2.0), 10, 0.1) == dict(mj=None, s=None, calls=10, sm_mhz=[None, 1500],
                                                              mean_mhz=1500, mj_per_call=None)
    _, unsupported = _simulated_pair(monkeypatch, step_s=None, energy=False)
    row = round_fields(unsupported.meters, calls, 0.04, unsupported.round_medians("ours"),
                       unsupported.round_medians("cublas"))
    assert row["energy_ratio"] is None and row["energy_rounds"]["ours"][0]["mj"] is None
    assert row["clock_ratio"] == pytest.approx(1400 / 1470)
    assert round_fields(None, calls, 0.04, [1.0], [1.0]) == dict.fromkeys(gemm_energy.ROUND_KEYS)
    unread = {"ours": [(None, None)], "cublas": [(None, None)]}
    assert round_fields(unread, calls, 0.04, [1.0], [1.0])["clock_ratio"] is None


def test_gemm_energy_probe_measures_the_counters_step_and_what_a_read_costs():
    """The probe polls the counter: a step of 140 mJ every 20 ms is seen as such; a round then counts
    from 80 ms and an energy window lasts >= 5 steps; a GPU without the counter, or no NVML, says so."""
    clock = SimpleNamespace(t=0.003)

    def meter():
        clock.t += 50e-6
        return dict(t_s=clock.t, mj=1000 + 140 * math.floor(clock.t / 0.02), sm_mhz=1980, read_us=50.0)
    busy = []

    def spin(seconds, mhz):
        busy.append((seconds, mhz))
        return lambda: busy.append("waited")
    probe = gemm_energy.probe_counter(meter, seconds=0.1, busy=spin, sleep=lambda s: setattr(clock, "t", clock.t + s))
    assert busy == [(0.1, 1980), "waited"]
    assert probe.period_s == pytest.approx(0.02, rel=0.02) and probe.step_mj == 140 and probe.steps == 5
    assert probe.read_us == 50.0 and probe.min_round_s == pytest.approx(0.08, rel=0.02)
    assert probe.window_s(0.05) == pytest.approx(0.1, rel=0.02) and probe.window_s(0.3) == 0.3
    assert probe.window_s(0) == 0
    line = gemm_energy.announce(None, probe, 0.3, (16, 16384))
    assert line.startswith("energy counter steps every 20.0 ms (140 mJ), read 50 us") and "at M in [16, 16384]" in line
    none = gemm_energy.probe_counter(lambda: dict(t_s=0.0, mj=None, sm_mhz=1980, read_us=1.0))
    assert none.unavailable == "NVML gives no total energy counter on this GPU" and none.window_s(0.3) == 0
    assert gemm_energy.announce(None, none, 0.3, (16,)).startswith("energy per GEMM not recorded: NVML gives no")
    missing = gemm_energy.probe_counter(lambda: None)
    assert missing.unavailable == "no NVML" and missing.min_round_s == pytest.approx(0.4)  # (100 ms assumed)
    assert gemm_energy.announce("pynvml not importable", missing, 0, ()) == (
        "energy per GEMM and SM clock per side not recorded: pynvml not importable")


class _WindowGpu:
    """Host time, a GPU queue and a counter that steps every 20 ms reporting the energy 5 ms before the
    step (a lag): 3500 W before the window (the previous side), 700 W inside."""

    def __init__(self, start: float):
        self.t = self.queue = start
        self.start = start

    def energy(self, at: float) -> float:
        before = min(at, self.start)
        return 3500.0 * before + 700.0 * max(0.0, at - self.start)  # mJ: W x s x 1e3 / 1e3

    def meter(self):
        self.t += 50e-6
        return dict(t_s=self.t, mj=1e3 * self.energy(math.floor(self.t / 0.02 + 1e-9) * 0.02 - 0.005), sm_mhz=1500,
                    read_us=50.0)

    def event(self):
        gpu = self

        class Event:
            def record(self):
                self.at = max(gpu.queue, gpu.t)

            def query(self):
                return gpu.t >= self.at

            def synchronize(self):
                gpu.t = max(gpu.t, self.at)

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3
        return Event()


def test_gemm_energy_window_polls_the_counter_while_one_side_replays():
    """An energy window of 0.1 s of 1 ms replays (4 calls each): launched in chunks of 20 ms with the
    counter polled meanwhile, the GPU never idle; power from the second step on (the first step's
    interval holds the previous side's 3500 W: left out), energy per call = 700 W x 250 us; then a cell's
    two windows as ratios."""
    gpu = _WindowGpu(start=0.018)

    def replay():
        gpu.queue = max(gpu.queue, gpu.t) + 0.001
    window = gemm_energy.polled_window(replay, 4, 0.001, 0.1, gpu.meter, new_event=gpu.event,
                                       synchronize=lambda: None, sleep=lambda s: setattr(gpu, "t", gpu.t + s))
    assert window["calls"] == 400 and window["us_per_call"] == pytest.approx(250.0)
    assert window["s"] == pytest.approx(0.1)
    assert window["steps"] == 5 and window["watts"] == pytest.approx(700.0, rel=1e-3)
    assert window["mj_per_call"] == pytest.approx(175.0, rel=1e-3) and window["sm_mhz"] == 1500
    assert gpu.t == pytest.approx(0.118, abs=1e-3)  # (polled until the last replay ended, no later)
    theirs = dict(window, us_per_call=240.0, watts=700.0, mj_per_call=168.0, sm_mhz=1560)
    fields = gemm_energy.window_fields({"cublas": theirs, "ours": window})
    assert fields["time_ratio"] == pytest.approx(250 / 240)
    assert fields["energy_ratio"] == pytest.approx(175 / 168, rel=1e-3)
    assert fields["clock_ratio"] == pytest.approx(1500 / 1560)
    assert fields["cycles_ratio"] == pytest.approx(250 / 240 * 1500 / 1560)
    assert fields["power_ratio"] == pytest.approx(1.0, rel=1e-3)
    assert gemm_energy.tag(dict(energy_window=fields)) == "window E x1.042 f x0.962"


def _row(m, time_ratios, energy_ratios, clock_ratios, window=None):
    cublas = [100.0] * len(time_ratios)
    return dict(shape="s", m=m, weight_mb=1.0, ratio=1.0, ratio_paired=time_ratios[0],
                round_us=[100.0 * t for t in time_ratios],
                round_cublas_us=cublas, energy_rounds=dict(ours=[], cublas=[]), round_energy_ratios=energy_ratios,
                energy_ratio=None if None in energy_ratios else sorted(energy_ratios)[len(energy_ratios) // 2],
                round_clock_ratios=clock_ratios, clock_ratio=clock_ratios[0],
                cycles_ratio=time_ratios[0] * clock_ratios[0],
                energy_window=window)


def test_gemm_energy_summary_by_band_of_m_beside_the_time_ratio():
    """The summary: each band's geomean time ratio over its rows, beside the geomean energy / clock /
    cycles ratio of the rows that have one (and the energy windows'); the per-round correlation of time
    and energy ratios, pooled and within cells; None where no row was metered (no NVML)."""
    rows = [_row(16, [0.97, 0.98, 0.99], [0.96, 0.98, 1.0], [1.0, 1.0, 1.0]),
            _row(256, [1.0, 1.0, 1.0], [None, None, None], [1.0, 1.0, 1.0]),
            _row(2048, [1.02, 1.03, 1.04], [1.02, 1.03, 1.04], [0.98, 0.97, 0.96], window=dict(energy_ratio=1.03)),
            _row(16384, [1.01, 1.02, 1.03], [1.01, 1.02, 1.03], [0.99, 0.98, 0.97], window=dict(energy_ratio=1.01)),
            _row(8192, [1.02, 1.02, 1.02], [1.0, 1.1, 1.2], [0.98, 0.98, 0.98])]
    summary = gemm_energy.summarize(rows, gemm.decided_ratio)
    bands = {b["m"]: b for b in summary["bands"]}
    assert list(bands) == ["<= 64", "128-512", "1024-4096", ">= 8192"]
    assert bands["<= 64"]["cells"] == 1 and bands["<= 64"]["time_ratio"] == pytest.approx(0.97)
    assert bands["<= 64"]["energy_ratio"] == dict(cells=1, geomean=pytest.approx(0.98))
    assert bands["128-512"]["energy_ratio"] == dict(cells=0, geomean=None) and bands["128-512"]["time_ratio"] == 1.0
    assert bands[">= 8192"]["cells"] == 2 and bands[">= 8192"]["time_ratio"] == pytest.approx(math.sqrt(1.01 * 1.02))
    assert bands[">= 8192"]["energy_ratio"]["geomean"] == pytest.approx(math.sqrt(1.02 * 1.1))
    assert bands[">= 8192"]["window_energy_ratio"] == dict(cells=1, geomean=pytest.approx(1.01))
    assert bands["1024-4096"]["clock_ratio"]["geomean"] == pytest.approx(0.98)
    assert summary["metered_cells"] == 5 and summary["rounds"] == 15 and summary["energy_rounds"] == 12
    assert 0.5 < summary["time_energy_correlation"] < 1.0
    assert summary["time_clock_correlation"] < 0 and summary["time_clock_correlation_within_cells"] == pytest.approx(
        _pearson_of_centered([0.97, 0.98, 0.99, 1.0, 1.0, 1.0, 1.02, 1.03, 1.04, 1.01, 1.02, 1.03, 1.02, 1.02, 1.02],
                             [1.0] * 6 + [0.98, 0.97, 0.96, 0.99, 0.98, 0.97] + [0.98] * 3))
    # within cells: 16, 2048 and 16384 move together (r = 1), 8192's energy moves with no time change
    assert summary["time_energy_correlation_within_cells"] == pytest.approx(
        _pearson_of_centered([0.97, 0.98, 0.99, 1.02, 1.03, 1.04, 1.01, 1.02, 1.03, 1.02, 1.02, 1.02],
                             [0.96, 0.98, 1.0, 1.02, 1.03, 1.04, 1.01, 1.02, 1.03, 1.0, 1.1, 1.2]))
    line = gemm_energy.describe(summary)
    assert line.startswith("energy by M: <= 64 time x0.970 E x0.980 f x1.000 cycles x0.970 (E of 1/1 cells, window E -")
    assert "| >= 8192 time x1.015 E x1.059" in line and line.endswith("(12 of 15 rounds)")
    assert gemm_energy.summarize([dict(rows[0], energy_rounds=None)], gemm.decided_ratio) is None
    assert gemm_energy.describe(None) == "energy by M: not recorded"
    full = gemm.summarize(rows)
    assert full["energy"]["bands"][0]["time_ratio"] == pytest.approx(0.97)


def _pearson_of_centered(xs, ys):
    import statistics
    cx, cy = [], []
    for i in range(0, len(xs), 3):
        lx, ly = [math.log(v) for v in xs[i:i + 3]], [math.log(v) for v in ys[i:i + 3]]
        cx += [v - statistics.fmean(lx) for v in lx]
        cy += [v - statistics.fmean(ly) for v in ly]
    return statistics.correlation(cx, cy)


def test_gemm_energy_grid_says_once_why_nothing_is_recorded_and_passes_the_windows(tmp_path, monkeypatch):
    """run_bench on a machine without NVML: one line says energy and clock are not recorded and why, the
    JSON holds the probe; time_cell gets the probe, and an energy window only at the M values asked
    (none here: nothing to poll)."""
    got = []

    def time_cell(name, m, n, k, dtype_name, device, replays, counter=None, window_s=0.0):
        got.append((m, counter, window_s))
        return dict(shape=name, m=m, n=n, k=k, config="c", error="skipped", rel_err=1e-3, cublas_rel_err=1e-3)
    gemm_grid_on_cpu(monkeypatch, time_cell)
    lines = []
    console = SimpleNamespace(print=lambda text, highlight=False: lines.append(text))
    path = gemm.run_bench("bf16", (1, 16), ["70b-tp8 qkv"], 10, tmp_path, console, cublas_kernels=False,
                          energy_window_s=0.3, energy_ms=(16,))
    assert [line for line in lines if line.startswith("energy")] == [
        "energy per GEMM and SM clock per side not recorded: not a CUDA device (cpu)"]
    assert [(m, c.unavailable, w) for m, c, w in got] == [(1, "no NVML", 0.0), (16, "no NVML", 0.0)]
    result = json.loads(path.read_text())
    assert result["energy_counter"]["unavailable"] == "no NVML" and result["summary"]["energy"] is None
    # with a counter stepping every 100 ms: the window goes to the M values asked, >= WINDOW_PERIODS steps long
    monkeypatch.setattr(gemm_energy, "probe_counter", lambda meter, busy: CounterProbe(period_s=0.1))
    got.clear()
    gemm.run_bench("bf16", (1, 16), ["70b-tp8 qkv"], 10, tmp_path, console, cublas_kernels=False,
                   energy_window_s=0.3, energy_ms=(16,))
    assert [(m, w) for m, _, w in got] == [(1, 0.0), (16, pytest.approx(0.5))]
