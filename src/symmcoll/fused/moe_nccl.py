"""MoE dispatch and combine over NCCL's ``all_to_all_single`` (the "nccl" algorithm of ``moe_dispatch`` /
``moe_combine``): a lean eager layer whose every output equals ``reference.moe_dispatch`` /
``moe_combine``'s bit for bit, at one host read per dispatch and none per combine.

What such a layer costs eagerly is mostly host time per torch op (4x H100 host: about 8 us per op that
launches a kernel, 2 us per view), so it is written for few ops: every index is built on the device from
the routing, constants (aranges, the per-token metadata column) are made once and cached, and what the
host read already tells (split sizes, which rows a ``max_rows`` cut keeps, whether any slot is invalid or
dropped) is worked out in Python instead of on the device. No host<->device copy but the one read.

Experts are split evenly over the W ranks (expert e on rank e // (E / W)); ids outside [0, E) are ignored.

dispatch(tokens [T, H], topk_ids [T, k], E, max_rows):

1. on the device: every slot's expert (E for an invalid id: ``clamp(-1, E) % (E + 1)``) and owner rank;
   a [W + 1, T] flag per (destination, token) pair (a token goes once to each rank owning one of its
   experts; row W collects the invalid slots); per destination the rows and the slots per local expert
   ([W, 1 + E/W] counts); two stable argsorts: the uint8 pair flags (the pairs by destination, then
   token) and this rank's (token, slot)s by expert (the order the combine returns them in);
2. one all-gather (``all_gather_single``) of the counts: every rank learns every (source, owner, expert)
   count, so the combine needs no exchange of counts;
3. ONE host read (``.tolist()``) of the counts: ``all_to_all_single`` takes its splits as host lists. The
   host then works out which rows every owner keeps under ``max_rows`` (its layout is by local expert,
   then source: a prefix of it is kept). This read is also why the algorithm cannot be captured in a
   CUDA graph;
4. one ``index_select`` lays the rows out by destination, each followed by its metadata (int64 origin
   (source * T + token) * k, then its k int32 expert ids; 16-byte aligned rows), and one
   ``all_to_all_single`` moves them as bytes;
5. on the receiver, one stable argsort of narrow keys (local expert, or E/W for "not mine": a cached
   [E + 1] table indexed by the received ids) over the received (row, slot)s gives the oracle's layout
   (by local expert, then source rank, token, slot); the first ``max_rows`` are kept: one
   ``index_select`` writes them, the rest of ``recv`` is zeroed; row_origin is the row's origin + slot,
   self_rows one scatter by origin.

combine(expert_out [max_rows, H], topk_weights [T, k]): one ``index_select`` lays the kept rows out by
source rank, one ``all_to_all_single`` (splits from the dispatch) returns them, one ``index_select``
puts each of this rank's (token, slot)s its returned row (a zero row where none came: an invalid or
dropped slot), and the oracle's own arithmetic finishes: ``(weights * slots).sum(dim=1)`` over the same
[T, k, H] fp32 values (the product of an fp32 weight and a row of expert_out's dtype is computed in fp32,
as the oracle's product of the weight and the row converted to fp32), rounded once -- the same torch
reduction on the same values and shape, so the oracle's bits whatever order torch's sum adds the k
slots in. Invalid slots get weight 0, as in the oracle (0 * 0 there, not weight * 0: -0 and NaN differ).

The split lists live in a ``ReturnRoute`` that the op keeps per dispatch (keyed by its row_origin
tensor). A combine given a row_origin from elsewhere (another dispatch algorithm, a copy) builds the
route itself with one exchange of counts and one host read.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

# Each dispatched row is padded to a multiple of this many bytes (row, then its metadata): rows of the
# send and receive buffers stay 16-byte aligned.
ROW_ALIGN_BYTES = 16
# Sort keys travel as int16 below this many experts (a narrower radix sort), else as int32.
INT16_KEYS_BELOW = 2 ** 15 - 1
# Cached per-token origin columns and receiver sort-key tables (one per device and shape) kept at most.
TABLES_CACHED = 64


@dataclasses.dataclass(frozen=True)
class ReturnRoute:
    """What a combine needs: the host splits of its one ``all_to_all_single`` and device index lists."""
    to_source: tuple[int, ...]          # kept rows this rank returns to each source rank
    from_owner: tuple[int, ...]         # rows each owner rank returns to this rank
    send_rows: torch.Tensor             # rows of expert_out in send order: by source rank, then by row
    slot_source: torch.Tensor           # per (token, slot) here, flat: its returned row, or sum(from_owner)
    valid_slot: torch.Tensor | None     # [T, k] bool: slots with a valid id; None where every slot has one
    group: object = None


# The route of every live dispatch output, keyed by its row_origin tensor (with that tensor's version:
# an in-place change to it invalidates the route).
_ROUTES: WeakIdKeyDictionary = WeakIdKeyDictionary()
# Constants made once per device: a growing int64 arange, a one, an fp32 zero; origin columns and
# receiver sort-key tables.
_ARANGES: dict[torch.device, torch.Tensor] = {}
_SCALARS: dict[tuple[torch.device, str], torch.Tensor] = {}
_TABLES: dict[tuple, torch.Tensor] = {}


def _arange(n: int, device: torch.device) -> torch.Tensor:
    """int64 arange(n): a prefix of one cached tensor per device (grown by doubling)."""
    cached = _ARANGES.get(device)
    if cached is None or cached.numel() < n:
        cached = torch.arange(max(n, 1024, 2 * (0 if cached is None else cached.numel())), device=device)
        _ARANGES[device] = cached
    return cached[:n]


def _scalar(kind: str, device: torch.device) -> torch.Tensor:
    """A cached 0-dim device tensor: "one" (int64) or "zero" (fp32)."""
    found = _SCALARS.get((device, kind))
    if found is None:
        found = torch.ones((), dtype=torch.int64, device=device) if kind == "one" else \
            torch.zeros((), dtype=torch.float32, device=device)
        _SCALARS[(device, kind)] = found
    return found


def _table(key: tuple, make) -> torch.Tensor:
    """The cached tensor ``make()`` made for ``key`` (at most TABLES_CACHED kept)."""
    found = _TABLES.get(key)
    if found is None:
        if len(_TABLES) >= TABLES_CACHED:
            _TABLES.clear()
        found = _TABLES[key] = make()
    return found


def _origin_column(tokens_n: int, k: int, rank: int, device: torch.device) -> torch.Tensor:
    """[T, 2] int32, cached: each token's origin (rank * T + token) * k as an int64 in two int32 words."""
    return _table((device, "origins", tokens_n, k, rank), lambda: (
        _arange(tokens_n, device) * k + rank * tokens_n * k).view(torch.int32).view(tokens_n, 2))


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


