"""The rank side of benchmarks/scaleout_check.py: every hierarchical op on emulated nodes, case by case,
each phase written down as it happens (scaleout_journal.py) and bounded.

What a rank does before its first case reports (``nodes``), in this order, each a journal phase:
1. (before this module runs) the rank process starts, imports torch and symmcoll, joins the process
   group (launch.RankPool: NCCL, or gloo for ranks sharing a GPU); the parent times it.
2. "nvshmem init" (GPU, one rank per GPU only): torch's NVSHMEM backend selected and a 4 KiB NVSHMEM
   allocation on symmcoll's allocation thread -- NVSHMEM's initialisation: a unique id through the
   default group's store, NVSHMEM's bootstrap over sockets, its own NCCL communicator; collective over
   every rank, and nothing bounds it but this phase's limit.
3. "workspace": the hierarchical workspace (memory/creation.py): a store rendezvous (bounded by
   SYMMCOLL_TIMEOUT_S), one symmetric allocation of every region (NVSHMEM on GPU: nvshmem_malloc, collective
   over every rank, unbounded), torch's rendezvous of it, the fills, a second store rendezvous.
4. each case: three calls of fresh data, the first one compiling its kernels (the exchange kernel is linked
   against NVSHMEM's device library: ~5 s on an H100 per variant, and each rank compiles its own, as the
   rank number is specialised); every device-side wait gives up after SYMMCOLL_TIMEOUT_S worth of spins.
5. after each case, "agree": one small all_reduce over the process group in which the ranks agree whether
   any of them failed the case (then all reset the workspaces together: with NVSHMEM the free is collective,
   a rank resetting alone would wait in it for ranks that never come) and whether time is up (then all
   stop together; ranks that stopped at different cases would wait on each other).
Every phase has a limit: past it the rank dumps its stacks and ends (scaleout_journal.Journal.phase).
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import plan, topology
from symmcoll.bench.checks import rank_coded

from scaleout_journal import CASE_PHASE, Journal
from shared_gpu_check import _expected  # the exact answer computed locally (benchmarks/ is on sys.path)

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True)
class Case:
    index: int
    op: str  # a collective, or "moe_round_trip"
    dtype: torch.dtype
    numel: int = 0  # per-rank input elements (collectives)
    algorithm: str = "auto"
    tokens: int = 0  # moe_round_trip: tokens x hidden, top-k
    hidden: int = 0
    k: int = 0

    def row(self) -> dict:
        row = {"index": self.index, "op": self.op, "dtype": str(self.dtype)}
        if self.op == "moe_round_trip":
            return {**row, "tokens": self.tokens, "hidden": self.hidden, "k": self.k}
        return {**row, "numel": self.numel, **({"asked": self.algorithm} if self.algorithm != "auto" else {})}


@dataclass(frozen=True)
class Limits:
    """Seconds a phase may take before its rank dumps its stacks and ends."""

    init_s: float = 90.0  # NVSHMEM's initialisation; the workspace (each; seconds when they work)
    first_call_s: float = 100.0  # a case's first call: its compiles, then waits bounded by SYMMCOLL_TIMEOUT_S
    call_s: float = 60.0  # later calls
    sync_s: float = 60.0  # the agreement after a case; a reset of the workspaces


@dataclass(frozen=True)
class RankPlan:
    """What ``nodes`` does on every rank of one configuration."""

    label: str  # e.g. "2x1": nodes x ranks per node
    journal_dir: str
    t0: float  # time.time() when the check started: the journals' time origin
    deadline: float  # time.time() after which no case starts (the ranks agree on it)
    cases: tuple
    limits: Limits
    inject: tuple = ()  # ("fail" | "hang", rank, case index): tests of the failure paths


def cases_for(world: int, cuda: bool) -> tuple:
    """Most decisive first: one tiny bf16 all_reduce (NVSHMEM up, one exchange each way); every op once at
    bf16, the get path, one MoE round trip; on GPU every op at 2**18 elements per rank; then the other
    dtypes and sizes. A run cut by its time budget keeps the head of this list."""
    bf16, small, odd, large = torch.bfloat16, world * 3, world * 4097, world << 18
    specs = [("all_reduce", bf16, small)]
    specs += [(op, bf16, small) for op in OPS[1:]]
    specs += [("all_gather", bf16, odd, "hierarchical_get"), ("moe_round_trip", bf16, 0, "auto", 5, 16, 2)]
    if cuda:
        specs += [(op, bf16, large) for op in OPS]
    for dtype in (bf16, torch.float16, torch.float32):
        for numel in (small, odd, large) if cuda else (small, odd):
            specs += [(op, dtype, numel) for op in OPS if (op, dtype, numel) not in specs]
    if cuda:
        specs.append(("moe_round_trip", bf16, 0, "auto", 128, 7168, 8))
    return tuple(Case(i, *spec) for i, spec in enumerate(specs))


def _prepare(journal: Journal, limits: Limits, dev: torch.device):
    """Phases 2 and 3 of the module docstring; returns what must stay alive (the NVSHMEM probe)."""
    probe = None
    if dev.type == "cuda" and os.environ.get("SYMMCOLL_MEMORY") != "ipc":
        import torch.distributed._symmetric_memory as symm_mem
        from symmcoll.memory.transport import select_nvshmem_backend

        with journal.phase("nvshmem init (a 4 KiB NVSHMEM allocation)", limits.init_s):
            select_nvshmem_backend(dev)
            probe = symmcoll.memory.persistent(dev, lambda: symm_mem.empty(4096, dtype=torch.uint8, device=dev))
            torch.cuda.synchronize()
    with journal.phase("workspace", limits.init_s):
        ws = symmcoll.memory.get_workspace(None, dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    kind = {None: "none", 0: "emulated", 1: "NVSHMEM"}[getattr(ws.transport, "kind", None)]
    mib = sum(r.local.numel() for r in ws.regions.values()) / 2**20
    journal.say(f"workspace of {mib:.0f} MiB in regions, {ws.topology.signature if ws.topology else 'one node'}, "
                f"transport {kind}")
    return probe


def _collective(x: torch.Tensor, case: Case):
    if case.algorithm != "auto":
        return getattr(symmcoll, case.op)(x, algorithm=case.algorithm)
    return getattr(symmcoll, case.op)(x)


def _run_case(journal: Journal, case: Case, rpl: RankPlan, dev: torch.device) -> dict:
    """Three calls of fresh data, each its own phase; the rank's row (wrong count, times, error)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = dev.type == "cuda"
    row = {**case.row(), "wrong": 0}
    times = []
    try:
        for call in range(3):
            limit = rpl.limits.first_call_s if call == 0 else rpl.limits.call_s
            name = f"{CASE_PHASE}#{case.index} call {call}: {case.op} {str(case.dtype).replace('torch.', '')}"
            with journal.phase(name, limit, say_begin=rank == 0 and call == 0, say_end=False):
                if call == 0 and ("hang", rank, case.index) in rpl.inject:
                    time.sleep(3600)  # a test of the phase limit: the journal must name this phase
                start = time.perf_counter()
                row["wrong"] += _one_call(case, rank, world, call, dev, row)
                if cuda:
                    torch.cuda.synchronize()
                times.append((time.perf_counter() - start) * 1e3)
        symmcoll.check()
        if ("fail", rank, case.index) in rpl.inject:
            raise RuntimeError("injected failure (--inject): this rank alone fails the case")
    except Exception:  # noqa: BLE001 - recorded; the ranks then agree on resetting together
        row["error"] = traceback.format_exc()[-1500:]
    if times:
        row["ms_first"] = round(times[0], 3)
    if len(times) > 1:
        row["ms_after"] = round(sum(times[1:]) / len(times[1:]), 3)
    return row


