"""MoE dispatch and combine over NCCL's ``all_to_all_single`` (the "nccl" algorithm of ``moe_dispatch`` /
``moe_combine``): a lean eager layer whose every output equals ``reference.moe_dispatch`` /
``moe_combine``'s bit for bit, at one host read per dispatch and none per combine.

Experts are split evenly over the W ranks (expert e on rank e // (E / W)); ids outside [0, E) are ignored.

dispatch(tokens [T, H], topk_ids [T, k], E, max_rows):

1. on the device: every slot's expert (E for an invalid id) and owner rank (W for an invalid id); the
   (token, rank) pairs -- a token goes once to each rank owning one of its experts; per destination the
   rows and the slots per local expert ([W, 1 + E/W] counts); two stable argsorts of narrow keys: the
   pairs by destination, and this rank's (token, slot)s by expert (the order the combine returns them in);
2. one all-gather (``all_gather_single``) of the counts: every rank learns every (source, owner,
   expert) count, so it works out on the device which rows every owner keeps under ``max_rows`` (its
   layout is by local expert, then source: a prefix of it is kept), and the combine needs no exchange
   of counts;
3. ONE host read (``.tolist()``) of the counts and the kept counts: ``all_to_all_single`` takes its splits
   as host lists. This is also why the algorithm cannot be captured in a CUDA graph;
4. one ``index_select`` lays the rows out by destination, each followed by an int32 field (source rank,
   token, its k expert ids; 16-byte aligned rows), and one ``all_to_all_single`` moves them as bytes;
5. on the receiver, one stable argsort of (local expert, or E/W for "not mine") over the received
   (row, slot)s gives the oracle's layout (by local expert, then source rank, token, slot); the first
   ``max_rows`` are kept: one ``index_select`` writes them, the rest of ``recv`` is zeroed, and
   row_origin / self_rows come from the same indices (no host read: a scatter with a dummy slot).

combine(expert_out [max_rows, H], topk_weights [T, k]): one ``index_select`` lays the kept rows out by
source rank, one ``all_to_all_single`` (splits from the dispatch) returns them, and the oracle's own
arithmetic finishes: a zeroed fp32 [T * k, H] slot tensor gets every returned row, and
``(weights * slots).sum(dim=1)`` over [T, k, H] is rounded once -- the same torch ops on the same
values and shapes, so on any device the oracle's bits there, whatever order torch's sum adds the k slots
in (an ``index_add_`` of the returned rows adds them by owner rank: other fp32 roundings). Dropped slots
(max_rows) and invalid ones stay zero, as in the oracle. The price: the fp32 [T * k, H] tensor (the
oracle's too) is written twice and read once more than an ``index_add_`` would need.

The split lists live in a ``ReturnRoute`` that the op keeps per dispatch (keyed by its row_origin
tensor). A combine given a row_origin from elsewhere (another dispatch algorithm, a copy) builds the
route itself with one exchange of counts and one host read.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

# Each dispatched row is padded to a multiple of this many bytes (row, then its int32 metadata): rows of
# the send and receive buffers stay 16-byte aligned.
ROW_ALIGN_BYTES = 16
# Sort keys travel as int16 below this many experts (a narrower radix sort), else as int32.
INT16_KEYS_BELOW = 2 ** 15 - 1


@dataclasses.dataclass(frozen=True)
class ReturnRoute:
    """What a combine needs: the host splits of its one ``all_to_all_single`` and two device index lists."""
    to_source: tuple[int, ...]      # kept rows this rank returns to each source rank
    from_owner: tuple[int, ...]     # rows each owner rank returns to this rank
    send_rows: torch.Tensor         # rows of expert_out in send order: by source rank, then by row
    returned_slot: torch.Tensor     # per returned row: its (token, slot) here, as token * k + slot
    group: object = None


# The route of every live dispatch output, keyed by its row_origin tensor (with that tensor's version:
# an in-place change to it invalidates the route).
_ROUTES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a contiguous tensor (gloo moves no bf16; NCCL moves bytes either way)."""
    return t.view(torch.uint8).reshape(-1)


