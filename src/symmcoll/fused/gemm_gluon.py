"""The GEMM core's decode kernel in Gluon, for sm_90: a swapped tile (the tokens on wgmma's narrow side) 64
columns of B wide over its share of K, whose first k-steps of B -- a weight, which no kernel before writes --
are loaded into shared memory before the programmatic-dependent-launch wait.

Why a second kernel beside gemm_kernel.py's K-loop: at M <= 64 a GEMM reads its weights and little else, and
a decode step is a chain of such GEMMs. Under PDL the next launch's programs take each SM the moment ours
leaves it, but the Triton core's software pipeline cannot issue a load before ``griddepcontrol.wait``, so
each launch starts its reads from nothing when the one before ends. Gluon (triton 3.6,
``triton.experimental.gluon``) hands us the ring: this kernel issues its first STAGES k-steps of B (~160 KB a
program) before the wait, so they stream while the launch before it drains. Measured on one H200
(benchmarks/results/2026-11-29-gluon-h200, chains of the same decode GEMM over rotating weights, beside the
core and cuBLAS): 70b-tp4 o (32 MB) M = 1 / 16 3.84 / 3.75 TB/s against the core's 3.34 / 3.30, 70b-tp2 o
4.27 against 3.87, 70b-tp8 down 4.20 against 3.80, 405b-tp8 qkv (the column blocks' k-steps split 3 ways)
3.68 against 3.40; where the launch leaves SMs idle (70b-tp4 qkv whole: 40 programs) the early loads lose.
Where it wins is the tune's to say: a table config with ``gluon`` set runs here, the rest on the core.

Gluon does not run under the interpreter: on CPU, on other GPUs and in the fused ops' own kernels a
``gluon`` config runs the Triton core's tile of the same shape (``runs_here`` says which; the CPU tests run
that twin, and compile this kernel for sm_90). The split: ``parts`` programs a column block share its
k-steps; each stores its fp32 partial, the last to arrive (a counter a column block, left zero as
gemm_split.split_counters asks) sums every part's in part order and stores the tile -- the same bits
whichever part is last.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..language import INTERPRETED
from .gemm_configs import GemmConfig
from .gemm_split import split_counters

# Columns of B (rows of W) a program computes: wgmma's 64-row side.
BLOCK_N = 64
GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


@gluon.jit
def _issue_step(a_desc, b_desc, a_bufs, b_bufs, a_ready, b_ready, col0, step, stage, end, LOAD_A: gl.constexpr,
                LOAD_B: gl.constexpr, B_T: gl.constexpr):
    """TMA loads of k-step ``step`` (if below ``end``) of A [tokens, BK] and/or B's 64 columns into ``stage``."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    live = step < end
    if LOAD_B:
        mbarrier.expect(b_ready.index(stage), b_desc.block_type.nbytes, pred=live)
        if B_T:  # W [N, K]: blocks [64, BK]
            tma.async_copy_global_to_shared(b_desc, [col0, step * BK], b_ready.index(stage), b_bufs.index(stage), live)
        else:  # B [K, N]: blocks [BK, 64]
            tma.async_copy_global_to_shared(b_desc, [step * BK, col0], b_ready.index(stage), b_bufs.index(stage), live)
    if LOAD_A:
        mbarrier.expect(a_ready.index(stage), a_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(a_desc, [0, step * BK], a_ready.index(stage), a_bufs.index(stage), live)


@gluon.jit
def decode_kernel(
    # C [M, N] = A [M, K] @ B, M <= the tokens tile; B given as B [K, N] or (B_T) W = B^T [N, K], row-major,
    # through host descriptors (gemm_gluon.descriptors). Program (t, p): part p of C[:, 64t : 64t + 64].
    a_desc, b_desc, c_ptr, M, N, K, stride_c,
    # parts > 1 (the grid's second dimension): fp32 partials [tiles, parts, 64, tokens], zeroed counters [tiles]
    partials_ptr, counters_ptr,
    STAGES: gl.constexpr, B_T: gl.constexpr,
    PDL: gl.constexpr,  # launched with programmatic dependent launch: B's first STAGES k-steps before the wait
    B_EARLY: gl.constexpr,  # B's first k-steps issued before the wait (False: after it, as the Triton core; a probe's)
    A_STAGES: gl.constexpr,  # A's ring (GemmConfig.a_stages; STAGES where it is 0): A's tiles come from L2
    num_warps: gl.constexpr,
):
    BT: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0] if B_T else b_desc.block_type.shape[1]  # (BLOCK_N)
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [A_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    a_ready = gl.allocate_shared_memory(gl.int64, [A_STAGES, 1], mbarrier.MBarrierLayout())
    b_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(A_STAGES):
        mbarrier.init(a_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(b_ready.index(i), count=1)
    tile = gl.program_id(0)
    part = gl.program_id(1)
    parts = gl.num_programs(1)
    col0 = tile * BN
    steps = gl.cdiv(K, BK)
    first = part * steps // parts
    end = (part + 1) * steps // parts
    if B_EARLY:  # B: a weight, loaded before the wait
        for s in gl.static_range(STAGES):
            _issue_step(a_desc, b_desc, a_bufs, b_bufs, a_ready, b_ready, col0, first + s, s, end, False, True, B_T)
    if PDL:  # the kernel before has completed and its stores are visible; the next may launch
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)
    if not B_EARLY:
        for s in gl.static_range(STAGES):
            _issue_step(a_desc, b_desc, a_bufs, b_bufs, a_ready, b_ready, col0, first + s, s, end, False, True, B_T)
    for s in gl.static_range(A_STAGES):  # A: the kernel before may have written it
        _issue_step(a_desc, b_desc, a_bufs, b_bufs, a_ready, b_ready, col0, first + s, s, end, True, False, B_T)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BT, 16])
    acc = gl.zeros([BN, BT], gl.float32, layout)  # C's tile transposed
    for i in range(end - first):
        stage = i % STAGES
        a_stage = i % A_STAGES
        mbarrier.wait(b_ready.index(stage), (i // STAGES) & 1)
        mbarrier.wait(a_ready.index(a_stage), (i // A_STAGES) & 1)
        if B_T:
            w = b_bufs.index(stage)
        else:
            w = b_bufs.index(stage).permute((1, 0))
        acc = warpgroup_mma(w, a_bufs.index(a_stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        gl.thread_barrier()  # every warp's wgmma has read the stages before the TMA refills them
        _issue_step(a_desc, b_desc, a_bufs, b_bufs, a_ready, b_ready, col0, first + i + STAGES, stage, end, False,
                    True, B_T)
        _issue_step(a_desc, b_desc, a_bufs, b_bufs, a_ready, b_ready, col0, first + i + A_STAGES, a_stage, end, True,
                    False, B_T)
    local = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    tokens = gl.arange(0, BT, layout=gl.SliceLayout(0, layout))
    cols = col0 + local
    c_ptrs = c_ptr + tokens[None, :].to(gl.int64) * stride_c + cols[:, None]
    mask = (cols[:, None] < N) & (tokens[None, :] < M)
    if parts == 1:
        gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        offsets = local[:, None] * BT + tokens[None, :]
        slots = partials_ptr + tile.to(gl.int64) * parts * (BN * BT)
        gl.store(slots + part * (BN * BT) + offsets, acc)
        gl.thread_barrier()  # every thread's partial is stored before the counter says so
        arrived = gl.atomic_add(counters_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == parts - 1:  # the last part: every partial is visible; sum them in part order
            total = gl.zeros([BN, BT], gl.float32, layout)
            for q in range(parts):
                total += gl.load(slots + q * (BN * BT) + offsets, cache_modifier=".cg")
            gl.store(c_ptrs, total.to(c_ptr.dtype.element_ty), mask=mask)
            gl.store(counters_ptr + tile, 0)  # left zero for the next launch (which waits for this one)


def runs_here(config: GemmConfig, a: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether the plain matmul may run ``config`` on this kernel: a ``gluon`` config, an sm_90 GPU (not the
    interpreter), 16-bit operands, at most the tile's tokens. (The caller checks that A and B are TMA-aligned:
    gemm.tma_ok, as for the Triton core's descriptors.)"""
    return (config.gluon and not INTERPRETED and a.is_cuda and a.dtype in GL_DTYPES and src.dtype == a.dtype
            and a.shape[0] <= config.block_m and _sm90(a.device))


_SM90: dict = {}


def _sm90(device: torch.device) -> bool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM90:
        _SM90[index] = torch.cuda.get_device_capability(index)[0] == 9
    return _SM90[index]


def blocks(config: GemmConfig, b_t: bool) -> tuple[list[int], list[int]]:
    """The TMA blocks: A's [tokens, BK], B's ([64, BK] of W, or [BK, 64])."""
    bk = config.block_k
    return [config.block_m, bk], ([BLOCK_N, bk] if b_t else [bk, BLOCK_N])


def layouts(config: GemmConfig, dtype: torch.dtype, b_t: bool) -> tuple:
    """The shared-memory layouts of ``blocks``."""
    return tuple(gl.NVMMASharedLayout.get_default_for(block, GL_DTYPES[dtype]) for block in blocks(config, b_t))


def descriptors(config: GemmConfig, a: torch.Tensor, src: torch.Tensor, b_t: bool) -> tuple:
    (a_block, b_block), (la, lb) = blocks(config, b_t), layouts(config, a.dtype, b_t)
    return TensorDescriptor.from_tensor(a, a_block, la), TensorDescriptor.from_tensor(src, b_block, lb)


def launch_args(config: GemmConfig, a: torch.Tensor, src: torch.Tensor, b_t: bool, out: torch.Tensor,
                pdl: dict, b_early: bool = True) -> tuple:
    """(grid, args, meta) of ``decode_kernel`` for C = ``out`` (``src``, ``b_t``: gemm.b_layout's; ``b_early``
    False: B's first k-steps after the wait -- benchmarks/gluon_decode_probe.py's comparison)."""
    (m, k), n = a.shape, out.shape[1]
    tiles = triton.cdiv(n, BLOCK_N)
    parts = max(1, min(config.split_k, triton.cdiv(k, config.block_k)))
    if parts > 1:
        partials = torch.empty(tiles * parts * BLOCK_N * config.block_m, dtype=torch.float32, device=a.device)
        counters = split_counters(a.device, tiles)
    else:
        partials = counters = out  # (unused)
    a_desc, b_desc = descriptors(config, a, src, b_t)
    meta = dict(STAGES=config.num_stages, B_T=b_t, PDL=bool(pdl.get("PDL")), B_EARLY=b_early,
                A_STAGES=config.a_ring, num_warps=4,
                **({"launch_pdl": True} if pdl.get("launch_pdl") else {}))
    return (tiles, parts), (a_desc, b_desc, out, m, n, k, out.stride(0), partials, counters), meta


def compile_sm90(config: GemmConfig, b_t: bool, pdl: bool = True, dtype: torch.dtype = torch.bfloat16,
                 b_early: bool = True):
    """``decode_kernel`` built for sm_90 without a GPU, as the GPU's launch of ``config`` compiles it (16-byte
    aligned pointers and sizes that are multiples of 16): the compile checks' (tests/test_compile.py) -- Gluon
    kernels are not recorded on meta tensors as the Triton ones are (a meta launch runs the Triton twin)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    (a_block, b_block), (la, lb) = blocks(config, b_t), layouts(config, dtype, b_t)
    name = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    desc = lambda block, layout: f"tensordesc<{name}[{block[0]}, {block[1]}],{layout!r}>"
    signature = {"a_desc": desc(a_block, la), "b_desc": desc(b_block, lb), "c_ptr": f"*{name}",
                 "M": "i32", "N": "i32", "K": "i32", "stride_c": "i32", "partials_ptr": "*fp32", "counters_ptr": "*i32",
                 "STAGES": "constexpr", "B_T": "constexpr", "PDL": "constexpr", "B_EARLY": "constexpr",
                 "A_STAGES": "constexpr", "num_warps": "constexpr"}
    constexprs = {(9, ): config.num_stages, (10, ): b_t, (11, ): pdl, (12, ): b_early,
                  (13, ): config.a_ring, (14, ): 4}
    attrs = {(i, ): [["tt.divisibility", 16]] for i in (2, 4, 5, 6, 7, 8)}
    return triton.compile(GluonASTSource(decode_kernel, signature, constexprs, attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": pdl})
