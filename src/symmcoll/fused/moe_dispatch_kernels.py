"""The kernels of MoE dispatch (fused/moe.py: the algorithm, the layouts, the host side; the combine's
kernels are fused/moe_combine_kernels.py; one-rank variants 2-4 and 6 are fused/moe_dispatch_ranges.py
and fused/moe_pull_folded.py, which share this file's ``_store_rows`` and ``_counts_and_unused_origins``).

Dispatch on one rank with at most LOCAL_ROUTE_SLOTS (fused/moe_rules.py) slots: ``moe_dispatch_local_kernel``
alone (every program routes every slot itself, then copies its tokens' rows). Otherwise, per round of
tokens: ``moe_route_kernel`` (local: stage token rows in my buffer for the peers;
in the first round also sanitise topk_ids into my buffer's metadata, count slots per expert per
block of TB tokens and rank each slot among the block's slots of its expert; the last program to
finish turns the counts into prefixes over blocks and totals), then ``moe_dispatch_kernel`` (entry
barrier; pull every token row that has a local expert once and store it into each of its local
experts' rows; exit barrier).

Data movement is a token row (or a part of one) at a time: the row's k slots are a [KP2] vector, so a
step is one [HB] load stored to every destination row at once (a [KP2, HB] store of the row
broadcast). Row addresses are per-row scalars plus a contiguous range: 16-byte accesses wherever rows
are 16-byte multiples, no per-element pointers, and k rows in flight per step. Sizes and offsets that
only count are not specialised (``do_not_specialize``): one compiled kernel serves every batch of a
shape class; row lengths and offsets of rows stay specialised (16-byte alignment).
"""

import triton
import triton.language as tl

from ..language import ARG_MAX_ROWS, ARG_TOPK_IDS, block_barrier, copy_blocks, open_call, peer_ptr, record_argument

# Slots of a routing block compared with each other per step of the in-block ranking.
RANK_CHUNK: tl.constexpr = tl.constexpr(32)


@triton.jit
def _sanitised_ids(ids_ptr, slot, b, tokens_n, num_experts, K: tl.constexpr, KP2: tl.constexpr, TB: tl.constexpr):
    """(raw ids, ids with every id outside [0, E) as -1, valid) of slots ``slot`` of routing block ``b``."""
    token = b * TB + slot // KP2
    valid = (token < tokens_n) & (slot % KP2 < K)
    raw = tl.load(ids_ptr + token * K + slot % KP2, mask=valid, other=-1)
    return raw, tl.where((raw < 0) | (raw >= num_experts), -1, raw).to(tl.int32), valid


