"""The persistent tensor-core GEMM every fused op is built on: a tile scheduler, tile loads by TMA
descriptor or by pointer, fp32 accumulation, and one plain ``matmul`` (C = A @ B) for the two-launch
variants.

Persistent: one program per SM walks tiles ``pid, pid + P, ...`` of a grouped order (GROUP_M row blocks
share B columns in L2, as in Triton's tutorials 03/09). Fused ops reorder the *row blocks* (their own
shard first, peers' after) through ``row_block``, which maps a logical row-block index to (shard,
block within the shard) so that no tile straddles two ranks' rows.

Loads: ``TMA=True`` uses device-side tensor descriptors (Hopper's bulk tensor copies; row strides must be
16-byte aligned, which the host checks), ``TMA=False`` masked pointer loads (any shape). ``mma`` is
``tl.dot`` with fp32 accumulation; under the interpreter it upcasts to fp32 first (triton 3.6's
interpreter adds bf16 bit patterns instead of values) -- the GPU path never does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import INTERPRETED, narrow
from ..launcher import launch
from ..plan import LaunchConfig  # noqa: F401  (fused configs share the dataclass conventions)


@triton.jit
def mma(a, b, acc):
    """acc + a @ b in fp32 (tensor cores on GPU)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def grouped_tile(tile, num_m, num_n, GROUP_M: tl.constexpr):
    """(row block, column block) of ``tile`` in grouped order: GROUP_M row blocks sweep the columns
    together, so a column block of B is reused from L2 by GROUP_M tiles."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@triton.jit
def row_block(logical, blocks_per_shard, rows_per_shard, rank, WORLD: tl.constexpr, BM: tl.constexpr):
    """Logical row block -> (owner rank, first row, rows in this block): my shard's blocks first, then
    rank+1's, ...; blocks never straddle two shards (a shard's last block may be short)."""
    owner = (rank + logical // blocks_per_shard) % WORLD
    first = (logical % blocks_per_shard) * BM
    return owner, owner * rows_per_shard + first, tl.minimum(rows_per_shard - first, BM)


@triton.jit
def load_tile(ptr, rows, cols, row_limit, col_limit, stride):
    """A [len(rows), len(cols)] tile of a row-major matrix, zeros outside the limits."""
    mask = (rows[:, None] < row_limit) & (cols[None, :] < col_limit)
    return tl.load(ptr + rows[:, None].to(tl.int64) * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def store_tile(c_ptr, acc, rows, cols, row_limit, col_limit, stride):
    mask = (rows[:, None] < row_limit) & (cols[None, :] < col_limit)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * stride + cols[None, :], narrow(acc, c_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def acc_tile_tma(a_desc, row, b_desc, col, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """fp32 [BM, BN] tile of A[row:row+BM] @ B[:, col:col+BN] by TMA loads (rows beyond A: zeros)."""
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        acc = mma(a_desc.load([row, k]), b_desc.load([k, col]), acc)
    return acc


@triton.jit
def acc_tile(a_base, stride_a, rows, b_ptr, stride_b, cols, K, N, BM: tl.constexpr, BN: tl.constexpr,
             BK: tl.constexpr):
    """The same by masked pointer loads: A rows [0, rows) from ``a_base``, B columns ``cols``."""
    r = tl.arange(0, BM)
    acc = tl.zeros([BM, BN], tl.float32)
    for k in range(0, K, BK):
        ks = k + tl.arange(0, BK)
        acc = mma(load_tile(a_base, r, ks, rows, K, stride_a), load_tile(b_ptr, ks, cols, K, N, stride_b), acc)
    return acc


@triton.jit
def matmul_kernel(
    # C [M, N] = A [M, K] @ B [K, N], row-major (row strides given)
    a_ptr, b_ptr, c_ptr, M, N, K, stride_a, stride_b, stride_c,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    TMA: tl.constexpr,
):
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    if TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1], block_shape=[BM, BK])
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1], block_shape=[BK, BN])
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        acc = tl.zeros([BM, BN], tl.float32)
        for k in range(0, K, BK):
            if TMA:
                acc = mma(a_desc.load([pid_m * BM, k]), b_desc.load([k, pid_n * BN]), acc)
            else:
                ks = k + tl.arange(0, BK)
                acc = mma(load_tile(a_ptr, rows, ks, M, K, stride_a), load_tile(b_ptr, ks, cols, K, N, stride_b), acc)
        store_tile(c_ptr, acc, rows, cols, M, N, stride_c)


# Tile configs (BM, BN, BK, GROUP_M, warps, stages), from benchmarks/gemm_probe.py on H200; CPU: small.
GPU_GEMM = (128, 256, 64, 8, 8, 3)
CPU_GEMM = (32, 32, 32, 4, 4, 1)


def num_sms(device: torch.device) -> int:
    """Programs of a persistent kernel: one per SM (4 under the interpreter; an H100/H200's 132 when
    recording launches on a machine without a GPU)."""
    if device.type != "cuda":
        return 4
    if not torch.cuda.is_available():
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Device-side tensor descriptors need 16-byte aligned bases and row strides."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 for t in tensors if t.dim() == 2)


_ALLOCATOR_SET = False


def ensure_tma_allocator() -> None:
    """Device-side descriptors live in a per-launch scratch buffer Triton asks an allocator for."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _ALLOCATOR_SET = True


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, config=None,
           programs: int | None = None) -> torch.Tensor:
    """C = A @ B with the persistent kernel (A [M, K], B [K, N], row-major; fp32 accumulation)."""
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), dtype=a.dtype, device=a.device) if out is None else out
    bm, bn, bk, group, warps, stages = config or (GPU_GEMM if a.device.type != "cpu" else CPU_GEMM)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    nprog = max(1, min(tiles, programs or num_sms(a.device)))
    on_gpu = a.is_cuda or a.device.type == "meta"  # meta: the compile checks record the launch
    use_tma = on_gpu and tma_ok(a, b, out)
    if use_tma and a.is_cuda:
        ensure_tma_allocator()
    launch(matmul_kernel, (nprog,), (a, b, out, M, N, K, a.stride(0), b.stride(0), out.stride(0)),
           dict(BM=bm, BN=bn, BK=bk, GROUP_M=group, NUM_PROGRAMS=nprog, TMA=use_tma, num_warps=warps,
                num_stages=stages))
    return out


def compile_cases(make_workspace):
    """The plain GEMM's launches on meta tensors (TMA: aligned shapes; pointer loads: odd ones)."""
    def case(m, n, k, dtype):
        def thunk():
            a = torch.empty((m, k), dtype=dtype, device="meta")
            b = torch.empty((k, n), dtype=dtype, device="meta")
            matmul(a, b, config=GPU_GEMM, programs=132)
        return f"gemm {m}x{n}x{k} {dtype}", thunk
    return [case(8192, 8192, 8192, torch.bfloat16), case(1000, 3584, 4096, torch.float16),
            case(33, 100, 72, torch.bfloat16)]
