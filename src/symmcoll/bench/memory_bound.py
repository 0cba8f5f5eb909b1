"""``symmcoll bench`` specs of the memory-bound ops (bench/fused.py runs them): all_reduce_rms_norm, the
quantized all-reduce and MoE dispatch / combine, each with the bytes its kernel must move per rank
(bench/roofline.py), so that every row shows GB/s and % of the copy rate measured in the same run.

Shapes: all_reduce_rms_norm (tokens, hidden) and (tokens, hidden, 2) for the fp8-per-token output;
all_reduce_quantized (MiB of x, the format of "auto" and of the codec row: 0 int8, 1 fp8, 2 int4, group
size): every row checked against the exact sum (quantization inside a 0.2 tolerance), the codec row
against the emulation; MoE (tokens, hidden, experts, top-k). The "local" row is torch doing the op's work on one GPU without communication.

Bytes per row: a symmcoll kernel, its own model at the run's world size; a torch row on one GPU, the op's
local work; MoE, every implementation the op's bytes (an effective rate: torch's gather reads more);
composites of several launches (nccl, unfused all_reduce_rms_norm), none.
"""

from __future__ import annotations

import random

import torch
import torch.distributed as dist

import symmcoll
import symmcoll.reference

from . import roofline

QUANTS = {0: None, 1: "fp8_per_tensor", 2: "fp8_per_token"}
EPS = 1e-6


# ---- all-reduce + residual + RMSNorm ---------------------------------------------------------------------

def _norm_inputs(shape, dtype, rank, world, call, device):
    tokens, hidden = shape[:2]
    g = torch.Generator(device=device).manual_seed(1000 * call + rank)
    x = torch.randn(tokens, hidden, generator=g, device=device, dtype=torch.float32).to(dtype)
    shared = torch.Generator(device=device).manual_seed(1000 * call + 77)  # the same on every rank
    residual = torch.randn(tokens, hidden, generator=shared, device=device, dtype=torch.float32).to(dtype)
    weight = torch.randn(hidden, generator=shared, device=device, dtype=torch.float32).to(dtype)
    return x, residual, weight


def _quant(shape):
    return QUANTS[shape[2]] if len(shape) > 2 else None


def add_rms_norm(x, residual, weight, quant):
    """torch's add + RMSNorm (+ fp8 per token): what the fused op does on one rank; (normed, new
    residual, per-token scales or None)."""
    new_residual = residual + x
    if quant is None:
        return torch.nn.functional.rms_norm(new_residual, (x.shape[-1],), weight, EPS), new_residual, None
    normed = torch.nn.functional.rms_norm(new_residual.float(), (x.shape[-1],), weight.float(), EPS)
    scales = normed.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448.0
    return (normed / scales).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), new_residual, scales


_COMPILED = {}


def compiled_add_rms_norm(inputs, quant):
    """torch.compile'd add_rms_norm, one compiled function per quant mode; the token dimension is marked
    dynamic (the hidden size stays static, so inductor's row kernel is specialised to it as it would be
    in a model), which keeps it to one compilation per hidden size instead of one per shape."""
    fn = _COMPILED.get(quant)
    if fn is None:
        fn = _COMPILED[quant] = torch.compile(lambda x, r, w: add_rms_norm(x, r, w, quant))
    x, residual, weight = inputs
    if x.shape[0] > 1:
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(residual, 0)
    return lambda: fn(x, residual, weight)


def _norm_local_reference(inputs, group):
    """fp32 RMSNorm of residual + x (this rank's x alone: what the torch baselines compute)."""
    x, residual, weight = inputs
    total = (residual.float() + x.float()).to(x.dtype).float()
    return total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + EPS) * weight.float()


def _norm_run(algorithm, inputs, group, shape):
    quant = _quant(shape)
    out = symmcoll.all_reduce_rms_norm(*inputs, EPS, group, algorithm=algorithm, quant=quant)
    return out[0].float() * out[2] if quant == "fp8_per_token" else out[0]


def _norm_reference(inputs, group, shape):
    return symmcoll.reference.all_reduce_rms_norm(*inputs, EPS, group)[0]


def _norm_bytes(shape, dtype, world, algorithm):
    """The fused kernels: their model at this world size (auto: the kernel it picks); torch's add +
    RMSNorm on one GPU: the local work; composites of several launches (nccl, unfused): none."""
    from ..fused.all_reduce_rms_norm import auto_kernel
    if algorithm == "auto":
        algorithm = auto_kernel(shape[0] * shape[1] * dtype.itemsize, world)
    if algorithm in ("one_shot", "two_shot"):
        return roofline.rms_norm_bytes(shape[0], shape[1], dtype.itemsize, _quant(shape), world, algorithm)
    if algorithm in ("local", "torch.compile add+RMSNorm"):
        return roofline.rms_norm_bytes(shape[0], shape[1], dtype.itemsize, _quant(shape))
    return None


