"""Groups that span nodes (emulated on CPU): the hierarchical algorithms at 2 x 2, 3 x 2 and 2 x 4, every
op (the collectives, MoE dispatch and combine) and dtype, exact on rank-coded data (reductions against the fp32 reference, tolerances only for avg and
random data), fresh data on repeated calls, pieces beyond one exchange; the rule that cross-node memory is
reachable only through the transport; mismatched calls; routing; the NVSHMEM kernels' sm_90 compile.

One 8-rank pool serves every topology: 2 x 2 and 3 x 2 are subgroups of its first 4 and 6 ranks (node
size from SYMMCOLL_RANKS_PER_NODE, set inside the ranks and dropped with symmcoll.reset afterwards).
"""

import os
import random

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch, plan, reference, topology
from symmcoll.comm import exchange
from symmcoll.errors import SymmcollError
from symmcoll.memory.layout import ANNOUNCE_SLOT

from conftest import DEVICE
from rank_checks import assert_close, random_input, rank_coded

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="emulated nodes: CPU only (GPU: scripts/gpu_check.sh scaleout)")

# Data movement moves words: one dtype of each itemsize (1, 2, 4, 8 bytes) covers every dtype's kernel;
# the other 1-byte dtypes on 2 x 2 only.
MOVE_DTYPES = [torch.float8_e4m3fn, torch.bfloat16, torch.int32, torch.float64]
MORE_MOVE_DTYPES = [torch.uint8, torch.bool]


def _coded(numel, dtype, rank, call):
    """Rank-coded values for any dtype (bool: a rank-dependent pattern)."""
    if dtype == torch.bool:
        return (torch.arange(numel) * 3 + rank + call) % 5 < 2
    if dtype == torch.float8_e4m3fn:
        return rank_coded(numel, torch.float32, rank, call).to(dtype)
    return rank_coded(numel, dtype, rank, call)


def _in_nodes(size, per_node, fn, *args):
    """On every rank of the pool: nodes of ``per_node`` ranks, a group of the first ``size`` ranks, and
    ``fn(group, *args)`` on its members."""
    os.environ[topology.ENV_RANKS_PER_NODE] = str(per_node)
    # Host-side rendezvous of 8 interpreted ranks on 2 shared cores can take more than the default.
    os.environ["SYMMCOLL_TIMEOUT_S"] = "60"
    symmcoll.reset()
    try:
        group = dist.new_group(list(range(size))) if size < dist.get_world_size() else None
        return fn(group, *args) if dist.get_rank() < size else None
    finally:
        os.environ.pop(topology.ENV_RANKS_PER_NODE)
        os.environ.pop("SYMMCOLL_TIMEOUT_S")
        symmcoll.reset()


