"""MoE dispatch on one rank in one launch, routed by ranges of tokens (dispatch variants 2 and 3, fused/moe_rules.py).

Why: on one rank the two-launch dispatch (moe_route_kernel, then moe_dispatch_kernel) pays a second
launch and the routing kernel's chain of dependent memory round trips (histogram, counter, scan:
about 5 us), which at 1024 tokens is 40% of the call; the one-launch variant 1 (every program ranks
every slot against every other, moe_dispatch_local_kernel) costs a [slots of an item, all slots]
comparison per item and holds every slot's expert in registers (it spills past 4096 slots).

How (one launch, no program waits for another, so neither co-residency nor program order matters)::

    program p = (range r of range_tokens consecutive tokens, part of the row):
      issue the loads of its first tokens' first words (in flight during the routing pass);
      one pass over topk_ids [T, k] (every slot, CHUNK at a time, two chunks in flight): a histogram
        of 2 E_P2 bins, (expert, slot before my range or not): totals per expert (each expert's first
        row: their prefix) and the slots of each expert before my range; program 0 checks the ids
        and writes the counts; every program marks its share of the unused rows' origins -1;
      next[e] = first row of e + e's slots before my range;
      per item of TT tokens of my range: the item's slots' rows = next[e] + earlier slots of e in the
        item, next += the item's slots per expert ([TT * KP2, E_P2] comparisons, registers only);
        row origins and the tokens' rows (part 0 only), then each token row read once and stored into
        every slot's row ([TT * KP2, HB] stores, moe_dispatch_kernels._store_rows); variant 3 (AHEAD) issues
        the next item's row and id loads before this item's stores (two items in flight, not one).

Variant 4 (ROUTE_ALL): the routing pass counts (expert, before my range) as two histograms of E_P2
bins over the chunks before and from my range (the straddling chunk split by one more), not one of 2
E_P2 bins over every chunk (the histogram's cost per slot grows with its bins: about 620 SASS per
chunk at 512 bins, 350 at 16); then every slot of my range is routed at once, [RS] slots: its row
is its expert's next row (a gather of next[e]) + its range's earlier slots of that expert ([RS, RS]
comparisons), stored as its own-token row (every part's program stores the same values) with its
origin (part 0); after a barrier the items read their slots' rows back (this program's stores) and
only copy, the next item's loads ahead: no per-item [TT * KP2, E_P2] tile and its cross-warp
reductions (8 BAR.SYNC per item at 256 experts), which cost more with E than the rows' copies at
1024 tokens (roofline run 2026-11-27: variant 3 at 65-70% of copy with 256 experts, 76-85% with 8).
Ranges of more than RS_MAX_TILE / max(RS, E_P2) slots route per item as variant 3 does.

Reads: every row once, topk_ids once per program (from L2: T * k ids per program; the pass's floor, estimated:
about 2 us at 1024 tokens x top-8 with 4 programs per SM; fewer, wider programs read less; programs
share ranges when rows are cut in parts), writes: every slot's row, its origin and the tokens' rows. The
layout is the two-launch path's (by expert, then token, then slot), bit for bit. Wins where the
routing launch is a large share of the call (<= a few thousand tokens); at many tokens x top-8 the
redundant pass over the ids (L2 reads growing with programs x slots) may lose to the routing launch:
the roofline sweep measures both and the table picks (memory_bound_configs.py).
"""

import triton
import triton.language as tl

from ..language import ARG_TOPK_IDS, record_argument
from .moe_dispatch_kernels import _counts_and_unused_origins, _store_rows


@triton.jit
def _chunk_ids(ids_ptr, c0, lanes, slots_n, num_experts, worst):
    """A chunk's raw ids (-1 past the end), which are used (in [0, E)), and (program 0) the largest bad id
    so far."""
    slot = c0 + lanes
    raw = tl.load(ids_ptr + slot, mask=slot < slots_n, other=-1)
    used = (raw >= 0) & (raw < num_experts)
    if tl.program_id(0) == 0:
        bad = (slot < slots_n) & ((raw < -1) | (raw >= num_experts))
        worst = tl.maximum(worst, tl.max(tl.where(bad, raw, -(1 << 30)), axis=0).to(tl.int32))
    return raw, used, worst


