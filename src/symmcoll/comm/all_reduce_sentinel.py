"""Barrier-free all-reduce with a sentinel in the data (the Lamport scheme): one-shot and two-shot.

Receive slots in a symmetric region start out holding ``EMPTY`` (0x80008000: two bf16/fp16 negative
zeros; for fp32 a negative denormal). Senders never write ``EMPTY``: before sending, every 16-bit
negative zero becomes +0, and an fp32 word equal to ``EMPTY`` becomes -0.0 (a change of 4.6e-41). A
receiver polls its slots with volatile loads until no word is ``EMPTY`` (``wait_filled``): an aligned
4-byte word lands whole, so any other value is the sender's final value. No signal, no fence, no
barrier, and no flag inflating the data (the flag protocol in all_reduce_low_latency.py doubles it).
After reading, the receiver writes ``EMPTY`` back into the slots it consumed.

sentinel_one_shot
    Every rank stores its (sanitised) input into its row of every peer's slots, then waits for every
    peer's row and reduces all ranks in rank order (fp32; bit-identical results everywhere).
    Traffic: (W-1) * S bytes written to peers per rank. Latency: one NVLink hop.

sentinel_two_shot
    Reduce-scatter then all-gather, both by pushing: shard s of my input goes to rank s's slots; rank s
    reduces its shard and pushes the result into every peer's gather slots; every rank
    copies the gathered shards into its output. Traffic: 2 (W-1)/W * S per rank, all remote stores (no
    round trip waited on). Latency: two hops.

Rotating slot sets keep it graph-safe: each rank keeps a launch counter on the device (``launch_epoch``
/ ``end_launch``: every program of a launch reads the same epoch, every launch advances it once)
and a launch uses slot set ``epoch % PHASES``. Every rank makes the same launches, so the counters
agree across ranks. A rank can be at most one launch ahead of any peer (finishing launch k+1 needs
every peer's launch k+1 data, sent after that peer finished launch k, resets included), so a slot set
is empty again before anybody writes it again. The epoch is the same for every program of a launch
(not a per-program count): launch configs change with the size, so a slot belongs to different
programs in different launches.

Peer tiles: both kernels handle all peers of a block at once, as one [PEERS, BLOCK] tile (row i = rank
i; a pointer per row from the address table): one store sends a block to every peer, one volatile load
of every peer's row is polled with one block-wide reduction, and the rows are reduced in a fixed order
(the same on every rank). Per peer, the loads and polls formed a dependent chain; the tiles took the
two-shot from 92 to 81 us at 16 MB on 4 ranks. On 2 ranks the one-shot keeps its per-peer kernel.

Messages above the size limit of the region go in pieces (one launch each).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import compile_check
from ..language import EPOCH_SLOTS, end_launch, launch_epoch, peer_ptr, wait_filled, wait_filled_rows
from ..memory import register_op
from ._common import LaunchConfig, SizedConfigs, chunks, combine, finalize, finish, prepare_reduction
from .all_reduce_low_latency import _WORD_FORMAT, _pack, _unpack, padded_words

ONE_SHOT = register_op("all_reduce.sentinel_one_shot")
TWO_SHOT = register_op("all_reduce.sentinel_two_shot")
REDUCE_SCATTER = register_op("reduce_scatter.sentinel")

EMPTY: tl.constexpr = tl.constexpr(-2147450880)  # 0x80008000 as int32
_NEG_ZERO_F32: tl.constexpr = tl.constexpr(-2147483648)  # 0x80000000
_HIGH_HALF: tl.constexpr = tl.constexpr(-65536)  # 0xFFFF0000
PHASES: tl.constexpr = tl.constexpr(3)

# Largest message per launch, by device (CPU: keeps the /dev/shm regions small and chunking tested).
MAX_BYTES = {"one_shot": {"cuda": 2 << 20, "cpu": 64 << 10},
             "two_shot": {"cuda": 16 << 20, "cpu": 128 << 10}}
# Block = int32 words per program step. From benchmarks/sweep_configs.py (sentinel_*_tiles against
# sentinel_*_base, benchmarks/results/2026-11-22-sweep; earlier rounds in 2026-11-21-sweep-2 and -3).
# One-shot on 2 ranks keeps the per-peer kernel (one peer: nothing to batch; measured faster).
GPU_ONE_SHOT = SizedConfigs(((128 << 10, LaunchConfig(512, 128, 4)),
                             (256 << 10, LaunchConfig(256, 256, 4)),
                             (1 << 40, LaunchConfig(512, 128, 4))),
                            per_world=((2, ((64 << 10, LaunchConfig(256, 128, 4)),
                                            (128 << 10, LaunchConfig(256, 256, 4)),
                                            (1 << 40, LaunchConfig(128, 512, 4)))),))
GPU_TWO_SHOT = SizedConfigs(
    ((256 << 10, LaunchConfig(512, 132, 4)),
     (1 << 20, LaunchConfig(512, 528, 4)),
     (4 << 20, LaunchConfig(512, 264, 4)),
     (1 << 40, LaunchConfig(512, 528, 4))),
    per_world=((2, ((256 << 10, LaunchConfig(512, 132, 4)),
                    (1 << 20, LaunchConfig(512, 264, 4)),
                    (4 << 20, LaunchConfig(1024, 264, 4)),
                    (1 << 40, LaunchConfig(1024, 528, 4)))),))


@triton.jit
def _sanitize(words, FORMAT: tl.constexpr):
    """Make sure no word equals EMPTY: 16-bit negative zeros -> +0; fp32 EMPTY -> -0.0."""
    if FORMAT == 2:
        return tl.where(words == EMPTY, _NEG_ZERO_F32, words)
    else:
        words = tl.where((words & 0xFFFF) == 0x8000, words & _HIGH_HALF, words)
        return tl.where((words & _HIGH_HALF) == _NEG_ZERO_F32, words & 0xFFFF, words)


@triton.jit
def _take(ptrs, mask, src, rank, budget, status_ptr, op_code):
    """``src``'s words from my slots at ``ptrs`` once filled; the slots are emptied for reuse."""
    words, budget = wait_filled(ptrs, mask, EMPTY, budget, status_ptr, rank, src, op_code)
    tl.store(ptrs, tl.zeros_like(words) + EMPTY, mask=mask)
    return words, budget