def _torch_norm(inputs, shape, compiled):
    quant = _quant(shape)
    if compiled:
        return compiled_add_rms_norm(inputs, quant)
    return lambda: add_rms_norm(*inputs, quant)


def _dequantized(fn, shape):
    """A torch baseline thunk whose result compares with the fp32 reference (fp8: times its scales)."""
    def thunk():
        normed, _, scales = fn()
        return normed if scales is None else normed.float() * scales
    return thunk


# ---- MoE dispatch / combine ------------------------------------------------------------------------------

def _moe_inputs(shape, dtype, rank, world, call, device):
    """Rank- and token-coded rows (exact in bf16), random distinct experts per token, dyadic weights; the
    combine's expert output (the received rows * 2, exact) and handle from a dispatch."""
    tokens_n, hidden, experts, k = shape
    i = torch.arange(tokens_n * hidden, device=device).reshape(tokens_n, hidden)
    tokens = ((i * 7 + rank * 5 + call) % 9 - 4).to(dtype)
    rng = random.Random(1234 + rank)  # the same routing for fresh data (call 1): the handle stays valid
    ids = torch.tensor([rng.sample(range(experts), k) for _ in range(tokens_n)], device=device)
    weights = torch.tensor([0.5, 0.25, 1.0, 2.0, 0.125, 0.75, 1.5, 0.375][:k], device=device).repeat(tokens_n, 1)
    recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts)
    return tokens, ids, weights, recv * 2, handle


def _received(got, inputs, group, shape):
    """The rows a dispatch filled (the rest of its output is not written)."""
    n = int(symmcoll.reference.moe_dispatch(inputs[0], inputs[1], shape[2], group)[1].sum())
    return got[:n]


def _moe_bytes(phase):
    def count(shape, dtype, world, algorithm, inputs=None, rank=0):
        tokens_n, hidden, experts, k = shape
        ids = inputs[1] if inputs is not None else None
        if ids is None:
            return None
        dispatch, combine = roofline.moe_bytes(ids.cpu(), experts, world, rank, hidden * dtype.itemsize,
                                               ids.element_size(), 4)
        return dispatch if phase == "dispatch" else combine
    return count


def _torch_dispatch(inputs, group, shape):
    """torch on one GPU: the received rows gathered in dispatch order (index_select)."""
    tokens, ids, experts = inputs[0], inputs[1], shape[2]
    _, counts, origin, _ = symmcoll.reference.moe_dispatch(tokens, ids, experts, group)
    rows = origin[origin >= 0] // ids.shape[1] % tokens.shape[0]
    out = torch.empty(rows.numel(), tokens.shape[1], dtype=tokens.dtype, device=tokens.device)
    return lambda: torch.index_select(tokens, 0, rows, out=out)


def _torch_combine(inputs, group, shape):
    """torch on one GPU: every token's k expert rows gathered, weighted and summed in fp32."""
    expert_out, weights, handle = inputs[3], inputs[2], inputs[4]
    rows = handle.self_rows.clamp(min=0)
    used = (handle.self_rows >= 0).float() * weights.float()
    return lambda: (expert_out[rows].float() * used[..., None]).sum(1).to(expert_out.dtype)


def _combine_reference(inputs, group, shape):
    tokens, ids, weights, expert_out, handle = inputs
    return symmcoll.reference.moe_combine(expert_out, weights, ids, handle.row_origin, shape[2], group).float()


# ---- the quantized all-reduce ----------------------------------------------------------------------------

CODECS = ("int8", "fp8", "int4")


def _quantized_inputs(shape, dtype, rank, world, call, device):
    numel = shape[0] * (1 << 20) // dtype.itemsize
    g = torch.Generator(device=device).manual_seed(1000 * call + rank)
    return (torch.randn(numel, generator=g, device=device, dtype=torch.float32).to(dtype),)


def _codec(shape):
    return CODECS[shape[1]], shape[2]


def _quantized_run(algorithm, inputs, group, shape):
    """quantized_X: format X; exact: the exact all-reduce; auto: the shape's format (its choice)."""
    fmt, group_size = _codec(shape)
    if algorithm == "exact":
        return symmcoll.all_reduce(inputs[0], group)
    if algorithm.startswith("quantized_"):
        fmt = algorithm.split("_", 1)[1]
    return symmcoll.all_reduce(inputs[0], group, quantize=fmt, group_size=group_size)


def _exact_sum(inputs, group, shape):
    """Every row is checked against the exact sum (the quantization error is inside the tolerance)."""
    return symmcoll.reference.all_reduce(inputs[0].float(), group)


def _codec_round_trip(inputs, group, shape):
    """A baseline row: the quantize and dequantize kernels of the shape's format (bench/roofline.py) over
    this rank's x, back to back."""
    fmt, group_size = _codec(shape)
    x = inputs[0]
    words, scales = roofline.codec_buffers(x.numel(), fmt, group_size, x.device)
    out = torch.empty_like(x)

    def thunk():
        roofline.quantize(x, words, scales, fmt, group_size)
        roofline.dequantize(words, scales, out, fmt, group_size)
        return out
    return thunk


