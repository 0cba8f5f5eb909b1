"""MoE dispatch and combine (the shape of DeepEP's low-latency API), with routing that never leaves the GPU.

Experts are split evenly over the ranks: expert e lives on rank e // (E / W) as its local expert
e % (E / W). ``moe_dispatch(tokens [T, H], topk_ids [T, k], num_experts)`` sends every token once to each
rank that owns at least one of its experts and returns, on every rank, the rows received laid out by
local expert (then source rank, token, slot: deterministic), the row count of each local expert, and a
handle; ``moe_combine(expert_out, topk_weights, handle)`` returns to every token's rank the sum over its
k slots of weight * (that expert's output row), accumulated in fp32 and rounded once. Slots with an id
outside [0, E) are ignored (DeepEP's -1 for a dropped slot); other bad ids are reported, naming topk_ids.
Nothing is read back to the host: both are CUDA-graph capturable. Every rank passes the same T, H, k, E
and max_recv_rows (part of the call descriptor: a peer that differs is reported).

dispatch ("pull"), per round of tokens::

    rank s:  moe_route_kernel: tokens_s --copy--> buf_s (peers only);  topk_ids_s (sanitised) --> meta_s;
             per block of TB tokens, slots per expert and each slot's rank among its expert's slots
             of the block --> meta_s; the last program: prefixes over blocks, totals --> meta_s (local)
    rank r:  moe_dispatch_kernel: entry barrier;
             offsets of my experts' rows from every source's totals (meta_s, NVLink reads);
             per (source s, token t, part of the row): the rows of my experts t goes to (expert start +
             s's share before + block prefix + rank in block: k slots as one vector), buf_s[t]
             (my own: tokens_r[t]) --read once--> out[each of those rows] (one [k, HB] store);
             row origins (source, token, slot) for combine; exit barrier

combine ("push"), per round of tokens::

    rank r:  moe_push_kernel (W > 1): expert_out_r[row] --NVLink store--> landing_s[token, slot]
    rank s:  moe_combine_kernel: entry barrier; per (token t, part of the row): the k slots' rows as one
             [k, HB] load (expert_out_s[own row] for a local expert, landing_s[t, j] otherwise), weighted
             and summed in fp32 in registers, stored once; exit barrier

Traffic: dispatch reads each token once per destination rank (over NVLink for peers, plus one local
staging copy of the tokens, which are not in symmetric memory: none on one rank) and writes each
received row once; combine stores each remote (token, slot) row once and reads every slot row and
writes every token row once. Tokens that do not fit the buffer (dispatch) or the landing region
(combine, T * k rows) go in rounds, each a pair of launches; every rank derives the rounds from T, H, k
and E; one round on one rank. Launch (programs, warps, elements per step, tokens per item): on one rank
the table measured on this GPU model, else GPU_CONFIG; overridable per call (``plan.resolve(...,
config=)``) for the roofline sweep.

Where the rest lives: the kernels in fused/moe_dispatch_kernels.py (route, pull, one-launch local) and
fused/moe_combine_kernels.py (push, combine), the one-rank dispatch variants 2-4 and 6 in
fused/moe_dispatch_ranges.py and fused/moe_pull_folded.py; the shape rules and launch rules (GPU_CONFIG,
TOKENS_PER_ITEM, the dispatch variants, row parts) in fused/moe_rules.py. This file: the regions, the
launches of each round, the "nccl" wrappers, the op declarations and the compile cases.

Compared with torch's ``all_to_all_single`` (the "nccl" algorithm, fused/moe_nccl.py), which needs the
counts on the host (one read per dispatch) and a gather/scatter around each exchange, this is
two launches and two barriers per round, no host synchronisation, and no expansion or reordering pass.
"""

from __future__ import annotations

import torch
import triton

from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..ops import OpSpec, resolve_group, world_size
from ..ops import declare as declare_op
from ..plan import Algorithm, Plan, Request, resolve
from . import moe_dispatch_ranges, moe_nccl
from .moe_combine_kernels import moe_combine_kernel, moe_push_kernel
from .moe_dispatch_kernels import moe_dispatch_kernel, moe_dispatch_local_kernel, moe_route_kernel
from .moe_pull_folded import moe_pull_folded_kernel
from .moe_rules import (DISPATCH_VARIANT, LOCAL_ROUTE_SLOTS, PUSH_ROWS, as_words, ceil16, combine_shape, dispatch_shape,
                        option, pick_launch, ranges_chunk, routing_tiles, row_parts, runs_folded, scan_rows)

