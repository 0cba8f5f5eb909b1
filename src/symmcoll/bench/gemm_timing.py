"""How the GEMM grid (bench/gemm.py) times one cell: ours and cuBLAS each warmed, probed and captured
once, then replayed in paired rounds (bench/rounds.py ``interleave``) under a plan made from their pace
(``plan_cell``), so that the whole published grid fits one device call with a tune beside it.

Why a plan (until 2026-11-28 every cell was timed alike): 3 rounds, each capturing both graphs anew
(six captures a cell, each after a full garbage collection: timing.frozen_heap), each graph at least
20 calls, 12 replays of it a round. A 10 ms cell (70b-tp2 gate_up, M = 16384) took 14 s of GPU time for
600 timed GEMMs a side in 3 rounds of 5 s; the grid's 234 cells 176 s of GPU time (recomputed from
2026-11-27-gemm-settled-h100's cell times), 127 s of it at M >= 8192. With the collections, one H100
timed 208 of the 234 cells in 305 s (2026-11-27-paired-qkv-h100).

The plan (``plan_cell``), the same for both sides of a cell:
* calls per graph: as before (timing.graph_repeats: a replay of >= 200 us and >= 20 calls) wherever
  that replay is shorter than LONG_REPLAY_US; a longer call gets only as many passes over the input
  sets as make a replay of LONG_REPLAY_US (one, from 2 ms a pass);
* rounds: rounds.plan_rounds -- about ``replays`` timed replays a side in all, at least MIN_ROUNDS
  rounds, each round of both sides within rounds.ROUND_BUDGET_S of GPU time (more and shorter rounds
  at millisecond cells: a round's two sides then see the same GPU speed);
* untimed replays before each round's timed ones: WARMUP_REPLAYS, one for a replay of a millisecond or
  more.
On the settled H100 grid's cell times this plans ~31 s of GPU time for all 234 cells
(``planned_gpu_seconds``; tests/test_bench_gemm_plan.py holds the grid within one device call).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import gemm_energy
from .rounds import Interleaved, interleave, plan_rounds, rotation
from .timing import capture_passes, eager_pass_us, event_times_us, graph_repeats, replayed_us

# A replay this long needs no more calls: its start-up (a graph launch queued behind the previous
# replay, a few us) is <= 0.2% of it, and both sides have the same calls per graph. Every cell whose
# 20 calls (the short-call rule) last less keeps that rule: the grid's us-scale cells are captured
# as before.
LONG_REPLAY_US = 2000.0
# The paired ratio is the median of the per-round ratios; a round caught in a burst of drift moves it
# only where few rounds outvote it (2026-11-27-paired-qkv-h100, 70b-tp8 o M=16384 over 3 rounds:
# 0.862, 1.080, 0.880). Five rounds a cell at least (three until 2026-11-28).
MIN_ROUNDS = 5
# Untimed replays of each graph before each round's timed ones (graph_us: 2); one where a replay lasts
# LONG_WARMUP_S or more (already a millisecond of the same kernels; the fused bench's rule too).
WARMUP_REPLAYS = 2
LONG_WARMUP_S = 1e-3
# GPU work of a cell besides its rounds, for the plan's seconds: a side's eager passes over the input
# sets before its capture (one warms, two probe: timing.eager_pass_us), and the fp32 checks (ours
# before and after the rounds, cuBLAS before).
PREPARE_PASSES = 3
CHECK_CALLS = (2, 1)


@dataclass(frozen=True)
class CellPlan:
    """How a cell's two sides are timed: ``repeats`` passes over the input sets in one graph
    (``calls_per_graph`` calls), then ``rounds`` rounds of ``warmup`` untimed and ``per_round`` timed
    replays of each."""

    repeats: int
    calls_per_graph: int
    warmup: int
    rounds: int
    per_round: int

    def gpu_seconds(self, call_us: Sequence[float], sets: int) -> float:
        """The GPU time the cell's timing takes at ``call_us`` per call of each side (checks included)."""
        replays = self.rounds * (self.warmup + self.per_round) * self.calls_per_graph
        return sum(t * (PREPARE_PASSES * sets + replays + checks)
                   for t, checks in zip(call_us, CHECK_CALLS)) * 1e-6


