"""A one-program barrier kernel over a workspace's group, in stream order: what host code places
between copy-engine copies (graph-safe, bounded, carrying the call descriptor like every barrier)."""

import triton
import triton.language as tl

from .signals import announce, block_barrier


@triton.jit
def barrier_kernel(
    # workspace: signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call's descriptor
    desc,
    WORLD: tl.constexpr,
):
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)
