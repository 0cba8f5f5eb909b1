"""MoE dispatch and combine across nodes, in DeepEP's normal mode: a token crosses the node boundary once
to each node hosting at least one of its experts (to my counterpart there), and to no other node; NVLink
then forwards it to the ranks there that own its experts. The combine reduces inside the node first, so
one row per token and node it went to crosses back.

Group of N nodes x R ranks (symmcoll.topology), E experts: expert e on group rank e // (E / W), node
e // (E / N). Rank (n, l)'s counterparts are (m, l). Same API, output layout and handle as fused/moe.py
(rows by local expert, then source rank, token, slot; ``row_origin``, ``self_rows``), so the combine, the
reference and the callers cannot tell the difference.

route (both ops), on rank (n, l)::

    exchange (network, tiny)      my count of tokens needing node m, for every m, to every counterpart;
                                  read back to the host (as DeepEP does): width = the largest count
                                  between two different nodes of my counterparts (one piece size for all)
    exchange (network)            to (m, l): the indices of my tokens naming node m's experts (in order,
                                  padded with -1 to width) and their slots in node m's numbering

dispatch.hierarchical::

    exchange (network)            to (m, l) the rows of those tokens, width per piece (pads zero words);
                                  my own node's tokens stay here
    for each source node n' (NVLink)   moe_dispatch.pull over my node: the tokens of (n', l') that came to
                                  (n, l'), put back at their own token index, each once to every rank of
                                  my node owning one of its experts
    merge (local)                 per local expert, pass n' rows before pass n' + 1: the global order
                                  (source rank n' R + l', token, slot)

combine.hierarchical::

    route again; exchange         the weights of the tokens sent, as the rows were
    for each n'                   the rows of pass n' (from row_origin: source node n'), moe_combine.push over
                                  my node: (m, l) gets, for every token (n', l) sent it, the weighted sum over
                                  node m's experts
    exchange                      that partial, for those tokens only, back to (n', l); the source sums in
                                  node order (fp32) the partials of the nodes it sent the token to, rounded

Per rank and direction, the network carries (N-1) x width rows: the tokens that need the node, and pads up
to the largest such count among the counterparts (the exchange's pieces have one size; per-destination
lengths in the exchange kernel would drop the pads). The combine rounds each node's partial to
expert_out's dtype before the final sum: within one rounding per node of the flat reference, exact on
integer-valued data. Rows past max_recv_rows are dropped as the flat kernels drop them; each node pass
reports its own overflow only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..comm.hierarchical import FAMILY, counterpart_all_to_all, counterpart_gather, node_view_of
from ..plan import WORD_DTYPES, Algorithm, Plan, Request, algorithms, register

NODE_ALGORITHMS = {"moe_dispatch": "pull", "moe_combine": "push"}


def _node_plan(plan: Plan, op: str, experts: int, max_rows: int, tokens_n: int, k: int) -> Plan:
    key = ("node_plan", op, experts, max_rows, tokens_n, k)
    node_plan = plan.cache.get(key)
    if node_plan is None:
        view = node_view_of(plan)
        request = Request(op, (max_rows if op == "moe_combine" else tokens_n, 0), plan.request.dtype,
                          plan.request.device, options=(("num_experts", experts), ("max_rows", max_rows)))
        node_plan = plan.cache[key] = Plan(request, "kernel", algorithms(op)[NODE_ALGORITHMS[op]], plan.group,
                                           view.world_size, view.rank, view, None, plan.desc, None)
    return node_plan


class Route(NamedTuple):
    """Which of my tokens cross to which node, and which of my counterparts' tokens came to me."""
    sent: torch.Tensor  # [N, width]: the tokens (indices) I send node m's counterpart, in order; -1 pads
    #                     (row n, my node: all -1, my own tokens never enter the exchange)
    received: torch.Tensor  # [N, width]: the tokens of my counterpart on node n' that it sent me; -1 pads
    slots: torch.Tensor  # [N, T, k]: their slots naming my node's experts, in my node's numbering, at their
    #                      own token index; -1 for tokens that did not come; row n: my own tokens'