def plan_cell(call_us: Sequence[float], sets: int, replays: int) -> CellPlan:
    """The plan for a cell whose sides take ``call_us`` per call (eager probes; ours first) over ``sets``
    input sets, ``replays`` timed replays a side in all (see the module's docstring). The faster side
    sizes the graph, so neither side's replay is shorter than the rule asks."""
    pass_us = max(min(call_us) * sets, 1e-3)
    repeats = max(1, min(graph_repeats(pass_us, sets), math.ceil(LONG_REPLAY_US / pass_us)))
    calls = repeats * sets
    replay_s = [t * calls * 1e-6 for t in call_us]
    warmup = 1 if max(replay_s) >= LONG_WARMUP_S else WARMUP_REPLAYS
    rounds = plan_rounds(replay_s, [warmup] * len(replay_s), replays, min_rounds=MIN_ROUNDS)
    return CellPlan(repeats, calls, warmup, rounds.rounds, rounds.per_round)


def planned_gpu_seconds(call_us: Sequence[float], sets: int, replays: int) -> float:
    """The GPU time ``plan_cell``'s plan of a cell takes (its sides at ``call_us``)."""
    return plan_cell(call_us, sets, replays).gpu_seconds(call_us, sets)


@dataclass
class PairTiming:
    """What a cell's rounds measured: each side's median per round (``rounds.Interleaved``), the plan,
    and the eager probes it was made from (us per call)."""

    measured: Interleaved
    plan: CellPlan
    probe_us: dict
    # what ``observe`` gave just before the first round and just after the last ({"before", "after"})
    around_rounds: dict | None = None
    # side -> [(before, after) reads of ``meter`` around its timed replays, one pair a round it ran]
    meters: dict | None = None
    # side -> gemm_energy.polled_window after the rounds (energy windows asked for)
    windows: dict | None = None

    def round_medians(self, side: str) -> list[float]:
        return self.measured.round_medians[side]

    def median_round(self, side: str) -> float:
        """The side's time: the median of its round medians."""
        return statistics.median(self.round_medians(side))


def metered_replays(captured, replays: int, warmup: int, meter: Callable[[], object]) -> tuple[list[float], tuple]:
    """``timing.replayed_us`` with ``meter`` read right before and right after the timed replays: after a
    synchronize that ends the warm-up replays (the window holds none of them), before the first timing
    event; after the synchronize that ``event_times_us`` makes past the last one. The GPU idles during
    the reads (tens of microseconds each), outside the events, as it idles between turns anyway."""
    for _ in range(warmup):
        captured.replay()
    torch.cuda.synchronize()
    before = meter()
    samples = event_times_us(captured.replay, replays, per=captured.calls, isolated=False)
    return samples, (before, meter())


def time_pair(sides: dict[str, list[Callable[[], object]]], sets: int, replays: int,
              observe: Callable[[], object] | None = None, meter: Callable[[], object] | None = None,
              window_s: float = 0.0) -> PairTiming:
    """Both sides of a cell (name -> one call per input set; ours first): each probed, the plan made from
    their probes, each captured once, then the planned rounds, the order rotated every round (ours
    first in even rounds, cuBLAS in odd). A side that raised in a round is out of the later ones
    (``measured.errors``). ``observe`` (e.g. the GPU's clock and temperature, bench/gpu_state.py) is
    called after the captures, before the first round, and after the last round's timed replays ended:
    outside every timed replay. ``meter`` (the energy counter and the SM clock: bench/gemm_energy.py) is
    read around each side's timed replays in every round (``metered_replays``: ``meters``); with
    ``window_s``, after the rounds each side in the next round's order is replayed for an energy window
    (gemm_energy.polled_window: ``windows``)."""
    probe_us = {name: eager_pass_us(calls) / sets for name, calls in sides.items()}
    plan = plan_cell(list(probe_us.values()), sets, replays)
    captured = {name: capture_passes(calls, plan.repeats) for name, calls in sides.items()}
    meters = {name: [] for name in sides} if meter else None

    def turn(name, _):
        if meter is None:
            return replayed_us(captured[name], plan.per_round, plan.warmup)
        samples, reads = metered_replays(captured[name], plan.per_round, plan.warmup, meter)
        meters[name].append(reads)
        return samples
    before = observe() if observe else None
    measured = interleave(list(sides), plan.rounds, turn)
    around = dict(before=before, after=observe()) if observe else None
    windows = None
    if meter and window_s > 0 and not measured.errors:  # (a replay's length from the rounds: the eager probe
        windows = {name: gemm_energy.polled_window(      # overstates short calls)
            captured[name].replay, plan.calls_per_graph, measured.median(name) * plan.calls_per_graph * 1e-6,
            window_s, meter) for name in rotation(list(sides), plan.rounds)}
    return PairTiming(measured, plan, probe_us, around, meters, windows)
