"""What each rank of a scale-out check did, written down as it happens, so that a hang or a kill keeps it.

A rank keeps a ``Journal``: JSON lines appended and flushed to its own file (``begin`` and ``end`` of every
phase, one ``case`` row per case) and a progress line on stdout for each, stamped with seconds since the
check started (the same origin in every process). Each phase arms ``faulthandler.dump_traceback_later``:
a watchdog in C, which needs no GIL (a thread blocked in NVSHMEM's initialisation may hold it), dumps every
thread's Python stack to stderr and ends the process once the phase has run past its limit. The phase
left open in the file is then the one that hung; the parent (``summarize``) turns the files of a
configuration into result rows whatever happened to the ranks: finished, failed, timed out or killed.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import sys
import time

# Rank processes of every configuration append their pid here (the stage ends leftovers by these pids).
PIDS_FILE = "pids"
# Phases named with this prefix are a case's calls; the rest (initialisation, agreements, resets) are
# added up per name in the summary's phase times.
CASE_PHASE = "case "


def emit(line: str) -> None:
    """``line`` on stdout in one write: the ranks and the parent share it (print's separate writes of text
    and newline interleave across processes); a pipe keeps writes up to 4 KiB whole."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line[:4000] + "\n").encode())


def journal_path(directory: str, label: str, rank: int) -> str:
    return os.path.join(directory, f"{label}-rank{rank}.jsonl")


class Journal:
    """One rank's record of one configuration (``label``, e.g. "2x1"), times counted from ``t0``
    (``time.time()`` when the check started)."""

    def __init__(self, directory: str, label: str, rank: int, t0: float):
        os.makedirs(directory, exist_ok=True)
        self.label, self.rank, self.t0 = label, rank, t0
        self._file = open(journal_path(directory, label, rank), "a", buffering=1)
        with open(os.path.join(directory, PIDS_FILE), "a") as f:
            f.write(f"{os.getpid()}\n")
        self._write({"event": "start", "pid": os.getpid()})

    def _now(self) -> float:
        return round(time.time() - self.t0, 2)

    def _write(self, record: dict) -> None:
        self._file.write(json.dumps({"t": self._now(), **record}) + "\n")
        self._file.flush()

    def say(self, text: str) -> None:
        emit(f"[{self._now():7.1f} s] {self.label} rank {self.rank}: {text}")

    @contextlib.contextmanager
    def phase(self, name: str, limit_s: float, say_begin: bool = True, say_end: bool = True):
        """Run the block as phase ``name``: its begin and end written down (and said, unless asked not to),
        its seconds returned in the yielded dict (key "s"); past ``limit_s`` the process dumps its stacks
        and ends (exit code 1)."""
        self._write({"event": "begin", "phase": name, "limit_s": limit_s})
        if say_begin:
            self.say(f"{name} (limit {limit_s:.0f} s) ...")
        faulthandler.dump_traceback_later(limit_s, exit=True, file=sys.stderr)
        timing = {}
        start = time.perf_counter()
        try:
            yield timing
        finally:
            faulthandler.cancel_dump_traceback_later()
            timing["s"] = round(time.perf_counter() - start, 3)
            self._write({"event": "end", "phase": name, "s": timing["s"]})
            if say_end:
                self.say(f"{name}: done in {timing['s']:.1f} s")

    def case(self, row: dict) -> None:
        self._write({"event": "case", **row})
        self.say(case_line(row))

    def close(self) -> None:
        self._write({"event": "finish"})
        self._file.close()


