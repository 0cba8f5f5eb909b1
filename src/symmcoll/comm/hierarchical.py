"""Hierarchical collectives for groups that span nodes: today's kernels inside each node, one exchange
(comm/exchange.py) between nodes, every byte crossing the node boundary once.

A group of N nodes x R ranks (symmcoll.topology); rank (n, l) is local rank l of node n, group rank
n R + l; its *counterparts* are (m, l) on the other nodes. The node-local phases run the registered
intra-node algorithms unchanged, on a *node view* of the workspace (``node_view``: the address tables
start at the node's first rank, the kernels see R ranks and local rank l), so they never see a
cross-node peer. The exchange reaches counterparts through the transport only.

all_reduce.hierarchical   (S elements; per rank: NVLink 2 (R-1)/R S, network 2 (N-1)/(N R) S)
    node reduce-scatter (reduce_scatter.pull) of x into my stage: the node's partial of shard l, cut
    into N pieces; exchange ALL_REDUCE: piece m to (m, l), reduce piece n over the N nodes, send it back
    to every counterpart: shard l complete; node all-gather (all_gather.pull) of the shards.
reduce_scatter.hierarchical   (output s elements; NVLink (R-1) N s, network (N-1) s)
    segments regrouped by local rank (a local permute), node reduce-scatter: rank l holds the node's
    partial of segment (m, l) for every node m; exchange REDUCE: partial m to (m, l), reduce mine.
all_gather.hierarchical   (s elements per rank; network (N-1) s, NVLink (R-1) N s)
    exchange GATHER: x to every counterpart; node all-gather of the N pieces; a local permute puts
    piece (m, l') at output row m R + l'. ``hierarchical_get``: the same with the counterparts
    pulling (transport get) instead of pushing -- one more network latency; RDMA reads where a NIC
    serves them better than writes.
all_to_all.hierarchical   (equal splits, chunks of c; network (N-1) R c, NVLink (R-1) N c)
    exchange GATHER: the R chunks for node m's ranks go to (m, l) (DeepEP's normal mode: a token
    crosses the network once, to the counterpart, then NVLink); a local permute; node all-to-all
    (all_to_all.pull) forwards chunk (n, l) -> (m, l') to (m, l'); a local permute orders by source.

Where these win: the network is the bottleneck across nodes, and each carries the minimum (NCCL's ring
puts 2 (W-1)/W S through each rank's NIC for an all-reduce where this puts 2 (N-1)/(N R) S: R times
less; docs/algorithms.md has the cost model). Inputs beyond a piece go in rounds (one exchange launch
each). Node phases and exchange carry the call's descriptor: a rank that made another call is reported
by whichever wait meets it first. What they cannot serve (dtypes without a word type or a reduction,
all_to_all with split sizes, broadcast, the fused GEMM ops) goes to the process group's collective.
MoE dispatch and combine build on ``counterpart_gather`` / ``counterpart_all_to_all`` and the node view
(fused/moe_hierarchical.py).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..plan import CPU_CONFIG, Algorithm, Plan, Request, algorithms, reduction_dtype_reason, register, word_dtype_reason
from .common import as_words, cdiv, chunks
from .exchange import capacity, exchange, stage

FAMILY = "hierarchical"
# The intra-node algorithm of each node-local phase (barrier-based: their exit barrier ends every use of
# the shared buffer before the exchange or the next phase touches anything).
NODE_ALGORITHMS = {"reduce_scatter": "pull", "all_gather": "pull", "all_to_all": "pull"}


def node_view(ws):
    """The workspace of a group that spans nodes as the kernels of one node see it: R ranks, my local
    rank, every address table starting at my node's first rank (entries of 8 bytes), the same memory,
    state and error record. No topology: to its kernels the node is the whole group."""
    topo = ws.topology
    first = topo.first_rank(topo.node_of(ws.rank))
    per_node = topo.ranks_per_node
    regions = {name: replace(r, ptrs_dev=r.ptrs_dev + 8 * first, peers=r.peers[first:first + per_node])
               for name, r in ws.regions.items()}
    return replace(ws, rank=topo.local_rank(ws.rank), world_size=per_node, regions=regions, topology=None,
                   transport=None)


def node_view_of(plan: Plan):
    """The node view of ``plan``'s workspace (made once per plan)."""
    view = plan.cache.get("node_view")
    if view is None:
        view = plan.cache["node_view"] = node_view(plan.ws)
    return view


