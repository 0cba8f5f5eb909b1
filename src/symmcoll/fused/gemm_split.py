"""How the GEMM core shares a tile along K (gemm.matmul_kernel's split path; the plan comes from
gemm_configs.split_plan) and how the parts of a shared tile are summed.

    stream_range    stream-K: the k-steps of the tiles of the last, partial wave laid end to end and
                    cut into one contiguous range per program (as even as whole k-steps allow); a
                    range may end inside one tile and go on in the next (gemm_configs.stream_split).
    stream_owner    the program whose range holds a shared k-step (a tile's first and last parts).
    wave_part       the wave split: each of those tiles cut into equal parts of whole k-steps, the
                    (tile, part) units round-robin over the programs (gemm_configs.wave_split).
    split_reduce    the parts of a shared tile without a second kernel: every part stores its fp32
                    partial, bumps the tile's counter (acq_rel); the part that arrives last sums the
                    partials in part order (the result does not depend on who came last), resets the
                    counter (graph replays need no host work) and owns the epilogue. Nobody waits.
    split_counters  the zeroed per-tile counters, one table per (device, stream).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..memory.persistent_state import persistent
from .gemm_configs import MAX_SPLIT_TILES


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
def wave_part(unit, parts, steps):
    """(shared tile, part, [first, end) k-steps) of wave-split ``unit``: every shared tile in ``parts``
    parts of cdiv(steps, parts) k-steps, the last cut at the tile's end."""
    chunk = tl.cdiv(steps, parts)
    part = unit % parts
    return unit // parts, part, part * chunk, tl.minimum(part * chunk + chunk, steps)


@triton.jit
def split_reduce(acc, partials_ptr, counters_ptr, tile, part, parts, slots, BM: tl.constexpr, BN: tl.constexpr):
    """Publish this part's fp32 partial of shared ``tile`` (part ``part`` of ``parts``; the tile owns
    ``slots`` partial slots); returns (is_last, the tile's sum over its parts in part order --
    meaningful only where is_last)."""
    in_tile = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    base = partials_ptr + tl.cast(tile, tl.int64) * slots * (BM * BN)  # (tile: an int under the interpreter)
    tl.store(base + part * (BM * BN) + in_tile, acc)
    tl.debug_barrier()  # every thread's partial is stored before the counter says so
    arrived = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel", scope="gpu")
    is_last = arrived == parts - 1
    total = tl.zeros([BM, BN], tl.float32)
    if is_last:
        # (my own part read back too: holding it in registers beside the sum and the loads spills)
        for s in range(0, parts):
            total += tl.load(base + s * (BM * BN) + in_tile, cache_modifier=".cg")
        tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed", scope="gpu")  # ready for the next launch
    return is_last, total


_COUNTERS: dict = {}


def split_counters(device: torch.device) -> torch.Tensor:
    """Zeroed per-tile counters of split-K launches, one table per (device, stream): every launch
    leaves them zero. Made during graph capture, they belong to that graph (not kept)."""
    on_gpu = device.type == "cuda"
    key = (device.type, device.index, torch.cuda.current_stream(device).cuda_stream if on_gpu else None)
    counters = _COUNTERS.get(key)
    if counters is None:
        counters = persistent(device, lambda: torch.zeros(MAX_SPLIT_TILES, dtype=torch.int32, device=device))
        if not (on_gpu and torch.cuda.is_current_stream_capturing()):
            _COUNTERS[key] = counters
    return counters