@triton.jit
def _counts_and_unused_origins(counts_ptr, origin_ptr, status_ptr, counts, experts, n_experts, received, max_rows,
                               rank, desc):
    """Program 0: the expert counts out (int64) and max_rows checked; every program: its share of the
    rows past the received ones marked unused (origin -1)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if pid == 0:
        tl.store(counts_ptr + experts, counts.to(tl.int64), mask=experts < n_experts)
        if received > max_rows:
            record_argument(status_ptr, ARG_MAX_ROWS, received, max_rows, rank, desc)
    for r0 in range(received + pid * 1024, max_rows, nprog * 1024):
        rows = r0 + tl.arange(0, 1024)
        tl.store(origin_ptr + rows, tl.full([1024], -1, tl.int64), mask=rows < max_rows)


@triton.jit
def _store_rows(values, rows, to, kept, token_ok, part_start, part_end, lane, TT: tl.constexpr, KP2: tl.constexpr,
                HB: tl.constexpr):
    """A part of TT token rows (``values``: their first HB words, loaded) stored into each kept slot's row
    ``to`` ([TT * KP2] row addresses), one [TT * KP2, HB] store per step; the next HB words are in flight
    while these are stored."""
    for h0 in range(part_start, part_end, HB):
        ahead = h0 + HB + lane
        upcoming = tl.load(rows + ahead[None, :], mask=token_ok & (ahead[None, :] < part_end))
        h = h0 + lane
        copies = tl.reshape(tl.broadcast_to(values[:, None, :], (TT, KP2, HB)), (TT * KP2, HB))
        tl.store(to + h[None, :], copies, mask=kept[:, None] & (h[None, :] < part_end))
        values = upcoming


@triton.jit(do_not_specialize=["n_words", "tokens_n", "num_experts", "rank_off", "hist_off", "totals_off"])
def moe_route_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table; this rank's route counter (int32)
    desc, buffer_ptrs_dev, counter_ptr,
    # this round's token rows (words) and their count in words; topk_ids [T, K] (int32 or int64)
    tokens_ptr, n_words, ids_ptr, tokens_n, num_experts,
    # where in my buffer: in-block ranks [T, K], block prefixes [NB, E] and totals [E] (int32 words),
    # token rows (token words)
    rank_off, hist_off, totals_off, tokens_off,
    # ROUTE: the first round (routes); STAGE: peers read my rows (more than one rank); TB tokens per
    # routing block; E_P2 >= num_experts; SCAN_ROWS blocks per step of the scan; FOLD (one rank, every
    # block in one step: dispatch variant 6): block prefixes in rows of E_P2 (not num_experts), each
    # stored with its expert's start added
    WORLD: tl.constexpr, K: tl.constexpr, KP2: tl.constexpr, TB: tl.constexpr, E_P2: tl.constexpr,
    SCAN_ROWS: tl.constexpr, BLOCK: tl.constexpr, ROUTE: tl.constexpr, STAGE: tl.constexpr,
    FOLD: tl.constexpr = False,
):
    pid, nprog = open_call(signal_pad_ptrs_dev, desc, rank, WORLD)
    if STAGE:
        copy_blocks(tokens_ptr, peer_ptr(buffer_ptrs_dev, rank, tokens_ptr.dtype.element_ty) + tokens_off, n_words,
                    BLOCK)
    if ROUTE:
        meta = peer_ptr(buffer_ptrs_dev, rank, tl.int32)
        blocks = tl.cdiv(tokens_n, TB)
        slot = tl.arange(0, TB * KP2)
        experts = tl.arange(0, E_P2)
        for b in range(pid, blocks, nprog):
            raw, ids, valid = _sanitised_ids(ids_ptr, slot, b, tokens_n, num_experts, K, KP2, TB)
            bad = valid & ((raw < -1) | (raw >= num_experts))
            if tl.max(bad.to(tl.int32), axis=0) > 0:
                record_argument(status_ptr, ARG_TOPK_IDS, tl.max(tl.where(bad, raw, -(1 << 30)), axis=0).to(tl.int32),
                                num_experts, rank, desc)
            index = (b * TB + slot // KP2) * K + slot % KP2
            tl.store(meta + index, ids, mask=valid)
            counts = tl.histogram(ids, E_P2, mask=ids >= 0)
            if FOLD:  # rows of E_P2 counts (the padding's zeros too): the scan's loads are whole 16-byte words
                tl.store(meta + hist_off + b * E_P2 + experts, counts)
            else:
                tl.store(meta + hist_off + b * num_experts + experts, counts, mask=experts < num_experts)
            # Each slot's rank among the block's earlier slots of its expert (token, then slot order).
            ranks = tl.zeros([TB * KP2], tl.int32)
            for c in tl.static_range(0, TB * KP2, RANK_CHUNK):
                other = c + tl.arange(0, RANK_CHUNK)
                _, other_ids, _ = _sanitised_ids(ids_ptr, other, b, tokens_n, num_experts, K, KP2, TB)
                same = (other_ids[None, :] == ids[:, None]) & (other[None, :] < slot[:, None])
                ranks += tl.sum(same.to(tl.int32), axis=1)
            tl.store(meta + rank_off + index, ranks, mask=valid)
        # The last program to get here turns every block's counts into prefixes over blocks: it waits
        # for nobody (the others are done), so neither co-residency nor program order matters.
        tl.debug_barrier()
        if tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == nprog - 1:
            tl.store(counter_ptr, 0)  # ready for the next call
            rows = tl.arange(0, SCAN_ROWS)
            if FOLD:  # every block in this one tile (the host checks): the totals come first
                # (my buffer and hist_off are 16-byte aligned: the host's layout)
                at = tl.multiple_of(meta, 16) + tl.multiple_of(hist_off, 4) + rows[:, None] * E_P2 + experts[None, :]
                counts = tl.load(at, mask=rows[:, None] < blocks, other=0, volatile=True)
                totals = tl.sum(counts, axis=0)
                # The first row of each block's slots of each expert: the pull's row of a slot is this + its
                # in-block rank, one load where it was the expert's start (a cumsum of the totals) + this.
                tl.store(at, tl.cumsum(counts, axis=0) - counts + (tl.cumsum(totals, axis=0) - totals)[None, :],
                         mask=rows[:, None] < blocks)
                tl.store(meta + totals_off + experts, totals, mask=experts < num_experts)
            else:
                carry = tl.zeros([E_P2], tl.int32)
                for b0 in range(0, blocks, SCAN_ROWS):
                    at = meta + hist_off + (b0 + rows)[:, None] * num_experts + experts[None, :]
                    valid = ((b0 + rows)[:, None] < blocks) & (experts[None, :] < num_experts)
                    counts = tl.load(at, mask=valid, other=0, volatile=True)
                    tl.store(at, tl.cumsum(counts, axis=0) - counts + carry[None, :], mask=valid)
                    carry += tl.sum(counts, axis=0)
                tl.store(meta + totals_off + experts, carry, mask=experts < num_experts)


@triton.jit
def _own_item(meta, tokens_ptr, item, t0, tq, parts, part_words, row_words, num_experts, rank_off, K: tl.constexpr,
              KP2: tl.constexpr, TT: tl.constexpr, HB: tl.constexpr):
    """One rank, item ``item`` of the pull (past the last: every load masked off): (its rows [TT, 1], their
    first HB words of the part, its slots' ids, their in-block ranks, whether a slot has an expert), all
    loads issued at once; the block prefixes, which wait for the ids, are ``_own_prefixes``."""
    groups = tl.cdiv(tq, TT)
    first_token = t0 + item // parts % groups * TT
    part_start = item % parts * part_words
    part_end = tl.minimum(part_start + part_words, row_words)
    live = item < groups * parts
    in_group = tl.arange(0, TT)
    lane = tl.arange(0, HB)
    slot = tl.arange(0, TT * KP2)
    rows = tokens_ptr + (first_token - t0 + in_group).to(tl.int64)[:, None] * row_words
    words = part_start + lane
    values = tl.load(rows + words[None, :], mask=(live & (first_token + in_group < t0 + tq))[:, None] &
                     (words[None, :] < part_end))
    token = first_token + slot // KP2
    valid = live & (slot % KP2 < K) & (token < t0 + tq)
    ids = tl.load(meta + token * K + slot % KP2, mask=valid, other=-1)
    ranks = tl.load(meta + rank_off + token * K + slot % KP2, mask=valid, other=0)
    return rows, values, ids, ranks, valid & (ids >= 0) & (ids < num_experts)


@triton.jit
def _own_prefixes(meta, ids, mine, item, t0, tq, parts, num_experts, hist_off, KP2: tl.constexpr, TB: tl.constexpr,
                  TT: tl.constexpr):
    """The block prefix (rows of the slot's expert in earlier routing blocks) of each slot of ``item``."""
    token = t0 + item // parts % tl.cdiv(tq, TT) * TT + tl.arange(0, TT * KP2) // KP2
    return tl.load(meta + hist_off + token // TB * num_experts + ids, mask=mine, other=0)


@triton.jit
def _pull_own_ahead(meta, tokens_ptr, out_ptr, counts_ptr, origin_ptr, self_ptr, status_ptr, rank, desc, pid, nprog,
                    row_words, max_rows, num_experts, rank_off, hist_off, totals_off, t0, tq, parts, part_words,
                    K: tl.constexpr, KP2: tl.constexpr, ELP2: tl.constexpr, TB: tl.constexpr, TT: tl.constexpr,
                    HB: tl.constexpr):
    """One rank, the pull (dispatch variant 5): the first item's loads are in flight with the experts'
    totals (the loop below loads its first item after them), and the next item's row, ids and in-block
    ranks are loaded before this item's stores, its block prefixes right after them, so an item's stores
    wait for no metadata round trip of their own (the per-item loop waits for two: ids, then prefixes)."""
    slot = tl.arange(0, TT * KP2)
    j = slot % KP2
    in_group = tl.arange(0, TT)
    lane = tl.arange(0, HB)
    groups = tl.cdiv(tq, TT)
    rows, values, ids, ranks, mine = _own_item(meta, tokens_ptr, pid, t0, tq, parts, part_words, row_words,
                                               num_experts, rank_off, K, KP2, TT, HB)
    experts = tl.arange(0, ELP2)
    totals = tl.load(meta + totals_off + experts, mask=experts < num_experts, other=0)
    first = tl.cumsum(totals, axis=0) - totals  # each expert's first row
    if t0 == 0:
        _counts_and_unused_origins(counts_ptr, origin_ptr, status_ptr, totals, experts, num_experts,
                                   tl.sum(totals, axis=0), max_rows, rank, desc)
    prefix = _own_prefixes(meta, ids, mine, pid, t0, tq, parts, num_experts, hist_off, KP2, TB, TT)
    for item in range(pid, groups * parts, nprog):
        next_rows, next_values, next_ids, next_ranks, next_mine = _own_item(
            meta, tokens_ptr, item + nprog, t0, tq, parts, part_words, row_words, num_experts, rank_off, K, KP2, TT, HB)
        first_token = t0 + item // parts % groups * TT
        part_start = item % parts * part_words
        part_end = tl.minimum(part_start + part_words, row_words)
        token = first_token + slot // KP2
        valid = (j < K) & (token < t0 + tq)
        dest = tl.gather(first, tl.where(mine, ids, 0), 0) + prefix + ranks
        kept = mine & (dest < max_rows)
        if part_start == 0:
            tl.store(origin_ptr + dest, (token * K + j).to(tl.int64), mask=kept)
            tl.store(self_ptr + token * K + j, tl.where(kept, dest, -1).to(tl.int64), mask=valid)
        if tl.max(kept.to(tl.int32), axis=0) > 0:
            _store_rows(values, rows, out_ptr + dest.to(tl.int64)[:, None] * row_words, kept,
                        (first_token + in_group < t0 + tq)[:, None], part_start, part_end, lane, TT, KP2, HB)
        prefix = _own_prefixes(meta, next_ids, next_mine, item + nprog, t0, tq, parts, num_experts, hist_off, KP2, TB,
                               TT)
        rows, values, ids, ranks, mine = next_rows, next_values, next_ids, next_ranks, next_mine


@triton.jit(do_not_specialize=["tokens_n", "max_rows", "num_experts", "rank_off", "hist_off", "totals_off", "t0", "tq",
                                     "parts"])
def moe_dispatch_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # my own token rows of this round (words); outputs: rows by local expert (words), expert counts [EL]
    # int64, row origins [max_rows] int64, my own tokens' rows [T, K] int64
    tokens_ptr, out_ptr, counts_ptr, origin_ptr, self_ptr,
    tokens_n, row_words, max_rows, num_experts, rank_off, hist_off, totals_off, tokens_off,
    # this round: tokens [t0, t0 + tq) of every source (rows staged from t0 on in every buffer); each
    # row is moved in `parts` parts of part_words words (programs take (source, TT tokens, part) items)
    t0, tq, parts, part_words,
    # AHEAD (one rank only: dispatch variant 5): the next item's loads before this item's stores
    WORLD: tl.constexpr, K: tl.constexpr, KP2: tl.constexpr, EL: tl.constexpr, ELP2: tl.constexpr,
    TB: tl.constexpr, TT: tl.constexpr, HB: tl.constexpr, PEERS: tl.constexpr, AHEAD: tl.constexpr = False,
):
    pid, nprog = open_call(signal_pad_ptrs_dev, desc, rank, WORLD)
    if block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD) == 0:
        if WORLD == 1 and AHEAD:
            _pull_own_ahead(peer_ptr(buffer_ptrs_dev, rank, tl.int32), tokens_ptr, out_ptr, counts_ptr, origin_ptr,
                            self_ptr, status_ptr, rank, desc, pid, nprog, row_words, max_rows, num_experts, rank_off,
                            hist_off, totals_off, t0, tq, parts, part_words, K, KP2, ELP2, TB, TT, HB)
        else:
            # Where each local expert's rows start, and each source's share before them.
            ranks = tl.arange(0, PEERS)
            local = tl.arange(0, ELP2)
            table = buffer_ptrs_dev.to(tl.pointer_type(tl.uint64))
            metas = tl.load(table + tl.where(ranks < WORLD, ranks, 0)).to(tl.pointer_type(tl.int32))
            totals = tl.load(metas[:, None] + totals_off + rank * EL + local[None, :],
                             mask=(ranks[:, None] < WORLD) & (local[None, :] < EL), other=0)
            expert_total = tl.sum(totals, axis=0)
            starts = tl.cumsum(totals, axis=0) - totals + (tl.cumsum(expert_total, axis=0) - expert_total)[None, :]
            received = tl.sum(expert_total, axis=0)
            if t0 == 0:
                _counts_and_unused_origins(counts_ptr, origin_ptr, status_ptr, expert_total, local, EL, received,
                                           max_rows, rank, desc)
            slot = tl.arange(0, TT * KP2)
            j = slot % KP2
            in_group = tl.arange(0, TT)
            lane = tl.arange(0, HB)
            groups = tl.cdiv(tq, TT)
            for item in range(pid, WORLD * groups * parts, nprog):
                # Sources in the order rank+1, rank+2, ...: the ranks do not all read rank 0 first.
                src = (rank + 1 + item // (groups * parts)) % WORLD
                first_token = t0 + item // parts % groups * TT
                part_start = item % parts * part_words
                part_end = tl.minimum(part_start + part_words, row_words)
                token_ok = (first_token + in_group < t0 + tq)[:, None]
                if WORLD == 1:
                    # Every row is needed here: its first HB words are loaded before the three dependent
                    # loads of routing metadata that say where it goes.
                    rows = tokens_ptr + (first_token - t0 + in_group).to(tl.int64)[:, None] * row_words
                    values = tl.load(rows + (part_start + lane)[None, :],
                                     mask=token_ok & ((part_start + lane)[None, :] < part_end))
                meta = peer_ptr(buffer_ptrs_dev, src, tl.int32)
                # Each slot's row: start of (expert, source) + rows of earlier blocks + rank in its block.
                token = first_token + slot // KP2
                valid = (j < K) & (token < t0 + tq)
                ids = tl.load(meta + token * K + j, mask=valid, other=-1)
                mine = valid & (ids >= rank * EL) & (ids < (rank + 1) * EL)
                first = tl.sum(tl.where(ranks[:, None] == src, starts, 0), axis=0)
                dest = tl.gather(first, tl.where(mine, ids - rank * EL, 0), 0) + \
                    tl.load(meta + hist_off + token // TB * num_experts + ids, mask=mine, other=0) + \
                    tl.load(meta + rank_off + token * K + j, mask=mine, other=0)
                kept = mine & (dest < max_rows)
                if part_start == 0:
                    tl.store(origin_ptr + dest, (src * tokens_n + token).to(tl.int64) * K + j, mask=kept)
                    if src == rank:
                        tl.store(self_ptr + token * K + j, tl.where(kept, dest, -1).to(tl.int64), mask=valid)
                # Each row is read once (mine: from my tokens; a peer's: from its staged copy, only if one of
                # my experts needs it) and stored into each of its local experts' rows; the next HB words
                # are in flight while these are stored.
                if tl.max(kept.to(tl.int32), axis=0) > 0:
                    if WORLD > 1:
                        if src == rank:
                            rows = tokens_ptr
                        else:
                            rows = peer_ptr(buffer_ptrs_dev, src, out_ptr.dtype.element_ty) + tokens_off
                        rows = rows + (first_token - t0 + in_group).to(tl.int64)[:, None] * row_words
                        values = tl.load(rows + (part_start + lane)[None, :],
                                         mask=token_ok & ((part_start + lane)[None, :] < part_end))
                    _store_rows(values, rows, out_ptr + dest.to(tl.int64)[:, None] * row_words, kept, token_ok,
                                part_start, part_end, lane, TT, KP2, HB)
        # Nobody restages its buffer (next round or call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


@triton.jit(do_not_specialize=["tokens_n", "max_rows", "num_experts", "parts"])
def moe_dispatch_local_kernel(
    # workspace (Workspace.kernel_args): signal pads (unused: no peer), error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call's descriptor (named in error records)
    desc,
    # my token rows (words), topk_ids [T, K] (int32 or int64); outputs: rows by expert (words), expert
    # counts [E] int64, row origins [max_rows] int64, my tokens' rows [T, K] int64
    tokens_ptr, ids_ptr, out_ptr, counts_ptr, origin_ptr, self_ptr,
    tokens_n, row_words, max_rows, num_experts, parts, part_words,
    # SLOTS >= T * K (a power of 2): every program holds every slot's expert; programs take (TT tokens,
    # part of the row) items
    K: tl.constexpr, KP2: tl.constexpr, E_P2: tl.constexpr, SLOTS: tl.constexpr, TT: tl.constexpr,
    HB: tl.constexpr,
):
    """Dispatch on one rank in one launch, for batches of at most SLOTS slots: every program routes all
    slots itself (one load of topk_ids, a histogram: each expert's first row), so no routing launch, no
    counter and no scan precede the row copies; each slot's row is its expert's first + the slots of
    that expert before it (token, then slot order): the layout of moe_route_kernel + moe_dispatch_kernel."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    every = tl.arange(0, SLOTS)
    raw = tl.load(ids_ptr + every, mask=every < tokens_n * K, other=-1)
    bad = (every < tokens_n * K) & ((raw < -1) | (raw >= num_experts))
    if (pid == 0) & (tl.max(bad.to(tl.int32), axis=0) > 0):
        record_argument(status_ptr, ARG_TOPK_IDS, tl.max(tl.where(bad, raw, -(1 << 30)), axis=0).to(tl.int32),
                        num_experts, rank, desc)
    ids = tl.where((raw < 0) | (raw >= num_experts), -1, raw).to(tl.int32)  # (int32 from here: half the registers)
    counts = tl.histogram(ids, E_P2, mask=ids >= 0)
    starts = tl.cumsum(counts, axis=0) - counts
    received = tl.sum(counts, axis=0)
    _counts_and_unused_origins(counts_ptr, origin_ptr, status_ptr, counts, tl.arange(0, E_P2), num_experts, received,
                               max_rows, rank, desc)
    slot = tl.arange(0, TT * KP2)
    j = slot % KP2
    in_group = tl.arange(0, TT)
    lane = tl.arange(0, HB)
    for item in range(pid, tl.cdiv(tokens_n, TT) * parts, nprog):
        first_token = item // parts * TT
        part_start = item % parts * part_words
        part_end = tl.minimum(part_start + part_words, row_words)
        token_ok = (first_token + in_group < tokens_n)[:, None]
        # The rows' first HB words are in flight while their slots are placed.
        rows = tokens_ptr + (first_token + in_group).to(tl.int64)[:, None] * row_words
        values = tl.load(rows + (part_start + lane)[None, :], mask=token_ok & ((part_start + lane)[None, :] < part_end))
        at = (first_token + slot // KP2) * K + j
        valid = (j < K) & (first_token + slot // KP2 < tokens_n)
        mine = tl.load(ids_ptr + at, mask=valid, other=-1)
        mine = tl.where((mine < 0) | (mine >= num_experts), -1, mine).to(tl.int32)
        earlier = tl.sum(((ids[None, :] == mine[:, None]) & (every[None, :] < at[:, None])).to(tl.int32), axis=1)
        dest = tl.gather(starts, tl.where(mine >= 0, mine, 0), 0) + earlier
        kept = valid & (mine >= 0) & (dest < max_rows)
        if part_start == 0:
            tl.store(origin_ptr + dest, at.to(tl.int64), mask=kept)
            tl.store(self_ptr + at, tl.where(kept, dest, -1).to(tl.int64), mask=valid)
        if tl.max(kept.to(tl.int32), axis=0) > 0:
            _store_rows(values, rows, out_ptr + dest.to(tl.int64)[:, None] * row_words, kept, token_ok, part_start,
                        part_end, lane, TT, KP2, HB)
