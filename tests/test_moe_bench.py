"""benchmarks/moe_bench.py's torch_vdev baseline on CPU ranks: it runs in rank processes of its own, in
which selecting NVSHMEM is the first symmetric-memory action (torch refuses "Backend can not be changed
after use." once symmcoll's workspace exists); its buffers are allocated once for every case; its rows are
checked in the oracle's layout through the output offsets torch returns (empty experts padded to one row).
torch's ops are modelled over gloo (GlooVdev) after their CUDA source (nvshmem_extension.cu); where
NVSHMEM is missing (here, the real torch on CPU) every row says why instead of failing.

The timed ``nccl`` baseline (symmcoll's "nccl" algorithm, fused/moe_nccl.py) is exact against the oracle on
hand-made uneven routing, and its dispatch reads the host once, all-gathers the counts once and calls
all_to_all_single once, its combine calls all_to_all_single once and reads nothing (the oracle, timed
before, read the host twice and exchanged four times per dispatch)."""

import json
from pathlib import Path

import torch
import torch.distributed as dist

from symmcoll import launch, reference

from rank_checks import CountedCalls

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # spawned ranks inherit sys.path and unpickle moe_bench.*
    import moe_bench
    return moe_bench


def _exchange(rows, send_counts, recv_counts):
    """all_to_all_single of whole rows (viewed as bytes: gloo has no bf16), grouped by destination rank."""
    got = rows.new_empty((int(recv_counts.sum()), rows.shape[1]))
    dist.all_to_all_single(got.view(torch.uint8), rows.contiguous().view(torch.uint8),
                           [int(n) for n in recv_counts], [int(n) for n in send_counts])
    return got


