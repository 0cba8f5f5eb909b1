"""all-reduce + residual add + RMSNorm (+ fp8 quantization) in one kernel: the tail of every
tensor-parallel transformer block.

x, residual [..., H] (residual the same on every rank), weight [H]; returns normed and new_residual:

    new_residual = residual + sum over ranks of x            (fp32, rounded once to x.dtype)
    normed       = new_residual * rsqrt(mean(new_residual^2) + eps) * weight    (from the rounded residual)

Optionally normed comes out as fp8 e4m3 for the next GEMM: ``quant="fp8_per_tensor"`` divides by a
given ``scale`` (a one-element fp32 tensor, read on the device); ``"fp8_per_token"`` computes a scale
per row (max |row| / 448) and returns the scales too. Both clamp to +-448 before rounding.

Both kernels are the sentinel (Lamport) all-reduces of comm/sentinel.py with whole rows as the unit of
work, so the norm, which needs a whole row, runs where the row's sum appears: sanitised words (never
EMPTY) stored into peers' slots, polled until no word is EMPTY, emptied after reading; slot sets rotate
by launch epoch (epoch % 3) behind epoch-tagged call headers. Every rank adds the same words in rank
order, so results agree bit for bit. Program p handles the same rows in every stage, so it waits only
on program p of its peers. (docs/algorithms.md has the pictures.)

Where what lives (one algorithm a file):
    fused/rms_one_shot.py   the one-shot kernel: every peer's rows in one tile; (W-1) * S stored per
                            rank, for decode-sized inputs; on one rank the local kernel ("auto")
    fused/rms_two_shot.py   the two-shot kernel: scatter shards of whole rows, sum and normalise at
                            the owner, gather the new residual only (2 (W-1)/W * S per rank)
    fused/rms_rows.py       the row math both share: words, the sum over ranks, the norm, fp8 output
    this file               slot sizes, launch rules, the "auto" choice (AUTO_ONE_SHOT_MAX_BYTES), the
                            launcher of both kernels, the nccl / unfused paths and the op's declaration

Rows longer than MAX_HIDDEN elements run the unfused baseline; more rows than the slots hold go in
pieces of whole rows (one launch each). The local work of a step is one pass over whole rows, or (a
config ``block`` of less than a row) two passes over a row in chunks, the second reading back the new
residual the first wrote (fused/rms_rows.py): x, residual and weight read once from HBM (my own rows as
values, never through words), new residual and normed written once. Launch: ``gpu_config`` (values per
step, programs, warps; on one rank the table measured on this GPU model), overridable per call
(``plan.resolve(..., config=)``) for the roofline sweep.

nccl / unfused
    The process group's all-reduce / symmcoll.all_reduce ("auto"), then torch: residual + sum (rounded),
    RMSNorm in fp32 as the kernels' formula (not torch.nn.functional.rms_norm, whose CUDA kernel makes a
    row holding Inf all NaN: ``_rms_norm``), and the same quantization in torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton

from .. import ops, plan
from ..language import WORD_FORMAT, declare_slots
from ..launcher import launch, pdl_meta
from ..memory.layout import MAX_PROGRAMS
from ..plan import Algorithm, LaunchConfig
from . import memory_bound_configs
from .gemm import num_sms
from .rms_one_shot import rms_norm_one_shot_kernel
from .rms_rows import FP8_MAX, MIN_AMAX
from .rms_two_shot import rms_norm_two_shot_kernel

OP = "all_reduce_rms_norm"
QUANT = {None: 0, "fp8_per_tensor": 1, "fp8_per_token": 2}
MAX_HIDDEN = 32768
# Several ranks: the kernels' small-tensor launch rule up to this many bytes of x per rank (4 ranks; twice as
# many on 2), the bulk rule past it.
ONE_SHOT_MAX_BYTES = 256 << 10
# "auto" on several ranks: the one-shot kernel up to this many bytes of x per rank, the two-shot past it. On 4x
# H100 (2026-11-27, benchmarks/results/2026-11-27-rowpar-branches-h100x4/rms2, both kernels at their bulk rule)
# one-shot 12.4 / 16.9 us against two-shot 16.9 / 17.9 at 512 KiB / 1 MiB, two-shot ahead from 2 MiB (20.3 against
# 26.4). On 2 ranks one-shot reads half the peer bytes, so it holds at least as far.
AUTO_ONE_SHOT_MAX_BYTES = 1 << 20
# Several ranks past the one-shot sizes: bytes of a row a step holds (gpu_config's bulk rule).
ROW_CHUNK_BYTES = 8 << 10


def one_shot_max_bytes(world: int) -> int:
    """The most bytes of x per rank the small-tensor launch rule takes on several ranks."""
    return ONE_SHOT_MAX_BYTES * (2 if world <= 2 else 1)


def auto_kernel(nbytes: int, world: int) -> str:
    """The kernel "auto" runs for ``nbytes`` of x per rank (no table rule)."""
    return "one_shot" if world == 1 or nbytes <= AUTO_ONE_SHOT_MAX_BYTES else "two_shot"


def one_shot_words(device_type: str, world: int) -> int:
    """int32 words per (phase, source) slot row: 2 MB of x per launch on GPU, as sentinel_one_shot. CPU
    rows are small, so that the CPU tests run the multi-piece path."""
    return 1 << 19 if device_type == "cuda" else 256


def two_shot_words(device_type: str, world: int) -> int:
    """int32 words per (phase, scatter|gather, source) slot row: 16 MB of x per launch on GPU, as
    sentinel_two_shot, in whole 16-byte groups (on 3 ranks 4 M / 3 words put every peer's slot row off
    16-byte alignment: the stores to peers, polls and resets compiled 4 bytes wide); small on CPU."""
    return (4 << 20) // world // 4 * 4 if device_type == "cuda" else 64


ONE_SHOT_SLOTS, ONE_SHOT_EPOCHS = declare_slots(f"{OP}.one_shot", f"fused.{OP}", 1, one_shot_words)
TWO_SHOT_SLOTS, TWO_SHOT_EPOCHS = declare_slots(f"{OP}.two_shot", f"fused.{OP}", 2, two_shot_words)


def _outputs(x: torch.Tensor, quant: str | None):
    """(normed, new_residual, scales) as [rows, H] / [rows] views of the returned tensors."""
    h = x.shape[-1]
    normed = torch.empty(x.shape, dtype=torch.float8_e4m3fn if quant else x.dtype, device=x.device)
    scales = torch.empty((*x.shape[:-1], 1) if quant == "fp8_per_token" else (0,), dtype=torch.float32,
                         device=x.device)
    return normed, torch.empty_like(x), scales, h


def _row_block(h: int, itemsize: int) -> int:
    """Slot words of a row: H values, 4 // itemsize to a word, rounded up to a power of two."""
    return triton.next_power_of_2(triton.cdiv(max(h, 1), 4 // itemsize))


def gpu_config(request: plan.Request, world: int, two_shot: bool = False) -> LaunchConfig:
    """GPU launch of both kernels: ``block`` = values a program holds per step (whole rows: ``block`` /
    BLOCK_H rows; less than a row: one row in chunks of ``block`` values, two passes), ``max_programs``,
    ``num_warps`` (RmsConfig.ahead: the one-shot kernel's loads a step ahead). On one rank from the table
    measured on this GPU model (fused/memory_bound_configs.py: the fastest candidate of the roofline
    sweep per tokens x hidden x quant, 2-byte dtypes). Untuned rule (other GPUs, more ranks, fp32), from
    the first roofline run (2026-11-24, one H200, every (rows, warps, programs) at 32, 512 and 8192
    tokens): one row per step and 16 values per thread (warps = BLOCK_H / 512) was best or within 3% of
    it at most shapes; more rows per step lost up to 30% (2048 x 4096: 76% of copy with 2 rows)."""
    block_h = _row_block(request.shape[-1], request.dtype.itemsize) * (4 // request.dtype.itemsize)
    if world == 1 and request.dtype.itemsize == 2:
        tokens = request.numel // max(request.shape[-1], 1)
        entry = memory_bound_configs.rms_entry(memory_bound_configs.device_table(request.device), tokens,
                                               request.shape[-1], dict(request.options)["quant"])
        if entry is not None:
            return memory_bound_configs.rms_config(entry, block_h)
    if world > 1 and request.nbytes > one_shot_max_bytes(world):
        peaks = two_shot and dict(request.options)["quant"] == "fp8_per_token"
        return _bulk_config(block_h, request.dtype.itemsize, world, peaks, request.device)
    return LaunchConfig(block_h, MAX_PROGRAMS, max(4, min(32, block_h // 512)))


def _bulk_config(block_h: int, itemsize: int, world: int, peaks: bool, device: torch.device) -> LaunchConfig:
    """Several ranks past the one-shot sizes: the all-reduce's shape (comm/sentinel.py's two-shot: 16
    bytes per thread per peer row, 16 warps an SM, every program resident and looping), where the rule
    above gave whole rows of 16 values a thread (16384: 32 warps, a [4, 16384] fp32 tile in stage 2 at
    64 registers, 412 bytes spilled) and a program per row (8192 x 4096: 512 programs of 202 registers,
    one an SM: 4 waves, each waiting out its own NVLink round trips). A step is one row in chunks of
    ROW_CHUNK_BYTES (8 KB: 4096 16-bit values), 16 bytes of each at a thread; one program an SM (about
    128 registers at 16 warps fill the register file), looping over its rows: stage 0 sends all of them
    before the first wait. Half the chunk (8 warps, up to 255 registers) on 5-8 ranks, whose tiles have
    twice the rows, and in the two-shot kernel with per-token fp8 (``peaks``) past 8192 values a row (its
    stage 2 keeps peak accumulators beside the sums of squares: 8 bytes spilled at 16 warps on 4 ranks,
    32 on 3, in the sm_90 compile; the one-shot kernel spilled none there, and 48 bytes halved on 3).
    Left: 8 ranks' two-shot kernel with per-token fp8 spills 12 bytes at 255 registers (8 warps or 4)."""
    halved = world > 4 or (peaks and block_h > 8192)
    chunk = min(block_h, ROW_CHUNK_BYTES // itemsize // (2 if halved else 1))
    return LaunchConfig(chunk, num_sms(device), max(4, chunk * itemsize // (32 * 16)))


def two_shot_gpu_config(request: plan.Request, world: int) -> LaunchConfig:
    """``gpu_config`` of the two-shot kernel."""
    return gpu_config(request, world, two_shot=True)


def _steps(config: LaunchConfig, block_h: int, device_type: str) -> tuple[int, int]:
    """(ROWS, CHUNK): whole rows per step, or one row in chunks. CPU: 4 whole rows per step (every
    interpreted step costs milliseconds) unless a config was named (the tests of the chunked path)."""
    if device_type != "cuda" and config is plan.CPU_CONFIG:
        return 4, block_h
    return max(1, config.block // block_h), min(config.block, block_h)


def _launch_config(p: plan.Plan, h: int, itemsize: int) -> tuple[dict, int]:
    """Constexprs of both kernels and their programs' cap, from the plan's LaunchConfig."""
    row_block = _row_block(h, itemsize)
    block_h = row_block * (4 // itemsize)
    rows, chunk = _steps(p.config, block_h, p.ws.device.type)
    if chunk * itemsize < 16 and chunk < block_h:
        raise ValueError(f"config.block must hold at least 16 bytes of a row when it is less than a row, got "
                         f"{p.config.block}")
    return dict(WORLD=p.world, FORMAT=WORD_FORMAT[p.request.dtype], ROW_BLOCK=row_block, BLOCK_H=block_h, ROWS=rows,
                CHUNK=chunk, PEERS=triton.next_power_of_2(p.world), QUANT=QUANT[dict(p.request.options)["quant"]],
                num_warps=p.config.num_warps), p.config.max_programs


def _ahead(config: LaunchConfig) -> bool:
    return bool(getattr(config, "ahead", False))


def _every_step(config: LaunchConfig) -> bool:
    return bool(getattr(config, "every_step", False))


def _kernel_run(kind: str):
    one_shot = kind == "one_shot"
    kernel = rms_norm_one_shot_kernel if one_shot else rms_norm_two_shot_kernel
    slots, epochs_spec, words = ((ONE_SHOT_SLOTS, ONE_SHOT_EPOCHS, one_shot_words) if one_shot
                                 else (TWO_SHOT_SLOTS, TWO_SHOT_EPOCHS, two_shot_words))

    def launches(p: plan.Plan, x: torch.Tensor):
        """(quant, constexprs, [(first row, grid, sizes), ...]): what every call of plan ``p`` launches,
        from its shapes alone, so worked out on its first call (p.cache) rather than on each."""
        world, eps, quant = p.world, dict(p.request.options)["eps"], dict(p.request.options)["quant"]
        h = x.shape[-1]
        meta, max_programs = _launch_config(p, h, x.element_size())
        slot_words = words(p.ws.device.type, world)
        meta = dict(meta, SLOT_WORDS=slot_words, **({"AHEAD": _ahead(p.config)} if one_shot else {}),
                    **(pdl_meta(p.ws.device) if one_shot else {}))
        total = x.numel() // h if h else 0
        # Rows per launch: a slot row holds every row of a piece (one-shot) or of a piece's shard; one
        # launch on one rank (nothing goes through the slots).
        piece = slot_words // meta["ROW_BLOCK"] * (1 if one_shot else world) if world > 1 else max(total, 1)
        if one_shot and world == 1 and _every_step(p.config):
            max_programs = max(total, 1)  # a program per step (RmsConfig.every_step: no slots to size)
        pieces = []
        for start in range(0, total, piece):
            rows = min(piece, total - start)
            shard = rows if one_shot else triton.cdiv(rows, world)
            sizes = (rows, h, eps) if one_shot else (rows, shard, h, eps)
            pieces.append((start, (max(1, min(max_programs, triton.cdiv(shard, meta["ROWS"]))),), sizes))
        if one_shot and world == 1:  # one launch: its grid takes every step, or loops
            meta.update(ONE_STEP=len(pieces) == 1 and pieces[0][1][0] == triton.cdiv(total, meta["ROWS"]),
                        EVEN_H=h == meta["BLOCK_H"])
        return quant, meta, pieces

    def run(p: plan.Plan, x: torch.Tensor, _out, residual, weight, scale=None):
        ws = p.ws
        setup = p.cache.get(kernel)
        if setup is None:
            setup = p.cache[kernel] = launches(p, x)
        quant, meta, pieces = setup
        normed, new_residual, scales, h = _outputs(x, quant)
        region, epochs = ws.region(slots.name), ws.local_state(epochs_spec.name)
        scale_arg = scale if scale is not None else scales
        inputs = (x, residual, normed, new_residual, scales)
        if len(pieces) > 1:  # every piece from its first row (a single piece takes the tensors as they are)
            inputs = tuple(t.reshape(-1) for t in inputs)
        for start, grid, sizes in pieces:
            at = [t[start * h:] for t in inputs[:4]] if start else inputs[:4]
            row_scales = inputs[4][start:] if start and scales.numel() else inputs[4]
            launch(kernel, grid, (*ws.kernel_args, p.desc, region.ptrs_dev, epochs, at[0], at[1], weight, scale_arg,
                                  at[2], at[3], row_scales, *sizes), meta)
        return normed, new_residual, scales
    return run


def _rms_norm(rows: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 RMSNorm over the last dim as the kernels and reference.rms_norm_tail compute it. Not
    torch.nn.functional.rms_norm: on CUDA (torch 2.11) it returns NaN for a whole row whose sum of
    squares is Inf (a row holding Inf), where the formula gives 0 at every finite element (as torch's
    CPU kernel does); found by test_special_values on one H200."""
    rows = rows.float()
    return rows * torch.rsqrt(rows.square().mean(-1, keepdim=True) + eps) * weight.float()


def _torch_tail(p: plan.Plan, total: torch.Tensor, residual, weight, scale):
    """The baselines' tail in torch: add (rounded to the dtype), RMSNorm, quantize."""
    eps, quant = dict(p.request.options)["eps"], dict(p.request.options)["quant"]
    new_residual = residual + total
    scales = total.new_empty((0,), dtype=torch.float32)
    normed = _rms_norm(new_residual, weight, eps)
    if quant is None:
        return normed.to(new_residual.dtype), new_residual, scales
    if quant == "fp8_per_token":
        scales = normed.abs().amax(-1, keepdim=True).clamp_min(MIN_AMAX.value) / FP8_MAX.value
    normed = normed / (scale if quant == "fp8_per_tensor" else scales)
    return normed.clamp(-FP8_MAX.value, FP8_MAX.value).to(torch.float8_e4m3fn), new_residual, scales


def _nccl(p: plan.Plan, x, _out, residual, weight, scale=None):
    total = x.clone()
    dist.all_reduce(total, group=p.group)
    return _torch_tail(p, total, residual, weight, scale)


def _unfused(p: plan.Plan, x, _out, residual, weight, scale=None):
    total = plan.inner(p, "all_reduce", x).execute(x)
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
    for name, (_, _, device) in zip(["residual", "weight", "scale"], request.others):
        if device != request.device:
            raise ValueError(f"{name} is on {device}, x on {request.device}: all must be on this rank's device")
    (res_shape, res_dtype, _), (w_shape, w_dtype, _) = request.others[:2]
    if res_shape != shape or res_dtype != request.dtype:
        raise ValueError(f"residual must have x's shape {shape} and dtype {request.dtype}, got {res_shape} "
                         f"{res_dtype}")
    if w_shape != shape[-1:] or not w_dtype.is_floating_point:
        raise ValueError(f"weight must be a float vector of shape ({shape[-1]},), got {w_shape} {w_dtype}")
    has_scale = len(request.others) > 2
    if (quant == "fp8_per_tensor") != has_scale:
        raise ValueError("scale (a one-element fp32 tensor) is required with quant='fp8_per_tensor' and only then")
    if has_scale and (request.others[2][0] not in ((), (1,)) or request.others[2][1] != torch.float32):
        raise ValueError(f"scale must be a one-element fp32 tensor, got {request.others[2][:2]}")
    return None, (request.numel << 4) ^ (shape[-1] << 2) ^ QUANT[quant]


def _kernel_reason(request: plan.Request, world: int) -> str | None:
    h = request.shape[-1]
    if h > MAX_HIDDEN or _row_block(h, request.dtype.itemsize) > two_shot_words(request.device.type, world):
        return f"rows of {h} elements are longer than the kernels take ({MAX_HIDDEN} on GPU)"
    return None


def _default(request: plan.Request, world: int) -> str:
    """What "auto" runs without a table rule. One rank: the one-shot kernel at every size (no peer, so no
    protocol to choose; its launches are the ones the roofline table measured, loads ahead included).
    Several: one-shot up to AUTO_ONE_SHOT_MAX_BYTES, then two-shot. On 4x H100 (2026-11-27,
    benchmarks/results/2026-11-27-rowpar-branches-h100x4/rms) the two-shot kernel with 16-byte peer words and
    the bulk launch rule ran 1.7-4.7x faster than the unfused path at every shape from 138x16384 to
    8192x16384 (1536 against 3650 us there), so no size falls back to it any more."""
    return auto_kernel(request.nbytes, world)


def all_reduce_rms_norm_impl(x, residual, weight, eps: float, group_name: str, algorithm: str, quant: str,
                             scale=None):
    """(normed, new_residual, scales); ``quant`` "" for none; scales empty unless fp8_per_token."""
    others = (residual, weight) if scale is None else (residual, weight, scale)
    options = (("eps", float(eps)), ("quant", quant or None))
    return plan.resolve(OP, x, ops.resolve_group(group_name), algorithm, others=others,
                        options=options).execute(x, others=others)


def _fake(x, residual, weight, eps, group_name, algorithm, quant, scale=None):
    return _outputs(x, quant or None)[:3]


SPEC = ops.declare(ops.OpSpec(
    OP, "(Tensor x, Tensor residual, Tensor weight, float eps, str group_name, str algorithm, str quant, "
        "Tensor? scale=None) -> (Tensor, Tensor, Tensor)", all_reduce_rms_norm_impl, _fake,
    inputs=("x", "residual", "weight", "scale"), shape_rule=_shape_rule, default=_default,
    algorithms=(Algorithm(OP, plan.BACKEND, 90, "backend", _nccl, "process group all-reduce, then torch add + RMSNorm"),
                Algorithm(OP, "unfused", 91, "fused", _unfused, "symmcoll.all_reduce, then torch add + RMSNorm"),
                Algorithm(OP, "one_shot", 92, "fused", _kernel_run("one_shot"),
                          "sentinel one-shot over whole rows with the residual add and RMSNorm (+ fp8) inside",
                          gpu_config, accepts=_kernel_reason, instead="unfused"),
                Algorithm(OP, "two_shot", 93, "fused", _kernel_run("two_shot"),
                          "sentinel two-shot over shards of whole rows: norm at the owner and where gathered rows land",
                          two_shot_gpu_config, accepts=_kernel_reason, instead="unfused"))))

def compile_cases(make_workspace):
    """Both kernels' launches on meta tensors: hidden 16384, 8192, 6144 and 4096, an odd hidden size,
    every quant mode and dtype, every world size (1: no peer code), rank 1 somewhere; whole rows (the
    default config) and chunked rows (``block`` values less than a row), with loads a step ahead."""
    cases = []
    for kind in ("one_shot", "two_shot"):
        for world, rank, dtype, (tokens, h), quant, block in (
                (1, 0, torch.bfloat16, (8192, 16384), "fp8_per_token", None),
                (1, 0, torch.bfloat16, (8192, 16384), "fp8_per_token", 4096),
                (1, 0, torch.bfloat16, (8192, 16384), "fp8_per_token", -4096),
                (1, 0, torch.bfloat16, (2048, 4096), None, -4096),
                (1, 0, torch.bfloat16, (2048, 4096), None, None),
                (2, 1, torch.bfloat16, (6, 8192), None, None),
                (2, 1, torch.bfloat16, (6, 8192), None, 2048),
                (4, 0, torch.bfloat16, (138, 6144), "fp8_per_token", None),
                (3, 1, torch.float16, (33, 4099), "fp8_per_tensor", None),
                (3, 1, torch.float16, (33, 4099), "fp8_per_tensor", 1024),
                (8, 1, torch.float32, (512, 1024), None, None)):
            if kind == "two_shot" and block is not None and block < 0:
                continue  # loads ahead are the one-shot kernel's

            def thunk(kind=kind, world=world, rank=rank, dtype=dtype, tokens=tokens, h=h, quant=quant, block=block):
                x = torch.empty((tokens, h), dtype=dtype, device="meta")
                others = (torch.empty_like(x), torch.empty((h,), dtype=dtype, device="meta"))
                if quant == "fp8_per_tensor":
                    others += (torch.empty((1,), dtype=torch.float32, device="meta"),)
                request = plan.Request(OP, (tokens, h), dtype, torch.device("cuda"),
                                       options=(("eps", 1e-6), ("quant", quant)))
                config = (two_shot_gpu_config if kind == "two_shot" else gpu_config)(request, world)
                if block is not None:  # negative: the same block with the one-shot kernel's loads ahead
                    config = memory_bound_configs.RmsConfig(abs(block), config.max_programs,
                                                            max(4, abs(block) // 256), block < 0)
                p = plan.Plan(request, "kernel", plan.algorithms(OP)[kind], None, world, rank,
                              make_workspace(world, rank), config, 3, None)
                p.algorithm.run(p, x, None, *others)
            cases.append((f"{OP}.{kind} ws{world} {tokens}x{h} {quant} block {block}", thunk))
    return cases
