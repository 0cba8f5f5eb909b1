"""Where the eager time of the "nccl" MoE layer (``symmcoll/fused/moe_nccl.py``) goes:
``moe_bench.py --nccl-diagnose`` runs this in the bench's own rank processes right after the layer's
row is timed (warm: communicator, p2p connections and allocator blocks all exist), and stores the
result in the row as ``nccl_diagnose``.

Four measurements, each of which predicts the row's time a different way:

* ``op_host_us``: host microseconds per call of single torch ops (a launching op, a view, a stable
  argsort of 4096 int16 keys, the layer's all-gather of its count vector), queued back to back on an
  idle GPU (median of rounds). The layer's dispatch makes about 80 aten calls (about 30 of them launch
  work) and its combine 16 (6): times these, they give the host floor of each phase.
* ``comm_floor``: the layer's communication alone with its byte counts -- one all-gather of the same
  [W, 1 + E/W] count vector, one ``.tolist()``, one ``all_to_all_single`` of the same padded rows -- timed
  as the row is (``time_eager``: back-to-back calls between CUDA events, slowest rank's median) with its
  host time per call. What any NCCL dispatch with host-read splits pays at least.
* ``isolated_us``: dispatch and combine one call at a time, each after a barrier on an idle GPU (no
  call queued behind another, no peer late): the latency of one call.
* ``profile``: ``torch.profiler`` over ``PROFILED_CALLS`` calls of each phase: the entries with the most
  self CPU time and the most self device time per call (names, calls per call, us per call), so a
  single slow step (a host wait, a collective's host path, a kernel) shows by name; and per call every
  CUDA runtime call counted (cudaLaunchKernel, cudaMemcpyAsync, cudaStreamSynchronize, ...) and every
  device-side copy or memset by direction ("Memcpy DtoH (Device -> Pageable)", "Memcpy DtoD ..."): the
  layer should show one DtoH copy per dispatch (the counts' read), none per combine, no HtoD. The
  profiler adds a few us per op: the wall time per call it reports is above the row's.

On CPU ranks (tests) the same code runs with host timers and no CUDA activity."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from symmcoll.bench.timing import event_times_us, time_eager
from symmcoll.fused import moe_nccl

ROUNDS, CALLS_PER_ROUND = 7, 50
ISOLATED_CALLS = 15
PROFILED_CALLS = 10
TOP_ENTRIES = 12

_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def host_us_per_call(fn: Callable[[], object], device: torch.device, calls: int = CALLS_PER_ROUND) -> float:
    """Host time per call of ``fn`` queued back to back, each round starting on an idle GPU after a
    barrier: the median round's (slowest rank)."""
    per_round = []
    for _ in range(ROUNDS):
        _sync(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - start) / calls * 1e6)
    _sync(device)
    return _slowest(statistics.median(per_round), device)


class CommFloor:
    """The layer's communication with its byte counts and nothing else: one all-gather of the same
    count vector (per destination: rows, then slots per local expert), one host read, one
    all_to_all_single of the same padded rows (contents not set: only the bytes matter here)."""

    def __init__(self, tokens: torch.Tensor, topk_ids: torch.Tensor, num_experts: int):
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        local = num_experts // self.world
        ids = topk_ids.long()
        valid = (ids >= 0) & (ids < num_experts)
        owner = torch.where(valid, ids // local, self.world)
        rows_to = torch.stack([(owner == d).any(dim=1).sum() for d in range(self.world)])
        slots = torch.bincount(torch.where(valid, ids, num_experts).reshape(-1), minlength=num_experts + 1)
        self.send_counts = torch.cat([rows_to[:, None], slots[:num_experts].view(self.world, local)], 1).reshape(-1)
        self.per_pair = 1 + local
        self.counts = torch.empty(self.world * self.send_counts.numel(), dtype=torch.int64, device=tokens.device)
        self.row_bytes = moe_nccl.row_layout(tokens.shape[1], tokens.element_size(), ids.shape[1])[2]
        self.packed = torch.empty((int(rows_to.sum()), self.row_bytes), dtype=torch.uint8, device=tokens.device)
        self.arrived = None
        self()

    def __call__(self) -> torch.Tensor:
        _gather(self.counts, self.send_counts)
        host = self.counts.tolist()
        at = [(s * self.world + d) * self.per_pair for s in range(self.world) for d in range(self.world)]
        rows_out = [host[at[self.rank * self.world + d]] for d in range(self.world)]
        rows_in = [host[at[s * self.world + self.rank]] for s in range(self.world)]
        if self.arrived is None:
            self.arrived = self.packed.new_empty((sum(rows_in), self.row_bytes))
        dist.all_to_all_single(self.arrived.reshape(-1), self.packed.reshape(-1),
                               [n * self.row_bytes for n in rows_in], [n * self.row_bytes for n in rows_out])
        return self.arrived


def op_host_us(tokens: torch.Tensor, send_counts: torch.Tensor) -> dict:
    """Host us per call of single ops on this device (module docstring)."""
    device = tokens.device
    x = torch.zeros(64, device=device)
    keys = torch.arange(4096, device=device).remainder(61).to(torch.int16)
    gathered = torch.empty(dist.get_world_size() * send_counts.numel(), dtype=torch.int64, device=device)
    return {"add_": host_us_per_call(lambda: x.add_(1), device),
            "view": host_us_per_call(lambda: x.view(8, 8), device),
            "argsort_stable_int16_4096": host_us_per_call(lambda: torch.argsort(keys, stable=True), device),
            "all_gather_counts": host_us_per_call(lambda: _gather(gathered, send_counts), device, calls=20)}


def _timed(fn: Callable[[], object], plan, device: torch.device) -> dict:
    """The row's own method (time_eager: slowest rank's median of back-to-back calls) and host time."""
    if device.type != "cuda":
        return {"us": host_us_per_call(fn, device, calls=3), "host_us": None}
    timing = time_eager(fn, plan, dist.group.WORLD)
    return {"us": _slowest(statistics.median(timing.samples_us), device),
            "host_us": _slowest(timing.host_us, device)}


def isolated_us(fn: Callable[[], object], device: torch.device) -> float:
    """Median latency of one call on an idle GPU after a barrier (slowest rank)."""
    if device.type != "cuda":
        return host_us_per_call(fn, device, calls=1)
    samples = event_times_us(fn, ISOLATED_CALLS, group=dist.group.WORLD, isolated=True)
    return _slowest(statistics.median(samples), device)


def _self_device_us(event) -> float:
    return float(getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0) or 0)