def _one_call(case: Case, rank: int, world: int, call: int, dev: torch.device, row: dict) -> int:
    """One call of ``case`` with this call's data: the number of wrong elements (sets row["algorithm"])."""
    if case.op != "moe_round_trip":
        x_of = lambda r: rank_coded(case.numel, case.dtype, r, call, dev)  # noqa: E731
        row["algorithm"] = plan.resolve(case.op, x_of(rank), algorithm=case.algorithm).name
        got = _collective(x_of(rank), case)
        return int((got.float() != _expected(case.op, x_of, world, rank).float()).sum())
    experts = 8 * world
    g = torch.Generator().manual_seed(100 * call + rank)
    ids = torch.stack([torch.randperm(experts, generator=g)[:case.k] for _ in range(case.tokens)]).to(dev)
    ids[0, -1] = -1  # a dropped slot
    tokens = rank_coded(case.tokens * case.hidden, case.dtype, rank, call, dev).view(case.tokens, case.hidden)
    recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts)
    # Identity experts and unit weights: every token comes back times its number of valid slots.
    got = symmcoll.moe_combine(recv, torch.ones(case.tokens, case.k, device=dev), handle)
    want = (tokens.float() * (ids >= 0).sum(1, keepdim=True)).to(case.dtype)
    row["algorithm"] = plan.resolve("moe_dispatch", tokens, others=(ids,), options=(
        ("num_experts", experts), ("max_rows", recv.shape[0]))).name
    return int((got != want).sum())