def _codec_reference(inputs, group, shape):
    fmt, group_size = _codec(shape)
    levels, scales = symmcoll.reference.quantize_groups(inputs[0].float(), fmt, group_size)
    return symmcoll.reference.dequantize_groups(levels, scales).to(inputs[0].dtype).float()


def _quantized_bytes(shape, dtype, world, algorithm, inputs=None, rank=0):
    fmt, group_size = _codec(shape)
    nbytes = shape[0] << 20
    if algorithm == "codec round trip":
        return 2 * roofline.codec_bytes(nbytes, dtype.itemsize, fmt, group_size)
    if (algorithm.startswith("quantized_") or algorithm == "auto") and world > 1:
        fmt = algorithm.split("_", 1)[1] if algorithm != "auto" else fmt
        return roofline.quantized_all_reduce_bytes(nbytes, dtype.itemsize, fmt, group_size, world)
    # One rank (every algorithm is the exact path's copy) or an exact all-reduce: x read, out written.
    return 2 * nbytes if world == 1 else None


def specs(FusedSpec):
    """The memory-bound ops' FusedSpecs (bench/fused.py passes its class, avoiding an import cycle)."""
    norm_shapes = tuple((t, h) if q == 0 else (t, h, q) for q in (0, 2) for h in (4096, 6144, 8192, 16384)
                        for t in (1, 6, 32, 138, 512, 2048, 8192))
    moe_shapes = tuple((t, h, e, k) for t in (128, 1024, 4096) for h in (4096, 7168) for e in (8, 64, 256)
                       for k in (2, 8))
    arn = FusedSpec(
        op="all_reduce_rms_norm", shape_args=True, shapes=norm_shapes, inputs=_norm_inputs,
        reference=lambda inputs, group, shape=None: _norm_reference(inputs, group, shape),
        run=_norm_run, flops=lambda s: 0,
        local=lambda s, dtype, device: _dequantized(_torch_norm(_norm_inputs(s, dtype, 0, 1, 0, device), s, False), s),
        local_name="torch add+RMSNorm (one GPU)",
        baselines={"torch.compile add+RMSNorm": lambda inputs, group, shape: _dequantized(
                       _torch_norm(inputs, shape, True), shape),
                   "symmcoll:all_reduce alone": lambda inputs, group, shape: lambda: symmcoll.all_reduce(inputs[0],
                                                                                                         group)},
        baseline_references={"torch.compile add+RMSNorm": lambda inputs, group, shape: _norm_local_reference(
                                 inputs, group),
                             "symmcoll:all_reduce alone": lambda inputs, group, shape: symmcoll.reference.all_reduce(
                                 inputs[0].float(), group)},
        bytes=lambda shape, dtype, world, algorithm, inputs=None, rank=0: _norm_bytes(shape, dtype, world, algorithm),
        tolerance=lambda shape, dtype: 0.07 if _quant(shape) else None)
    dispatch = FusedSpec(
        op="moe_dispatch", shape_args=True, shapes=moe_shapes, inputs=_moe_inputs,
        reference=lambda inputs, group, shape: symmcoll.reference.moe_dispatch(inputs[0], inputs[1], shape[2],
                                                                               group)[0].float(),
        run=lambda algorithm, inputs, group, shape: symmcoll.moe_dispatch(inputs[0], inputs[1], shape[2], group,
                                                                          algorithm=algorithm)[0],
        flops=lambda s: 0, local=None, local_name="torch index_select (one GPU)",
        baselines={"torch index_select (one GPU)": _torch_dispatch},
        bytes=_moe_bytes("dispatch"), compare_rows=_received)
    combine = FusedSpec(
        op="moe_combine", shape_args=True, shapes=moe_shapes, inputs=_moe_inputs, reference=_combine_reference,
        run=lambda algorithm, inputs, group, shape: symmcoll.moe_combine(inputs[3], inputs[2], inputs[4],
                                                                         algorithm=algorithm),
        flops=lambda s: 0, local=None, local_name="torch gather + weighted sum (one GPU)",
        baselines={"torch gather + weighted sum (one GPU)": _torch_combine},
        bytes=_moe_bytes("combine"))
    quantized = FusedSpec(
        op="all_reduce_quantized", shape_args=True, shapes=tuple((mb, c, 64) for c in range(3) for mb in (1, 16, 256)),
        inputs=_quantized_inputs, reference=_exact_sum, run=_quantized_run, flops=lambda s: 0,
        local=None, local_name="-",
        baselines={"codec round trip": _codec_round_trip}, baseline_references={"codec round trip": _codec_reference},
        bytes=_quantized_bytes, tolerance=lambda shape, dtype: 0.2)
    return arn, dispatch, combine, quantized