@triton.jit
def _route_totals(ids_ptr, slots_n, first_slot, num_experts, status_ptr, rank, desc, E_P2: tl.constexpr,
                  CHUNK: tl.constexpr):
    """(slots of each expert before ``first_slot``, slots of each expert in all) over every slot of
    topk_ids; program 0 also reports an id outside [-1, E) naming topk_ids."""
    lanes = tl.arange(0, CHUNK)
    hist = tl.zeros([2 * E_P2], tl.int32)
    # (pipelined: the next chunks' ids are copied into shared memory while this one is counted)
    worst = -(1 << 30)  # the largest bad id (program 0 only: a reduction per chunk)
    for c0 in tl.range(0, slots_n, CHUNK, num_stages=3):
        raw, used, worst = _chunk_ids(ids_ptr, c0, lanes, slots_n, num_experts, worst)
        # bin 2 e + 1: a slot of expert e from my range on; 2 e: before it
        key = tl.where(used, raw.to(tl.int32) * 2 + (c0 + lanes >= first_slot).to(tl.int32), 0)
        hist += tl.histogram(key, 2 * E_P2, mask=used)
    if worst > -(1 << 30):
        record_argument(status_ptr, ARG_TOPK_IDS, worst, num_experts, rank, desc)
    before, from_mine = tl.split(tl.reshape(hist, (E_P2, 2)))
    return before, before + from_mine


@triton.jit
def _route_totals_split(ids_ptr, slots_n, first_slot, num_experts, status_ptr, rank, desc, E_P2: tl.constexpr,
                        CHUNK: tl.constexpr):
    """``_route_totals`` with E_P2-bin histograms: the chunks wholly before ``first_slot`` into
    ``before``, the others into ``from_split``, and the chunk holding ``first_slot`` once more for its
    slots before it (moved from one to the other)."""
    lanes = tl.arange(0, CHUNK)
    before = tl.zeros([E_P2], tl.int32)
    from_split = tl.zeros([E_P2], tl.int32)
    worst = -(1 << 30)
    split = first_slot // CHUNK * CHUNK
    for c0 in tl.range(0, split, CHUNK, num_stages=3):
        raw, used, worst = _chunk_ids(ids_ptr, c0, lanes, slots_n, num_experts, worst)
        before += tl.histogram(tl.where(used, raw, 0).to(tl.int32), E_P2, mask=used)
    for c0 in tl.range(split, slots_n, CHUNK, num_stages=3):
        raw, used, worst = _chunk_ids(ids_ptr, c0, lanes, slots_n, num_experts, worst)
        from_split += tl.histogram(tl.where(used, raw, 0).to(tl.int32), E_P2, mask=used)
    if worst > -(1 << 30):
        record_argument(status_ptr, ARG_TOPK_IDS, worst, num_experts, rank, desc)
    if first_slot > split:
        raw = tl.load(ids_ptr + split + lanes, mask=split + lanes < slots_n, other=-1)
        early = (raw >= 0) & (raw < num_experts) & (split + lanes < first_slot)
        moved = tl.histogram(tl.where(early, raw, 0).to(tl.int32), E_P2, mask=early)
        before += moved
        from_split -= moved
    return before, before + from_split


