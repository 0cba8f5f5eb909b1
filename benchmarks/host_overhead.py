"""Host time per eager call of the fused ops at world size 1 and of the collectives at world size 2: the
Python path from the public function to the kernel launch, with no GPU work timed (issue 25 point 6:
"nothing slower" on the host side).

    PYTHONPATH=src python3 benchmarks/host_overhead.py                        # this tree, CPU
    PYTHONPATH=src python3 benchmarks/host_overhead.py --old-src old_main/src  # and another tree, side by side
    PYTHONPATH=src python3 benchmarks/host_overhead.py --profile matmul_all_reduce   # where the time goes
    PYTHONPATH=src python3 benchmarks/host_overhead.py --path collectives --old-src old_main/src
    PYTHONPATH=src python3 benchmarks/host_overhead.py --path collectives --calls "all_gather auto 4 KB"

CPU (the default; no GPU needed): a gloo group of one, CPU tensors under TRITON_INTERPRET=1 and
``launcher.recording()``, so every launch is recorded instead of run: what is timed is exactly the host
code of a call (public wrapper, op spec, cached plan, algorithm host code, launch arguments), nothing of
the interpreter. The CPU path skips the GPU-only host work (TMA descriptors, the launcher's fast path).

--path collectives: the collectives of benchmarks/restructure_check.py (all_reduce auto / sentinel_one_shot /
one_shot / two_shot, all_reduce_, reduce_scatter, all_gather, broadcast, all_to_all at 4 KB and 4 MB
per rank, bf16) through their public functions as rank 0 of a group of two, in one process: torch's
"fake" process group (world size 2, no peer), meta tensors, the GPU's host path (GPU launch configs, a
workspace of two ranks from tests/kernel_specs.FakeWorkspace, the plans' prepared launches and the
launcher's fast path calling a no-op compiled kernel). What it leaves out: the driver call and the real
workspace's error-record read (the same code in both trees). Each row also says whether the repeated
call took its plan's prepared launch, and whether what the compiled kernel was handed equals the
algorithm's own recorded launches of that call (tests/test_host_overhead.py asserts both, and ceilings).

The column that decides "more work per call" is ``calls``: Python-level function calls of one repeated
call (sys.setprofile), not a clock (the JSON has C calls and bytecodes too); ``--calls CASE`` lists
them (function, file) for one case.

--device cuda (the GPU machine): real launches at world size 1, timed as bench.timing.host_time_us
does (rounds of CALLS calls queued on an idle GPU, the median round's time per call), without the
timing module, so that any tree can be timed by the same code. With --path collectives: two ranks
sharing GPU 0 (``collectives_cuda``), every result checked exactly first, CUDA_ROUNDS rounds of
CUDA_CALLS calls, rank 0's Python calls counted on the real GPU path (HOST_SMOKE=1: CPU ranks, a check
of the harness only).

Each tree runs in a process of its own (``--old-src``: that tree's src first on PYTHONPATH); the cases
use only the public functions and ``launcher.recording`` (both trees have them). The table: us per call
for each tree and their ratio; the median of ROUNDS rounds of CALLS calls after a warm-up, the median
over processes (``--repeats``, the trees alternating; ``--deadline`` stops starting rounds).
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


# The collectives of benchmarks/restructure_check.py, as rank 0 of a group of two: (op, algorithm, bytes per rank).
COLLECTIVES = (("all_reduce", "auto"), ("all_reduce", "sentinel_one_shot"), ("all_reduce", "one_shot"),
               ("all_reduce", "two_shot"), ("all_reduce_", "auto"), ("reduce_scatter", "auto"),
               ("all_gather", "auto"), ("broadcast", "auto"), ("all_to_all", "auto"))
COLLECTIVE_SIZES = (4 << 10, 4 << 20)
COLLECTIVE_CASES = tuple((op, algorithm, nbytes) for op, algorithm in COLLECTIVES for nbytes in COLLECTIVE_SIZES)


def collective_label(op, algorithm, nbytes) -> str:
    return f"{op} {algorithm} {nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{op} {algorithm} {nbytes >> 10} KB"


def collective_call(op, algorithm, nbytes, x):
    """A no-argument call of the public function on ``x`` (bf16, ``nbytes`` per rank)."""
    import symmcoll
    if op == "all_reduce_":
        return lambda: symmcoll.all_reduce_(x, algorithm=algorithm)
    if op == "broadcast":
        return lambda: symmcoll.broadcast(x, 0, algorithm=algorithm)
    return lambda: getattr(symmcoll, op)(x, algorithm=algorithm)


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


def _time(call, sync, rounds: int = ROUNDS, calls: int = CALLS, start_together=lambda: None) -> float:
    """us per call: the median of ``rounds`` rounds of ``calls`` calls, after a warm-up."""
    for _ in range(3):
        call()
    per_round = []
    for _ in range(rounds):
        sync()
        start_together()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    sync()
    return statistics.median(per_round)


class _LaunchNothing:
    """A compiled kernel whose launcher does nothing (--path gpu: the host code up to the driver call)."""
    function = packed_metadata = None

    def run(self, *args):
        pass


class _EveryKeyCompiled(dict):
    """launcher._COMPILED as if every (kernel, meta, specialisation) had been compiled: a key is hashed
    and looked up as in the real dictionary (hashing a kernel runs Triton's ``cache_key``)."""
    def get(self, key, default=None):
        found = dict.get(self, key)
        if found is None:
            found = self[key] = _LaunchNothing()
        return found


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


class _DeviceTypeForResolve(str):
    """The fake workspace's device type during a case's first call: "cuda" to the algorithms, and equal to
    the meta input's "meta" for the resolver's check that input and workspace share a device type."""
    def __eq__(self, other):
        return str.__eq__(self, other) or other == "meta"

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def fake_world_of_two():
    """This process as rank 0 of a group of two on the GPU's host path, without a GPU or a peer: torch's
    "fake" process group, the launcher patched as ``fake_gpu_launcher`` does (and a prepared launch
    "compiled" into a no-op at once), ``memory.get_workspace`` answering with a workspace of two ranks
    (tests/kernel_specs.FakeWorkspace with the host-visible error record a real one has), and meta
    tensors accepted as inputs. Returns ``arm()``: after a case's first call (the resolve, with the
    workspace's device type equal to "meta" for the resolver's device check), the workspace is on cuda."""
    import types
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from symmcoll import launcher, memory, plan
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from kernel_specs import FakeWorkspace

    # A real store (calls.remember keeps each call's descriptor fields there; FakeStore refuses set).
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=2)
    fake_gpu_launcher()
    launcher._raw_stream = lambda device_index: 0

    def prepare_without_compiling(self, *tensors):
        args = (*self.prefix, *tensors, *self.suffix)
        if any(t.data_ptr() % 16 for t in tensors):  # as launcher.Prepared: a misaligned view goes the slow way
            launcher.launch(self.kernel, self.grid[:1], args, self.meta)
            return
        launcher.LAUNCH_COUNTS[self.kernel.__name__] += 1
        self.tail = tuple(self.meta[p.name] if p.name in self.meta else p.default
                          for p in self.kernel.params[len(args):])
        self.device, self.compiled = 0, _LaunchNothing()
    launcher.Prepared.__call__ = prepare_without_compiling

    ws = FakeWorkspace(2, 0)
    ws.status_view, ws.reports_raised = np.zeros(memory.STATUS_REPORTS + 1, dtype=np.int32), 0
    memory.get_workspace = lambda *args, **kwargs: ws
    check_device = plan.check_device
    plan.check_device = lambda x, name="x": None if x.device.type == "meta" else check_device(x, name)

    def arm(armed: bool):
        ws.device = torch.device("cuda", 0) if armed else types.SimpleNamespace(
            type=_DeviceTypeForResolve("cuda"), index=0)
    arm(False)
    return arm