def row_layout(hidden: int, element_size: int, k: int) -> tuple[int, int, int]:
    """(data bytes, offset of the metadata, padded bytes) of one dispatched row: the row, then at an
    8-byte offset its int64 origin and k int32 expert ids, padded to ROW_ALIGN_BYTES."""
    data_bytes = hidden * element_size
    meta_at = -(-data_bytes // 8) * 8
    return data_bytes, meta_at, -(-(meta_at + 8 + 4 * k) // ROW_ALIGN_BYTES) * ROW_ALIGN_BYTES


def _local_keys(num_experts: int, world: int, rank: int, device: torch.device) -> torch.Tensor:
    """[E + 1] sort keys, cached: expert x -> its local index on this rank, or E/W where not this rank's
    (x = E: an invalid id)."""
    local = num_experts // world

    def make():
        shifted = _arange(num_experts + 1, device) - rank * local
        return torch.where((shifted >= 0) & (shifted < local), shifted, local).to(_key_dtype(num_experts))
    return _table((device, "local keys", num_experts, world, rank), make)


def _routing(topk_ids: torch.Tensor, num_experts: int, world: int):
    """(expert [T, k] int32 with E for an invalid id, owner [T, k] int32 with W for an invalid id, this
    rank's (token, slot)s sorted by expert, stably: valid ones first, by owner)."""
    tokens_n, k = topk_ids.shape
    expert = torch.remainder(topk_ids.clamp(-1, num_experts), num_experts + 1,
                             out=torch.empty((tokens_n, k), dtype=torch.int32, device=topk_ids.device))
    owner = expert // (num_experts // world)
    return expert, owner, torch.argsort(expert.view(-1), stable=True)


def _kept_on(host: list[int], owner: int, world: int, local: int, max_rows: int) -> list[int]:
    """Rows ``owner`` keeps from each source: its layout is by local expert, then source, and the first
    ``max_rows`` are kept. ``host``: the gathered counts, [source, owner, 1 + local] flat."""
    per_pair = 1 + local
    kept, budget = [0] * world, max_rows
    for e in range(1, per_pair):
        for s in range(world):
            n = min(host[(s * world + owner) * per_pair + e], budget)
            kept[s] += n
            budget -= n
    return kept


def _route(send_rows, slot_order, expert, full_from_owner, from_owner, to_source, num_experts,
           group) -> ReturnRoute:
    """The combine's route: where each (token, slot) of this rank finds its returned row. Returned rows
    come owner-major, each owner's kept prefix of this rank's slots on it in (expert, token, slot) order
    (``slot_order``); ``full_from_owner`` / ``from_owner``: those slots / those kept, per owner (host)."""
    slots_n = expert.numel()
    returned, valid = sum(from_owner), sum(full_from_owner)
    if list(from_owner) == list(full_from_owner):
        returned_slot = slot_order[:returned]
    else:
        starts = [sum(full_from_owner[:o]) for o in range(len(from_owner))]
        returned_slot = torch.cat([slot_order[s:s + n] for s, n in zip(starts, from_owner)])
    device = slot_order.device
    slot_source = torch.empty(slots_n, dtype=torch.int64, device=device) if returned == slots_n else \
        torch.full((slots_n,), returned, dtype=torch.int64, device=device)
    slot_source.scatter_(0, returned_slot, _arange(returned, device))
    valid_slot = None if valid == slots_n else expert != num_experts
    return ReturnRoute(tuple(to_source), tuple(from_owner), send_rows, slot_source, valid_slot, group)


def _send_rows(row_origin: torch.Tensor, slots_per_rank: int, world: int, kept: int) -> torch.Tensor:
    """The ``kept`` dispatch rows in return order: by source rank, then by row (stable). The first
    ``kept`` rows of row_origin are >= 0."""
    if world == 1:
        return _arange(kept, row_origin.device)
    source = torch.floor_divide(row_origin[:kept], max(slots_per_rank, 1),
                                out=torch.empty(kept, dtype=_key_dtype(world), device=row_origin.device))
    return torch.argsort(source, stable=True)


def dispatch(tokens: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, group=None,
             max_rows: int | None = None, out: torch.Tensor | None = None):
    """(recv [max_rows, H], expert_counts [E/W] int64, row_origin [max_rows] int64, self_rows [T, k]
    int64, route for ``combine``), exactly ``reference.moe_dispatch``'s outputs. ``max_rows=None``: as
    many rows as received (no padding). ``out``: where recv goes ([max_rows, H], tokens' dtype)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens_n, k = topk_ids.shape
    hidden, device = tokens.shape[1], tokens.device
    local, slots_n = num_experts // world, tokens_n * k
    expert, owner, slot_order = _routing(topk_ids, num_experts, world)
    # present[d * T + t] = 1 where token t goes to rank d (row W collects the invalid slots).
    present = torch.zeros((world + 1) * tokens_n, dtype=torch.uint8, device=device)
    present.scatter_(0, torch.add(_arange(tokens_n, device)[:, None], owner, alpha=tokens_n).view(-1), 1)
    slots_of_expert = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).index_add_(
        0, expert.view(-1), _scalar("one", device).expand(slots_n))
    send_counts = torch.cat([present[:world * tokens_n].view(world, tokens_n).sum(1)[:, None],
                             slots_of_expert[:num_experts].view(world, local)], dim=1)  # per destination
    counts = torch.empty(world * world * (1 + local), dtype=torch.int64, device=device)
    _all_gather(counts, send_counts.view(-1), group)
    pair_order = torch.argsort(present, descending=True, stable=True)    # queued before the host read

    host = counts.tolist()                                                 # the one host read
    per_pair = 1 + local

    def pair(s: int, o: int) -> list[int]:                                 # counts from source s to owner o
        return host[(s * world + o) * per_pair:(s * world + o + 1) * per_pair]

    rows_out = [pair(rank, d)[0] for d in range(world)]
    rows_in = [pair(s, rank)[0] for s in range(world)]
    slots_in = [sum(pair(s, rank)[1:]) for s in range(world)]
    slots_out = [sum(pair(rank, o)[1:]) for o in range(world)]
    received = sum(slots_in)
    to_source, from_owner = slots_in, slots_out
    if max_rows is not None:
        to_source = _kept_on(host, rank, world, local, max_rows) if received > max_rows else slots_in
        from_owner = [_kept_on(host, o, world, local, max_rows)[rank]
                      if sum(sum(pair(s, o)[1:]) for s in range(world)) > max_rows else slots_out[o]
                      for o in range(world)]
    kept_here = sum(to_source)
    max_rows = received if max_rows is None else max_rows

    # Rows as bytes, then their metadata (int64 origin, k int32 expert ids) at an 8-byte offset.
    data_bytes, meta_at, row_bytes = row_layout(hidden, tokens.element_size(), k)
    meta = torch.cat([_origin_column(tokens_n, k, rank, device), expert], 1)         # int32 [T, 2 + k]
    send_token = pair_order[:sum(rows_out)] % max(tokens_n, 1)
    packed = torch.empty((send_token.numel(), row_bytes), dtype=torch.uint8, device=device)
    torch.index_select(_row_bytes(tokens), 0, send_token, out=packed[:, :data_bytes])
    torch.index_select(meta, 0, send_token, out=packed[:, meta_at:meta_at + 8 + 4 * k].view(torch.int32))
    arrived = torch.empty((sum(rows_in), row_bytes), dtype=torch.uint8, device=device)
    dist.all_to_all_single(arrived.reshape(-1), packed.reshape(-1), [n * row_bytes for n in rows_in],
                           [n * row_bytes for n in rows_out], group=group)

    arrived_expert = arrived[:, meta_at + 8:meta_at + 8 + 4 * k].view(torch.int32)
    mine = _local_keys(num_experts, world, rank, device)[arrived_expert]
    grouped = torch.argsort(mine.view(-1), stable=True)[:kept_here]      # (row, slot)s: row * k + slot
    recv = tokens.new_empty((max_rows, hidden)) if out is None else out
    torch.index_select(arrived[:, :data_bytes].view(tokens.dtype), 0, grouped // k, out=recv[:kept_here])
    row_origin = torch.empty(max_rows, dtype=torch.int64, device=device)
    origin = arrived[:, meta_at:meta_at + 8].view(torch.int64) + _arange(k, device)  # [rows, k]
    torch.index_select(origin.view(-1), 0, grouped, out=row_origin[:kept_here])
    if kept_here < max_rows:
        recv[kept_here:].zero_()
        row_origin[kept_here:].fill_(-1)
    # self_rows[t, j] = the row of own token t's slot j: a scatter by origin into every rank's slots.
    every_slot = torch.full((world * slots_n,), -1, dtype=torch.int64, device=device)
    every_slot.scatter_(0, row_origin[:kept_here], _arange(kept_here, device))
    self_rows = every_slot[rank * slots_n:(rank + 1) * slots_n].view(tokens_n, k)
    expert_counts = counts.view(world, world, per_pair)[:, rank, 1:].sum(0)

    route = _route(_send_rows(row_origin, slots_n, world, kept_here), slot_order, expert, slots_out,
                   from_owner, to_source, num_experts, group)
    return recv, expert_counts, row_origin, self_rows, route


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
    device = row_origin.device
    expert, owner, slot_order = _routing(topk_ids, num_experts, world)
    source = torch.where(row_origin >= 0, row_origin // max(tokens_n * k, 1), world)
    one = _scalar("one", device)
    # [to source, from owner, this rank's valid slots per owner]
    counts = torch.zeros((3, world + 1), dtype=torch.int64, device=device)
    counts[0].scatter_add_(0, source, one.expand(source.numel()))
    counts[2].index_add_(0, owner.view(-1), one.expand(owner.numel()))
    dist.all_to_all_single(counts[1, :world], counts[0, :world].contiguous(), group=group)
    to_source, from_owner, full_from_owner = (row[:world] for row in counts.tolist())
    kept = sum(to_source)
    send_rows = torch.argsort(source.to(_key_dtype(world)), stable=True)[:kept]
    return _route(send_rows, slot_order, expert, full_from_owner, from_owner, to_source, num_experts, group)


def combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int,
            route: ReturnRoute, out: torch.Tensor | None = None) -> torch.Tensor:
    """[T, H]: exactly ``reference.moe_combine``: every token's sum over its valid slots of weight * its
    expert's output row, in fp32 (the oracle's ops and order), rounded once to expert_out's dtype."""
    tokens_n, k = topk_ids.shape
    hidden = expert_out.shape[1]
    returned = sum(route.from_owner)
    back = expert_out.index_select(0, route.send_rows)
    got = expert_out.new_empty((returned + 1, hidden))                 # the last row: for slots with none
    row_bytes = hidden * expert_out.element_size()
    dist.all_to_all_single(_bytes(got[:returned]), _bytes(back), [n * row_bytes for n in route.from_owner],
                           [n * row_bytes for n in route.to_source], group=route.group)
    if returned < tokens_n * k:
        got[returned].zero_()
    slots = got.index_select(0, route.slot_source).view(tokens_n, k, hidden)
    weights = topk_weights.float()
    if route.valid_slot is not None:
        weights = torch.where(route.valid_slot, weights, _scalar("zero", expert_out.device))
    summed = (weights[..., None] * slots).sum(dim=1)
    if out is None:
        return summed.to(expert_out.dtype)
    return out.copy_(summed)
