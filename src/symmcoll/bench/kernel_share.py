"""Where a step's GPU time goes, from a torch.profiler trace: communication, fused compute+communication,
or compute.

Every GPU activity of the trace (kernels, memcpys, memsets) is put in one class by its name:

* communication: NCCL kernels; torch's symmetric-memory kernels (``c10d::symmetric_memory::*``);
  symmcoll's collective kernels (every ``*_kernel`` of ``symmcoll.comm``); peer-to-peer copies, and
  device copies on a stream other than the step's main one (the copy-engine all-gathers of torch's
  async-TP and of symmcoll's copy-engine algorithms).
* fused: symmcoll's kernels that compute and communicate in one (every ``*_kernel`` of
  ``symmcoll.fused`` except the plain GEMM's ``matmul_kernel``, in ``fused/gemm_kernel.py``).
* compute: everything else (cuBLAS, attention, pointwise, Triton GEMMs, local copies).

Shares are of the summed durations (GPU busy time, not wall time): time overlapped on side streams
counts in full, so an overlapped all-gather shows as communication even where it hides under a GEMM.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import pkgutil
import tempfile

COMM_NAME_PARTS = ("nccl", "symmetric_memory", "symm_mem")
# torch's symmetric-memory kernels by their own names: torch 2.11 defines them in an anonymous namespace
# (``void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 2>(...)``), so no
# namespace in the name says what they are (2026-11-27, 4x H100: torch_async_tp's decode read 0% comm).
TORCH_SYMM_MEM_KERNELS = frozenset({
    "one_shot_all_reduce_kernel", "two_shot_all_reduce_kernel", "multimem_all_reduce_kernel",
    "multimem_one_shot_all_reduce_kernel", "multimem_all_gather_kernel", "barrier_kernel",
    "put_signal_kernel", "wait_signal_kernel", "reduce_scatter_kernel", "all_gather_kernel",
    "one_shot_all_gather_kernel", "two_shot_reduce_scatter_kernel"})
KERNEL_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# The GPU activities that took longest, by name (cut to this many characters), as shares() lists them:
# where two modes of a step differ (the TP block bench keeps them per row).
TOP_KERNELS = int(os.environ.get("SYMMCOLL_TOP_KERNELS", "12"))
TOP_NAME_CHARS = 90
IDLE_CAP_US = 100.0


@functools.lru_cache(maxsize=1)
def symmcoll_kernel_names() -> tuple[frozenset[str], frozenset[str]]:
    """(collective kernels, fused kernels) defined in symmcoll.comm and symmcoll.fused."""
    import symmcoll.comm
    import symmcoll.fused

    def kernels(package, skip=()):
        names = set()
        for info in pkgutil.iter_modules(package.__path__):
            if info.name in skip:
                continue
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for name, value in vars(module).items():
                fn = getattr(value, "fn", None)   # a @triton.jit function wraps the Python one
                if name.endswith("_kernel") and getattr(fn, "__module__", None) == module.__name__:
                    names.add(name)
        return frozenset(names)

    return kernels(symmcoll.comm), kernels(symmcoll.fused, skip=("gemm", "gemm_kernel"))


def kernel_base_name(name: str) -> str:
    """A kernel's own name without return type, namespaces, template and parameter lists:
    ``void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 2>(c10::BFloat16**, ...)``
    -> ``one_shot_all_reduce_kernel``; a Triton kernel's name is its own."""
    name = name.replace("(anonymous namespace)::", "")
    head = name.split("(")[0].split("<")[0].strip()
    head = head.split()[-1] if head.split() else head   # strip "void "
    return head.rsplit("::", 1)[-1]


def classify(event: dict, main_stream, comm_kernels=frozenset(), fused_kernels=frozenset()) -> str | None:
    """"comm" | "fused" | "compute" for a GPU activity of a chrome trace; None for anything else."""
    category, name = event.get("cat"), event.get("name", "")
    if event.get("ph") != "X" or category not in KERNEL_CATEGORIES:
        return None
    if category == "gpu_memcpy":
        peer = "PtoP" in name or event.get("args", {}).get("stream") != main_stream
        return "comm" if peer else "compute"
    if category == "gpu_memset":
        return "compute"
    base = kernel_base_name(name)
    if base in fused_kernels:
        return "fused"
    if base in comm_kernels or base in TORCH_SYMM_MEM_KERNELS or any(part in name.lower() for part in COMM_NAME_PARTS):
        return "comm"
    return "compute"


