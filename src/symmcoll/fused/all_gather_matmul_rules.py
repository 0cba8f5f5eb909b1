"""The host-side rules of all_gather_matmul (fused/all_gather_matmul.py): what a request must look like
(the shape rule), what the tuned dispatch table keys it by, what "auto" runs where the table has no rule,
and how many producer programs the fused kernel gets on a GPU. Each rule is a calibration or a check
with no kernel in it, kept apart so the variants' file reads as the ladder.
"""

from __future__ import annotations

import math

import torch

from .. import debug_switches
from .. import plan as planner
from .gemm import CORE_FASTER_BELOW, CORE_FROM_CUBLAS_US, core_measured_faster  # noqa: F401 (the tests read them here)

DTYPES = (torch.bfloat16, torch.float16)


def shape_rule(request: planner.Request, world: int):
    """Checks a request (bf16/fp16 A shard [M/W, K], each B [K, N] of its dtype and device) and keys its
    plan by M/W, K and the Bs' columns."""
    if request.dtype not in DTYPES:
        raise ValueError(f"a_shard.dtype {request.dtype} is not supported (bf16, fp16)")
    if len(request.shape) != 2:
        raise ValueError(f"a_shard must be 2-D [M/W, K], got shape {request.shape}")
    rows, k = request.shape
    if not request.others:
        raise ValueError("b: give at least one matrix")
    for i, (shape, dtype, device) in enumerate(request.others):
        if len(shape) != 2 or shape[0] != k:
            raise ValueError(f"b[{i}] must be [K={k}, N], got shape {shape}")
        if dtype != request.dtype:
            raise ValueError(f"b[{i}].dtype {dtype} differs from a_shard.dtype {request.dtype}")
        if device != request.device:
            raise ValueError(f"b[{i}] is on {device}, a_shard on {request.device}")
    key = rows * 1_000_003 + k * 7919 + sum(s[1] for s, _, _ in request.others)
    return None, key  # outputs (C per B, and the gathered A) are allocated by the variant


def dispatch_size(request: planner.Request, world: int) -> int:
    """What the tuned table keys this op by: M * N * K (N summed over the Bs)."""
    rows, k = request.shape
    return world * rows * k * sum(shape[1] for shape, _, _ in request.others)


# Gathered rows from which "auto" (without a table rule) overlaps the gather by the copy engines: on 4x H100
# (benchmarks/results/2026-11-27-multi-gpu-fix*-h100x4) copy_engine_producer beat every other variant and
# NCCL + cuBLAS at 4096 and 16384 rows (0.75-0.93x of auto's gather_then_cublas), and lost at 1024 rows and below.
COPY_ENGINE_FROM_ROWS = 4096


def choose_default(request: planner.Request, world: int) -> str:
    """What "auto" runs where the dispatch table has no rule for this op: the copy-engine producer for
    gathers of COPY_ENGINE_FROM_ROWS rows or more on several ranks, else the symmcoll all-gather then
    cuBLAS -- on one rank (nothing to overlap) then the GEMM core where its table measured it faster than
    cuBLAS at the very (M, N, K) of every B (``gemm.core_measured_faster``)."""
    rows = world * request.shape[0]
    if world > 1:
        return "copy_engine_producer" if rows >= COPY_ENGINE_FROM_ROWS else "gather_then_cublas"
    k = request.shape[1]
    core = all(core_measured_faster(rows, shape[1], k, request.dtype, request.device) for shape, _, _ in request.others)
    return "gather_then_gemm" if core else "gather_then_cublas"


# Producer programs of the fused kernel: on CPU exactly FUSED_PRODUCERS["cpu"] (the tests raise it); on a
# GPU fused_producers' rule, at least FUSED_PRODUCERS["cuda"] and at most FUSED_PRODUCERS_MAX.
FUSED_PRODUCERS = {"cuda": 8, "cpu": 1}
FUSED_PRODUCERS_MAX = 32
# The rule's rates: what one producer pulls over NVLink (bytes/s; 7-16 GB/s fitted to the one-step pull on
# 4x H100, benchmarks/NOTES.md, "all_gather_matmul at world size 4") and what one SM multiplies (flop/s:
# cuBLAS's ~730 TFLOP/s on 132 H100 SMs).
PRODUCER_PULL_RATE = 10e9
SM_FLOP_RATE = 5.5e12


def fused_producers(programs: int, chunks: int, n: int, itemsize: int) -> int:
    """Producer programs of the fused kernel on a GPU of ``programs`` persistent programs, for ``chunks``
    row blocks in all W shards and B's ``n`` columns. Consumers multiply my shard first (1/W of the
    tiles, no wait) and then the peers' shards in the order the producers pull them, so every chunk
    arrives in time when the pull of the W-1 peers' shards takes at most (W-1)/W of the GEMM time:
    (W-1)/W * M*K*e / (P*r) <= (W-1)/W * 2*M*N*K / ((S-P)*f), i.e. P >= S / (1 + 2*N*r / (e*f)), which
    depends on N only (the flops per pulled byte): 9 at N = 8192, 18 at N = 3584 (132 SMs, bf16). More
    producers than chunks would have nothing to move, and each one takes an SM from the GEMM.
    SYMMCOLL_AGMM_PRODUCERS (debug_switches) fixes the count to compare designs in one GPU run."""
    if debug_switches.AGMM_PRODUCERS is not None:
        wanted = debug_switches.AGMM_PRODUCERS
    else:
        wanted = max(FUSED_PRODUCERS["cuda"], math.ceil(
            programs / (1 + 2 * n * PRODUCER_PULL_RATE / (itemsize * SM_FLOP_RATE))))
    return max(1, min(wanted, FUSED_PRODUCERS_MAX, chunks, programs - 1))