def python_calls(call) -> tuple[int, list[str]]:
    """(Python-level function calls of one ``call()``, each as "function (file:line)")."""
    seen = []

    def profile(frame, event, arg):
        if event == "call":
            code = frame.f_code
            seen.append(f"{code.co_name} ({'/'.join(code.co_filename.split('/')[-2:])}:{code.co_firstlineno})")
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return len(seen) - 1, seen[1:]  # not the profiled lambda itself


def host_work(call) -> dict:
    """What one ``call()`` does on the host, counted (no clock): Python-level function calls, calls of C
    functions (builtins, torch's bindings: their cost varies, their number does not) and Python bytecode
    instructions executed (sys.settrace's opcode events), each without the profiled lambda itself."""
    counts = {"c_calls": 0, "opcodes": 0}

    def profile(frame, event, arg):
        counts["c_calls"] += event == "c_call"

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        counts["opcodes"] += event == "opcode"
        return trace
    calls, _ = python_calls(call)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    counts["c_calls"] -= 1  # sys.setprofile(None)
    counts["opcodes"] -= _LAMBDA_OPCODES
    return {"python_calls": calls, **counts}


def _opcodes_of_a_lambda() -> int:
    """Opcodes the tracer sees of a lambda that calls a no-op (what host_work subtracts)."""
    counts = [0]

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        counts[0] += event == "opcode"
        return trace
    noop = lambda: None  # noqa: E731
    call = lambda: noop()  # noqa: E731
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return counts[0] - 2  # noop's own: LOAD_CONST, RETURN


