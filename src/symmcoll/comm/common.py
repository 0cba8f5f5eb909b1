"""Host-side helpers the protocol modules share (no algorithm lives here): pieces, word views and the
launch configs of data movement."""

from __future__ import annotations

import contextlib

import torch

from ..launcher import Prepared, launch
from ..plan import CPU_CONFIG, WORD_DTYPES, LaunchConfig, Plan, Request


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` for host code: triton's is a ConstexprFunction, whose call unwraps its arguments in
    five more Python calls, and the collectives' host paths call it on every launch."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` for host code (n >= 1), without the ConstexprFunction's calls."""
    return 1 << (n - 1).bit_length()


def chunks(numel: int, capacity: int):
    """(start, length) pieces of at most ``capacity`` elements covering ``numel``."""
    if capacity <= 0:
        raise ValueError("workspace too small for a single element")
    for start in range(0, numel, capacity):
        yield start, min(capacity, numel - start)


def as_words(t: torch.Tensor) -> torch.Tensor:
    """Contiguous ``t`` flattened and viewed as integer words of the same itemsize (shares storage):
    a data-movement kernel moves any dtype of that itemsize bit-exactly."""
    return t.reshape(-1).view(WORD_DTYPES[t.element_size()])


# GPU launch configs for data movement, by word size: about 16 KiB per block step whatever the word;
# above a few MB, 32 KiB per step and a program per SM keep more NVLink traffic in flight (the trend of
# the all-reduce config sweep).
GPU_MOVE_CONFIGS = {
    1: LaunchConfig(block=16384, max_programs=64, num_warps=16),
    2: LaunchConfig(block=8192, max_programs=64, num_warps=16),
    4: LaunchConfig(block=4096, max_programs=64, num_warps=16),
    8: LaunchConfig(block=2048, max_programs=64, num_warps=16),
}
GPU_MOVE_LARGE_BYTES = 4 << 20
GPU_MOVE_LARGE_BYTES_PER_STEP = 32 << 10


def move_config(itemsize: int, nbytes: int, device_type: str = "cuda") -> LaunchConfig:
    """The launch config for moving words of ``itemsize``; ``nbytes`` must be the same on every rank
    (every rank must launch the same grid and blocks: program p waits on program p of its peers)."""
    if device_type == "cpu":
        return CPU_CONFIG
    if nbytes > GPU_MOVE_LARGE_BYTES:
        return LaunchConfig(GPU_MOVE_LARGE_BYTES_PER_STEP // itemsize, 132, 16)
    return GPU_MOVE_CONFIGS[itemsize]


def move_configs(request: Request, world: int) -> LaunchConfig:
    """``Algorithm.gpu_configs`` of the data-movement algorithms."""
    return move_config(request.dtype.itemsize, request.nbytes)


def config(plan: Plan) -> LaunchConfig:
    return plan.config or CPU_CONFIG


def meta(plan: Plan, **constexprs) -> dict:
    """The constexprs and launch options every kernel of a plan takes."""
    return dict(WORLD=plan.world, num_warps=config(plan).num_warps, **constexprs)


def launch_once(plan: Plan, kernel, grid: tuple, prefix: tuple, x_view, out_view, suffix: tuple, meta: dict,
                whole: bool) -> None:
    """Launch ``kernel`` over ``(*prefix, x_view, out_view, *suffix)``. When the launch is the whole
    call (one piece, the views start at the call's input and output), on GPU it is kept prepared as
    ``plan.fast``: later calls of the plan pass only the input's and output's addresses."""
    if whole and plan.fast is None and plan.ws.device.type == "cuda":
        prepared = Prepared(kernel, grid, prefix, suffix, meta)
        prepared(x_view, out_view)
        if prepared.compiled is not None:
            plan.fast = prepared
        return
    launch(kernel, grid, (*prefix, x_view, out_view, *suffix), meta)


def side_stream(plan: Plan, device: torch.device):
    """The plan's side stream, where copy-engine pulls run beside the main stream's staging (all_to_all's and
    all_gather's copy engines; None on CPU: everything runs in order)."""
    if device.type != "cuda":
        return None
    stream = plan.cache.get("side_stream")
    if stream is None:
        stream = plan.cache["side_stream"] = torch.cuda.Stream(device)
    return stream


def on_side(side, main):
    """Context: the side stream, after everything ``main`` has so far (a null context where ``side`` is None:
    on CPU everything runs in order on the current stream)."""
    if side is None:
        return contextlib.nullcontext()
    side.wait_stream(main)
    return torch.cuda.stream(side)


def byte_part(length: int, p: int, parts: int) -> tuple[int, int]:
    """(start, bytes) of part p of a chunk of ``length`` bytes cut in ``parts`` (16-byte multiples)."""
    per_part = -(-length // parts)
    cut = -(-per_part // 16) * 16
    start = min(p * cut, length)
    return start, min(cut, length - start)
