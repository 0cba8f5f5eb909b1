"""all-reduce + residual add + RMSNorm (+ fp8 quantization) in one kernel: the tail of every
tensor-parallel transformer block.

x, residual [..., H] (residual the same on every rank), weight [H]; returns normed and new_residual:

    new_residual = residual + sum over ranks of x            (fp32, rounded once to x.dtype)
    normed       = new_residual * rsqrt(mean(new_residual^2) + eps) * weight    (from the rounded residual)

Optionally normed comes out as fp8 e4m3 for the next GEMM: ``quant="fp8_per_tensor"`` divides by a
given ``scale`` (a one-element fp32 tensor, read on the device); ``"fp8_per_token"`` computes a scale
per row (max |row| / 448) and returns the scales too. Both clamp to +-448 before rounding.

Both kernels are the sentinel (Lamport) all-reduces of comm/sentinel.py with whole rows as the unit of
work, so the norm, which needs a whole row, runs where the row's sum appears. Slots start EMPTY; senders
store sanitised words (language.tiles.words_of: no word equals EMPTY); a receiver polls its slots until
no word is EMPTY, reads them and empties them again. Slot sets rotate by launch epoch (epoch % 3) and
each region starts with epoch-tagged call headers, exactly as in the sentinel all-reduce.

one_shot
    Program p owns rows p, p+P, ... . It stores its rows of x into its row of every peer's slots, then
    per row polls every peer's words as one [PEERS, row] tile, sums all ranks in rank order (fp32; the
    same words everywhere: every rank's result is bit-identical), adds the residual and normalises.
    Traffic: (W-1) * S stored per rank. For a few hundred KB per rank (decode).

two_shot
    Rows are cut into W shards of whole rows, ceil(T / W) each (the last short or empty); rank s owns
    shard s. Stage 0: shard s of my x goes to rank s's scatter slots. Stage 1: I sum my shard's rows,
    add the residual, round: the new residual rows are stored, normalised, and pushed (as words) into
    every peer's gather slots. Stage 2: I take every peer's new residual rows from my gather slots,
    store them and normalise them here (the norm is recomputed where the rows land, so the gather moves
    the residual only: the all-reduce's volume, 2 (W-1)/W * S per rank). Every rank normalises the
    same words: results agree bit for bit. Program p handles row i = p, p+P, ... of every shard in every
    stage, so it waits only on program p of its peers.

Rows longer than MAX_HIDDEN elements run the unfused baseline; more rows than the slots hold go in
pieces of whole rows (one launch each).

nccl / unfused
    The process group's all-reduce / symmcoll.all_reduce ("auto"), then torch: residual + sum (rounded),
    torch.nn.functional.rms_norm (fp32 when quantizing), and the same quantization in torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from .. import ops, plan
from ..comm.sentinel import HEADER_WORDS, PHASES, _peer_rows, _take_rows
from ..language import (EMPTY, EPOCH_SLOTS, MAX_WORLD, WORD_FORMAT, announce, end_launch, launch_epoch, narrow,
                        peer_ptr, post_header, values_of, words_of)
from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..plan import Algorithm, register, register_op

OP = "all_reduce_rms_norm"
QUANT = {None: 0, "fp8_per_tensor": 1, "fp8_per_token": 2}
MAX_HIDDEN = 32768
# int32 words per (phase, [scatter|gather,] source) slot row. CPU rows are small, so that the CPU tests
# run the multi-piece path.
ONE_SHOT_WORDS = {"cuda": 1 << 19, "cpu": 256}
TWO_SHOT_WORDS = {"cuda": 1 << 19, "cpu": 128}
# "auto": the one-shot kernel up to this many bytes of x per rank (4 ranks; twice as many on 2).
ONE_SHOT_MAX_BYTES = 256 << 10
FP8_MAX: tl.constexpr = tl.constexpr(448.0)  # largest float8_e4m3fn
MIN_AMAX: tl.constexpr = tl.constexpr(1e-12)  # per-token scales of all-zero rows stay finite


def _slots(kind: str, sets: int, words: dict):
    rule = ("rank s writes only its row of slot set epoch % 3 (and its header) in each receiver; the receiver "
            "empties what it read; a set is written again only after every receiver emptied it")
    slots = declare(RegionSpec(f"{OP}.{kind}.slots", f"fused.{OP}",
                               lambda g: (HEADER_WORDS.value + PHASES.value * sets * g.world_size
                                          * words[g.device_type]) * 4, rule, fill_int32=EMPTY.value))
    epochs = declare(RegionSpec(f"{OP}.{kind}.epochs", f"fused.{OP}", lambda g: EPOCH_SLOTS.value,
                                "this rank's launch-epoch table (kernels only)", symmetric=False))
    return slots, epochs


ONE_SHOT_SLOTS, ONE_SHOT_EPOCHS = _slots("one_shot", 1, ONE_SHOT_WORDS)
TWO_SHOT_SLOTS, TWO_SHOT_EPOCHS = _slots("two_shot", 2, TWO_SHOT_WORDS)


@triton.jit
def _row_words(x_ptr, row_ids, row_ok, H, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rows ``row_ids`` ([R]) of x as sanitised words [R, ROW_BLOCK] (zeros where not ``row_ok``)."""
    elems = tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (elems < H)[None, :]
    values = tl.load(x_ptr + row_ids[:, None].to(tl.int64) * H + elems[None, :], mask=mask, other=0).to(tl.float32)
    R: tl.constexpr = row_ids.shape[0]
    return tl.reshape(words_of(tl.reshape(values, [R * BLOCK_H]), FORMAT, R * ROW_BLOCK), [R, ROW_BLOCK])


