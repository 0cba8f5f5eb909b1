"""MoE dispatch variant 6 (one rank): the pull of fused/moe_dispatch_kernels.py's moe_dispatch_kernel over the
route kernel's FOLD layout, with no metadata round trip between one item's row stores and the next's.

moe_route_kernel with FOLD stores, per routing block and expert, the first row of that block's slots of
that expert (the expert's start + the rows of earlier blocks; rows of E_P2 experts), so a slot's row is
``hist[block, id] + rank in block``: one load that waits for the id, where variant 0 / 5 took the experts' totals, their
cumsum, a gather of it through shared memory (two barriers a layout) and then that load.

Per program, items pid, pid + nprog, ... (TT tokens x a part of the row, as moe_dispatch_kernel's) in
a pipeline of depth two: before item i's row stores go out, item i + 1's row words and its rows'
destinations (whose ids were loaded an item earlier) and item i + 2's ids and in-block ranks are
already requested. Why: under a write stream at HBM speed a load issued after a batch of stores waits
behind them (measured on one H100: the two-launch dispatch's row copies ran at 82% of copy speed
where torch's index_select of the same rows reached 91%, and at 93% with 4x the items a program), so
each dependent load between stores left the SM's stores idle for a round trip. Nothing waits on any
other program (no barrier: no peer), and the experts' totals (the counts and the origins of the rows
past the received ones) are loaded first and used last.

Reads and writes what variant 0 does: the token rows once, every (token, slot) row once, row origins
and own-token rows; its results are bit-identical (the same layout).
"""

import triton
import triton.language as tl

from .moe_dispatch_kernels import _counts_and_unused_origins, _store_rows


@triton.jit
def _item_ids(meta, item, tokens_n, parts, K: tl.constexpr, KP2: tl.constexpr, TT: tl.constexpr):
    """The expert ids of the slots of item ``item`` (-1: none; past the last item: all)."""
    groups = tl.cdiv(tokens_n, TT)
    slot = tl.arange(0, TT * KP2)
    token = item // parts % groups * TT + slot // KP2
    valid = (item < groups * parts) & (slot % KP2 < K) & (token < tokens_n)
    return tl.load(meta + token * K + slot % KP2, mask=valid, other=-1)


@triton.jit
def _item_places(meta, ids, item, tokens_n, parts, num_experts, rank_off, hist_off, K: tl.constexpr,
                 KP2: tl.constexpr, E_P2: tl.constexpr, TB: tl.constexpr, TT: tl.constexpr):
    """(the first row of each slot's routing block and expert, far below 0 where the slot has no expert;
    the slot's rank in its block) of item ``item``, both loaded: a slot's row is their sum, taken where
    it is used, so the loads are waited for there and not here."""
    slot = tl.arange(0, TT * KP2)
    token = item // parts % tl.cdiv(tokens_n, TT) * TT + slot // KP2
    has = (ids >= 0) & (ids < num_experts)
    first = tl.load(meta + hist_off + token // TB * E_P2 + ids, mask=has, other=-(1 << 30))
    return first, tl.load(meta + rank_off + token * K + slot % KP2, mask=has, other=0)


@triton.jit
def _item_words(tokens_ptr, item, tokens_n, parts, part_words, row_words, TT: tl.constexpr, HB: tl.constexpr):
    """(the rows of item ``item`` [TT, 1], their first HB words of its part)."""
    groups = tl.cdiv(tokens_n, TT)
    in_group = tl.arange(0, TT)
    first_token = item // parts % groups * TT
    part_start = item % parts * part_words
    words = part_start + tl.arange(0, HB)
    rows = tokens_ptr + (first_token + in_group).to(tl.int64)[:, None] * row_words
    live = (item < groups * parts) & (first_token + in_group < tokens_n)
    values = tl.load(rows + words[None, :], mask=live[:, None] & (words[None, :] < tl.minimum(part_start + part_words,
                                                                                             row_words)))
    return rows, values


@triton.jit(do_not_specialize=["tokens_n", "max_rows", "num_experts", "rank_off", "hist_off", "totals_off", "parts"])
def moe_pull_folded_kernel(
    # workspace (Workspace.kernel_args): signal pads (unused: no peer), error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call's descriptor (named in error records); my buffer (int32 words: the routing metadata of
    # moe_route_kernel with FOLD)
    desc, meta,
    # my token rows (words); outputs: rows by expert (words), expert counts [E] int64, row origins
    # [max_rows] int64, my tokens' rows [T, K] int64
    tokens_ptr, out_ptr, counts_ptr, origin_ptr, self_ptr,
    tokens_n, row_words, max_rows, num_experts, rank_off, hist_off, totals_off,
    # each row is moved in `parts` parts of part_words words (programs take (TT tokens, part) items)
    parts, part_words,
    K: tl.constexpr, KP2: tl.constexpr, E_P2: tl.constexpr, TB: tl.constexpr, TT: tl.constexpr, HB: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    experts = tl.arange(0, E_P2)
    totals = tl.load(meta + totals_off + experts, mask=experts < num_experts, other=0)
    slot = tl.arange(0, TT * KP2)
    j = slot % KP2
    in_group = tl.arange(0, TT)
    lane = tl.arange(0, HB)
    groups = tl.cdiv(tokens_n, TT)
    first, ranks = _item_places(meta, _item_ids(meta, pid, tokens_n, parts, K, KP2, TT), pid, tokens_n, parts,
                                num_experts, rank_off, hist_off, K, KP2, E_P2, TB, TT)
    next_ids = _item_ids(meta, pid + nprog, tokens_n, parts, K, KP2, TT)
    rows, values = _item_words(tokens_ptr, pid, tokens_n, parts, part_words, row_words, TT, HB)
    for item in range(pid, groups * parts, nprog):
        # What the next two items need is requested before this item's stores, and nothing loaded here
        # is used before them.
        later_ids = _item_ids(meta, item + 2 * nprog, tokens_n, parts, K, KP2, TT)
        next_rows, next_values = _item_words(tokens_ptr, item + nprog, tokens_n, parts, part_words, row_words, TT, HB)
        next_first, next_ranks = _item_places(meta, next_ids, item + nprog, tokens_n, parts, num_experts, rank_off,
                                              hist_off, K, KP2, E_P2, TB, TT)
        first_token = item // parts % groups * TT
        part_start = item % parts * part_words
        token = first_token + slot // KP2
        valid = (j < K) & (token < tokens_n)
        dest = first + ranks
        kept = valid & (dest >= 0) & (dest < max_rows)
        if part_start == 0:
            tl.store(origin_ptr + dest, (token * K + j).to(tl.int64), mask=kept)
            tl.store(self_ptr + token * K + j, tl.where(kept, dest, -1).to(tl.int64), mask=valid)
        if tl.max(kept.to(tl.int32), axis=0) > 0:
            _store_rows(values, rows, out_ptr + dest.to(tl.int64)[:, None] * row_words, kept,
                        (first_token + in_group < tokens_n)[:, None], part_start,
                        tl.minimum(part_start + part_words, row_words), lane, TT, KP2, HB)
        rows, values, first, ranks, next_ids = next_rows, next_values, next_first, next_ranks, later_ids
    _counts_and_unused_origins(counts_ptr, origin_ptr, status_ptr, totals, experts, num_experts,
                               tl.sum(totals, axis=0), max_rows, rank, desc)
