"""Host time per eager call of the fused ops at world size 1: the Python path from the public function to
the kernel launch, with no GPU work timed (issue 25 point 6: "nothing slower" on the host side).

    PYTHONPATH=src python3 benchmarks/host_overhead.py                        # this tree, CPU
    PYTHONPATH=src python3 benchmarks/host_overhead.py --old-src old_main/src  # and another tree, side by side
    PYTHONPATH=src python3 benchmarks/host_overhead.py --profile matmul_all_reduce   # where the time goes

CPU (the default; no GPU needed): a gloo group of one, CPU tensors under TRITON_INTERPRET=1 and
``launcher.recording()``, so every launch is recorded instead of run: what is timed is exactly the host
code of a call (public wrapper, op spec, cached plan, algorithm host code, launch arguments), nothing of
the interpreter. The CPU path skips the GPU-only host work (TMA descriptors, the launcher's fast path).

--device cuda (the GPU machine): real launches at world size 1, timed as bench.timing.host_time_us
does (rounds of CALLS calls queued on an idle GPU, the median round's time per call), without the
timing module, so that any tree can be timed by the same code.

Each tree runs in a process of its own (``--old-src``: that tree's src first on PYTHONPATH); the cases
use only the public functions and ``launcher.recording`` (both trees have them). The table: us per call
for each tree and their ratio; the median of ROUNDS rounds of CALLS calls after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# (op, algorithm, shape, b given as W.t()): the fused cases of benchmarks/restructure_check.py.
CASES = (("matmul_reduce_scatter", "fused", (16, 8192, 3584), False),
         ("matmul_reduce_scatter", "fused", (16, 8192, 3584), True),
         ("matmul_reduce_scatter", "fused", (2048, 8192, 3584), False),
         ("matmul_all_reduce", "one_shot", (16, 8192, 3584), False),
         ("matmul_all_reduce", "one_shot", (16, 8192, 3584), True),
         ("matmul_all_reduce", "two_shot", (2048, 8192, 3584), False),
         ("all_gather_matmul", "fused", (16, 1280, 8192), False),
         ("all_gather_matmul", "fused", (2048, 1280, 8192), False),
         ("all_gather_matmul", "fused", (2048, 1280, 8192), True),
         ("all_gather_matmul", "auto", (2048, 1280, 8192), False),
         ("all_reduce_rms_norm", "one_shot", (16, 8192), False),
         ("all_reduce_rms_norm", "two_shot", (4096, 8192), False),
         ("all_reduce", "auto", (2048,), False))
ROUNDS, CALLS = 15, 20
# --path gpu cannot time these: their algorithms resolve a collective inside (plan.resolve refuses meta).
NOT_ON_GPU_PATH = {("matmul_all_reduce", "two_shot"), ("all_gather_matmul", "auto"), ("all_reduce", "auto")}


def _label(op, algorithm, shape, transposed) -> str:
    return f"{op} {algorithm} {'x'.join(map(str, shape))}{' b=W.t' if transposed else ''}"


def make_call(op, algorithm, shape, transposed, device):
    """A no-argument call of the public function (inputs made once)."""
    import torch
    import symmcoll
    dt = torch.bfloat16
    empty = lambda *s: torch.zeros(*s, dtype=dt, device=device)
    if op == "all_reduce":
        x = empty(*shape)
        return lambda: symmcoll.all_reduce(x, algorithm=algorithm)
    if op == "all_reduce_rms_norm":
        tokens, hidden = shape
        x, residual, weight = empty(tokens, hidden), empty(tokens, hidden), empty(hidden)
        return lambda: symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-5, algorithm=algorithm)
    m, n, k = shape
    w = empty(n, k)
    b = w.t() if transposed else w.t().contiguous()
    a = empty(m, k)
    fn = getattr(symmcoll, op)
    return lambda: fn(a, b, algorithm=algorithm)


def _time(call, sync) -> float:
    for _ in range(3):
        call()
    per_round = []
    for _ in range(ROUNDS):
        sync()
        start = time.perf_counter()
        for _ in range(CALLS):
            call()
        per_round.append((time.perf_counter() - start) / CALLS * 1e6)
    sync()
    return statistics.median(per_round)


class _LaunchNothing:
    """A compiled kernel whose launcher does nothing (--path gpu: the host code up to the driver call)."""
    function = packed_metadata = None

    def run(self, *args):
        pass


class _EveryKeyCompiled(dict):
    """launcher._COMPILED as if every (kernel, meta, specialisation) had been compiled."""
    def get(self, key, default=None):
        return _LaunchNothing()


def fake_gpu_launcher():
    """Patch the launcher (this process only) to take its GPU path with nothing compiled or launched:
    every launch computes its key and arguments as on the GPU, then calls a no-op launcher."""
    import types
    import torch
    from symmcoll import launcher
    launcher.INTERPRETED, launcher.FAST, launcher._RECORDING = False, True, None
    launcher._COMPILED = _EveryKeyCompiled()
    stream = types.SimpleNamespace(cuda_stream=0)
    torch.cuda.current_stream = lambda *args: stream


def algorithm_call(op, algorithm, shape, transposed):
    """A no-argument call of the op's resolved algorithm on the GPU's host path, without a GPU: meta
    tensors of the case's shapes over tests/kernel_specs.FakeWorkspace (a CUDA workspace of one rank),
    the plan built as the resolver builds it (launch config, output shape); ``Plan.execute`` runs the
    algorithm's host code (GEMM config, TMA descriptors, launch arguments) and a no-op launch."""
    import torch
    from symmcoll import plan
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from kernel_specs import FakeWorkspace
    dt, dev = torch.bfloat16, "meta"
    if op == "all_reduce_rms_norm":
        tokens, hidden = shape
        x, residual, weight = (torch.empty(tokens, hidden, dtype=dt, device=dev),
                               torch.empty(tokens, hidden, dtype=dt, device=dev), torch.empty(hidden, dtype=dt, device=dev))
        others, options = (residual, weight), (("eps", 1e-5), ("quant", None))
    elif op == "all_reduce":
        x, others, options = torch.empty(*shape, dtype=dt, device=dev), (), ()
    else:
        m, n, k = shape
        w = torch.empty(n, k, dtype=dt, device=dev)
        x = torch.empty(m, k, dtype=dt, device=dev)
        others, options = (w.t() if transposed else torch.empty(k, n, dtype=dt, device=dev),), ()
    cuda = torch.device("cuda")
    request = plan.Request(op, tuple(x.shape), dt, cuda, "sum" if op == "all_reduce" else None, None, None,
                           tuple((tuple(t.shape), t.dtype, cuda) for t in others), options,
                           ("x",) + tuple(f"input {i}" for i in range(1, len(others) + 1)))
    out_shape, _ = plan.shape_rule(op)(request, 1) if hasattr(plan, "shape_rule") else plan._OP_RULES[op](request, 1)
    if algorithm == "auto":
        algorithm = plan.default_algorithm(op, request, 1)
    chosen = plan.algorithms(op)[algorithm]
    config = chosen.gpu_configs(request, 1) if callable(chosen.gpu_configs) else None
    p = plan.Plan(request, "kernel", chosen, None, 1, 0, FakeWorkspace(1, 0), config, 3, out_shape)
    return lambda: p.execute(x, others=others)


