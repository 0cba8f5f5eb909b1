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

Compared with torch's ``all_to_all_single`` (the "nccl" algorithm, fused/moe_nccl.py), which needs the
counts on the host (one read per dispatch) and a gather/scatter around each exchange, this is
two launches and two barriers per round, no host synchronisation, and no expansion or reordering pass.
"""

from __future__ import annotations

import operator

import torch
import triton

from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..ops import OpSpec, resolve_group, world_size
from ..ops import declare as declare_op
from ..plan import CPU_CONFIG, Algorithm, LaunchConfig, Plan, Request, resolve
from . import memory_bound_configs, moe_dispatch_ranges, moe_nccl
from .moe_kernels import (moe_combine_kernel, moe_dispatch_kernel, moe_dispatch_local_kernel, moe_push_kernel,
                          moe_route_kernel)
from .moe_pull_folded import moe_pull_folded_kernel

LANDING = declare(RegionSpec(
    "moe.landing", "moe", lambda g: g.buffer_bytes // 2,
    "expert ranks store a round's (token, slot) rows into the source's landing region before the source's "
    "entry barrier; the source reads it between its entry and exit barriers; the next round's (or call's) "
    "stores come after that exit barrier"))
COUNTER = declare(RegionSpec("moe.route_counter", "moe", lambda g: 1,
                             "programs of the route kernel that are done (the last one resets it)", symmetric=False))
# block = elements moved per step over a token's rows, max_programs, warps. In the first roofline run
# (2026-11-24, one H200) 528 programs beat 1024 by 5-20% at 4096 tokens top-8 (dispatch 162 vs 196 us,
# combine 157 vs 165 at hidden 7168, 64 experts) and lost <= 7% at top-2; likely why: at 72-94
# registers a thread only 5-7 such programs fit an SM (528 = 4 per SM all start at once, 1024 do not).
GPU_CONFIG = LaunchConfig(block=8192, max_programs=528, num_warps=4)
# Rows of expert output per push item (their origins are read as one vector, their parts as one tile).
PUSH_ROWS = 16
# Tokens per dispatch/combine item: one on GPU (a step is the token's k rows: no cross-thread shuffles);
# 16 on CPU, where every interpreted item costs milliseconds.
TOKENS_PER_ITEM = {"cuda": 1, "cpu": 16}
# Dispatch variants on one rank (more than one rank: always 0), numbered; the roofline sweep times each
# and the table's ``variant`` and ``local_slots`` pick per shape:
#   0: the routing launch, then the pull launch (moe_route_kernel + moe_dispatch_kernel); or, when the
#      slots (T * k, rounded up to a power of 2) are at most LOCAL_ROUTE_SLOTS (0: never), variant
#   1: one launch, every program ranks every slot (moe_dispatch_local_kernel);
#   2: one launch, each program routes a range of tokens after one histogram pass over every slot
#      (fused/moe_dispatch_ranges.py); 3: 2 with the next item's loads issued before this item's stores;
#   4: 3 with every slot of a range routed before its copies (and a cheaper histogram pass);
#   5: 0 with the pull's next item (row, ids, in-block ranks) loaded before this item's stores;
#   6: the routing launch with each block's prefixes folded with the experts' starts, then a pull with
#      no metadata round trip between two items' stores (fused/moe_pull_folded.py); where the route
#      kernel's scan takes more than one step (> SCAN_MAX_ROWS blocks at many experts), 5.
# On GPU without a table entry: 0 (two launches); on CPU the world-size-1 tests run each.
LOCAL_ROUTE_SLOTS = {"cuda": 0, "cpu": 4096}
DISPATCH_VARIANT = {"cuda": 0, "cpu": 0}


def _ranges_chunk(device_type: str, num_warps: int) -> int:
    """Slots per step of variants 2 and 3's routing pass (each program reads every slot's id once): 4 per
    thread on GPU (pipelined in 3 stages through shared memory: <= 128 registers at 4 warps, ptxas sm_90a;
    8 per thread took 150-200: fewer programs per SM); on CPU chunks that end inside the tests' ranges."""
    return 4 * 32 * num_warps if device_type == "cuda" else 256


