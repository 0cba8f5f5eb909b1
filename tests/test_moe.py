"""MoE dispatch and combine against reference.py (torch all_to_all_single with host-side counts):
random routing at 1 (no staging, no push), 2, 3 and 4 ranks including experts that receive nothing, tokens whose k experts share
a rank, dropped slots (-1) and more than one routing block; rank- and token-coded rows, so a misplaced row
names its source rank, token and expert; the "nccl" baseline; max_recv_rows too small and bad topk_ids
reported naming the argument; rounds when the workspace is small; fake shapes. GPU-only: 200 calls of
random routing, and CUDA-graph replays with new routing."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launcher, reference

from rank_checks import assert_clean_finish, assert_pads_zero, device, with_workspace_bytes


def coded_tokens(tokens_n, hidden, rank, call, dtype=torch.bfloat16):
    """Row t of rank r starts (r, t // 16, t % 16) and goes on with small integers: exact in bf16, and a
    misplaced row says whose it is."""
    i = torch.arange(tokens_n * hidden, dtype=torch.int64).reshape(tokens_n, hidden)
    rows = ((i * 7 + rank * 5 + call * 3) % 9 - 4).float()
    rows[:, 0] = rank
    rows[:, 1] = torch.arange(tokens_n) // 16
    rows[:, 2] = torch.arange(tokens_n) % 16
    return rows.to(dtype).to(device())


def routing(tokens_n, k, experts, world, rank, call):
    """Random distinct experts per token (seeded by rank and call), with: experts 1 and E-1 never chosen
    (they receive nothing), every 5th token's slots all on one rank, every 7th token's last slot dropped
    (-1), token 0 routed nowhere."""
    rng = random.Random(1000 * call + rank)
    local = experts // world
    usable = [e for e in range(experts) if e not in (1, experts - 1)]
    ids = []
    for t in range(tokens_n):
        if t % 5 == 0:
            owner = rng.randrange(world)
            pool = [e for e in usable if e // local == owner]
            row = rng.sample(pool, min(k, len(pool)))
            row += rng.sample([e for e in usable if e not in row], k - len(row))
        else:
            row = rng.sample(usable, k)
        if t % 7 == 3:
            row[-1] = -1
        ids.append(row)
    ids[0] = [-1] * k
    return torch.tensor(ids, dtype=torch.int64 if call % 2 else torch.int32, device=device())


def _name_row(row: torch.Tensor) -> str:
    return f"(rank {int(row[0])}, token {int(row[1]) * 16 + int(row[2])})"


def assert_dispatch(got, want, counts, what):
    """Bit-exact rows; a wrong row is named by its local expert and the token it holds and should hold."""
    rank = dist.get_rank()
    n = int(counts.sum())
    bad = (got[:n].view(torch.int16) != want[:n].view(torch.int16)).any(dim=1).nonzero().reshape(-1)
    if bad.numel():
        i = int(bad[0])
        expert = int((torch.cumsum(counts, 0) <= i).sum())
        raise AssertionError(f"rank {rank}: {what}: {bad.numel()} of {n} rows wrong; row {i} (local expert {expert}) "
                             f"holds {_name_row(got[i].cpu())}, want {_name_row(want[i].cpu())}")


def expert_compute(recv, counts, rank):
    """A stand-in for the experts: row * (local expert + 1) + rank, exact in bf16."""
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=recv.device), counts)
    out = torch.zeros_like(recv)
    n = expert.numel()
    out[:n] = (recv[:n].float() * (expert[:, None] + 1) + rank).to(recv.dtype)
    return out


def _round_trip(tokens_n, hidden, experts, k, calls, algorithms=("auto", "auto")):
    rank, world = dist.get_rank(), dist.get_world_size()
    for call in range(calls):
        tokens = coded_tokens(tokens_n, hidden, rank, call)
        ids = routing(tokens_n, k, experts, world, rank, call)
        weights = torch.tensor([0.5, 0.25, 2.0, 1.0, 0.125, 4.0, 1.0, 0.5][:k], device=device()).repeat(tokens_n, 1)
        what = f"{algorithms} T={tokens_n} H={hidden} E={experts} top-{k} call {call}"
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts, algorithm=algorithms[0])
        want = reference.moe_dispatch(tokens, ids, experts, max_rows=recv.shape[0])
        assert torch.equal(counts, want[1]), \
            f"rank {rank}: {what}: expert counts {counts.tolist()}, want {want[1].tolist()}"
        assert_dispatch(recv, want[0], counts, what)
        assert torch.equal(handle.row_origin, want[2]), f"rank {rank}: {what}: row origins differ"
        assert torch.equal(handle.self_rows, want[3]), f"rank {rank}: {what}: own-token rows differ"
        local = experts // world
        for unused in (1, experts - 1):  # never chosen: their rank holds no row for them
            assert unused // local != rank or int(counts[unused % local]) == 0, (what, counts)
        expert_out = expert_compute(recv, counts, rank)
        combined = symmcoll.moe_combine(expert_out, weights, handle, algorithm=algorithms[1])
        expected = reference.moe_combine(expert_out, weights, ids, want[2], experts)
        bad = (combined.float() != expected.float()).any(dim=1).nonzero().reshape(-1)
        if bad.numel():
            t = int(bad[0])
            raise AssertionError(f"rank {rank}: {what}: combine wrong for {bad.numel()} tokens, first token {t} "
                                 f"(experts {ids[t].tolist()}): got {combined[t, :4].tolist()}, "
                                 f"want {expected[t, :4].tolist()}")
    assert_pads_zero(f"after moe {algorithms}")
    return True


# (T, H, E per rank, k): top-2 of 2 experts per rank; top-3 of 4 per rank over two routing blocks with odd
# bf16 rows (half-words); top-8 of 8 per rank (every rank holds several of a token's experts).
SHAPES = [(20, 8, 2, 2), (300, 5, 4, 3), (24, 16, 8, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}H{}E{}k{}".format(*s))
def test_dispatch_combine(pools, world_size, shape):
    tokens_n, hidden, per_rank, k = shape
    experts = per_rank * world_size
    assert pools(world_size).run(_round_trip, tokens_n, hidden, experts, k, 2, ("pull", "push")) == [True] * world_size


def _one_rank():
    """World size 1: no staging, no push, one round; odd rows over several routing blocks, and every
    slot of a token on the rank; each dispatch variant (fused/moe_rules.py): 1 (one launch, every program
    routes every slot), 0 (the routing launch first, LOCAL_ROUTE_SLOTS 0), 2 (one launch routed by
    ranges of tokens: several ranges, a routing pass of several chunks that end inside a range, rows in
    two parts), 3 (2 with the next item's loads ahead), 4 (3 with each range's slots routed at once,
    before its copies, the histogram pass split at the range), 5 (0 with the pull's next item loaded
    ahead: items of 16 tokens over several routing blocks, several items a program, rows in two parts)
    and 6 (the folded prefixes and the pull two items ahead: the same shapes), each reporting
    max_recv_rows too small and a bad id."""
    from symmcoll.fused import moe_rules
    saved = moe_rules.LOCAL_ROUTE_SLOTS["cpu"], moe_rules.DISPATCH_VARIANT["cpu"]
    try:
        for local_slots, variant, shapes in ((4096, 0, ((300, 5, 8, 3), (24, 16, 16, 8))), (0, 0, ((300, 5, 8, 3),)),
                                             (0, 2, ((300, 5, 8, 3), (24, 16, 16, 8), (20, 1024, 8, 2))),
                                             (0, 3, ((300, 5, 8, 3), (20, 1024, 8, 2))),
                                             (0, 4, ((300, 5, 8, 3), (24, 16, 16, 8), (20, 1024, 8, 2))),
                                             (0, 5, ((300, 5, 8, 3), (24, 16, 16, 8), (20, 1024, 8, 2))),
                                             (0, 6, ((300, 5, 8, 3), (24, 16, 16, 8), (20, 1024, 8, 2)))):
            moe_rules.LOCAL_ROUTE_SLOTS["cpu"], moe_rules.DISPATCH_VARIANT["cpu"] = local_slots, variant
            kernel = {0: "moe_route_kernel", 1: "moe_dispatch_local_kernel", 2: "moe_dispatch_ranges_kernel",
                      3: "moe_dispatch_ranges_kernel", 4: "moe_dispatch_ranges_kernel",
                      5: "moe_dispatch_kernel", 6: "moe_pull_folded_kernel"}[variant or (local_slots > 0)]
            if variant == 5:  # the pull with its next item ahead is the one launched
                with launcher.recording() as launches:
                    symmcoll.moe_dispatch(coded_tokens(16, 4, 0, 0), torch.zeros(16, 2, dtype=torch.int64,
                                                                                 device=device()), 2)
                assert [r.meta.get("AHEAD") for r in launches if r.kernel.__name__ == kernel] == [True], launches
            if variant == 6:  # the route kernel folds, and the folded pull is the one launched
                with launcher.recording() as launches:
                    symmcoll.moe_dispatch(coded_tokens(16, 4, 0, 0), torch.zeros(16, 2, dtype=torch.int64,
                                                                                 device=device()), 2)
                assert [(r.kernel.__name__, r.meta.get("FOLD")) for r in launches] == \
                    [("moe_route_kernel", True), (kernel, None)], launches
            launched = launcher.LAUNCH_COUNTS[kernel]
            for shape in shapes:
                _round_trip(*shape, 2 if local_slots or variant else 1, ("pull", "push"))
            assert launcher.LAUNCH_COUNTS[kernel] > launched, f"variant {variant}: {kernel} never launched"
            tokens, ids = coded_tokens(16, 4, 0, 0), torch.zeros(16, 2, dtype=torch.int64, device=device())
            ids[:, 1] = 1
            with pytest.raises(symmcoll.SymmcollArgumentError, match=r"max_rows = 5 is too small: 32"):
                symmcoll.moe_dispatch(tokens, ids, 2, max_recv_rows=5)
                symmcoll.check()
            ids[3, 0] = 7
            with pytest.raises(symmcoll.SymmcollArgumentError, match=r"topk_ids holds 7"):
                symmcoll.moe_dispatch(tokens, ids, 2)
                symmcoll.check()
            assert_clean_finish(f"after moe reports on one rank, LOCAL_ROUTE_SLOTS {local_slots}, variant {variant}")
    finally:
        moe_rules.LOCAL_ROUTE_SLOTS["cpu"], moe_rules.DISPATCH_VARIANT["cpu"] = saved
    return True


def test_dispatch_combine_one_rank(pools):
    assert pools(1).run(_one_rank) == [True]


def test_nccl_baseline(pools):
    assert pools(3).run(_round_trip, 20, 8, 6, 2, 1, ("nccl", "nccl")) == [True] * 3


def _reports():
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = coded_tokens(16, 4, rank, 0)
    ids = torch.zeros(16, 2, dtype=torch.int64, device=device())
    ids[:, 1] = 1  # every token to experts 0 and 1, both on rank 0: rank 0 receives 16 * world rows
    with_sync = lambda fn: (fn(), torch.cuda.synchronize() if torch.cuda.is_available() else None, symmcoll.check())
    if rank == 0:
        with pytest.raises(symmcoll.SymmcollArgumentError, match=rf"max_rows = 5 is too small: {32 * world}"):
            with_sync(lambda: symmcoll.moe_dispatch(tokens, ids, 2 * world, max_recv_rows=5))
    else:
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, 2 * world, max_recv_rows=5)
        assert counts.tolist() == [0, 0]
    ids[3, 0] = 2 * world + 5 if rank == 1 else 0  # out of range on rank 1: reported, the slot ignored
    if rank == 1:
        with pytest.raises(symmcoll.SymmcollArgumentError, match=rf"topk_ids holds {2 * world + 5}"):
            with_sync(lambda: symmcoll.moe_dispatch(tokens, ids, 2 * world))
    else:
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, 2 * world)
    recv, counts, handle = symmcoll.moe_dispatch(tokens, ids.clamp(max=0), 2 * world)  # still usable
    if rank == 0:  # both slots of every token name expert 0: two rows each
        assert counts.tolist() == [32 * world, 0], counts
    for bad, pattern in [(lambda: symmcoll.moe_dispatch(tokens, ids, 2 * world + 1), "num_experts"),
                         (lambda: symmcoll.moe_dispatch(tokens, ids[:5], 2 * world), "topk_ids"),
                         (lambda: symmcoll.moe_dispatch(tokens, ids.float(), 2 * world), "topk_ids"),
                         (lambda: symmcoll.moe_dispatch(tokens[0], ids, 2 * world), "tokens"),
                         (lambda: symmcoll.moe_dispatch(tokens.t(), ids, 2 * world), "tokens must be contiguous"),
                         (lambda: symmcoll.moe_combine(recv, torch.ones(16, 3, device=device()), handle),
                          "topk_weights"),
                         (lambda: symmcoll.moe_combine(recv, torch.ones(2, 16, device=device()).t(), handle),
                          "topk_weights must be contiguous"),
                         (lambda: symmcoll.moe_combine(recv[:-1], torch.ones(16, 2, device=device()), handle),
                          "expert_out"),
                         (lambda: symmcoll.moe_combine(recv, torch.ones(16, 2, device=device()), None), "handle")]:
        with pytest.raises(ValueError, match=pattern):
            bad()
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = torch.ops.symmcoll.moe_dispatch(mode.from_tensor(tokens), mode.from_tensor(ids), 2 * world, 7,
                                               dist.group.WORLD.group_name, "auto")
        combined = torch.ops.symmcoll.moe_combine(fake[0], mode.from_tensor(torch.ones(16, 2)), mode.from_tensor(ids),
                                                  fake[1], fake[2], fake[3], 2 * world, dist.group.WORLD.group_name,
                                                  "auto")
    assert [tuple(t.shape) for t in fake] == [(7, 4), (2,), (7,), (16, 2)] and combined.shape == (16, 4)
    assert_clean_finish("after moe reports")
    return True


def test_reports_errors_and_fake_shapes(pools):
    assert pools(2).run(_reports) == [True] * 2


def test_rounds_in_a_small_workspace(pools):
    # 600 tokens of 16 bytes, top-2: beside 9920 bytes of routing metadata the dispatch stages 276 tokens
    # per round (3 rounds), the combine's landing region (half the buffer) holds 224 tokens' rows per
    # round (3 rounds).
    assert pools(3).run(with_workspace_bytes, 14336, _round_trip, 600, 8, 6, 2, 1, ("pull", "push")) == [True] * 3


def test_bench_script_on_cpu(tmp_path):
    """benchmarks/moe_bench.py end to end on CPU ranks (tiny case): every row checked, nothing wrong."""
    out = tmp_path / "moe.json"
    cmd = [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "moe_bench.py"), "--device", "cpu",
           "--world-size", "2", "--tokens", "16", "--hidden", "8", "--experts", "4", "--topk", "2",
           "--implementations", "symmcoll", "nccl", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result, = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["implementation"] for r in rows] == ["symmcoll", "nccl"], rows
    assert all(r["wrong"] == 0 and r["error"] is None and r["dispatch_us"] > 0 and r["combine_us"] > 0 for r in rows)
    assert rows[0]["dispatch_bytes_per_rank"] > 0 and result["world_size"] == 2
    assert result["provenance"]["backend"] == "gloo"


# --- GPU only (scripts/gpu_check.sh; reported as NOT RUN elsewhere) ---------------------------------

STRESS_CALLS = int(os.environ.get("SYMMCOLL_STRESS_CALLS", "200"))


def _stress(calls, seed):
    """Random T, H, E, k and routing every call; dispatch and combine checked against the reference."""
    rng = random.Random(seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = 0
    for call in range(calls):
        tokens_n, hidden = rng.choice([1, 7, 128, 1024]), rng.choice([16, 1000, 4096, 7168])
        experts = world * rng.choice([2, 4, 32])
        k = min(rng.choice([1, 2, 4, 8]), experts - 2)
        tokens = coded_tokens(tokens_n, hidden, rank, call)
        ids = routing(tokens_n, k, experts, world, rank, call)
        weights = torch.rand(tokens_n, k, generator=torch.Generator().manual_seed(call + rank)).mul(4).round().div(4)
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts)
        want = reference.moe_dispatch(tokens, ids, experts, max_rows=recv.shape[0])
        n = int(counts.sum())
        wrong += int((recv[:n].view(torch.int16) != want[0][:n].view(torch.int16)).sum())
        wrong += int((handle.row_origin != want[2]).sum()) + int((counts != want[1]).sum())
        expert_out = expert_compute(recv, counts, rank)
        combined = symmcoll.moe_combine(expert_out, weights.cuda(), handle)
        expected = reference.moe_combine(expert_out, weights.cuda(), ids, want[2], experts)
        wrong += int((combined.view(torch.int16) != expected.view(torch.int16)).sum())
    assert_clean_finish("after moe stress")
    return wrong


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
def test_moe_gpu_stress(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_stress, STRESS_CALLS, 7 + ws, timeout=900) == [0] * ws


def _graph(tokens_n, hidden, experts, k, replays):
    """dispatch, a stand-in expert step and combine captured once; every replay new tokens, routing, weights."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = coded_tokens(tokens_n, hidden, rank, 0)
    ids = routing(tokens_n, k, experts, world, rank, 0).long()
    weights = torch.ones(tokens_n, k, device="cuda")

    def step():
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts)
        return recv, counts, handle, symmcoll.moe_combine(recv * 2, weights, handle)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, counts, handle, combined = step()
    for replay in range(1, replays + 1):
        tokens.copy_(coded_tokens(tokens_n, hidden, rank, replay))
        ids.copy_(routing(tokens_n, k, experts, world, rank, replay))
        weights.copy_(torch.full((tokens_n, k), 0.5 * (replay % 3 + 1)))
        graph.replay()
        want = reference.moe_dispatch(tokens, ids, experts, max_rows=recv.shape[0])
        assert_dispatch(recv, want[0], counts, f"graph replay {replay}")
        expected = reference.moe_combine(recv * 2, weights, ids, want[2], experts)
        assert torch.equal(combined, expected), f"rank {rank}: combine, graph replay {replay}"
    assert_clean_finish("after moe graph replays")
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
def test_moe_cuda_graph(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_graph, 512, 4096, 8 * ws, 2, 10) == [10] * ws


def test_dispatch_variant_6_folds_only_where_the_scan_is_one_step():
    """Variant 6 needs every routing block in the route kernel's one scan step (the totals before the
    folded prefixes); elsewhere (more blocks at many experts, or peers) the dispatch runs as variant 5."""
    from symmcoll.fused import moe_rules
    assert moe_rules.runs_folded(6, 64, 256, 1)  # 1024 tokens, top-8 of 256 experts: the cell it is for
    assert moe_rules.runs_folded(6, 512, 8, 1)  # 4096 tokens, top-8 of 8: one step of [512, 8]
    assert not moe_rules.runs_folded(6, 256, 256, 1)  # 4096 tokens, top-8 of 256: sixteen steps
    assert not moe_rules.runs_folded(6, 10, 8, 2) and not moe_rules.runs_folded(5, 10, 8, 1)
