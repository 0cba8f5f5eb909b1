"""Timing one bound implementation on this rank (rank side), as DESIGN.md prescribes.

* graph: ``calls_per_graph`` calls captured in one CUDA graph (launch overhead out of the figure);
  after ``warmup`` replays, the timed replays go back to back after one barrier (the GPU never idles
  between them, no host sync inside the timed region) and one sample is replay time / calls_per_graph.
  Every process first captures ``SETTLE_GRAPHS`` throwaway graphs (``settle_graphs``): the first few
  graphs of a process replay faster than all later ones. ``symmcoll bench`` of the collectives
  (bench/worker.py) and of the fused ops (bench/fused_timing.py) both time this way (``time_graph``); a call
  slower than GRAPH_BUDGET_US / calls_per_graph gets fewer calls per graph (``graph_calls``).
* eager: every call timed with CUDA events (launch overhead in: what an eager program pays).
* cpu: every call timed with ``time.perf_counter`` between barriers; kernels run interpreted, so these
  are checks that the harness works, not performance.

The number of timed samples is the same on every rank (agreed with an all-reduce): a rank that
replayed a graph of collectives more often than its peers would wait forever.

``event_times_us`` is the package's one CUDA-event timing loop: every event-timed figure (this module,
bench/fused_timing.py, bench/tp_block.py, bench/link.py, the scripts under benchmarks/) comes from it.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .plan import TimingPlan


# The first few CUDA graphs a process captures replay faster than every later one: on one H100 (torch
# 2.11) the same graph of 40 small kernels replayed in 42.9 us as a process's first, second or third
# graph and in 49.1-49.8 us from the fourth on, destroyed graphs counting, profiler or not
# (benchmarks/graph_gap_probe.py, 2026-11-27-graph-position-h100): every kernel-to-kernel gap grows by
# ~0.2 us. A serving process holds dozens of graphs, and a benchmark must not favour whatever it
# happens to capture first: settle_graphs() captures SETTLE_GRAPHS throwaway graphs before the first
# graph that is timed, so every figure is taken in the steady state.
SETTLE_GRAPHS = 4
_SETTLED: set = set()


def settle_graphs() -> None:
    """Capture and replay SETTLE_GRAPHS throwaway graphs on the current device, once per process."""
    index = torch.cuda.current_device()
    if index in _SETTLED:
        return
    x = torch.zeros(256, device=f"cuda:{index}")
    torch.cuda.synchronize()
    for _ in range(SETTLE_GRAPHS):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(40):
                x.add_(1)
        graph.replay()
    torch.cuda.synchronize()
    _SETTLED.add(index)


def capture_steps(step: Callable[[], torch.Tensor], steps: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """``steps`` calls of ``step`` in one CUDA graph, after settle_graphs(): (the graph, what the last
    call returned, rewritten by every replay). ``step`` must be warmed up (compiled, planned, its kept
    state allocated: none of it may happen during a capture). The garbage collector waits meanwhile:
    tensors of earlier cases freed during the capture would be freed into its pool."""
    settle_graphs()
    gc.collect()
    gc.disable()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(steps):
                output = step()
    finally:
        gc.enable()
    return graph, output


@dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]  # per call
    mode: str                      # graph | eager | cpu
    calls_per_sample: int
    host_us: float | None = None   # eager: CPU time per call (median of rounds on an idle GPU)


class CapturedCalls:
    """``calls`` calls of ``call`` in one CUDA graph; ``output`` is what the last one returned, and
    is rewritten by every replay."""

    def __init__(self, call: Callable[[], torch.Tensor], calls: int):
        self.calls = calls
        torch.cuda.synchronize()
        self.graph, self.output = capture_steps(call, calls)

    def replay(self) -> None:
        self.graph.replay()


def _iters(step: Callable[[], object], plan: TimingPlan, group) -> int:
    """The timed samples: ``plan.iters`` where the plan leaves nothing to decide (min_iters == iters: the
    caller planned them, the same on every rank), else what fits the budget at a probe's pace."""
    if plan.min_iters >= plan.iters:
        return plan.iters
    probe = event_times_us(step, 2, isolated=False)
    return agreed_iters(max(probe) * 1e-6, plan, group)


def time_graph(captured: CapturedCalls, plan: TimingPlan, group) -> Timing:
    for _ in range(plan.warmup):
        captured.replay()
    iters = _iters(captured.replay, plan, group)
    samples = event_times_us(captured.replay, iters, group=group, isolated=False)
    return Timing(tuple(s / captured.calls for s in samples), "graph", captured.calls)


def time_eager(call: Callable[[], object], plan: TimingPlan, group, host: bool = True) -> Timing:
    """Eager calls back to back after one barrier; ``host``: also the CPU time per call (300 more calls:
    the fused bench's fallback for a call that cannot be captured leaves it out)."""
    for _ in range(plan.warmup):
        call()
    iters = _iters(call, plan, group)
    return Timing(tuple(event_times_us(call, iters, group=group, isolated=False)), "eager", 1,
                  host_time_us(call, group) if host else None)


def host_time_us(call: Callable[[], object], group, rounds: int = 15, calls: int = 20) -> float:
    """CPU time per call: rounds of ``calls`` calls queued on an idle GPU (few enough that the launch
    queue never fills, so the host never waits for the GPU), the median round's time per call."""
    per_round = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        dist.barrier(group)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return sorted(per_round)[len(per_round) // 2]


def time_cpu(call: Callable[[], object], plan: TimingPlan, group) -> Timing:
    for _ in range(plan.warmup):
        call()
    samples = []
    for _ in range(plan.iters):
        dist.barrier(group)  # start together: the figure should not include waiting for a late peer
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e6)
    return Timing(tuple(samples), "cpu", 1)


