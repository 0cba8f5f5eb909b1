"""The benchmark's rank-side entry points: what the parent runs on every rank.

All three are collective (every rank calls them together, through ``RankPool.run`` or in-process under
torchrun) and return the same answer on every rank, so the caller may read rank 0's.

A case goes through stages: bind, check before timing (fresh rank-coded data against the oracle),
timing, check after timing (fresh data again, eagerly and through a replay of the timed graph). A
failure in any rank ends the case on all ranks at the next stage boundary (the ranks agree on it with
an all-gather), so one broken implementation is reported as such and the sweep goes on with the next.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.distributed as dist

import symmcoll

from .. import topology
from . import checks, link, provenance
from .baselines import backend_implementation, torch_symm_mem_implementations
from .impls import Implementation, quantized_implementations, symmcoll_implementations
from .metrics import bandwidth, summarize
from .plan import Case
from .results import LinkLimit, Measurement, Provenance
from .timing import CapturedCalls, Timing, time_cpu, time_eager, time_graph

# Every rank imports this module before its first case. A torch deprecation (FutureWarning) of an API
# the bench or a baseline calls would otherwise print once per rank process, W copies of one line
# among the tables; symmcoll itself calls the current names (comm/backend.py).
warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.")


@dataclass(frozen=True)
class RankInfo:
    """What the ranks can run: implementation (name, family) per op, notes on what is left out."""

    provenance: Provenance
    world_size: int
    implementations: dict[str, tuple[tuple[str, str], ...]]
    notes: tuple[str, ...]


def _device() -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, the CPU under gloo (also on a GPU host)."""
    if "nccl" in str(dist.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_REGISTRY: dict[str, dict[str, Implementation]] = {}
_MISSING_TORCH_OPS: dict[str, list[str]] = {}


def implementations(op: str) -> dict[str, Implementation]:
    """Backend, torch symm_mem ops, then symmcoll's algorithms; empty if symmcoll lacks the op."""
    if op not in _REGISTRY:
        if op not in symmcoll.ALGORITHMS:
            _REGISTRY[op] = {}
        else:
            torch_ops, _MISSING_TORCH_OPS[op] = torch_symm_mem_implementations(op, _device())
            found = [backend_implementation(op, dist.group.WORLD), *torch_ops, *symmcoll_implementations(op),
                     *quantized_implementations(op)]
            _REGISTRY[op] = {impl.name: impl for impl in found}
    return _REGISTRY[op]


def describe(ops: tuple[str, ...]) -> RankInfo:
    notes = []
    found = {}
    for op in ops:
        impls = implementations(op)
        if not impls:
            notes.append(f"{op}: symmcoll has no kernel for it yet; skipped")
            continue
        if _MISSING_TORCH_OPS.get(op):
            notes.append(f"{op}: this torch lacks {', '.join(_MISSING_TORCH_OPS[op])}; not compared")
        if not checks.has_reference(op):
            notes.append(f"{op}: symmcoll.reference.{op} is missing; results are NOT checked")
        found[op] = tuple((impl.name, impl.family) for impl in impls.values())
    return RankInfo(provenance.collect(_device().type), dist.get_world_size(), found, tuple(notes))


class _Stages:
    """The stages of one case on this rank. After each stage the ranks exchange (error, value) in one
    all-gather, so they agree on whether any failed and every later collective is reached by all ranks
    or by none. Inside a stage, collectives that cannot fail on one rank alone (the oracle) come before
    anything that can (the implementation, ``symmcoll.check``)."""

    def __init__(self, group):
        self.group = group
        self.error: str | None = None

    def run(self, stage: str, fn: Callable[[], object], share: bool = False):
        """``fn()`` on this rank: its value, or with ``share`` every rank's value in rank order (it must
        pickle); None once any rank has failed a stage."""
        if self.error is not None:
            return None
        value, local_error = None, None
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - reported in the result row, the sweep goes on
            local_error = f"rank {dist.get_rank()}: {stage}: {type(exc).__name__}: {exc}"
        gathered = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(gathered, (local_error, value if share else None), group=self.group)
        self.error = next((error for error, _ in gathered if error is not None), None)
        if self.error is not None:
            return None
        return [v for _, v in gathered] if share else value


def run_case(case: Case) -> Measurement:
    group = dist.group.WORLD
    device = _device()
    impl = implementations(case.op)[case.implementation]
    stages = _Stages(group)
    checked = checks.has_reference(case.op)
    inputs = _Inputs(case, group, device, impl)

    bound = stages.run("bind", lambda: impl.bind(inputs.coded(0), group))
    wrong_before = stages.run("check before timing", share=True,
                              fn=lambda: _wrong_in_call(bound, inputs, 1) if checked else None)
    timing, note, captured = stages.run("timing", lambda: _time(bound, case, group, device)) or (None,) * 3
    replay_check = captured is not None and not impl.in_place
    wrong_after = stages.run("check after timing", share=True,
                             fn=lambda: _check_after(bound, inputs, captured if replay_check else None)
                             if checked else None)
    captured = None  # release the captured graph before the next case
    if stages.error is not None:
        symmcoll.reset()  # a timed-out kernel leaves workspaces inconsistent; rebuilt on next use
    summaries = [None] * dist.get_world_size(group)  # every rank gets here with timing on all or none
    dist.all_gather_object(summaries, summarize(timing.samples_us) if timing else None, group=group)
    hosts = [None] * dist.get_world_size(group)
    dist.all_gather_object(hosts, timing.host_us if timing else None, group=group)
    measurement = _measurement(case, impl, timing, summaries, _total(wrong_before), _total(wrong_after),
                               stages.error, note, dist.get_world_size(group))
    host = [h for h in hosts if h is not None]
    return replace(measurement, host_us=max(host)) if len(host) == len(hosts) else measurement


class _Inputs:
    """Rank-coded inputs of a case; call index k gives different data for every k. The expected
    result and the count of wrong elements are the implementation's own where it has them (lossy
    implementations are judged against their error bound), else the oracle's and equality."""

    def __init__(self, case: Case, group, device: torch.device, impl: Implementation):
        self.case, self.group, self.device, self.impl = case, group, device, impl

    def coded(self, call_index: int) -> torch.Tensor:
        return checks.coded_input(self.case.op, self.case.count, checks.TORCH_DTYPES[self.case.dtype],
                                  dist.get_rank(self.group), dist.get_world_size(self.group), call_index,
                                  self.device)

    def with_expected(self, call_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, the oracle's output); collective."""
        x = self.coded(call_index)
        if self.impl.expected is not None:
            return x, self.impl.expected(x, self.group)
        return x, checks.expected(self.case.op, x, self.group)

    def count_wrong(self, got: torch.Tensor, want) -> int:
        if self.impl.count_wrong is not None:
            return self.impl.count_wrong(got, want)
        return checks.count_wrong(got, want)


def _wrong_in_call(bound, inputs: _Inputs, call_index: int) -> int:
    x, want = inputs.with_expected(call_index)
    bound.load(x)
    got = bound.call()
    _synchronize(inputs.device)
    symmcoll.check()
    return inputs.count_wrong(got, want)


def _check_after(bound, inputs: _Inputs, captured: CapturedCalls | None) -> int:
    """Fresh data through an eager call, then (out-of-place ops in graph mode) through a replay of the
    timed graph. Both oracle answers are computed first: a failure cannot skip a collective."""
    x_eager, want_eager = inputs.with_expected(2)
    x_replay, want_replay = inputs.with_expected(3) if captured is not None else (None, None)
    bound.load(x_eager)
    got = bound.call()
    _synchronize(inputs.device)
    symmcoll.check()
    wrong = inputs.count_wrong(got, want_eager)
    if captured is not None:
        bound.load(x_replay)
        captured.replay()
        _synchronize(inputs.device)
        symmcoll.check()
        wrong += inputs.count_wrong(captured.output, want_replay)
    return wrong


def _total(per_rank: list | None) -> int | None:
    """#wrong summed over ranks; None if unchecked or the stage failed."""
    if per_rank is None or any(v is None for v in per_rank):
        return None
    return sum(per_rank)


def _time(bound, case: Case, group, device) -> tuple[Timing, str | None, CapturedCalls | None]:
    plan = case.plan
    if device.type == "cpu" or plan.mode == "cpu":
        return time_cpu(bound.call, plan, group), None, None
    if plan.mode == "eager":
        return time_eager(bound.call, plan, group), None, None
    try:
        captured = CapturedCalls(bound.call, plan.calls_per_graph)
        failure = None
    except Exception as exc:  # noqa: BLE001 - not every op can be captured; time it eagerly instead
        captured, failure = None, f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    flags = [None] * dist.get_world_size(group)
    dist.all_gather_object(flags, failure, group=group)
    failure = next((f for f in flags if f is not None), None)
    if failure is not None:
        torch.cuda.synchronize()
        return time_eager(bound.call, plan, group), f"graph capture failed ({failure}); eager", None
    return time_graph(captured, plan, group), None, captured


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measurement(case: Case, impl: Implementation, timing: Timing | None, summaries: list, wrong_before,
                 wrong_after, error: str | None, note: str | None, world: int) -> Measurement:
    timed = [r for r in summaries if r is not None]
    medians = tuple(r.median_us for r in timed)
    slowest = max(timed, key=lambda r: r.median_us, default=None)
    bw = bandwidth(case.op, case.size_bytes, world, slowest.median_us) if slowest else None
    wrong = None if wrong_before is None or wrong_after is None else wrong_before + wrong_after
    if wrong is None and error is None:
        note = "; ".join(filter(None, [note, "unchecked (no reference)"]))
    return Measurement(
        op=case.op, implementation=impl.name, family=impl.family, size_bytes=case.size_bytes,
        count=case.count, dtype=case.dtype,
        timing=timing.mode if timing else case.plan.mode,
        calls_per_sample=timing.calls_per_sample if timing else 0,
        samples=len(timing.samples_us) if timing else 0,
        median_us=slowest.median_us if slowest else None,
        p20_us=slowest.p20_us if slowest else None, p80_us=slowest.p80_us if slowest else None,
        per_rank_median_us=medians if len(medians) == world else (),
        algbw_gbps=bw.algbw_gbps if bw else None, busbw_gbps=bw.busbw_gbps if bw else None,
        link_percent=None, wrong_before=wrong_before, wrong_after=wrong_after, wrong=wrong,
        error=error, note=note or None,
    )


def measure_link(nbytes: int) -> LinkLimit:
    """Peer-pull bandwidth (link.py), the slowest rank's; on CPU, nothing to measure."""
    if _device().type != "cuda":
        return LinkLimit(nbytes, None, None, "CPU run: no link to measure")
    group = dist.group.WORLD
    if dist.get_world_size(group) < 2:
        return LinkLimit(nbytes, None, None, "one rank: no peer to pull from")
    if topology.of_group(group).spans:
        # No pointer reaches the next rank (and torch's CUDA symmetric memory would have to come before
        # the NVSHMEM backend the workspace needs): the link across nodes is the network's.
        return LinkLimit(nbytes, None, None, "group spans nodes (SYMMCOLL_RANKS_PER_NODE): no NVLink peer pull")
    try:
        result = (*link.peer_pull_gbps(group, nbytes), None)
    except Exception as exc:  # noqa: BLE001 - the sweep is worth having without a link figure
        result = (None, None, None, f"{type(exc).__name__}: {exc}")
    gathered = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, result, group=group)
    failures = [g[3] for g in gathered if g[3]]
    if failures:
        return LinkLimit(nbytes, None, None, f"link measurement failed: {failures[0]}")
    copy_engine = min(g[0] for g in gathered)
    pulls = [g[1] for g in gathered]
    sm_pull = min(pulls) if all(p is not None for p in pulls) else None
    notes = "; ".join(dict.fromkeys(g[2] for g in gathered if g[2])) or None
    return LinkLimit(nbytes, copy_engine, sm_pull, notes)
