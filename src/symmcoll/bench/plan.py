"""What the parent asks the ranks to do: plain frozen dataclasses, pickled to every rank."""

from __future__ import annotations

from dataclasses import dataclass

# How each timing mode is done (see timing.py): CUDA-graph replays, eager calls timed with CUDA
# events, or perf_counter on CPU (interpreted kernels: not a performance figure).
TIMING_MODES = ("graph", "eager", "cpu")

DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class TimingPlan:
    """How one (implementation, size) is timed.

    mode: "graph" | "eager" | "cpu".
    warmup: untimed samples first (graph replays, or calls).
    iters: timed samples wanted (graph replays, or calls); fewer when ``seconds_per_case`` runs out.
    min_iters: never fewer timed samples than this, whatever the budget.
    calls_per_graph: calls captured in one CUDA graph (graph mode); a sample is one replay / this.
    seconds_per_case: time budget for the timed samples of one case (keeps 256 MB sweeps short).
    """

    mode: str
    warmup: int
    iters: int
    min_iters: int
    calls_per_graph: int
    seconds_per_case: float

    def __post_init__(self):
        if self.mode not in TIMING_MODES:
            raise ValueError(f"timing mode must be one of {TIMING_MODES}, got {self.mode!r}")
        if self.iters < 1 or self.min_iters < 1 or self.calls_per_graph < 1 or self.warmup < 0:
            raise ValueError(f"iters, min_iters and calls_per_graph must be >= 1, warmup >= 0: {self}")


@dataclass(frozen=True)
class Case:
    """One implementation of one op at one size."""

    op: str
    implementation: str
    size_bytes: int
    count: int
    dtype: str
    plan: TimingPlan