def shares(events: list[dict], comm_kernels=None, fused_kernels=None, top: int = TOP_KERNELS) -> dict:
    """Summed GPU microseconds per class and the comm and fused shares of their total (``top``: how many
    activities top_kernels and idle_before list)."""
    if comm_kernels is None or fused_kernels is None:
        comm_kernels, fused_kernels = symmcoll_kernel_names()
    per_stream: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            stream = e.get("args", {}).get("stream")
            per_stream[stream] = per_stream.get(stream, 0.0) + float(e.get("dur", 0))
    main_stream = max(per_stream, key=per_stream.get) if per_stream else None
    totals = {"comm": 0.0, "fused": 0.0, "compute": 0.0}
    by_name: dict[str, float] = {}
    calls: dict[str, int] = {}
    on_main = []  # (the main stream's activities: its idle time below)
    count = 0
    for e in events:
        kind = classify(e, main_stream, comm_kernels, fused_kernels)
        if kind:
            count += 1
            totals[kind] += float(e.get("dur", 0))
            name = e.get("name", "")[:TOP_NAME_CHARS]
            by_name[name] = by_name.get(name, 0.0) + float(e.get("dur", 0))
            calls[name] = calls.get(name, 0) + 1
            if e.get("args", {}).get("stream") == main_stream:
                on_main.append(e)
    busy = sum(totals.values())
    longest = sorted(by_name.items(), key=lambda item: -item[1])[:top]
    # Idle time of the main stream before each activity, by the activity's name: where a step's time
    # goes beyond its kernels (gaps of IDLE_CAP_US or more are between calls, not inside one).
    idle_before: dict[str, float] = {}
    last_end = None
    for e in sorted(on_main, key=lambda e: float(e.get("ts", 0))):
        start = float(e.get("ts", 0))
        if last_end is not None and 0 < start - last_end < IDLE_CAP_US:
            name = e.get("name", "")[:TOP_NAME_CHARS]
            idle_before[name] = idle_before.get(name, 0.0) + start - last_end
        last_end = max(last_end or start, start + float(e.get("dur", 0)))
    idle_top = sorted(idle_before.items(), key=lambda item: -item[1])[:top]
    # busy_us / activities: every GPU activity's time and count (a step's time less busy_us is the
    # GPU's idle time between kernels: launch gaps, host waits); top_calls: how often each of top_kernels ran
    return {"comm_us": totals["comm"], "fused_us": totals["fused"], "compute_us": totals["compute"],
            "busy_us": busy, "activities": count, "idle_us": sum(idle_before.values()),
            "idle_before": [[name, round(us, 2)] for name, us in idle_top],
            "comm_share": totals["comm"] / busy if busy else None,
            "fused_share": totals["fused"] / busy if busy else None,
            "top_kernels": [[name, round(us, 2)] for name, us in longest],
            "top_calls": [[name, calls[name]] for name, _ in longest]}


def trace_events(run, calls: int = 2) -> list[dict]:
    """The chrome-trace events (CUDA activities) of ``calls`` calls of ``run`` under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity

    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)


def profile(run, calls: int = 2, tag: str | None = None, steps: int = 1, top: int = TOP_KERNELS) -> dict:
    """Shares of ``calls`` calls of ``run`` (CUDA activities only); top_kernels, top_calls, busy_us,
    activities, idle_us and idle_before a step, one call of ``run`` being ``steps`` steps (a graph replay of
    several). With SYMMCOLL_TRACE_DIR set, the chrome trace is kept there as ``<tag>.json``."""
    events = trace_events(run, calls)
    keep = os.environ.get("SYMMCOLL_TRACE_DIR")
    if keep and tag:
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, f"{tag}.json"), "w") as f:  # the GPU activities only
            json.dump([e for e in events if e.get("cat") in KERNEL_CATEGORIES], f)
    result = shares(events, top=top)
    per = calls * steps
    for key in ("top_kernels", "idle_before", "top_calls"):
        result[key] = [[name, round(us / per, 2)] for name, us in result[key]]
    for key in ("busy_us", "activities", "idle_us"):
        result[key] /= per
    return result
