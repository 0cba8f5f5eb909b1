"""Correctness inside the benchmark (rank side): rank-coded inputs, the oracle's answer, #wrong.

Inputs are small integers (-8..8) that depend on (rank, index, call), the same recipe as the tests'
``rank_coded``, built on the device because host-side generation of 256 MB inputs would dominate the
run. Sums over <= 8 ranks stay below 256, so every result is exact in bf16/fp16/fp32 and a check is
equality: no tolerance can hide a misplaced chunk.
"""

from __future__ import annotations

import torch

from .. import reference
from .metrics import input_numel

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def rank_coded(numel: int, dtype: torch.dtype, rank: int, call: int, device: torch.device) -> torch.Tensor:
    """((7i + 13 rank + 5 call + 3 (i // 9973)) mod 17) - 8, computed mod 17 term by term so int32
    suffices for any tensor that fits in memory."""
    i = torch.arange(numel, dtype=torch.int32, device=device)
    values = (i % 17) * 7 + (i // 9973 % 17) * 3 + (rank * 13 + call * 5) % 17
    return (values % 17 - 8).to(dtype)


def coded_input(op: str, count: int, dtype: torch.dtype, rank: int, world: int, call: int,
                device: torch.device) -> torch.Tensor:
    """This rank's input of ``op`` for ``count`` elements of "size" (metrics.SIZE_CONVENTION)."""
    return rank_coded(input_numel(op, count, world), dtype, rank, call, device)


def has_reference(op: str) -> bool:
    return callable(getattr(reference, op, None))


def expected(op: str, x: torch.Tensor, group) -> torch.Tensor:
    """The oracle's result for this rank's input ``x`` (collective: every rank calls it)."""
    if op == "all_reduce":
        return reference.all_reduce(x, group, "sum")
    return getattr(reference, op)(x, group)


def count_wrong(got: torch.Tensor, want: torch.Tensor) -> int:
    """Elements of ``got`` that differ from ``want``; every element counts as wrong if the sizes
    differ (a result of the wrong shape is wrong everywhere)."""
    if got.numel() != want.numel():
        return max(got.numel(), want.numel())
    g, w = got.reshape(-1), want.reshape(-1)
    if g.dtype != w.dtype:
        g, w = g.float(), w.float()
    return int((g != w).sum())