def profile(fn: Callable[[], object], device: torch.device, calls: int = PROFILED_CALLS) -> dict:
    """torch.profiler over ``calls`` calls: wall us per call, aten events per call, and the top entries by
    self CPU and by self device time, per call: [name, events per call, us per call]."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    dist.barrier()
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        wall = (time.perf_counter() - start) / calls * 1e6
    events = prof.key_averages()

    def top(us_of):
        ranked = sorted(events, key=us_of, reverse=True)[:TOP_ENTRIES]
        return [[e.key, round(e.count / calls, 2), round(us_of(e) / calls, 1)] for e in ranked if us_of(e) > 0]

    def counted(prefixes):
        return {e.key: round(e.count / calls, 2) for e in events if e.key.startswith(prefixes)}

    return {"wall_us_per_call": round(wall, 1),
            "aten_events_per_call": sum(e.count for e in events if e.key.startswith("aten::")) / calls,
            "runtime_calls_per_call": counted(("cuda", "cuLaunch")),
            "copies_per_call": counted(("Memcpy", "Memset")),
            "by_self_cpu": top(lambda e: float(e.self_cpu_time_total)),
            "by_self_device": top(_self_device_us) if device.type == "cuda" else []}


def diagnose(impl, plan) -> dict:
    """Every measurement of the module docstring for a bench ``Nccl`` implementation whose row was just
    timed (``impl.dispatch`` / ``impl.combine`` ready to call)."""
    device = impl.tokens.device
    floor = CommFloor(impl.tokens, impl.ids, impl.experts)
    result = {"op_host_us": op_host_us(impl.tokens, floor.send_counts),
              "comm_floor": _timed(floor, plan, device),
              "comm_floor_rows_in": floor.arrived.shape[0],
              "isolated_us": {"dispatch": isolated_us(impl.dispatch, device),
                              "comm_floor": isolated_us(floor, device)}}
    impl.dispatch()
    result["isolated_us"]["combine"] = isolated_us(impl.combine, device)
    try:
        result["profile"] = {"dispatch": profile(impl.dispatch, device), "combine": profile(impl.combine, device)}
    except Exception as exc:  # noqa: BLE001 - a profiler that does not run here is said, not fatal
        result["profile"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:200]}
    return result


def summary_lines(diag: dict) -> list[str]:
    """Rank 0's diagnosis in a few log lines."""
    lines = [f"nccl diagnose: op host us {diag['op_host_us']}; comm floor {diag['comm_floor']}; "
             f"isolated us {diag['isolated_us']}"]
    for phase, prof in diag.get("profile", {}).items():
        if not isinstance(prof, dict):
            lines.append(f"nccl diagnose profile: {prof}")
            continue
        lines.append(f"nccl diagnose profile {phase}: wall {prof['wall_us_per_call']} us/call, "
                     f"{prof['aten_events_per_call']} aten events/call")
        lines.append(f"  cuda runtime calls/call: {prof['runtime_calls_per_call']}")
        lines.append(f"  device copies/call: {prof['copies_per_call']}")
        lines.append(f"  self cpu: {prof['by_self_cpu']}")
        lines.append(f"  self device: {prof['by_self_device']}")
    return lines