_LAMBDA_OPCODES = _opcodes_of_a_lambda()


def launches_match_recorded(call) -> bool:
    """Whether ``call()`` on the GPU's host path (a prepared launch or ``launcher.launch``) hands the
    compiled kernels the grids and arguments that the algorithm's own launches of the same call have
    (``launcher.recording()``, where nothing is prepared): what a prepared launch keeps from its first
    call must not be something that changes between calls. Tensors compare by address."""
    import torch
    from symmcoll import launcher
    ran = []
    run = _LaunchNothing.run
    _LaunchNothing.run = lambda self, *args: ran.append(args)
    try:
        call()
    finally:
        _LaunchNothing.run = run
    with launcher.recording() as recorded:
        call()
    address = lambda args: tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)  # noqa: E731
    if not recorded or len(ran) != len(recorded):
        return False
    for args, launch in zip(ran, recorded):
        # run(gridX, gridY, gridZ, stream, function, packed_metadata, 3 hooks, *kernel arguments, *constexprs)
        grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
        if tuple(args[:3]) != grid or address(args[9:9 + len(launch.args)]) != address(launch.args):
            return False
    return True


def collectives_worker(profile: str | None, calls_of: str | None) -> list[dict]:
    """Every collective case as rank 0 of a fake group of two (``fake_world_of_two``): Python calls and
    launches of a repeated call, and its CPU time per call (``_time``)."""
    import torch
    from symmcoll import launcher, plan
    arm = fake_world_of_two()
    rows = []
    for op, algorithm, nbytes in COLLECTIVE_CASES:
        label = collective_label(op, algorithm, nbytes)
        if (profile and profile not in label) or (calls_of and calls_of != label):
            continue
        row = {"case": label}
        try:
            call = collective_call(op, algorithm, nbytes, torch.empty(nbytes // 2, dtype=torch.bfloat16,
                                                                      device="meta"))
            arm(False)
            plan.clear_cache()  # so that the case's own plan is the one resolved here
            call()  # the resolve
            resolved = list(plan._PLANS.values())[-1]  # all_reduce_: all_reduce's plan
            row["runs"] = resolved.name  # what "auto" chose
            arm(True)
            call(), call()  # the first call on the GPU's host path prepares the plan's launch
            row["prepared"] = resolved.fast is not None
            before = sum(launcher.LAUNCH_COUNTS.values())
            seen = python_calls(call)[1]
            row["launches"] = sum(launcher.LAUNCH_COUNTS.values()) - before
            row.update(host_work(call))
            row["same_as_recorded"] = launches_match_recorded(call)
            if calls_of:
                print("\n".join(seen))
            if profile:
                _profile(call, label)
                continue
            row["host_us"] = _time(call, lambda: None)
        except Exception as exc:  # noqa: BLE001 - reported in the row; the others go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    return rows


# --device cuda --path collectives: two ranks time-slice one GPU (a call takes milliseconds of GPU time),
# so fewer calls than ROUNDS x CALLS keep a process of every case near 30 s.
CUDA_ROUNDS, CUDA_CALLS = 9, 10
# HOST_SMOKE=1: --device cuda --path collectives on two CPU ranks (interpreted kernels, 512 bytes, one
# round of two calls, no work counts): a check that the harness runs, not a measurement.
SMOKE = os.environ.get("HOST_SMOKE") == "1"
if SMOKE:
    CUDA_ROUNDS, CUDA_CALLS = 1, 2


def _collective_want(op, xs, rank, world):
    """The exact result of ``op`` on rank-coded bf16 inputs ``xs`` (integers: fp32 sums are exact)."""
    import torch
    total = sum(x.float() for x in xs).to(torch.bfloat16)
    if op in ("all_reduce", "all_reduce_"):
        return total
    if op == "reduce_scatter":
        return total.chunk(world)[rank]
    if op == "all_gather":
        return torch.cat(xs)
    if op == "broadcast":
        return xs[0]
    return torch.cat([x.chunk(world)[rank] for x in xs])  # all_to_all, equal splits


