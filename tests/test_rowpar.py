"""The row-parallel fused ops on CPU ranks: matmul_reduce_scatter, matmul_all_reduce and
all_reduce_rms_norm, every algorithm, world sizes 2-4, bf16 and fp16, odd shapes (M not a multiple of
the tile, N not a multiple of 16), back-to-back calls with fresh data, against the fp32 reference
(normwise relative error, a tolerance per dtype)."""

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launcher, reference

from rank_checks import device

DTYPES = [torch.bfloat16, torch.float16]
# max |got - want| / max |want| against the fp32 reference. bf16 and fp16 results are rounded once
# (2^-9 / 2^-11 relative); partial products travel rounded to the dtype as well (one rounding per
# rank, as torch.matmul's output is), so a few roundings of terms as large as the sum add up.
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2.5e-3, torch.float32: 1e-5}


def operand(shape, dtype, rank, call, salt=0):
    g = torch.Generator().manual_seed(7919 * call + 104729 * salt + rank)
    return torch.randn(shape, generator=g).to(dtype).to(device())


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


def launches(name):
    return launcher.LAUNCH_COUNTS[name]


# ---- matmul_reduce_scatter ---------------------------------------------------------------------------

MMRS_ALGORITHMS = ["fused", "unfused", "nccl"]


def _mmrs_shapes(world):
    # (M, N, K): shards of 35 rows (not a multiple of the 32-row CPU tile) and N = 50 (pointer loads);
    # 33 x 150 makes 2 x 5 = 10 tiles per shard: 3 pieces of the 8 KB CPU slot (bf16 32x32 tiles of 2 KB);
    # one row per shard; K smaller than one k-step; the first shape again with fresh data.
    return [(35 * world, 50, 40), (33 * world, 150, 24), (world, 17, 9), (35 * world, 50, 40)]


def _mmrs(algorithm, dtype):
    rank, world = dist.get_rank(), dist.get_world_size()
    errs = []
    for call, (m, n, k) in enumerate(_mmrs_shapes(world)):
        a, b = operand((m, k), dtype, rank, call), operand((k, n), dtype, rank, call, salt=1)
        before = launches("matmul_reduce_scatter_kernel")
        got = symmcoll.matmul_reduce_scatter(a, b, algorithm=algorithm)
        assert got.dtype == dtype
        errs.append(assert_rel_close(got, reference.matmul_reduce_scatter(a, b), f"{algorithm} {m}x{n}x{k} call {call}"))
        if algorithm == "fused" and (m, n, k) == (33 * world, 150, 24):
            assert launches("matmul_reduce_scatter_kernel") - before == 3, "10 tiles in 4-tile pieces: 3 launches"
    return max(errs)


@pytest.mark.parametrize("algorithm", MMRS_ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_reduce_scatter(pools, world_size, dtype, algorithm):
    pools(world_size).run(_mmrs, algorithm, dtype)
