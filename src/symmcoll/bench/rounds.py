"""Interleaved timing rounds: the implementations a bench compares, timed turn by turn in the same seconds.

A bench that times implementation after implementation hands any drift of the GPU (clock, temperature,
whatever else shares the machine) to whichever comes later: on one H100, at world size 1, the fused
bench's ``all_gather_matmul`` fused and copy_engine_producer (the same kernel at one rank) came out 4%
apart in one run and 10% in another (benchmarks/NOTES.md, "interleaved rounds"). So the fused bench
(bench/fused.py) and the decoder-block bench (bench/tp_block.py) prepare every implementation first
(check, compile, capture), then time them in ``rounds`` rounds: each round every implementation in
turn, the order rotated by one each round (A B C, B C A, C A B: nobody always first, nobody always
after the same neighbour), a share of the samples in each; a row's time is the median of all its
samples. bench/gemm.py alternates ours and cuBLAS the same way (its ROUNDS).

Rounds do not stop the GPU's own speed from drifting: on one H100 every implementation of a shape of a
millisecond or more, cuBLAS included, moved 5-28% between rounds (benchmarks/NOTES.md, "paired
rounds"), so a ratio of two medians over all samples still carries drift. ``paired_ratios`` divides
each round's median by the baseline's median of the same round (timed within the same fraction of a
second) and a row's ratio is the median of those; ``plan_rounds`` keeps a round short enough for that
(ROUND_BUDGET_S of GPU time for all implementations of a shape) by taking more rounds of fewer replays,
and at least DRIFT_ROUNDS of them there, so that the median of the paired ratios is itself tight.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import torch.distributed as dist

# Rounds per comparison when the command line does not say (`symmcoll bench --rounds`), and at least
# this many where rounds are planned (``plan_rounds``).
ROUNDS = 3
# A planned round (every implementation of a shape in turn, warm-up replays included) should take no
# more GPU time than this: drift seen on one H100 moved over seconds and in bursts of tens of ms, and a
# paired ratio cancels only what both sides of it saw.
ROUND_BUDGET_S = 0.15
# Planned rounds take at most this many rounds and at least this many timed replays a round (a round's
# median of one sample is one sample).
MAX_ROUNDS = 30
MIN_PER_ROUND = 2
# Where no round of ROUNDS rounds' share fits ROUND_BUDGET_S (millisecond shapes), at least this many rounds,
# whatever replays were asked: on one H100 single rounds' paired ratios there spread 0.84-1.27 (2026-11-27,
# results/2026-11-27-paired-qkv-h100/call1: matmul_all_reduce 512x8192x28672, 10 rounds of 2-3 replays), so
# the median of 10 is uncertain by ~3%, the size of issue 22's 1.03 bound; 25 make it ~2% (1.25 sigma /
# sqrt(rounds)) for ~2.5x the timed replays of those shapes -- seconds a shape, against its compile.
DRIFT_ROUNDS = 25


def rotation(names: Sequence, round_index: int) -> list:
    """The order of ``names`` in round ``round_index``: rotated left by one each round."""
    if not names:
        return []
    k = round_index % len(names)
    return list(names[k:]) + list(names[:k])


def per_round(total: int, rounds: int) -> int:
    """Samples per round so that ``rounds`` rounds give at least ``total`` (and at least one)."""
    return max(1, -(-total // max(rounds, 1)))


@dataclass(frozen=True)
class RoundPlan:
    """How a shape's implementations are timed: ``rounds`` rounds of ``per_round`` timed replays each."""

    rounds: int
    per_round: int


