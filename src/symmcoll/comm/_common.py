"""What every collective's host wrapper and kernel share: launch configs, input checks, reductions."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import compile_check
from ..language import block_barrier
from ..memory import MAX_PROGRAMS, Workspace, get_workspace

REDUCTION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Reduction ops as kernel constexprs.
OP_SUM, OP_AVG, OP_MAX, OP_MIN = 0, 1, 2, 3
REDUCE_OPS = {"sum": OP_SUM, "avg": OP_AVG, "max": OP_MAX, "min": OP_MIN}


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel is launched: elements per block step, the most programs, warps per program."""

    block: int
    max_programs: int
    num_warps: int

    def __post_init__(self):
        if self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two, got {self.block}")
        if not 1 <= self.max_programs <= MAX_PROGRAMS:
            raise ValueError(f"max_programs must be in [1, {MAX_PROGRAMS}], got {self.max_programs}")

    def grid(self, work_items: int) -> tuple[int]:
        """Programs for ``work_items`` blocks of work (at least one, at most ``max_programs``)."""
        return (max(1, min(self.max_programs, work_items)),)


@dataclass(frozen=True)
class SizedConfigs:
    """Launch configs by message size: ``(max_bytes, config)`` ascending; the last one holds beyond.
    Chosen from measurements (benchmarks/sweep_configs.py on the GPU machine)."""

    table: tuple[tuple[int, LaunchConfig], ...]
    # Tables for particular world sizes, where the best config differs: ((world, table), ...).
    per_world: tuple[tuple[int, tuple[tuple[int, LaunchConfig], ...]], ...] = ()

    def pick(self, nbytes: int, world: int | None = None) -> LaunchConfig:
        table = dict(self.per_world).get(world, self.table)
        for max_bytes, config in table:
            if nbytes <= max_bytes:
                return config
        return table[-1][1]

    @property
    def largest(self) -> LaunchConfig:
        return self.table[-1][1]


# On CPU every program instance costs ~0.7 ms of interpreter overhead: few programs, big blocks.
CPU_CONFIG = LaunchConfig(block=16384, max_programs=4, num_warps=4)


def reduce_op_code(op: str) -> int:
    try:
        return REDUCE_OPS[op]
    except KeyError:
        raise ValueError(f"op must be one of {sorted(REDUCE_OPS)}, got {op!r}") from None


def check_tensor(x, name: str, ws_device_type: str | None = None) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_contiguous():
        raise ValueError(f"{name} must be contiguous (got strides {tuple(x.stride())})")
    if ws_device_type is not None and x.device.type != ws_device_type:
        raise ValueError(f"{name} is on {x.device}, expected a {ws_device_type} tensor")


def check_reduction_dtype(x: torch.Tensor, name: str) -> None:
    if x.dtype not in REDUCTION_DTYPES:
        raise ValueError(f"{name}.dtype {x.dtype} is not supported for reductions "
                         f"(supported: bf16, fp16, fp32)")


def resolve_config(x: torch.Tensor, ws: Workspace, config: LaunchConfig | None,
                   gpu_configs: SizedConfigs) -> LaunchConfig:
    """``config`` if given, else CPU_CONFIG on CPU, else ``gpu_configs``' pick for x's size and the
    workspace's world size."""
    if config is not None:
        return config
    if x.device.type == "cpu":
        return CPU_CONFIG
    return gpu_configs.pick(x.numel() * x.element_size(), ws.world_size)


def prepare_reduction(x: torch.Tensor, group, op: str, config: LaunchConfig | None,
                      gpu_configs: SizedConfigs):
    """Validate a reduction's input, get the workspace, resolve the launch config (by size)."""
    check_tensor(x, "x")
    check_reduction_dtype(x, "x")
    code = reduce_op_code(op)
    ws = get_workspace(group, x.device)
    check_tensor(x, "x", ws.device.type)
    cfg = resolve_config(x, ws, config, gpu_configs)
    return ws, code, cfg


def finish(ws: Workspace) -> None:
    """After launching: on CPU the kernel already ran, so a timeout is reported right here.
    On GPU it is reported by the next call on this workspace or by ``symmcoll.check()``."""
    if ws.device.type == "cpu":
        ws.check()


def chunks(numel: int, capacity: int):
    """(start, length) pieces of at most ``capacity`` elements covering ``numel``."""
    if capacity <= 0:
        raise ValueError("workspace too small for a single element")
    for start in range(0, numel, capacity):
        yield start, min(capacity, numel - start)


@triton.jit
def combine(acc, value, OP: tl.constexpr):
    """Fold ``value`` (fp32) into ``acc`` (fp32) for sum/avg/max/min."""
    if OP == 2:
        return tl.maximum(acc, value)
    elif OP == 3:
        return tl.minimum(acc, value)
    else:
        return acc + value


