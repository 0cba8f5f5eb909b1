"""How a call starts and the one-program barrier kernel: ``open_call``, the prologue of kernels that
stride items over their programs and talk to peers; ``barrier_kernel``, a barrier over a workspace's
group in stream order: what host code places between copy-engine copies (graph-safe, bounded, carrying
the call descriptor like every barrier)."""

import triton
import triton.language as tl

from .signals import announce, block_barrier


@triton.jit
def open_call(signal_pad_ptrs_dev, desc, rank, WORLD: tl.constexpr):
    """(this program's id, the number of programs), for taking items pid, pid + nprog, ...; program 0
    also announces the call (``desc``) to every peer, so a peer that times out can name it."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    return pid, nprog


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
