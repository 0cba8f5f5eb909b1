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
from . import gemm
from .gemm_tables import measured_cell

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


# One rank: the gather is a copy and the op is its GEMM, so "auto" runs the GEMM core where the GPU's GEMM
# table measured it this much faster than cuBLAS at the very (M, N, K) of every B, else cuBLAS. On one H100
# (benchmarks/results/2026-11-27-grid-drift-h100/fused/, and call 1 of 2026-11-27-paired-qkv-h100) auto's
# gather_then_cublas ran 2.2-2.5% behind gather_then_gemm at 16384x8192x8192 and 16384x6656x16384 in both
# runs (the table: 0.983 / 0.987) and ahead of it at 16384x3584x8192 (1.008) and 4096x8192x8192 (not in it).
CORE_FASTER_BELOW = 0.99
# ...and only where cuBLAS took at least this long in the tune: a cell of a few us is a quick pass there, with
# B read from HBM, while the op's operands of such a size stay in L2 between calls. At 1024^3 the H200's tune
# read 0.965 and the fused bench gather_then_gemm 1.039 against gather_then_cublas 0.997 (5.8 against 5.6 us,
# benchmarks/results/2026-11-28-gemm-retune-h200/fused2/); the H100 1.011 against 1.004 (tenth stop). A launch
# that takes the small products' PDL (gemm.small_pdl: its start and prologue under the kernel before) is exempt:
# measured L2-warm as the fused ops call it (the tune's fused shapes), its ratio is the fused bench's -- at 1024^3
# on one H200 gather_then_gemm 0.963 against gather_then_cublas 1.009 (results/2026-11-28-pdl-small-h200/call2).
CORE_FROM_CUBLAS_US = 20.0


def choose_default(request: planner.Request, world: int) -> str:
    """What "auto" runs where the dispatch table has no rule for this op: the copy-engine producer for
    gathers of COPY_ENGINE_FROM_ROWS rows or more on several ranks, else the symmcoll all-gather then
    cuBLAS -- on one rank (nothing to overlap) then the GEMM core where its table says it beats cuBLAS
    there (``CORE_FASTER_BELOW``) on a cell cuBLAS takes ``CORE_FROM_CUBLAS_US`` or more for, or that the
    core launches with the small products' PDL (``gemm.takes_small_pdl``)."""
    rows = world * request.shape[0]
    if world > 1:
        return "copy_engine_producer" if rows >= COPY_ENGINE_FROM_ROWS else "gather_then_cublas"
    k = request.shape[1]
    cells = [(measured_cell(rows, shape[1], k, request.device), shape[1]) for shape, _, _ in request.others]
    core = all(c is not None and c[0] < CORE_FASTER_BELOW and ((c[1] or 0.0) >= CORE_FROM_CUBLAS_US or
                                                               gemm.takes_small_pdl(rows, n, k, request.dtype,
                                                                                    request.device))
               for c, n in cells)
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

