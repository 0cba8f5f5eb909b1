"""``algorithm="auto"``: the fastest measured algorithm per (op, world size, dtype, size).

The table is a list of rules ``(op, world_size, dtype, max_bytes) -> algorithm``, sizes as ``symmcoll
bench`` reports them (bytes per rank of the input; of the output for reduce_scatter): for a call of
``nbytes`` the first rule of its (op, world size, dtype) with ``nbytes <= max_bytes`` wins, and past the
last rule the last one holds. Rules come from benchmark results (``table_from_results``; the fused
ops' from the fused bench's rows, ``rules_from_fused_rows``, keyed by M * N * K): at each
measured size the fastest correct implementation among symmcoll's algorithms and the backend (NCCL),
consecutive sizes with the same winner merged into one rule.

Which table is used, first found: ``$SYMMCOLL_DISPATCH_FILE``; the file ``symmcoll tune`` writes
(``~/.cache/symmcoll/dispatch.json``); the table shipped with the package for this GPU model
(``data/dispatch_<model>.json``: h200, h100), else the H200 one (also on CPU). A case the table does
not know (another world size) uses the nearest world size of the same op, except a group of one: rules
measured on several ranks weigh communication it does not have (a fused op's one-rank call runs its
default). A rule may name ``DEFAULT`` ("default"): the op's built-in default at those sizes (``plan.default_algorithm``,
which may depend on the shape, as matmul_all_reduce's one-shot decode rule does) -- how a table keeps the default
below a measured crossover, or at a world size it has not measured (which would otherwise take the nearest one's
rules). What the table names is only a proposal: ``symmcoll.plan`` decides what runs (an unsupported case goes to
the process group's own collective, "nccl"; gloo on CPU).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

from .fused.gemm_tables import device_facts, table_path

log = logging.getLogger("symmcoll")

FALLBACK = "nccl"
DEFAULT = "default"  # a rule's algorithm: the op's built-in default (plan.default_algorithm)
USER_TABLE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "symmcoll" / "dispatch.json"
# The GPU models' tables live beside the GEMM and roofline tables (gemm_tables.table_path); the H200 one
# serves every GPU without a table of its own, and CPU.
PACKAGED_TABLE = table_path("h200", "dispatch")


def packaged_table(model: str | None) -> Path:
    """The shipped table of a GPU model ('h100', 'h200'; None: not known), else the H200 one."""
    own = table_path(model, "dispatch") if model else None
    return own if own is not None and own.is_file() else PACKAGED_TABLE


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Rule:
    op: str
    world_size: int
    dtype: str
    max_bytes: int
    algorithm: str


@dataclass(frozen=True)
class Table:
    rules: tuple[Rule, ...]
    source: str

    def choose(self, op: str, world_size: int, dtype: str, nbytes: int) -> str | None:
        """The algorithm for this case, or None if the table has no rule for ``op``."""
        candidates = [r for r in self.rules if r.op == op]
        if not candidates:
            return None
        sizes = {r.world_size for r in candidates}
        if world_size == 1 and 1 not in sizes:
            return None  # rules measured on several ranks weigh communication that one rank does not have
        world = min(sizes, key=lambda w: (abs(w - world_size), -w))
        same = [r for r in candidates if r.world_size == world]
        rules = [r for r in same if r.dtype == dtype] or [r for r in same if r.dtype == "bf16"] or same
        rules = sorted(rules, key=lambda r: r.max_bytes)
        for rule in rules:
            if nbytes <= rule.max_bytes:
                return rule.algorithm
        return rules[-1].algorithm

    def to_json(self) -> str:
        return json.dumps({"source": self.source, "rules": [asdict(r) for r in self.rules]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Table":
        data = json.loads(text)
        return cls(tuple(Rule(**r) for r in data["rules"]), data.get("source", "?"))


def table_from_results(results, source: str) -> Table:
    """Rules from ``bench.results.BenchResult``s: the fastest correct symmcoll algorithm or backend
    collective at each measured size, merged over consecutive sizes. Runs of the same (op, world size,
    dtype) are pooled: at a size two runs measured, the faster row wins (one run may stop early, or time
    only some implementations at its last size)."""
    by_case: dict[tuple[str, int, str], dict[int, tuple[float, str]]] = {}
    for result in results:
        world = result.config.world_size
        # The fallback as symmcoll runs it ("symmcoll:nccl", out of place) where the run measured it;
        # otherwise the backend's own (in-place) row stands in for it.
        # A row of a graph run timed eagerly because its capture failed is no candidate: auto runs
        # where graphs are captured (2026-11-27: the fallback's all_to_all read counts on the host).
        rows = [m for m in result.measurements if not (result.config.plan.mode == "graph" and m.timing == "eager")]
        measured_fallback = {m.op for m in rows if m.implementation == f"symmcoll:{FALLBACK}"}
        for m in rows:
            if not m.ok or m.family not in ("symmcoll", "backend"):
                continue
            if m.family == "backend" and m.op in measured_fallback:
                continue
            name = m.implementation.split(":", 1)[1] if m.family == "symmcoll" else FALLBACK
            if name == "auto":
                continue
            best = by_case.setdefault((m.op, world, m.dtype), {})
            if m.size_bytes not in best or m.median_us < best[m.size_bytes][0]:
                best[m.size_bytes] = (m.median_us, name)
    rules = [rule for (op, world, dtype), winners in by_case.items() for rule in _merged_rules(op, world, dtype, winners)]
    return Table(tuple(rules), source)


def rules_from_fused_rows(rows: list[dict]) -> list[Rule]:
    """Rules from the fused bench's rows (bench/fused.py): at each measured shape the fastest correct
    symmcoll variant, keyed by M * N * K (the op's dispatch size), consecutive shapes with the same
    winner merged."""
    best: dict[tuple, dict[int, tuple[float, str]]] = {}
    for r in rows:
        if r["family"] != "symmcoll" or r["error"] or r["median_us"] is None or r["implementation"] == "symmcoll:auto" \
                or len(r["shape"]) > 2 and r["op"] == "all_reduce_rms_norm":  # fp8 output: keyed like bf16
            continue
        size = 1
        for v in r["shape"]:
            size *= v
        case = best.setdefault((r["op"], r["world_size"], r["dtype"]), {})
        name = r["implementation"].split(":", 1)[1].partition("@")[0]  # (a repeat, "unfused@2": its algorithm)
        if size not in case or r["median_us"] < case[size][0]:
            case[size] = (r["median_us"], name)
    return [rule for (op, world, dtype), winners in best.items() for rule in _merged_rules(op, world, dtype, winners)]


def _merged_rules(op: str, world: int, dtype: str, winners: dict[int, tuple[float, str]]) -> list[Rule]:
    """One case's rules from its winner at each measured size ({size: (us, algorithm)}): one rule per run
    of consecutive sizes with the same winner, at the run's largest size."""
    sizes = sorted(winners)
    return [Rule(op, world, dtype, size, winners[size][1]) for i, size in enumerate(sizes)
            if i + 1 == len(sizes) or winners[sizes[i + 1]][1] != winners[size][1]]


@lru_cache(maxsize=4)
def _table_for(model: str | None) -> Table:
    for path in (os.environ.get("SYMMCOLL_DISPATCH_FILE"), USER_TABLE, packaged_table(model)):
        if path and Path(path).is_file():
            table = Table.from_json(Path(path).read_text())
            return Table(table.rules, f"{path} ({table.source})")
    return Table((), "none (built-in defaults)")


def active_table(device: torch.device | None = None) -> Table:
    """The table ``algorithm="auto"`` reads for a call on ``device`` (see the module text); None: the
    H200's, the one every GPU without a table of its own reads."""
    return _table_for(device_facts(device)[0] if device is not None else None)


active_table.cache_clear = _table_for.cache_clear


def choose(op: str, world_size: int, dtype: torch.dtype, nbytes: int, device: torch.device | None = None) -> str | None:
    """The table's algorithm for this case on ``device`` (None if the table has no rule for ``op``)."""
    return active_table(device).choose(op, world_size, _DTYPE_NAMES.get(dtype, "other"), nbytes)
