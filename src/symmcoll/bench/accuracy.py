"""Accuracy of the quantized all-reduce: the error bound docs/algorithms.md states, test data, and the
table ``symmcoll accuracy`` writes (every format x group size x data kind, beside the exact path).

Errors are measured against the fp64 sum of the inputs as they are handed to the all-reduce (already
in the input dtype): what an exact all-reduce computes before its one final rounding. So the exact
bf16 path's error is its final rounding alone, and a quantized path's error is everything
quantization adds on top of the same inputs.

Data kinds (per rank, ``numel`` a multiple of ``HIDDEN``):
    gaussian   independent N(0, 1) values on every rank
    outliers   activation-like: N(0, 1) rows of HIDDEN channels, OUTLIER_CHANNELS of them (the same on
               every rank, like the outlier features of LLM activations) 100x larger
    mlp        hidden states of a tensor-parallel MLP with random weights: every rank computes
               gelu(X W1_r) W2_r for its column shard W1_r and row shard W2_r of the same layer
               (X, W1, W2 shared); the all-reduce of these partials is the layer's output
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.distributed as dist

KINDS = ("gaussian", "outliers", "mlp")
HIDDEN = 1024
OUTLIER_CHANNELS = 4
OUTLIER_SCALE = 100.0
FORMATS = ("int8", "fp8", "int4")
GROUP_SIZES = (32, 64, 128)
_QMAX = {"int8": 127.0, "fp8": 448.0, "int4": 7.0}
# Unit roundoff of the output dtype (the final rounding of the result).
_UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}
# Slack for the fp32 roundings inside a codec (scale, inverse, products): a few units of 2**-24
# relative to the group's largest magnitude, rounded up generously.
_CODEC_SLACK = 2.0 ** -20
_FP32_ROUNDOFF = 2.0 ** -24


def _codec_error(magnitude: torch.Tensor, amax: torch.Tensor, quantize: str) -> torch.Tensor:
    """Largest error of one value of ``magnitude`` in a group whose largest magnitude is ``amax`` (a
    scale is never taken from less than 2^-118: language/codecs.py TINY_AMAX)."""
    amax = amax.clamp_min(2.0 ** -118)
    if quantize == "fp8":
        # e4m3: 3 mantissa bits (half a step is <= 1/16 of the value); subnormal steps of 2**-9 scales.
        return magnitude / 16 + amax / (448 * 1024) + amax * _CODEC_SLACK
    return amax / (2 * _QMAX[quantize]) + amax * _CODEC_SLACK


def error_bound(parts: torch.Tensor, quantize: str, group_size: int, op: str = "sum",
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Per-element bound on |quantized all-reduce - exact sum| for inputs ``parts`` [W, n] (every
    rank's flattened input); groups are G consecutive elements of the flattened tensor.

    e1 = sum over ranks r of codec_error(|x_r|, amax_r of the group)     (scatter; conservative: the
         owner's own contribution is in fact exact) plus fp32 summation rounding
    e2 = codec_error(|S| + e1, max over the group of |S| + e1)          (the reduced shard re-quantized)
    bound = e1 + e2 + u * (|S| + e1 + e2)                               (u: the output dtype's roundoff)
    (op "avg": S and e1 divided by W.)
    """
    world, n = parts.shape
    padded_n = math.ceil(max(n, 1) / group_size) * group_size
    p = torch.zeros(world, padded_n, dtype=torch.float64, device=parts.device)
    p[:, :n] = parts.double()
    p = p.reshape(world, -1, group_size)
    magnitude = p.abs()
    amax = magnitude.amax(dim=2, keepdim=True)
    e1 = _codec_error(magnitude, amax, quantize).sum(dim=0)
    total = p.sum(dim=0)
    e1 = e1 + (world - 1) * _FP32_ROUNDOFF * (magnitude.sum(dim=0) + e1)
    if op == "avg":
        total, e1 = total / world, e1 / world + _FP32_ROUNDOFF * total.abs() / world
    reduced = total.abs() + e1
    e2 = _codec_error(reduced, reduced.amax(dim=1, keepdim=True), quantize)
    bound = e1 + e2 + _UNIT_ROUNDOFF[dtype] * (reduced + e2)
    return bound.reshape(-1)[:n]


def errors(got: torch.Tensor, exact: torch.Tensor) -> dict:
    """rel_l2 = ||got - exact|| / ||exact||; max_abs = max |got - exact|; max_rel = max_abs / max |exact|."""
    diff = (got.double().reshape(-1) - exact.double().reshape(-1)).abs()
    norm = exact.double().norm().item()
    top = exact.double().abs().max().item() if exact.numel() else 0.0
    max_abs = diff.max().item() if diff.numel() else 0.0
    return {"rel_l2": diff.norm().item() / norm if norm else 0.0, "max_abs": max_abs,
            "max_rel": max_abs / top if top else 0.0}


