"""The timing half of the fused bench (bench/fused.py ``run_shape`` runs the flow; this module times).

Per implementation of a shape: ``prepare`` measures one eager call (the slowest rank's), captures as many
calls as fit GRAPH_BUDGET_US in one CUDA graph (eager where capture fails on any rank) and returns a
``Prepared``; ``time_round`` times one round of it (bench/rounds.py interleaves the rounds) under the plan
``replay_plan`` (rounds from the command line) or ``planned_round`` (rounds planned from the replays'
pace) gives. The ranks agree on everything that decides what runs next (rounds.agreed), so every rank
makes the same collective calls. ``free_share`` tells when a shape's captured graphs have taken so much
GPU memory that they are timed as a batch and freed before the rest are captured.
``Implementation`` carries one row of a shape through all of it; ``slowest_rank`` and ``timing_details``
turn a row's samples into its time (the slowest rank's median) and its timing fields (spread, rounds,
the paired per-round ratios to cuBLAS).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .metrics import summarize
from .plan import TimingPlan
from .rounds import agreed, paired_ratio, paired_ratios, per_round, slowest_rounds
from .timing import (CapturedCalls, Timing, event_times_us, graph_calls, release_gpu_memory, time_eager,
                     time_graph)

# Timed samples per implementation: ``replays`` unless they would take longer than CASE_BUDGET_S.
CASE_BUDGET_S = 1.0
MIN_REPLAYS = 5
# Untimed replays first, as the collective bench's (driver.DEFAULTS["cuda"].warmup); in every round.
WARMUP_REPLAYS = 3
# A replay lasts about this long at most (bench/timing.py's GRAPH_BUDGET_US is 20 ms): half of it lets
# a round of nine implementations of a multi-millisecond shape, three replays each, stay within
# ROUND_BUDGET_S (a call of 3.3 ms: 3 calls a replay, not 6).
GRAPH_BUDGET_US = 10_000.0
# Where rounds are planned: untimed replays of an implementation in each round, WARMUP_REPLAYS for a
# replay shorter than this, one for a longer one (already milliseconds of the same kernels).
LONG_REPLAY_S = 1e-3
# The implementations of a shape are captured all before they are timed (bench/rounds.py). Should the
# free GPU memory (the least of any rank) fall below this share of the GPU's after a capture, the
# captured ones are timed and freed first, and the rest form the next batch (cuBLAS is timed in every
# batch). At the default shapes on an 80 GB GPU all of a shape fit in one batch.
MIN_FREE_SHARE = 0.2


def replay_plan(replays: int, calls_per_graph: int, rounds: int = 1) -> TimingPlan:
    """One round's share of ``replays`` timed replays (within its share of CASE_BUDGET_S), never fewer
    than its share of MIN_REPLAYS (nor more than asked)."""
    iters = per_round(replays, rounds)
    return TimingPlan(mode="graph", warmup=WARMUP_REPLAYS, iters=iters,
                      min_iters=min(per_round(min(MIN_REPLAYS, replays), rounds), iters),
                      calls_per_graph=calls_per_graph, seconds_per_case=CASE_BUDGET_S / rounds)


def planned_round(per_round_replays: int, prepared: "Prepared") -> TimingPlan:
    """One planned round (rounds.plan_rounds) of a prepared implementation: exactly ``per_round_replays``
    timed replays (no probe: the plan is the same on every rank), after its warm-up replays."""
    return TimingPlan(mode="graph", warmup=warmup_replays(prepared), iters=per_round_replays,
                      min_iters=per_round_replays, calls_per_graph=prepared.calls, seconds_per_case=CASE_BUDGET_S)


def replay_seconds(prepared: "Prepared") -> float:
    """One replay of a prepared implementation (its calls at the eager call's pace, the slowest rank's)."""
    return (prepared.call_us or 0.0) * prepared.calls * 1e-6


def warmup_replays(prepared: "Prepared") -> int:
    return 1 if replay_seconds(prepared) >= LONG_REPLAY_S else WARMUP_REPLAYS


@dataclass
class Prepared:
    """One implementation ready to be timed: ``calls`` calls of ``thunk`` in one CUDA graph, or (where
    capture failed on any rank: ``failure`` says why) the thunk called eagerly."""

    thunk: Callable
    calls: int
    captured: CapturedCalls | None
    failure: str | None
    call_us: float | None = None          # an eager call's time, the slowest rank's (plans the rounds)

    def mode(self, samples: int, replays: int, calls_per_graph: int) -> str:
        mode = self.failure or ("graph" if self.calls == calls_per_graph else f"graph, {self.calls} calls per replay")
        return f"{mode}, {samples} replays" if samples < replays else mode


def prepare(thunk, calls_per_graph: int, group) -> Prepared:
    """As the collective bench times (bench/timing.py: ``time_graph``): ``graph_calls`` calls in one CUDA
    graph (fewer only for a call slower than this module's GRAPH_BUDGET_US / calls_per_graph, the
    slowest rank's eager call deciding), eager calls where capture fails on any rank.

    Until 2026-11-27 this captured 3 calls and isolated every replay (barrier, synchronize, replay,
    synchronize): each sample then held a graph launch onto an idle GPU and the ranks' start skew,
    a floor of about 5-20 us per call at world size 4 (benchmarks/NOTES.md, "fused bench at world size
    4: small-shape floor")."""
    thunk()
    torch.cuda.synchronize()
    call_us = max(agreed(event_times_us(thunk, 1, group=group)[0], group))
    calls = graph_calls(call_us, calls_per_graph, GRAPH_BUDGET_US)
    # (capture_steps, under CapturedCalls, holds the garbage collector off: tensors of earlier cases,
    # which torch's symmetric-memory ops allocate themselves, must not be freed during the capture)
    try:
        captured, failure = CapturedCalls(thunk, calls), None
    except Exception as exc:  # noqa: BLE001 - not every baseline can be captured
        torch.cuda.synchronize()
        captured, failure = None, f"eager (capture failed: {type(exc).__name__}: {str(exc)[:80]})"
    failure = next((f for f in agreed(failure, group) if f is not None), None)
    return Prepared(thunk, calls, None if failure else captured, failure, call_us)


def time_round(prepared: Prepared, plan: TimingPlan, group) -> Timing:
    """One round of a prepared implementation: WARMUP_REPLAYS replays, then the timed replays back to
    back after one barrier (every rank the same number); eager calls where it was not captured."""
    if prepared.captured is None:
        return time_eager(prepared.thunk, replace(plan, mode="eager"), group, host=False)
    return time_graph(prepared.captured, plan, group)


def time_alone(thunk, replays: int, calls_per_graph: int, group) -> tuple[Timing, str]:
    """One implementation alone, in one round: every rank's samples (us per call) and the timing note."""
    prepared = prepare(thunk, calls_per_graph, group)
    timing = time_round(prepared, replay_plan(replays, prepared.calls), group)
    return timing, prepared.mode(len(timing.samples_us), replays, calls_per_graph)


def slowest_rank(samples_us, group, round_medians: list | None = None) -> dict:
    """The slowest rank's median (the row's time) with its p20 / p80, and every rank's median; with
    ``round_medians`` (this rank's median of each round), the slowest rank's of each round too."""
    summaries = agreed(summarize(samples_us), group)
    slowest = max(summaries, key=lambda s: s.median_us)
    spread = {"median_us": slowest.median_us, "p20_us": slowest.p20_us, "p80_us": slowest.p80_us,
              "per_rank_median_us": [s.median_us for s in summaries]}
    if round_medians is not None:
        spread["round_median_us"] = slowest_rounds(round_medians, group)
    return spread


@dataclass(eq=False)  # (hashed by identity: bench/rounds.py keys its results by implementation)
class Implementation:
    """One row of a shape: what it runs and, once checked and captured, what it measured."""

    name: str
    family: str                          # local | symmcoll | baseline
    what: object = None                  # an algorithm name, or a baseline's maker
    thunk: Callable | None = None
    inputs: tuple = ()
    err: float | None = None
    prepared: Prepared | None = None
    error: str | None = None
    nbytes: int | None = None
    samples: list = field(default_factory=list)
    round_medians: list = field(default_factory=list)
    # for each of its rounds, the index of the same round in cuBLAS's round_medians (cuBLAS is timed
    # in every batch: its rounds are those of all batches)
    local_rounds: list = field(default_factory=list)
    per_round: int | None = None         # timed replays a round, where planned
    mode: str | None = None              # the row's timing note
    calls_per_sample: int = 1

    def timed(self, replays: int, calls_per_graph: int) -> None:
        """Its rounds are over: the timing note, and the graph (with its memory) let go."""
        if self.prepared is not None:
            self.mode = self.prepared.mode(len(self.samples), replays, calls_per_graph)
            self.calls_per_sample = self.prepared.calls if self.prepared.captured is not None else 1
        self.prepared, self.thunk, self.inputs = None, None, ()


def rank_device() -> torch.device:
    """This rank's GPU (the CPU tests of bench/fused.py put the CPU in its place)."""
    return torch.device("cuda", torch.cuda.current_device())


def free_share(group) -> float:
    """The least share of its GPU's memory any rank has free, counting what torch's allocator holds unused."""
    free, total = torch.cuda.mem_get_info()
    unused = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    return min(agreed((free + unused) / total, group))


# A timed batch's graphs and inputs, dropped by ``Implementation.timed``, given back to the GPU before the
# next batch is captured (and before free_share is asked again); a name of this module so that the CPU
# tests can replace it.
release = release_gpu_memory


def timing_details(impl: Implementation, spread: dict, local_rounds: list) -> dict:
    """A row's timing details: calls per graph, timed samples (all rounds), the slowest rank's p20 / p80,
    every rank's median (the spread that tells launch skew from the op's own time), the rounds, the
    replays of each and the slowest rank's median in each (the drift a single pass would have handed to
    whatever came later), and the ratio to cuBLAS round by round and their median (``x_cublas_paired``)."""
    ours = spread["round_median_us"]
    theirs = [local_rounds[i] if i < len(local_rounds) else None for i in impl.local_rounds]
    ratios = paired_ratios(ours, theirs) if local_rounds else []
    return {"calls_per_graph": impl.calls_per_sample, "samples": len(impl.samples),
            **{k: v for k, v in spread.items() if k != "median_us"}, "rounds": len(ours),
            "replays_per_round": impl.per_round, "x_cublas_per_round": ratios or None,
            "x_cublas_paired": paired_ratio(ratios)}
