"""Low-latency all-reduce: no barrier at all.

Every rank pushes its input straight into every peer's buffer; each 4-byte data word travels in one
8-byte store together with a flag, ``(epoch << 32) | word`` (the LL protocol). A receiver polls its own
buffer until every slot carries this call's epoch, reduces (fp32, in rank order) and writes its output.
There is no signal, no fence and no exit barrier: data and flag arrive in one single-copy-atomic store,
and the flag of a stale slot (an older epoch) never matches.

Graph safety: the epoch lives on the device, in a per-rank table that every launch advances once
(``launch_epoch`` / ``end_launch``: every program of a launch reads the same epoch, whatever the grid;
plain stores, no atomic), so replays need no host work. Every rank makes the same launches, so the
counters agree across ranks. Two regions alternate by epoch parity: a rank can be at most one launch ahead of a peer still reading (it cannot
finish launch k+1 before every peer has started it, i.e. finished launch k), so launch k+1's pushes
never overwrite launch k's slots. (Per-program counters, the first version, broke when the launch
config changed between calls: a slot then belongs to different programs, whose counters disagree.)

Traffic: each rank writes 2 * (W-1) * S bytes (data + flags) to peers, reads nothing remotely.
Wins at small sizes (a few KB up to ~256 KB), where one-shot's two barriers dominate; the 2x inflation
and the polling cost lose at larger sizes. Messages above LL_MAX_BYTES are sent in pieces.

Layout of the LL region on every rank: [2 phases][WORLD sources][LL_MAX_WORDS] int64 slots; the
source rank writes its slot row in every receiver's region.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import compile_check
from ..language import EPOCH_SLOTS, end_launch, launch_epoch, peer_ptr, wait_flagged
from ..memory import register_op
from ._common import LaunchConfig, SizedConfigs, chunks, combine, finalize, finish, prepare_reduction

LOW_LATENCY = register_op("all_reduce.low_latency")

LL_MAX_BYTES = 512 << 10
LL_MAX_WORDS = LL_MAX_BYTES // 4
# Block = int32 words per program step. From benchmarks/sweep_configs.py on 4x H200.
GPU_LL = SizedConfigs(((8 << 10, LaunchConfig(256, 256, 2)),
                       (64 << 10, LaunchConfig(256, 128, 4)),
                       (1 << 40, LaunchConfig(512, 256, 4))))

# How a 4-byte word holds data: two bf16, two fp16, or one fp32.
_WORD_FORMAT = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


@triton.jit
def _unpack(words, FORMAT: tl.constexpr):
    """The fp32 values in a block of int32 words: (low, high) halves for 16-bit formats."""
    if FORMAT == 2:
        return words.to(tl.float32, bitcast=True), words.to(tl.float32, bitcast=True)
    else:
        half_ty = tl.bfloat16 if FORMAT == 0 else tl.float16
        lo = (words & 0xFFFF).to(tl.int16).to(half_ty, bitcast=True).to(tl.float32)
        hi = ((words >> 16) & 0xFFFF).to(tl.int16).to(half_ty, bitcast=True).to(tl.float32)
        return lo, hi


@triton.jit
def _pack(lo, hi, FORMAT: tl.constexpr):
    if FORMAT == 2:
        return lo.to(tl.int32, bitcast=True)
    else:
        half_ty = tl.bfloat16 if FORMAT == 0 else tl.float16
        lo_bits = lo.to(half_ty).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        hi_bits = hi.to(half_ty).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        return lo_bits | (hi_bits << 16)


@triton.jit
def _low_latency_kernel(
    # symmetric LL region (address table), this rank's launch epoch, error record, wait budget
    ll_ptrs_dev, epochs_ptr, status_ptr, max_spins,
    # this call's tensors, as int32 words
    x_ptr, out_ptr, n_words,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters
    REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, SLOTS: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % 2
    flag = epoch.to(tl.int64) << 32
    lane = tl.arange(0, BLOCK)

    # Push: my words, flagged with this epoch, into my row of every rank's region (mine included).
    my_row = (phase * WORLD + rank) * SLOTS
    for start in range(pid * BLOCK, n_words, nprog * BLOCK):
        offs = start + lane
        mask = offs < n_words
        words = tl.load(x_ptr + offs, mask=mask)
        slots = flag | words.to(tl.uint32).to(tl.int64)
        for r in tl.static_range(WORLD):
            tl.store(peer_ptr(ll_ptrs_dev, r, tl.int64) + my_row + offs, slots, mask=mask)

    # Receive: poll every source row of my own region, reduce in rank order.
    my_region = peer_ptr(ll_ptrs_dev, rank, tl.int64)
    budget = max_spins
    for start in range(pid * BLOCK, n_words, nprog * BLOCK):
        offs = start + lane
        mask = offs < n_words
        slots, budget = wait_flagged(my_region + phase * WORLD * SLOTS + offs, mask, epoch, budget,
                                     status_ptr, rank, 0, op_code)
        acc_lo, acc_hi = _unpack(slots.to(tl.int32), FORMAT)
        for src in tl.static_range(1, WORLD):
            slots, budget = wait_flagged(my_region + (phase * WORLD + src) * SLOTS + offs, mask, epoch,
                                         budget, status_ptr, rank, src, op_code)
            lo, hi = _unpack(slots.to(tl.int32), FORMAT)
            acc_lo = combine(acc_lo, lo, REDUCE_OP)
            acc_hi = combine(acc_hi, hi, REDUCE_OP)
        acc_lo = finalize(acc_lo, REDUCE_OP, WORLD)
        acc_hi = finalize(acc_hi, REDUCE_OP, WORLD)
        tl.store(out_ptr + offs, _pack(acc_lo, acc_hi, FORMAT), mask=mask)

    end_launch(epochs_ptr, epoch)


def padded_words(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``x`` flattened to a whole number of int32 words (a 16-bit tensor of odd length gets one
    spare element), and whether it was padded."""
    flat = x.reshape(-1)
    padded = (flat.numel() * flat.element_size()) % 4 != 0
    if padded:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return flat, padded