def _collectives_cuda_rank() -> list[dict]:
    """One rank of ``collectives_cuda``: every case checked exactly, then counted and timed."""
    import torch
    import torch.distributed as dist
    import symmcoll
    from symmcoll.bench.checks import rank_coded
    rank, world, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    dev = torch.device("cpu") if SMOKE else torch.device("cuda", 0)
    sync = (lambda: None) if SMOKE else torch.cuda.synchronize

    def measure(op, algorithm, nbytes) -> dict:
        row = {"case": collective_label(op, algorithm, nbytes)}
        nbytes = 512 if SMOKE else nbytes
        try:
            coded = lambda n: [rank_coded(nbytes // 2, torch.bfloat16, r, n, dev) for r in range(world)]  # noqa: E731
            xs = coded(0)
            x = xs[rank].clone()
            call = collective_call(op, algorithm, nbytes, x)
            got = call()
            row["wrong"] = int(((x if op == "all_reduce_" else got) != _collective_want(op, xs, rank, world)).sum())
            for _ in range(3):
                call()
            xs = coded(1)  # a repeated call (on GPU: the plan's prepared launch) with new values in x
            x.copy_(xs[rank])
            got = call()
            row["wrong"] += int(((x if op == "all_reduce_" else got) != _collective_want(op, xs, rank, world)).sum())
            if not SMOKE:  # (traced, an interpreted kernel takes minutes)
                row.update(host_work(call))  # the real GPU path's calls (every rank makes the same calls)
            # As bench.timing.host_time_us: rounds queued on an idle GPU, the ranks starting together.
            row["host_us"] = _time(call, sync, CUDA_ROUNDS, CUDA_CALLS, lambda: dist.barrier(group))
        except Exception as exc:  # noqa: BLE001 - reported in the row; the others go on
            row["error"] = f"rank {rank}: {type(exc).__name__}: {exc}"[:300]
        return row

    rows = []
    for op, algorithm, nbytes in COLLECTIVE_CASES:
        rows.append(measure(op, algorithm, nbytes))
        anyone_failed = [False] * world
        dist.all_gather_object(anyone_failed, "error" in rows[-1])
        if any(anyone_failed):
            symmcoll.reset()  # on every rank together: a failed call leaves the workspaces broken
    return rows


def collectives_cuda() -> list[dict]:
    """--device cuda --path collectives: every collective case on two ranks sharing GPU 0 (cuda-shared:
    two processes, a gloo group), each result checked exactly first (rank-coded values against their
    fp32 sum); per case each rank's host us (CPU time per call of rounds of CUDA_CALLS calls queued on an
    idle GPU, the median round) and rank 0's work counts of one repeated call on the real GPU path."""
    from symmcoll import launch
    per_rank = launch.run(_collectives_cuda_rank, 2, device="cpu" if SMOKE else "cuda-shared", timeout=400)
    return [dict(r0, host_us_rank1=r1.get("host_us"), wrong=r0.get("wrong", 0) + r1.get("wrong", 0),
                 error=r0.get("error") or r1.get("error")) for r0, r1 in zip(*per_rank)]


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
                if device == "cpu":
                    row.update(host_work(call))
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
    """One row per case over repeated processes: the median host us, and each process's (and rank 1's)."""
    merged = []
    for rows in zip(*runs):
        times = [r["host_us"] for r in rows if r.get("host_us") is not None]
        merged.append(dict(rows[0], host_us=statistics.median(times) if times else None, runs_us=times,
                           runs_us_rank1=[r["host_us_rank1"] for r in rows if r.get("host_us_rank1") is not None],
                           wrong=sum(r.get("wrong") or 0 for r in rows),
                           error=next((r["error"] for r in rows if r.get("error")), None)))
    return merged


def _run_tree(src: str, device: str, path: str, timeout: float = 600) -> list[dict] | None:
    """The rows of one worker process of the tree at ``src`` (None, with its error printed, if it failed)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    env.pop("TRITON_INTERPRET", None)
    if device == "cpu" and path == "public":
        env["TRITON_INTERPRET"] = "1"
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--device", device, "--path",
                               path], env=env, capture_output=True, text=True, timeout=max(30, timeout))
    except subprocess.TimeoutExpired:
        print(f"{src}: timed out after {timeout:.0f} s", flush=True)
        return None
    if proc.returncode:
        print(f"{src}: exit {proc.returncode}\n{proc.stderr[-2000:]}", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--old-src", default=None, help="src/ of another tree, timed the same way")
    parser.add_argument("--new-src", default=None, help="src/ of the tree after (default: this tree's)")
    parser.add_argument("--path", choices=("public", "gpu", "collectives"), default="public",
                        help="public: the public function (CPU: recorded launches); gpu: the algorithm's host code on "
                             "the GPU path without a GPU (meta tensors, a fake workspace, no-op launches); "
                             "collectives: the collectives' public functions at world size 2 (CPU: one rank of a "
                             "fake group on the GPU's host path; cuda: two ranks sharing GPU 0)")
    parser.add_argument("--profile", default=None, help="cProfile the cases whose label contains this")
    parser.add_argument("--calls", default=None, help="--path collectives: list the Python calls of this case")
    parser.add_argument("--out", default=None, help="JSON of the rows")
    parser.add_argument("--repeats", type=int, default=1, help="processes per tree, alternating")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds for every process: no round (a process per tree) is started that would end "
                             "past it, judged by the last round's length")
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker or args.profile or args.calls:
        if args.device == "cpu" and args.path == "public" and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("CPU tensors need TRITON_INTERPRET=1 (set it, or run without --worker/--profile)")
        if args.path == "collectives":
            rows = collectives_worker(args.profile, args.calls) if args.device == "cpu" else collectives_cuda()
        else:
            rows = worker(args.device, args.profile, args.path)
        if not args.profile and not args.calls:
            print(json.dumps(rows))
        return 0
    start = time.monotonic()
    here = args.new_src or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    sources = [("new", here)] + ([("old", args.old_src)] if args.old_src else [])
    runs = {tree: [] for tree, _ in sources}
    last_round = 0.0
    for _ in range(args.repeats):  # the trees alternate: drift between processes shows as spread
        # The next round as long as the last one (the first one compiles the kernels: later ones are shorter).
        if args.deadline and time.monotonic() - start + 1.3 * last_round > args.deadline:
            break
        round_began = time.monotonic()
        for tree, src in sources:
            began = time.monotonic()
            remaining = args.deadline - (began - start) if args.deadline else 600
            got = _run_tree(src, args.device, args.path, remaining)
            if got is not None:
                runs[tree].append(got)
                print(f"{tree}: process {len(runs[tree])} in {time.monotonic() - began:.0f} s", flush=True)
        last_round = time.monotonic() - round_began
    if not runs["new"]:
        print("no process of this tree finished")
        return 1
    trees = {tree: _merge(got) for tree, got in runs.items() if got}
    rounds, calls = (CUDA_ROUNDS, CUDA_CALLS) if args.device == "cuda" and args.path == "collectives" else (ROUNDS, CALLS)
    processes = {tree: len(got) for tree, got in runs.items()}
    print(f"host us per call, {args.device}, path {args.path}, median of {rounds} rounds of {calls} calls, median "
          f"over processes {processes} (the trees alternating); calls: Python-level calls of one repeated call")
    print(f"{'case':<50}{'new':>9}{'old':>9}{'x':>7}{'calls new':>10}{'old':>5}  launches  (new runs / old runs)")
    failed = False
    for i, row in enumerate(trees["new"]):
        old = trees["old"][i] if "old" in trees else {}
        new_us, old_us = row.get("host_us"), old.get("host_us")
        fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
        ratio = f"{new_us / old_us:.2f}" if new_us and old_us else "-"
        calls = f"{row.get('python_calls', '-'):>10}{old.get('python_calls', '-'):>5}"
        note = "; ".join(f"{t}: {r['error']}" for t, r in (("new", row), ("old", old)) if r.get("error"))
        note += "; ".join(f"{t}: WRONG {r['wrong']}" for t, r in (("new", row), ("old", old)) if r.get("wrong"))
        failed |= bool(row.get("error") or row.get("wrong"))
        note = note or row.get("note", "")
        if len(row.get("runs_us", ())) > 1:
            note += " (" + " ".join(f"{v:.0f}" for v in row["runs_us"]) + " / " + \
                " ".join(f"{v:.0f}" for v in old.get("runs_us", ())) + ")"
        if row.get("runs_us_rank1"):
            note += " rank 1: " + " ".join(f"{v:.0f}" for v in row["runs_us_rank1"]) + " / " + \
                " ".join(f"{v:.0f}" for v in old.get("runs_us_rank1", ()))
        print(f"{row['case']:<50}{fmt(new_us):>9}{fmt(old_us):>9}{ratio:>7}{calls}  {row.get('launches')} {note}")
    print(f"{time.monotonic() - start:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(trees, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
