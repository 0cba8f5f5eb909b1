"""The kernels of MoE dispatch and combine (fused/moe.py: the algorithm, the layouts, the host side).

Dispatch, per round of tokens: ``moe_route_kernel`` (local: stage token rows in my buffer; in the
first round also sanitise topk_ids into my buffer's metadata and count slots per expert per block of
TB tokens, the last program to finish turning the counts into prefixes over blocks and totals), then
``moe_dispatch_kernel`` (entry barrier; pull every token row that has a local expert once from its
source's buffer and store it into each of its local experts' rows; exit barrier).

Combine, per round of tokens: ``moe_push_kernel`` (an expert rank stores each of its output rows into
the landing region of the row's source, at (token, slot)), then ``moe_combine_kernel`` (entry barrier;
each source sums its tokens' slots, weighted, in fp32: a slot of a local expert straight from its own
expert output, the others from its landing region; exit barrier).
"""

import triton
import triton.language as tl

from ..language import (ARG_MAX_ROWS, ARG_TOPK_IDS, announce, block_barrier, copy_blocks, narrow, peer_ptr,
                        record_argument)


@triton.jit
def moe_route_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table; this rank's route counter (int32)
    desc, buffer_ptrs_dev, counter_ptr,
    # this round's token rows (words) and their count in words; topk_ids [T, K] (int32 or int64)
    tokens_ptr, n_words, ids_ptr, tokens_n, num_experts,
    # where in my buffer: block prefixes [NB, E] and totals [E] (int32 words), token rows (token words)
    hist_off, totals_off, tokens_off,
    # ROUTE: the first round (routes); TB tokens per routing block; E_P2 >= num_experts; SCAN_ROWS
    # blocks per step of the scan
    WORLD: tl.constexpr, K: tl.constexpr, KP2: tl.constexpr, TB: tl.constexpr, E_P2: tl.constexpr,
    SCAN_ROWS: tl.constexpr, BLOCK: tl.constexpr, ROUTE: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    copy_blocks(tokens_ptr, peer_ptr(buffer_ptrs_dev, rank, tokens_ptr.dtype.element_ty) + tokens_off, n_words, BLOCK)
    if ROUTE:
        meta = peer_ptr(buffer_ptrs_dev, rank, tl.int32)
        blocks = tl.cdiv(tokens_n, TB)
        slot = tl.arange(0, TB * KP2)
        experts = tl.arange(0, E_P2)
        for b in range(pid, blocks, nprog):
            token = b * TB + slot // KP2
            valid = (token < tokens_n) & (slot % KP2 < K)
            index = token * K + slot % KP2
            raw = tl.load(ids_ptr + index, mask=valid, other=-1)
            bad = valid & ((raw < -1) | (raw >= num_experts))
            if tl.max(bad.to(tl.int32), axis=0) > 0:
                record_argument(status_ptr, ARG_TOPK_IDS, tl.max(tl.where(bad, raw, -(1 << 30)), axis=0).to(tl.int32),
                                num_experts, rank, desc)
            ids = tl.where(bad, -1, raw).to(tl.int32)
            tl.store(meta + index, ids, mask=valid)
            counts = tl.histogram(ids, E_P2, mask=ids >= 0)
            tl.store(meta + hist_off + b * num_experts + experts, counts, mask=experts < num_experts)
        # The last program to get here turns every block's counts into prefixes over blocks: it waits
        # for nobody (the others are done), so neither co-residency nor program order matters.
        tl.debug_barrier()
        if tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == nprog - 1:
            tl.store(counter_ptr, 0)  # ready for the next call
            carry = tl.zeros([E_P2], tl.int32)
            rows = tl.arange(0, SCAN_ROWS)
            for b0 in range(0, blocks, SCAN_ROWS):
                at = meta + hist_off + (b0 + rows)[:, None] * num_experts + experts[None, :]
                valid = ((b0 + rows)[:, None] < blocks) & (experts[None, :] < num_experts)
                counts = tl.load(at, mask=valid, other=0, volatile=True)
                tl.store(at, tl.cumsum(counts, axis=0) - counts + carry[None, :], mask=valid)
                carry += tl.sum(counts, axis=0)
            tl.store(meta + totals_off + experts, carry, mask=experts < num_experts)