@triton.jit
def _route_range(ids_ptr, origin_ptr, self_ptr, upcoming_row, first, end, max_rows, num_experts, part_start,
                 K: tl.constexpr, KP2: tl.constexpr, E_P2: tl.constexpr, RS: tl.constexpr):
    """Every slot of tokens [first, end) routed at once (``upcoming_row``: each expert's next row at
    ``first``): its row stored as the token's own-token row (-1: not kept) and (part 0) its origin."""
    s = tl.arange(0, RS)
    token = first + s // KP2
    j = s % KP2
    valid = (j < K) & (token < end)
    raw = tl.load(ids_ptr + token * K + j, mask=valid, other=-1)
    ids = tl.where((raw < 0) | (raw >= num_experts), -1, raw).to(tl.int32)
    earlier = tl.sum(((ids[None, :] == ids[:, None]) & (s[None, :] < s[:, None])).to(tl.int32), axis=1)
    dest = tl.gather(upcoming_row, tl.maximum(ids, 0), 0) + earlier
    kept = (ids >= 0) & (dest < max_rows)
    if part_start == 0:
        tl.store(origin_ptr + dest, (token * K + j).to(tl.int64), mask=kept)
    tl.store(self_ptr + token * K + j, tl.where(kept, dest, -1).to(tl.int64), mask=valid)


@triton.jit
def _item(tokens_ptr, ids_ptr, t0, end, row_words, part_start, part_end, K: tl.constexpr, KP2: tl.constexpr,
          TT: tl.constexpr, HB: tl.constexpr):
    """The loads of the item of TT tokens from ``t0`` (up to ``end``): (row addresses [TT, 1], their first
    HB words of the part, the slots' raw ids [TT * KP2])."""
    in_group = tl.arange(0, TT)
    lane = tl.arange(0, HB)
    slot = tl.arange(0, TT * KP2)
    rows = tokens_ptr + (t0 + in_group).to(tl.int64)[:, None] * row_words
    values = tl.load(rows + (part_start + lane)[None, :],
                     mask=(t0 + in_group < end)[:, None] & ((part_start + lane)[None, :] < part_end))
    token = t0 + slot // KP2
    raw = tl.load(ids_ptr + token * K + slot % KP2, mask=(slot % KP2 < K) & (token < end), other=-1)
    return rows, values, raw