def make_input(kind: str, numel: int, rank: int, world: int, seed: int = 0) -> torch.Tensor:
    """This rank's fp32 input of ``kind`` (see the module docstring); ``numel`` a multiple of HIDDEN."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if numel % HIDDEN:
        raise ValueError(f"numel must be a multiple of {HIDDEN}, got {numel}")
    tokens = numel // HIDDEN
    own = torch.Generator().manual_seed(seed * 1000 + rank)
    shared = torch.Generator().manual_seed(seed * 1000 + 999)
    if kind == "gaussian":
        return torch.randn(numel, generator=own)
    if kind == "outliers":
        x = torch.randn(tokens, HIDDEN, generator=own)
        channels = torch.randperm(HIDDEN, generator=shared)[:OUTLIER_CHANNELS]
        x[:, channels] *= OUTLIER_SCALE
        return x.reshape(-1)
    x = torch.randn(tokens, HIDDEN, generator=shared)
    w1 = torch.randn(HIDDEN, 4 * HIDDEN, generator=shared) / math.sqrt(HIDDEN)
    w2 = torch.randn(4 * HIDDEN, HIDDEN, generator=shared) / math.sqrt(4 * HIDDEN)
    columns = torch.tensor_split(torch.arange(4 * HIDDEN), world)[rank]
    return (torch.nn.functional.gelu(x @ w1[:, columns]) @ w2[columns]).reshape(-1)


def _exact_sum(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    acc = x.double().to(device)
    dist.all_reduce(acc)
    return acc.cpu()


def _gather(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    x = x.to(device)
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x)
    return torch.stack(parts).cpu()


def measure(numel: int, dtype: torch.dtype, kinds=KINDS, formats=FORMATS, group_sizes=GROUP_SIZES,
            seed: int = 0) -> list[dict]:
    """Rank side (collective): a row per (kind, path) with the errors against the exact sum, the
    number of elements outside ``error_bound`` and the algorithm that ran. The quantized kernel runs
    at every size here (the exact-path fallback is switched off while measuring)."""
    import symmcoll
    from symmcoll import plan
    from symmcoll.comm.quantized import size_threshold

    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    with size_threshold(0):
        for kind in kinds:
            x = make_input(kind, numel, rank, world, seed).to(dtype)
            exact = _exact_sum(x, device)
            parts = _gather(x.float(), device)
            got = symmcoll.all_reduce(x.to(device)).cpu()
            rows.append({"kind": kind, "path": "exact", "group_size": None, "algorithm": "auto",
                         **errors(got, exact)})
            for quantize in formats:
                for group_size in group_sizes:
                    xd = x.to(device)
                    name = plan.resolve("all_reduce_quantized", xd, None, f"quantized_{quantize}", reduce_op="sum",
                                        options=(("group_size", group_size),)).name
                    got = symmcoll.all_reduce(xd, quantize=quantize, group_size=group_size).cpu()
                    bound = error_bound(parts, quantize, group_size, "sum", dtype)
                    outside = int(((got.double() - exact).abs() > bound).sum())
                    rows.append({"kind": kind, "path": quantize, "group_size": group_size, "algorithm": name,
                                 **errors(got, exact), "outside_bound": outside,
                                 "bound_max": bound.max().item()})
    return rows


def _rank_measure(numel: int, dtype_name: str) -> dict:
    from dataclasses import asdict

    from . import provenance
    from .checks import TORCH_DTYPES
    rows = measure(numel, TORCH_DTYPES[dtype_name])
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return {"provenance": asdict(provenance.collect(device_type)), "world_size": dist.get_world_size(),
            "numel_per_rank": numel, "dtype": dtype_name, "rows": rows}


def run(world_sizes, numel: int, dtype_name: str, out_dir: Path, device: str = "auto") -> list[Path]:
    """``symmcoll accuracy``: measure at each world size, write one JSON file each; returns the paths."""
    from ..launch import RankPool, default_device_type
    device_type = default_device_type() if device == "auto" else device
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for world in world_sizes:
        with RankPool(world, device=device_type) as pool:
            result = pool.run(_rank_measure, numel, dtype_name, timeout=1800)[0]
        result["error_definition"] = ("against the fp64 sum of the inputs in the input dtype; rel_l2 = ||err|| / "
                                      "||sum||, max_abs = max |err|, max_rel = max_abs / max |sum|; outside_bound "
                                      "counts elements beyond bench.accuracy.error_bound")
        path = out_dir / f"accuracy-{device_type}-ws{world}-{dtype_name}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        written.append(path)
    return written


def format_table(result: dict) -> str:
    """The rows of a result as a plain-text table (kind x path x G)."""
    lines = [f"world size {result['world_size']}, {result['numel_per_rank']} {result['dtype']} elements per rank",
             f"{'data':10} {'path':6} {'G':>4} {'rel_l2':>10} {'max_abs':>10} {'max_rel':>10} {'outside':>7}"]
    for r in result["rows"]:
        lines.append(f"{r['kind']:10} {r['path']:6} {str(r['group_size'] or '-'):>4} {r['rel_l2']:10.3e} "
                     f"{r['max_abs']:10.3e} {r['max_rel']:10.3e} {str(r.get('outside_bound', '-')):>7}")
    return "\n".join(lines)