LANDING = declare(RegionSpec(
    "moe.landing", "moe", lambda g: g.buffer_bytes // 2,
    "expert ranks store a round's (token, slot) rows into the source's landing region before the source's "
    "entry barrier; the source reads it between its entry and exit barriers; the next round's (or call's) "
    "stores come after that exit barrier"))
COUNTER = declare(RegionSpec("moe.route_counter", "moe", lambda g: 1,
                             "programs of the route kernel that are done (the last one resets it)", symmetric=False))


def _dispatch(plan: Plan, tokens: torch.Tensor, out: torch.Tensor, topk_ids: torch.Tensor):
    ws, world, rank = plan.ws, plan.world, plan.rank
    tokens_n, k = topk_ids.shape
    experts = option(plan.request, "num_experts")
    local_experts, max_rows = experts // world, out.shape[0]
    words, out_words = as_words(tokens), as_words(out)
    row = tokens.shape[1] * tokens.element_size() // words.element_size()
    cfg, tt, local_slots, variant = pick_launch(plan, "moe_dispatch", tokens_n, tokens.shape[1], k, experts)
    tiles = routing_tiles(k, local_experts)
    counts = torch.empty(local_experts, dtype=torch.int64, device=tokens.device)
    origin = torch.empty(max_rows, dtype=torch.int64, device=tokens.device)
    self_rows = torch.empty((tokens_n, k), dtype=torch.int64, device=tokens.device)
    e_p2 = triton.next_power_of_2(experts)
    slots = triton.next_power_of_2(max(tokens_n * k, 1))
    if world == 1 and variant in (2, 3, 4):  # one launch: each program routes a range of tokens
        parts, part_words, hb = row_parts(row, triton.cdiv(max(tokens_n, 1), tt), cfg, tt * tiles["KP2"])
        range_tokens, programs = moe_dispatch_ranges.ranges_grid(tokens_n, cfg.max_programs, parts, tt)
        route_slots = moe_dispatch_ranges.route_all_slots(range_tokens, tiles["KP2"], e_p2) if variant == 4 else 0
        launch(moe_dispatch_ranges.moe_dispatch_ranges_kernel, (programs,),
               (*ws.kernel_args, plan.desc, words, topk_ids, out_words, counts, origin, self_rows, tokens_n, row,
                max_rows, experts, range_tokens, parts, part_words),
               dict(K=k, KP2=tiles["KP2"], E_P2=e_p2, CHUNK=ranges_chunk(ws.device.type, cfg.num_warps), TT=tt, HB=hb,
                    AHEAD=variant >= 3, ROUTE_ALL=route_slots > 0, RS=max(route_slots, 1), num_warps=cfg.num_warps))
        return out, counts, origin, self_rows
    if world == 1 and slots <= local_slots:  # one launch: every program routes every slot itself
        parts, part_words, hb = row_parts(row, triton.cdiv(max(tokens_n, 1), tt), cfg, tt * tiles["KP2"])
        launch(moe_dispatch_local_kernel, cfg.grid(triton.cdiv(max(tokens_n, 1), tt) * parts),
               (*ws.kernel_args, plan.desc, words, topk_ids, out_words, counts, origin, self_rows, tokens_n, row,
                max_rows, experts, parts, part_words),
               dict(K=k, KP2=tiles["KP2"], E_P2=e_p2, SLOTS=slots, TT=tt, HB=hb, num_warps=cfg.num_warps))
        return out, counts, origin, self_rows
    tb = tiles["TB"]
    blocks = triton.cdiv(tokens_n, tb)
    fold = runs_folded(variant, blocks, e_p2, world)
    # My buffer: sanitised ids [T, k], in-block ranks [T, k], block prefixes [blocks, E] (variant 6:
    # [blocks, E_P2]), totals [E] (int32), then this round's token rows for the peers.
    rank_off = ceil16(tokens_n * k)
    hist_off = rank_off + ceil16(tokens_n * k)
    totals_off = hist_off + ceil16(blocks * (e_p2 if fold else experts))
    meta_bytes = (totals_off + ceil16(experts)) * 4
    if meta_bytes > ws.buffer_bytes:
        raise ValueError(f"tokens: the routing metadata of {tokens_n} tokens ({meta_bytes} bytes) does not fit the "
                         f"{ws.buffer_bytes}-byte workspace (SYMMCOLL_WORKSPACE_BYTES)")
    # One round on one rank (nothing is staged); else as many rows as the buffer holds beside the metadata.
    per_round = max(tokens_n, 1) if world == 1 else \
        (ws.buffer_bytes - meta_bytes) // max(1, row * words.element_size())
    if per_round == 0:
        raise ValueError(f"tokens: a row of {row * words.element_size()} bytes does not fit the "
                         f"{ws.buffer_bytes}-byte workspace beside the routing metadata (SYMMCOLL_WORKSPACE_BYTES)")
    tq = min(tokens_n, per_round)
    parts, part_words, hb = row_parts(row, world * triton.cdiv(tq, tt), cfg, tt * tiles["KP2"])
    stage_words = tq * row if world > 1 else 0
    route_grid = cfg.grid(max(blocks, triton.cdiv(stage_words, 4096)))
    for t0 in range(0, max(tokens_n, 1), per_round):
        n = min(per_round, tokens_n - t0)
        launch(moe_route_kernel, route_grid,
               (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, ws.local_state(COUNTER.name), words[t0 * row:],
                n * row if world > 1 else 0, topk_ids, tokens_n, experts, rank_off, hist_off, totals_off,
                meta_bytes // words.element_size()),
               dict(WORLD=world, K=k, KP2=tiles["KP2"], TB=tb, E_P2=e_p2, SCAN_ROWS=scan_rows(blocks, e_p2, world),
                    BLOCK=4096, ROUTE=t0 == 0, STAGE=world > 1, FOLD=fold, num_warps=8))
        if fold:  # one rank, one round; my buffer's words directly (no address table to load first)
            launch(moe_pull_folded_kernel, cfg.grid(triton.cdiv(max(n, 1), tt) * parts),
                   (*ws.kernel_args, plan.desc, ws.buffer.view(torch.int32), words, out_words, counts, origin,
                    self_rows, tokens_n, row, max_rows, experts, rank_off, hist_off, totals_off, parts, part_words),
                   dict(K=k, KP2=tiles["KP2"], E_P2=e_p2, TB=tb, TT=tt, HB=hb, num_warps=cfg.num_warps))
            continue
        launch(moe_dispatch_kernel, cfg.grid(world * triton.cdiv(max(n, 1), tt) * parts),
               (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, words[t0 * row:], out_words, counts, origin,
                self_rows, tokens_n, row, max_rows, experts, rank_off, hist_off, totals_off,
                meta_bytes // words.element_size(), t0, n, parts, part_words),
               dict(WORLD=world, K=k, EL=local_experts, PEERS=triton.next_power_of_2(world), TT=tt, HB=hb,
                    AHEAD=world == 1 and variant in (5, 6), num_warps=cfg.num_warps, **tiles))
    return out, counts, origin, self_rows


def _combine(plan: Plan, expert_out: torch.Tensor, out: torch.Tensor, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor, counts: torch.Tensor, origin: torch.Tensor, self_rows: torch.Tensor):
    ws, world = plan.ws, plan.world
    tokens_n, k = topk_ids.shape
    hidden, max_rows = expert_out.shape[1], expert_out.shape[0]
    experts = option(plan.request, "num_experts")
    local_experts = experts // world
    (cfg, tt, _, _), kp2 = pick_launch(plan, "moe_combine", tokens_n, hidden, k, experts), triton.next_power_of_2(k)
    landing = ws.region(LANDING.name)
    # One round on one rank (nothing lands); else as many tokens' k rows as the landing region holds.
    per_round = max(tokens_n, 1) if world == 1 else \
        landing.local.numel() // expert_out.element_size() // max(1, k * hidden)
    if per_round == 0:
        raise ValueError(f"expert_out: {k} rows of {hidden} elements per token do not fit the landing region "
                         f"({landing.local.numel()} bytes; SYMMCOLL_WORKSPACE_BYTES)")
    tq = min(tokens_n, per_round)
    parts, part_len, hb = row_parts(hidden, triton.cdiv(tq, tt), cfg, tt * kp2)
    push_parts, push_len, push_hb = row_parts(hidden, triton.cdiv(max_rows, PUSH_ROWS), cfg, PUSH_ROWS)
    for t0 in range(0, max(tokens_n, 1), per_round):
        n = min(per_round, tokens_n - t0)
        if world > 1:
            launch(moe_push_kernel, cfg.grid(triton.cdiv(max_rows, PUSH_ROWS) * push_parts),
                   (*ws.kernel_args, plan.desc, landing.ptrs_dev, expert_out, counts, origin, tokens_n, hidden,
                    max_rows, t0, n, push_parts, push_len),
                   dict(WORLD=world, K=k, EL=local_experts, ELP2=triton.next_power_of_2(local_experts), RB=PUSH_ROWS,
                        HB=push_hb, num_warps=cfg.num_warps))
        launch(moe_combine_kernel, cfg.grid(triton.cdiv(max(n, 1), tt) * parts),
               (*ws.kernel_args, plan.desc, landing.ptrs_dev, expert_out, topk_weights, topk_ids, self_rows, out,
                tokens_n, hidden, max_rows, experts, local_experts, t0, n, parts, part_len),
               dict(WORLD=world, K=k, KP2=kp2, TT=tt, HB=hb, num_warps=cfg.num_warps))
    return out


def _dispatch_nccl(plan: Plan, tokens, out, topk_ids):
    """torch's all_to_all_single, one host read of the counts (fused/moe_nccl.py); its return route is
    kept for the combine."""
    recv, counts, origin, self_rows, route = moe_nccl.dispatch(tokens, topk_ids, option(plan.request, "num_experts"),
                                                               plan.group, out.shape[0], out)
    moe_nccl.remember(origin, route)
    return recv, counts, origin, self_rows


def _combine_nccl(plan: Plan, expert_out, out, topk_weights, topk_ids, counts, origin, self_rows):
    experts = option(plan.request, "num_experts")
    return moe_nccl.combine(expert_out, topk_weights, topk_ids, experts,
                            moe_nccl.route_for(origin, topk_ids, experts, plan.group), out)


def moe_dispatch_impl(tokens, topk_ids, num_experts: int, max_recv_rows: int, group_name: str, algorithm: str):
    return resolve("moe_dispatch", tokens, resolve_group(group_name), algorithm, others=(topk_ids,),
                   options=(("num_experts", num_experts), ("max_rows", max_recv_rows))).execute(tokens,
                                                                                               others=(topk_ids,))


def moe_combine_impl(expert_out, topk_weights, topk_ids, expert_counts, row_origin, self_rows, num_experts: int,
                     group_name: str, algorithm: str):
    others = (topk_weights, topk_ids, expert_counts, row_origin, self_rows)
    return resolve("moe_combine", expert_out, resolve_group(group_name), algorithm, others=others,
                   options=(("num_experts", num_experts),)).execute(expert_out, others=others)


def _dispatch_fake(tokens, topk_ids, num_experts, max_recv_rows, group_name, algorithm):
    local_experts = num_experts // world_size(group_name)
    return (tokens.new_empty((max_recv_rows, tokens.shape[1])), topk_ids.new_empty((local_experts,), dtype=torch.int64),
            topk_ids.new_empty((max_recv_rows,), dtype=torch.int64),
            topk_ids.new_empty(topk_ids.shape, dtype=torch.int64))


def _combine_fake(expert_out, topk_weights, topk_ids, expert_counts, row_origin, self_rows, num_experts, group_name,
                  algorithm):
    return expert_out.new_empty((topk_ids.shape[0], expert_out.shape[1]))


DISPATCH = declare_op(OpSpec(
    "moe_dispatch", "(Tensor tokens, Tensor topk_ids, int num_experts, int max_recv_rows, str group_name, "
                    "str algorithm) -> (Tensor, Tensor, Tensor, Tensor)", moe_dispatch_impl, _dispatch_fake,
    inputs=("tokens", "topk_ids"), shape_rule=dispatch_shape, default="pull",
    algorithms=(Algorithm("moe_dispatch", "pull", 100, "moe", _dispatch,
                          "route locally, barrier, pull each token once per rank into its experts' rows", None),
                Algorithm("moe_dispatch", "nccl", 101, "backend", _dispatch_nccl,
                          "torch all_to_all_single of rows and ids, one host read of the counts (.tolist())",
                          None))))
COMBINE = declare_op(OpSpec(
    "moe_combine", "(Tensor expert_out, Tensor topk_weights, Tensor topk_ids, Tensor expert_counts, "
                   "Tensor row_origin, Tensor self_rows, int num_experts, str group_name, str algorithm) -> Tensor",
    moe_combine_impl, _combine_fake,
    inputs=("expert_out", "topk_weights", "topk_ids", "handle.expert_counts", "handle.row_origin", "handle.self_rows"),
    shape_rule=combine_shape, default="push",
    algorithms=(Algorithm("moe_combine", "push", 102, "moe", _combine,
                          "push expert rows to their tokens' ranks, barrier, weighted fp32 sum per token", None),
                Algorithm("moe_combine", "nccl", 103, "backend", _combine_nccl,
                          "torch all_to_all_single back (splits from the dispatch), weighted fp32 sum per token",
                          None))))

def compile_cases(make_workspace):
    """(label, thunk) launches on meta tensors for the compile checks: 1 (no staging, no push; dispatch
    variants 0 to 6), 2, 3 and 4 ranks, bf16, fp8 and fp32, top-2 of 8, top-8 of 64 and 256
    experts, an odd hidden size."""
    cases = []
    for world, dtype, experts, k, hidden, local_slots, variant in (
            (1, torch.bfloat16, 256, 8, 7168, 0, 0), (1, torch.bfloat16, 256, 8, 7168, 4096, 0),
            (1, torch.float32, 8, 2, 5, 1024, 0), (1, torch.bfloat16, 256, 8, 7168, 0, 2),
            (1, torch.float32, 8, 2, 5, 0, 3), (1, torch.float8_e4m3fn, 64, 2, 4096, 0, 2),
            (1, torch.bfloat16, 64, 8, 4096, 0, 3), (1, torch.bfloat16, 256, 2, 4096, 0, 4),
            (1, torch.float32, 8, 2, 5, 0, 4), (1, torch.bfloat16, 256, 8, 4096, 0, 5),
            (1, torch.float32, 8, 2, 5, 0, 5), (1, torch.bfloat16, 256, 8, 4096, 0, 6),
            (1, torch.float32, 8, 2, 5, 0, 6),
            (2, torch.bfloat16, 8, 2, 4096, 0, 0), (4, torch.float8_e4m3fn, 64, 8, 7168, 0, 0),
            (3, torch.float32, 6, 3, 5, 0, 0)):
        def thunk(world=world, dtype=dtype, experts=experts, k=k, hidden=hidden, local_slots=local_slots,
                  variant=variant):
            saved = LOCAL_ROUTE_SLOTS["cuda"], DISPATCH_VARIANT["cuda"]
            LOCAL_ROUTE_SLOTS["cuda"], DISPATCH_VARIANT["cuda"] = local_slots, variant
            try:
                _compile_case(make_workspace, world, dtype, experts, k, hidden)
            finally:
                LOCAL_ROUTE_SLOTS["cuda"], DISPATCH_VARIANT["cuda"] = saved
        cases.append((f"moe.{world}ranks.{dtype}.top{k}of{experts}.local{local_slots}.v{variant}", thunk))
    return cases


def _compile_case(make_workspace, world, dtype, experts, k, hidden):
    """One rank's dispatch and (16- and 32-bit floats) combine of 300 tokens on meta tensors."""
    rank = min(1, world - 1)
    ws = make_workspace(world, rank)
    meta = torch.device("meta")
    tokens = torch.empty(300, hidden, dtype=dtype, device=meta)
    ids = torch.empty(300, k, dtype=torch.int64, device=meta)
    max_rows = 300 * world * min(k, experts // world)
    request = Request("moe_dispatch", tuple(tokens.shape), dtype, meta,
                      others=(((300, k), torch.int64, meta),),
                      options=(("num_experts", experts), ("max_rows", max_rows)))
    plan = Plan(request, "kernel", None, None, world, rank, ws, None, 3, (max_rows, hidden))
    out = torch.empty(max_rows, hidden, dtype=dtype, device=meta)
    _, counts, origin, self_rows = _dispatch(plan, tokens, out, ids)
    if dtype.is_floating_point and dtype.itemsize > 1:
        combined = torch.empty(300, hidden, dtype=dtype, device=meta)
        _combine(plan, out, combined, torch.empty(300, k, device=meta), ids, counts, origin, self_rows)
