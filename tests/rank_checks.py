"""Helpers that run inside rank processes: rank-coded inputs and checks that name rank and index."""

from __future__ import annotations

import torch
import torch.distributed as dist

import symmcoll


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")


def rank_coded(numel: int, dtype: torch.dtype, rank: int, call: int = 0) -> torch.Tensor:
    """Small integers that depend on (rank, index, call): sums over <= 8 ranks are exact in bf16."""
    i = torch.arange(numel, dtype=torch.int64, device=device())
    values = (i * 7 + rank * 13 + call * 5 + (i // 9973) * 3) % 17 - 8
    return values.to(dtype)


def random_input(numel: int, dtype: torch.dtype, rank: int, call: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * call + rank)
    return torch.randn(numel, generator=g).to(dtype).to(device())


TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2)}


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str, exact: bool = False) -> None:
    rank = dist.get_rank()
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"rank {rank}: {what}: got {got.dtype}{tuple(got.shape)}, "
                             f"want {want.dtype}{tuple(want.shape)}")
    g, w = got.float().reshape(-1).cpu(), want.float().reshape(-1).cpu()
    if exact:
        bad = g != w
    else:
        rtol, atol = TOLERANCE[got.dtype]
        bad = (g - w).abs() > atol + rtol * w.abs()
    bad |= g.isnan() != w.isnan()
    if bool(bad.any()):
        idx = int(bad.nonzero()[0])
        raise AssertionError(f"rank {rank}: {what}: {int(bad.sum())} of {g.numel()} wrong, first at "
                             f"index {idx}: got {g[idx].item()}, want {w[idx].item()}")


def assert_pads_zero(what: str) -> None:
    """Every slot of every workspace's pad is 0. Collective: peers must not start their next call
    (whose signals would land in this rank's pad) until every rank has looked."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()
    try:
        _check_pads(what)
    finally:
        dist.barrier()


def _check_pads(what: str) -> None:
    from symmcoll.memory.layout import ANNOUNCE_SLOT
    for ws in symmcoll.memory.workspaces():
        nonzero = ws.signal_pad[:ANNOUNCE_SLOT].nonzero()  # barrier slots (announce slots keep a value)
        if nonzero.numel():
            raise AssertionError(f"rank {ws.rank}: {what}: signal pad not zero at slots "
                                 f"{nonzero.reshape(-1)[:8].tolist()}")


def assert_clean_finish(what: str) -> None:
    """After a run of calls: no kernel of this rank timed out, and every signal pad is zero again."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    symmcoll.check()
    assert_pads_zero(what)


def special_values(numel: int, rank: int, world: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank ``rank``'s input of a reduction over ``world`` ranks where the positions cycle through the
    cases special values make: NaN on the first or on the last rank, +Inf against -Inf, Inf on every
    rank, Inf against NaN, and small integers (exact in every dtype) in between."""
    nan, inf = float("nan"), float("inf")
    last = world - 1
    cases = [
        lambda r: nan if r == 0 else 1.0,                    # NaN first in rank order
        lambda r: nan if r == last else 2.0,                 # NaN last
        lambda r: inf if r == 0 else (-inf if r == 1 else 0.0),   # +Inf + -Inf: NaN (sum), +-Inf (max/min)
        lambda r: inf,                                       # Inf everywhere
        lambda r: -inf,
        lambda r: inf if r == last else -3.0,                # one Inf among finite values
        lambda r: nan if r == 0 else (inf if r == 1 else -inf),
        lambda r: float(r) - 1.0,                            # finite
        lambda r: float((r * 5) % 7) - 3.0,
    ]
    values = [cases[i % len(cases)](rank) for i in range(numel)]
    return torch.tensor(values, dtype=torch.float32).to(dtype).to(device())


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str, rtol: float = 0.0, atol: float = 0.0) -> None:
    """``got`` equals ``want`` where both are finite (within rtol/atol), and both are NaN, +Inf or -Inf
    at the same places; names rank and index of the first difference."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    if got.shape != want.shape:
        raise AssertionError(f"rank {rank}: {what}: got shape {tuple(got.shape)}, want {tuple(want.shape)}")
    g, w = got.float().reshape(-1).cpu(), want.float().reshape(-1).cpu()
    finite = torch.isfinite(g) & torch.isfinite(w)
    bad = torch.where(finite, (g - w).abs() > atol + rtol * w.abs(), ~((g == w) | (g.isnan() & w.isnan())))
    if bool(bad.any()):
        idx = int(bad.nonzero()[0])
        raise AssertionError(f"rank {rank}: {what}: {int(bad.sum())} of {g.numel()} wrong, first at index {idx}: "
                             f"got {g[idx].item()}, want {w[idx].item()}")
