"""The GEMM core's host side and the plain ``matmul`` (C = A @ B) built on it; its kernels (the one
K-loop, the tile scheduler, the split path, ``matmul_kernel``) are in gemm_kernel.py.

    matmul          C = A @ B: validates, reads B's layout (``b_layout``: row-major, or nn.Linear's
                    ``W.t()`` read in place) and launches ``matmul_kernel`` as ``core_launch`` says -- or,
                    for a table config marked ``gluon`` on sm_90, gemm_gluon.py's decode kernel.
    core_launch     the launch of one product: the config fitted to shared memory, its split plan over
                    the persistent programs (gemm_configs.split_plan), the grid, TMA descriptors made on
                    the host where every operand is aligned (``use_tma``), the split's partials and
                    counters (gemm_split.py). What depends on the shape alone is worked out once per
                    shape (``_core_shape``). all_gather_matmul's lone-rank path launches its own kernel
                    with it.
    helpers         what the fused ops' launches share: ``b_layout``, ``use_tma``, ``host_descriptors``,
                    ``c_descriptor``, ``precision``, ``programs_for`` / ``num_sms``.

Configs (tile shape, swap, split, warps, stages) come from gemm_tables.gemm_config: a table measured
per GPU model by ``symmcoll tune --op gemm``, or the untuned rule.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ..launcher import launch, pdl_meta
from . import gemm_gluon
from .gemm_configs import MAX_SPLIT_TILES, GemmConfig, split_plan
from .gemm_kernel import matmul_kernel, split_sum_kernel
from .gemm_tables import device_facts, gemm_config, measured_cell, pdl_decode_limits, pdl_small_limits
from .gemm_split import reduce_loads, split_counters

# tl.dot's precision for fp32 operands, by torch.get_float32_matmul_precision().
FP32_PRECISION = {"highest": "tf32x3", "high": "tf32", "medium": "tf32"}


def num_sms(device: torch.device) -> int:
    """Programs of a persistent kernel: one per SM (4 under the interpreter; an H100/H200's 132 when
    recording launches on a machine without a GPU)."""
    if device.type == "meta" or (device.type == "cuda" and not torch.cuda.is_available()):
        return 132
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Device-side tensor descriptors need 16-byte aligned bases and row strides (and unit column
    strides)."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(1) == 1
               for t in tensors if t.dim() == 2)


_ALLOCATOR_SET = False


def ensure_tma_allocator() -> None:
    """Device-side descriptors live in a per-launch scratch buffer Triton asks an allocator for."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _ALLOCATOR_SET = True


def use_tma(device_type: str, *tensors: torch.Tensor) -> bool:
    """Tensor-descriptor loads on GPU where every row stride is 16-byte aligned; pointer loads
    otherwise (and always on CPU). Meta tensors (compile checks) count as GPU tensors."""
    if device_type not in ("cuda", "meta") or not tma_ok(*tensors):
        return False
    if tensors[0].is_cuda:
        ensure_tma_allocator()
    return True


def precision(dtype: torch.dtype) -> str:
    return FP32_PRECISION[torch.get_float32_matmul_precision()] if dtype == torch.float32 else "tf32"


def b_layout(b: torch.Tensor, k: int) -> tuple[torch.Tensor, bool]:
    """(matrix to load from, B_T): B row-major [K, N], or W [N, K] where B is a transposed view of a
    row-major W (nn.Linear's ``weight.t()``: no copy); anything else is copied row-major."""
    (rows, cols), (row_stride, col_stride) = b.shape, b.stride()  # one call each: on every fused GEMM call's path
    if col_stride == 1 and (row_stride >= cols or rows == 1):
        return b, False
    if row_stride == 1 and col_stride >= k:
        return b.t(), True
    return b.contiguous(), False


def b_descriptor(b: torch.Tensor, b_t: bool, block_n: int, block_k: int) -> TensorDescriptor:
    """B's tensor descriptor made on the host: blocks [block_n, block_k] of W (b_t) or [block_k, block_n]."""
    return TensorDescriptor(b, list(b.shape), [b.stride(0), 1], [block_n, block_k] if b_t else [block_k, block_n])


