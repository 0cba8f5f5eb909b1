"""Bench-independent timer of symmcoll's all-reduces on real multi-GPU (one process per GPU).

Why: on 4 H100s the barrier-free all-reduces (low_latency, sentinel_*) ran 25-400x slower at some sizes
since 401756e, and the benchmark's timer changed in the same stretch (benchmarks/multi_gpu_regression.md).
This probe times them with nothing of ``symmcoll.bench``: only ``symmcoll.all_reduce``,
``symmcoll.reference`` and ``symmcoll.launch``, which every tree since 70f4eb8 has, so it also runs on
old trees (PYTHONPATH=bis/<sha>/src) and under the debug switches (symmcoll.debug_switches; set them in
the environment before this script starts).

Per rank, on its own GPU, for every algorithm and size (bf16; inputs small integers that encode the
rank, so the fp32 sum is exact and every element can be compared):
  1. check: one call against ``reference.all_reduce`` (the package's oracle), #wrong counted;
  2. eager: after a barrier, ``--eager-calls`` calls back to back between two CUDA events (3 rounds);
  3. graph: ``--calls`` calls captured in one CUDA graph; ``--replays`` replays back to back after a
     barrier, each between two events;
  4. kicked: the same replays after rank 0 held its stream for ``--kick-us`` (a late peer, as any
     real run has now and then): if one late start leaves the kernels slow for every later replay,
     the slowness sustains itself (a convoy), and the per-replay figures show it;
  5. the graph's output is checked again.
The figure of a case is the slowest rank's median (us per call). ``programs``: programs per launch of
the case (HEAD-era trees only: ``launcher.recording``). ``--host-reads`` adds a micro-benchmark
independent of symmcoll: P programs (1 or 4 warps) each make 8 volatile reads of one int32 in pinned
host memory, or in device memory, for P = 1..512; if host reads of many programs are served one after
another, the host figure grows with P (and with warps, if each warp's read is served alone) and the
device one does not.

Each rank also prints its current device, its tensors' device and its stream's device, and rank 0
lists which GPUs each rank's process has a context on (nvidia-smi), so a launch on the wrong device or
a stray context shows. Results: one JSON (``--out``), and every rank appends each case to
``<out>.rank<r>.jsonl`` as it finishes (kept if the run is cut).

    PYTHONPATH=src python3 benchmarks/multi_gpu_probe.py --world-size 4 --label head --out probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import symmcoll
from symmcoll import launch, reference

ALGORITHMS = ("low_latency", "sentinel_one_shot", "sentinel_two_shot", "one_shot")
SIZES = ("16K", "64K", "256K", "1M")
SHORT = {"low_latency": "ll", "sentinel_one_shot": "s1s", "sentinel_two_shot": "s2s", "one_shot": "os"}
CYCLES_PER_US = 1800  # torch.cuda._sleep counts SM clocks (H100/H200: ~1.7-2.0 GHz)


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _quantiles(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=5) if len(samples) > 1 else [samples[0]] * 4
    return {"median": statistics.median(samples), "p20": q[0], "p80": q[3], "min": min(samples), "max": max(samples)}


def _programs(x: torch.Tensor, algorithm: str) -> list[int] | None:
    """Programs of each launch one call makes (nothing runs), where the tree can record launches."""
    launcher = getattr(symmcoll, "launcher", None) or sys.modules.get("symmcoll.launcher")
    if launcher is None or not hasattr(launcher, "recording"):
        return None
    with launcher.recording() as launches:
        symmcoll.all_reduce(x, algorithm=algorithm)
    return [int(rec.grid[0]) for rec in launches]


class _HostMark:
    """A CUDA event's interface over the host clock (``--device cpu``: a dry run of this script)."""

    def record(self):
        self.at = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1e3


class _Replayed:
    """``calls`` calls run again on every replay (``--device cpu``: no CUDA graphs)."""

    def __init__(self, call, calls: int):
        self.call, self.calls = call, calls
        self.output = call()

    def replay(self):
        for _ in range(self.calls):
            self.output = self.call()


