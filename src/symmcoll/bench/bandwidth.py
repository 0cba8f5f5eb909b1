"""What the memory system gives in this run: the rate an SM copy kernel and an SM read kernel reach
over 1 GiB (CUDA-graph replays), the references for memory-bound kernels ("% of copy") and for
decode GEMMs (the weight-read rate beside the read rate; ``read_same_bytes_tbs``: the read kernel
over a decode cell's own weights, one launch a read, as the GEMM reads them). A graph-captured ``copy_`` reached only
2.7 TB/s on an H200 where SM kernels reach ~4.3: its figure is reported too, not used as reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..launcher import launch
from .timing import graph_us

BLOCK = 8192


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """dst <- src, persistent over BLOCK-element pieces (16-byte accesses)."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def read_kernel(src_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    """Each program sums its pieces of src (fp32) into sums[pid]: every byte read once, nothing else."""
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(sums_ptr + tl.program_id(0), tl.sum(acc, 0))


def copy(src: torch.Tensor, dst: torch.Tensor, grid: tuple) -> None:
    launch(copy_kernel, grid, (src, dst, src.numel()), dict(BLOCK=BLOCK, num_warps=8))


def read(src: torch.Tensor, sums: torch.Tensor, grid: tuple, block: int = BLOCK) -> None:
    launch(read_kernel, grid, (src, sums, src.numel()), dict(BLOCK=block, num_warps=8))


@dataclass(frozen=True)
class Bandwidth:
    copy_tbs: float        # SM copy kernel, (bytes read + bytes written) / time
    read_tbs: float        # SM read kernel, bytes read / time
    torch_copy_tbs: float  # graph-captured Tensor.copy_, (read + written) / time
    nbytes: int

    def as_dict(self) -> dict:
        return dict(copy_tbs=self.copy_tbs, read_tbs=self.read_tbs, torch_copy_tbs=self.torch_copy_tbs,
                    nbytes=self.nbytes)


def measure(device: torch.device, nbytes: int = 1 << 30, replays: int = 20) -> Bandwidth:
    """The three rates over ``nbytes`` of bf16 on ``device`` (median of graph replays)."""
    n = nbytes // 2
    src = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    sums = torch.empty(sms * 4, device=device, dtype=torch.float32)
    grid = (sms * 4,)

    def median(samples):
        return sorted(samples)[len(samples) // 2]

    copy_us = median(graph_us([lambda: copy(src, dst, grid)], replays, min_graph_us=0))
    if not torch.equal(dst, src):
        raise RuntimeError("bandwidth reference: the copy kernel's output differs from its input")
    read_us = median(graph_us([lambda: read(src, sums, grid)], replays, min_graph_us=0))
    torch_us = median(graph_us([lambda: dst.copy_(src)], replays, min_graph_us=0))
    return Bandwidth(2 * nbytes / copy_us / 1e6, nbytes / read_us / 1e6, 2 * nbytes / torch_us / 1e6, nbytes)


# (programs per SM, elements a program loads per step) of the read kernel over a decode cell's weights: the
# 1 GiB reference's (4, BLOCK) kept ~64 KB in flight per SM and read 3.94 TB/s on an H200 where the GEMM core's
# TMA loads stream 448 MB at 4.43; the others keep 2x / 4x as much in flight.
READ_VARIANTS = ((4, BLOCK), (8, BLOCK), (8, 2 * BLOCK))


def read_same_bytes_tbs(sources: list[torch.Tensor], replays: int = 20) -> tuple[float, dict]:
    """The SM read kernel over each of ``sources`` in turn (a decode cell's weight sets: B's bytes, rotating
    as the GEMMs read them), captured into one graph: bytes of one source / median time per read, in TB/s --
    what a kernel that does nothing but stream those bytes reaches in one launch each, its start and its
    last wave's tail included (the 1 GiB figures above leave both out). The best of READ_VARIANTS, and each
    one's rate by "<programs per SM>x<block>"."""
    device = sources[0].device
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    flat = [source.reshape(-1) for source in sources]  # (contiguous weights: views)
    nbytes = flat[0].numel() * flat[0].element_size()
    rates = {}
    for per_sm, block in READ_VARIANTS:
        sums = torch.empty(sms * per_sm, device=device, dtype=torch.float32)
        grid = (sms * per_sm,)
        samples = graph_us([lambda src=src: read(src, sums, grid, block) for src in flat], replays)
        rates[f"{per_sm}x{block}"] = nbytes / sorted(samples)[len(samples) // 2] / 1e6
    return max(rates.values()), rates


def compile_cases(make_workspace):
    """The reference kernels' launches on meta tensors (the read kernel also at the decode cells' widest step)."""
    src = lambda: torch.empty(1 << 20, dtype=torch.bfloat16, device="meta")
    sums = lambda: torch.empty(528, dtype=torch.float32, device="meta")
    return [("bandwidth copy", lambda: copy(src(), src(), (528,))),
            ("bandwidth read", lambda: read(src(), sums(), (528,))),
            ("bandwidth read, the decode cells' widest step",
             lambda: read(src(), sums(), (528,), 2 * BLOCK))]