def host_descriptors(config: GemmConfig, a: torch.Tensor, b: torch.Tensor, b_t: bool) -> tuple:
    """Tensor descriptors of A and B made on the host (kernel parameters: no device work per launch)."""
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    return TensorDescriptor(a, list(a.shape), [a.stride(0), 1], [bm, bk]), b_descriptor(b, b_t, bn, bk)


def c_descriptor(c: torch.Tensor, rows: int, config: GemmConfig) -> TensorDescriptor:
    """C's tensor descriptor for ``store_result`` with TMA_STORE: ``rows`` rows (its clipping is the
    row limit), blocks of a tile's C_HALVES piece (GemmConfig.c_halves)."""
    return TensorDescriptor(c, [rows, c.shape[1]], [c.stride(0), 1],
                            [config.block_m, config.block_n // config.c_halves])


def programs_for(config: GemmConfig, device: torch.device) -> int:
    """Persistent programs of a GEMM-core kernel: ``occupancy`` per SM."""
    return num_sms(device) * config.occupancy


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, config: GemmConfig | None = None,
           programs: int | None = None) -> torch.Tensor:
    """C = A @ B with the GEMM core (A [M, K] row-major; B [K, N] row-major or the transpose of a
    row-major [N, K]; fp32 accumulation; bf16, fp16 or fp32)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul takes a [M, K] and b [K, N], got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if b.dtype != a.dtype:
        raise ValueError(f"b.dtype ({b.dtype}) must equal a.dtype ({a.dtype})")
    M, K = a.shape
    N = b.shape[1]
    out = torch.empty((M, N), dtype=a.dtype, device=a.device) if out is None else out
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    a = a if a.stride(1) == 1 else a.contiguous()
    src, b_t = b_layout(b, K)
    config = config or gemm_config(M, N, K, a.dtype, a.device)
    if config.gluon and gemm_gluon.runs_here(config, a, src) and tma_ok(a, src):  # (else the core runs the tile)
        launch(gemm_gluon.decode_kernel, *gemm_gluon.launch_args(config.fitted(a.element_size()), a, src, b_t, out,
                                                                  pdl_meta(a.device, True if PDL_DECODE else None)))
        return out
    core = core_launch(a, src, b_t, out, config, programs)
    launch(matmul_kernel, (core.grid,), core.args, launch_meta(core, a.device))
    launch_split_sum(core, out)
    return out


# The plain GEMM's decode launches of whole tiles (no split, one program an SM) up to the M and the bytes of B
# that the GPU model's table measured ("pdl_decode": gemm_tables.pdl_decode_limits) run with programmatic
# dependent launch and release the next kernel right after their wait, whatever SYMMCOLL_PDL says
# (SYMMCOLL_PDL_DECODE=0: they follow it). On one H200 (results/2026-11-28-pdl-early-h200/call3, the 90 decode
# cells in a chain of the same GEMM, against no PDL at all): 70b-tp8 o 0.90-0.92x the time, 70b-tp4 o
# 0.94-0.95x, 70b-tp4 qkv M = 8/16 0.93-0.94x, 70b-tp8 down 0.95-0.97x, dsv3-expert 0.94-0.99x -- the next
# kernel's programs are dispatched while ours finish, so its launch leaves no gap (cuBLAS's decode kernels
# launch so too). Not applied where it was slower: split launches (405b-tp8 qkv 22 -> 23.5-30 us, call2), two
# programs an SM (405b-tp8 o M = 16: 18.1 -> 22.5, call2), and longer reads -- every whole-tile cell of more
# than 64 MB of weights ran at 0.99-1.31x (70b-tp2 qkv, 80 MB in 80 tiles: 1.24-1.31x; the gate_up cells of
# 112-448 MB 1.04-1.12x where the tiles are 104-224): the H200 table's limits are M <= 64, B <= 64 MB. Why they
# lose (results/2026-11-28-pdl-placement-h200/call1, a probe of each program's SM and timer): at 80 tiles the
# next launch's programs take the SMs ours leave idle, so each launch runs crowded on whichever SMs were free
# (its programs' reads of 1 MB took 13.6-28.9 us against 19.0-21.5 without PDL), where 128 programs on 132 SMs
# leave no room to crowd. Split launches over every SM under the rule lost too (the same folder, call2). The
# H100's table has none (not measured there). Loading B's first one or two k-steps before the wait as well (a
# weight, held in registers: the Triton pipeline issues nothing before the wait) was slower again (call2's p1e / p2e
# columns): not kept. The whole ring of them before the wait is what pays -- gemm_gluon.py's kernel, where the
# table says so (results/2026-11-29-gluon-h200).
PDL_DECODE = os.environ.get("SYMMCOLL_PDL_DECODE", "1") == "1"


def decode_pdl(M: int, N: int, K: int, itemsize: int, split: bool, occupancy: int, key: str | None) -> bool:
    """Whether a plain-GEMM launch of (M, N, K) runs with PDL and early release on GPU model ``key`` (see
    PDL_DECODE): whole tiles, one program an SM, within the model's measured limits."""
    return _within(PDL_DECODE, split, occupancy, pdl_decode_limits(key), M, N * K * itemsize)


# The GEMM core's launches of small products (whole tiles, one program an SM, at most the multiply-adds and bytes
# of B the GPU model's table measured: "pdl_small", gemm_tables.pdl_small_limits) run with programmatic dependent
# launch -- the next kernel released after our main loop, as SYMMCOLL_PDL=1 does -- whatever SYMMCOLL_PDL says
# (SYMMCOLL_PDL_SMALL=0: they follow it), the plain matmul's and the fused ops' alike (the rule sits in the core's
# meta). Such a kernel's main loop is short (1024^3: 8 k-steps of L2-warm operands, 5.5 us in the kernel on one
# H200 against cuBLAS's 5.3, 0.2 us between kernels on both sides), so the next launch's start and prologue under
# its epilogue are a few percent of a call: all_gather_matmul at world size 1, 1024^3, fused 1.042 -> 0.961x cuBLAS,
# copy_engine_producer 1.037 -> 0.963 (results/2026-11-28-pdl-small-h200/call1: SYMMCOLL_PDL=0 against 1, the
# other shapes of the three fused ops' grids 0.97-1.03x the time of no PDL, within the run-to-run spread). A decode
# launch takes the decode rule first (early release); where it does not apply (past its limits) neither does this
# one unless B is as small. The H100's table has none (not measured there).
PDL_SMALL = os.environ.get("SYMMCOLL_PDL_SMALL", "1") == "1"


def small_pdl(M: int, N: int, K: int, itemsize: int, split: bool, occupancy: int, key: str | None) -> bool:
    """Whether the core's launch of (M, N, K) runs with PDL by the small-product rule on GPU model ``key`` (see
    PDL_SMALL): whole tiles, one program an SM, within the model's measured limits."""
    return _within(PDL_SMALL, split, occupancy, pdl_small_limits(key), M * N * K, N * K * itemsize)


def launch_pdl(M: int, N: int, K: int, itemsize: int, split: bool, occupancy: int, key: str | None) -> tuple:
    """(decode rule, small-product rule) of the core's launch of (M, N, K) on GPU model ``key``: the decode
    rule (early release) first; the small products' only where it does not apply -- never both."""
    early = decode_pdl(M, N, K, itemsize, split, occupancy, key)
    return early, not early and small_pdl(M, N, K, itemsize, split, occupancy, key)


def _within(switch: bool, split: bool, occupancy: int, limits: tuple[int, int] | None, size: int,
            b_bytes: int) -> bool:
    """A PDL rule's test: the switch on, whole tiles, one program an SM, ``size`` and ``b_bytes`` within the
    GPU model's measured ``limits`` (None: the model has none)."""
    return (switch and not split and occupancy == 1 and limits is not None and size <= limits[0]
            and b_bytes <= limits[1])


def takes_small_pdl(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the core's launch of (M, N, K) with the table's config for it runs with the small products' PDL
    (``small_pdl`` on the launch's own plan; all_gather_matmul's one-rank "auto" asks)."""
    config = gemm_config(M, N, K, dtype, device)
    return _core_shape(M, N, K, config, dtype.itemsize, None, device, PDL_DECODE, PAIR_REDUCE, PDL_SMALL)[7]


# One rank: a fused op is its GEMM (nothing to gather, reduce or hide), so its "auto" runs the GEMM core -- through
# the variant whose kernel is the core's there -- where the GPU's GEMM table measured it this much faster than
# cuBLAS at the very (M, N, K) of each B (``core_measured_faster``), else cuBLAS. all_gather_matmul on one H100
# (benchmarks/results/2026-11-27-grid-drift-h100/fused/, and call 1 of 2026-11-27-paired-qkv-h100) auto's
# gather_then_cublas ran 2.2-2.5% behind gather_then_gemm at 16384x8192x8192 and 16384x6656x16384 in both
# runs (the table: 0.983 / 0.987) and ahead of it at 16384x3584x8192 (1.008) and 4096x8192x8192 (not in it).
CORE_FASTER_BELOW = 0.99
# ...and only where cuBLAS took at least this long in the tune: a cell of a few us is a quick pass there, with
# B read from HBM, while the op's operands of such a size stay in L2 between calls. At 1024^3 the H200's tune
# read 0.965 and the fused bench gather_then_gemm 1.039 against gather_then_cublas 0.997 (5.8 against 5.6 us,
# benchmarks/results/2026-11-28-gemm-retune-h200/fused2/); the H100 1.011 against 1.004 (tenth stop). A launch
# that takes the small products' PDL (gemm.small_pdl: its start and prologue under the kernel before) is exempt:
# measured L2-warm as the fused ops call it (the tune's fused shapes), its ratio is the fused bench's -- at 1024^3
# on one H200 gather_then_gemm 0.963 against gather_then_cublas 1.009 (results/2026-11-28-pdl-small-h200/call2).
CORE_FROM_CUBLAS_US = 20.0


def core_measured_faster(M: int, N: int, K: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the table of ``device``'s GPU measured the core faster than cuBLAS at exactly (M, N, K) -- below
    CORE_FASTER_BELOW, on a cell cuBLAS took CORE_FROM_CUBLAS_US or more for or whose launch takes the small
    products' PDL (False where the table has no such cell, or on CPU): what a one-rank fused op's "auto" reads."""
    cell = measured_cell(M, N, K, device)
    return (cell is not None and cell[0] < CORE_FASTER_BELOW
            and ((cell[1] or 0.0) >= CORE_FROM_CUBLAS_US or takes_small_pdl(M, N, K, dtype, device)))


def launch_meta(core: "CoreLaunch", device: torch.device) -> dict:
    """``matmul_kernel``'s meta for ``core``: PDL with early release for a whole-tile decode launch within
    its GPU model's measured limits (``core.decode_pdl``), else the core's own (the SYMMCOLL_PDL switch's)."""
    if not core.decode_pdl:
        return core.meta
    decode = pdl_meta(device, True)
    return {**core.meta, **decode, "EARLY_RELEASE": True} if decode else core.meta


# The wave split's tiles of exactly two parts, where the two slots fit the registers (reduce_loads >= 2), summed
# by gemm_split.pair_reduce (1: one partial stored and loaded a tile) instead of split_reduce (every part's
# stored, all loaded by the last); on a GPU, where every part is resident at once (one round of parts), by
# gemm_split.exchange_halves (2: each part stores the half its partner finishes and finishes its own).
# SYMMCOLL_GEMM_PAIR_REDUCE=0 / 1 / 2 caps it (the same bits every way), ``pair_reduce_switched`` in a process.
PAIR_REDUCE = int(os.environ.get("SYMMCOLL_GEMM_PAIR_REDUCE", "2"))


def pairs(config: GemmConfig, plan, sum_apart: bool, switch: int) -> bool:
    """Whether ``plan``'s shared tiles (if any) are summed in pairs: the wave split in two parts, summed in the
    kernel, one-part tiles whose two slots fit the registers, ``switch`` (PAIR_REDUCE) >= 1."""
    return (switch >= 1 and plan.shared and not plan.stream and plan.sharing == 2 and not sum_apart
            and not config.block_n2 and reduce_loads(config.block_m, config.tile_n, config.num_warps) >= 2)


def pair_mode(config: GemmConfig, plan, shared_tiles: int, sum_apart: bool, switch: int, grid: int,
              device_type: str) -> int:
    """matmul_kernel's PAIR: 0 no pairs, 1 gemm_split.pair_reduce, 2 exchange_halves -- where ``switch`` allows
    it, every part is resident at once (one round: the ``shared_tiles`` tiles' 2 parts on at most ``grid``
    programs, each part its program's last item, so no part waits on one queued behind it) and runs at once
    (not the interpreter's one program at a time: ``device_type`` "cpu"), and C is stored by pointer or through
    a descriptor of half tiles (GemmConfig.c_halves)."""
    if not pairs(config, plan, sum_apart, switch):
        return 0
    halves = (switch >= 2 and 2 * shared_tiles <= grid and device_type != "cpu"
              and not (config.tma_store and config.c_halves == 1))
    return 2 if halves else 1


@contextlib.contextmanager
def pair_reduce_switched(mode: int):
    """PAIR_REDUCE set to ``mode`` (0, 1, 2) inside the block (launches made or captured there)."""
    global PAIR_REDUCE
    saved, PAIR_REDUCE = PAIR_REDUCE, int(mode)
    try:
        yield
    finally:
        PAIR_REDUCE = saved


@contextlib.contextmanager
def decode_pdl_switched(on: bool, small: bool | None = None):
    """PDL_DECODE set to ``on`` (and PDL_SMALL to ``small``, if given) inside the block (the precompile workers:
    a tiny launch on meta tensors compiles what the real cell on the GPU being timed launches,
    ``bench.gemm.compile_job``)."""
    global PDL_DECODE, PDL_SMALL
    saved = PDL_DECODE, PDL_SMALL
    PDL_DECODE, PDL_SMALL = on, PDL_SMALL if small is None else small
    try:
        yield
    finally:
        PDL_DECODE, PDL_SMALL = saved


@dataclass(frozen=True)
class CoreLaunch:
    """What ``matmul_kernel`` (``persistent_matmul``) is launched with for one product: the grid, the
    operands as the kernel reads them (host tensor descriptors with TMA, else the tensors), the split
    plan's counts and buffers, and the constexprs and launch options."""
    grid: int
    a: object
    b: object
    b2: object
    c: object
    M: int
    N: int
    K: int
    strides: tuple  # (A's, B's as read, C's) row strides
    whole_tiles: int
    sharing: int
    slots: int
    partials: torch.Tensor
    counters: torch.Tensor
    meta: dict
    sum_grid: tuple | None = None  # GemmConfig.sum_apart with shared tiles: split_sum_kernel's grid and meta
    sum_meta: dict | None = None
    decode_pdl: bool = False  # a plain matmul launch runs with PDL and early release (``decode_pdl``, launch_meta)

    @property
    def args(self) -> tuple:
        """``matmul_kernel``'s runtime arguments, in order."""
        return (self.a, self.b, self.b2, self.c, self.M, self.N, self.K, *self.strides, self.whole_tiles,
                self.sharing, self.slots, self.partials, self.counters)


# Elements of a tile split_sum_kernel's program sums (ROWS = this / block_n rows): 128 x 128 tiles in 8-row
# chunks, 16 a tile, so 10 shared tiles (128 x 1280) give 160 programs, each loading 4 KB per part.
SUM_ELEMENTS = 1024


def launch_split_sum(core: CoreLaunch, out: torch.Tensor) -> None:
    """GemmConfig.sum_apart: after ``core``'s launch, its shared tiles summed into ``out`` (nothing where
    the launch shares no tile or its config sums in the kernel)."""
    if core.sum_grid is not None:
        launch(split_sum_kernel, core.sum_grid, (core.partials, out, core.M, core.N, core.K, out.stride(0),
                                                 core.whole_tiles, core.sharing, core.slots), core.sum_meta)


@functools.lru_cache(maxsize=4096)
def _core_shape(M: int, N: int, K: int, config: GemmConfig, itemsize: int, programs: int | None,
                device: torch.device, pdl_decode_switch: bool, pair_switch: int = 2,
                pdl_small_switch: bool = True) -> tuple:
    """What core_launch derives from the shape alone (the fitted config, its split plan, the grid's tile
    units, the plan's constexprs, whether a plain matmul launch takes the decode PDL: ``decode_pdl`` under
    ``pdl_decode_switch``, PDL_DECODE's value, a key of the cache -- and whether the launch takes the small
    products' PDL, ``small_pdl`` under ``pdl_small_switch``; ``pair_switch``: PAIR_REDUCE's), once per
    shape: an eager call repeats none of it (issue 25's host work per call)."""
    config, tiles, plan, grid = planned(config, M, N, K, itemsize, programs or programs_for(config, device))
    sum_apart = config.sum_apart and plan.shared
    meta = dict(SPLIT=plan.shared, FLATTEN=config.flatten, STREAM=plan.stream,
                REDUCE_LOADS=reduce_loads(config.block_m, config.tile_n, config.num_warps) if plan.shared else 1,
                C_HALVES=config.c_halves, BN2=config.block_n2, SUM_APART=sum_apart,
                PAIR=pair_mode(config, plan, tiles - plan.whole_tiles, sum_apart, pair_switch, grid, device.type),
                **config.meta())
    summing = None  # (split_sum_kernel's grid, its constexprs) where the config sums its shared tiles apart
    if sum_apart:
        rows = min(config.block_m, max(1, SUM_ELEMENTS // config.block_n))
        summing = ((tiles - plan.whole_tiles, config.block_m // rows),
                   dict(BM=config.block_m, BN=config.block_n, BK=config.block_k, GROUP_M=config.group_m, ROWS=rows,
                        PARTS=plan.slots if plan.stream else plan.sharing, STREAM=plan.stream, num_warps=4))
    early, small = launch_pdl(M, N, K, itemsize, plan.shared, config.occupancy, device_facts(device)[0])
    return config, tiles, plan, grid, meta, summing, early, small


def planned(config: GemmConfig, M: int, N: int, K: int, itemsize: int, programs: int) -> tuple:
    """(the config fitted to shared memory, its tiles, its split plan, the grid) of (M, N, K) on at most
    ``programs`` programs: every program's whole tiles and parts, no program without work. (A ``gluon`` config
    runs its Triton twin here: GemmConfig.core_twin.)"""
    config = config.core_twin.fitted(itemsize)
    tiles = triton.cdiv(M, config.block_m) * triton.cdiv(N, config.tile_n)
    plan = split_plan(config, tiles, K, programs)
    units = (plan.sharing if plan.stream else (tiles - plan.whole_tiles) * plan.sharing) if plan.shared else 0
    grid = min(programs, max(units, plan.whole_tiles)) if plan.shared else min(tiles, programs)
    return config, tiles, plan, max(1, grid)


def launch_pair_mode(config: GemmConfig, M: int, N: int, K: int, itemsize: int, programs: int,
                     device_type: str = "cuda", switch: int | None = None) -> int:
    """The PAIR constexpr of the launch of (M, N, K) with ``config`` on ``programs`` programs (what
    ``_core_shape`` gives it; the precompile workers ask, bench.gemm.compile_job)."""
    config, tiles, plan, grid = planned(config, M, N, K, itemsize, programs)
    return pair_mode(config, plan, tiles - plan.whole_tiles, config.sum_apart and plan.shared,
                     PAIR_REDUCE if switch is None else switch, grid, device_type)


def core_launch(a: torch.Tensor, src: torch.Tensor, b_t: bool, out: torch.Tensor, config: GemmConfig,
                programs: int | None = None) -> CoreLaunch:
    """The GEMM core's launch of C [M, N] = A [M, K] @ B (``src`` and ``b_t`` from ``b_layout``; M, N, K
    > 0; A row-major): the config fitted to shared memory, its split plan over ``programs`` persistent
    programs (default ``programs_for``), descriptors where TMA may load (``use_tma``)."""
    (M, K), N = a.shape, out.shape[1]
    device_type = "meta" if a.device.type == "meta" else a.device.type
    config, tiles, plan, grid, shape_meta, summing, early, small = _core_shape(
        M, N, K, config, a.element_size(), programs, a.device, PDL_DECODE, PAIR_REDUCE, PDL_SMALL)
    if plan.shared:
        partials = torch.empty(((tiles - plan.whole_tiles) * plan.slots * config.block_m * config.tile_n,),
                               dtype=torch.float32, device=a.device)
        if summing:  # no counter is bumped: a captured launch takes no slice of the arena
            counters = partials  # (unused)
        elif a.device.type != "meta":
            counters = split_counters(a.device, tiles - plan.whole_tiles)
        else:
            counters = torch.empty(MAX_SPLIT_TILES, dtype=torch.int32, device="meta")
    else:
        partials, counters = out, out  # (unused)
    tma = use_tma(device_type, a, src, out)
    a_arg, b_arg = host_descriptors(config, a, src, b_t) if tma else (a, src)
    # a two-part tile's second part: B's descriptor with blocks block_n2 wide, or B's pointer again (None, a
    # compile-time constant, for one part: the kernel of a one-part tile has the parameters it had before)
    b2_arg = None if not config.block_n2 else b_descriptor(src, b_t, config.block_n2, config.block_k) if tma else src
    tma_store = tma and config.tma_store
    c_arg = c_descriptor(out, M, config) if tma_store else out
    pdl = pdl_meta(a.device, True if small else None)
    return CoreLaunch(grid, a_arg, b_arg, b2_arg, c_arg, M, N, K, (a.stride(0), src.stride(0), out.stride(0)),
                      plan.whole_tiles, plan.sharing, plan.slots, partials, counters,
                      dict(B_T=b_t, TMA=tma, HOST_DESC=tma, TMA_STORE=tma_store, PRECISION=precision(a.dtype),
                           **shape_meta, **pdl), *((summing[0], {**summing[1], **pdl}) if summing else (None, None)),
                      early)


def compile_cases(make_workspace):
    """The plain GEMM's launches on meta tensors: large-M TMA, swapped decode tiles with the wave split
    and with stream-K, B given transposed, mid-M stream-K (the last wave shared, and the last full wave
    with it; two programs per SM) and the wave split, C stored in halves through TMA (whole and split
    tiles), the deep pipelines of the narrow-N cells, two-part tiles (B and W^T; whole and wave-split), split tiles
    summed apart (the wave split and stream-K) and in pairs (two parts), the small
    products' one-wave and two-per-SM tiles, odd K and N by pointer loads, fp16 and fp32."""
    def case(m, n, k, dtype, config=None, b_t=False):
        def thunk():
            a = torch.empty((m, k), dtype=dtype, device="meta")
            b = torch.empty((n, k), dtype=dtype, device="meta").t() if b_t else torch.empty((k, n), dtype=dtype,
                                                                                            device="meta")
            matmul(a, b, config=config, programs=132 * (config.occupancy if config else 1))
        label = config.label if config else "auto"
        return f"gemm {m}x{n}x{k} {dtype} {label}{' B^T' if b_t else ''}", thunk
    return [case(8192, 8192, 8192, torch.bfloat16),
            case(16, 1280, 8192, torch.bfloat16),
            case(16, 1280, 8192, torch.bfloat16, GemmConfig(16, 64, 128, 1, 6, True, 4, 5)),
            case(16, 1280, 8192, torch.bfloat16, GemmConfig(16, 64, 128, 1, 4, True, 4, 6, stream_k=True)),
            case(64, 8192, 8192, torch.bfloat16, GemmConfig(64, 128, 64, 8, 1, False, 4, 4), b_t=True),
            case(8, 4096, 7168, torch.float16, GemmConfig(16, 64, 128, 1, 2, True, 4, 5), b_t=True),
            case(8192, 8192, 8192, torch.bfloat16, GemmConfig(128, 256, 64, 8, 1, False, 8, 3, 1, True, True)),
            case(8192, 8192, 1024, torch.bfloat16, GemmConfig(128, 256, 64, 16, 1, False, 8, 3, 1, True, True)),
            case(2048, 2560, 8192, torch.bfloat16, GemmConfig(128, 256, 64, 8, 4, False, 8, 3, 1, True, True)),
            case(1024, 2560, 8192, torch.bfloat16, GemmConfig(128, 128, 64, 8, 4, False, 8, 6, stream_k=True)),
            case(2048, 1280, 8192, torch.bfloat16, GemmConfig(128, 256, 64, 8, 4, False, 8, 4)),
            case(2048, 1280, 8192, torch.bfloat16, GemmConfig(128, 128, 64, 8, 8, False, 8, 4, 1, True, True,
                                                              stream_k=True)),
            case(2048, 1280, 8192, torch.bfloat16, GemmConfig(128, 256, 64, 8, 16, False, 8, 3)),
            case(256, 5120, 8192, torch.bfloat16, GemmConfig(256, 128, 64, 8, 16, False, 8, 3, stream_k=True)),
            case(512, 5120, 8192, torch.bfloat16, GemmConfig(128, 128, 64, 8, 16, False, 8, 4, split_wave=True,
                                                             stream_k=True), b_t=True),
            case(256, 2304, 16384, torch.bfloat16, GemmConfig(128, 128, 64, 8, 4, False, 8, 4)),
            case(256, 2560, 8192, torch.bfloat16, GemmConfig(64, 128, 64, 8, 4, False, 4, 4, occupancy=2,
                                                             stream_k=True)),
            # two-part tiles (block_n2): one wave of 128 tiles at 512x2560 on 132 SMs, B and W^T
            case(512, 2560, 8192, torch.bfloat16, GemmConfig(64, 128, 64, 8, 1, False, 4, 4, block_n2=32)),
            case(512, 2560, 8192, torch.bfloat16, GemmConfig(128, 64, 64, 8, 1, False, 8, 4, block_n2=16), b_t=True),
            # two-part tiles wave-split: 32 tiles x 4 parts = 128 units on 132 SMs (256x2560, 128x1280)
            case(256, 2560, 8192, torch.bfloat16, GemmConfig(128, 128, 64, 8, 4, False, 8, 5, block_n2=32)),
            case(128, 1280, 8192, torch.bfloat16, GemmConfig(64, 64, 64, 8, 4, False, 4, 6, block_n2=16), b_t=True),
            # the wave split summed apart (GemmConfig.sum_apart): 10 tiles of 128 x 128 in 13 parts, then the sum kernel
            case(128, 1280, 8192, torch.bfloat16, GemmConfig(128, 128, 64, 8, 16, False, 8, 5, sum_apart=True)),
            # ... and stream-K summed apart: 28 tiles of 128 x 256 shared by 132 ranges (2048 x 2560)
            case(2048, 2560, 8192, torch.bfloat16, GemmConfig(128, 256, 64, 8, 16, False, 8, 3, stream_k=True,
                                                              sum_apart=True)),
            # two parts a tile exchanging halves (gemm_split.exchange_halves): 64 tiles of 128 x 128 in 2 parts on
            # 132 SMs (dsv3-expert gate_up M = 256; tests/test_compile.py compiles pair_reduce's too)
            case(256, 4096, 7168, torch.bfloat16, GemmConfig(128, 128, 64, 8, 2, False, 8, 6)),
            # small products (gemm_candidates.small_candidates): one wave of 128 x 64 tiles, two warpgroups,
            # eight stages at 1024^3; two flattened programs per SM at 2048 x 1024 x 1024
            case(1024, 1024, 1024, torch.bfloat16, GemmConfig(128, 64, 64, 8, 1, False, 8, 8)),
            case(2048, 1024, 1024, torch.bfloat16, GemmConfig(64, 64, 128, 8, 1, False, 4, 3, occupancy=2,
                                                              flatten=True)),
            case(1000, 3584, 4096, torch.float16),
            case(33, 100, 72, torch.bfloat16),
            case(300, 512, 1000, torch.float32)]
