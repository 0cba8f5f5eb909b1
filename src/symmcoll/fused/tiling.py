"""What the row-parallel fused ops (matmul + reduce-scatter, matmul + all-reduce) share on top of
gemm.py: tile configs by problem shape, the program count, the TMA decision, and ``tile_product``, one
output tile of A @ B over all of K, for kernels that do more with a finished tile than store it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from .gemm import CPU_GEMM, GPU_GEMM, ensure_tma_allocator, load_tile, mma, num_sms, tma_ok


@dataclass(frozen=True)
class TileConfig:
    """A GEMM tile shape and how its program is launched."""

    bm: int
    bn: int
    bk: int
    group_m: int
    num_warps: int
    num_stages: int

    def meta(self) -> dict:
        return dict(BM=self.bm, BN=self.bn, BK=self.bk, GROUP_M=self.group_m, num_warps=self.num_warps,
                    num_stages=self.num_stages)


# GPU tile configs by the rows of the tile grid, ascending (the last holds beyond). The large-M entry is
# gemm.py's (measured on H200 against cuBLAS); the two small-M entries are starting points for the
# GPU sweep, not measurements: decode-sized GEMMs are bound by reading B, so they trade the tile's
# rows for more column tiles (every SM streams part of B).
GPU_TILES = ((128, TileConfig(64, 64, 128, 1, 4, 4)),
             (1024, TileConfig(128, 128, 64, 8, 8, 3)),
             (1 << 62, TileConfig(*GPU_GEMM)))
CPU_TILE = TileConfig(*CPU_GEMM)
# Compile checks record launches on meta tensors: programs as on an H200.
META_SMS = 132


def tile_config(rows: int, device_type: str, itemsize: int = 2) -> TileConfig:
    """The tile config for a GEMM whose tile grid has ``rows`` rows (every rank must pass the same);
    4-byte operands take half the k-step, so that the pipeline's stages fit a Hopper block's 227 KB of
    shared memory."""
    if device_type != "cuda":
        return CPU_TILE
    config = next((c for max_rows, c in GPU_TILES if rows <= max_rows), GPU_TILES[-1][1])
    return replace(config, bk=config.bk // 2) if itemsize > 2 else config


def programs(t: torch.Tensor, work: int) -> int:
    """Persistent programs for ``work`` tiles: one per SM at most (a CPU run: gemm.num_sms's 4)."""
    sms = META_SMS if t.device.type == "meta" else num_sms(t.device)
    return max(1, min(sms, work))


def use_tma(device_type: str, *tensors: torch.Tensor) -> bool:
    """Tensor-descriptor loads on GPU where every row stride is 16-byte aligned; pointer loads
    otherwise (and always on CPU)."""
    if device_type != "cuda" or not tma_ok(*tensors):
        return False
    if tensors[0].is_cuda:
        ensure_tma_allocator()
    return True


@triton.jit
def operand_descriptors(a_ptr, b_ptr, M, N, K, stride_a, stride_b, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, TMA: tl.constexpr):
    """Tensor descriptors of A [M, K] and B [K, N] (TMA), or the pointers themselves."""
    if TMA:
        return (tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1], block_shape=[BM, BK]),
                tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1], block_shape=[BK, BN]))
    else:
        return a_ptr, b_ptr


@triton.jit
def tile_product(a_ptr, b_ptr, a_desc, b_desc, row0, col0, row_limit, N, K, stride_a, stride_b,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, TMA: tl.constexpr):
    """fp32 tile A[row0:row0+BM, :] @ B[:, col0:col0+BN]. Pointer loads read A rows below
    ``row_limit`` only (zeros beyond); TMA loads read whole blocks of A (rows past ``row_limit`` but
    inside A come in too: the caller masks them out of what it stores)."""
    rows = row0 + tl.arange(0, BM)
    cols = col0 + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        if TMA:
            acc = mma(a_desc.load([row0, k]), b_desc.load([k, col0]), acc)
        else:
            ks = k + tl.arange(0, BK)
            acc = mma(load_tile(a_ptr, rows, ks, row_limit, K, stride_a), load_tile(b_ptr, ks, cols, K, N, stride_b),
                      acc)
    return acc
