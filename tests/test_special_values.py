"""NaN and +-Inf through every reduction: torch's answer (``torch.sum`` over the stacked inputs,
``torch.amax`` / ``torch.amin``: NaN propagates, +Inf + -Inf is NaN), as ``symmcoll.reference`` states it.

Every all_reduce and reduce_scatter algorithm with sum, avg, max and min; the fused ops' reductions
(matmul_reduce_scatter, matmul_all_reduce, all_reduce_rms_norm with and without fp8); the quantized
all-reduce on both sides of its size rule: the kernel (a group holding NaN or Inf becomes NaN) and the
exact fallback below SYMMCOLL_QUANTIZE_MIN_BYTES (1 MB on GPU: what run 1 on an H200 met, where the
reference still emulated the kernel). Inputs cycle
through NaN on the first / last rank, +Inf against -Inf, Inf against NaN and small integers, so every
finite result is exact. The interpreter runs tl.maximum / tl.minimum as the GPU does (NaN dropped
unless asked for: language/blocks.py), so these CPU runs see what the GPU computes; the ``gpu`` test
runs the same checks on a GPU (two ranks sharing it on a one-GPU machine: scripts/gpu_check.sh
semantics).

Not covered: algorithm="nccl" with max/min. The process group decides there: NCCL's max/min drop NaN
(fmaxf / __hmax), gloo's depend on the order of the operands (docs/algorithms.md)."""

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference
from symmcoll.comm.quantized import size_threshold

from rank_checks import device, special_values, assert_same

OPS = ("sum", "avg", "max", "min")


def _process_group_runs_here() -> bool:
    """The process group's own collectives run on these tensors (not with gloo on GPU tensors: ranks
    sharing one GPU, where gloo lacks most CUDA collectives)."""
    return not (torch.cuda.is_available() and dist.get_backend() == "gloo")
# 6 whole cycles of special_values per segment; 108 bytes of bf16: whole words (reduce_scatter.sentinel).
SEGMENT = 54


