"""The kernels of MoE combine (fused/moe.py: the algorithm, the layouts, the host side; the dispatch's
kernels, which lay out the rows these read, are fused/moe_dispatch_kernels.py).

Per round of tokens: ``moe_push_kernel`` (more than one rank only: an expert rank stores each of its
output rows into the landing region of the row's source, at (token, slot)), then ``moe_combine_kernel``
(entry barrier; each source sums its tokens' slots, weighted, in fp32: a slot of a local expert straight
from its own expert output, the others from its landing region; exit barrier).

Kept apart from the dispatch's kernels: combine runs on the layout dispatch left (row origins, each own
token's rows) and shares no device code with it, so each direction reads on its own. A step is one
[KP2, HB] load of every slot's row of a token, reduced in registers; the push moves [RB, HB] tiles of RB
rows. Row addresses are per-row scalars plus a contiguous range (no per-element pointers). Sizes and
offsets that only count are not specialised (``do_not_specialize``): one compiled kernel serves every
batch of a shape class.
"""

import triton
import triton.language as tl

from ..language import block_barrier, narrow, open_call, peer_ptr


@triton.jit(do_not_specialize=["tokens_n", "max_rows", "t0", "tq", "parts"])
def moe_push_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the landing region's address table
    desc, landing_ptrs_dev,
    # my expert outputs [max_rows, hidden], expert counts [EL], row origins [max_rows] (from dispatch)
    expert_ptr, counts_ptr, origin_ptr, tokens_n, hidden, max_rows,
    # this round: tokens [t0, t0 + tq) of every source; rows in `parts` parts of part_len elements
    # (programs take (block of RB rows, part) items)
    t0, tq, parts, part_len,
    WORLD: tl.constexpr, K: tl.constexpr, EL: tl.constexpr, ELP2: tl.constexpr, RB: tl.constexpr,
    HB: tl.constexpr,
):
    pid, nprog = open_call(signal_pad_ptrs_dev, desc, rank, WORLD)
    local = tl.arange(0, ELP2)
    rows_held = tl.minimum(tl.sum(tl.load(counts_ptr + local, mask=local < EL, other=0), axis=0), max_rows)
    table = landing_ptrs_dev.to(tl.pointer_type(tl.uint64))
    lane = tl.arange(0, HB)
    in_block = tl.arange(0, RB)
    for item in range(pid, tl.cdiv(rows_held, RB) * parts, nprog):
        rows = item // parts * RB + in_block
        part = item % parts
        part_end = tl.minimum(part * part_len + part_len, hidden)
        # The block's rows that go out in this round, and where each lands (its source's region).
        origins = tl.load(origin_ptr + rows, mask=rows < rows_held, other=-1)
        token = (origins // K) % tokens_n
        src = (origins // (tokens_n * K)).to(tl.int32)
        send = (origins >= 0) & (src != rank) & (token >= t0) & (token < t0 + tq)
        if tl.max(send.to(tl.int32), axis=0) > 0:
            landing = tl.multiple_of(tl.load(table + tl.where(send, src, rank)).to(
                tl.pointer_type(expert_ptr.dtype.element_ty)), 16)
            to = landing + ((token - t0) * K + origins % K) * hidden
            read = expert_ptr + rows.to(tl.int64) * hidden
            for h0 in range(part * part_len, part_end, HB):
                h = h0 + lane
                keep = send[:, None] & (h[None, :] < part_end)
                tl.store(to[:, None] + h[None, :], tl.load(read[:, None] + h[None, :], mask=keep), mask=keep)


@triton.jit(do_not_specialize=["tokens_n", "max_rows", "num_experts", "local_experts", "t0", "tq", "parts"])
def moe_combine_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the landing region's address table
    desc, landing_ptrs_dev,
    # my expert outputs [max_rows, hidden]; my tokens' weights and ids [T, K]; my own tokens' rows
    # [T, K] (from dispatch); the result [T, hidden]
    expert_ptr, weights_ptr, ids_ptr, self_ptr, out_ptr, tokens_n, hidden, max_rows, num_experts, local_experts,
    # this round: my tokens [t0, t0 + tq); rows in `parts` parts of part_len elements (programs take
    # (TT tokens, part) items)
    t0, tq, parts, part_len,
    WORLD: tl.constexpr, K: tl.constexpr, KP2: tl.constexpr, TT: tl.constexpr, HB: tl.constexpr,
):
    pid, nprog = open_call(signal_pad_ptrs_dev, desc, rank, WORLD)
    if block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD) == 0:
        landing = peer_ptr(landing_ptrs_dev, rank, expert_ptr.dtype.element_ty)
        slot = tl.arange(0, TT * KP2)
        in_group = tl.arange(0, TT)
        lane = tl.arange(0, HB)
        end = tl.minimum(t0 + tq, tokens_n)
        groups = tl.cdiv(end - t0, TT)
        for item in range(pid, groups * parts, nprog):
            first_token = t0 + item // parts * TT
            part_start = item % parts * part_len
            part_end = tl.minimum(part_start + part_len, hidden)
            token = first_token + slot // KP2
            at = token * K + slot % KP2
            in_round = (slot % KP2 < K) & (token < end)
            # A slot's row in my expert output comes from dispatch (-1 where the slot has none), so the
            # rows' loads wait for one load, not for the ids first.
            own_row = tl.load(self_ptr + at, mask=in_round, other=-1)
            own_ok = (own_row >= 0) & (own_row < max_rows)
            if WORLD == 1:  # every expert is mine: the slots with a row are the ones used
                use = in_round & own_ok
                rows = expert_ptr + own_row * hidden
            else:
                ids = tl.load(ids_ptr + at, mask=in_round, other=-1)
                mine = ids // local_experts == rank
                # A local slot whose row did not fit max_rows (reported by dispatch) contributes nothing.
                use = in_round & (ids >= 0) & (ids < num_experts) & (~mine | own_ok)
                rows = tl.where(mine, expert_ptr + own_row * hidden, landing + (at - t0 * K).to(tl.int64) * hidden)
            weights = tl.where(use, tl.load(weights_ptr + at, mask=in_round, other=0).to(tl.float32), 0.0)
            out_rows = out_ptr + (first_token + in_group).to(tl.int64)[:, None] * hidden
            out_ok = (first_token + in_group < end)[:, None]
            values = tl.load(rows[:, None] + (part_start + lane)[None, :],
                             mask=use[:, None] & ((part_start + lane)[None, :] < part_end), other=0)
            for h0 in range(part_start, part_end, HB):
                # The next HB elements of every slot's row are in flight while these are summed.
                ahead = h0 + HB + lane
                upcoming = tl.load(rows[:, None] + ahead[None, :], mask=use[:, None] & (ahead[None, :] < part_end),
                                   other=0)
                acc = tl.sum(tl.reshape(values.to(tl.float32) * weights[:, None], (TT, KP2, HB)), axis=1)
                h = h0 + lane
                tl.store(out_rows + h[None, :], narrow(acc, out_ptr.dtype.element_ty),
                         mask=out_ok & (h[None, :] < part_end))
                values = upcoming
        # Nobody pushes into my landing region (next round or call) until I have read it.
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
