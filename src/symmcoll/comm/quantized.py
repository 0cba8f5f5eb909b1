"""Quantized all-reduce: a barrier-free (sentinel) two-shot whose both hops carry 8- or 4-bit codes.

``symmcoll.all_reduce(x, quantize="int8" | "fp8" | "int4", group_size=G)`` runs op
``all_reduce_quantized`` (its own op, so that no exact-path test, stress or table ever picks a lossy
algorithm by accident); its algorithms are ``quantized_int8``, ``quantized_fp8``, ``quantized_int4``
and ``exact`` (the exact all-reduce, ``algorithm="auto"``), which the resolver substitutes where
quantizing cannot pay: below ``min_bytes()`` (1 MB on GPU; 0 on CPU, so that tests run the kernel),
on one rank, or for an empty tensor.

Protocol (rank r owns shard r of each piece; codecs in language/codecs.py)::

    stage 0  shard s of x_r -> quantize (groups of G, one fp32 scale each) -> pack into int32 words
             -> NVLink stores into my row of rank s's scatter slots               every s != r
    stage 1  poll my scatter rows until no word is EMPTY, reset them to EMPTY; dequantize; add my own
             shard exactly; sum in rank order (fp32) -> re-quantize the reduced shard
             -> my output (dequantized from those codes) and my row of every peer's gather slots
    stage 2  poll + reset my gather rows; dequantize -> out[s]                       every s != r

Wire format of a row (one source rank's shard, 16-byte aligned):
``[codes: shard_len * BITS / 32 words][... up to SCALES_AT][scales: shard_len / G fp32 words]``,
codes little-endian within a word (4 int8/fp8 or 8 int4 per word). The sentinel is ``EMPTY`` =
0x80008000, which no data word can equal: it holds the byte 0x80, which no code ever takes (int8
codes are in [-127, 127], int4 nibbles in [-7, 7], fp8 never writes negative zero), and its sign
bit is set, which no scale has (scales are >= 0 or a positive NaN).

Slot sets rotate with a per-rank launch epoch (language/slots.py: a rank is at most one launch ahead,
and it has emptied what it read before it sends again), so nothing on the host changes between calls
(CUDA graphs replay). Headers carry the call descriptor (format, dtype, op,
size and G): a peer in another call is reported, never decoded.

Deterministic: every rank decodes the same bytes, the owner included (its output comes from the
codes it sends), and sums in rank order with explicit IEEE roundings (``div_rn``, no FMA
contraction): bit-identical on every rank and run, and equal to ``reference.all_reduce_quantized``.
Error bound (per element, sum; docs/algorithms.md): the scatter error of W-1 quantized
contributions plus the error of re-quantizing the sum, plus the output dtype's rounding.

Traffic per rank: 2 (W-1)/W of S * (BITS/16 + 2/G) for a bf16 input of S bytes: 0.53 S-equivalents
for int8/fp8 at G = 64, 0.28 for int4. Pieces of ``MAX_ELEMENTS`` input elements per launch.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from .. import debug_switches
from ..language import (FORMAT_BITS, FORMATS, declare_slots, end_launch, narrow, open_two_stage_slots, own_shard,
                        post_call, shard_geometry)
from ..launcher import launch
from ..ops import OpSpec, declare, resolve_group
from ..plan import (REDUCTION_DTYPES, Algorithm, LaunchConfig, Plan, Request, SizedConfigs, algorithms, clear_cache,
                    inner, resolve)
from .common import cdiv, chunks, config, meta, next_power_of_2
from .quantized_steps import finish_shard, receive_block, scatter_block, stages_prefetched, sum_shard

OP = "all_reduce_quantized"
GROUP_SIZES = (32, 64, 128)
DEFAULT_GROUP_SIZE = 64
# Shard lengths are multiples of this: of every group size, and of 8 codes (an int4 word).
ALIGN = 128
# Input elements per launch (CPU: small, so that the tests run the multi-piece path).
MAX_ELEMENTS = {"cuda": 8 << 20, "cpu": 8 << 10}
# Below this many input bytes the exact path runs instead (SYMMCOLL_QUANTIZE_MIN_BYTES overrides).
MIN_BYTES = {"cuda": 1 << 20, "cpu": 0}


def min_bytes(device_type: str) -> int:
    value = os.environ.get("SYMMCOLL_QUANTIZE_MIN_BYTES")
    if not value:
        return MIN_BYTES[device_type]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"SYMMCOLL_QUANTIZE_MIN_BYTES must be a number of bytes, got {value!r}") from None


@contextlib.contextmanager
def size_threshold(nbytes: int):
    """``SYMMCOLL_QUANTIZE_MIN_BYTES`` = ``nbytes`` inside the block (0: the kernel at every size), the
    plans resolved again on the way in and out (they keep the algorithm the threshold picked)."""
    saved = os.environ.get("SYMMCOLL_QUANTIZE_MIN_BYTES")
    os.environ["SYMMCOLL_QUANTIZE_MIN_BYTES"] = str(nbytes)
    clear_cache()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("SYMMCOLL_QUANTIZE_MIN_BYTES", None)
        else:
            os.environ["SYMMCOLL_QUANTIZE_MIN_BYTES"] = saved
        clear_cache()


def shard_capacity(device_type: str, world: int) -> int:
    """Most elements of a shard per launch (a multiple of ALIGN)."""
    return cdiv(cdiv(MAX_ELEMENTS[device_type], world), ALIGN) * ALIGN


def row_words(device_type: str, world: int) -> int:
    """int32 words of a slot row: 8-bit codes, then scales for the smallest group size."""
    capacity = shard_capacity(device_type, world)
    return capacity // 4 + capacity // GROUP_SIZES[0]


def pieces(numel: int, world: int, device_type: str):
    """(start, elements, shard length) of every launch; every rank computes the same."""
    for start, n in chunks(numel, world * shard_capacity(device_type, world)):
        yield start, n, cdiv(cdiv(n, world), ALIGN) * ALIGN


SLOTS, EPOCHS = declare_slots("quantized", "quantized", 2, row_words)

# Block = input elements per program step (a power of two >= ALIGN). 2048 values, three programs an SM
# (396 on 132 SMs), 8 warps: the fastest of the row kernel's configs on 2x H100 at 4-64 MB (2026-11-27,
# benchmarks/results/2026-11-27-quant-rows-h100x2: int8 / int4 at 16 MB 37.0 / 27.4 us against 41.4 / 32.4
# with 2048 x 264 and 38.0 / 26.9 with 4096 x 264). Below 4 MB not compared.
GPU_CONFIGS = SizedConfigs(((1 << 40, LaunchConfig(2048, 396, 8)),))
if debug_switches.QUANT_CONFIG:  # one config at every size, to time configs in one GPU call
    GPU_CONFIGS = SizedConfigs(((1 << 40, LaunchConfig(*debug_switches.QUANT_CONFIG)),))
# Every load a loop step ahead (``stages_prefetched``) from PREFETCH_FROM_BYTES a rank: on 2x H100 it was
# 9% faster at 16 MB (int8 37.0 -> 33.7 us, int4 27.1 -> 24.8) and at 64 MB (147.0 -> 134.3, 109.1 -> 100.2),
# and 6-9% slower at 4 MB (10.6 -> 11.2, 8.4 -> 9.2): benchmarks/results/2026-11-28-quant-agce-h100x2. 8 MB
# not measured. SYMMCOLL_QUANT_PREFETCH=1 / 0 forces it on / off at every size (read at each launch: tests
# set it in their rank processes).
PREFETCH = debug_switches.QUANT_PREFETCH
PREFETCH_FROM_BYTES = 16 << 20


def prefetch_for(nbytes: int) -> bool:
    """Whether a call of ``nbytes`` a rank runs the prefetching stages (the switch, else the size rule)."""
    return nbytes >= PREFETCH_FROM_BYTES if PREFETCH is None else PREFETCH


# Registers a thread may use with PREFETCH (ptxas takes 110-128 unbounded, sm_90): every program of a launch
# must be resident at once, and 3 programs of 8 warps an SM (396 on 132) fit in 65536 registers at <= 80 a
# thread (the allocation's granularity is 8) -- what the default kernel uses. (SYMMCOLL_QUANT_MAXNREG=64 fits
# 4 an SM, for LaunchConfig(2048, 528, 8): the default kernel compiles to 64 without spilling.)
PREFETCH_REGISTERS = 80


@triton.jit
def quantized_two_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # this piece: shard s = x[s * shard_len:][:shard_len], valid below numel
    x_ptr, out_ptr, numel, shard_len,
    # FMT/BITS: codec (language/codecs.py); G: group size; ROW: words per slot row, scales at SCALES_AT;
    # BLOCK: elements per program step
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FMT: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr,
    ROW: tl.constexpr, SCALES_AT: tl.constexpr, BLOCK: tl.constexpr, PREFETCH: tl.constexpr = False,
):
    """One [BLOCK] row per rank, ranks unrolled (tl.static_range): the rank-order sum adds rows that sit
    in the same threads, with no reduction across warps, and every thread works on every row. (It
    replaced a [PEERS, BLOCK] tile whose rank rows Triton put in different warps: the rank-order sum went
    through shared memory, ~14 barriers a step, half the warps idle at ws 2 -- 3.4x slower than the exact
    all-reduce on 2x H100; benchmarks/results/2026-11-27-quant-rows-h100x2.)"""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch, scatter_base, gather_base, region, headers, pads, peer_headers = open_two_stage_slots(
        slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc, rank, WORLD, ROW)
    blocks, n_words, n_groups = shard_geometry(shard_len, BLOCK, BITS, G)
    lane = tl.arange(0, BLOCK)[None, :]
    elem = out_ptr.dtype.element_ty
    WORDS: tl.constexpr = BLOCK * BITS // 32
    GROUPS: tl.constexpr = BLOCK // G

    if PREFETCH:
        stages_prefetched(slot_ptrs_dev, status_ptr, max_spins, rank, desc, x_ptr, out_ptr, numel, shard_len, epoch,
                          scatter_base, gather_base, region, headers, pads, peer_headers, blocks, n_words, n_groups,
                          WORLD, REDUCE_OP, FMT, BITS, G, ROW, SCALES_AT, BLOCK)
    else:
        # Stage 0: shard s of my input, quantized, into my row of rank s's scatter slots; the peers in ring
        # order from mine (each rank starts with a different one).
        for b in range(pid, blocks, nprog):
            in_shard = b * BLOCK + lane
            for step in tl.static_range(1, WORLD):
                s = (rank + step) % WORLD
                offs = s * shard_len + in_shard
                x = tl.load(x_ptr + offs, mask=(in_shard < shard_len) & (offs < numel), other=0).to(tl.float32)
                scatter_block(x, s, b, slot_ptrs_dev, scatter_base, rank, n_words, n_groups, FMT, BITS, G, ROW,
                              SCALES_AT, BLOCK)
        post_call(pads, peer_headers, epoch, desc, rank, WORLD)

        # Stage 1: my shard = my own values (exact) + every peer's decoded codes, in rank order; the
        # re-quantized sum is my output (decoded from the codes I send) and goes to every peer.
        budget = max_spins
        check = 1
        for b in range(pid, blocks, nprog):
            _, offs, mask = own_shard(b, BLOCK, lane, rank, shard_len, numel)
            own = tl.load(x_ptr + offs, mask=mask, other=0).to(tl.float32)  # in flight during the waits
            acc, budget, check = sum_shard(own, b, budget, check, region, scatter_base, status_ptr, rank, desc,
                                           headers, epoch, n_words, n_groups, WORLD, ROW, SCALES_AT, BITS, G, FMT,
                                           BLOCK)
            finish_shard(acc, b, offs, mask, budget, out_ptr, slot_ptrs_dev, gather_base, rank, n_words, n_groups,
                         WORLD, REDUCE_OP, FMT, BITS, G, ROW, SCALES_AT, BLOCK)

        # Stage 2: every other reduced shard from my gather slots into my output.
        for b in range(pid, blocks, nprog):
            in_shard = b * BLOCK + lane
            for step in tl.static_range(1, WORLD):
                s = (rank + step) % WORLD
                values, budget = receive_block(region + gather_base + s * ROW, s, b, n_words, n_groups, budget,
                                               status_ptr, rank, desc, headers, epoch, 0, WORLD, SCALES_AT, WORDS,
                                               GROUPS, BITS, G, FMT, BLOCK)
                offs = s * shard_len + in_shard
                if budget > 0:
                    tl.store(out_ptr + offs, narrow(values, elem), mask=(in_shard < shard_len) & (offs < numel))
    end_launch(epochs_ptr, epoch)


def _run(fmt: str, plan: Plan, x: torch.Tensor, out: torch.Tensor, prefetch: bool | None = None) -> torch.Tensor:
    """``prefetch``: run ``stages_prefetched`` (default: ``prefetch_for`` the call's bytes a rank)."""
    prefetch = prefetch_for(x.numel() * x.element_size()) if prefetch is None else prefetch
    ws, cfg, world = plan.ws, config(plan), plan.world
    if cfg.block < ALIGN:
        raise ValueError(f"the quantized all-reduce needs a launch block of >= {ALIGN} elements, got {cfg.block}")
    device_type = ws.device.type
    # No block larger than a shard can be (the CPU config's blocks are 16K elements).
    block = min(cfg.block, next_power_of_2(shard_capacity(device_type, world)))
    region, epochs = ws.region(SLOTS.name), ws.local_state(EPOCHS.name)
    code = FORMATS[fmt]
    constexprs = meta(plan, REDUCE_OP=plan.reduce_code, FMT=code, BITS=FORMAT_BITS[code],
                      G=dict(plan.request.options)["group_size"], ROW=row_words(device_type, world),
                      SCALES_AT=shard_capacity(device_type, world) // 4, BLOCK=block)
    if prefetch:  # (left out when off: the default launch and its compile cache key stay as they were)
        constexprs["PREFETCH"] = True
    registers = debug_switches.QUANT_MAXNREG or (PREFETCH_REGISTERS if prefetch else None)
    if registers and device_type == "cuda":
        constexprs["maxnreg"] = registers
    constexprs["enable_fp_fusion"] = False  # x * inverse + 0.5 must round twice, as the reference does
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    for start, n, shard_len in pieces(flat.numel(), world, device_type):
        launch(quantized_two_shot_kernel, cfg.grid(cdiv(shard_len, block)),
               (*ws.kernel_args, plan.desc, region.ptrs_dev, epochs, flat[start:], out_flat[start:], n, shard_len),
               constexprs)
    return out


def _exact(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The exact all-reduce, as ``symmcoll.all_reduce(x)`` without quantize= runs it."""
    return inner(plan, "all_reduce", x, reduce_op=plan.request.reduce_op).execute(x, out)


def _shape_rule(request, world: int):
    """Validates a quantized call (ValueError naming the argument); (output shape, descriptor size key)."""
    if request.dtype not in REDUCTION_DTYPES:
        raise ValueError(f"x.dtype {request.dtype} cannot be quantized: quantize= takes bf16, fp16 or fp32 "
                         f"tensors (call all_reduce without quantize= for other dtypes)")
    if request.reduce_op not in ("sum", "avg"):
        raise ValueError(f"op must be 'sum' or 'avg' with quantize=, got {request.reduce_op!r}")
    group_size = dict(request.options).get("group_size")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    # The group size changes the wire format: it is part of the size key that calls compare.
    return request.shape, request.nbytes * len(GROUP_SIZES) + GROUP_SIZES.index(group_size)


def exact_instead(numel: int, nbytes: int, world: int, device_type: str, threshold: int | None = None) -> str | None:
    """Why a quantized call of ``numel`` elements (``nbytes`` bytes) runs the exact all-reduce instead
    (None: it quantizes): one rank, an empty tensor, or fewer bytes than ``threshold`` (default
    ``min_bytes(device_type)``). The one rule: the resolver applies it, ``reference`` models it."""
    threshold = min_bytes(device_type) if threshold is None else threshold
    if world < 2 or numel == 0:
        return "nothing to send"
    if nbytes < threshold:
        return f"x holds {nbytes} bytes, below {threshold}, where quantizing does not pay"
    return None


def _worth_quantizing(request, world: int) -> str | None:
    return exact_instead(request.numel, request.nbytes, world, request.device.type)


# What quantize= accepts (the formats of language/codecs.py).
QUANTIZE_FORMATS = tuple(FORMATS)


def all_reduce_quantized_impl(x, group_name: str, reduce_op: str, quantize: str, group_size: int):
    if quantize not in QUANTIZE_FORMATS:
        raise ValueError(f"quantize must be None or one of {QUANTIZE_FORMATS}, got {quantize!r}")
    return resolve(OP, x, resolve_group(group_name), f"quantized_{quantize}", reduce_op=reduce_op,
                   options=(("quantize", quantize), ("group_size", group_size))).execute(x)


SPEC = declare(OpSpec(
    OP, "(Tensor x, str group_name, str reduce_op, str quantize, int group_size) -> Tensor",
    all_reduce_quantized_impl, lambda x, *args: torch.empty_like(x, memory_format=torch.contiguous_format),
    shape_rule=_shape_rule, reduces=True,
    algorithms=(*(Algorithm(OP, f"quantized_{fmt}", code, "quantized", functools.partial(_run, fmt),
                            f"barrier-free two-shot carrying {fmt} codes with a scale per group on both hops",
                            GPU_CONFIGS, accepts=_worth_quantizing, instead="exact")
                  for code, fmt in ((80, "int8"), (81, "fp8"), (82, "int4"))),
                Algorithm(OP, "exact", 83, "quantized", _exact, "the exact all-reduce (algorithm='auto')"))))

def compile_cases(make_workspace):
    """Launches to compile for sm_90 (tests/test_compile.py): every format, group size, dtype and GPU
    config, world sizes 2, 3, 4 and 8, both rank parities; SYMMCOLL_QUANT_PREFETCH's kernel at world
    sizes 2 and 3 (its stage 1 has a form for each)."""
    cases = [("int8", 64, 2, 0, torch.bfloat16, 3 << 20, False), ("fp8", 32, 3, 1, torch.float16, 1 << 20, False),
             ("int4", 128, 8, 1, torch.bfloat16, 1 << 20, False), ("fp8", 128, 4, 0, torch.float32, 3 << 20, False),
             ("int4", 32, 4, 0, torch.float32, 5 << 10, False), ("int8", 64, 2, 1, torch.bfloat16, 8 << 20, True),
             ("int4", 64, 3, 2, torch.bfloat16, 8 << 20, True)]
    found = []
    for fmt, group_size, world, rank, dtype, numel, ahead in cases:
        def thunk(fmt=fmt, group_size=group_size, world=world, rank=rank, dtype=dtype, numel=numel, ahead=ahead):
            request = Request(OP, (numel,), dtype, torch.device("cuda"), "sum", None, None, (),
                              (("group_size", group_size),))
            algorithm = algorithms(OP)[f"quantized_{fmt}"]
            p = Plan(request, "kernel", algorithm, None, world, rank, make_workspace(world, rank),
                     GPU_CONFIGS.pick(request.nbytes, world), 3, (numel,))
            x = torch.empty((numel,), dtype=dtype, device="meta")
            _run(fmt, p, x, torch.empty_like(x), prefetch=ahead)
        found.append((f"{OP}.quantized_{fmt}.G{group_size}{'.prefetch' if ahead else ''}", thunk))
    return found
