"""The single oracle: what every symmcoll op must return, computed with torch / torch.distributed.

Reductions are torch's over the stacked inputs of every rank, in fp32 (as symmcoll accumulates), rounded
once to the input dtype: ``sum`` is ``torch.sum`` over the stack (IEEE: NaN propagates, +Inf + -Inf is
NaN), ``avg`` that divided by the world size, ``max`` / ``min`` are ``torch.amax`` / ``torch.amin`` (NaN
propagates). The process group's own reductions are not used: NCCL's max/min drop NaN (``fmaxf``) and
gloo's depend on the order of the operands. Data movement (all-gather, all-to-all, broadcast) moves the
tensors' bytes, so every dtype is compared bit-exactly.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def reduce_stacked(stacked: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``op`` over dim 0 of ``stacked`` (one row per rank), in fp32: what every reduction computes."""
    stacked = stacked.float()
    if op == "sum":
        return stacked.sum(0)
    if op == "avg":
        return stacked.sum(0) / stacked.shape[0]
    if op == "max":
        return stacked.amax(0)
    if op == "min":
        return stacked.amin(0)
    raise ValueError(f"op must be 'sum', 'avg', 'max' or 'min', got {op!r}")


def stacked(x: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``x``, stacked along a new dim 0 (rank order). Collective."""
    return all_gather(x.reshape(-1), group).reshape(dist.get_world_size(group), *x.shape)


def all_reduce(x: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    return reduce_stacked(stacked(x, group), op).to(x.dtype)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a contiguous tensor: gloo does not move bf16/fp8/bool, bytes are bytes."""
    return t.reshape(-1).view(torch.uint8)


def reduce_scatter(x: torch.Tensor, group=None, op: str = "sum") -> torch.Tensor:
    """Segment ``rank`` (of W along dim 0) of the fp32 all-reduce of ``x``, rounded once."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = x.shape[0] // world
    return reduce_stacked(stacked(x, group), op)[rank * rows:(rank + 1) * rows].to(x.dtype)


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
_TINY_AMAX = 2.0 ** -118  # language/codecs.py TINY_AMAX


def quantize_groups(values: torch.Tensor, quantize: str, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``values`` (length a multiple of ``group_size``) -> (the levels the codes stand for, fp32, one
    row per group; the scales, one per group), rounded exactly as ``language/codecs.py`` rounds: amax =
    max(max |v|, 2^-118), scale = amax / qmax, t = v * (qmax / amax) (no clamp: |t| <= qmax (1 + 2^-23)
    rounds to at most qmax), a group holding Inf or NaN gets zero levels and a NaN scale."""
    v = values.float().reshape(-1, group_size)
    finite = torch.isfinite(v).all(dim=1, keepdim=True)
    v = torch.where(finite, v, torch.zeros_like(v))
    amax = v.abs().amax(dim=1, keepdim=True).clamp_min(_TINY_AMAX)
    qmax = _QUANT_MAX[quantize]
    # Tensor by tensor: torch computes `tensor / scalar` and `scalar / tensor` through a reciprocal,
    # which is not the correctly rounded quotient the kernel's div_rn gives.
    qmax_t = torch.full_like(amax, qmax)
    scale = torch.div(amax, qmax_t)
    t = v * torch.div(qmax_t, amax)
    if quantize == "fp8":
        levels = t.to(torch.float8_e4m3fn).float()
    else:
        levels = torch.trunc(t + torch.where(t >= 0, 0.5, -0.5))
    return levels, torch.where(finite, scale, torch.full_like(scale, float("nan")))


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
    """What ``all_reduce(x, quantize=..., group_size=...)`` returns, bit for bit (``quantized_stacked``
    of every rank's x, with the size rule of x's device). Collective."""
    return quantized_stacked(stacked(x, group), op, quantize, group_size, x.device.type).to(x.dtype)


def quantized_stacked(parts: torch.Tensor, op: str = "sum", quantize: str = "int8", group_size: int = 64,
                      device_type: str | None = None, min_bytes: int | None = None) -> torch.Tensor:
    """The quantized all-reduce of every rank's input (``parts``: one row per rank, rank order), fp32,
    shaped like one input, as a call on ``device_type`` (default: parts') returns it.

    Where the library runs the exact all-reduce instead (``comm.quantized.exact_instead``: one rank, an
    empty tensor, fewer input bytes than ``min_bytes``, by default ``SYMMCOLL_QUANTIZE_MIN_BYTES`` or
    1 MB on GPU and 0 on CPU): the exact sum (``reduce_stacked``; NaN only where an input is NaN).
    Otherwise, for each shard of each piece (geometry: ``comm.quantized.pieces``), the owner's own
    values exact plus every other rank's values quantized and decoded, summed in rank order in fp32,
    then quantized and decoded again (round the result once to the input dtype); a group holding NaN
    or Inf reads NaN."""
    from .comm.quantized import exact_instead, pieces
    world = parts.shape[0]
    device_type = device_type or parts.device.type
    one = parts[0]
    if exact_instead(one.numel(), one.numel() * one.element_size(), world, device_type, min_bytes):
        return reduce_stacked(parts, op)
    flat = parts.reshape(world, -1).float()
    out = torch.empty(flat.shape[1], dtype=torch.float32, device=parts.device)
    for start, n, shard_len in pieces(flat.shape[1], world, device_type):
        for owner in range(world):
            lo, hi = start + owner * shard_len, start + min((owner + 1) * shard_len, n)
            if lo >= hi:
                continue
            acc = None
            for r in range(world):
                values = flat[r, lo:hi] if r == owner else _round_trip(flat[r, lo:hi], quantize, group_size)
                acc = values.clone() if acc is None else acc + values
            if op == "avg":
                acc = torch.div(acc, torch.full_like(acc, world))
            out[lo:hi] = _round_trip(acc, quantize, group_size)
    return out.reshape(parts.shape[1:])


# ---- fused ops: fp32 results (not rounded), for relative-error checks --------------------------------

def matmul_all_reduce(a: torch.Tensor, b: torch.Tensor, group=None) -> torch.Tensor:
    """sum over ranks of a @ b, in fp32 from the inputs' values (torch.sum over the stacked products)."""
    return reduce_stacked(stacked(a.float() @ b.float(), group))


def matmul_reduce_scatter(a: torch.Tensor, b: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's rows [r * M/W, (r+1) * M/W) of sum over ranks of a @ b, in fp32."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    rows = a.shape[0] // world
    return matmul_all_reduce(a, b, group)[rank * rows:(rank + 1) * rows]


FP8_MAX = 448.0  # largest float8_e4m3fn


def all_reduce_rms_norm(x, residual, weight, eps: float, group=None, quant: str | None = None, scale=None):
    """(normed, new_residual[, scales]) in fp32 (``rms_norm_tail`` of the sum over ranks of x). Collective."""
    return rms_norm_tail(reduce_stacked(stacked(x, group)), residual, weight, eps, quant, scale)


def rms_norm_tail(total: torch.Tensor, residual, weight, eps: float, quant: str | None = None, scale=None):
    """(normed, new_residual[, scales]) in fp32 from ``total`` (the fp32 sum over ranks of x):
    new_residual = residual + total, normed = new_residual / sqrt(mean(new_residual^2) + eps) * weight
    over the last dim. quant "fp8_per_tensor": normed is divided by ``scale`` and clamped to +-448 (still
    fp32, not rounded to fp8); "fp8_per_token": the same with a scale per row, max|row| / 448, also
    returned ([rows, 1])."""
    new_residual = residual.float() + total
    normed = new_residual * torch.rsqrt(new_residual.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if quant == "fp8_per_tensor":
        return (normed / scale.float()).clamp(-FP8_MAX, FP8_MAX), new_residual
    if quant == "fp8_per_token":
        scales = normed.abs().amax(-1, keepdim=True).clamp_min(1e-12) / FP8_MAX
        return (normed / scales).clamp(-FP8_MAX, FP8_MAX), new_residual, scales
    return normed, new_residual


# ---- MoE dispatch / combine (experts split evenly over ranks: expert e lives on rank e // (E / W)) ---

def _exchange_rows(rows: torch.Tensor, counts: list[int], group) -> tuple[torch.Tensor, list[int]]:
    """all_to_all_single of ``rows`` (grouped by destination, ``counts[d]`` rows for rank d) with the
    counts exchanged first and read back to the host, as any all_to_all_single user must."""
    send_t = torch.tensor(counts, dtype=torch.int64, device=rows.device)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t, group=group)
    recv = recv_t.tolist()
    out = rows.new_empty((sum(recv), *rows.shape[1:]))
    row_bytes = math.prod(rows.shape[1:]) * rows.element_size()
    if row_bytes:
        dist.all_to_all_single(_as_bytes(out), _as_bytes(rows.contiguous()),
                               output_split_sizes=[r * row_bytes for r in recv],
                               input_split_sizes=[c * row_bytes for c in counts], group=group)
    return out, recv


def _valid_ids(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    ids = topk_ids.long()
    return torch.where((ids >= 0) & (ids < num_experts), ids, -1)


def moe_dispatch(tokens: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, group=None,
                 max_rows: int | None = None):
    """(recv [max_rows, H], expert_counts [E/W] int64, row_origin [max_rows] int64, self_rows [T, k] int64).

    Token t goes once to every rank owning one of its experts (ids outside [0, E) are ignored); the
    receiver lays its rows out by local expert, then source rank, then token, then slot; row_origin[i]
    = (source * T + token) * k + slot (-1 past the rows received), self_rows[t, j] = the row of this
    rank's own token t for its local expert in slot j (-1 elsewhere). Rows past max_rows are dropped."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens_n, k = topk_ids.shape
    local_experts = num_experts // world
    max_rows = world * tokens_n * min(k, local_experts) if max_rows is None else max_rows
    ids = _valid_ids(topk_ids, num_experts)
    owner = torch.where(ids >= 0, ids // local_experts, -1)
    chosen = [(owner == d).any(dim=1).nonzero().reshape(-1) for d in range(world)]  # tokens per rank, in order
    meta = torch.cat([torch.cat([c[:, None], ids[c]], dim=1) for c in chosen])
    recv_tokens, recv = _exchange_rows(torch.cat([tokens[c] for c in chosen]), [len(c) for c in chosen], group)
    recv_meta, _ = _exchange_rows(meta, [len(c) for c in chosen], group)
    source = torch.repeat_interleave(torch.arange(world, device=tokens.device),
                                     torch.tensor(recv, device=tokens.device))
    recv_ids = recv_meta[:, 1:]
    local = (recv_ids >= 0) & (recv_ids // local_experts == rank)
    row, slot = local.nonzero(as_tuple=True)                     # by (source, token), then slot
    expert = recv_ids[row, slot] - rank * local_experts
    order = torch.sort(expert, stable=True).indices              # by local expert, keeping that order
    row, slot, expert = row[order], slot[order], expert[order]
    kept = min(row.numel(), max_rows)
    out = tokens.new_zeros((max_rows, tokens.shape[1]))
    out[:kept] = recv_tokens[row[:kept]]
    origin = (source[row] * tokens_n + recv_meta[row, 0]) * k + slot
    row_origin = torch.full((max_rows,), -1, dtype=torch.int64, device=tokens.device)
    row_origin[:kept] = origin[:kept]
    self_rows = torch.full((tokens_n, k), -1, dtype=torch.int64, device=tokens.device)
    mine = (source[row[:kept]] == rank).nonzero().reshape(-1)
    self_rows[recv_meta[row[mine], 0], slot[mine]] = mine
    counts = torch.bincount(expert, minlength=local_experts)[:local_experts]
    return out, counts, row_origin, self_rows


def moe_combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                row_origin: torch.Tensor, num_experts: int, group=None) -> torch.Tensor:
    """[T, H]: for every token of this rank, sum over its slots j with a valid expert of
    topk_weights[t, j] * (that expert's output row for it), in fp32, rounded once to expert_out's dtype."""
    world = dist.get_world_size(group)
    tokens_n, k = topk_ids.shape
    rows = (row_origin >= 0).nonzero().reshape(-1)
    origin = row_origin[rows]
    dest = origin // (tokens_n * k)
    order = torch.sort(dest, stable=True).indices
    counts = torch.bincount(dest, minlength=world)[:world].tolist()
    got, _ = _exchange_rows(expert_out[rows[order]], counts, group)
    where, _ = _exchange_rows((origin % (tokens_n * k))[order, None], counts, group)
    slots = expert_out.new_zeros((tokens_n * k, expert_out.shape[1])).float()
    slots[where.reshape(-1)] = got.float()
    weights = torch.where(_valid_ids(topk_ids, num_experts) >= 0, topk_weights.float(), 0.0)
    return (weights[..., None] * slots.reshape(tokens_n, k, -1)).sum(dim=1).to(expert_out.dtype)
