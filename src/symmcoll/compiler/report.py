"""What ``symmcoll.backend`` did to each graph it compiled: every functional collective, what it became
(a fused op, a plain symmcoll op) or why it was left as it was, and the reasons the fused patterns
that were tried did not apply."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Entry:
    """One functional collective of a graph.

    collective: the node's name and op (``all_reduce_2 (all_reduce)``); result: the symmcoll op it
    became (``symmcoll.matmul_all_reduce``), or None where it was left; detail: the nodes fused with it,
    or why it was left; skipped: ``(pattern, reason)`` of the fused patterns tried first."""

    collective: str
    result: str | None
    detail: str = ""
    skipped: tuple[tuple[str, str], ...] = ()

    def lines(self) -> list[str]:
        head = f"  {'rewritten' if self.result else 'left':<9}  {self.collective}"
        head += f" -> {self.result}" if self.result else ""
        head += f": {self.detail}" if self.detail else ""
        return [head] + [f"             (not {pattern}: {reason})" for pattern, reason in self.skipped]


@dataclass
class GraphReport:
    """The report of one graph: ``kind`` is "forward", "backward" or "inference"."""

    kind: str
    entries: list[Entry] = field(default_factory=list)
    # Ops of the graph after the rewrite, by name ("symmcoll.all_gather_matmul", "_c10d_functional.all_reduce").
    ops_after: Counter = field(default_factory=Counter)
    note: str = ""

    @property
    def rewritten(self) -> list[Entry]:
        return [e for e in self.entries if e.result]

    @property
    def left(self) -> list[Entry]:
        return [e for e in self.entries if not e.result]

    def count(self, name: str) -> int:
        """How many ops of the rewritten graph are ``name`` ("symmcoll.all_reduce"), or have names
        starting with it where it ends with a dot ("symmcoll.", "_c10d_functional.")."""
        if name.endswith("."):
            return sum(n for op, n in self.ops_after.items() if op.startswith(name))
        return self.ops_after[name]

    def __str__(self) -> str:
        lines = [f"symmcoll.backend: {self.kind} graph: {len(self.rewritten)} collective(s) rewritten, "
                 f"{len(self.left)} left" + (f" ({self.note})" if self.note else "")]
        for entry in self.entries:
            lines += entry.lines()
        return "\n".join(lines)
