"""The host-side rules of MoE dispatch and combine (fused/moe.py): what a request must look like (the
shape rules), how a call is launched (programs, warps, elements per step, tokens per item, which dispatch
variant on one rank, the route kernel's scan: from the measured table, else the untuned rules here) and
how rows are cut into words and parts. Each rule is a check or a calibration with no kernel in it, kept
apart so that fused/moe.py reads as the algorithm: its regions, its launches and its op declarations.

The roofline sweep (benchmarks/roofline.py) and the tests set TOKENS_PER_ITEM, LOCAL_ROUTE_SLOTS and
DISPATCH_VARIANT here (in place: fused/moe.py's compile cases too); ``pick_launch`` reads them per call.
"""

from __future__ import annotations

import operator

import torch
import triton

from ..plan import CPU_CONFIG, LaunchConfig, Plan, Request
from . import memory_bound_configs

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


def ranges_chunk(device_type: str, num_warps: int) -> int:
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


def scan_rows(blocks: int, e_p2: int, world: int) -> int:
    """SCAN_ROWS of the route kernel (blocks per step of its scan) for ``blocks`` routing blocks of E_P2
    experts."""
    rows = triton.next_power_of_2(max(blocks, 1))
    one_step = world == 1 and rows <= SCAN_MAX_ROWS and rows * e_p2 <= SCAN_TILE
    return max(rows if one_step else 1, 4096 // e_p2, 1)


def runs_folded(variant: int, blocks: int, e_p2: int, world: int) -> bool:
    """Whether dispatch variant 6 runs as itself: one rank, and the route kernel's scan of ``blocks``
    routing blocks in one step (the folded prefixes need the totals before any prefix is stored)."""
    return variant == 6 and world == 1 and scan_rows(blocks, e_p2, world) >= blocks


def option(request: Request, name: str):
    """The request's option ``name`` (num_experts, max_rows)."""
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
    experts = _routing_checks(shape[0], topk, option(request, "num_experts"), world)
    max_rows = option(request, "max_rows")
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
    experts = _routing_checks(tokens_n, topk, option(request, "num_experts"), world)
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


def routing_tiles(k: int, local_experts: int) -> dict:
    """Routing constexprs: KP2 slots, ELP2 local experts, TB tokens per routing block (TB * KP2 = 128
    slots: the in-block ranking compares them in chunks of 32)."""
    kp2 = triton.next_power_of_2(k)
    return dict(KP2=kp2, ELP2=triton.next_power_of_2(local_experts), TB=max(1, 128 // kp2))


def pick_launch(plan: Plan, op: str, tokens_n: int, hidden: int, k: int,
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


def row_parts(row: int, items: int, cfg: LaunchConfig, rows_per_step: int) -> tuple[int, int, int]:
    """(parts, part length, HB) for ``items`` row groups: rows cut in parts when there are too few items
    to keep every program busy (small batches), parts of at least 256 elements (multiples of 16:
    16-byte accesses stay aligned); HB = elements of a row per step (``cfg.block`` over the
    ``rows_per_step`` rows of a step), at most the part."""
    parts = max(1, min(triton.cdiv(2 * cfg.max_programs, max(items, 1)), triton.cdiv(row, 256)))
    part_len = triton.cdiv(triton.cdiv(max(row, 1), parts), 16) * 16
    return parts, part_len, max(16, min(cfg.block // rows_per_step, triton.next_power_of_2(part_len)))


def as_words(t: torch.Tensor) -> torch.Tensor:
    """Rows as the widest words (<= 4 bytes) dividing them: fewer, wider accesses."""
    row_bytes = t.shape[1] * t.element_size()
    size = 4 if row_bytes % 4 == 0 else (2 if row_bytes % 2 == 0 else 1)
    flat = t.reshape(-1).view(torch.uint8)
    if flat.data_ptr() % size:
        flat = flat.clone()
    return flat.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[size])


def ceil16(n: int) -> int:
    """``n`` rounded up to a multiple of 16 (offsets of the routing metadata: 16-word aligned)."""
    return -(-n // 16) * 16