@triton.jit
def _word_values(words, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
    """[R, ROW_BLOCK] words -> [R, BLOCK_H] fp32 values."""
    R: tl.constexpr = words.shape[0]
    return tl.reshape(values_of(tl.reshape(words, [R * ROW_BLOCK]), FORMAT, R * ROW_BLOCK), [R, BLOCK_H])


@triton.jit
def _finish_rows(new_residual, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H,
                 eps, QUANT: tl.constexpr, BLOCK_H: tl.constexpr):
    """Store rows ``row_ids`` of the new residual ([R, BLOCK_H] fp32, already rounded to the output
    dtype) and of the normalised (and maybe quantized) rows; per-token scales as well."""
    elems = tl.arange(0, BLOCK_H)
    in_row = (elems < H)[None, :]
    mask = row_ok[:, None] & in_row
    offs = row_ids[:, None].to(tl.int64) * H + elems[None, :]
    tl.store(residual_out_ptr + offs, narrow(new_residual, residual_out_ptr.dtype.element_ty), mask=mask)
    squares = tl.where(in_row, new_residual * new_residual, 0.0)
    inv_rms = tl.rsqrt(tl.sum(squares, axis=1) / H + eps)
    weight = tl.load(weight_ptr + elems, mask=elems < H, other=0).to(tl.float32)
    normed = new_residual * inv_rms[:, None] * weight[None, :]
    if QUANT == 0:
        tl.store(normed_ptr + offs, narrow(normed, normed_ptr.dtype.element_ty), mask=mask)
    else:
        if QUANT == 1:
            scaled = normed / tl.load(scale_ptr)
        else:
            scales = tl.maximum(tl.max(tl.where(in_row, tl.abs(normed), 0.0), axis=1), MIN_AMAX) / FP8_MAX
            tl.store(scales_ptr + row_ids, scales, mask=row_ok)
            scaled = normed / scales[:, None]
        clamped = tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX)
        tl.store(normed_ptr + offs, narrow(clamped, normed_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_one_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # inputs [rows, H] (weight [H], scale [1]) and outputs (scales [rows]) of this piece
    x_ptr, residual_ptr, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, rows, H, eps,
    # ROW_BLOCK: words per row rounded up to a power of 2 (BLOCK_H elements); SLOT_WORDS: per source row;
    # PEERS = WORLD rounded up to a power of 2; QUANT: 0 none, 1 fp8 per tensor, 2 fp8 per token
    WORLD: tl.constexpr, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
    SLOT_WORDS: tl.constexpr, PEERS: tl.constexpr, QUANT: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % PHASES
    base = HEADER_WORDS + phase * WORLD * SLOT_WORDS
    row_words = tl.cdiv(H, BLOCK_H // ROW_BLOCK)
    lanes = tl.arange(0, ROW_BLOCK)
    peers = tl.arange(0, PEERS)
    is_peer = (peers < WORLD) & (peers != rank)
    peer_rows = _peer_rows(slot_ptrs_dev, peers, is_peer)
    one = tl.full([1], 1, tl.int1)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    post_header(slot_ptrs_dev, phase, epoch, desc, rank, WORLD)
    # Stage 1: my rows into my row of every peer's slots (one tile store reaches every peer).
    for row in range(pid, rows, nprog):
        words = _row_words(x_ptr, tl.zeros([1], tl.int32) + row, one, H, FORMAT, ROW_BLOCK, BLOCK_H)
        tl.store(peer_rows + base + rank * SLOT_WORDS + row * row_words + lanes[None, :],
                 tl.broadcast_to(words, (PEERS, ROW_BLOCK)), mask=is_peer[:, None] & (lanes < row_words)[None, :])
    # Stage 2: per row, every peer's words at once; sum in rank order, add, normalise.
    region = peer_ptr(slot_ptrs_dev, rank, tl.int32)
    headers = region.to(tl.pointer_type(tl.int64)) + phase * MAX_WORLD
    budget = max_spins
    check = 1
    for row in range(pid, rows, nprog):
        row_id = tl.zeros([1], tl.int32) + row
        tile, budget = _take_rows(region + base + peers[:, None] * SLOT_WORDS + row * row_words + lanes[None, :],
                                  is_peer[:, None] & (lanes < row_words)[None, :], peers, rank, budget, status_ptr,
                                  desc, headers, epoch, check, WORLD)
        check = 0
        own = _row_words(x_ptr, row_id, one, H, FORMAT, ROW_BLOCK, BLOCK_H)
        values = _word_values(tl.where(peers[:, None] == rank, own, tile), FORMAT, ROW_BLOCK, BLOCK_H)
        total = tl.sum(tl.where((peers < WORLD)[:, None], values, 0.0), axis=0)
        if budget > 0:
            elems = tl.arange(0, BLOCK_H)
            residual = tl.load(residual_ptr + tl.cast(row, tl.int64) * H + elems, mask=elems < H, other=0).to(tl.float32)
            new_residual = narrow(total + residual, residual_out_ptr.dtype.element_ty).to(tl.float32)
            _finish_rows(new_residual[None, :], row_id, one, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr,
                         scales_ptr, H, eps, QUANT, BLOCK_H)
    end_launch(epochs_ptr, epoch)


@triton.jit
def rms_norm_two_shot_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the slot region's address table; this rank's launch-epoch table
    desc, slot_ptrs_dev, epochs_ptr,
    # inputs [rows, H] (weight [H], scale [1]) and outputs (scales [rows]) of this piece; shard s = rows
    # [s * shard_rows, (s + 1) * shard_rows) below ``rows``
    x_ptr, residual_ptr, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, rows, shard_rows, H, eps,
    WORLD: tl.constexpr, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr,
    SLOT_WORDS: tl.constexpr, PEERS: tl.constexpr, QUANT: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % PHASES
    scatter_base = HEADER_WORDS + phase * 2 * WORLD * SLOT_WORDS
    gather_base = scatter_base + WORLD * SLOT_WORDS
    row_words = tl.cdiv(H, BLOCK_H // ROW_BLOCK)
    lanes = tl.arange(0, ROW_BLOCK)
    in_row = (lanes < row_words)[None, :]
    peers = tl.arange(0, PEERS)
    is_peer = (peers < WORLD) & (peers != rank)
    peer_rows = _peer_rows(slot_ptrs_dev, peers, is_peer)
    region = peer_ptr(slot_ptrs_dev, rank, tl.int32)
    headers = region.to(tl.pointer_type(tl.int64)) + phase * MAX_WORLD
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    post_header(slot_ptrs_dev, phase, epoch, desc, rank, WORLD)
    # Stage 0: row i of shard s of my x -> my row of rank s's scatter slots, every s at once.
    for i in range(pid, shard_rows, nprog):
        their_rows = peers * shard_rows + i
        sent = is_peer & (their_rows < rows)
        words = _row_words(x_ptr, their_rows, sent, H, FORMAT, ROW_BLOCK, BLOCK_H)
        tl.store(peer_rows + scatter_base + rank * SLOT_WORDS + i * row_words + lanes[None, :], words,
                 mask=sent[:, None] & in_row)
    # Stage 1: my rows: sum, add, round; store, normalise, and push the new residual to every peer.
    budget = max_spins
    check = 1
    one = tl.full([1], 1, tl.int1)
    for i in range(pid, shard_rows, nprog):
        row = rank * shard_rows + i
        mine = tl.zeros([1], tl.int32) + row
        mine_ok = mine < rows
        received = is_peer & (row < rows)
        tile, budget = _take_rows(region + scatter_base + peers[:, None] * SLOT_WORDS + i * row_words + lanes[None, :],
                                  received[:, None] & in_row, peers, rank, budget, status_ptr, desc, headers, epoch,
                                  check, WORLD)
        check = 0
        own = _row_words(x_ptr, mine, mine_ok, H, FORMAT, ROW_BLOCK, BLOCK_H)
        values = _word_values(tl.where(peers[:, None] == rank, own, tile), FORMAT, ROW_BLOCK, BLOCK_H)
        total = tl.sum(tl.where((peers < WORLD)[:, None], values, 0.0), axis=0)
        elems = tl.arange(0, BLOCK_H)
        residual = tl.load(residual_ptr + tl.cast(row, tl.int64) * H + elems, mask=(elems < H) & (row < rows),
                           other=0).to(tl.float32)
        # The new residual as the peers will see it (rounded and sanitised alike).
        words = words_of(narrow(total + residual, residual_out_ptr.dtype.element_ty).to(tl.float32), FORMAT, ROW_BLOCK)
        if budget > 0:
            _finish_rows(values_of(words, FORMAT, ROW_BLOCK)[None, :], mine, mine_ok & one, weight_ptr, scale_ptr,
                         normed_ptr, residual_out_ptr, scales_ptr, H, eps, QUANT, BLOCK_H)
            tl.store(peer_rows + gather_base + rank * SLOT_WORDS + i * row_words + lanes[None, :],
                     tl.broadcast_to(words[None, :], (PEERS, ROW_BLOCK)), mask=received[:, None] & in_row)
    # Stage 2: every peer's new residual rows from my gather slots; store and normalise them here.
    for i in range(pid, shard_rows, nprog):
        their_rows = peers * shard_rows + i
        received = is_peer & (their_rows < rows)
        tile, budget = _take_rows(region + gather_base + peers[:, None] * SLOT_WORDS + i * row_words + lanes[None, :],
                                  received[:, None] & in_row, peers, rank, budget, status_ptr, desc, headers, epoch, 0,
                                  WORLD)
        if budget > 0:
            _finish_rows(_word_values(tile, FORMAT, ROW_BLOCK, BLOCK_H), their_rows, received, weight_ptr, scale_ptr,
                         normed_ptr, residual_out_ptr, scales_ptr, H, eps, QUANT, BLOCK_H)
    end_launch(epochs_ptr, epoch)


# ---- host side ---------------------------------------------------------------------------------------

def _outputs(x: torch.Tensor, quant: str | None):
    """(normed, new_residual, scales) as [rows, H] / [rows] views of the returned tensors."""
    h = x.shape[-1]
    normed = torch.empty(x.shape, dtype=torch.float8_e4m3fn if quant else x.dtype, device=x.device)
    scales = torch.empty((*x.shape[:-1], 1) if quant == "fp8_per_token" else (0,), dtype=torch.float32,
                         device=x.device)
    return normed, torch.empty_like(x), scales, h


def _launch_config(p: plan.Plan, h: int, itemsize: int) -> tuple[dict, int]:
    """Constexprs of both kernels and their programs' cap."""
    row_block = triton.next_power_of_2(triton.cdiv(h, 4 // itemsize))
    block_h = row_block * (4 // itemsize)
    if p.ws.device.type == "cuda":
        warps, programs = (16 if block_h >= 8192 else 8 if block_h >= 2048 else 4), 132
    else:
        warps, programs = p.config.num_warps, p.config.max_programs
    return dict(WORLD=p.world, FORMAT=WORD_FORMAT[p.request.dtype], ROW_BLOCK=row_block, BLOCK_H=block_h,
                PEERS=triton.next_power_of_2(p.world), QUANT=QUANT[dict(p.request.options)["quant"]],
                num_warps=warps), programs


def _kernel_run(kind: str):
    one_shot = kind == "one_shot"
    kernel = rms_norm_one_shot_kernel if one_shot else rms_norm_two_shot_kernel
    slots, epochs_spec, words = ((ONE_SHOT_SLOTS, ONE_SHOT_EPOCHS, ONE_SHOT_WORDS) if one_shot
                                 else (TWO_SHOT_SLOTS, TWO_SHOT_EPOCHS, TWO_SHOT_WORDS))

    def run(p: plan.Plan, x: torch.Tensor, _out, residual, weight, scale=None):
        ws, world = p.ws, p.world
        eps, quant = dict(p.request.options)["eps"], dict(p.request.options)["quant"]
        normed, new_residual, scales, h = _outputs(x, quant)
        meta, max_programs = _launch_config(p, h, x.element_size())
        slot_words = words[ws.device.type]
        row_words = triton.cdiv(h, meta["BLOCK_H"] // meta["ROW_BLOCK"])
        total = x.numel() // h if h else 0
        # Rows per launch: one slot row holds every row of a piece (one-shot) or of a piece's shard.
        piece = slot_words // row_words * (1 if one_shot else world)
        region, epochs = ws.region(slots.name), ws.local_state(epochs_spec.name)
        flat = [t.reshape(-1) for t in (x, residual, normed, new_residual)]
        scale_arg = scale if scale is not None else scales
        for start in range(0, total, piece):
            rows = min(piece, total - start)
            shard = rows if one_shot else triton.cdiv(rows, world)
            pieces = [t[start * h:] for t in flat]
            sizes = (rows, h, eps) if one_shot else (rows, shard, h, eps)
            launch(kernel, (max(1, min(max_programs, shard)),),
                   (*ws.kernel_args, p.desc, region.ptrs_dev, epochs, pieces[0], pieces[1], weight, scale_arg,
                    pieces[2], pieces[3], scales.reshape(-1)[start:] if scales.numel() else scales, *sizes),
                   dict(meta, SLOT_WORDS=slot_words))
        return normed, new_residual, scales
    return run


def _torch_tail(p: plan.Plan, total: torch.Tensor, residual, weight, scale):
    """The baselines' tail in torch: add (rounded to the dtype), RMSNorm, quantize."""
    eps, quant = dict(p.request.options)["eps"], dict(p.request.options)["quant"]
    new_residual = residual + total
    h = new_residual.shape[-1]
    if quant is None:
        return torch.nn.functional.rms_norm(new_residual, (h,), weight, eps), new_residual, total.new_empty((0,),
                                                                                                        dtype=torch.float32)
    normed = torch.nn.functional.rms_norm(new_residual.float(), (h,), weight.float(), eps)
    if quant == "fp8_per_tensor":
        scales = normed.new_empty((0,))
        normed = normed / scale
    else:
        scales = normed.abs().amax(-1, keepdim=True).clamp_min(MIN_AMAX.value) / FP8_MAX.value
        normed = normed / scales
    return normed.clamp(-FP8_MAX.value, FP8_MAX.value).to(torch.float8_e4m3fn), new_residual, scales


def _nccl(p: plan.Plan, x, _out, residual, weight, scale=None):
    total = x.clone()
    dist.all_reduce(total, group=p.group)
    return _torch_tail(p, total, residual, weight, scale)


def _unfused(p: plan.Plan, x, _out, residual, weight, scale=None):
    total = plan.resolve("all_reduce", x, p.group, "auto").execute(x)
    return _torch_tail(p, total, residual, weight, scale)


def _shape_rule(request: plan.Request, world: int):
    options = dict(request.options)
    shape, quant = request.shape, options["quant"]
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension (the hidden size is its last), got a 0-dim tensor")
    if request.dtype not in plan.REDUCTION_DTYPES:
        raise ValueError(f"x.dtype must be bf16, fp16 or fp32, got {request.dtype}")
    if quant not in QUANT:
        raise ValueError(f"quant must be None, 'fp8_per_tensor' or 'fp8_per_token', got {quant!r}")
    if not options["eps"] >= 0:
        raise ValueError(f"eps must be a number >= 0, got {options['eps']!r}")
    names = ["residual", "weight", "scale"]
    for name, (other_shape, dtype, device) in zip(names, request.others):
        if device != request.device:
            raise ValueError(f"{name} is on {device}, x on {request.device}: all must be on this rank's device")
    (res_shape, res_dtype, _), (w_shape, w_dtype, _) = request.others[:2]
    if res_shape != shape or res_dtype != request.dtype:
        raise ValueError(f"residual must have x's shape {shape} and dtype {request.dtype}, got {res_shape} {res_dtype}")
    if w_shape != shape[-1:] or not w_dtype.is_floating_point:
        raise ValueError(f"weight must be a float vector of shape ({shape[-1]},), got {w_shape} {w_dtype}")
    has_scale = len(request.others) > 2
    if (quant == "fp8_per_tensor") != has_scale:
        raise ValueError("scale (a one-element fp32 tensor) is required with quant='fp8_per_tensor' and only then")
    if has_scale and (request.others[2][0] not in ((), (1,)) or request.others[2][1] != torch.float32):
        raise ValueError(f"scale must be a one-element fp32 tensor, got {request.others[2][0]} {request.others[2][1]}")
    return None, (request.numel << 4) ^ (shape[-1] << 2) ^ QUANT[quant]


def _kernel_reason(request: plan.Request, world: int) -> str | None:
    if request.shape[-1] > MAX_HIDDEN:
        return f"rows of {request.shape[-1]} elements are longer than the kernels' {MAX_HIDDEN}"
    return None


def _default(request: plan.Request, world: int) -> str:
    return "one_shot" if request.nbytes <= ONE_SHOT_MAX_BYTES * (2 if world <= 2 else 1) else "two_shot"


register_op(OP, _shape_rule, default=_default)
register(Algorithm(OP, plan.BACKEND, 80, "backend", _nccl, "the process group's all-reduce, then torch add + RMSNorm"))
register(Algorithm(OP, "unfused", 81, "fused", _unfused, "symmcoll.all_reduce, then torch add + RMSNorm"))
register(Algorithm(OP, "one_shot", 82, "fused", _kernel_run("one_shot"),
                   "sentinel one-shot over whole rows with the residual add and RMSNorm (+ fp8) inside",
                   accepts=_kernel_reason, instead="unfused"))
register(Algorithm(OP, "two_shot", 83, "fused", _kernel_run("two_shot"),
                   "sentinel two-shot over shards of whole rows: norm at the owner and where gathered rows land",
                   accepts=_kernel_reason, instead="unfused"))


def all_reduce_rms_norm_impl(x, residual, weight, eps: float, group_name: str, algorithm: str, quant: str,
                             scale=None):
    """(normed, new_residual, scales); ``quant`` "" for none; scales empty unless fp8_per_token."""
    others = (residual, weight) if scale is None else (residual, weight, scale)
    for name, t in zip(("x", "residual", "weight", "scale"), (x, *others)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (got shape {tuple(t.shape)}, strides {tuple(t.stride())})")
    options = (("eps", float(eps)), ("quant", quant or None))
    return plan.resolve(OP, x, ops.resolve_group(group_name), algorithm, others=others,
                        options=options).execute(x, others=others)


def _fake(x, residual, weight, eps, group_name, algorithm, quant, scale=None):
    normed, new_residual, scales, _ = _outputs(x, quant or None)
    return normed, new_residual, scales


ops.define(OP, "(Tensor x, Tensor residual, Tensor weight, float eps, str group_name, str algorithm, str quant, "
               "Tensor? scale=None) -> (Tensor, Tensor, Tensor)", all_reduce_rms_norm_impl, _fake)


def compile_cases(make_workspace):
    """Both kernels' launches on meta tensors: hidden 8192 and 6144, an odd hidden size, every quant
    mode and dtype, every world size, rank 1 somewhere."""
    cases = []
    for kind in ("one_shot", "two_shot"):
        for world, rank, dtype, (tokens, h), quant in ((2, 1, torch.bfloat16, (6, 8192), None),
                                                       (4, 0, torch.bfloat16, (138, 6144), "fp8_per_token"),
                                                       (3, 1, torch.float16, (33, 4099), "fp8_per_tensor"),
                                                       (8, 1, torch.float32, (512, 1024), None)):
            def thunk(kind=kind, world=world, rank=rank, dtype=dtype, tokens=tokens, h=h, quant=quant):
                x = torch.empty((tokens, h), dtype=dtype, device="meta")
                others = (torch.empty_like(x), torch.empty((h,), dtype=dtype, device="meta"))
                if quant == "fp8_per_tensor":
                    others += (torch.empty((1,), dtype=torch.float32, device="meta"),)
                request = plan.Request(OP, (tokens, h), dtype, torch.device("cuda"),
                                       options=(("eps", 1e-6), ("quant", quant)))
                p = plan.Plan(request, "kernel", plan.algorithms(OP)[kind], None, world, rank,
                              make_workspace(world, rank), None, 3, None)
                p.algorithm.run(p, x, None, *others)
            cases.append((f"{OP}.{kind} ws{world} {tokens}x{h} {quant}", thunk))
    return cases