# The route kernel's scan: its steps are dependent (load, cumsum, store: ~0.5-1 us each on an H100:
# moe_route took 5.0 us with one step of [64, 64] at 1024 tokens, 6.3 with four of [16, 256], 13.6 with
# sixteen at 4096 tokens), so every block goes in one step where they fit SCAN_MAX_ROWS rows of at most
# SCAN_TILE counts; else steps of 4096 counts as before. (sm_90 compiles: one step of [64, 256] takes
# 255 registers, no spill: one route program an SM, which the <= 64 programs of such a grid can afford
# on one rank; with peers the same programs also stage the tokens (a grid of up to max_programs), so
# there the steps stay as they were. [256, 64] spilled 408 bytes and took 64 KB of shared memory.)
SCAN_TILE = 16384
SCAN_MAX_ROWS = 64


def _scan_rows(blocks: int, e_p2: int, world: int) -> int:
    """SCAN_ROWS of the route kernel (blocks per step of its scan) for ``blocks`` routing blocks of E_P2
    experts."""
    rows = triton.next_power_of_2(max(blocks, 1))
    one_step = world == 1 and rows <= SCAN_MAX_ROWS and rows * e_p2 <= SCAN_TILE
    return max(rows if one_step else 1, 4096 // e_p2, 1)


def _folds(variant: int, blocks: int, e_p2: int, world: int) -> bool:
    """Whether dispatch variant 6 runs as itself: one rank, and the route kernel's scan of ``blocks``
    routing blocks in one step (the folded prefixes need the totals before any prefix is stored)."""
    return variant == 6 and world == 1 and _scan_rows(blocks, e_p2, world) >= blocks


def _option(request: Request, name: str):
    return dict(request.options)[name]


def _routing_checks(tokens_n: int, topk, num_experts, world: int) -> int:
    shape, dtype, device = topk
    if len(shape) != 2 or shape[0] != tokens_n or dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids must be an int32/int64 tensor of shape ({tokens_n}, k), got {dtype} of shape "
                         f"{shape}")
    if not 1 <= shape[1] <= 64:
        raise ValueError(f"topk_ids must have 1 to 64 slots per token, got {shape[1]}")
    try:
        num_experts = operator.index(num_experts)
    except TypeError:
        raise ValueError(f"num_experts must be an int, got {num_experts!r}") from None
    if num_experts < world or num_experts % world:
        raise ValueError(f"num_experts must be a positive multiple of the world size {world} (experts are split "
                         f"evenly over the ranks), got {num_experts}")
    return num_experts


def dispatch_shape(request: Request, world: int) -> tuple[tuple, int]:
    shape = request.shape
    if len(shape) != 2:
        raise ValueError(f"tokens must be 2-D [T, H], got shape {shape}")
    if request.dtype.itemsize not in (1, 2, 4, 8):
        raise ValueError(f"tokens.dtype {request.dtype} has no word type")
    topk = request.others[0]
    if topk[2] != request.device:
        raise ValueError(f"topk_ids must be on tokens' device ({request.device}), got {topk[2]}")
    experts = _routing_checks(shape[0], topk, _option(request, "num_experts"), world)
    max_rows = _option(request, "max_rows")
    if not isinstance(max_rows, int) or max_rows < 0:
        raise ValueError(f"max_recv_rows must be an int >= 0, got {max_rows!r}")
    return (max_rows, shape[1]), hash((shape, topk[0], experts, max_rows)) & ((1 << 62) - 1)


def combine_shape(request: Request, world: int) -> tuple[tuple, int]:
    shape = request.shape
    if len(shape) != 2 or request.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"expert_out must be a 2-D bf16/fp16/fp32 tensor [max_recv_rows, H], got {request.dtype} "
                         f"of shape {shape}")
    weights, topk = request.others[0], request.others[1]
    tokens_n = topk[0][0] if len(topk[0]) == 2 else -1
    experts = _routing_checks(tokens_n, topk, _option(request, "num_experts"), world)
    if weights[0] != topk[0] or not weights[1].is_floating_point:
        raise ValueError(f"topk_weights must be a float tensor shaped like topk_ids {topk[0]}, got {weights[1]} of "
                         f"shape {weights[0]}")
    for (other_shape, _, other_device), name in zip(request.others, ("topk_weights", "topk_ids", "handle")):
        if other_device != request.device:
            raise ValueError(f"{name} must be on expert_out's device ({request.device}), got {other_device}")
    if request.others[3][0] != (shape[0],):
        raise ValueError(f"expert_out must have the handle's max_recv_rows = {request.others[3][0][0]} rows, got "
                         f"{shape[0]}")
    return (tokens_n, shape[1]), hash((shape, topk[0], experts, 7)) & ((1 << 62) - 1)


