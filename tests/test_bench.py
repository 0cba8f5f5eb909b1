"""The benchmark harness: sizes, busbw factors, table layout, the result file, plots, and a real CPU run
of ``python -m symmcoll bench`` at world size 2."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console

import symmcoll
from symmcoll.bench import checks, driver, plot, results
from symmcoll.bench.driver import selected
from symmcoll.bench.metrics import OPS, bandwidth, busbw_factor, count_for, link_percent, summarize
from symmcoll.bench.plan import TimingPlan
from symmcoll.bench.plot import plot_files
from symmcoll.bench.report import comparison_table, implementation_table
from symmcoll.bench.sizes import format_size, parse_size, size_sweep

import rank_checks
from bench_fixtures import synthetic_result

# --- sizes -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, nbytes", [("4096", 4096), ("4K", 4 << 10), ("4k", 4 << 10),
                                          ("256M", 256 << 20), ("1G", 1 << 30), ("1.5K", 1536),
                                          ("4KB", 4 << 10), ("4KiB", 4 << 10)])
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "K", "4X", "-4K", "0", "0.3"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size_and_sweep():
    assert [format_size(n) for n in (1000, 1024, 3 << 20, 1 << 30, 1536)] == \
        ["1000", "1K", "3M", "1G", "1536"]
    assert size_sweep(4 << 10, 32 << 10, 2) == [4096, 8192, 16384, 32768]
    assert size_sweep(1 << 10, 1 << 20, 32) == [1 << 10, 32 << 10, 1 << 20]
    assert size_sweep(1000, 1000, 2) == [1000]
    with pytest.raises(ValueError):
        size_sweep(8, 4, 2)


# --- metrics -----------------------------------------------------------------------------------------

# Written out, not computed: all_reduce 2(n-1)/n, the other three (n-1)/n (nccl-tests).
BUSBW_FACTORS = {
    "all_reduce": {2: 1.0, 4: 1.5, 8: 1.75},
    "reduce_scatter": {2: 0.5, 4: 0.75, 8: 0.875},
    "all_gather": {2: 0.5, 4: 0.75, 8: 0.875},
    "all_to_all": {2: 0.5, 4: 0.75, 8: 0.875},
}


@pytest.mark.parametrize("world", [2, 4, 8])
@pytest.mark.parametrize("op", OPS)
def test_busbw_factor(op, world):
    assert busbw_factor(op, world) == pytest.approx(BUSBW_FACTORS[op][world])


@pytest.mark.parametrize("op, algbw_gbps", [("all_reduce", 10.0), ("all_to_all", 10.0),
                                             ("all_gather", 40.0), ("reduce_scatter", 40.0)])
def test_bandwidth_uses_nccl_tests_bytes(op, algbw_gbps):
    # 1e6 bytes per rank in 100 us at 4 ranks; AG/RS count the whole gathered/scattered tensor.
    bw = bandwidth(op, 1_000_000, 4, 100.0)
    assert bw.algbw_gbps == pytest.approx(algbw_gbps)
    assert bw.busbw_gbps == pytest.approx(algbw_gbps * BUSBW_FACTORS[op][4])
    assert link_percent(bw.busbw_gbps, bw.busbw_gbps * 2) == pytest.approx(50.0)


def test_count_and_summary():
    assert count_for("all_to_all", 1000, 2, 3) == 498  # equal splits need a multiple of the world size
    assert count_for("all_gather", 1000, 2, 3) == 500
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median_us, s.p20_us, s.p80_us) == pytest.approx((3.0, 1.8, 4.2))


def test_rank_coded_matches_the_tests_recipe_and_counts_wrong():
    ours = checks.rank_coded(30011, torch.float32, 3, 2, torch.device("cpu"))
    assert torch.equal(ours, rank_checks.rank_coded(30011, torch.float32, 3, 2))
    broken = ours.clone()
    broken[[5, 20000]] += 1
    assert checks.count_wrong(broken, ours) == 2
    assert checks.count_wrong(ours[:10], ours) == 30011


def test_algorithms_filter():
    assert selected("symmcoll:one_shot", None)
    assert selected("symmcoll:one_shot", ("one_shot",))
    assert selected("torch:two_shot", ("torch:*",))
    assert not selected("nccl", ("torch:*", "one_shot"))


def test_torch_ops_with_the_copy_in_run_only_when_asked_and_copy_the_callers_tensor_every_call():
    from symmcoll.bench.baselines import TORCH_COPY_IN, copy_in
    from symmcoll.bench.impls import Bound
    assert not driver._wanted(TORCH_COPY_IN, None) and not driver._wanted(TORCH_COPY_IN, ("torch:*",))
    assert driver._wanted(TORCH_COPY_IN, ("torch:*_copy_in",)) and driver._wanted("torch_symm_mem", ("torch:*",))
    assert not driver._wanted(results.QUANTIZED, ("torch:*",)) and driver._wanted(results.QUANTIZED, ("quantized_int8",))
    # A stand-in for torch's in-place two_shot: doubles its symmetric buffer. Fed the caller's tensor inside the call,
    # every call gives the same answer from the same input (it was in place; it is not any more).
    symm = torch.zeros(4)

    def binder(x, group):
        symm.copy_(x)
        return Bound(load=symm.copy_, call=lambda: symm.mul_(2))
    bound = copy_in(binder)(torch.ones(4), None)
    bound.load(torch.full((4,), 3.0))
    assert bound.call().tolist() == [6.0] * 4 and bound.call().tolist() == [6.0] * 4


def test_an_algorithms_pattern_that_selects_nothing_is_named():
    """Two names quoted as one word (the slip of a GPU run on 2026-11-27) must not shrink a run silently."""
    from types import SimpleNamespace

    from symmcoll.bench.driver import _cases
    info = SimpleNamespace(implementations={"all_reduce": (("symmcoll:quantized_int8", "quantized"),
                                                           ("symmcoll:auto", "symmcoll"))})
    options = SimpleNamespace(ops=["all_reduce"], algorithms=("symmcoll:quantized_int8 symmcoll:auto", "auto"),
                              dtype="bf16")
    _, notes = _cases(info, options, None, [], 2)
    assert notes == ["--algorithms 'symmcoll:quantized_int8 symmcoll:auto' matches no implementation of all_reduce: "
                     "ignored (several names are separate words or comma-separated)"]
    options.algorithms = ("quantized_int8", "auto")
    assert _cases(info, options, None, [], 2)[1] == []


def _render(table, width: int = 250) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))
    console.print(table)
    return console.export_text()


def test_implementation_table_layout():
    text = _render(implementation_table(synthetic_result(), "all_reduce", "symmcoll:one_shot"))
    header = next(line for line in text.splitlines() if "size" in line and "#wrong" in line)
    for column in ("size", "count", "type", "redop", "time (us)", "p20-p80 (us)", "algbw (GB/s)",
                   "busbw (GB/s)", "% link", "#wrong"):
        assert column in header
    assert "2(n-1)/n" in text  # the convention is stated with the table
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["4K"], ["1M"])]
    assert rows == [
        ["4K", "2048", "bf16", "sum", "6.00", "5.94-6.06", "0.68", "1.02", "0.3", "0"],
        ["1M", "524288", "bf16", "sum", "32.00", "31.68-32.32", "32.77", "49.15", "13.7", "0"],
    ]


def test_comparison_table_flags_wrong_and_picks_the_best_correct():
    text = _render(comparison_table(synthetic_result(), "all_reduce"))
    header = next(line for line in text.splitlines() if line.split()[:1] == ["size"])
    assert header.split()[1:6] == ["nccl", "t:1s", "1s", "bad", "best"]
    assert "t:1s = torch:one_shot, 1s = symmcoll:one_shot, bad = symmcoll:bad" in " ".join(text.split())
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.split()[:1] in (["4K"], ["1M"])}
    # 4K: symmcoll:bad (1.00 us) is wrong, so the best is symmcoll:one_shot: 12/6 over NCCL, 7/6 over torch.
    assert rows["4K"] == ["4K", "12.0", "7.00", "6.00", "1.00!", "1s", "2.00x", "1.17x", "0.3"]
    # 1M: torch one-shot is best; symmcoll's best against it is 30/32.
    assert rows["1M"][5:] == ["t:1s", "1.33x", "0.94x", "14.6"]


def _with_fallback(result, times_us):
    """``result`` plus "symmcoll:nccl" rows (the process group's collective called through symmcoll)."""
    nccl = [m for m in result.measurements if m.implementation == "nccl"]
    fallback = [dataclasses.replace(m, implementation="symmcoll:nccl", family="symmcoll", median_us=t,
                                    link_percent=None) for m, t in zip(nccl, times_us)]
    return dataclasses.replace(result, measurements=result.measurements + tuple(fallback))


def test_fallback_is_labelled_and_counted_as_the_backend():
    # The fallback at 5 us beats symmcoll:one_shot (6 us) at 4K: that is NCCL winning, not symmcoll.
    result = _with_fallback(synthetic_result(), (5.0, 41.0))
    text = _render(comparison_table(result, "all_reduce"))
    assert "nccl* = symmcoll:nccl (nccl called through symmcoll" in " ".join(text.split())
    row = next(line.split() for line in text.splitlines() if line.split()[:1] == ["4K"])
    assert row[5:] == ["5.00", "nccl*", "2.40x", "0.83x", "-"]  # sc vs others = 5 / 6
    title = _render(implementation_table(result, "all_reduce", "symmcoll:nccl")).splitlines()[0]
    assert "symmcoll:nccl (nccl called through symmcoll: the fallback" in title
    assert plot.legend_label(result, "symmcoll:nccl") == "nccl through symmcoll (fallback)"
    # a wrong fallback still fails the run: it is symmcoll's code path
    rows = [dataclasses.replace(m, wrong=3) if m.implementation == "symmcoll:nccl" else m
            for m in result.measurements if m.implementation != "symmcoll:bad"]
    assert driver.failed(dataclasses.replace(result, measurements=tuple(rows)))
    clean = [m for m in rows if m.implementation != "symmcoll:nccl"]
    assert not driver.failed(dataclasses.replace(result, measurements=tuple(clean)))


def _everything_today(op: str, world: int):
    """A result with every implementation the bench compares for ``op`` today: the backend, torch's
    symmetric-memory ops (as on the GPU machine), every symmcoll algorithm, auto and the fallback;
    sizes 4K..256M with times of every width up to 5 digits, and a wrong row."""
    base = synthetic_result()
    template = base.measurements[0]
    names = [("nccl", "backend"), *((f"torch:{n}", "torch_symm_mem") for n in TORCH_OPS[op]),
             *((f"symmcoll:{n}", "symmcoll") for n in [*symmcoll.ALGORITHMS[op], "auto", "nccl"])]
    sizes = [4096 << (2 * i) for i in range(9)]
    rows = [dataclasses.replace(template, op=op, implementation=name, family=family, size_bytes=size,
                                median_us=12345.678 / (1 + i + j) + 1.234 * i,
                                wrong=7 if (i, j) == (1, 2) else 0)
            for i, (name, family) in enumerate(names) for j, size in enumerate(sizes)]
    config = dataclasses.replace(base.config, ops=(op,), sizes=tuple(sizes), world_size=world)
    return dataclasses.replace(base, config=config, measurements=tuple(rows))


# torch's symmetric-memory ops the bench compares on GPU (bench/baselines.py)
TORCH_OPS = {"all_reduce": ["one_shot", "two_shot"], "reduce_scatter": ["reduce_scatter_out", "low_contention"],
             "all_gather": ["low_contention"], "all_to_all": []}
RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _assert_fits(text: str, sizes: list[int], width: int = 120) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert "…" not in text, text  # nothing cut short
    starts = [line.split()[0] for line in lines if line.split()]
    for size in sizes:  # the size column is there, one row per size
        assert format_size(size) in starts, (format_size(size), text)


@pytest.mark.parametrize("op", OPS)
def test_tables_fit_120_columns_with_every_implementation(op):
    result = _everything_today(op, 4)
    text = _render(comparison_table(result, op), width=120)
    _assert_fits(text, list(result.config.sizes))
    header = next(line for line in text.splitlines() if line.split()[:1] == ["size"])
    assert len(header.split()) == 1 + len(result.implementations(op)) + 4  # size, codes, best, ratios, %link
    for name in result.implementations(op):
        _assert_fits(_render(implementation_table(result, op, name), width=120), list(result.config.sizes))


def test_committed_gpu_results_fit_120_columns():
    files = sorted((RESULTS_DIR / "2026-11-22-perf-5").glob("2026*.json"))
    assert len(files) == 2
    for path in files:
        result = results.load(path)
        for op in result.ops():
            sizes = sorted({m.size_bytes for m in result.measurements if m.op == op})
            _assert_fits(_render(comparison_table(result, op), width=120), sizes)


# --- result file and plots -------------------------------------------------------------------------------


def test_result_round_trip(tmp_path):
    result = synthetic_result()
    path = results.write(result, tmp_path / results.default_filename(result))
    assert path.name == "20260101-000000-h200-ws4-graph-bf16.json"
    loaded = results.load(path)
    assert loaded == result
    assert isinstance(loaded.measurements[0].per_rank_median_us, tuple)
    data = json.loads(path.read_text())
    assert data["provenance"]["git_sha"] == "0123456789abcdef"
    assert data["measurements"][0]["wrong"] == 0 and data["config"]["plan"]["mode"] == "graph"
    data["schema"] = "something else"
    with pytest.raises(ValueError, match="schema"):
        results.from_dict(data)


def test_plot_from_stored_result(tmp_path):
    path = results.write(synthetic_result(), tmp_path / "run.json")
    written = plot_files([path], tmp_path / "plots")
    assert written == [tmp_path / "plots" / "run-all_reduce.png"]
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and written[0].stat().st_size > 10_000


def test_plot_names_world_size_dtype_and_size_convention():
    ws4 = synthetic_result()
    ws2 = dataclasses.replace(ws4, config=dataclasses.replace(ws4.config, world_size=2))
    assert plot.title([ws4], "all_reduce") == "all_reduce, world size 4, bf16, graph timing, NVIDIA H200 x4"
    assert plot.title([ws4, ws2], "all_reduce").startswith("all_reduce, world sizes 4 and 2, bf16")
    assert plot.size_label("all_reduce") == "size: bytes per rank (in = out)"
    assert plot.size_label("all_gather") == "size: input bytes per rank (output = n*size)"
    assert plot.size_label("reduce_scatter") == "size: output bytes per rank (input = n*size)"
    assert plot.busbw_formula("all_reduce") == "algbw*2(n-1)/n"


# --- the real command, CPU mode ------------------------------------------------------------------------


def test_bench_cli_cpu_end_to_end(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "symmcoll", "bench", "--op", "all_reduce", "-b", "1K", "-e", "4K", "-f", "2",
           "--world-size", "2", "-n", "2", "-w", "0", "--out", str(tmp_path), "--plot"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "NOT performance" in out
    assert max(len(line) for line in out.splitlines()) <= 120  # a log file: the 120-column layout
    assert "Warning" not in proc.stderr, proc.stderr  # no per-rank torch deprecation warnings
    # Rows of the per-implementation tables: size count type redop time p20-p80 algbw busbw %link #wrong
    headers = [line for line in out.splitlines() if "#wrong" in line]
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+K\s+\d+\s+bf16\s", line)]
    # gloo + symmcoll's algorithms + symmcoll:auto + symmcoll:nccl (the fallback, out of place)
    implementations = 3 + len(symmcoll.ALGORITHMS["all_reduce"])
    assert len(headers) == implementations
    assert len(rows) == 3 * implementations
    assert all(row[9] == "0" for row in rows), out

    files = list(Path(tmp_path).glob("*.json"))
    assert len(files) == 1
    result = results.load(files[0])
    assert result.config.world_size == 2 and result.provenance.backend == "gloo"
    assert len(result.measurements) == 3 * implementations
    assert all(m.wrong == 0 and m.median_us > 0 and len(m.per_rank_median_us) == 2
               for m in result.measurements)
    assert {m.implementation for m in result.measurements} == {
        "gloo", "symmcoll:auto", "symmcoll:nccl",
        *(f"symmcoll:{name}" for name in symmcoll.ALGORITHMS["all_reduce"])}
    assert list(Path(tmp_path).glob("*-all_reduce.png"))


# --- failures stay inside their row ------------------------------------------------------------------


def _broken_implementations_then_a_good_one():
    import torch.distributed as dist

    from symmcoll.bench import worker
    from symmcoll.bench.impls import Bound, Implementation
    from symmcoll.bench.plan import Case

    def bind_identity(x, group):  # returns its input: wrong wherever the other rank's value is not 0
        return Bound(load=x.copy_, call=lambda: x.clone())

    def bind_failing_on_rank1(x, group):
        def call():
            if dist.get_rank() == 1:
                raise RuntimeError("deliberate failure")
            return x.clone()
        return Bound(load=x.copy_, call=call)

    registry = worker.implementations("all_reduce")
    for name, bind in (("test:identity", bind_identity), ("test:fails", bind_failing_on_rank1)):
        registry[name] = Implementation(name, "all_reduce", "symmcoll", False, bind)
    plan = TimingPlan(mode="cpu", warmup=0, iters=2, min_iters=1, calls_per_graph=1, seconds_per_case=60)
    return [worker.run_case(Case("all_reduce", name, 2048, 1024, "bf16", plan))
            for name in ("test:identity", "test:fails", "gloo")]


def test_wrong_and_failing_implementations_are_reported_and_the_sweep_goes_on(pools):
    identity, fails, gloo = pools(2).run(_broken_implementations_then_a_good_one)[0]
    assert identity.error is None and identity.median_us is not None
    assert identity.wrong_before > 1000 and identity.wrong_after > 1000 and not identity.ok
    assert fails.median_us is None and "rank 1: check before timing: RuntimeError: deliberate" in fails.error
    assert gloo.ok and len(gloo.per_rank_median_us) == 2


def test_time_limit_keeps_what_ran_and_names_what_was_left_out(pools, tmp_path, monkeypatch):
    """--time-limit: past the deadline no case starts, and the cases done are still printed and written
    (a sweep cut by `timeout` on the GPU machine left nothing at all)."""
    import functools
    import itertools

    clock = itertools.chain([0.0, 0.0], itertools.repeat(1e9))  # deadline set at 0; case 1 starts; case 2 is late
    monkeypatch.setattr(driver, "_clock", lambda: next(clock))
    options = driver.BenchOptions(
        ops=("all_reduce",), begin=1024, end=1024, factor=2, dtype="bf16", algorithms=("gloo", "symmcoll:one_shot"),
        world_sizes=(2,), mode=None, iters=2, warmup=0, calls_per_graph=1, seconds_per_case=None,
        out_dir=tmp_path, plot=False, device="cpu", link_bytes=4096, time_limit_s=100)
    runner = driver.Runner(functools.partial(driver._rank0_answer, pools(2)), 2, "cpu", "pool", True)
    result = driver._sweep(runner, options, Console(quiet=True), driver._deadline(options))
    assert [m.implementation for m in result.measurements] == ["gloo"] and result.measurements[0].ok
    assert any(n.startswith("cut by --time-limit 100 s: 1 of 2 cases run, the first left out all_reduce 1K "
                            "symmcoll:one_shot") for n in result.notes), result.notes
    assert not driver.failed(result)
    assert driver._finish([result], options, Console(quiet=True), True) == 0
    (written,) = tmp_path.glob("*.json")
    assert len(results.load(written).measurements) == 1


def test_fused_bench_times_slow_cases_with_fewer_replays():
    from symmcoll.bench.fused_timing import CASE_BUDGET_S, MIN_REPLAYS, replay_plan
    from symmcoll.bench.timing import fitting_iters

    plan = replay_plan(20, 3)
    assert fitting_iters(100e-6, plan) == 20                          # 20 x 0.1 ms: all asked for
    assert fitting_iters(CASE_BUDGET_S / 8, plan) == 8                # what fits the budget
    assert fitting_iters(0.43, plan) == MIN_REPLAYS                   # a 0.43 s replay: the floor
    assert fitting_iters(0.43, replay_plan(3, 3)) == 3                # never more than asked


# --- how a graph is timed: the collective bench and the fused bench alike ------------------------------

class _FakeGpu:
    """A CUDA timeline on the CPU: a replay of a graph of N calls advances the GPU clock by N x CALL_US;
    events read that clock; host syncs and barriers are logged, so a test can see what happens between
    the first timed event and the last."""

    CALL_US = 7.0

    def __init__(self):
        self.clock_us, self.log = 0.0, []
        gpu = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = gpu.clock_us
                gpu.log.append("event")

            def synchronize(self):
                gpu.log.append("sync")

            def elapsed_time(self, end):
                return (end.at - self.at) / 1e3  # ms

        class Graph:
            def __init__(self):
                self.calls = 0

            def replay(self):
                gpu.clock_us += self.calls * gpu.CALL_US
                gpu.log.append("replay")

        self.Event, self.Graph = Event, Graph

    def install(self, monkeypatch, timing, fused=None):
        gpu = self
        monkeypatch.setattr(timing.torch.cuda, "Event", self.Event)
        monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda *a: gpu.log.append("sync"))
        monkeypatch.setattr(timing.dist, "barrier", lambda *a, **k: gpu.log.append("barrier"))
        monkeypatch.setattr(timing, "agreed_iters", lambda seconds, plan, group: timing.fitting_iters(seconds, plan))

        def capture(call, calls):
            graph = gpu.Graph()
            graph.calls = calls
            outputs = [call() for _ in range(calls)]
            gpu.log.append(f"captured {calls}")
            return graph, outputs[-1]
        monkeypatch.setattr(timing, "capture_steps", capture)


def _timed_region(log: list) -> list:
    """What the log holds from the first event after the (one) barrier to the last event."""
    after_barrier = log[log.index("barrier"):]
    first, last = after_barrier.index("event"), len(after_barrier) - 1 - after_barrier[::-1].index("event")
    return after_barrier[first:last + 1]


def test_time_graph_replays_back_to_back_with_no_host_sync_inside(monkeypatch):
    """time_graph (the collective bench's method): warm-up replays, then the timed replays after one
    barrier, back to back: between the first timed event and the last, only replays and events (no
    host sync, no barrier); a sample is a replay / the calls in the graph."""
    from symmcoll.bench import timing

    gpu = _FakeGpu()
    gpu.install(monkeypatch, timing)
    captured = timing.CapturedCalls(lambda: None, 20)
    plan = TimingPlan(mode="graph", warmup=3, iters=12, min_iters=5, calls_per_graph=20, seconds_per_case=1.0)
    result = timing.time_graph(captured, plan, group="the ranks")
    assert result.calls_per_sample == 20 and len(result.samples_us) == 12
    assert all(s == pytest.approx(_FakeGpu.CALL_US) for s in result.samples_us)
    assert gpu.log.count("barrier") == 1
    timed = _timed_region(gpu.log)
    assert set(timed) == {"event", "replay"} and timed.count("replay") == 12
    # the warm-up replays (3) and the probe's (2) come before the barrier
    assert gpu.log[:gpu.log.index("barrier")].count("replay") == 5


def test_time_graph_takes_no_probe_where_the_replays_are_planned(monkeypatch):
    """min_iters == iters (bench/rounds.py planned them, the same on every rank): no probe replays, no
    agreement; exactly the warm-up replays, then the planned timed ones."""
    from symmcoll.bench import timing

    gpu = _FakeGpu()
    gpu.install(monkeypatch, timing)
    monkeypatch.setattr(timing, "agreed_iters", lambda *a: pytest.fail("no agreement needed"))
    captured = timing.CapturedCalls(lambda: None, 3)
    plan = TimingPlan(mode="graph", warmup=1, iters=2, min_iters=2, calls_per_graph=3, seconds_per_case=1.0)
    result = timing.time_graph(captured, plan, group="the ranks")
    assert len(result.samples_us) == 2 and gpu.log[:gpu.log.index("barrier")].count("replay") == 1


def test_fused_bench_times_like_the_collective_bench(monkeypatch):
    """bench/fused_timing.py's time_alone is timing.time_graph over CapturedCalls of the command line's calls
    per graph (20, as the collective bench), WARMUP_REPLAYS warm-up replays as the collective bench's; a call
    slower than fused_timing.GRAPH_BUDGET_US (10 ms: half the collective bench's, so a round stays short)
    / 20 gets fewer calls per graph (at least one), the same on every rank."""
    from symmcoll.bench import fused, fused_timing, timing, worker

    assert fused_timing.time_graph is worker.time_graph and fused_timing.CapturedCalls is worker.CapturedCalls
    assert fused_timing.WARMUP_REPLAYS == driver.DEFAULTS["cuda"].warmup
    import inspect
    assert fused.CALLS_PER_GRAPH == 20 and inspect.signature(fused.run).parameters["calls_per_graph"].default == 20
    gpu = _FakeGpu()
    gpu.install(monkeypatch, timing)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: gpu.log.append("sync"))
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)

    def gather(out, value, group=None):  # two ranks; the other one's eager call is 1.5x slower
        out[:] = [value, value * 1.5 if isinstance(value, float) else value]
    monkeypatch.setattr(torch.distributed, "all_gather_object", gather)
    assert fused_timing.GRAPH_BUDGET_US == 10_000.0
    for eager_us, calls in ((30.0, 20), (1000.0, 6), (5e5, 1)):  # 1.5 ms x 6 <= 10 ms budget
        monkeypatch.setattr(fused_timing, "event_times_us", lambda step, n, group=None, e=eager_us: [e])
        gpu.log.clear()
        result, mode = fused_timing.time_alone(lambda: None, 10, 20, group="the ranks")
        assert f"captured {calls}" in gpu.log
        assert result.mode == "graph" and result.calls_per_sample == calls
        assert result.samples_us == (pytest.approx(_FakeGpu.CALL_US),) * len(result.samples_us)
        assert mode == ("graph" if calls == 20 else f"graph, {calls} calls per replay")
        assert gpu.log.count("barrier") == 1
        timed = _timed_region(gpu.log)
        assert set(timed) == {"event", "replay"} and timed.count("replay") == len(result.samples_us)