def low_latency(x: torch.Tensor, group=None, *, op: str = "sum",
                config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place barrier-free all-reduce for small tensors; returns a new tensor."""
    ws, code, cfg = prepare_reduction(x, group, op, config, GPU_LL)
    region = ws.region("all_reduce.ll", 2 * ws.world_size * LL_MAX_WORDS * 8)
    epochs = ws.local_state("all_reduce.ll.epochs", EPOCH_SLOTS.value)

    flat, padded = padded_words(x)
    out = torch.empty_like(flat)
    src_words, out_words = flat.view(torch.int32), out.view(torch.int32)
    for start, n in chunks(src_words.numel(), LL_MAX_WORDS):
        grid = cfg.grid(triton.cdiv(n, cfg.block))
        _low_latency_kernel[grid](
            region.ptrs_dev, epochs, ws.status_ptr, ws.max_spins,
            src_words[start:], out_words[start:], n,
            ws.rank, LOW_LATENCY,
            WORLD=ws.world_size, REDUCE_OP=code, FORMAT=_WORD_FORMAT[x.dtype], SLOTS=LL_MAX_WORDS,
            BLOCK=cfg.block, num_warps=cfg.num_warps,
        )
    finish(ws)
    if padded:
        out = out[:-1]
    return out.view(x.shape)


for _format in (0, 1, 2):
    for _world in (2, 3, 4, 8):
        compile_check.register(
            _low_latency_kernel,
            {"ll_ptrs_dev": "i64", "epochs_ptr": "*i32", "status_ptr": "i64", "max_spins": "i32",
             "x_ptr": "*i32", "out_ptr": "*i32", "n_words": "i32", "rank": "i32", "op_code": "i32"},
            {"WORLD": _world, "REDUCE_OP": 0 if _world != 3 else 3, "FORMAT": _format,
             "SLOTS": LL_MAX_WORDS, "BLOCK": GPU_LL.largest.block},
            num_warps=GPU_LL.largest.num_warps, label=f"format{_format},")