# A graph replay lasts about this long at most: a call slower than GRAPH_BUDGET_US / calls_per_graph is
# captured fewer times per graph (at least once). Such a call takes > 1 ms at 20 calls per graph, so a
# replay's launch and the ranks' skew (tens of us) stay under a few percent of one call, while every
# call of a few us is timed 20 to a graph, back to back, as the collective bench times it.
GRAPH_BUDGET_US = 20_000.0


def graph_calls(call_us: float, calls_per_graph: int, budget_us: float = GRAPH_BUDGET_US) -> int:
    """Calls to capture per graph for a call of ``call_us`` (an eager call's time, the slowest rank's:
    every rank must capture the same number, a graph holding collectives), a replay within ``budget_us``."""
    return max(1, min(calls_per_graph, int(budget_us // max(call_us, 1e-3))))


def fitting_iters(seconds_per_sample: float, plan: TimingPlan) -> int:
    """Timed samples that fit the case's budget at this pace, within [min_iters, iters]."""
    affordable = int(plan.seconds_per_case / max(seconds_per_sample, 1e-9))
    return max(plan.min_iters, min(plan.iters, affordable))


def agreed_iters(seconds_per_sample: float, plan: TimingPlan, group) -> int:
    """``fitting_iters`` at the slowest rank's pace: the same number on every rank."""
    pace = torch.tensor([seconds_per_sample], dtype=torch.float64,
                        device=torch.device("cuda", torch.cuda.current_device()))
    dist.all_reduce(pace, op=dist.ReduceOp.MAX, group=group)
    return fitting_iters(float(pace.item()), plan)


def event_times_us(step: Callable[[], object], samples: int, *, group=None, per: int = 1,
                   isolated: bool = True) -> list[float]:
    """``samples`` runs of ``step``, each between two CUDA events: microseconds per call (a run's GPU
    time / ``per``, the calls one run makes: a graph's captured calls).

    isolated: each run starts on an idle GPU, and with ``group`` the ranks meet at a barrier before
    each (no sample includes a late peer); else the runs go back to back after one barrier, with one
    synchronisation at the end (the GPU never idles between them)."""
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
    if not isolated:
        if group is not None:
            dist.barrier(group)
        torch.cuda.synchronize()
    for start, end in pairs:
        if isolated:
            if group is not None:
                dist.barrier(group)
            torch.cuda.synchronize()
        start.record()
        step()
        end.record()
        if isolated:
            end.synchronize()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 / per for start, end in pairs]


MIN_CALLS_PER_GRAPH = 20


def graph_repeats(pass_us: float, calls: int, min_graph_us: float = 200.0) -> int:
    """Passes over ``calls`` calls (one pass: ``pass_us``, an eager pass's time) that one graph replay of
    ``graph_us`` makes: a replay of about ``min_graph_us`` or more, and at least MIN_CALLS_PER_GRAPH calls
    (the eager probe includes launch gaps, so it overstates a short call: a replay's start-up is spread
    over many calls whatever the probe said)."""
    return max(1, int(min_graph_us / max(pass_us, 1e-3) + 0.999), -(-MIN_CALLS_PER_GRAPH // calls))


def capture_passes(calls: list[Callable[[], object]], passes: int) -> CapturedCalls:
    """``passes`` passes over ``calls`` (warmed up: compiled, planned) in order, in one CUDA graph."""
    order = iter(range(10 ** 9))
    return CapturedCalls(lambda: calls[next(order) % len(calls)](), passes * len(calls))


def eager_pass_us(calls: list[Callable[[], object]]) -> float:
    """Every call once (compiles, warms up), then the faster of two eager passes over them, in us."""
    for call in calls:
        call()
    return min(event_times_us(lambda: [c() for c in calls], 2, isolated=False))


def replayed_us(captured: CapturedCalls, replays: int, warmup: int) -> list[float]:
    """``warmup`` untimed replays, then ``replays`` timed ones back to back: microseconds per captured call."""
    for _ in range(warmup):
        captured.replay()
    return event_times_us(captured.replay, replays, per=captured.calls, isolated=False)


def graph_us(calls: list[Callable[[], object]], replays: int, warmup: int = 2, min_graph_us: float = 200.0) -> list[float]:
    """One process, no group: ``calls`` (e.g. one per rotating input set) captured in order, repeated
    until a replay lasts about ``min_graph_us`` (``graph_repeats``), into one CUDA graph; the time per
    call of each of ``replays`` timed replays, in microseconds."""
    passes = graph_repeats(eager_pass_us(calls), len(calls), min_graph_us)
    return replayed_us(capture_passes(calls, passes), replays, warmup)


@contextlib.contextmanager
def frozen_heap():
    """The objects alive now (modules, compiled kernels: torch's and Triton's ~200k) left out of the
    garbage collector's passes inside the block (``gc.freeze``). ``capture_steps`` collects before every
    capture, and a full pass over those objects takes ~0.1 s (0.11-0.21 s on the CPU machine, torch and
    symmcoll's benches imported): the GEMM grid, capturing six graphs a cell until 2026-11-28, spent
    about 130 of the 305 s of 2026-11-27-paired-qkv-h100's grid outside the GPU (its plan implies 163 s
    of GPU time, its compiles took 10), and the GEMM tune captures one graph a candidate. Frozen, a pass
    walks only what the block made (tens of microseconds); what was garbage is collected before the freeze."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release_gpu_memory() -> None:
    """Graphs and tensors a bench just dropped, given back to the GPU before it captures again: collect
    them, let the GPU finish with them, return the allocator's cached blocks (the fused bench between
    batches, the decoder-block bench between cases)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
