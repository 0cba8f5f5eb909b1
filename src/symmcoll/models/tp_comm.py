"""The communication of a tensor-parallel block: one class per mode, four operations each.

    gather_matmul(a_shard, w)        all_gather(a_shard, dim 0) @ w          (sequence-parallel, in front of
                                                                             a column-parallel matmul)
    matmul_scatter(a, w)             reduce_scatter(a @ w, dim 0)            (sequence-parallel, after a
                                                                             row-parallel matmul)
    matmul_all_reduce(a, w)          all_reduce(a @ w)                       (classic TP)
    all_reduce_rms_norm(p, r, w, e)  h = r + all_reduce(p); (RMSNorm(h) * w, h)   (classic TP)

| mode | sequence-parallel (prefill) | classic TP (decode) |
|---|---|---|
| nccl | functional all_gather / reduce_scatter (NCCL) + matmul | matmul + dist.all_reduce (NCCL) |
| torch_async_tp | symm_mem.fused_all_gather_matmul / fused_matmul_reduce_scatter | matmul + symm_mem.one_shot_all_reduce_copy |
| symmcoll | symmcoll.all_gather_matmul / matmul_reduce_scatter | symmcoll.matmul_all_reduce / all_reduce_rms_norm |
| local | matmul (one rank: the unsharded block, the tests' oracle) | matmul |

torch has no fused matmul + all-reduce, and its async-TP ops shard rows, which decode (B rows, B = 1 is
not divisible by W) cannot: decode in torch_async_tp is classic TP whose all-reduces are torch's own
symmetric-memory one-shot all-reduce (its latency-bound algorithm), the strongest torch-native decode.
Its symmetric buffer is allocated collectively on the first call of each larger size: run a decode step
eagerly before capturing one in a CUDA graph (as with every mode's warm-up).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .layers import rms_norm

MODES = ("nccl", "torch_async_tp", "symmcoll")
SYMMCOLL_OPS = ("all_gather_matmul", "matmul_reduce_scatter", "matmul_all_reduce", "all_reduce_rms_norm")

# torch 2.13 renamed the functional collectives (the old names warn on every eager call); older torch
# (the GPU machine's 2.11) has only the old ones.
_all_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_reduce_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


class _AllReduceThenNorm:
    """matmul_all_reduce and all_reduce_rms_norm from an all_reduce: the unfused compositions."""

    def matmul_all_reduce(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.all_reduce(a @ w)

    def all_reduce_rms_norm(self, partial, residual, weight, eps: float):
        h = residual + self.all_reduce(partial)
        return rms_norm(h, weight, eps), h


class LocalComm(_AllReduceThenNorm):
    world = 1

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_matmul(self, a_shard, w):
        return a_shard @ w

    def matmul_scatter(self, a, w):
        return a @ w


class NcclComm(_AllReduceThenNorm):
    def __init__(self, group):
        self.group = group
        self.world = dist.get_world_size(group)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        # In place on a matmul's fresh output: the plain collective, which CUDA graphs capture.
        dist.all_reduce(t, group=self.group)
        return t

    def gather_matmul(self, a_shard, w):
        return funcol.wait_tensor(_all_gather(a_shard, 0, self.group)) @ w

    def matmul_scatter(self, a, w):
        return funcol.wait_tensor(_reduce_scatter(a @ w, "sum", 0, self.group))


class TorchAsyncTPComm(_AllReduceThenNorm):
    def __init__(self, group):
        import torch.distributed._symmetric_memory  # noqa: F401  (registers torch.ops.symm_mem)
        self.group = group
        self.world = dist.get_world_size(group)
        self.group_name = group.group_name

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        from ..memory.torch_buffers import symmetric_view
        buffer, _ = symmetric_view(self.group, t.device, t.numel(), t.dtype)
        return torch.ops.symm_mem.one_shot_all_reduce_copy(buffer.view(t.shape), t, "sum", self.group_name)

    def gather_matmul(self, a_shard, w):
        _, (out,) = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [w], 0, self.group_name, return_A=False)
        return out

    def matmul_scatter(self, a, w):
        return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, w, "sum", 0, self.group_name)


class SymmcollComm:
    def __init__(self, group, algorithms: dict[str, str] | None):
        import symmcoll
        unknown = set(algorithms or {}) - set(SYMMCOLL_OPS)
        if unknown:
            raise ValueError(f"algorithms: unknown ops {sorted(unknown)} (the block uses {', '.join(SYMMCOLL_OPS)})")
        self.symmcoll, self.group = symmcoll, group
        self.world = dist.get_world_size(group)
        self.algorithm = {op: (algorithms or {}).get(op, "auto") for op in SYMMCOLL_OPS}

    # The public functions are looked up on every call (not bound here), so a test's stand-in for an op
    # that is not merged yet, installed on the module, is what runs.
    def gather_matmul(self, a_shard, w):
        return self.symmcoll.all_gather_matmul(a_shard, w, self.group, algorithm=self.algorithm["all_gather_matmul"])

    def matmul_scatter(self, a, w):
        return self.symmcoll.matmul_reduce_scatter(a, w, self.group,
                                                   algorithm=self.algorithm["matmul_reduce_scatter"])

    def matmul_all_reduce(self, a, w):
        return self.symmcoll.matmul_all_reduce(a, w, self.group, algorithm=self.algorithm["matmul_all_reduce"])

    def all_reduce_rms_norm(self, partial, residual, weight, eps: float):
        # The fused op takes contiguous rows; a decode input may be a view (a column of a [B, S, H] batch).
        return self.symmcoll.all_reduce_rms_norm(partial, residual.contiguous(), weight, eps, self.group,
                                                 algorithm=self.algorithm["all_reduce_rms_norm"])


def make_comm(mode: str, group=None, algorithms: dict[str, str] | None = None):
    """The communication of ``mode`` over ``group`` (None: the default group; unused for "local")."""
    if mode not in (*MODES, "local"):
        raise ValueError(f"mode must be one of {', '.join(MODES)} or local, got {mode!r}")
    if algorithms and mode != "symmcoll":
        raise ValueError(f"algorithms= applies to mode 'symmcoll' only, not {mode!r}")
    if mode == "local":
        return LocalComm()
    if mode == "symmcoll":   # symmcoll resolves None itself (and the op then takes no group object)
        return SymmcollComm(group, algorithms)
    group = group if group is not None else dist.group.WORLD
    return NcclComm(group) if mode == "nccl" else TorchAsyncTPComm(group)