def _mark():
    return torch.cuda.Event(enable_timing=True) if torch.cuda.is_available() else _HostMark()


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _graph_samples(graph, calls: int, replays: int, kick_us: float, rank: int) -> list[float]:
    marks = [(_mark(), _mark()) for _ in range(replays)]
    dist.barrier()
    _sync()
    if kick_us and rank == 0 and torch.cuda.is_available():
        torch.cuda._sleep(int(kick_us * CYCLES_PER_US))
    for start, end in marks:
        start.record()
        graph.replay()
        end.record()
    _sync()
    return [s.elapsed_time(e) * 1e3 / calls for s, e in marks]


def _eager_us(call, n: int) -> float:
    rounds = []
    for _ in range(3):
        start, end = _mark(), _mark()
        dist.barrier()
        _sync()
        start.record()
        for _ in range(n):
            call()
        end.record()
        _sync()
        rounds.append(start.elapsed_time(end) * 1e3 / n)
    return statistics.median(rounds)


def _device_records() -> list[list[int]]:
    from symmcoll import memory
    return [ws.device_record() for ws in memory.workspaces() if hasattr(ws, "device_record")]


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _case(algorithm: str, nbytes: int, opts: dict) -> dict:
    rank = dist.get_rank()
    device = _device()
    numel = nbytes // 2
    x = ((torch.arange(numel, device=device) * 7 + rank * 13) % 17 - 8).to(torch.bfloat16)
    expected = reference.all_reduce(x)
    out = symmcoll.all_reduce(x, algorithm=algorithm)
    result = {"algorithm": algorithm, "bytes": nbytes, "wrong": int((out != expected).sum()),
              "devices": {"x": str(x.device), "out": str(out.device)}}
    if device.type == "cuda":
        result["devices"].update(current=torch.cuda.current_device(), stream=str(torch.cuda.current_stream().device))
    result["programs"] = _programs(x, algorithm)
    result["eager_us"] = _eager_us(lambda: symmcoll.all_reduce(x, algorithm=algorithm), opts["eager_calls"])
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            for _ in range(opts["calls"]):
                out = symmcoll.all_reduce(x, algorithm=algorithm)
        replayed = lambda: out  # noqa: E731 - every replay rewrites the last captured call's output
    else:
        graph = _Replayed(lambda: symmcoll.all_reduce(x, algorithm=algorithm), opts["calls"])
        replayed = lambda: graph.output  # noqa: E731
    for _ in range(3):
        graph.replay()
    result["graph"] = _graph_samples(graph, opts["calls"], opts["replays"], 0.0, rank)
    result["kicked"] = _graph_samples(graph, opts["calls"], opts["replays"], opts["kick_us"], rank)
    result["wrong_after_graph"] = int((replayed() != expected).sum())
    result["records"] = _device_records()
    del graph
    return result


@triton.jit
def _poll_kernel(addr, out_ptr, READS: tl.constexpr):
    ptr = addr.to(tl.pointer_type(tl.int32))
    total = tl.load(ptr, volatile=True)
    for _ in tl.static_range(READS - 1):
        total += tl.load(ptr, volatile=True)
    tl.store(out_ptr + tl.program_id(0), total)


def _host_reads(alone: bool) -> dict:
    """us per launch of _poll_kernel over host (pinned) and device memory, by programs; ``alone``: only
    rank 0 runs it (the others wait at the barrier)."""
    rank = dist.get_rank()
    found = {}
    if not alone or rank == 0:
        host = torch.zeros(16, dtype=torch.int32).pin_memory()
        dev = torch.zeros(16, dtype=torch.int32, device="cuda")
        out = torch.empty(512, dtype=torch.int32, device="cuda")
        for where, word in (("host", host), ("device", dev)):
            for warps in (1, 4):
                for programs in (1, 8, 32, 128, 512):
                    _poll_kernel[(programs,)](word.data_ptr(), out, READS=8, num_warps=warps)
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(5):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        _poll_kernel[(programs,)](word.data_ptr(), out, READS=8, num_warps=warps)
                        end.record()
                        torch.cuda.synchronize()
                        times.append(start.elapsed_time(end) * 1e3)
                    found[f"{where}/{warps}w/{programs}p"] = statistics.median(times)
    dist.barrier()
    return found