def _node_phase(plan: Plan, op: str, x: torch.Tensor, out: torch.Tensor) -> None:
    """Run ``op``'s intra-node algorithm over my node (x and out contiguous, as that algorithm takes
    them), with this call's descriptor. A node of one rank: a copy."""
    view = node_view_of(plan)
    if view.world_size == 1:
        out.reshape(-1).copy_(x.reshape(-1))
        return
    key = ("node_plan", op, tuple(x.shape), tuple(out.shape))
    node_plan = plan.cache.get(key)
    if node_plan is None:
        algorithm = algorithms(op)[NODE_ALGORITHMS[op]]
        request = Request(op, tuple(x.shape), x.dtype, x.device, plan.request.reduce_op)
        config = CPU_CONFIG if x.device.type == "cpu" else None
        if config is None and callable(algorithm.gpu_configs):
            config = algorithm.gpu_configs(request, view.world_size)
        elif config is None and algorithm.gpu_configs is not None:
            config = algorithm.gpu_configs.pick(request.nbytes, view.world_size)
        node_plan = plan.cache[key] = Plan(request, "kernel", algorithm, plan.group, view.world_size, view.rank, view,
                                           config, plan.desc, tuple(out.shape))
    node_plan.algorithm.run(node_plan, x, out)


def _all_reduce(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    topo = plan.ws.topology
    nodes, per_node = topo.nodes, topo.ranks_per_node
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    for start, length in chunks(flat.numel(), per_node * nodes * capacity(plan.ws, x.dtype)):
        piece = cdiv(cdiv(length, per_node * nodes), 16) * 16  # aligned pieces; the tail padded
        padded = per_node * nodes * piece
        src = flat[start:start + length]
        if padded != length:
            src = torch.cat([src, src.new_zeros(padded - length)])
        shard = stage(plan.ws, x.dtype, nodes * piece)
        _node_phase(plan, "reduce_scatter", src, shard)
        reduced = torch.empty(nodes * piece, dtype=x.dtype, device=x.device)
        exchange(plan, x.dtype, reduced, "all_reduce", piece, piece, piece)
        gathered = out_flat[start:start + length] if padded == length else torch.empty_like(src)
        _node_phase(plan, "all_gather", reduced, gathered)
        if padded != length:
            out_flat[start:start + length].copy_(gathered[:length])
    return out


def _reduce_scatter(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    topo = plan.ws.topology
    nodes, per_node = topo.nodes, topo.ranks_per_node
    out_flat = out.reshape(-1)
    segment = out_flat.numel()
    segments = x.reshape(nodes, per_node, segment)  # segment (m, l') of group rank m R + l'
    for start, length in chunks(segment, capacity(plan.ws, x.dtype)):
        # Local rank l' reduces, over my node, segment (m, l') for every node m: regrouped by l'.
        by_local = segments[:, :, start:start + length].transpose(0, 1).contiguous()
        partials = stage(plan.ws, x.dtype, nodes * length)
        _node_phase(plan, "reduce_scatter", by_local.reshape(-1), partials)
        exchange(plan, x.dtype, out_flat[start:start + length], "reduce", length, length, 0)
    return out


def counterpart_gather(plan: Plan, words: torch.Tensor, mode: str = "gather") -> torch.Tensor:
    """Every counterpart's ``words`` (flat, the same count on every rank; mine included) as [N, numel],
    row n from node n: exchanges in pieces."""
    nodes, total = plan.ws.topology.nodes, words.numel()
    out = torch.empty((nodes, total), dtype=words.dtype, device=words.device)
    for start, length in chunks(total, capacity(plan.ws, words.dtype)):
        stage(plan.ws, words.dtype, length).copy_(words[start:start + length])
        got = out if length == total else torch.empty((nodes, length), dtype=words.dtype, device=words.device)
        exchange(plan, words.dtype, got, mode, length, 0, length)
        if got is not out:
            out[:, start:start + length].copy_(got)
    return out


def counterpart_all_to_all(plan: Plan, pieces: torch.Tensor) -> torch.Tensor:
    """``pieces`` [N, L] (row m for my counterpart on node m; mine at my node's row) -> [N, L], row n what
    my counterpart on node n sent me: exchanges in pieces."""
    nodes, total = pieces.shape
    out = torch.empty_like(pieces)
    for start, length in chunks(total, capacity(plan.ws, pieces.dtype)):
        stage(plan.ws, pieces.dtype, nodes * length).view(nodes, length).copy_(pieces[:, start:start + length])
        got = out if length == total else torch.empty((nodes, length), dtype=pieces.dtype, device=pieces.device)
        exchange(plan, pieces.dtype, got, "gather", length, length, length)
        if got is not out:
            out[:, start:start + length].copy_(got)
    return out


def _all_gather(plan: Plan, x: torch.Tensor, out: torch.Tensor, mode: str = "gather") -> torch.Tensor:
    topo = plan.ws.topology
    nodes, per_node = topo.nodes, topo.ranks_per_node
    words = as_words(x)
    mine = counterpart_gather(plan, words, mode)  # [m]: (m, l)'s input
    node_rows = torch.empty(per_node * nodes * words.numel(), dtype=words.dtype, device=x.device)
    _node_phase(plan, "all_gather", mine.view(-1), node_rows)  # [l'][m]
    # Output row m R + l' comes from group rank m R + l'.
    as_words(out).view(nodes, per_node, -1).copy_(node_rows.view(per_node, nodes, -1).transpose(0, 1))
    return out


def _all_to_all(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    topo = plan.ws.topology
    nodes, per_node = topo.nodes, topo.ranks_per_node
    words = as_words(x)
    chunk = words.numel() // (nodes * per_node)
    # To my counterpart on node m: my chunks for (m, l') for every l'; from node n: (n, l)'s for (me, l').
    arrived = counterpart_all_to_all(plan, words.view(nodes, per_node * chunk))
    by_dest = arrived.view(nodes, per_node, chunk).transpose(0, 1).contiguous().view(per_node, nodes * chunk)
    by_source = torch.empty_like(by_dest)
    _node_phase(plan, "all_to_all", by_dest, by_source)  # row l: what (n, l) sent me, for every n
    # Output chunk n R + l comes from group rank n R + l.
    as_words(out).view(nodes, per_node, chunk).copy_(by_source.view(per_node, nodes, chunk).transpose(0, 1))
    return out


def _equal_splits_reason(request: Request, world: int) -> str | None:
    if request.splits is not None:
        return "all_to_all.hierarchical takes equal splits only (splits=None)"
    return word_dtype_reason(request, world)


register(Algorithm("all_reduce", "hierarchical", 120, FAMILY, _all_reduce,
                   "node reduce-scatter, exchange of shards between nodes, node all-gather", None,
                   accepts=reduction_dtype_reason, instead="nccl"))
register(Algorithm("reduce_scatter", "hierarchical", 121, FAMILY, _reduce_scatter,
                   "node reduce-scatter of every node's segments, exchange of partials between nodes", None,
                   accepts=reduction_dtype_reason, instead="nccl"))
register(Algorithm("all_gather", "hierarchical", 122, FAMILY, _all_gather,
                   "exchange of inputs between nodes, node all-gather", None,
                   accepts=word_dtype_reason, instead="nccl"))
register(Algorithm("all_gather", "hierarchical_get", 124, FAMILY,
                   lambda plan, x, out: _all_gather(plan, x, out, "get_gather"),
                   "the same, counterparts pulling (get) each other's input", None,
                   accepts=word_dtype_reason, instead="nccl"))
register(Algorithm("all_to_all", "hierarchical", 123, FAMILY, _all_to_all,
                   "chunks to the counterpart on the destination node, then forwarded inside the node", None,
                   accepts=_equal_splits_reason, instead="nccl"))