@triton.jit
def _receive(x_ptr, slots, offs, slot_offs, mask, src, rank, budget, status_ptr, op_code,
             FORMAT: tl.constexpr):
    """``src``'s words: my own from ``x_ptr``, a peer's from my slots (``_take``)."""
    if src == rank:
        words = _sanitize(tl.load(x_ptr + offs, mask=mask, other=0), FORMAT)
    else:
        words, budget = _take(slots + slot_offs, mask, src, rank, budget, status_ptr, op_code)
    return words, budget


@triton.jit
def _reduce_sources(x_ptr, slots, row_words, offs, slot_offs, mask, rank, budget, status_ptr, op_code,
                    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr):
    """Reduce one block over every rank in rank order; source ``src`` sits at slots + src * row_words.
    Returns the packed, sanitised words and the spin budget left."""
    words, budget = _receive(x_ptr, slots, offs, slot_offs, mask, 0, rank, budget, status_ptr,
                             op_code, FORMAT)
    acc_lo, acc_hi = _unpack(words, FORMAT)
    for src in tl.static_range(1, WORLD):
        words, budget = _receive(x_ptr, slots, offs, src * row_words + slot_offs, mask, src, rank,
                                 budget, status_ptr, op_code, FORMAT)
        lo, hi = _unpack(words, FORMAT)
        acc_lo = combine(acc_lo, lo, REDUCE_OP)
        acc_hi = combine(acc_hi, hi, REDUCE_OP)
    acc_lo = finalize(acc_lo, REDUCE_OP, WORLD)
    acc_hi = finalize(acc_hi, REDUCE_OP, WORLD)
    return _sanitize(_pack(acc_lo, acc_hi, FORMAT), FORMAT), budget