@triton.jit
def moe_dispatch_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # outputs: rows by local expert (words), expert counts [EL] int64, row origins [max_rows] int64,
    # my own tokens' rows [T, K] int64
    out_ptr, counts_ptr, origin_ptr, self_ptr,
    tokens_n, row_words, max_rows, num_experts, hist_off, totals_off, tokens_off,
    # this round: routing blocks [first_block, end_block) (the first one staged first in every buffer);
    # each block's rows are moved in `parts` parts of part_words words (programs take (source, block,
    # part) items, so that small batches still keep every program busy)
    first_block, end_block, parts, part_words,
    WORLD: tl.constexpr, K: tl.constexpr, KP2: tl.constexpr, EL: tl.constexpr, ELP2: tl.constexpr,
    TB: tl.constexpr, HB: tl.constexpr, PEERS: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    if block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD) == 0:
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
        if first_block == 0:
            if pid == 0:
                tl.store(counts_ptr + local, expert_total.to(tl.int64), mask=local < EL)
                if received > max_rows:
                    record_argument(status_ptr, ARG_MAX_ROWS, received, max_rows, rank, desc)
            for r0 in range(received + pid * 1024, max_rows, nprog * 1024):
                rows = r0 + tl.arange(0, 1024)
                tl.store(origin_ptr + rows, tl.full([1024], -1, tl.int64), mask=rows < max_rows)
        slot = tl.arange(0, TB * KP2)
        j = slot % KP2
        column = tl.arange(0, KP2)
        lane = tl.arange(0, HB)
        blocks = end_block - first_block
        for item in range(pid, WORLD * blocks * parts, nprog):
            # Sources in the order rank+1, rank+2, ...: the ranks do not all read rank 0 first.
            src = (rank + 1 + item // (blocks * parts)) % WORLD
            b = first_block + item // parts % blocks
            part = item % parts
            meta = peer_ptr(buffer_ptrs_dev, src, tl.int32)
            # Rows of each local expert before this block: earlier experts, earlier sources, earlier blocks.
            before = tl.sum(tl.where(ranks[:, None] == src, starts, 0), axis=0) + \
                tl.load(meta + hist_off + b * num_experts + rank * EL + local, mask=local < EL, other=0)
            token = b * TB + slot // KP2
            valid = (token < tokens_n) & (j < K)
            ids = tl.load(meta + token * K + j, mask=valid, other=-1)
            mine = valid & (ids >= rank * EL) & (ids < (rank + 1) * EL)
            onehot = (mine[:, None] & ((ids - rank * EL)[:, None] == local[None, :])).to(tl.int32)
            dest = tl.sum(onehot * (tl.cumsum(onehot, axis=0) - onehot + before[None, :]), axis=1)
            kept = mine & (dest < max_rows)
            if part == 0:
                tl.store(origin_ptr + dest, (src * tokens_n + token).to(tl.int64) * K + j, mask=kept)
                if src == rank:
                    tl.store(self_ptr + token * K + j, tl.where(kept, dest, -1).to(tl.int64), mask=valid)
            # Each token row with a local expert is read once, and stored for each of its local experts.
            dest2 = tl.reshape(dest, [TB, KP2]).to(tl.int64)
            kept2 = tl.reshape(kept, [TB, KP2]).to(tl.int32)
            wanted = tl.max(kept2, axis=1) > 0
            staged = peer_ptr(buffer_ptrs_dev, src, out_ptr.dtype.element_ty) + tokens_off + \
                ((b - first_block) * TB + tl.arange(0, TB)).to(tl.int64)[:, None] * row_words
            part_end = tl.minimum(part * part_words + part_words, row_words)
            for h0 in range(part * part_words, part_end, HB):
                h = h0 + lane
                in_row = h[None, :] < part_end
                values = tl.load(staged + h[None, :], mask=wanted[:, None] & in_row)
                for slot_j in tl.static_range(K):
                    pick = column[None, :] == slot_j
                    to = tl.sum(tl.where(pick, dest2, 0), axis=1)
                    keep = tl.sum(tl.where(pick, kept2, 0), axis=1) > 0
                    tl.store(out_ptr + to[:, None] * row_words + h[None, :], values, mask=keep[:, None] & in_row)
        # Nobody restages its buffer (next round or call) until every peer has read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


@triton.jit
def moe_push_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the landing region's address table
    desc, landing_ptrs_dev,
    # my expert outputs [max_rows, hidden], expert counts [EL], row origins [max_rows] (from dispatch)
    expert_ptr, counts_ptr, origin_ptr, tokens_n, hidden, max_rows,
    # this round: tokens [t0, t0 + tq) of every source
    t0, tq,
    WORLD: tl.constexpr, K: tl.constexpr, EL: tl.constexpr, ELP2: tl.constexpr, RB: tl.constexpr,
    HB: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    local = tl.arange(0, ELP2)
    rows_held = tl.minimum(tl.sum(tl.load(counts_ptr + local, mask=local < EL, other=0), axis=0), max_rows)
    table = landing_ptrs_dev.to(tl.pointer_type(tl.uint64))
    lane = tl.arange(0, HB)
    steps = tl.cdiv(hidden, HB)
    # One loop over (block of rows, block of a row): each step loads its rows' origins again (cached)
    for step in range(pid, tl.cdiv(rows_held, RB) * steps, nprog):
        row = step // steps * RB + tl.arange(0, RB)
        h = step % steps * HB + lane
        origin = tl.load(origin_ptr + row, mask=row < rows_held, other=-1)
        src = (origin // (tokens_n * K)).to(tl.int32)
        token = (origin // K) % tokens_n
        send = (origin >= 0) & (src != rank) & (token >= t0) & (token < t0 + tq)
        landing = tl.load(table + tl.where(send, src, rank)).to(tl.pointer_type(expert_ptr.dtype.element_ty))
        at = landing + ((token - t0) * K + origin % K) * hidden
        keep = send[:, None] & (h[None, :] < hidden)
        values = tl.load(expert_ptr + row.to(tl.int64)[:, None] * hidden + h[None, :], mask=keep)
        tl.store(at[:, None] + h[None, :], values, mask=keep)


@triton.jit
def moe_combine_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the landing region's address table
    desc, landing_ptrs_dev,
    # my expert outputs [max_rows, hidden]; my tokens' weights and ids [T, K]; my own tokens' rows
    # [T, K] (from dispatch); the result [T, hidden]
    expert_ptr, weights_ptr, ids_ptr, self_ptr, out_ptr, tokens_n, hidden, max_rows, num_experts,
    # this round: my tokens [t0, t0 + tq); rows in `parts` parts of part_words elements (programs take
    # (block of tokens, part) items)
    t0, tq, parts, part_words,
    WORLD: tl.constexpr, K: tl.constexpr, KP2: tl.constexpr, EL: tl.constexpr, TB: tl.constexpr,
    HB: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    if block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD) == 0:
        landing = peer_ptr(landing_ptrs_dev, rank, expert_ptr.dtype.element_ty)
        column = tl.arange(0, KP2)
        lane = tl.arange(0, HB)
        end = tl.minimum(t0 + tq, tokens_n)
        for item in range(pid, tl.cdiv(end - t0, TB) * parts, nprog):
            token = t0 + item // parts * TB + tl.arange(0, TB)
            part = item % parts
            part_end = tl.minimum(part * part_words + part_words, hidden)
            in_round = token < end
            at = token[:, None] * K + column[None, :]
            slots = in_round[:, None] & (column[None, :] < K)
            ids = tl.load(ids_ptr + at, mask=slots, other=-1)
            valid = slots & (ids >= 0) & (ids < num_experts)
            weights = tl.load(weights_ptr + at, mask=valid, other=0).to(tl.float32)
            own_row = tl.load(self_ptr + at, mask=valid, other=-1)
            mine = ids // EL == rank
            # A local slot whose row did not fit max_rows (reported by dispatch) contributes nothing.
            use = valid & (~mine | ((own_row >= 0) & (own_row < max_rows)))
            for h0 in range(part * part_words, part_end, HB):
                h = h0 + lane
                acc = tl.zeros([TB, HB], tl.float32)
                for j in tl.static_range(K):
                    pick = column[None, :] == j
                    use_j = tl.sum(tl.where(pick, use.to(tl.int32), 0), axis=1) > 0
                    from_self = tl.sum(tl.where(pick, mine.to(tl.int32), 0), axis=1) > 0
                    own_j = tl.sum(tl.where(pick, own_row, 0), axis=1).to(tl.int64)
                    landed = ((token - t0) * K + j).to(tl.int64)
                    src = tl.where(from_self[:, None], expert_ptr + own_j[:, None] * hidden,
                                   landing + landed[:, None] * hidden) + h[None, :]
                    values = tl.load(src, mask=use_j[:, None] & (h[None, :] < part_end), other=0).to(tl.float32)
                    acc += values * tl.sum(tl.where(pick, weights, 0.0), axis=1)[:, None]
                tl.store(out_ptr + token.to(tl.int64)[:, None] * hidden + h[None, :],
                         narrow(acc, out_ptr.dtype.element_ty), mask=in_round[:, None] & (h[None, :] < part_end))
        # Nobody pushes into my landing region (next round or call) until I have read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