def plan_rounds(replay_s: Sequence[float], warmups: Sequence[int], replays: int,
                budget_s: float = ROUND_BUDGET_S, min_rounds: int = ROUNDS) -> RoundPlan:
    """Rounds and replays a round for implementations whose one replay takes ``replay_s`` seconds each
    (with ``warmups`` untimed replays each per round): about ``replays`` timed replays each in all, in the
    fewest rounds (at least ``min_rounds``) whose every round fits ``budget_s``. Where ``min_rounds`` rounds do
    not fit (the budget binds), fewer replays a round -- down to MIN_PER_ROUND (or ``replays`` / MAX_ROUNDS,
    the more) -- and at least DRIFT_ROUNDS rounds, at most MAX_ROUNDS. Fast shapes (tens of us, no drift
    seen) keep ``min_rounds`` rounds; millisecond shapes get 25-30 rounds of 2-5 replays."""
    def round_s(n: int) -> float:
        return sum(t * (n + w) for t, w in zip(replay_s, warmups))
    replays = max(1, replays)
    floor = max(MIN_PER_ROUND, -(-replays // MAX_ROUNDS))
    n = per_round(replays, min_rounds)
    binds = round_s(n) > budget_s
    while n > floor and round_s(n) > budget_s:
        n -= 1
    rounds = max(min_rounds, -(-replays // n), DRIFT_ROUNDS if binds else 0)
    return RoundPlan(min(MAX_ROUNDS, rounds), n)


def paired_ratios(rounds: Sequence[float | None], baseline_rounds: Sequence[float | None]) -> list[float]:
    """Each round's median over the baseline's median of the same round (rounds either lacks: left out)."""
    return [a / b for a, b in zip(rounds, baseline_rounds) if a is not None and b]


def paired_ratio(ratios: Sequence[float]) -> float | None:
    """A row's ratio to its baseline from ``paired_ratios``: their median (None without any). A drift of the
    GPU's speed that slows both sides of a round alike leaves it where it is."""
    return statistics.median(ratios) if ratios else None


@dataclass
class Interleaved:
    """What ``interleave`` measured: every name's samples over all rounds (in round order), each round's
    median per name, the error that took a name out (it was not timed after it), and the order of each
    round."""

    samples: dict = field(default_factory=dict)          # name -> [sample, ...]
    round_medians: dict = field(default_factory=dict)    # name -> [median of round 0, ...]
    errors: dict = field(default_factory=dict)           # name -> error text
    orders: list = field(default_factory=list)           # [[name, ...] per round]

    def median(self, name: Hashable) -> float | None:
        samples = self.samples.get(name)
        return statistics.median(samples) if samples else None


def interleave(names: Sequence[Hashable], rounds: int, time_one: Callable[[Hashable, int], Sequence[float]],
               agree: Callable[[str | None], str | None] = lambda error: error,
               on_failure: Callable[[Hashable, str], None] = lambda name, error: None) -> Interleaved:
    """Time ``names`` in ``rounds`` rotated rounds: ``time_one(name, round)`` gives that turn's samples or
    raises. ``agree(error or None)`` makes every rank see the same outcome of a turn (collective: the
    first error any rank saw); a name that failed is out of the later rounds, ``on_failure(name, error)``
    is called on every rank (e.g. to rebuild what the failure broke) before the next turn."""
    result = Interleaved(samples={n: [] for n in names}, round_medians={n: [] for n in names})
    live = list(names)
    for r in range(rounds):
        order = rotation(live, r)
        result.orders.append(order)
        for name in order:
            error, samples = None, ()
            try:
                samples = list(time_one(name, r))
            except Exception as exc:  # noqa: BLE001 - reported as the name's error; the others go on
                error = f"round {r + 1}: {type(exc).__name__}: {exc}"[:300]
            error = agree(error)
            if error is not None:
                result.errors[name] = error
                live.remove(name)
                on_failure(name, error)
                continue
            result.samples[name] += samples
            result.round_medians[name].append(statistics.median(samples) if samples else None)
    return result


# ---- agreement across ranks: every rank must time the same turns (the timed replays are collective) ---

def agreed(value, group) -> list:
    """Every rank's ``value`` (collective), in rank order."""
    values = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values


def slowest_rounds(round_medians: Sequence[float], group) -> list[float]:
    """Each round's slowest rank's median (collective; ``round_medians``: this rank's, one a round)."""
    return [max(per_rank) for per_rank in zip(*agreed(list(round_medians), group))]


def first_error(error: str | None, group) -> str | None:
    """The first error any rank saw (collective), prefixed with its rank: ``interleave``'s ``agree``."""
    mine = f"rank {dist.get_rank(group)}: {error}"[:300] if error else None
    return next((e for e in agreed(mine, group) if e), None)