def _tiles(k: int, local_experts: int) -> dict:
    """Routing constexprs: KP2 slots, ELP2 local experts, TB tokens per routing block (TB * KP2 = 128
    slots: the in-block ranking compares them in chunks of 32)."""
    kp2 = triton.next_power_of_2(k)
    return dict(KP2=kp2, ELP2=triton.next_power_of_2(local_experts), TB=max(1, 128 // kp2))


def _config(plan: Plan, op: str, tokens_n: int, hidden: int, k: int,
            experts: int) -> tuple[LaunchConfig, int, int, int]:
    """(launch, tokens per item, LOCAL_ROUTE_SLOTS, DISPATCH_VARIANT) of ``op``: ``block`` = elements
    (words) moved per step summed over a token's KP2 rows, ``max_programs``, ``num_warps``. The plan's
    (``plan.resolve(..., config=)``, with the module's TOKENS_PER_ITEM, LOCAL_ROUTE_SLOTS and
    DISPATCH_VARIANT: the roofline sweep); on one GPU rank the table measured on this GPU model
    (fused/memory_bound_configs.py, by tokens x hidden x top-k x experts); else GPU_CONFIG; the CPU's on
    CPU."""
    device = plan.ws.device
    if device.type != "cuda":
        return CPU_CONFIG, TOKENS_PER_ITEM[device.type], LOCAL_ROUTE_SLOTS[device.type], DISPATCH_VARIANT["cpu"]
    untuned = (TOKENS_PER_ITEM["cuda"], LOCAL_ROUTE_SLOTS["cuda"], DISPATCH_VARIANT["cuda"])
    if plan.config is not None:
        return (plan.config, *untuned)
    entry = None if plan.world > 1 else memory_bound_configs.moe_entry(
        memory_bound_configs.device_table(device), op, tokens_n, hidden, k, experts)
    return memory_bound_configs.moe_config(entry) if entry else (GPU_CONFIG, *untuned)


def _split(row: int, items: int, cfg: LaunchConfig, rows_per_step: int) -> tuple[int, int, int]:
    """(parts, part length, HB) for ``items`` row groups: rows cut in parts when there are too few items
    to keep every program busy (small batches), parts of at least 256 elements (multiples of 16:
    16-byte accesses stay aligned); HB = elements of a row per step (``cfg.block`` over the
    ``rows_per_step`` rows of a step), at most the part."""
    parts = max(1, min(triton.cdiv(2 * cfg.max_programs, max(items, 1)), triton.cdiv(row, 256)))
    part_len = triton.cdiv(triton.cdiv(max(row, 1), parts), 16) * 16
    return parts, part_len, max(16, min(cfg.block // rows_per_step, triton.next_power_of_2(part_len)))


def _words(t: torch.Tensor) -> torch.Tensor:
    """Rows as the widest words (<= 4 bytes) dividing them: fewer, wider accesses."""
    row_bytes = t.shape[1] * t.element_size()
    size = 4 if row_bytes % 4 == 0 else (2 if row_bytes % 2 == 0 else 1)
    flat = t.reshape(-1).view(torch.uint8)
    if flat.data_ptr() % size:
        flat = flat.clone()
    return flat.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[size])


def _ceil16(n: int) -> int:
    return -(-n // 16) * 16


def _dispatch(plan: Plan, tokens: torch.Tensor, out: torch.Tensor, topk_ids: torch.Tensor):
    ws, world, rank = plan.ws, plan.world, plan.rank
    tokens_n, k = topk_ids.shape
    experts = _option(plan.request, "num_experts")
    local_experts, max_rows = experts // world, out.shape[0]
    words, out_words = _words(tokens), _words(out)
    row = tokens.shape[1] * tokens.element_size() // words.element_size()
    cfg, tt, local_slots, variant = _config(plan, "moe_dispatch", tokens_n, tokens.shape[1], k, experts)
    tiles = _tiles(k, local_experts)
    counts = torch.empty(local_experts, dtype=torch.int64, device=tokens.device)
    origin = torch.empty(max_rows, dtype=torch.int64, device=tokens.device)
    self_rows = torch.empty((tokens_n, k), dtype=torch.int64, device=tokens.device)
    e_p2 = triton.next_power_of_2(experts)
    slots = triton.next_power_of_2(max(tokens_n * k, 1))
    if world == 1 and variant in (2, 3, 4):  # one launch: each program routes a range of tokens
        parts, part_words, hb = _split(row, triton.cdiv(max(tokens_n, 1), tt), cfg, tt * tiles["KP2"])
        range_tokens, programs = moe_dispatch_ranges.ranges_grid(tokens_n, cfg.max_programs, parts, tt)
        route_slots = moe_dispatch_ranges.route_all_slots(range_tokens, tiles["KP2"], e_p2) if variant == 4 else 0
        launch(moe_dispatch_ranges.moe_dispatch_ranges_kernel, (programs,),
               (*ws.kernel_args, plan.desc, words, topk_ids, out_words, counts, origin, self_rows, tokens_n, row,
                max_rows, experts, range_tokens, parts, part_words),
               dict(K=k, KP2=tiles["KP2"], E_P2=e_p2, CHUNK=_ranges_chunk(ws.device.type, cfg.num_warps), TT=tt, HB=hb,
                    AHEAD=variant >= 3, ROUTE_ALL=route_slots > 0, RS=max(route_slots, 1), num_warps=cfg.num_warps))
        return out, counts, origin, self_rows
    if world == 1 and slots <= local_slots:  # one launch: every program routes every slot itself
        parts, part_words, hb = _split(row, triton.cdiv(max(tokens_n, 1), tt), cfg, tt * tiles["KP2"])
        launch(moe_dispatch_local_kernel, cfg.grid(triton.cdiv(max(tokens_n, 1), tt) * parts),
               (*ws.kernel_args, plan.desc, words, topk_ids, out_words, counts, origin, self_rows, tokens_n, row,
                max_rows, experts, parts, part_words),
               dict(K=k, KP2=tiles["KP2"], E_P2=e_p2, SLOTS=slots, TT=tt, HB=hb, num_warps=cfg.num_warps))
        return out, counts, origin, self_rows
    tb = tiles["TB"]
    blocks = triton.cdiv(tokens_n, tb)
    fold = _folds(variant, blocks, e_p2, world)
    # My buffer: sanitised ids [T, k], in-block ranks [T, k], block prefixes [blocks, E] (variant 6:
    # [blocks, E_P2]), totals [E] (int32), then this round's token rows for the peers.
    rank_off = _ceil16(tokens_n * k)
    hist_off = rank_off + _ceil16(tokens_n * k)
    totals_off = hist_off + _ceil16(blocks * (e_p2 if fold else experts))
    meta_bytes = (totals_off + _ceil16(experts)) * 4
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
    parts, part_words, hb = _split(row, world * triton.cdiv(tq, tt), cfg, tt * tiles["KP2"])
    stage_words = tq * row if world > 1 else 0
    route_grid = cfg.grid(max(blocks, triton.cdiv(stage_words, 4096)))
    for t0 in range(0, max(tokens_n, 1), per_round):
        n = min(per_round, tokens_n - t0)
        launch(moe_route_kernel, route_grid,
               (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, ws.local_state(COUNTER.name), words[t0 * row:],
                n * row if world > 1 else 0, topk_ids, tokens_n, experts, rank_off, hist_off, totals_off,
                meta_bytes // words.element_size()),
               dict(WORLD=world, K=k, KP2=tiles["KP2"], TB=tb, E_P2=e_p2, SCAN_ROWS=_scan_rows(blocks, e_p2, world),
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
    experts = _option(plan.request, "num_experts")
    local_experts = experts // world
    (cfg, tt, _, _), kp2 = _config(plan, "moe_combine", tokens_n, hidden, k, experts), triton.next_power_of_2(k)
    landing = ws.region(LANDING.name)
    # One round on one rank (nothing lands); else as many tokens' k rows as the landing region holds.
    per_round = max(tokens_n, 1) if world == 1 else \
        landing.local.numel() // expert_out.element_size() // max(1, k * hidden)
    if per_round == 0:
        raise ValueError(f"expert_out: {k} rows of {hidden} elements per token do not fit the landing region "
                         f"({landing.local.numel()} bytes; SYMMCOLL_WORKSPACE_BYTES)")
    tq = min(tokens_n, per_round)
    parts, part_len, hb = _split(hidden, triton.cdiv(tq, tt), cfg, tt * kp2)
    push_parts, push_len, push_hb = _split(hidden, triton.cdiv(max_rows, PUSH_ROWS), cfg, PUSH_ROWS)
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
    recv, counts, origin, self_rows, route = moe_nccl.dispatch(tokens, topk_ids, _option(plan.request, "num_experts"),
                                                               plan.group, out.shape[0], out)
    moe_nccl.remember(origin, route)
    return recv, counts, origin, self_rows


def _combine_nccl(plan: Plan, expert_out, out, topk_weights, topk_ids, counts, origin, self_rows):
    experts = _option(plan.request, "num_experts")
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
