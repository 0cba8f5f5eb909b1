"""Helpers that run inside rank processes: rank-coded inputs and checks that name rank and index.

Test modules share code only through this module (and conftest.py's ``DEVICE``): no test module
imports another test module."""

from __future__ import annotations

import math
import os
from unittest import mock

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


def with_workspace_bytes(nbytes: int, fn, *args):
    """``fn(*args)`` on this rank with workspaces of ``nbytes`` bytes. SYMMCOLL_WORKSPACE_BYTES is read when
    a workspace is created, so every rank drops its workspaces before and after (symmcoll.reset, together):
    a pool's ranks serve the tests that need a small workspace, with no fresh processes (3-4 s each)."""
    with mock.patch.dict(os.environ, SYMMCOLL_WORKSPACE_BYTES=str(nbytes)):
        symmcoll.reset()
        try:
            return fn(*args)
        finally:
            symmcoll.reset()


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


# ---- data movement: every dtype, bit for bit ------------------------------------------------------------

def dtype_coded(shape, dtype, rank, call):
    """Values that depend on (rank, index, call) in as many bits as the dtype has."""
    i = torch.arange(math.prod(shape), dtype=torch.int64)
    h = (i * 2654435761 + rank * 40503 + call * 977 + 12345) % (1 << 31)
    if dtype == torch.bool:
        t = (h >> 7) % 2 == 1
    elif dtype in (torch.int8, torch.uint8):
        t = ((h >> 5) % 256).to(torch.uint8).view(dtype)
    elif dtype == torch.int64:
        t = h * (1 << 20) + rank
    elif dtype == torch.complex64:
        t = torch.complex(h.float(), torch.full_like(h, rank).float() - call)
    elif dtype == torch.complex128:
        t = torch.complex(h.double(), (h % 7).double() + rank)
    elif dtype.is_floating_point:
        t = ((h >> 8) % 61 - 30).to(torch.float32)
    else:
        t = h
    return t.to(dtype).reshape(shape).to(device())


def assert_bits_equal(got, want, what):
    """Bit-exact comparison; a failure names the rank and the first wrong index."""
    rank = dist.get_rank()
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"rank {rank}: {what}: got {got.dtype}{tuple(got.shape)}, "
                             f"want {want.dtype}{tuple(want.shape)}")
    size = got.element_size()
    g = got.contiguous().reshape(-1).view(torch.uint8).reshape(-1, size).cpu()
    w = want.contiguous().reshape(-1).view(torch.uint8).reshape(-1, size).cpu()
    bad = (g != w).any(dim=1)
    if bool(bad.any()):
        idx = int(bad.nonzero()[0])
        raise AssertionError(f"rank {rank}: {what}: {int(bad.sum())} of {bad.numel()} wrong, first at "
                             f"index {idx}: got {got.reshape(-1)[idx].cpu()}, "
                             f"want {want.reshape(-1)[idx].cpu()}")


# ---- the row-parallel fused ops (test_rowpar.py, test_gpu_rowpar.py) ----------------------------------

# max |got - want| / max |want| against the fp32 reference. bf16 and fp16 results are rounded once
# (2^-9 / 2^-11 relative); partial products travel rounded to the dtype as well (one rounding per
# rank, as torch.matmul's output is), so a few roundings of terms as large as the sum add up.
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2.5e-3, torch.float32: 1e-5}
# fp8 e4m3 keeps 3 mantissa bits: half a step is 1/16 of the value.
FP8_TOL = 0.07


def assert_rel_close(got, want, what, tol=None):
    rank = dist.get_rank()
    if got.shape != want.shape:
        raise AssertionError(f"rank {rank}: {what}: got shape {tuple(got.shape)}, want {tuple(want.shape)}")
    tol = tol or REL_TOL[got.dtype]
    g, w = got.float().cpu(), want.float().cpu()
    assert not g.isnan().any(), f"rank {rank}: {what}: NaN in the result"
    err = float((g - w).abs().max()) / max(float(w.abs().max()), 1e-30) if w.numel() else 0.0
    assert err <= tol, f"rank {rank}: {what}: relative error {err:.3g} > {tol:g}"
    return err


def assert_same_on_every_rank(t, what):
    """An all-reduce's result: the same bits on every rank."""
    mine = t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]).to(torch.int64)
    first = mine.clone()
    dist.broadcast(first, 0)
    assert torch.equal(mine, first), f"rank {dist.get_rank()}: {what}: differs from rank 0's"


def assert_slots_empty():
    """Every sentinel slot of every region (beyond its headers) is EMPTY again after the calls."""
    from symmcoll.language import EMPTY
    from symmcoll.memory.regions import declared
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()
    ws = symmcoll.get_workspace()
    for spec in declared():
        if spec.symmetric and spec.fill_int32 == EMPTY.value:
            local = ws.region(spec.name).local
            words = local[: local.numel() // 4 * 4].view(torch.int32)[spec.header_words:]
            left = (words != EMPTY.value).nonzero().reshape(-1)
            assert left.numel() == 0, f"rank {ws.rank}: {spec.name}: slots not EMPTY at {left[:8].tolist()}"
    dist.barrier()


# ---- the TP block (test_tp_block.py, test_gpu_tp_block.py) ---------------------------------------------

TP_BLOCK_TOLERANCE = 2e-2


def relative_update_error(got, want, base):
    """Relative error of the update got - base against want - base (fp32)."""
    g, w = got.float() - base.float(), want.float() - base.float()
    return float((g - w).norm() / w.norm())


# What reads a tensor back to the host (a synchronisation on CUDA) when called from Python.
HOST_READS = ("tolist", "item", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")
# The torch.distributed collectives the MoE layers over NCCL call.
COUNTED_COLLECTIVES = ("all_to_all_single", "all_gather_single", "all_gather_into_tensor")


class CountedCalls:
    """Calls of HOST_READS on tensors and of COUNTED_COLLECTIVES inside a ``with`` block (``calls``: name
    -> count, only names called)."""

    def __enter__(self):
        self.calls, self._inside = {}, set()
        self._saved = [(torch.Tensor, name, torch.Tensor.__dict__.get(name)) for name in HOST_READS]
        self._saved += [(dist, name, getattr(dist, name)) for name in COUNTED_COLLECTIVES if hasattr(dist, name)]
        for owner, name, _ in self._saved:
            setattr(owner, name, self._counting(name, getattr(owner, name)))
        return self

    def _counting(self, name, original):
        def counted(*args, **kwargs):
            # A call made from inside this one (a TorchFunctionMode such as ``torch.device(...)`` calls
            # the method again) is the same read: counted once.
            if name in self._inside:
                return original(*args, **kwargs)
            self.calls[name] = self.calls.get(name, 0) + 1
            self._inside.add(name)
            try:
                return original(*args, **kwargs)
            finally:
                self._inside.discard(name)
        return counted

    def __exit__(self, *exc):
        for owner, name, original in self._saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        return False
