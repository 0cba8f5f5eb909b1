"""What the fused variants claim, counted: the kernels each one launches (symmcoll.launcher.LAUNCH_COUNTS)
and that no torch matmul runs (every aten op of the call, recorded by a TorchDispatchMode). A "fused"
variant that quietly fell back to torch.matmul + a collective, or to two kernels, fails here although
its values would be right."""

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import symmcoll
from symmcoll.launcher import LAUNCH_COUNTS

from rank_checks import device

MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "_scaled_mm", "dot", "mv", "linear", "addmv", "einsum"}


class _AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def _count(fn):
    """(kernels launched by name, torch matmuls run) while ``fn()`` runs."""
    before = dict(LAUNCH_COUNTS)
    with _AtenOps() as ops:
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    launched = {k: v - before.get(k, 0) for k, v in LAUNCH_COUNTS.items() if v != before.get(k, 0)}
    return launched, sorted({n for n in ops.names if n in MATMULS})


def _claims():
    rank, world = dist.get_rank(), dist.get_world_size()
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(rank)
    a = torch.randn(8 * world, 16, generator=g).to(bf).to(device())
    b = torch.randn(16, 24, generator=g).to(bf).to(device())
    x = torch.randn(4, 32, generator=g).to(bf).to(device())
    residual, weight = torch.ones_like(x), torch.ones(32, dtype=bf, device=device())
    calls = {
        # one kernel: producer programs gather, consumer programs multiply
        ("all_gather_matmul", "fused"): (lambda: symmcoll.all_gather_matmul(a[:5], b, algorithm="fused"),
                                         {"ag_matmul_kernel": 1}),
        # one GEMM kernel reading peers' rows, between two barrier kernels
        ("all_gather_matmul", "naive_remote"): (lambda: symmcoll.all_gather_matmul(a[:5], b, algorithm="naive_remote"),
                                                {"ag_matmul_kernel": 1, "barrier_kernel": 2}),
        ("matmul_reduce_scatter", "fused"): (lambda: symmcoll.matmul_reduce_scatter(a, b, algorithm="fused"),
                                             {"matmul_reduce_scatter_kernel": 1}),
        ("matmul_all_reduce", "one_shot"): (lambda: symmcoll.matmul_all_reduce(a, b, algorithm="one_shot"),
                                            {"matmul_all_reduce_kernel": 1}),
        # the reduce-scatter kernel, then symmcoll's all-gather (one kernel at this size)
        ("matmul_all_reduce", "two_shot"): (lambda: symmcoll.matmul_all_reduce(a, b, algorithm="two_shot"),
                                            {"matmul_reduce_scatter_kernel": 1, "all_gather_kernel": 1}),
        ("all_reduce_rms_norm", "one_shot"): (lambda: symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6,
                                                                                   algorithm="one_shot"),
                                              {"rms_norm_one_shot_kernel": 1}),
        ("all_reduce_rms_norm", "two_shot"): (lambda: symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6,
                                                                                   algorithm="two_shot"),
                                              {"rms_norm_two_shot_kernel": 1}),
    }
    found = {}
    for name, (fn, want) in calls.items():
        fn()  # first call: plans, workspaces, compiled kernels
        found[name] = (*_count(fn), want)
    return found


def test_fused_variants_launch_what_they_claim(pools):
    for rank, found in enumerate(pools(2).run(_claims)):
        for (op, algorithm), (launched, matmuls, want) in found.items():
            assert launched == want, f"rank {rank}: {op}.{algorithm} launched {launched}, claims {want}"
            assert matmuls == [], f"rank {rank}: {op}.{algorithm} ran torch {matmuls}"


def _baseline_counts():
    """The unfused baselines do run torch.matmul: the recorder sees it."""
    bf = torch.bfloat16
    a = torch.ones(4, 16, dtype=bf, device=device())
    b = torch.ones(16, 8, dtype=bf, device=device())
    symmcoll.matmul_reduce_scatter(a, b, algorithm="unfused")
    return _count(lambda: symmcoll.matmul_reduce_scatter(a, b, algorithm="unfused"))[1]


def test_the_recorder_sees_torch_matmul(pools):
    assert all(found == ["mm"] for found in pools(2).run(_baseline_counts))