def _every_op(group, per_node, more):
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    nodes = world // per_node
    what = f"{nodes}x{per_node}"
    for op, x in (("all_reduce", torch.ones(4)), ("reduce_scatter", torch.ones(world)),
                  ("all_gather", torch.ones(4)), ("all_to_all", torch.ones(world))):
        assert plan.resolve(op, x, group).name == "hierarchical", f"{op} {what}: auto must pick hierarchical"
    routing = torch.zeros(4, 2, dtype=torch.int64)
    assert plan.resolve("moe_dispatch", torch.ones(4, 8), group, others=(routing,),
                        options=(("num_experts", world), ("max_rows", 8))).name == "hierarchical"
    assert plan.resolve("broadcast", torch.ones(4), group, src=0).name == "nccl"
    ws = [w for w in symmcoll.memory.workspaces() if w.group_name == (group or dist.group.WORLD).group_name][0]
    assert ws.topology.nodes == nodes and ws.transport is not None
    cap = exchange.capacity(ws, torch.float32)  # one exchange piece: sizes past it need several launches

    # Reductions: every dtype; a size of one element, an odd one, one of several pieces; on 2 x 2 the last
    # case again with fresh data (the same plan; elsewhere every call is a new plan, and each exchange
    # launch still alternates the slot sets).
    cases = [(torch.bfloat16, 1), (torch.float16, 1001), (torch.float32, world * cap + 37)]
    for call, (dtype, numel) in enumerate(cases + cases[-1:] if more else cases):
        x = rank_coded(numel, dtype, rank, call)
        assert_close(symmcoll.all_reduce(x, group), reference.all_reduce(x, group),
                     f"all_reduce {dtype} {numel} {what} call {call}", exact=True)
        x = rank_coded(world * (37 if numel < cap else cap + 5), dtype, rank, call)
        assert_close(symmcoll.reduce_scatter(x, group), reference.reduce_scatter(x, group),
                     f"reduce_scatter {dtype} {x.numel()} {what} call {call}", exact=True)
    # Reduce ops other than sum: avg divides per node and again across nodes (fp32 reference, a tolerance).
    for op in ("max", "min", "avg") if more else ("avg",):
        x = rank_coded(world * 33, torch.bfloat16, rank, 3)
        assert_close(symmcoll.all_reduce(x, group, op=op), reference.all_reduce(x, group, op=op),
                     f"all_reduce {op} {what}", exact=op != "avg")
        assert_close(symmcoll.reduce_scatter(x, group, op=op), reference.reduce_scatter(x, group, op=op),
                     f"reduce_scatter {op} {what}", exact=op != "avg")
    if more:
        x = random_input(3000, torch.float32, rank, 5).reshape(-1, 3)
        assert_close(symmcoll.all_reduce(x, group), reference.all_reduce(x, group), f"all_reduce random {what}")

    # Data movement, bit-exact: pieces of one and of several launches; on 2 x 2 the other 1-byte dtypes and
    # the first dtype again with fresh data.
    dtypes = MOVE_DTYPES + (MORE_MOVE_DTYPES + MOVE_DTYPES[:1] if more else [])
    for call, dtype in enumerate(dtypes):
        rows = 5 if call % 2 else cap // 4 + 3  # rows of 4 elements: one or several pieces
        x = _coded(rows * 4, dtype, rank, call).reshape(rows, 4)
        assert_close(symmcoll.all_gather(x, group), reference.all_gather(x, group), f"all_gather {dtype} {what}",
                     exact=True)
        if call == 1:  # the counterparts pulling (transport get) instead of pushing
            assert_close(symmcoll.all_gather(x, group, algorithm="hierarchical_get"), reference.all_gather(x, group),
                         f"all_gather hierarchical_get {dtype} {what}", exact=True)
        x = _coded(world * rows * 2, dtype, rank, call).reshape(world * rows, 2)
        assert_close(symmcoll.all_to_all(x, group), reference.all_to_all(x, group), f"all_to_all {dtype} {what}",
                     exact=True)
    for call in range(2 if more else 1):
        _moe_round_trip(group, rank, world, per_node, call, what)
    _assert_pads_zero(group, f"after the hierarchical ops {what}")
    symmcoll.check()
    return True


def _routing(rank, call, tokens_n, k, experts, nodes, per_node):
    """Rank ``rank``'s top-k ids (any rank can compute any other's): random on call 0, node-local on later
    calls (every token's experts on its own node, every third token one more on the next node: most
    tokens need one node); token 0 routed nowhere, a dropped slot in token 3."""
    rng = random.Random(100 * call + rank)
    if call == 0:
        ids = [rng.sample(range(experts), k) for _ in range(tokens_n)]
    else:
        per = experts // nodes
        home, next_ = rank // per_node, (rank // per_node + 1) % nodes
        ids = [rng.sample(range(home * per, home * per + per), k - (t % 3 == 0)) +
               ([next_ * per + rng.randrange(per)] if t % 3 == 0 else []) for t in range(tokens_n)]
    ids = torch.tensor(ids, dtype=torch.int64)
    ids[0], ids[3, -1] = -1, -1
    return ids


def _needing(ids, node, experts, nodes):
    """The tokens of ``ids`` with a slot naming one of node ``node``'s experts, in order."""
    return [t for t, row in enumerate(ids.tolist()) if any(0 <= e < experts and e // (experts // nodes) == node
                                                           for e in row)]