def _all_gather(t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.stack(parts)


class GlooVdev:
    """moe_bench's torch API (TorchSymmMem) on CPU: symm_mem.empty as zeros, all_to_all_vdev_2d and
    all_to_all_vdev_2d_offset with torch's layouts over gloo; every call is logged per rank (with how
    many symmcoll workspaces and torch_buffers allocations the process holds at set_backend)."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir

    def _log(self, **entry):
        with open(Path(self.log_dir) / f"rank{dist.get_rank()}.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")

    def unavailable(self, device):
        return None

    def select_nvshmem(self, device, heap_bytes):
        from symmcoll import memory
        from symmcoll.memory import torch_buffers
        self._log(call="set_backend", workspaces=len(memory.workspaces()),
                  torch_buffers=sum(len(v) for v in torch_buffers._ALLOCATIONS.values()), heap_bytes=heap_bytes)

    def empty(self, numel, dtype, device):
        self._log(call="empty", bytes=numel * dtype.itemsize)
        return torch.zeros(numel, dtype=dtype, device=device)

    def dispatch(self, inp, out, in_splits, out_splits_offsets, group_name):
        """Input rows by global expert (rank-major); out by local expert, then source rank, each expert's
        bin at least one row (major_align 1); out_splits_offsets[:, e * world + source]."""
        world, rank = dist.get_world_size(), dist.get_rank()
        ne = in_splits.numel() // world
        coming = _all_gather(in_splits)[:, rank * ne:(rank + 1) * ne]  # [source, local expert]
        received = _exchange(inp[: int(in_splits.sum())], in_splits.view(world, ne).sum(1), coming.sum(1))
        bins = coming.sum(0).clamp(min=1)
        start = torch.cumsum(bins, 0) - bins
        at_source = 0
        for source in range(world):
            for e in range(ne):
                n, at = int(coming[source, e]), int(start[e] + coming[:source, e].sum())
                out[at:at + n] = received[at_source:at_source + n]
                out_splits_offsets[0, e * world + source], out_splits_offsets[1, e * world + source] = n, at
                at_source += n
        self._log(call="dispatch", padded=int((coming.sum(0) == 0).sum()))

    def combine(self, inp, out, in_splits_offsets, out_splits_offsets, group_name):
        """Rows at in_splits_offsets[:, e * world + source] go back to their source, where they land by
        owner rank, then local expert, from row 0 on; out_splits_offsets[:, owner * ne + e]."""
        world, rank = dist.get_world_size(), dist.get_rank()
        ne = in_splits_offsets.shape[1] // world
        splits, offsets = in_splits_offsets.view(2, ne, world)  # [local expert, source]
        rows = torch.cat([inp[int(offsets[e, s]):int(offsets[e, s] + splits[e, s])]
                          for s in range(world) for e in range(ne)])
        coming = _all_gather(splits)[:, :, rank]  # [owner, local expert]
        received = _exchange(rows, splits.sum(0), coming.sum(1))
        out[: received.shape[0]] = received
        counts = coming.reshape(-1)
        out_splits_offsets[0], out_splits_offsets[1] = counts, torch.cumsum(counts, 0) - counts


def test_torch_vdev_in_ranks_of_its_own(monkeypatch, tmp_path):
    moe_bench = _bench(monkeypatch)
    # (tokens, hidden, experts, top-k): at 2 ranks the first leaves global expert 1 without a row (a
    # padded bin); the cases differ in size, so every one is a view of buffers sized for the largest.
    cases = [(3, 8, 8, 2), (16, 16, 4, 2), (5, 8, 8, 1)]
    names = ["symmcoll", "nccl", "torch_vdev"]
    result = moe_bench.measure(2, cases, names, "cpu", vdev_api=GlooVdev(str(tmp_path)))
    rows = result["rows"]
    assert [(r["tokens"], r["implementation"]) for r in rows] == [(c[0], n) for c in cases for n in names]
    assert all(r["wrong"] == 0 and r["error"] is None and r["dispatch_us"] > 0 and r["combine_us"] > 0
               for r in rows), rows
    for rank in range(2):
        log = [json.loads(line) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
        first = log[0]
        # symmcoll's rows ran before in other processes: here nothing had touched symmetric memory
        assert first["call"] == "set_backend" and first["workspaces"] == 0 and first["torch_buffers"] == 0, log[:2]
        empties = [e["bytes"] for e in log if e["call"] == "empty"]
        assert len(empties) == 7 and all(e["call"] != "set_backend" for e in log[1:])  # once, for every case
        assert first["heap_bytes"] >= sum(empties)
        assert sum(e["padded"] for e in log if e["call"] == "dispatch") > 0


def test_torch_vdev_says_why_it_did_not_run(monkeypatch):
    """The real torch API on CPU ranks: every row carries the reason, nothing is timed or raised."""
    moe_bench = _bench(monkeypatch)
    cases = [(4, 8, 4, 2), (8, 8, 4, 2)]
    rows = moe_bench.measure(2, cases, ["torch_vdev"], "cpu")["rows"]
    assert [r["tokens"] for r in rows] == [4, 8]
    assert all(r["error"].startswith("not run: torch's all_to_all_vdev_2d needs CUDA") and r["wrong"] is None
               and "dispatch_us" not in r for r in rows), rows


def _uneven_routing(case, rank, world, experts, k):
    """Hand-made top-k ids: most slots on rank 0's experts, some tokens with all k slots on one rank or
    one expert twice, invalid ids (-1 and E), experts that nobody picks; case "one_receiver": every token
    of every rank goes to rank 0 only (the others receive nothing)."""
    local = experts // world
    if case == "one_receiver":
        rows = [[t % local, -1, (t + 1) % local] for t in range(9)]
    else:
        rows = [[0, 1, 2], [0, 0, experts - 1], [local, -1, 1], [2, experts, 0], [1, 0, local + 2],
                [-1, -1, -1], [local + 2, local, 0], [0, 2, 1], [experts - 1, 1, local]]
        rows = rows[rank:] + rows[:rank]  # each rank routes differently
    return torch.tensor([r[:k] for r in rows], dtype=torch.int64)


def _per_expert(rows, counts):
    """Expert outputs that depend on the expert: row * (local expert + 1) over the first counts.sum() rows."""
    factor = torch.repeat_interleave(torch.arange(1, counts.numel() + 1), counts)[:, None]
    out = rows.clone()
    out[:factor.shape[0]] = (rows[:factor.shape[0]].float() * factor).to(rows.dtype)
    return out


def _lean_nccl_on_uneven_routing(case):
    """One rank: moe_bench's Nccl against the oracle, exact, with host reads and all_to_all_single calls
    counted per phase; returns (wrong elements, dispatch calls, combine calls, rows received)."""
    import moe_bench
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens_n, hidden, experts, k = 9, 24, 4 * world, 3
    tokens, _, weights = moe_bench._inputs(tokens_n, hidden, experts, k, rank, torch.device("cpu"))
    ids = _uneven_routing(case, rank, world, experts, k)
    want = reference.moe_dispatch(tokens, ids, experts)
    impl = moe_bench.Nccl(tokens, ids, weights, experts)
    with CountedCalls() as in_dispatch:
        recv, counts, _ = impl.dispatch()
    wrong = moe_bench._wrong_dispatch(impl, recv, want, counts) + abs(recv.shape[0] - int(want[1].sum()))
    # Each expert's output depends on the expert (row * (local expert + 1)): a row combined with another
    # expert's output would show; every value stays exact in bf16 and in fp32 sums.
    impl.set_expert_out(_per_expert(recv, counts))
    with CountedCalls() as in_combine:
        combined = impl.combine()
    want_combined = reference.moe_combine(_per_expert(want[0], want[1]), weights, ids, want[2], experts)
    wrong += int((combined.view(torch.int16) != want_combined.view(torch.int16)).sum())
    return wrong, in_dispatch.calls, in_combine.calls, recv.shape[0], counts.tolist()


def test_nccl_baseline_is_lean_and_exact(monkeypatch):
    _bench(monkeypatch)
    for case, world in (("uneven", 2), ("uneven", 3), ("one_receiver", 2)):
        results = launch.run(_lean_nccl_on_uneven_routing, world, case, device="cpu", timeout=300)
        for rank, (wrong, dispatch_calls, combine_calls, received, counts) in enumerate(results):
            assert wrong == 0, (case, rank, results)
            gathers = sum(dispatch_calls.pop(name, 0) for name in ("all_gather_single", "all_gather_into_tensor"))
            assert gathers == 1, (case, rank, dispatch_calls)
            assert dispatch_calls == {"tolist": 1, "all_to_all_single": 1}, (case, rank, dispatch_calls)
            assert combine_calls == {"all_to_all_single": 1}, (case, rank, combine_calls)
            if case == "one_receiver":
                assert (received == 0) == (rank > 0), results  # only rank 0 receives rows
            else:
                assert 0 in counts and received > 0, results  # an expert with no row on every rank


def test_nccl_diagnose_measures_the_layer_and_its_communication_alone(monkeypatch):
    """moe_bench --nccl-diagnose on CPU ranks: the nccl row stays exact and carries the diagnosis; the
    communication floor moves exactly the rows the layer receives (one per (source token, this rank)
    pair: the oracle's row origins over k, distinct), and the profile sees one all-gather and one
    all_to_all per dispatch, one all_to_all per combine, and the layer's aten calls."""
    moe_bench = _bench(monkeypatch)
    import moe_nccl_diagnose
    cases = [(9, 24, 8, 3), (5, 16, 4, 2)]
    rows = moe_bench.measure(2, cases, ["nccl"], "cpu", diagnose=True)["rows"]
    assert [r["tokens"] for r in rows] == [9, 5] and all(r["wrong"] == 0 and r["error"] is None for r in rows), rows
    for (tokens_n, hidden, experts, k), row in zip(cases, rows):
        diag = row["nccl_diagnose"]
        assert all(v > 0 for v in diag["op_host_us"].values()), diag
        assert diag["comm_floor"]["us"] > 0 and all(v > 0 for v in diag["isolated_us"].values()), diag
        received = set()
        for rank in range(2):  # the row is rank 0's: every source token with an expert on rank 0
            tokens, ids, _ = moe_bench._inputs(tokens_n, hidden, experts, k, rank, torch.device("cpu"))
            received |= {(rank, t) for t in range(tokens_n) if ((ids[t] // (experts // 2)) == 0).any()}
        assert diag["comm_floor_rows_in"] == len(received), (diag["comm_floor_rows_in"], received)
        for phase, collectives in (("dispatch", {"c10d::_allgather_base_": 1.0, "c10d::alltoall_base_": 1.0}),
                                   ("combine", {"c10d::alltoall_base_": 1.0})):
            prof = diag["profile"][phase]
            # gloo's collectives cost the most host time here: they lead the list, once per call each
            c10d = {name: calls for name, calls, _ in prof["by_self_cpu"] if name.startswith("c10d::")}
            assert c10d == collectives, prof
            assert prof["aten_events_per_call"] >= (100 if phase == "dispatch" else 15), prof
            assert prof["wall_us_per_call"] > 0 and len(prof["by_self_cpu"]) == moe_nccl_diagnose.TOP_ENTRIES, prof
            # CPU ranks: no CUDA runtime call and no device copy to count (on CUDA: one DtoH per dispatch)
            assert prof["runtime_calls_per_call"] == {} and prof["copies_per_call"] == {}, prof
