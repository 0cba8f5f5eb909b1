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
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

# Rounds per comparison when the command line does not say (`symmcoll bench --rounds`).
ROUNDS = 3


def rotation(names: Sequence, round_index: int) -> list:
    """The order of ``names`` in round ``round_index``: rotated left by one each round."""
    if not names:
        return []
    k = round_index % len(names)
    return list(names[k:]) + list(names[:k])


def per_round(total: int, rounds: int) -> int:
    """Samples per round so that ``rounds`` rounds give at least ``total`` (and at least one)."""
    return max(1, -(-total // max(rounds, 1)))


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
