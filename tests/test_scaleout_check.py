"""benchmarks/scaleout_check.py on CPU ranks (2 emulated nodes of 1), as scripts/gpu_check.sh scaleout-multi
runs it on GPUs: every case reported and exact, each rank's journal written as it runs; a case that one
rank alone fails is followed by a reset on every rank together (the later cases stay exact: a rank
resetting alone would, under NVSHMEM, wait in the collective free for ranks that never come); a rank
that hangs is ended by its phase limit and named with the phase, and the next configuration still runs;
a time budget stops every rank at the same case; a SIGTERM keeps what ran and ends the ranks."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the script's own CPU mode (GPU: gpu_check.sh scaleout-multi)")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scaleout_check.py"
CASES = 26  # scaleout_cases.cases_for(2, cuda=False)


def _start(tmp_path, *args):
    out = tmp_path / "scaleout.json"
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--no-compile", "--out", str(out), *args]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", SYMMCOLL_TIMEOUT_S="5")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env), out


def _run(tmp_path, *args, timeout=400):
    proc, out = _start(tmp_path, *args)
    log, _ = proc.communicate(timeout=timeout)
    return proc.returncode, log, json.loads(out.read_text())


def _cases(result, config="2x1"):
    return [r for r in result["rows"] if r.get("config") == config and r["op"] not in ("phase", "phases", "left_out")]


def test_every_case_reported_exact_with_journals(tmp_path):
    rc, log, result = _run(tmp_path)
    assert rc == 0, log[-4000:]
    cases = _cases(result)
    assert [r["index"] for r in cases] == list(range(CASES)), log[-4000:]
    assert all(r["wrong"] == 0 and "error" not in r and r["ranks"] == 2 and r["ms_first"] > 0 for r in cases)
    assert cases[0]["op"] == "all_reduce" and cases[0]["algorithm"] == "hierarchical"
    assert {r["algorithm"] for r in cases} == {"hierarchical", "hierarchical_get"}
    assert result["summary"]["2x1"]["exact"] == CASES and result["summary"]["2x1"]["outcome"] == "finished"
    assert "workspace" in result["summary"]["2x1"]["phase_s"]
    # Each rank's journal: begin and end of every phase, one case record per case, the rank's pid.
    journals = tmp_path / "scaleout.journal"
    for rank in (0, 1):
        records = [json.loads(line) for line in (journals / f"2x1-rank{rank}.jsonl").read_text().splitlines()]
        assert records[0]["event"] == "start" and records[-1]["event"] == "finish"
        assert sum(r["event"] == "case" for r in records) == CASES
        assert sum(r["event"] == "begin" for r in records) == sum(r["event"] == "end" for r in records)
    assert len((journals / "pids").read_text().split()) == 2
    # Progress as it happens, one line each (ranks and parent share stdout), then the summary.
    assert "2x1 rank 1: all_reduce bfloat16 n=6 (hierarchical): exact" in log
    assert f"SUMMARY 2x1: {CASES} of {CASES} cases exact" in log
    assert all(line == "" or line.startswith(("[", "    ", "SUMMARY", "PROBLEMS")) for line in log.splitlines()), log


def test_one_rank_failing_a_case_resets_every_rank(tmp_path):
    # (the first 6 cases: case 1 fails on rank 0 alone, the four after it must be exact)
    rc, log, result = _run(tmp_path, "--inject", "fail:0:0:1", "--cases", "6")
    assert rc == 1
    cases = _cases(result)
    assert len(cases) == 6 and result["summary"]["2x1"]["cases"] == 6
    failed = [r for r in cases if r.get("error")]
    assert [r["index"] for r in failed] == [1] and failed[0]["error"].startswith("rank 0: "), failed
    assert "injected failure" in failed[0]["error"]
    # Every later case exact: the ranks reset together before case 2.
    assert all(r["wrong"] == 0 and "error" not in r for r in cases[2:]), [r for r in cases[2:] if r.get("error")]
    for rank in (0, 1):
        text = (tmp_path / "scaleout.journal" / f"2x1-rank{rank}.jsonl").read_text()
        assert '"phase": "reset (a rank failed the last case)"' in text


def test_a_hanging_rank_is_named_with_its_phase_and_the_next_configuration_runs(tmp_path):
    began = time.monotonic()
    # A budget that does not bind (the default's share of it ran out on a loaded 2-core CI machine after 24 of the
    # second configuration's 26 cases): this test is about the hang, test_time_budget_... about the budget.
    # (the first 4 cases of each configuration: the hang is case 2 of the first; the second runs its 4 exact)
    rc, log, result = _run(tmp_path, "--configs", "2x1,2x1", "--inject", "hang:0:1:2", "--phase-limit-s", "8",
                           "--budget-s", "1200", "--cases", "4")
    assert rc == 1 and time.monotonic() - began < 400, log[-4000:]
    first = [r for r in result["rows"] if r.get("config") == "2x1-0"]
    assert [r["index"] for r in _cases(result, "2x1-0")][:2] == [0, 1]
    assert all(not r.get("error") for r in _cases(result, "2x1-0")[:2])
    stuck = [r for r in first if r["op"] == "phase"]
    assert len(stuck) == 1 and stuck[0]["stuck_phase"] == "case #2 call 0: all_gather bfloat16", stuck
    assert stuck[0]["stuck_ranks"] == [1] and "timed out or killed in phase" in stuck[0]["error"]
    assert result["summary"]["2x1-0"]["stuck"] == [{"phase": "case #2 call 0: all_gather bfloat16", "ranks": [1]}]
    assert "Timeout (0:00:08)!" in log  # the hung rank's stacks, dumped by its watchdog
    assert result["summary"]["2x1-1"]["exact"] == 4 and result["summary"]["2x1-1"]["outcome"] == "finished"


def test_time_budget_stops_every_rank_at_the_same_case(tmp_path):
    rc, log, result = _run(tmp_path, "--budget-s", "5")
    assert rc == 0, log[-4000:]
    cases = _cases(result)
    assert 1 <= len(cases) < CASES and all(r["wrong"] == 0 and "error" not in r for r in cases)
    left, = [r for r in result["rows"] if r["op"] == "left_out"]
    assert left["ranks"] == 2 and left["cases"] == list(range(len(cases), CASES)) and "error" not in left


def test_sigterm_keeps_what_ran_and_ends_the_ranks(tmp_path):
    proc, out = _start(tmp_path, "--inject", "hang:0:0:1", "--phase-limit-s", "300")
    lines = []
    for line in proc.stdout:  # wait until rank 0 hangs in case 1 (its begin line), then stop the check
        lines.append(line)
        if "rank 0: case #1 call 0" in line:
            break
    # ... once rank 1 has journaled case 0 too: on a loaded 2-core machine rank 0's line came before rank 1's
    # record reached its journal, and the check then (rightly) had no row of case 0 from every rank.
    journal = tmp_path / "scaleout.journal" / "2x1-rank1.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and '"event": "case"' not in (journal.read_text() if journal.exists() else ""):
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    log = "".join(lines) + rest
    assert proc.returncode == 1, log[-4000:]
    result = json.loads(out.read_text())
    assert result["summary"]["2x1"]["outcome"].startswith("stopped by SIGTERM"), result["summary"]
    assert [r["index"] for r in _cases(result) if not r.get("error")] == [0]
    stuck = {s["phase"]: s["ranks"] for s in result["summary"]["2x1"]["stuck"]}
    assert 0 in stuck["case #1 call 0: reduce_scatter bfloat16"], stuck  # (rank 1 may still wait there too)
    for pid in (tmp_path / "scaleout.journal" / "pids").read_text().split():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