def _moe_round_trip(group, rank, world, per_node, call, what, tokens_n=12, hidden=8, k=3):
    """moe_dispatch then moe_combine against the reference: rows, counts and handle exact (rank- and
    token-coded rows), the combine exact on integer rows and weights of a few bits; random then node-local
    routing with a token routed nowhere and dropped slots. What crossed the node boundary, read from the
    exchanges of token rows and partials: from each other node's counterpart exactly its tokens that name
    one of my node's experts (DeepEP's normal mode), back from each node partials only for my tokens sent
    there, pads zero, and no more rows per piece than the largest such count between two nodes (my own
    node's tokens never cross)."""
    from symmcoll.fused import moe_hierarchical
    experts = 2 * world
    nodes, node, local = world // per_node, rank // per_node, rank % per_node
    ids = _routing(rank, call, tokens_n, k, experts, nodes, per_node)
    tokens = rank_coded(tokens_n * hidden, torch.bfloat16, rank, call).reshape(tokens_n, hidden)
    tokens[:, 0], tokens[:, 1] = rank, torch.arange(tokens_n)
    crossed = []  # the exchanges of bf16 rows: what each counterpart sent me
    exchange_rows = moe_hierarchical.counterpart_all_to_all

    def spy(plan, pieces):
        got = exchange_rows(plan, pieces)
        if pieces.dtype == torch.int16:  # bf16 rows as words (routing goes as int64, weights as int32)
            crossed.append(got.view(torch.bfloat16).view(nodes, -1, hidden))
        return got

    moe_hierarchical.counterpart_all_to_all = spy
    try:
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts, group)
        expert_out = (recv.float() * 2 + rank).to(torch.bfloat16)
        rng = random.Random(7 * call + rank)
        weights = torch.tensor([[rng.choice([0.25, 0.5, 1.0]) for _ in range(k)] for _ in range(tokens_n)])
        combined = symmcoll.moe_combine(expert_out, weights, handle)
    finally:
        moe_hierarchical.counterpart_all_to_all = exchange_rows
    rows_in, partials_back = crossed  # dispatch's token rows, combine's partials
    needs = {(m, r): _needing(_routing(r, call, tokens_n, k, experts, nodes, per_node), m, experts, nodes)
             for m in range(nodes) for r in range(local, world, per_node)}  # my counterparts' routing
    width = max(1, max(len(v) for (m, r), v in needs.items() if m != r // per_node))  # tokens to another node
    assert rows_in.shape[1] == width, f"{what}: pieces of {rows_in.shape[1]} rows, {width} needed"
    for source in range(nodes):
        if source == node:
            continue  # my own tokens for my node never cross
        sender = source * per_node + local
        want_tokens = needs[(node, sender)]
        got = rows_in[source]
        assert got[:len(want_tokens), 0].eq(sender).all() and got[:len(want_tokens), 1].tolist() == want_tokens, (
            f"{what} call {call}: rank {rank} got tokens {got[:, :2].tolist()} of rank {sender}, "
            f"wants exactly {want_tokens} (those naming node {node}'s experts)")
        assert not got[len(want_tokens):].any(), f"{what} call {call}: rank {rank}: pad rows from {sender} not zero"
        # Back from node `source`: one partial per token of mine I sent there, nothing for the others.
        assert partials_back.shape[1] == width and not partials_back[source, len(needs[(source, rank)]):].any(), (
            f"{what} call {call}: rank {rank}: partials from node {source} for tokens not sent there")
    if call > 0:  # node-local routing: most tokens need one node
        assert rows_in.shape[1] < tokens_n // 2, f"{what}: {rows_in.shape[1]} of {tokens_n} rows per piece"
    want, want_counts, want_origin, want_self = reference.moe_dispatch(tokens, ids, experts, group, recv.shape[0])
    rows = int(want_counts.sum())
    assert_close(counts, want_counts, f"moe_dispatch counts {what}", exact=True)
    assert_close(recv[:rows], want[:rows], f"moe_dispatch rows {what} call {call}", exact=True)
    assert_close(handle.row_origin, want_origin, f"moe_dispatch row_origin {what}", exact=True)
    assert_close(handle.self_rows, want_self, f"moe_dispatch self_rows {what}", exact=True)
    assert_close(combined, reference.moe_combine(expert_out, weights, ids, want_origin, experts, group),
                 f"moe_combine {what} call {call}", exact=True)


def _assert_pads_zero(group, what):
    dist.barrier(group)  # nobody starts a next call (signals into my pad) before every rank looked
    try:
        for ws in symmcoll.memory.workspaces():
            nonzero = ws.signal_pad[:ANNOUNCE_SLOT].nonzero()
            assert nonzero.numel() == 0, f"rank {ws.rank}: {what}: signal pad not zero at {nonzero[:8].tolist()}"
    finally:
        dist.barrier(group)


@pytest.fixture(scope="module")
def pool8(pools):
    return pools(8)


# 2 x 2 also runs max/min, random data, the other 1-byte dtypes, and every op again with fresh data.
@pytest.mark.parametrize("size,per_node,more", [(4, 2, True), (6, 2, False), (8, 4, False)], ids=["2x2", "3x2", "2x4"])
def test_every_op_across_nodes(pool8, size, per_node, more):
    assert pool8.run(_in_nodes, size, per_node, _every_op, per_node, more, timeout=600)[:size] == [True] * size


def _mismatch(group):
    """Rank 0 calls all_gather where the others call all_reduce (same bytes): reported, not hung."""
    rank = dist.get_rank(group)
    x = rank_coded(64, torch.float32, rank, 0)
    os.environ["SYMMCOLL_TIMEOUT_S"] = "8"  # bounds this test should a wait end by a timeout (next workspace)
    symmcoll.reset(group)
    symmcoll.all_reduce(x, group)  # the workspace exists: what follows is the mismatch alone
    try:
        if rank == 0:
            symmcoll.all_gather(x, group)
        else:
            symmcoll.all_reduce(x, group)
        symmcoll.check()
    except SymmcollError as exc:
        return type(exc).__name__, exc.peer
    return None


def test_mismatched_calls_across_nodes_are_reported(pool8):
    seen = pool8.run(_in_nodes, 4, 2, _mismatch, timeout=300)[:4]
    # Rank 0 and its counterpart (rank 2) meet in the exchange, rank 1 meets rank 0 in its node phase; rank 3,
    # whose partners all called all_reduce, learns from rank 1's exchange signal that rank 1 had failed.
    mismatch = "SymmcollMismatchError"
    assert seen == [(mismatch, 2), (mismatch, 0), (mismatch, 0), (mismatch, 1)], seen


def _read_across_nodes():
    """A kernel that cheats: one_shot reads every rank's buffer through the address table, which holds
    0 for the peer on the other node."""
    from symmcoll.comm.pull import one_shot_kernel
    from symmcoll.launcher import launch as launch_kernel
    os.environ[topology.ENV_RANKS_PER_NODE] = "1"
    symmcoll.reset()
    x = torch.ones(64)
    symmcoll.all_reduce(x)  # the workspace of 2 nodes x 1
    ws = symmcoll.memory.workspaces()[0]
    out = torch.empty_like(x)
    launch_kernel(one_shot_kernel, (1,), (*ws.kernel_args, 3, ws.buffer_ptrs_dev, x, out, 64),
                  dict(WORLD=2, REDUCE_OP=0, BLOCK=64))
    return out.tolist()


def test_a_kernel_that_reads_a_cross_node_peer_fails():
    with pytest.raises(launch.RankError, match="exited with code"):
        launch.run(_read_across_nodes, 2, device="cpu", timeout=120)


def test_topology_layout():
    assert topology.layout(list(range(8)), 4) == topology.Topology(8, 4, 2)
    assert topology.layout(list(range(8)), None) == topology.Topology(8, 8, 1)
    assert topology.layout([0, 1, 2, 3], 8) == topology.Topology(4, 4, 1)  # a subgroup inside one node
    assert topology.layout([2, 3, 4, 5], 2) == topology.Topology(4, 2, 2)
    assert not topology.layout([0, 1, 2], 2).regular  # 2 ranks on one node, 1 on the other
    assert not topology.layout([0, 2, 1, 3], 2).regular  # a node's ranks not consecutive in the group
    with pytest.raises(ValueError, match="SYMMCOLL_RANKS_PER_NODE"):
        os.environ[topology.ENV_RANKS_PER_NODE] = "zero"
        try:
            topology.ranks_per_node_setting()
        finally:
            os.environ.pop(topology.ENV_RANKS_PER_NODE)


def test_routing_across_nodes():
    """What runs for a group that spans nodes, without any rank: hierarchical where it takes the input,
    the process group's own otherwise; hierarchical names refused on one node."""
    two_by_two = topology.Topology(4, 2, 2)
    req = lambda op, dtype=torch.float32, splits=None: plan.Request(op, (8,), dtype, torch.device("cpu"),
                                                                    "sum" if op in plan.REDUCTIONS else None,
                                                                    None, splits)
    assert plan.choose(req("all_reduce"), 4, "auto", two_by_two) == "hierarchical"
    assert plan.choose(req("all_reduce"), 4, "one_shot", two_by_two) == "hierarchical"
    assert plan.choose(req("all_reduce", torch.int32), 4, "auto", two_by_two) == "nccl"
    assert plan.choose(req("all_to_all", splits=(2, 2, 2, 2)), 4, "auto", two_by_two) == "nccl"
    assert plan.choose(req("broadcast"), 4, "auto", two_by_two) == "nccl"
    assert plan.choose(req("all_reduce"), 4, "auto", topology.Topology(4, 1, 3, regular=False)) == "nccl"
    with pytest.raises(ValueError, match="span nodes"):
        plan.choose(req("all_reduce"), 4, "hierarchical", topology.Topology(4, 4, 1))
    assert "hierarchical" not in symmcoll.ALGORITHMS["all_reduce"]
    assert set(plan.algorithms("all_gather", across_nodes=True)) == {"hierarchical", "hierarchical_get"}


def test_groups_short_of_the_whole_job_get_no_nvshmem_memory(monkeypatch):
    """NVSHMEM's allocations are collective over every process of the job: on GPU, a group that spans nodes
    but is not the whole job would wait in nvshmem_malloc forever (its workspace, or even the descriptor
    handshake's); so would any group short of the whole job once NVSHMEM serves this process's symmetric
    memory (torch cannot switch back). Such groups go to the process group's own collective, no workspace."""
    from symmcoll.memory import transport
    monkeypatch.setitem(transport._AVAILABLE, "nvshmem", True)  # as on a GPU machine with NVSHMEM
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    req = lambda op, device: plan.Request(op, (8,), torch.float32, device, "sum", None, None)  # noqa: E731
    whole, part = topology.layout([0, 1, 2, 3], 2, job_world=4), topology.layout([0, 1, 2, 3], 2, job_world=8)
    assert whole.whole_job and not part.whole_job and whole.spans and part.spans
    assert plan.choose(req("all_reduce", cuda), 4, "auto", whole) == "hierarchical"
    assert transport.workspace_possible(whole, cuda)
    assert plan.choose(req("all_reduce", cuda), 4, "auto", part) == "nccl"
    assert plan.choose(req("all_gather", cuda), 4, "hierarchical", part) == "nccl"
    assert not transport.workspace_possible(part, cuda)
    # CPU (emulated nodes) serves any group.
    assert plan.choose(req("all_reduce", cpu), 4, "auto", part) == "hierarchical"
    # One node, short of the whole job: CUDA symmetric memory, unless NVSHMEM already serves this process.
    one_node = topology.layout([0, 1], 2, job_world=4)
    assert transport.workspace_possible(one_node, cuda) and plan.choose(req("all_reduce", cuda), 2, "auto", one_node) != "nccl"
    monkeypatch.setattr(transport, "nvshmem_selected", lambda device: device.type == "cuda")
    assert not transport.workspace_possible(one_node, cuda)
    assert plan.choose(req("all_reduce", cuda), 2, "auto", one_node) == "nccl"
    assert transport.workspace_possible(topology.layout([0, 1], 2, job_world=2), cuda)
    # A group that spans nodes with no NVSHMEM: no workspace, NCCL.
    monkeypatch.setitem(transport._AVAILABLE, "nvshmem", False)
    assert not transport.workspace_possible(whole, cuda) and plan.choose(req("all_reduce", cuda), 4, "auto", whole) == "nccl"


def test_nvshmem_device_library_for_the_compile_checks():
    """CI installs NVSHMEM's device library (the test extra): test_compile.py then links and compiles the
    exchange kernels over the NVSHMEM transport for sm_90, not the emulated twin."""
    from symmcoll.memory.transport import nvshmem_library
    if not os.environ.get("CI") and nvshmem_library() is None:
        pytest.skip("NOT RUN: nvidia-nvshmem-cu13 not installed here (pip install -e '.[test]'); CI installs it")
    assert nvshmem_library() is not None, "pip install -e '.[test]' must bring nvidia-nvshmem-cu13"