def _agree(journal: Journal, limits: Limits, dev: torch.device, failed: bool, out_of_time: bool) -> tuple[bool, bool]:
    """(did any rank fail, is any rank out of time), the same answer on every rank."""
    with journal.phase("agree", limits.sync_s, say_begin=False, say_end=False):
        on = dev if dist.get_backend() == "nccl" else torch.device("cpu")
        flags = torch.tensor([int(failed), int(out_of_time)], dtype=torch.int32, device=on)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        any_failed, stop = flags.tolist()
    return bool(any_failed), bool(stop)


def _reset(journal: Journal, limits: Limits, dev: torch.device, why: str) -> None:
    """Every rank together (NVSHMEM's free is collective): kernels done, workspaces dropped."""
    with journal.phase(f"reset ({why})", limits.sync_s, say_begin=False, say_end=False):
        if dev.type == "cuda":
            try:
                torch.cuda.synchronize()  # a failed call's kernels end by their own wait budgets
            except RuntimeError as exc:  # a sticky CUDA error: the reset below still drops the workspaces
                journal.say(f"synchronize before the reset: {exc}")
        symmcoll.reset()


def nodes(per_node: int, rpl: RankPlan) -> list[dict]:
    """On every rank: the cases of ``rpl`` with nodes of ``per_node`` ranks; the rank's rows (also in its
    journal, which is what the parent reads: it survives a killed rank)."""
    os.environ[topology.ENV_RANKS_PER_NODE] = str(per_node)
    symmcoll.reset()
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    journal = Journal(rpl.journal_dir, rpl.label, dist.get_rank(), rpl.t0)
    rows, probe, failed = [], None, False
    try:
        try:
            probe = _prepare(journal, rpl.limits, dev)
        except Exception:  # noqa: BLE001
            failed = True
            rows.append({"index": -1, "op": "workspace", "wrong": 0, "error": traceback.format_exc()[-1500:]})
            journal.case(rows[-1])
        if _agree(journal, rpl.limits, dev, failed, False)[0]:
            return rows  # no workspace on some rank: no case can run
        slowest = 0.0
        for position, case in enumerate(rpl.cases):
            if position:
                out_of_time = time.time() + max(slowest, 5.0) > rpl.deadline
                any_failed, stop = _agree(journal, rpl.limits, dev, failed, out_of_time)
                if any_failed:
                    _reset(journal, rpl.limits, dev, "a rank failed the last case")
                if stop:
                    left = [c.index for c in rpl.cases[position:]]
                    rows.append({"index": 10_000, "op": "left_out", "wrong": 0, "cases": left,
                                 "note": f"time budget: {len(left)} cases not started"})
                    journal.case(rows[-1])
                    break
            began = time.perf_counter()
            rows.append(_run_case(journal, case, rpl, dev))
            journal.case(rows[-1])
            failed = bool(rows[-1].get("error"))
            slowest = max(slowest, time.perf_counter() - began)
        return rows
    finally:
        os.environ.pop(topology.ENV_RANKS_PER_NODE, None)
        del probe
        _reset(journal, rpl.limits, dev, "end of the configuration")
        journal.close()
