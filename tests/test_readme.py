"""The README as a newcomer reads it: its code blocks run as written (as scripts, under torchrun on CPU),
its summary table is what the committed result files say, its links stay inside the repository, and
the two commands CI extracts are still there."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DEVICE

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _block(first_line: str) -> str:
    """The ```python block of README.md that starts with ``first_line`` (e.g. "# example.py")."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if b.splitlines()[0] == first_line]
    assert len(blocks) == 1, f"README.md has {len(blocks)} python blocks starting with {first_line!r}"
    return blocks[0]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    if DEVICE == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run_script(name: str, tmp_path: Path, timeout: float = 300) -> str:
    script = tmp_path / name
    script.write_text(_block(f"# {name}"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_two_commands_ci_extracts_are_unchanged():
    lines = README.splitlines()
    after = {lines[i]: lines[i + 1] for i in range(len(lines) - 1)}
    assert after["# run the main job (installs, then benchmarks; on a machine without GPUs it runs in CPU mode)"] == \
        "python3 -m pip install torch==2.13.0 -e . && symmcoll bench"
    assert after["# run the tests"] == 'python3 -m pip install torch==2.13.0 -e ".[test]" && python3 -m pytest -q'


def test_links_stay_inside_the_repository():
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    assert targets, "no links found: the pattern is wrong"
    for target in targets:
        assert "://" not in target and not target.startswith("/"), target
        path = (ROOT / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT) and path.exists(), target


def test_usage_example_runs_as_a_script(tmp_path):
    out = _run_script("example.py", tmp_path)
    assert out.splitlines() == ["rank 0: (3.0, 1.5, (16, 128), 1.0)", "rank 1: (3.0, 1.5, (16, 128), 1.0)"], out


@pytest.mark.skipif(DEVICE != "cpu", reason="the CPU command of the README")
def test_torchrun_example_on_cpu(tmp_path):
    (tmp_path / "torchrun_example.py").write_text(_block("# torchrun_example.py"))
    line = next(line for line in README.splitlines() if line.startswith("TRITON_INTERPRET=1 ") and "torchrun" in line)
    words = shlex.split(line.split("#")[0])
    assignments = dict(w.split("=", 1) for w in words if re.match(r"^[A-Z_]+=", w))
    command = [w for w in words if not re.match(r"^[A-Z_]+=", w)]
    assert command[0] == "torchrun" and assignments == {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    # torchrun as a module: the same program, found without relying on PATH
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", *command[1:]], cwd=tmp_path,
                          env=_env(**assignments), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["rank 0: 2.0", "rank 1: 2.0"], proc.stdout


def test_model_example_runs_as_a_script(tmp_path):
    # CPU: torch.compile with aot_eager, autograd, a subgroup, all_reduce_; GPU: inductor and CUDA graphs too.
    out = _run_script("model.py", tmp_path, timeout=600)
    logged = ast.literal_eval(out.strip().splitlines()[-1])  # [mean loss on rank 0, on rank 1]
    assert len(logged) == 2 and logged[0] == logged[1] and logged[0] > 0, out


def test_tp_compile_example_runs_as_a_script(tmp_path):
    # DTensor tensor parallelism compiled with symmcoll.backend: the outputs checked in the script; the
    # graphs and what their collectives became, as rank 0 prints them, are what the comment at the end says.
    out = _run_script("tp_compile.py", tmp_path)
    said = _block("# tp_compile.py").split("# prints:")[1]
    rewrites = r"(\w+ graph|-> symmcoll\.\w+|not \w+)"
    assert re.findall(rewrites, out) == re.findall(rewrites, said) != [], out


def test_summary_table_is_what_the_committed_results_say():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import summary
    finally:
        sys.path.pop(0)
    from symmcoll.bench import results

    command = re.search(r"`python3 benchmarks/summary.py --plot docs/summary.png` from\s+(.*?)\. Every size", README,
                        re.S)
    assert command, "the README no longer says which files the summary comes from"
    patterns = re.findall(r"`(benchmarks/results/[^`]+)`", command.group(1))
    files = sorted(p for pattern in patterns for p in ROOT.glob(pattern))
    assert len(files) == 5, files
    table = summary.table(summary.points([(p, results.load(p)) for p in files]))
    assert table in README
    assert (ROOT / "docs" / "summary.png").stat().st_size > 10_000


def test_the_installed_version_is_the_one_in_the_source():
    """pyproject.toml takes its version from symmcoll.__version__ (what result files record): an
    installed symmcoll reports the same."""
    import importlib.metadata

    import symmcoll
    assert importlib.metadata.version("symmcoll") == symmcoll.__version__