def test_graph_calls_keeps_a_replay_within_the_budget():
    from symmcoll.bench.timing import GRAPH_BUDGET_US, graph_calls

    assert graph_calls(5.0, 20) == 20
    assert graph_calls(GRAPH_BUDGET_US / 20, 20) == 20
    assert graph_calls(GRAPH_BUDGET_US / 4, 20) == 4
    assert graph_calls(10 * GRAPH_BUDGET_US, 20) == 1
    assert graph_calls(5.0, 3) == 3  # never more than asked
    assert graph_calls(GRAPH_BUDGET_US / 4, 20, budget_us=GRAPH_BUDGET_US / 2) == 2  # the fused bench's budget


def test_source_digest_names_the_commit_that_ran(tmp_path):
    """gpu_check.sh's env.txt carries the digest of the copied sources: the same digest from git's objects of
    the commit that ran, another for any other commit or a changed file (the device copy has no .git)."""
    import subprocess

    from symmcoll.bench.provenance import commit_digest, tree_digest
    git = lambda *args: subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    pkg = tmp_path / "src" / "symmcoll"
    (pkg / "fused").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "fused" / "table.json").write_text("{}\n")
    (pkg / "notes.txt").write_text("not digested\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "empty")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    first = tree_digest(tmp_path)
    assert commit_digest(tmp_path, "HEAD") == first != commit_digest(tmp_path, "HEAD~1")
    (pkg / "notes.txt").write_text("changed, still not digested\n")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "junk.py").write_text("y = 2\n")
    assert tree_digest(tmp_path) == first
    (pkg / "fused" / "table.json").write_text('{"changed": true}\n')
    assert tree_digest(tmp_path) != first