def case_line(row: dict) -> str:
    """One line for a case row (a rank's, or the ranks' merged)."""
    if row.get("note"):
        return f"{row['op']}: {row['note']}"
    what = row["op"]
    if "dtype" in row:
        what += f" {row['dtype'].replace('torch.', '')}"
    if "numel" in row or "tokens" in row:
        what += f" n={row['numel']}" if "numel" in row else f" {row['tokens']}x{row['hidden']} top-{row['k']}"
    if row.get("algorithm"):
        what += f" ({row['algorithm']})"
    if row.get("error"):
        verdict = "ERROR " + row["error"].strip().splitlines()[-1][:200]
    else:
        verdict = "exact" if row.get("wrong") == 0 else f"{row.get('wrong')} WRONG"
    times = ""
    if "ms_first" in row:
        times = f", first call {row['ms_first']:.1f} ms" + (f", then {row['ms_after']:.2f} ms" if "ms_after" in row else "")
    return f"{what}: {verdict}{times}"


def read(path: str) -> list[dict]:
    """The records of one journal file (a last line cut by a kill is dropped)."""
    records = []
    try:
        with open(path) as f:
            for line in f:
                with contextlib.suppress(json.JSONDecodeError):
                    records.append(json.loads(line))
    except FileNotFoundError:
        pass
    return records


def summarize(directory: str, label: str, world: int, base: dict, outcome: str) -> list[dict]:
    """Result rows of configuration ``label`` from its ranks' journals: one per case (the ranks' rows
    merged: wrong counts added, the slowest rank's times, errors named by rank), one per phase a rank
    left open ("timed out in phase P", or killed in it), one with every rank's seconds per phase name
    (calls excepted: the case rows have them).
    ``outcome``: how the ranks' run ended, as the parent saw it."""
    journals = {r: read(journal_path(directory, label, r)) for r in range(world)}
    cases: dict[int, dict] = {}
    for rank, records in journals.items():
        for rec in records:
            if rec.get("event") != "case":
                continue
            row = {k: v for k, v in rec.items() if k not in ("event", "t")}
            merged = cases.setdefault(row["index"], {**base, **row, "wrong": 0, "ranks": 0})
            merged["ranks"] += 1
            merged["wrong"] += row.get("wrong", 0)
            for key in ("ms_first", "ms_after"):
                if key in row:
                    merged[key] = max(merged.get(key, 0.0), row[key])
            if row.get("error"):
                merged.setdefault("errors", {})[str(rank)] = row["error"]
    rows = []
    for index in sorted(cases):
        row = cases[index]
        errors = row.pop("errors", None)
        row.pop("error", None)
        if errors:
            first = min(errors, key=int)
            row["error"] = f"rank {first}: {errors[first]}" + (f" (ranks {sorted(errors, key=int)} failed)"
                                                                if len(errors) > 1 else "")
        elif row["ranks"] < world:
            row["error"] = f"only {row['ranks']} of {world} ranks finished this case"
        rows.append(row)
    phases, stuck = {}, {}
    for rank, records in journals.items():
        open_phases, times = {}, {}
        for rec in records:
            if rec.get("event") == "begin":
                open_phases[rec["phase"]] = rec
            elif rec.get("event") == "end":
                open_phases.pop(rec["phase"], None)
                if not rec["phase"].startswith(CASE_PHASE):  # (the case rows have those times)
                    times[rec["phase"]] = round(times.get(rec["phase"], 0.0) + rec["s"], 3)
        phases[str(rank)] = times
        for name, rec in open_phases.items():
            stuck.setdefault(name, []).append((rank, rec["t"], rec.get("limit_s")))
        if not records:
            stuck.setdefault("rank start (no journal: the rank never reached the check)", []).append((rank, None, None))
    for name, ranks in stuck.items():
        rows.append({**base, "op": "phase", "error": f"timed out or killed in phase {name!r} "
                     f"(ranks {[r for r, _, _ in ranks]}; began at {[t for _, t, _ in ranks]} s, limit "
                     f"{ranks[0][2]} s); run: {outcome}", "stuck_phase": name, "stuck_ranks": [r for r, _, _ in ranks]})
    rows.append({**base, "op": "phases", "outcome": outcome, "phase_s": phases})
    return rows
