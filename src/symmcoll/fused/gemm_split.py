"""How the GEMM core shares a tile along K (gemm_kernel.matmul_kernel's split path; the plan comes
from gemm_configs.split_plan) and how the parts of a shared tile are summed.

    stream_cut      stream-K: how many k-steps each program's range holds (the kernel's cut, in one place).
    stream_range    stream-K: the k-steps of the tiles of the last, partial wave laid end to end and
                    cut into one contiguous range per program (as even as whole k-steps allow); a
                    range may end inside one tile and go on in the next (gemm_configs.stream_split).
    stream_owner    the program whose range holds a shared k-step (a tile's first and last parts).
    wave_part       the wave split: each of those tiles cut into equal parts of whole k-steps, the
                    (tile, part) units, part-major, round-robin over the programs (gemm_configs.wave_split).
    split_reduce    the parts of a shared tile without a second kernel: every part stores its fp32
                    partial (both accumulators of a two-part tile), bumps the tile's counter once
                    (acq_rel); the part that arrives last sums the partials in part order (the
                    result does not depend on who came last), a few slots per round trip
                    (``reduce_loads``), resets the counter (graph replays need no host work) and
                    owns the epilogue. Nobody waits.
    pair_reduce     a tile of exactly two parts (the wave split's sharing = 2, tiles whose two slots
                    fit the registers): the part that finishes first stores its partial and says so;
                    the second waits for that (bounded; the first is running, it took its ticket after
                    its K-loop), adds it to its own accumulator in registers and owns the epilogue --
                    one 64 KB partial stored and loaded a tile instead of two stored and two loaded.
    exchange_halves the same tiles where every part is resident at once (one round of parts on a GPU): each
                    part stores the column half its partner finishes (32 KB), waits (bounded) for the
                    partner's, sums its own half and stores it -- both SMs busy at once, half the bytes
                    each; never under the interpreter, which runs one program at a time (pair_reduce there).
    store_partial   GemmConfig.sum_apart instead of split_reduce: the part's partial stored row-major,
                    summed by a second kernel (gemm_kernel.split_sum_kernel), every SM a few rows.
    split_counters  the zeroed per-tile counters: one table per (device, stream) for launches made
                    eagerly; for a launch captured into a CUDA graph, a slice of its own of one
                    zeroed arena made outside any capture (no fill kernel in the graph).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..memory import capturing
from ..memory.persistent_state import persistent
from .gemm_configs import MAX_SPLIT_TILES


@triton.jit
def stream_cut(shared_steps, sharing):
    """(least, longer) of ``shared_steps`` k-steps cut into ``sharing`` ranges as even as whole k-steps allow:
    ``least`` each, one more for the first ``longer`` (the GEMM kernel cuts them so; the sum kernel of a plan
    summed apart finds each tile's parts by the same cut)."""
    return shared_steps // sharing, shared_steps % sharing


@triton.jit
def stream_range(program, least, longer):
    """[first, end) of the shared k-steps ``program`` computes: ``least`` each, one more for the
    first ``longer`` programs."""
    first = program * least + tl.minimum(program, longer)
    return first, first + least + tl.where(program < longer, 1, 0)


@triton.jit
def stream_owner(step, least, longer):
    """The program whose stream-K range holds shared k-step ``step`` (inverse of stream_range)."""
    in_longer = longer * (least + 1)
    return tl.where(step < in_longer, step // (least + 1), longer + (step - in_longer) // least)


@triton.jit
def wave_part(unit, shared_tiles, parts, steps):
    """(shared tile, part, [first, end) k-steps) of wave-split ``unit``: every one of the
    ``shared_tiles`` tiles in ``parts`` parts of cdiv(steps, parts) k-steps, the last cut at the tile's
    end. Units go part-major (part 0 of every tile, then part 1, ...): where the units take more than
    one round of the programs, no tile is complete before the last round, so the reductions (each a
    fp32 tile stored, and ``parts`` read back by one SM) all run at the end, beside one another,
    instead of a round's reductions delaying the next round's parts of the same programs -- tile-major
    units put one reduction per round on the critical path (2 at 80 tiles of 128x256 in 3 parts over
    132 programs). The sum is in part order either way: the bits do not depend on the order."""
    chunk = tl.cdiv(steps, parts)
    part = unit // shared_tiles
    return unit % shared_tiles, part, part * chunk, tl.minimum(part * chunk + chunk, steps)


def reduce_loads(block_m: int, block_n: int, num_warps: int) -> int:
    """Partial slots the last part of a shared tile ``block_n`` wide (a two-part tile: both parts, its
    tile_n) loads at once (split_reduce's REDUCE_LOADS). One
    slot a round trip made the reduction latency-bound: on one H100 (2026-11-27 tune, 128x128 tiles
    of 128x1280x8192) each further part cost ~1.4 us, 64 KB a round trip. More at once where the
    sum and the loads fit the registers: a thread's share of a tile is at most 64 fp32 values for
    two slots, 16 for four."""
    per_thread = block_m * block_n // (32 * num_warps)
    return 4 if per_thread <= 16 else 2 if per_thread <= 64 else 1


@triton.jit
def to_slot_order(acc, BM: tl.constexpr, BN: tl.constexpr):
    """The [BM, BN] tile as [BM * BN // 4, 4] in the order a partial slot holds it: the order of the
    sm_90 wgmma accumulator's registers (warps of 16 rows; in a warp, lane 4p + q holds rows p and
    p + 8 of columns 8j + 2q and 8j + 2q + 1, j = 0 .. BN/8 - 1), so that the slot's [., 4] rows
    are one thread's 4 values (a 16-byte store) and a warp's 32 rows 512 contiguous bytes. The
    compiler then stores and loads the partial straight from and into the accumulator's registers:
    in row-major order the 128x256 fp32 tile went through shared memory (mma -> blocked: 128 KB
    written and read back, 3 barriers) before the store, and the sum again before the epilogue. A
    permutation only: any other layout (swapped tiles, 4 warps) is still right, with a conversion."""
    x = tl.reshape(acc, (BM // 16, 2, 8, BN // 8, 4, 2))  # (row // 16, row // 8 % 2, row % 8, j, q, col % 2)
    x = tl.permute(x, (3, 0, 2, 4, 1, 5))
    return tl.reshape(x, (BM * BN // 4, 4))


@triton.jit
def from_slot_order(x, BM: tl.constexpr, BN: tl.constexpr):
    """The inverse of ``to_slot_order``."""
    x = tl.reshape(x, (BN // 8, BM // 16, 8, 4, 2, 2))
    x = tl.permute(x, (1, 4, 2, 0, 3, 5))
    return tl.reshape(x, (BM, BN))


@triton.jit
def slot_index(BM: tl.constexpr, BN: tl.constexpr):
    """Offsets of a [BM, BN] tile's floats in its partial slot, shaped as ``to_slot_order`` gives them."""
    return tl.arange(0, BM * BN // 4)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def sum_slots(total, base, in_slot, parts, stride, REDUCE_LOADS: tl.constexpr):
    """``total`` (zeros) plus, elementwise and in part order, ``parts`` fp32 pieces shaped as ``in_slot``
    ``stride`` floats apart from ``base`` (one piece a partial slot), REDUCE_LOADS (1, 2 or 4) loaded
    per round trip (a piece past the last part reads as zeros: adding 0.0 changes no sum)."""
    for s in range(0, parts, REDUCE_LOADS):
        first = tl.load(base + s * stride + in_slot, cache_modifier=".cg")
        if REDUCE_LOADS >= 2:
            second = tl.load(base + (s + 1) * stride + in_slot, mask=s + 1 < parts, other=0.0, cache_modifier=".cg")
        if REDUCE_LOADS >= 4:
            third = tl.load(base + (s + 2) * stride + in_slot, mask=s + 2 < parts, other=0.0, cache_modifier=".cg")
            fourth = tl.load(base + (s + 3) * stride + in_slot, mask=s + 3 < parts, other=0.0, cache_modifier=".cg")
        total += first
        if REDUCE_LOADS >= 2:
            total += second
        if REDUCE_LOADS >= 4:
            total += third
            total += fourth
    return total


@triton.jit
def split_reduce(acc, partials_ptr, counters_ptr, tile, part, parts, slots, BM: tl.constexpr, BN: tl.constexpr,
                 REDUCE_LOADS: tl.constexpr = 1, acc2=None, BN2: tl.constexpr = 0):
    """Publish this part's fp32 partial of shared ``tile`` (part ``part`` of ``parts``; the tile owns
    ``slots`` partial slots, each a tile in ``to_slot_order``); returns (is_last, the tile's sum
    over its parts in part order -- meaningful only where is_last). The last part loads
    REDUCE_LOADS (1, 2 or 4) slots per round trip and adds them in part order (a slot past the last
    part reads as zeros: adding 0.0 changes no sum), so the bits do not depend on REDUCE_LOADS, on
    who came last, or on the slot order (an elementwise sum).

    BN2 > 0 (a two-part tile, gemm_kernel.k_loop's BN2): a slot is BM x (BN + BN2) floats, the first
    part's [BM, BN] then the second's [BM, BN2] ``acc2``; both are stored before the one counter bump,
    the last part sums each in part order and returns (is_last, sum, sum of the second part)."""
    in_slot = slot_index(BM, BN)
    slot_size = BM * (BN + BN2)
    base = partials_ptr + tl.cast(tile, tl.int64) * slots * slot_size  # (tile: an int under the interpreter)
    tl.store(base + part * slot_size + in_slot, to_slot_order(acc, BM, BN))
    if BN2 > 0:
        in_slot2 = slot_index(BM, BN2)
        tl.store(base + part * slot_size + BM * BN + in_slot2, to_slot_order(acc2, BM, BN2))
    tl.debug_barrier()  # every thread's partial is stored before the counter says so
    arrived = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel", scope="gpu")
    is_last = arrived == parts - 1
    total = tl.zeros([BM * BN // 4, 4], tl.float32)
    if BN2 > 0:
        total2 = tl.zeros([BM * BN2 // 4, 4], tl.float32)
    if is_last:
        # (my own part read back too: holding it in registers beside the sum and the loads spills)
        total = sum_slots(total, base, in_slot, parts, slot_size, REDUCE_LOADS)
        if BN2 > 0:
            total2 = sum_slots(total2, base + BM * BN, in_slot2, parts, slot_size, REDUCE_LOADS)
        tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
    if BN2 > 0:
        return is_last, from_slot_order(total, BM, BN), from_slot_order(total2, BM, BN2)
    else:
        return is_last, from_slot_order(total, BM, BN)


# Spins (atomic reads of the tile's counter, ~1 us each under load) the second part of a pair waits for
# the first's partial at most: the first is past its K-loop when the second arrives, storing 64 KB, so a
# wait of more than ~10^6 round trips means it never will -- the tile is then NaN (a visible failure,
# never a hang).
PAIR_SPINS: tl.constexpr = tl.constexpr(1 << 20)


@triton.jit
def wait_counter(counter_ptr, seen, target):
    """Poll a tile's counter (acquire) from ``seen`` until it reads at least ``target``, at most PAIR_SPINS
    times; returns the last value read (below ``target``: the wait gave up)."""
    spins = 0
    while (seen < target) & (spins < PAIR_SPINS):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    return seen


@triton.jit
def pair_reduce(acc, partials_ptr, counters_ptr, tile, slots, BM: tl.constexpr, BN: tl.constexpr):
    """The two parts of shared ``tile`` (the wave split's sharing = 2): returns (is_last, the tile's sum
    -- meaningful only where is_last). Each part takes a ticket after its K-loop (the tile's counter: 0
    first, 1 or 3 second). The first stores its fp32 partial into the tile's slot 0 and adds 2 to the
    counter (release); the second waits until the counter reads 4 (acquire; bounded by PAIR_SPINS, the
    tile NaN past it), sums (0 + its own) + the first's -- IEEE addition commutes, so these are the bits
    split_reduce's part-order sum (0 + part 0) + part 1 gives, whoever came first -- resets the counter
    and owns the epilogue. Against split_reduce: one partial stored and loaded a tile instead of two and
    two (the 4 MB of 64 tiles' partials crossed L2 three times more there: ~2.3 us at 1024^3 on an H200),
    and the second part holds its own accumulator, the loaded partial and the sum at once (so only where
    two slots fit the registers: gemm_split.reduce_loads >= 2). Under the interpreter programs run one
    after another: the first has always finished when the second takes its ticket (3), nobody spins."""
    in_slot = slot_index(BM, BN)
    slot = partials_ptr + tl.cast(tile, tl.int64) * slots * (BM * BN)  # (tile: an int under the interpreter)
    ticket = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel", scope="gpu")
    total = tl.zeros([BM * BN // 4, 4], tl.float32)
    if ticket == 0:
        tl.store(slot + in_slot, to_slot_order(acc, BM, BN))
        tl.debug_barrier()  # every thread's partial is stored before the counter says so
        tl.atomic_add(counters_ptr + tile, 2, sem="release", scope="gpu")
    else:
        seen = wait_counter(counters_ptr + tile, ticket + 1, 4)
        total += to_slot_order(acc, BM, BN)
        total += tl.load(slot + in_slot, cache_modifier=".cg")
        total = tl.where(seen >= 4, total, float("nan"))
        tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
    return ticket != 0, from_slot_order(total, BM, BN)


@triton.jit
def exchange_halves(acc, partials_ptr, counters_ptr, tile, part, slots, BM: tl.constexpr, BN: tl.constexpr):
    """The two parts of shared ``tile`` (part ``part``, 0 or 1), both resident (one round of parts: gemm._core_shape
    says so): part p owns column half p of the tile. Each stores the half its partner owns into the tile's slot
    (region h of the slot: a partner's contribution to half h, in ``to_slot_order``), adds 1 to the counter
    (release), waits until it reads 2 (acquire; bounded by PAIR_SPINS, the half NaN past it), and returns its
    half: (0 + its own) + the partner's, the bits of the part-order sum (IEEE addition commutes). A second add
    says when both have read: the one that makes it 4 resets the counter for the next launch. Against
    pair_reduce: both SMs store 32 KB and load 32 KB at once instead of one storing 64 KB and the other then
    loading it, and each stores half of C."""
    HALF: tl.constexpr = BN // 2
    left, right = tl.split(tl.permute(tl.reshape(acc, (BM, 2, HALF)), (0, 2, 1)))
    mine = tl.where(part == 0, left, right)
    theirs = tl.where(part == 0, right, left)
    in_half = slot_index(BM, HALF)
    slot = partials_ptr + tl.cast(tile, tl.int64) * slots * (BM * BN)
    tl.store(slot + (1 - part) * (BM * HALF) + in_half, to_slot_order(theirs, BM, HALF))
    tl.debug_barrier()  # every thread's half is stored before the counter says so
    seen = wait_counter(counters_ptr + tile, tl.atomic_add(counters_ptr + tile, 1, sem="release", scope="gpu") + 1, 2)
    total = tl.zeros([BM * HALF // 4, 4], tl.float32)
    total += to_slot_order(mine, BM, HALF)
    total += tl.load(slot + part * (BM * HALF) + in_half, cache_modifier=".cg")
    total = tl.where(seen >= 2, total, float("nan"))
    if tl.atomic_add(counters_ptr + tile, 1, sem="relaxed", scope="gpu") == 3:
        tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed", scope="gpu")  # both have read: ready for the next launch
    return from_slot_order(total, BM, HALF)


@triton.jit
def store_partial(acc, partials_ptr, tile, part, slots, BM: tl.constexpr, BN: tl.constexpr):
    """GemmConfig.sum_apart: this part's fp32 partial of shared ``tile`` into its slot, row-major (no
    counter, nobody sums here: gemm_kernel.split_sum_kernel reads a few rows of every slot of a tile
    per program, after this kernel)."""
    base = partials_ptr + (tl.cast(tile, tl.int64) * slots + part) * (BM * BN)
    tl.store(base + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :], acc)


_COUNTERS: dict = {}
# Counters for launches captured into CUDA graphs: slices of a zeroed arena made by an eager split
# launch. A table made during a capture is a zero-fill kernel in the graph before that launch,
# replayed every time (a node of a few microseconds before every split GEMM of the graph: decode
# GEMMs take 10-30 us); a table kept from one capture for the next would be zero only once its own
# graph has replayed. A captured launch keeps its slice for good (its graph may replay at any time,
# and nothing says when it is gone), so graphs never share counters; an arena less than a quarter
# free is replaced by the next eager launch and kept (its slices may be in live graphs): 4 MB per
# ~10^4 captured split launches. A capture that finds too little room falls back to a table of the
# launch's own, made in the capture as before.
CAPTURE_ARENA = 1 << 20
_ARENAS: dict = {}  # (device type, index) -> [zeroed arena, first free entry]
_RETIRED: list = []  # arenas replaced: never freed


def _zeros(device: torch.device, entries: int) -> torch.Tensor:
    return persistent(device, lambda: torch.zeros(entries, dtype=torch.int32, device=device))


def split_counters(device: torch.device, needed: int = MAX_SPLIT_TILES) -> torch.Tensor:
    """``needed`` zeroed per-tile counters for one split-K launch on ``device``'s current stream;
    every launch leaves its counters zero. Eager launches share one table per (device, stream)
    (launches on one stream never overlap); a launch being captured gets a slice of the arena that
    no other launch ever gets."""
    index = device.index
    if index is None and device.type == "cuda":  # "cuda" and "cuda:0" are one device: one arena
        index = torch.cuda.current_device()
    device_key = (device.type, index)
    arena = _ARENAS.get(device_key)
    if capturing(device):
        if arena is not None and arena[1] + needed <= arena[0].numel():
            arena[1] += needed
            return arena[0][arena[1] - needed:arena[1]]
        return _zeros(device, MAX_SPLIT_TILES)  # (belongs to the graph being captured: not kept)
    on_gpu = device.type == "cuda"
    key = (*device_key, torch.cuda.current_stream(device).cuda_stream if on_gpu else None)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = _COUNTERS[key] = _zeros(device, MAX_SPLIT_TILES)
    if arena is None or arena[1] > CAPTURE_ARENA * 3 // 4:
        if arena is not None:
            _RETIRED.append(arena[0])
        _ARENAS[device_key] = [_zeros(device, CAPTURE_ARENA), 0]
        if on_gpu:  # zero before any graph captured on another stream replays
            torch.cuda.current_stream(device).synchronize()
    return counters
