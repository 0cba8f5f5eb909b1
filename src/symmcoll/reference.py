"""The single oracle: what every symmcoll op must return, computed with torch / torch.distributed.

Reductions run in fp32 (as symmcoll accumulates) and are rounded once to the input dtype. Data movement
(all-gather, all-to-all, broadcast) moves the tensors' bytes, so every dtype is compared bit-exactly.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
             "min": dist.ReduceOp.MIN}


def all_reduce(x: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    acc = x.float().clone()
    dist.all_reduce(acc, op=_DIST_OPS[op], group=group)
    if op == "avg":
        acc /= dist.get_world_size(group)
    return acc.to(x.dtype)



def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a contiguous tensor: gloo does not move bf16/fp8/bool, bytes are bytes."""
    return t.reshape(-1).view(torch.uint8)


def reduce_scatter(x: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    """Segment ``rank`` (of W along dim 0) of the fp32 all-reduce of ``x``, rounded once."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    acc = x.float().clone()
    dist.all_reduce(acc, op=_DIST_OPS[op], group=group)
    if op == "avg":
        acc /= world
    rows = x.shape[0] // world
    return acc[rank * rows:(rank + 1) * rows].to(x.dtype)


def all_gather(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``x`` concatenated along dim 0 (a 0-dim ``x`` counts as one element)."""
    world = dist.get_world_size(group)
    shape = tuple(x.shape) or (1,)
    out = torch.empty((world * shape[0], *shape[1:]), dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    mine = _as_bytes(x.contiguous())
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return torch.cat(parts).view(x.dtype).reshape(out.shape)


def all_to_all(x: torch.Tensor, group=None, splits=None) -> torch.Tensor:
    """Rows ``splits[j]`` of ``x`` (equal chunks if None) go to rank j; the rows received come back
    concatenated in source-rank order."""
    world = dist.get_world_size(group)
    send = list(splits) if splits is not None else [x.shape[0] // world] * world
    send_t = torch.tensor(send, dtype=torch.int64, device=x.device)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t, group=group)
    recv = recv_t.tolist()
    out = torch.empty((sum(recv), *x.shape[1:]), dtype=x.dtype, device=x.device)
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    if row_bytes:
        dist.all_to_all_single(_as_bytes(out), _as_bytes(x.contiguous()),
                               output_split_sizes=[r * row_bytes for r in recv],
                               input_split_sizes=[s * row_bytes for s in send], group=group)
    return out


def broadcast(x: torch.Tensor, src: int, group=None) -> torch.Tensor:
    """A new tensor equal to group rank ``src``'s ``x``, on every rank."""
    out = x.clone(memory_format=torch.contiguous_format)
    if out.numel():
        root = dist.get_global_rank(group or dist.group.WORLD, src)
        dist.broadcast(_as_bytes(out), src=root, group=group)
    return out


# ---- the quantized all-reduce (comm/quantized.py), emulated step by step in fp32 --------------------

_QUANT_MAX = {"int8": 127.0, "fp8": 448.0, "int4": 7.0}


def quantize_groups(values: torch.Tensor, quantize: str, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``values`` (length a multiple of ``group_size``) -> (the levels the codes stand for, fp32, one
    row per group; the scales, one per group), rounded exactly as ``language/codecs.py`` rounds."""
    v = values.float().reshape(-1, group_size)
    finite = torch.isfinite(v)
    v = torch.where(finite, v, torch.zeros_like(v))
    amax = v.abs().amax(dim=1, keepdim=True)
    qmax = _QUANT_MAX[quantize]
    # Tensor by tensor: torch computes `tensor / scalar` and `scalar / tensor` through a reciprocal,
    # which is not the correctly rounded quotient the kernel's div_rn gives.
    qmax_t = torch.full_like(amax, qmax)
    scale = torch.div(amax, qmax_t)
    inverse = torch.where(amax > 0, torch.div(qmax_t, torch.where(amax > 0, amax, torch.ones_like(amax))),
                          torch.zeros_like(amax))
    t = (v * inverse).clamp(-qmax, qmax)
    if quantize == "fp8":
        levels = t.to(torch.float8_e4m3fn).float()
    else:
        levels = torch.trunc(t + torch.where(t >= 0, 0.5, -0.5))
    scale = torch.where(finite.all(dim=1, keepdim=True), scale, torch.full_like(scale, float("nan")))
    return levels, scale


def dequantize_groups(levels: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return (levels * scales).reshape(-1)


def _round_trip(values: torch.Tensor, quantize: str, group_size: int) -> torch.Tensor:
    """``values`` quantized and decoded, zero-padded to whole groups and cut back."""
    n = values.numel()
    padded = torch.zeros(-(-n // group_size) * group_size, dtype=torch.float32, device=values.device)
    padded[:n] = values
    return dequantize_groups(*quantize_groups(padded, quantize, group_size))[:n]


def all_reduce_quantized(x: torch.Tensor, group=None, op: str = "sum", quantize: str = "int8",
                         group_size: int = 64) -> torch.Tensor:
    """What ``all_reduce(x, quantize=..., group_size=...)`` returns, bit for bit: for each shard of each
    piece (geometry: ``comm.quantized.pieces``), the owner's own values exact plus every other rank's
    values quantized and decoded, summed in rank order in fp32, then quantized and decoded again and
    rounded once to x's dtype. Collective (gathers every rank's x)."""
    from .comm.quantized import pieces
    world = dist.get_world_size(group)
    flat = x.reshape(-1)
    parts = all_gather(flat, group).reshape(world, -1).float()
    out = torch.empty(flat.numel(), dtype=torch.float32, device=x.device)
    for start, n, shard_len in pieces(flat.numel(), world, x.device.type):
        for owner in range(world):
            lo, hi = start + owner * shard_len, start + min((owner + 1) * shard_len, n)
            if lo >= hi:
                continue
            acc = None
            for r in range(world):
                values = parts[r, lo:hi] if r == owner else _round_trip(parts[r, lo:hi], quantize, group_size)
                acc = values.clone() if acc is None else acc + values
            if op == "avg":
                acc = torch.div(acc, torch.full_like(acc, world))
            out[lo:hi] = _round_trip(acc, quantize, group_size)
    return out.to(x.dtype).reshape(x.shape)


# ---- fused ops: fp32 results (not rounded), for relative-error checks --------------------------------

def matmul_all_reduce(a: torch.Tensor, b: torch.Tensor, group=None) -> torch.Tensor:
    """sum over ranks of a @ b, in fp32 from the inputs' values."""
    acc = a.float() @ b.float()
    dist.all_reduce(acc, group=group)
    return acc


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's rows [r * M/W, (r+1) * M/W) of sum over ranks of a @ b, in fp32."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = a.shape[0] // world
    return matmul_all_reduce(a, b, group)[rank * rows:(rank + 1) * rows]


FP8_MAX = 448.0  # largest float8_e4m3fn


def all_reduce_rms_norm(x, residual, weight, eps: float, group=None, quant: str | None = None, scale=None):
    """(normed, new_residual[, scales]) in fp32: new_residual = residual + sum over ranks of x, normed =
    new_residual / sqrt(mean(new_residual^2) + eps) * weight over the last dim. quant "fp8_per_tensor":
    normed is divided by ``scale`` and clamped to +-448 (still fp32, not rounded to fp8);
    "fp8_per_token": the same with a scale per row, max|row| / 448, also returned ([rows, 1])."""
    total = x.float().clone()
    dist.all_reduce(total, group=group)
    new_residual = residual.float() + total
    normed = new_residual * torch.rsqrt(new_residual.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if quant == "fp8_per_tensor":
        return (normed / scale.float()).clamp(-FP8_MAX, FP8_MAX), new_residual
    if quant == "fp8_per_token":
        scales = normed.abs().amax(-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
        return (normed / scales).clamp(-FP8_MAX, FP8_MAX), new_residual, scales
    return normed, new_residual