def _reduction_failures(dtypes, algorithms=None, reduce_ops=OPS) -> list[str]:
    """Every all_reduce / reduce_scatter algorithm (or ``algorithms``: op -> names) x reduce op x dtype;
    the failures, not just the first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for op in ("all_reduce", "reduce_scatter"):
        names = [*symmcoll.ALGORITHMS[op], "auto"] + (["nccl"] if _process_group_runs_here() else [])
        for algorithm in (algorithms or {}).get(op, names) if algorithms else names:
            for reduce_op in reduce_ops:
                if algorithm == "nccl" and reduce_op in ("max", "min"):
                    continue  # the process group's semantics (module docstring)
                for dtype in dtypes:
                    x = special_values(world * SEGMENT, rank, world, dtype)
                    try:
                        got = getattr(symmcoll, op)(x, op=reduce_op, algorithm=algorithm)
                        want = getattr(reference, op)(x, op=reduce_op)
                        assert_same(got, want, f"{op}.{algorithm} {reduce_op} {dtype}")
                    except AssertionError as exc:
                        failures.append(str(exc))
    symmcoll.check()
    return failures


def test_every_reduction_algorithm(pools):
    failures = [f for rank_failures in pools(2).run(_reduction_failures, [torch.bfloat16]) for f in rank_failures]
    assert failures == [], "\n".join(failures[:20])


def test_max_min_over_padded_peer_tiles(pools):
    """World size 3: the sentinel kernels reduce [4, BLOCK] tiles whose fourth row is padding."""
    sentinel = {"all_reduce": ["sentinel_one_shot", "sentinel_two_shot"], "reduce_scatter": ["sentinel"]}
    failures = [f for r in pools(3).run(_reduction_failures, [torch.float16], sentinel, ("max", "min")) for f in r]
    assert failures == [], "\n".join(failures[:20])


def _operands(m, k, n, rank, world, dtype):
    """a [m, k] full of special values, b [k, n] of -1, 0, 1 (zeros make Inf * 0 = NaN)."""
    a = special_values(m * k, rank, world, dtype).reshape(m, k)
    b = (torch.arange(k * n, device=device()).reshape(k, n) % 3 - 1).to(dtype)
    return a, b


def _fused_failures(dtype) -> list[str]:
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []

    def check(got, want, what, **tol):
        try:
            assert_same(got, want, what, **tol)
        except AssertionError as exc:
            failures.append(str(exc))

    a, b = _operands(4 * world, 9, 20, rank, world, dtype)
    nccl = ("nccl",) if _process_group_runs_here() else ()
    for algorithm in ("fused", "unfused", "chunked", *nccl):
        check(symmcoll.matmul_reduce_scatter(a, b, algorithm=algorithm), reference.matmul_reduce_scatter(a, b),
              f"matmul_reduce_scatter.{algorithm} {dtype}")
    for algorithm in ("one_shot", "two_shot", "unfused", *nccl):
        check(symmcoll.matmul_all_reduce(a, b, algorithm=algorithm), reference.matmul_all_reduce(a, b),
              f"matmul_all_reduce.{algorithm} {dtype}")
    # Rows of 18: row 1 sums to a NaN, row 2 to +Inf, row 3 to +Inf - Inf, the others finite.
    x = (torch.arange(5 * 18, device=device()).reshape(5, 18) % 5 - 2 + rank).to(dtype)
    x[1, 3] = float("nan") if rank == 0 else x[1, 3]
    x[2, 5] = float("inf") if rank == world - 1 else x[2, 5]
    x[3, 0] = float("inf") if rank == 0 else -float("inf")
    residual = torch.ones_like(x)
    weight = torch.full((18,), 0.5, dtype=dtype, device=device())
    scale = torch.full((1,), 0.25, device=device())
    tol = dict(rtol=1e-2, atol=1e-2)
    # The unfused and nccl variants end in torch: fp8 through them is torch's own arithmetic.
    for algorithm in ("one_shot", "two_shot", "unfused", *nccl):
        for quant in (None, "fp8_per_token", "fp8_per_tensor") if algorithm.endswith("_shot") else (None,):
            what = f"all_reduce_rms_norm.{algorithm} {quant} {dtype}"
            extra = dict(scale=scale) if quant == "fp8_per_tensor" else {}
            got = symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6, algorithm=algorithm, quant=quant, **extra)
            want = reference.all_reduce_rms_norm(x, residual, weight, 1e-6, quant=quant, **extra)
            check(got[1], want[1], what + " new residual", **tol)
            # The kernels normalise the rounded residual; fp8 keeps 3 mantissa bits.
            check(got[0], want[0], what + " normed", rtol=0.07 if quant else 2e-2, atol=1e-2)
            if quant == "fp8_per_token":
                check(got[2], want[2], what + " scales", **tol)
    symmcoll.check()
    return failures


def test_fused_reductions(pools):
    failures = [f for rank_failures in pools(2).run(_fused_failures, torch.bfloat16) for f in rank_failures]
    assert failures == [], "\n".join(failures[:20])


def _quantized_failures() -> list[str]:
    """As documented (docs/algorithms.md), under both sides of the size rule: the kernel
    (SYMMCOLL_QUANTIZE_MIN_BYTES=0) makes a group holding NaN or Inf dequantize to NaN (codecs.py); below
    the threshold (1 MB, the GPU's default, above these 16 KB) the exact all-reduce runs: NaN only where
    an input is NaN. Both bit for bit as reference.all_reduce_quantized, which applies the same rule."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.randn(4096, generator=torch.Generator().manual_seed(rank)).to(device())
    x[100] = float("nan") if rank == 0 else 1.0
    x[1000] = float("inf") if rank == world - 1 else 2.0
    failures = []
    for threshold in (0, 1 << 20):
        with size_threshold(threshold):
            path = "kernel" if threshold == 0 else "exact fallback"
            for quantize in ("int8", "fp8", "int4"):
                got = symmcoll.all_reduce(x, quantize=quantize, group_size=64)
                want = reference.all_reduce_quantized(x, None, "sum", quantize, 64)
                try:
                    assert_same(got, want, f"quantized {quantize} ({path})")
                    if threshold == 0:
                        assert bool(got[64:128].isnan().all() & got[960:1024].isnan().all()), \
                            "a non-finite group is not NaN"
                    else:
                        assert torch.equal(got.isnan(), torch.arange(4096, device=got.device) == 100), \
                            "the exact path has NaN where no input is NaN"
                        assert_same(got, reference.all_reduce(x), f"quantized {quantize} ({path}) against the exact sum")
                    assert bool(got[:64].isfinite().all()), "a finite group became NaN"
                except AssertionError as exc:
                    failures.append(f"rank {rank}: quantized {quantize} ({path}): {exc}")
    return failures


def test_quantized_as_documented(pools):
    failures = [f for rank_failures in pools(2).run(_quantized_failures) for f in rank_failures]
    assert failures == [], "\n".join(failures)


@pytest.mark.gpu
def test_gpu_every_reduction(pools):
    """The same checks on CUDA tensors (the GPU's max.f32 drops NaN unless told otherwise)."""
    world = 2
    # bf16 only for the collectives: every kernel variant compiles on first use (the combine is the
    # same code for every dtype); the fused ops in bf16, the quantized path in fp32.
    failures = [f for r in pools(world).run(_reduction_failures, [torch.bfloat16], timeout=300) for f in r]
    failures += [f for r in pools(world).run(_fused_failures, torch.bfloat16, timeout=300) for f in r]
    failures += [f for r in pools(world).run(_quantized_failures, timeout=300) for f in r]
    assert failures == [], "\n".join(failures[:40])