@triton.jit(do_not_specialize=["tokens_n", "max_rows", "num_experts", "range_tokens", "parts"])
def moe_dispatch_ranges_kernel(
    # workspace (Workspace.kernel_args): signal pads (unused: no peer), error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call's descriptor (named in error records)
    desc,
    # my token rows (words), topk_ids [T, K] (int32 or int64); outputs: rows by expert (words), expert
    # counts [E] int64, row origins [max_rows] int64, my tokens' rows [T, K] int64
    tokens_ptr, ids_ptr, out_ptr, counts_ptr, origin_ptr, self_ptr,
    tokens_n, row_words, max_rows, num_experts,
    # program p: tokens [p // parts * range_tokens, + range_tokens), words [p % parts * part_words, + part_words)
    range_tokens, parts, part_words,
    # E_P2 >= num_experts; CHUNK slots per step of the routing pass; TT tokens per item; HB words of a
    # row per step; AHEAD: the next item's loads are issued before this item's stores (variant 3);
    # ROUTE_ALL: the range's RS slots (its tokens rounded up to a power of 2, times KP2) routed before
    # the copies (variant 4)
    K: tl.constexpr, KP2: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr, TT: tl.constexpr,
    HB: tl.constexpr, AHEAD: tl.constexpr, ROUTE_ALL: tl.constexpr = False, RS: tl.constexpr = 1,
):
    pid = tl.program_id(0)
    first = pid // parts * range_tokens
    end = tl.minimum(first + range_tokens, tokens_n)
    part_start = pid % parts * part_words
    part_end = tl.minimum(part_start + part_words, row_words)
    in_group = tl.arange(0, TT)
    lane = tl.arange(0, HB)
    slot = tl.arange(0, TT * KP2)
    j = slot % KP2
    experts = tl.arange(0, E_P2)
    # The first item's rows and ids are in flight during the routing pass.
    rows, values, raw = _item(tokens_ptr, ids_ptr, first, end, row_words, part_start, part_end, K, KP2, TT, HB)
    if ROUTE_ALL:
        before, totals = _route_totals_split(ids_ptr, tokens_n * K, first * K, num_experts, status_ptr, rank, desc,
                                             E_P2, CHUNK)
    else:
        before, totals = _route_totals(ids_ptr, tokens_n * K, first * K, num_experts, status_ptr, rank, desc, E_P2,
                                       CHUNK)
    received = tl.sum(totals, axis=0)
    _counts_and_unused_origins(counts_ptr, origin_ptr, status_ptr, totals, experts, num_experts, received, max_rows,
                               rank, desc)
    # The row of each expert's next slot: its first row + its slots before this one (token, then slot).
    upcoming_row = tl.cumsum(totals, axis=0) - totals + before
    # ROUTE_ALL: the items' "ids" are their slots' rows, read back from self_ptr once this program stored them.
    slots_ptr = self_ptr if ROUTE_ALL else ids_ptr
    if ROUTE_ALL:
        _route_range(ids_ptr, origin_ptr, self_ptr, upcoming_row, first, end, max_rows, num_experts, part_start, K,
                     KP2, E_P2, RS)
        tl.debug_barrier()
        token = first + slot // KP2
        raw = tl.load(self_ptr + token * K + j, mask=(j < K) & (token < end), other=-1)
    for t0 in range(first, end, TT):
        if AHEAD:
            next_rows, next_values, next_raw = _item(tokens_ptr, slots_ptr, t0 + TT, end, row_words, part_start,
                                                     part_end, K, KP2, TT, HB)
        elif t0 != first:
            rows, values, raw = _item(tokens_ptr, slots_ptr, t0, end, row_words, part_start, part_end, K, KP2, TT, HB)
        if ROUTE_ALL:  # routed: copies only
            _store_rows(values, rows, out_ptr + raw.to(tl.int64)[:, None] * row_words, raw >= 0,
                        (t0 + in_group < end)[:, None], part_start, part_end, lane, TT, KP2, HB)
        else:
            token = t0 + slot // KP2
            valid = (j < K) & (token < end)
            ids = tl.where((raw < 0) | (raw >= num_experts), -1, raw).to(tl.int32)
            earlier = tl.sum(((ids[None, :] == ids[:, None]) & (slot[None, :] < slot[:, None])).to(tl.int32), axis=1)
            match = ids[:, None] == experts[None, :]
            dest = tl.sum(tl.where(match, upcoming_row[None, :], 0), axis=1) + earlier
            upcoming_row += tl.sum(match.to(tl.int32), axis=0)
            kept = (ids >= 0) & (dest < max_rows)
            if part_start == 0:
                tl.store(origin_ptr + dest, (token * K + j).to(tl.int64), mask=kept)
                tl.store(self_ptr + token * K + j, tl.where(kept, dest, -1).to(tl.int64), mask=valid)
            if tl.max(kept.to(tl.int32), axis=0) > 0:
                _store_rows(values, rows, out_ptr + dest.to(tl.int64)[:, None] * row_words, kept,
                            (t0 + in_group < end)[:, None], part_start, part_end, lane, TT, KP2, HB)
        if AHEAD:
            rows, values, raw = next_rows, next_values, next_raw


# Most elements of _route_range's [RS, RS] comparison and [RS] gather from [E_P2] (per program: 64 per
# thread at 8 warps); larger ranges route per item.
RS_MAX_TILE = 16384


def route_all_slots(range_tokens: int, kp2: int, e_p2: int) -> int:
    """RS of variant 4: the slots of a range (its tokens rounded up to a power of 2, times KP2), or 0 where
    the tiles of routing them at once would pass RS_MAX_TILE (then routed per item)."""
    rs = triton.next_power_of_2(max(range_tokens, 1)) * kp2
    return rs if rs * max(rs, e_p2) <= RS_MAX_TILE else 0


def ranges_grid(tokens_n: int, max_programs: int, parts: int, tt: int) -> tuple[int, int]:
    """(tokens per range, programs): ranges of whole items of ``tt`` tokens, as many as ``max_programs``
    programs over ``parts`` parts of a row allow (at least one), every token in one."""
    groups = max(1, triton.cdiv(tokens_n, tt))
    ranges = min(groups, max(1, max_programs // parts))
    range_tokens = tt * triton.cdiv(groups, ranges)
    return range_tokens, max(1, triton.cdiv(tokens_n, range_tokens)) * parts