@triton.jit
def _one_shot_kernel(
    # symmetric slot region (address table), this rank's launch epoch, error record, wait budget
    slot_ptrs_dev, epochs_ptr, status_ptr, max_spins,
    # this call's tensors, as int32 words
    x_ptr, out_ptr, n_words,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters: ROW = slots per source row
    REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    epoch = launch_epoch(epochs_ptr)
    phase_base = (epoch % PHASES) * WORLD * ROW
    lane = tl.arange(0, BLOCK)

    # Push my words into my row of every peer's slots.
    for start in range(pid * BLOCK, n_words, step):
        offs = start + lane
        mask = offs < n_words
        words = _sanitize(tl.load(x_ptr + offs, mask=mask), FORMAT)
        for r in tl.static_range(WORLD):
            if r != rank:
                tl.store(peer_ptr(slot_ptrs_dev, r, tl.int32) + phase_base + rank * ROW + offs, words,
                         mask=mask)

    slots = peer_ptr(slot_ptrs_dev, rank, tl.int32) + phase_base
    budget = max_spins
    for start in range(pid * BLOCK, n_words, step):
        offs = start + lane
        mask = offs < n_words
        words, budget = _reduce_sources(x_ptr, slots, ROW, offs, offs, mask, rank, budget, status_ptr,
                                        op_code, WORLD, REDUCE_OP, FORMAT)
        tl.store(out_ptr + offs, words, mask=mask)
    end_launch(epochs_ptr, epoch)


# ---- Peer tiles: every peer's row of a block in one [PEERS, BLOCK] tile, so a block's loads from
# all peers go out together and one poll (one block-wide reduction) covers them all, instead of one
# dependent load-and-poll per peer.

@triton.jit
def _peer_row_ptrs(ptrs_dev, rows, is_peer):
    """[PEERS, 1] int32 pointers: row i -> the region of peer ``rows[i]`` (non-peer rows: my own
    table entry 0; they are always masked off)."""
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    bases = tl.load(table + tl.where(is_peer, rows, 0))
    return tl.multiple_of(bases.to(tl.pointer_type(tl.int32)), 16)[:, None]


@triton.jit
def _take_rows(ptrs, mask, rows, rank, budget, status_ptr, op_code):
    """A [PEERS, BLOCK] tile of my slots once filled (row i from peer ``rows[i]``); the slots are
    emptied for reuse."""
    words, budget = wait_filled_rows(ptrs, mask, rows, EMPTY, budget, status_ptr, rank, op_code)
    tl.store(ptrs, tl.zeros_like(words) + EMPTY, mask=mask)
    return words, budget


@triton.jit
def _reduce_rows(values, valid, OP: tl.constexpr, WORLD: tl.constexpr):
    """op over the valid rows of a [PEERS, BLOCK] fp32 tile (the same order on every rank)."""
    if OP == 2:
        acc = tl.max(tl.where(valid, values, float("-inf")), axis=0)
    elif OP == 3:
        acc = tl.min(tl.where(valid, values, float("inf")), axis=0)
    else:
        acc = tl.sum(tl.where(valid, values, 0.0), axis=0)
    return finalize(acc, OP, WORLD)


@triton.jit
def _reduce_tile(tile, own, rows, rank, WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr):
    """Packed, sanitised op over every rank of a block: peers' words in ``tile``, mine in ``own``."""
    words = tl.where(rows[:, None] == rank, own[None, :], tile)
    lo, hi = _unpack(words, FORMAT)
    valid = rows[:, None] < WORLD
    acc_lo = _reduce_rows(lo, valid, REDUCE_OP, WORLD)
    acc_hi = _reduce_rows(hi, valid, REDUCE_OP, WORLD)
    return _sanitize(_pack(acc_lo, acc_hi, FORMAT), FORMAT)


@triton.jit
def _one_shot_tiles_kernel(
    # symmetric slot region (address table), this rank's launch epoch, error record, wait budget
    slot_ptrs_dev, epochs_ptr, status_ptr, max_spins,
    # this call's tensors, as int32 words
    x_ptr, out_ptr, n_words,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters: ROW = slots per source row; PEERS = WORLD rounded up to a power of two
    REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
    PEERS: tl.constexpr,
):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    epoch = launch_epoch(epochs_ptr)
    phase_base = (epoch % PHASES) * WORLD * ROW
    lane = tl.arange(0, BLOCK)
    rows = tl.arange(0, PEERS)
    is_peer = (rows < WORLD) & (rows != rank)
    peer_rows = _peer_row_ptrs(slot_ptrs_dev, rows, is_peer)

    # Push my words into my row of every peer's slots (one store per peer, all in flight together).
    for start in range(pid * BLOCK, n_words, step):
        offs = start + lane
        mask = offs < n_words
        words = _sanitize(tl.load(x_ptr + offs, mask=mask), FORMAT)
        tl.store(peer_rows + phase_base + rank * ROW + offs[None, :], tl.broadcast_to(words[None, :], (PEERS, BLOCK)),
                 mask=is_peer[:, None] & mask[None, :])

    slots = peer_ptr(slot_ptrs_dev, rank, tl.int32) + phase_base
    budget = max_spins
    for start in range(pid * BLOCK, n_words, step):
        offs = start + lane
        mask = offs < n_words
        tile, budget = _take_rows(slots + rows[:, None] * ROW + offs[None, :], is_peer[:, None] & mask[None, :],
                                  rows, rank, budget, status_ptr, op_code)
        own = _sanitize(tl.load(x_ptr + offs, mask=mask, other=0), FORMAT)
        tl.store(out_ptr + offs, _reduce_tile(tile, own, rows, rank, WORLD, REDUCE_OP, FORMAT), mask=mask)
    end_launch(epochs_ptr, epoch)


@triton.jit
def _two_shot_tiles_kernel(
    # symmetric slot region (address table), this rank's launch epoch, error record, wait budget
    slot_ptrs_dev, epochs_ptr, status_ptr, max_spins,
    # this call's tensors, as int32 words: shard s of x = x[s * x_stride :][:shard_words], valid
    # below n_words
    x_ptr, out_ptr, n_words, shard_words, x_stride,
    # topology
    rank, op_code,
    WORLD: tl.constexpr,
    # meta-parameters: ROW = slots per source row (>= shard_words); GATHER: all-reduce (out shaped
    # like x) rather than reduce-scatter (out = my reduced shard); PEERS = WORLD rounded up to a power of 2
    REDUCE_OP: tl.constexpr, FORMAT: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr,
    GATHER: tl.constexpr, PEERS: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    scatter_base = (epoch % PHASES) * 2 * WORLD * ROW
    gather_base = scatter_base + WORLD * ROW
    blocks = tl.cdiv(shard_words, BLOCK)
    lane = tl.arange(0, BLOCK)
    rows = tl.arange(0, PEERS)
    is_peer = (rows < WORLD) & (rows != rank)
    peer_rows = _peer_row_ptrs(slot_ptrs_dev, rows, is_peer)
    slots = peer_ptr(slot_ptrs_dev, rank, tl.int32)

    # Stage 0: shard s of my input -> my row of rank s's scatter slots, every s at once.
    for b in range(pid, blocks, nprog):
        in_shard = b * BLOCK + lane
        offs = rows[:, None] * x_stride + in_shard[None, :]
        mask = is_peer[:, None] & (in_shard[None, :] < shard_words) & (offs < n_words)
        words = _sanitize(tl.load(x_ptr + offs, mask=mask), FORMAT)
        tl.store(peer_rows + scatter_base + rank * ROW + in_shard[None, :], words, mask=mask)

    # Stage 1: reduce my shard; keep it and push it into my row of every peer's gather slots.
    budget = max_spins
    for b in range(pid, blocks, nprog):
        in_shard = b * BLOCK + lane
        offs = rank * x_stride + in_shard
        mask = (in_shard < shard_words) & (offs < n_words)
        tile_mask = is_peer[:, None] & mask[None, :]
        tile, budget = _take_rows(slots + scatter_base + rows[:, None] * ROW + in_shard[None, :], tile_mask,
                                  rows, rank, budget, status_ptr, op_code)
        own = _sanitize(tl.load(x_ptr + offs, mask=mask, other=0), FORMAT)
        words = _reduce_tile(tile, own, rows, rank, WORLD, REDUCE_OP, FORMAT)
        if GATHER:
            tl.store(out_ptr + offs, words, mask=mask)
            tl.store(peer_rows + gather_base + rank * ROW + in_shard[None, :],
                     tl.broadcast_to(words[None, :], (PEERS, BLOCK)), mask=tile_mask)
        else:
            tl.store(out_ptr + in_shard, words, mask=mask)

    # Stage 2: every other shard from my gather slots into my output.
    if GATHER:
        for b in range(pid, blocks, nprog):
            in_shard = b * BLOCK + lane
            offs = rows[:, None] * x_stride + in_shard[None, :]
            mask = is_peer[:, None] & (in_shard[None, :] < shard_words) & (offs < n_words)
            tile, budget = _take_rows(slots + gather_base + rows[:, None] * ROW + in_shard[None, :], mask,
                                      rows, rank, budget, status_ptr, op_code)
            tl.store(out_ptr + offs, tile, mask=mask)
    end_launch(epochs_ptr, epoch)


# Which one-shot kernel the wrappers launch: None = peer tiles except on 2 ranks (one peer: the per-peer
# kernel measured faster); True/False forces one kind (for measuring them against each other). The
# two-shot always uses peer tiles (faster at every size and world size measured, 2026-11-22-sweep).
PEER_TILES: bool | None = None


def _shard_words(n_words: int, world: int) -> int:
    """Two-shot shard of an n-word piece: ceil(n / W) rounded up to 4 words, so every shard starts
    16-byte aligned (Triton specialises integer arguments divisible by 16)."""
    return triton.cdiv(triton.cdiv(n_words, world), 4) * 4


def _row_words(kind: str, device_type: str, world: int) -> int:
    words = MAX_BYTES[kind][device_type] // 4
    return words if kind == "one_shot" else _shard_words(words, world)


def _slots(ws, kind: str):
    """The slot region and launch-epoch counter of ``kind``, and the slots per source row."""
    world = ws.world_size
    row = _row_words(kind, ws.device.type, world)
    region_words = PHASES.value * world * row * (1 if kind == "one_shot" else 2)
    region = ws.region(f"all_reduce.sentinel_{kind}", region_words * 4, fill_int32=EMPTY.value)
    epochs = ws.local_state(f"all_reduce.sentinel_{kind}.epochs", EPOCH_SLOTS.value)
    return region, epochs, row


def _kernel(kind: str, world: int):
    """The kernel to launch for ``kind`` and its extra meta-parameters."""
    if kind == "two_shot":
        return _two_shot_tiles_kernel, {"PEERS": triton.next_power_of_2(world)}
    tiles = PEER_TILES if PEER_TILES is not None else world > 2
    if tiles:
        return _one_shot_tiles_kernel, {"PEERS": triton.next_power_of_2(world)}
    return _one_shot_kernel, {}


def reduce_scatter_words(ws, x: torch.Tensor, out: torch.Tensor, code: int, cfg: LaunchConfig) -> None:
    """Reduce-scatter by pushing (stages 0 and 1 of the two-shot kernel): ``x`` holds W segments of
    ``out.numel()`` elements along dim 0, each a whole number of int32 words."""
    region, epochs, row = _slots(ws, "two_shot")
    x_words, out_words = x.reshape(-1).view(torch.int32), out.reshape(-1).view(torch.int32)
    segment = out_words.numel()
    kernel, extra = _kernel("two_shot", ws.world_size)
    for start, n in chunks(segment, row):
        kernel[cfg.grid(triton.cdiv(n, cfg.block))](
            region.ptrs_dev, epochs, ws.status_ptr, ws.max_spins,
            x_words[start:], out_words[start:], (ws.world_size - 1) * segment + n, n, segment,
            ws.rank, REDUCE_SCATTER, WORLD=ws.world_size, REDUCE_OP=code, FORMAT=_WORD_FORMAT[x.dtype],
            ROW=row, BLOCK=cfg.block, num_warps=cfg.num_warps, GATHER=False, **extra)
    finish(ws)


def _run(kind: str, x: torch.Tensor, group, op: str, config: LaunchConfig | None) -> torch.Tensor:
    ws, code, cfg = prepare_reduction(x, group, op, config,
                                      GPU_ONE_SHOT if kind == "one_shot" else GPU_TWO_SHOT)
    world = ws.world_size
    region, epochs, row = _slots(ws, kind)
    flat, padded = padded_words(x)
    out = torch.empty_like(flat)
    src_words, out_words = flat.view(torch.int32), out.view(torch.int32)
    kernel, extra = _kernel(kind, world)
    common = dict(WORLD=world, REDUCE_OP=code, FORMAT=_WORD_FORMAT[x.dtype], ROW=row, BLOCK=cfg.block,
                  num_warps=cfg.num_warps, **extra)
    piece = MAX_BYTES[kind][ws.device.type] // 4
    for start, n in chunks(src_words.numel(), piece):
        if kind == "one_shot":
            kernel[cfg.grid(triton.cdiv(n, cfg.block))](
                region.ptrs_dev, epochs, ws.status_ptr, ws.max_spins,
                src_words[start:], out_words[start:], n, ws.rank, ONE_SHOT, **common)
        else:
            shard = _shard_words(n, world)
            kernel[cfg.grid(triton.cdiv(shard, cfg.block))](
                region.ptrs_dev, epochs, ws.status_ptr, ws.max_spins,
                src_words[start:], out_words[start:], n, shard, shard, ws.rank, TWO_SHOT, **common,
                GATHER=True)
    finish(ws)
    if padded:
        out = out[:-1]
    return out.view(x.shape)


def sentinel_one_shot(x: torch.Tensor, group=None, *, op: str = "sum",
                      config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place barrier-free one-shot all-reduce; returns a new tensor."""
    return _run("one_shot", x, group, op, config)


def sentinel_two_shot(x: torch.Tensor, group=None, *, op: str = "sum",
                      config: LaunchConfig | None = None) -> torch.Tensor:
    """Out-of-place barrier-free two-shot (push reduce-scatter + push all-gather); returns a new
    tensor."""
    return _run("two_shot", x, group, op, config)


_SIGNATURE = {"slot_ptrs_dev": "i64", "epochs_ptr": "*i32", "status_ptr": "i64", "max_spins": "i32",
              "x_ptr": "*i32", "out_ptr": "*i32", "n_words": "i32"}
for _format in (0, 1, 2):
    for _world in (2, 3, 4, 8):
        _meta = {"WORLD": _world, "REDUCE_OP": 0 if _world != 3 else 3, "FORMAT": _format}
        compile_check.register(
            _one_shot_kernel, {**_SIGNATURE, "rank": "i32", "op_code": "i32"},
            {**_meta, "ROW": _row_words("one_shot", "cuda", _world), "BLOCK": GPU_ONE_SHOT.largest.block},
            num_warps=GPU_ONE_SHOT.largest.num_warps, label=f"format{_format},")
        for _gather in (True, False):
            compile_check.register(
                _two_shot_tiles_kernel,
                {**_SIGNATURE, "shard_words": "i32", "x_stride": "i32", "rank": "i32", "op_code": "i32"},
                {**_meta, "ROW": _row_words("two_shot", "cuda", _world), "BLOCK": GPU_TWO_SHOT.largest.block,
                 "GATHER": _gather, "PEERS": triton.next_power_of_2(_world)},
                num_warps=GPU_TWO_SHOT.largest.num_warps, label=f"format{_format},")
        compile_check.register(
            _one_shot_tiles_kernel, {**_SIGNATURE, "rank": "i32", "op_code": "i32"},
            {**_meta, "ROW": _row_words("one_shot", "cuda", _world), "BLOCK": GPU_ONE_SHOT.largest.block,
             "PEERS": triton.next_power_of_2(_world)},
            num_warps=GPU_ONE_SHOT.largest.num_warps, label=f"format{_format},")