def route(plan: Plan, topk_ids: torch.Tensor, experts: int) -> Route:
    """Send node m only my tokens with a slot naming one of its experts (DeepEP's normal mode): one
    exchange of counts (read back to the host, as DeepEP does: the pieces of an exchange have one size
    among the counterparts, the largest count between two of their nodes), one of token indices and slots."""
    nodes, node_of_mine = plan.ws.topology.nodes, plan.ws.topology.node_of(plan.rank)
    per_node = experts // nodes
    tokens_n, k = topk_ids.shape
    ids = topk_ids.long()
    ids = torch.where((ids >= 0) & (ids < experts), ids, -1)
    node = torch.arange(nodes, device=ids.device)[:, None, None]
    mine = torch.where(ids[None] // per_node == node, ids[None] - node * per_node, -1)  # -1 // E/N is -1: never a node
    needed = (mine >= 0).any(-1)  # [N, T]
    needed[node_of_mine] = False  # my own node's tokens stay here
    counts = counterpart_gather(plan, needed.sum(1))  # [source node, destination node]: all my counterparts'
    width = max(1, int(counts.max()))
    position = torch.where(needed, torch.cumsum(needed, 1) - 1, width)  # compacted, order kept; width: unused
    token = torch.arange(tokens_n, device=ids.device).expand(nodes, tokens_n)
    sent = torch.full((nodes, width + 1), -1, dtype=torch.int64, device=ids.device).scatter_(1, position, token)
    sent = sent[:, :width].contiguous()
    picked = torch.where((sent >= 0)[..., None], mine.gather(1, sent.clamp(min=0)[..., None].expand(-1, -1, k)), -1)
    got = counterpart_all_to_all(plan, torch.cat([sent[..., None], picked], -1).view(nodes, -1))
    got = got.view(nodes, width, k + 1)
    received = got[..., 0]
    slots = torch.full((nodes, tokens_n + 1, k), -1, dtype=torch.int64, device=ids.device)
    slots.scatter_(1, torch.where(received >= 0, received, tokens_n)[..., None].expand(-1, -1, k), got[..., 1:])
    slots[node_of_mine, :tokens_n] = mine[node_of_mine]
    return Route(sent, received, slots[:, :tokens_n])


def _to_nodes(plan: Plan, rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows [N, T, H] -> [N, width, H]: row ``index[m, j]`` of rows[m] (zeros for -1) to my counterpart on
    node m; what each counterpart sent me in return, in its order. Moved as words (any dtype, bit-exact);
    pads go as zero words: no token's data crosses to a node that did not ask for it."""
    words = rows.view(WORD_DTYPES[rows.element_size()])
    picked = words.gather(1, index.clamp(min=0)[..., None].expand(-1, -1, rows.shape[2]))
    picked.masked_fill_((index < 0)[..., None], 0)
    back = counterpart_all_to_all(plan, picked.view(index.shape[0], -1))
    return back.view(picked.shape).view(rows.dtype)


def _at_tokens(rows: torch.Tensor, index: torch.Tensor, tokens_n: int) -> torch.Tensor:
    """[N, width, H] rows of tokens ``index`` -> [N, T, H], zeros where no row came (as words: any dtype)."""
    nodes, width, hidden = rows.shape
    words = rows.view(WORD_DTYPES[rows.element_size()])
    full = words.new_zeros((nodes, tokens_n + 1, hidden))
    full.scatter_(1, torch.where(index >= 0, index, tokens_n)[..., None].expand(-1, -1, hidden), words)
    return full[:, :tokens_n].view(rows.dtype)


def _expert_of_rows(counts: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(local expert of each of ``rows`` rows laid out by ``counts``, row index within its expert)."""
    ends = torch.cumsum(counts, 0)
    r = torch.arange(rows, device=counts.device)
    expert = torch.searchsorted(ends, r, right=True).clamp(max=counts.numel() - 1)
    return expert, r - (ends - counts)[expert]


def _dispatch(plan: Plan, tokens: torch.Tensor, out: torch.Tensor, topk_ids: torch.Tensor):
    topo = plan.ws.topology
    nodes, per_node = topo.nodes, topo.ranks_per_node
    tokens_n, k = topk_ids.shape
    experts = dict(plan.request.options)["num_experts"]
    max_rows = out.shape[0]
    routes = route(plan, topk_ids, experts)
    arrived = _at_tokens(_to_nodes(plan, tokens.expand(nodes, -1, -1), routes.sent), routes.received, tokens_n)
    arrived[topo.node_of(plan.rank)] = tokens
    slots = routes.slots
    node_plan = _node_plan(plan, "moe_dispatch", experts // nodes, max_rows, tokens_n, k)
    passes = []
    for source_node in range(nodes):  # NVLink: the tokens of node n' as forwarded by their counterparts here
        rows = arrived[source_node]
        passes.append(node_plan.algorithm.run(node_plan, rows, torch.empty_like(out), slots[source_node]))
    counts = torch.stack([p[1] for p in passes])  # [pass, local expert]
    total = counts.sum(0)
    start = torch.cumsum(total, 0) - total  # first global row of each expert
    before = torch.cumsum(counts, 0) - counts  # rows of earlier passes in each expert
    merged = out.new_zeros((max_rows + 1, out.shape[1]))  # row max_rows: where rows past the end go
    origin = torch.full((max_rows + 1,), -1, dtype=torch.int64, device=out.device)
    self_rows = torch.full((tokens_n * k,), -1, dtype=torch.int64, device=out.device)
    for source_node, (rows, _, node_origin, node_self) in enumerate(passes):
        expert, within = _expert_of_rows(counts[source_node], max_rows)
        valid = node_origin >= 0
        dest = start[expert] + before[source_node, expert] + within
        dest = torch.where(valid & (dest < max_rows), dest, max_rows)
        merged.index_copy_(0, dest, rows)
        # Node-level source l' (the forwarding counterpart) is group rank n' R + l' globally.
        source = source_node * per_node + node_origin // (tokens_n * k)
        origin.index_copy_(0, dest, torch.where(valid, source * tokens_n * k + node_origin % (tokens_n * k), -1))
        if source_node == topo.node_of(plan.rank):  # my own tokens, forwarded by myself
            flat = node_self.reshape(-1)
            kept = dest[flat.clamp(min=0)]
            self_rows = torch.where((flat >= 0) & (kept < max_rows), kept, -1)
    out.copy_(merged[:max_rows])
    return out, total, origin[:max_rows], self_rows.view(tokens_n, k)


def _combine(plan: Plan, expert_out: torch.Tensor, out: torch.Tensor, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor, counts: torch.Tensor, origin: torch.Tensor, self_rows: torch.Tensor):
    topo = plan.ws.topology
    nodes, per_node, local = topo.nodes, topo.ranks_per_node, topo.local_rank(plan.rank)
    tokens_n, k = topk_ids.shape
    experts = dict(plan.request.options)["num_experts"]
    max_rows, hidden = expert_out.shape
    routes = route(plan, topk_ids, experts)
    slots = routes.slots
    weights = _at_tokens(_to_nodes(plan, topk_weights.float().expand(nodes, -1, -1), routes.sent), routes.received,
                         tokens_n)
    weights[topo.node_of(plan.rank)] = topk_weights.float()
    node_plan = _node_plan(plan, "moe_combine", experts // nodes, max_rows, tokens_n, k)
    expert, _ = _expert_of_rows(counts, max_rows)
    valid = origin >= 0
    source = origin // (tokens_n * k)
    within = origin % (tokens_n * k)  # token * k + slot
    partials = expert_out.new_empty((nodes, tokens_n, hidden))
    for source_node in range(nodes):
        # The rows of this pass, in their order (the global order restricted to source node n').
        mine = valid & (source // per_node == source_node)
        position = torch.where(mine, torch.cumsum(mine, 0) - 1, max_rows)
        rows = expert_out.new_zeros((max_rows + 1, hidden)).index_copy_(0, position, expert_out)[:max_rows]
        node_origin = torch.full((max_rows + 1,), -1, dtype=torch.int64, device=origin.device).index_copy_(
            0, position, (source % per_node) * tokens_n * k + within)[:max_rows]
        node_counts = torch.zeros_like(counts).scatter_add_(0, expert, mine.to(counts.dtype))
        forwarded_by_me = torch.where(mine & (source % per_node == local), within, tokens_n * k)
        node_self = torch.full((tokens_n * k + 1,), -1, dtype=torch.int64, device=origin.device).index_copy_(
            0, forwarded_by_me, position)[:tokens_n * k].view(tokens_n, k)
        node_plan.algorithm.run(node_plan, rows, partials[source_node], weights[source_node], slots[source_node],
                                node_counts, node_origin, node_self)
    # Partial n' belongs to my counterpart on node n', for the tokens it sent here; I get one partial of each
    # of my tokens from every node I sent it to (zeros from the others: nothing crossed).
    back = _to_nodes(plan, partials, routes.received)  # [m, j]: node m's partial of my token sent[m, j]
    by_node = _at_tokens(back.float(), routes.sent, tokens_n)
    by_node[topo.node_of(plan.rank)] = partials[topo.node_of(plan.rank)].float()  # my node's, computed here
    summed = by_node.sum(0)  # fp32, node order
    out.copy_(summed.to(out.dtype))
    return out


register(Algorithm("moe_dispatch", "hierarchical", 125, FAMILY, _dispatch,
                   "tokens to the counterpart on each node hosting one of their experts, then over NVLink", None))
register(Algorithm("moe_combine", "hierarchical", 126, FAMILY, _combine,
                   "weighted sums inside each node, one partial per token back from each node it went to", None))
