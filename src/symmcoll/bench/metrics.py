"""What a benchmark number means: sizes per op, algbw/busbw as nccl-tests defines them, percentiles,
and the link-limited bound.

Size convention (the "size" column and -b/-e):
  * all_reduce, all_to_all: bytes of the tensor each rank passes in (= bytes it gets back);
  * all_gather: bytes each rank contributes (its input shard; the output is world * size);
  * reduce_scatter: bytes each rank gets back (its output shard; the input is world * size).
This is what ANCHORS.md tabulates ("bytes per rank" for AG/RS), so figures compare directly.

Bandwidths follow nccl-tests exactly, so busbw is comparable across ops and against the link:
  algbw = nccl_bytes / time, where nccl_bytes is nccl-tests' "size": the tensor for all_reduce and
  all_to_all, the whole gathered / scattered tensor (world * size) for all_gather and reduce_scatter;
  busbw = algbw * factor, factor 2(n-1)/n for all_reduce and (n-1)/n for the other three.
busbw is then the bytes each rank must move over its links per second, so the link-limited time
bound of any of the four is nccl_bytes * factor / B and "% of link" is simply busbw / B.
GB here is 1e9 bytes (as nccl-tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
REDUCTIONS = frozenset({"all_reduce", "reduce_scatter"})

SIZE_CONVENTION = {
    "all_reduce": "size = bytes per rank (in = out); algbw = size/time; busbw = algbw*2(n-1)/n",
    "all_to_all": "size = bytes per rank (in = out); algbw = size/time; busbw = algbw*(n-1)/n",
    "all_gather": "size = input bytes per rank (output = n*size); algbw = n*size/time; "
                  "busbw = algbw*(n-1)/n",
    "reduce_scatter": "size = output bytes per rank (input = n*size); algbw = n*size/time; "
                      "busbw = algbw*(n-1)/n",
}


def check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")


def busbw_factor(op: str, world: int) -> float:
    check_op(op)
    if op == "all_reduce":
        return 2 * (world - 1) / world
    return (world - 1) / world


def nccl_bytes(op: str, size_bytes: int, world: int) -> int:
    """nccl-tests' "size" for this op: the byte count algbw divides by the time."""
    check_op(op)
    return size_bytes * world if op in ("all_gather", "reduce_scatter") else size_bytes


def input_numel(op: str, count: int, world: int) -> int:
    """Elements each rank passes in, for ``count`` elements of "size"."""
    return count * world if op == "reduce_scatter" else count


def output_numel(op: str, count: int, world: int) -> int:
    return count * world if op == "all_gather" else count


def count_for(op: str, size_bytes: int, itemsize: int, world: int) -> int:
    """Elements of "size" (0 if it holds none); all_to_all needs a multiple of the world size
    (equal splits), so its count is rounded down to one."""
    count = size_bytes // itemsize
    if op == "all_to_all":
        count -= count % world
    return count


@dataclass(frozen=True)
class Bandwidth:
    algbw_gbps: float
    busbw_gbps: float


def bandwidth(op: str, size_bytes: int, world: int, time_us: float) -> Bandwidth:
    algbw = nccl_bytes(op, size_bytes, world) / (time_us * 1e-6) / 1e9
    return Bandwidth(algbw, algbw * busbw_factor(op, world))


def link_percent(busbw_gbps: float, link_gbps: float) -> float:
    """How close a result comes to the link-limited bound (100 = at the bound)."""
    return 100.0 * busbw_gbps / link_gbps


@dataclass(frozen=True)
class Summary:
    """Median and spread of one rank's per-call times, in microseconds."""

    median_us: float
    p20_us: float
    p80_us: float


def summarize(samples_us) -> Summary:
    values = np.asarray(list(samples_us), dtype=np.float64)
    if values.size == 0:
        raise ValueError("no samples to summarize")
    p20, median, p80 = np.percentile(values, [20, 50, 80])
    return Summary(float(median), float(p20), float(p80))