def worker(device: str, profile: str | None, path: str = "public") -> list[dict]:
    """Time every case in this process (a group of one); with ``profile``, print cProfile's view of the
    matching cases instead."""
    import contextlib
    import torch
    import torch.distributed as dist
    from symmcoll import launcher
    if path == "gpu":
        fake_gpu_launcher()
    if not dist.is_initialized():
        dist.init_process_group("gloo" if device == "cpu" else "nccl", init_method="tcp://127.0.0.1:29533",
                                rank=0, world_size=1)
    if device == "cuda":
        torch.cuda.set_device(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for case in CASES:
        label = _label(*case)
        if profile and profile not in label:
            continue
        row = {"case": label}
        try:
            if path == "gpu" and case[:2] in NOT_ON_GPU_PATH:
                row["note"] = "public path only"
                rows.append(row)
                continue
            call = make_call(*case, device) if path == "public" else algorithm_call(*case)
            recording = device == "cpu" and path == "public"
            with launcher.recording() if recording else contextlib.nullcontext() as launches:
                before = sum(launcher.LAUNCH_COUNTS.values())
                call()
                row["launches"] = len(launches) if recording else sum(launcher.LAUNCH_COUNTS.values()) - before
                if profile:
                    _profile(call, label)
                    continue
                row["host_us"] = _time(call, sync)
        except Exception as exc:  # noqa: BLE001 - reported in the row; the others go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    return rows


def _profile(call, label, calls: int = 2000) -> None:
    import cProfile
    import pstats
    for _ in range(3):
        call()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    print(f"== {label}: {calls} calls")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def _merge(runs: list[list[dict]]) -> list[dict]:
    """One row per case over repeated processes: the median host us, and each process's."""
    merged = []
    for rows in zip(*runs):
        times = [r["host_us"] for r in rows if r.get("host_us") is not None]
        merged.append(dict(rows[0], host_us=statistics.median(times) if times else None, runs_us=times))
    return merged


def _run_tree(src: str, device: str, path: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    env.pop("TRITON_INTERPRET", None)
    if device == "cpu" and path == "public":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--device", device, "--path", path],
                          env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise SystemExit(f"{src}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--old-src", default=None, help="src/ of another tree, timed the same way")
    parser.add_argument("--new-src", default=None, help="src/ of the tree after (default: this tree's)")
    parser.add_argument("--path", choices=("public", "gpu"), default="public",
                        help="public: the public function (CPU: recorded launches); gpu: the algorithm's host code on "
                             "the GPU path without a GPU (meta tensors, a fake workspace, no-op launches)")
    parser.add_argument("--profile", default=None, help="cProfile the cases whose label contains this")
    parser.add_argument("--out", default=None, help="JSON of the rows")
    parser.add_argument("--repeats", type=int, default=1, help="processes per tree, alternating")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker or args.profile:
        if args.device == "cpu" and args.path == "public" and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("CPU tensors need TRITON_INTERPRET=1 (set it, or run without --worker/--profile)")
        rows = worker(args.device, args.profile, args.path)
        if not args.profile:
            print(json.dumps(rows))
        return 0
    here = args.new_src or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    sources = [("new", here)] + ([("old", args.old_src)] if args.old_src else [])
    runs = {tree: [] for tree, _ in sources}
    for _ in range(args.repeats):  # the trees alternate: drift between processes shows as spread
        for tree, src in sources:
            runs[tree].append(_run_tree(src, args.device, args.path))
    trees = {tree: _merge(got) for tree, got in runs.items()}
    print(f"host us per call, {args.device}, path {args.path}, median of {ROUNDS} rounds of {CALLS} calls"
          f"{f', median of {args.repeats} processes per tree (alternating)' if args.repeats > 1 else ''}")
    print(f"{'case':<50}{'new':>9}{'old':>9}{'x':>7}  launches  (new runs / old runs)")
    for i, row in enumerate(trees["new"]):
        old = trees["old"][i] if "old" in trees else {}
        new_us, old_us = row.get("host_us"), old.get("host_us")
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"
        ratio = f"{new_us / old_us:.2f}" if new_us and old_us else "-"
        note = "; ".join(f"{t}: {r['error']}" for t, r in (("new", row), ("old", old)) if r.get("error"))
        note = note or row.get("note", "")
        if len(row.get("runs_us", ())) > 1:
            note += " (" + " ".join(f"{v:.0f}" for v in row["runs_us"]) + " / " + \
                " ".join(f"{v:.0f}" for v in old.get("runs_us", ())) + ")"
        print(f"{row['case']:<50}{fmt(new_us):>9}{fmt(old_us):>9}{ratio:>7}  {row.get('launches')} {note}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(trees, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
