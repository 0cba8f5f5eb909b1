"""The result file: one JSON document per run, the only input plots and later comparisons read.

Every figure of the run is in it (per implementation and size: slowest rank's median and p20/p80,
every rank's median, algbw, busbw, #wrong before and after timing, % of the link limit) together with
where it came from (git sha, versions, GPU, world size, timing mode). ``load(write(r)) == r``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .plan import TimingPlan

SCHEMA = "symmcoll.bench/1"
# The family of lossy implementations (all_reduce(x, quantize=...)): timed and checked against their
# error bound, but never "best" among exact implementations nor a candidate of the dispatch table.
QUANTIZED = "symmcoll_quantized"


@dataclass(frozen=True)
class Measurement:
    """One implementation of one op at one size. Times are per call, in microseconds, of the slowest
    rank (the rank whose median is largest); ``None`` where nothing was timed (see ``error``)."""

    op: str
    implementation: str
    family: str                 # "symmcoll" | "backend" (NCCL/gloo) | "torch_symm_mem" | "torch_copy_in" | QUANTIZED
    size_bytes: int             # see metrics.SIZE_CONVENTION
    count: int                  # elements of size_bytes
    dtype: str
    timing: str                 # how this row was actually timed: graph | eager | cpu
    calls_per_sample: int       # calls per timed sample (calls per graph; 1 otherwise)
    samples: int                # timed samples per rank
    median_us: float | None
    p20_us: float | None
    p80_us: float | None
    per_rank_median_us: tuple[float, ...]
    algbw_gbps: float | None
    busbw_gbps: float | None
    link_percent: float | None  # busbw / measured link bandwidth; None where no link was measured
    wrong_before: int | None    # wrong elements, summed over ranks, before timing (None: not checked)
    wrong_after: int | None     # ... after timing, on fresh data (and a graph replay, out-of-place ops)
    wrong: int | None           # the #wrong column: wrong_before + wrong_after
    error: str | None           # why the row is incomplete (first failing rank and stage)
    note: str | None            # e.g. graph capture failed, timed eagerly
    host_us: float | None = None  # eager timing: CPU time per call, slowest rank (timing.host_time_us)

    @property
    def ok(self) -> bool:
        """Timed and checked, with no wrong element."""
        return self.error is None and self.median_us is not None and self.wrong == 0


@dataclass(frozen=True)
class Provenance:
    git_sha: str
    symmcoll_version: str
    torch_version: str
    triton_version: str
    nccl_version: str | None
    python_version: str
    hostname: str
    device_type: str            # cuda | cpu
    gpu_name: str | None
    gpu_count: int
    backend: str                # torch.distributed backend of the ranks: nccl | gloo
    created_utc: str


@dataclass(frozen=True)
class RunConfig:
    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    dtype: str
    world_size: int
    plan: TimingPlan
    algorithms: tuple[str, ...] | None  # the --algorithms filter; None = all
    launcher: str                       # "pool" (symmcoll started the ranks) | "torchrun"


@dataclass(frozen=True)
class LinkLimit:
    """Peer-to-peer bandwidth measured in the same run: every rank pulls ``bytes`` from the next rank's
    symmetric buffer at once (copy engine via ``copy_``, and SM loads via a Triton kernel); each figure
    is the slowest rank's. The bound used for "% of link" is the better of the two."""

    bytes: int
    copy_engine_gbps: float | None
    sm_pull_gbps: float | None
    note: str | None

    @property
    def bound_gbps(self) -> float | None:
        measured = [v for v in (self.copy_engine_gbps, self.sm_pull_gbps) if v]
        return max(measured) if measured else None


@dataclass(frozen=True)
class BenchResult:
    schema: str
    provenance: Provenance
    config: RunConfig
    link: LinkLimit | None
    measurements: tuple[Measurement, ...]
    notes: tuple[str, ...]

    def ops(self) -> list[str]:
        return [op for op in self.config.ops if any(m.op == op for m in self.measurements)]

    def implementations(self, op: str) -> list[str]:
        """Implementation names of ``op`` in the order they were measured."""
        return list(dict.fromkeys(m.implementation for m in self.measurements if m.op == op))

    def rows(self, op: str, implementation: str) -> list[Measurement]:
        return [m for m in self.measurements if m.op == op and m.implementation == implementation]


def to_dict(result: BenchResult) -> dict:
    return dataclasses.asdict(result)


def from_dict(data: dict) -> BenchResult:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a symmcoll benchmark result (schema {data.get('schema')!r}, "
                         f"expected {SCHEMA!r})")
    config = dict(data["config"], plan=_build(TimingPlan, data["config"]["plan"]))
    return BenchResult(
        schema=data["schema"],
        provenance=_build(Provenance, data["provenance"]),
        config=_build(RunConfig, config),
        link=_build(LinkLimit, data["link"]) if data.get("link") else None,
        measurements=tuple(_build(Measurement, m) for m in data["measurements"]),
        notes=tuple(data["notes"]),
    )


def _build(cls, values: dict):
    """A frozen dataclass from its JSON dict; JSON arrays come back as the tuples they were."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def write(result: BenchResult, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_dict(result), indent=1) + "\n")
    return path


def load(path: str | Path) -> BenchResult:
    return from_dict(json.loads(Path(path).read_text()))


def default_filename(result: BenchResult) -> str:
    """e.g. 20260121-203000-h200-ws4-graph-bf16.json: sortable by time, says what it is."""
    p, c = result.provenance, result.config
    stamp = p.created_utc.replace("-", "").replace(":", "").replace("T", "-")[:15]
    device = _slug(p.gpu_name) if p.gpu_name else "cpu"
    return f"{stamp}-{device}-ws{c.world_size}-{c.plan.mode}-{c.dtype}.json"


def _slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200' (the model, the part that tells runs apart)."""
    words = [w for w in name.lower().replace("nvidia", "").split() if w]
    return "-".join(words)[:24] or "gpu"