@triton.jit
def finalize(acc, OP: tl.constexpr, WORLD: tl.constexpr):
    if OP == 1:
        return acc / WORLD
    else:
        return acc


# --- data movement: kernels move words, not values -------------------------------------------------

# Integer word of each itemsize. A data-movement kernel sees any dtype of that itemsize (fp8, bool, ints,
# bf16, complex64, ...) as these words, so one kernel per word size moves every dtype bit-exactly.
WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# GPU launch configs for data movement, by word size: about 16 KiB per block step whatever the word.
GPU_MOVE_CONFIGS = {
    1: LaunchConfig(block=16384, max_programs=64, num_warps=16),
    2: LaunchConfig(block=8192, max_programs=64, num_warps=16),
    4: LaunchConfig(block=4096, max_programs=64, num_warps=16),
    8: LaunchConfig(block=2048, max_programs=64, num_warps=16),
}

logger = logging.getLogger("symmcoll")


def as_words(t: torch.Tensor) -> torch.Tensor | None:
    """Contiguous ``t`` flattened and viewed as integer words of the same itemsize (shares storage);
    None when no word type fits (e.g. complex128), so the caller falls back to the process group."""
    word = WORD_DTYPES.get(t.element_size())
    if word is None:
        return None
    try:
        return t.reshape(-1).view(word)
    except (RuntimeError, TypeError):
        return None


# Above a few MB: 32 KiB per block step and a program per SM keep more NVLink traffic in flight
# (the trend of the all-reduce config sweep).
GPU_MOVE_LARGE_BYTES_PER_STEP = 32 << 10
GPU_MOVE_LARGE = LaunchConfig(block=8192, max_programs=132, num_warps=16)  # block set per word size


def move_config(words: torch.Tensor, nbytes: int) -> LaunchConfig:
    """The launch config for moving ``words``; ``nbytes`` must be the same on every rank (every rank
    must launch the same grid and blocks: program p waits on program p of its peers)."""
    if words.device.type == "cpu":
        return CPU_CONFIG
    if nbytes > 4 << 20:
        return LaunchConfig(GPU_MOVE_LARGE_BYTES_PER_STEP // words.element_size(),
                            GPU_MOVE_LARGE.max_programs, GPU_MOVE_LARGE.num_warps)
    return GPU_MOVE_CONFIGS[words.element_size()]


def check_device(x: torch.Tensor, name: str) -> None:
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} is on {x.device}: symmcoll runs on cuda tensors "
                         f"(and on cpu tensors under TRITON_INTERPRET=1)")


def group_size(group) -> int:
    """World size of ``group`` (default: the world group), for validation before any workspace."""
    import torch.distributed as dist
    if group is None and not dist.is_initialized():
        raise RuntimeError("symmcoll: torch.distributed is not initialized (use symmcoll.launch or "
                           "torch.distributed.init_process_group first)")
    return dist.get_world_size(group)


@triton.jit
def move_block(src, dst, offs, mask):
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def copy_blocks(src, dst, n, BLOCK: tl.constexpr):
    """Copy ``n`` elements src -> dst; this program takes blocks pid, pid + P, ... (P programs).
    Whole blocks go unmasked (16-byte vector accesses where aligned); only the tail is masked."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    lane = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n, step):
        offs = start + lane
        if start + BLOCK <= n:
            move_block(src, dst, offs, tl.full([BLOCK], 1, tl.int1))
        else:
            move_block(src, dst, offs, offs < n)


@triton.jit
def _tee(src, dst_a, dst_b, offs, mask):
    v = tl.load(src + offs, mask=mask)
    tl.store(dst_a + offs, v, mask=mask)
    tl.store(dst_b + offs, v, mask=mask)


@triton.jit
def tee_blocks(src, dst_a, dst_b, n, BLOCK: tl.constexpr):
    """Copy ``n`` elements src -> dst_a and src -> dst_b in one pass; blocks split as copy_blocks."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    lane = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n, step):
        offs = start + lane
        if start + BLOCK <= n:
            _tee(src, dst_a, dst_b, offs, tl.full([BLOCK], 1, tl.int1))
        else:
            _tee(src, dst_a, dst_b, offs, offs < n)


@triton.jit
def _barrier_kernel(signal_pad_ptrs_dev, status_ptr, max_spins, rank, op_code, WORLD: tl.constexpr):
    block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code, WORLD)


def barrier(ws: Workspace, op_code: int) -> None:
    """A one-program barrier over the workspace's group, in stream order (graph-safe)."""
    _barrier_kernel[(1,)](ws.signal_pad_ptrs_dev, ws.status_ptr, ws.max_spins, ws.rank, op_code,
                          WORLD=ws.world_size, num_warps=1)


compile_check.register(
    _barrier_kernel, {"signal_pad_ptrs_dev": "i64", "status_ptr": "i64", "max_spins": "i32", "rank": "i32",
                      "op_code": "i32"}, {"WORLD": 4}, num_warps=1, label="")