def _row_bytes(t: torch.Tensor) -> torch.Tensor:
    """[rows, bytes per row] uint8 view of a row-major 2-D tensor (copied first where a dimension of size
    0 or 1 left it a stride other than 1 in its last dimension, which ``view(dtype)`` refuses)."""
    if t.stride(-1) != 1:
        t = t.new_empty(t.shape).copy_(t)
    return t.view(torch.uint8)


def _all_gather(out: torch.Tensor, part: torch.Tensor, group) -> None:
    """Every rank's ``part`` into the flat ``out``, in rank order (torch 2.13 renamed
    all_gather_into_tensor all_gather_single and deprecated the old name)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, part, group=group)


def _key_dtype(largest: int) -> torch.dtype:
    return torch.int16 if largest < INT16_KEYS_BELOW else torch.int32


def _count(index: torch.Tensor, size: int) -> torch.Tensor:
    """int64 histogram of ``index`` (values in [0, size)) without bincount's host read on CUDA."""
    ones = torch.ones(1, dtype=torch.int64, device=index.device).expand(index.numel())
    return torch.zeros(size, dtype=torch.int64, device=index.device).scatter_add_(0, index.reshape(-1), ones)


def row_layout(hidden: int, element_size: int, k: int) -> tuple[int, int, int]:
    """(data bytes, offset of the int32 metadata, padded bytes) of one dispatched row: the row, then its
    source rank, token and k expert ids at a 4-byte offset, padded to ROW_ALIGN_BYTES."""
    data_bytes = hidden * element_size
    meta_at = -(-data_bytes // 4) * 4
    return data_bytes, meta_at, -(-(meta_at + 4 * (2 + k)) // ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES


def _routing(topk_ids: torch.Tensor, num_experts: int, world: int):
    """(expert [T, k] int64 with E for an invalid id, owner [T, k] int64 with W for an invalid id,
    this rank's (token, slot)s sorted by expert, stably: valid ones first, grouped by owner rank)."""
    ids = topk_ids.long()
    expert = torch.where((ids >= 0) & (ids < num_experts), ids, num_experts)
    owner = expert // (num_experts // world)
    slot_order = torch.argsort(expert.reshape(-1).to(_key_dtype(num_experts)), stable=True)
    return expert, owner, slot_order


def _returned_slots(slot_order, full_from_owner, kept_from_owner, returned: int) -> torch.Tensor:
    """Per row an owner returns (owner-major, each owner's kept prefix of this rank's slots on it in
    (expert, token, slot) order): its token * k + slot. Device-only: ``returned`` is the host total."""
    world = full_from_owner.numel()
    owner = torch.repeat_interleave(torch.arange(world, device=slot_order.device), kept_from_owner,
                                    output_size=returned)
    skip = (full_from_owner.cumsum(0) - full_from_owner) - (kept_from_owner.cumsum(0) - kept_from_owner)
    return slot_order[torch.arange(returned, device=slot_order.device) + skip[owner]]


def _send_rows(row_origin: torch.Tensor, slots_per_rank: int, world: int, kept: int) -> torch.Tensor:
    """The ``kept`` dispatch rows in return order: by source rank, then by row (stable)."""
    source = torch.where(row_origin >= 0, row_origin // max(slots_per_rank, 1), world)
    return torch.argsort(source.to(_key_dtype(world)), stable=True)[:kept]


def dispatch(tokens: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, group=None,
             max_rows: int | None = None, out: torch.Tensor | None = None):
    """(recv [max_rows, H], expert_counts [E/W] int64, row_origin [max_rows] int64, self_rows [T, k]
    int64, route for ``combine``), exactly ``reference.moe_dispatch``'s outputs. ``max_rows=None``: as
    many rows as received (no padding). ``out``: where recv goes ([max_rows, H], tokens' dtype)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens_n, k = topk_ids.shape
    hidden, device = tokens.shape[1], tokens.device
    local_experts = num_experts // world
    expert, owner, slot_order = _routing(topk_ids, num_experts, world)
    # pair_rank[t, d] = d where token t goes to rank d, else W (column W collects the invalid slots).
    pair_rank = torch.full((tokens_n, world + 1), world, dtype=_key_dtype(world), device=device)
    pair_rank.scatter_(1, owner, owner.to(pair_rank.dtype))
    rows_to = (pair_rank[:, :world] < world).sum(0)
    slots_of_expert = _count(expert, num_experts + 1)[:num_experts].view(world, local_experts)
    send_counts = torch.cat([rows_to[:, None], slots_of_expert], dim=1)    # per destination rank
    counts = torch.empty(world * world * (1 + local_experts), dtype=torch.int64, device=device)
    _all_gather(counts, send_counts.reshape(-1), group)
    counts = counts.view(world, world, 1 + local_experts)                   # source, owner, (rows, slots)
    # Each owner's layout: by local expert, then source; under max_rows it keeps a prefix of it.
    slots = counts[:, :, 1:].permute(1, 2, 0).reshape(world, -1)             # [owner, expert * source]
    if max_rows is not None:
        before = slots.cumsum(1) - slots
        slots = torch.minimum(slots, (max_rows - before).clamp_min(0))
    kept = slots.view(world, local_experts, world).sum(1)                    # [owner, source]
    pair_order = torch.argsort(pair_rank.reshape(-1), stable=True)          # queued before the host read

    host = torch.cat([counts.reshape(-1), kept.reshape(-1)]).tolist()       # the one host read
    per_pair = 1 + local_experts
    pair_counts = [host[i:i + per_pair] for i in range(0, world * world * per_pair, per_pair)]  # source-major
    kept_host = host[world * world * per_pair:]                                               # owner-major
    rows_out = [pair_counts[rank * world + d][0] for d in range(world)]
    rows_in = [pair_counts[s * world + rank][0] for s in range(world)]
    received = sum(sum(pair_counts[s * world + rank][1:]) for s in range(world))
    kept_here = received if max_rows is None else min(received, max_rows)
    max_rows = received if max_rows is None else max_rows

    # Rows as bytes, then their int32 metadata (source rank, token, k expert ids) at a 4-byte offset.
    data_bytes, meta_at, row_bytes = row_layout(hidden, tokens.element_size(), k)
    meta = torch.cat([torch.full((tokens_n, 1), rank, dtype=torch.int32, device=device),
                      torch.arange(tokens_n, dtype=torch.int32, device=device)[:, None], expert.to(torch.int32)], 1)
    send_token = pair_order[:sum(rows_out)] // (world + 1)
    packed = torch.empty((send_token.numel(), row_bytes), dtype=torch.uint8, device=device)
    torch.index_select(_row_bytes(tokens), 0, send_token, out=packed[:, :data_bytes])
    torch.index_select(meta, 0, send_token, out=packed[:, meta_at:meta_at + 4 * (2 + k)].view(torch.int32))
    arrived = torch.empty((sum(rows_in), row_bytes), dtype=torch.uint8, device=device)
    dist.all_to_all_single(arrived.reshape(-1), packed.reshape(-1), [n * row_bytes for n in rows_in],
                           [n * row_bytes for n in rows_out], group=group)

    arrived_meta = arrived[:, meta_at:meta_at + 4 * (2 + k)].view(torch.int32)
    arrived_expert = arrived_meta[:, 2:]
    mine = torch.where(arrived_expert // local_experts == rank, arrived_expert - rank * local_experts, local_experts)
    grouped = torch.argsort(mine.reshape(-1).to(_key_dtype(local_experts)), stable=True)[:kept_here]
    row, slot = grouped // k, grouped % k
    recv = tokens.new_empty((max_rows, hidden)) if out is None else out
    torch.index_select(arrived[:, :data_bytes].view(tokens.dtype), 0, row, out=recv[:kept_here])
    recv[kept_here:].zero_()
    source, token = arrived_meta[row, 0].long(), arrived_meta[row, 1].long()
    row_origin = torch.full((max_rows,), -1, dtype=torch.int64, device=device)
    row_origin[:kept_here] = (source * tokens_n + token) * k + slot
    # self_rows[t, j] = the row of own token t's slot j; other rows write a dummy entry past the end.
    self_rows = torch.full((tokens_n * k + 1,), -1, dtype=torch.int64, device=device)
    self_rows.scatter_(0, torch.where(source == rank, token * k + slot, tokens_n * k),
                       torch.arange(kept_here, device=device))
    expert_counts = counts[:, rank, 1:].sum(0)

    from_owner = kept_host[rank::world]
    route = ReturnRoute(tuple(kept_host[rank * world:(rank + 1) * world]), tuple(from_owner),
                        _send_rows(row_origin, tokens_n * k, world, kept_here),
                        _returned_slots(slot_order, counts[rank, :, 1:].sum(1), kept[:, rank], sum(from_owner)),
                        group)
    return recv, expert_counts, row_origin, self_rows[:tokens_n * k].view(tokens_n, k), route


def remember(row_origin: torch.Tensor, route: ReturnRoute) -> None:
    """Keep ``route`` for the combine that will be given ``row_origin`` (while that tensor lives and is
    not changed in place)."""
    _ROUTES[row_origin] = (row_origin._version, route)


def route_for(row_origin: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, group=None) -> ReturnRoute:
    """The route ``dispatch`` made for ``row_origin`` (no host read), else one built from it: one
    ``all_to_all_single`` of per-source row counts and one host read."""
    found = _ROUTES.get(row_origin)
    if found is not None and found[0] == row_origin._version and found[1].group is group:
        return found[1]
    world = dist.get_world_size(group)
    tokens_n, k = topk_ids.shape
    _, owner, slot_order = _routing(topk_ids, num_experts, world)
    source = torch.where(row_origin >= 0, row_origin // max(tokens_n * k, 1), world)
    counts = torch.empty((2, world), dtype=torch.int64, device=row_origin.device)  # to source, from owner
    counts[0] = _count(source, world + 1)[:world]
    dist.all_to_all_single(counts[1], counts[0], group=group)
    to_source, from_owner = counts.tolist()
    return ReturnRoute(tuple(to_source), tuple(from_owner), _send_rows(row_origin, tokens_n * k, world, sum(to_source)),
                       _returned_slots(slot_order, _count(owner, world + 1)[:world], counts[1], sum(from_owner)),
                       group)


def combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
            route: ReturnRoute, out: torch.Tensor | None = None) -> torch.Tensor:
    """[T, H]: exactly ``reference.moe_combine``: every token's sum over its valid slots of weight * its
    expert's output row, in fp32 (the oracle's ops and order), rounded once to expert_out's dtype."""
    tokens_n, k = topk_ids.shape
    hidden = expert_out.shape[1]
    back = expert_out.index_select(0, route.send_rows)
    got = expert_out.new_empty((sum(route.from_owner), hidden))
    row_bytes = hidden * expert_out.element_size()
    dist.all_to_all_single(_bytes(got), _bytes(back), [n * row_bytes for n in route.from_owner],
                           [n * row_bytes for n in route.to_source], group=route.group)
    slots = torch.zeros((tokens_n * k, hidden), dtype=torch.float32, device=expert_out.device)
    slots.index_copy_(0, route.returned_slot, got.float())
    ids = topk_ids.long()
    weights = torch.where((ids >= 0) & (ids < num_experts), topk_weights.float(), 0.0)
    summed = (weights[..., None] * slots.reshape(tokens_n, k, hidden)).sum(dim=1)
    if out is None:
        return summed.to(expert_out.dtype)
    return out.copy_(summed)