def _contexts(pids: list[int]) -> str:
    """Which GPUs each rank's process has a CUDA context on, from nvidia-smi."""
    try:
        text = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"
    by_rank = {r: [line.split(",")[1].strip() for line in text.splitlines() if line.split(",")[0].strip() == str(p)]
               for r, p in enumerate(pids)}
    return "; ".join(f"rank {r}: {gpus}" for r, gpus in by_rank.items())


def _primary_contexts() -> list[int] | str:
    """The GPUs on which this process has an active primary CUDA context (driver API): a rank that touched
    another rank's GPU shows it here."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        found = []
        for i in range(torch.cuda.device_count()):
            dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
            if lib.cuDeviceGet(ctypes.byref(dev), i) or lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags),
                                                                                       ctypes.byref(active)):
                return f"driver call failed for GPU {i}"
            if active.value:
                found.append(i)
        return found
    except OSError as exc:
        return f"no libcuda: {exc}"


def _rank_main(opts: dict) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(f"{opts['out']}.pids", "a") as f:  # for the stage to end this process if the run is cut
        f.write(f"{os.getpid()}\n")
    device = _device()
    info = {"rank": rank, "pid": os.getpid(), "symmcoll": os.path.dirname(symmcoll.__file__)}
    if device.type == "cuda":
        info.update(current_device=torch.cuda.current_device(), stream_device=str(torch.cuda.current_stream().device),
                    gpu=torch.cuda.get_device_name(device))
    print(f"rank {rank}: pid {info['pid']} current device {info.get('current_device')} stream on "
          f"{info.get('stream_device')} ({info.get('gpu')}) symmcoll from {info['symmcoll']}", flush=True)
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    if rank == 0 and device.type == "cuda":
        info["contexts"] = _contexts(pids)
        print("CUDA contexts per rank process:", info["contexts"], flush=True)
    deadline = time.monotonic() + opts["budget_s"]
    cases = []
    jsonl = f"{opts['out']}.rank{rank}.jsonl"
    for algorithm in opts["algorithms"]:
        for size in opts["sizes"]:
            go = torch.tensor([time.monotonic() < deadline], dtype=torch.int32, device=device)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)  # every rank stops at the same case
            if not int(go):
                break
            started = time.monotonic()
            try:
                case = _case(algorithm, parse_size(size), opts)
            except Exception as exc:  # noqa: BLE001 - one case failing must not hide the others
                case = {"algorithm": algorithm, "bytes": parse_size(size), "error": f"{type(exc).__name__}: {exc}"[:400]}
            case["seconds"] = round(time.monotonic() - started, 2)
            with open(jsonl, "a") as f:
                f.write(json.dumps(case) + "\n")
            every = [None] * world
            dist.all_gather_object(every, case)
            if rank == 0:
                print(_line(algorithm, size, every), flush=True)
            cases.append(case)
    if device.type == "cuda":
        info["primary_contexts"] = _primary_contexts()
        print(f"rank {rank}: primary CUDA contexts on GPUs {info['primary_contexts']} (one GPU per rank expected)", flush=True)
    if opts["host_reads"] and device.type == "cuda":
        info["host_reads_all_ranks"] = _host_reads(alone=False)
        info["host_reads_rank0_alone"] = _host_reads(alone=True)
        if rank == 0:
            for key in ("host_reads_all_ranks", "host_reads_rank0_alone"):
                print(key, " ".join(f"{k}={v:.1f}us" for k, v in info[key].items()), flush=True)
    return {"info": info, "cases": cases}


def _slowest(every: list[dict], key: str) -> dict | None:
    if any(key not in c for c in every):
        return None
    per_rank = [_quantiles(c[key]) for c in every]
    return max(per_rank, key=lambda q: q["median"])


def _line(algorithm: str, size: str, every: list[dict]) -> str:
    if any("error" in c for c in every):
        return f"{algorithm:18s} {size:>5s} ERROR " + " | ".join(c.get("error", "ok") for c in every)
    programs = every[0].get("programs")
    total = sum(programs) if programs else None
    graph, kicked = _slowest(every, "graph"), _slowest(every, "kicked")
    eager = max(c["eager_us"] for c in every)
    wrong = max(c["wrong"] for c in every), max(c["wrong_after_graph"] for c in every)
    per_program = f"{graph['median'] / total:6.2f}" if total else "   n/a"
    kicked_tail = "/".join(f"{s:.0f}" for s in every[0]["kicked"][:6])
    records = [r for c in every for rec in c.get("records", []) for r in rec[:1] if r]
    return (f"{algorithm:18s} {size:>5s} programs {str(programs):12s} eager {eager:8.2f}  graph {graph['median']:8.2f} "
            f"({graph['p20']:.2f}-{graph['p80']:.2f})  kicked {kicked['median']:8.2f} ({kicked['p20']:.2f}-"
            f"{kicked['p80']:.2f}) first replays r0 {kicked_tail}  us/program {per_program}  wrong {wrong[0]}/{wrong[1]}"
            f"{'  ERROR RECORD ' + str(records) if records else ''}")


def summarize(folder: str) -> str:
    """One line per probe result in ``folder`` (in the order they were written): slowest-rank medians,
    graph / kicked, us per call, per case; '!' marks wrong results or errors."""
    paths = sorted((os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")), key=os.path.getmtime)
    lines = []
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        cells = []
        for case in result["cases"]:
            name = f"{SHORT.get(case['algorithm'], case['algorithm'])}@{case['bytes'] >> 10}K"
            if case["errors"]:
                cells.append(f"{name} ERROR!")
                continue
            bad = "!" if case["wrong"] or case["wrong_after_graph"] else ""
            cells.append(f"{name} {case['graph']['median']:.1f}/{case['kicked']['median']:.1f}{bad}")
        lines.append(f"{result['label']:28s} " + "  ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=torch.cuda.device_count())
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu: a dry run of this script (interpreted kernels, host clock, no graphs)")
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--calls", type=int, default=20, help="calls captured per graph")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--eager-calls", type=int, default=50)
    parser.add_argument("--kick-us", type=float, default=500.0)
    parser.add_argument("--host-reads", action="store_true")
    parser.add_argument("--budget-s", type=float, default=90.0, help="no case starts after this many seconds")
    parser.add_argument("--label", default="")
    parser.add_argument("--out")
    parser.add_argument("--summarize", metavar="DIR", help="print one line per probe result in DIR and exit")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    if not args.out:
        parser.error("--out is required")
    opts = {k: getattr(args, k) for k in ("algorithms", "sizes", "calls", "replays", "eager_calls", "kick_us",
                                          "host_reads", "budget_s", "out")}
    env = {k: v for k, v in os.environ.items() if k.startswith("SYMMCOLL_")}
    # ``timeout`` sends SIGTERM: leave through the rank pool's exit, which kills the rank processes (a rank
    # left spinning on a GPU would slow whatever runs next).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    print(f"probe {args.label}: world {args.world_size}, env {env}", flush=True)
    ranks = launch.run(_rank_main, args.world_size, opts, device=args.device, timeout=args.budget_s + 240)
    cases = []
    for i, case in enumerate(ranks[0]["cases"]):
        every = [r["cases"][i] for r in ranks]
        entry = {"algorithm": case["algorithm"], "bytes": case["bytes"], "programs": case.get("programs"),
                 "errors": [c.get("error") for c in every if "error" in c]}
        if not entry["errors"]:
            entry.update(wrong=max(c["wrong"] for c in every), wrong_after_graph=max(c["wrong_after_graph"] for c in every),
                         eager_us=max(c["eager_us"] for c in every), graph=_slowest(every, "graph"),
                         kicked=_slowest(every, "kicked"), per_rank=every)
        cases.append(entry)
    with open(args.out, "w") as f:
        json.dump({"label": args.label, "world_size": args.world_size, "env": env,
                   "git_sha": os.environ.get("SYMMCOLL_GIT_SHA"), "ranks": [r["info"] for r in ranks],
                   "cases": cases}, f, indent=1)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
