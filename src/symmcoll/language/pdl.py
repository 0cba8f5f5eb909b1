"""Programmatic dependent launch (PDL, sm_90+): a kernel launched with Triton's ``launch_pdl=True``
option (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) may start while the kernel before it on
the stream is still running -- as soon as every program of that kernel has executed
``griddepcontrol.launch_dependents`` or exited -- so its launch and prologue overlap the previous
kernel's tail instead of following it (cuBLAS's nvjet kernels do this; the gap it saves is the few
microseconds between two kernels of a decode step).

The two halves, each a no-op unless the kernel's ``PDL`` constexpr is set:

* ``wait_prior_grid``: ``griddepcontrol.wait``. The PTX ISA: "causes the executing thread to wait
  until all prerequisite grids in flight have completed and all the memory operations from the
  prerequisite grids are performed and made visible to the current grid". A PDL-launched kernel calls
  it in every program, unconditionally, before its first global-memory access of any kind: loads of
  inputs, signal pads, counters and epochs, and stores too -- an output may be memory the caching
  allocator handed back after the previous kernel was enqueued, that it still reads -- and before a
  device-side tensor descriptor is built (it is written to global scratch). Only index math and
  kernel parameters come before it. Nothing a peer rank can observe happens before it, so a
  multi-rank protocol sees the same order as without PDL.
* ``release_dependents``: ``griddepcontrol.launch_dependents``, a hint that the next kernel (if it
  was launched with PDL) may be scheduled once every program of this one has issued it. Safe anywhere
  after ``wait_prior_grid``: a dependent's own ``griddepcontrol.wait`` still waits for this kernel's
  full completion and memory flush (the sentence above, from the dependent's side), and the dependent
  can start only once every program of this kernel is resident (each has issued it), so its programs
  never hold an SM a program of ours still needs. Kernels issue it after their main loop, so the
  dependent's launch overlaps their epilogue (a peer's spin in a multi-rank kernel included: our
  programs are already resident, and spin with a bounded budget).

Not launched with PDL, ``griddepcontrol.wait`` returns at once and ``launch_dependents`` does nothing
(Triton's gdc_wait / gdc_launch_dependents docstrings). Under the interpreter kernels run one after
another, so both are no-ops: their ``tl.*`` twin is nothing at all (inline asm does not run there).
The host side -- the SYMMCOLL_PDL switch and the launch option -- is ``launcher.pdl_meta``.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .blocks import INTERPRETED


@triton.jit
def wait_prior_grid(PDL: tl.constexpr):
    """With PDL: wait until the previous kernel on the stream has completed and its memory is visible.
    Call first thing in every program, before any global load or store."""
    if PDL:
        if INTERPRETED:  # kernels run one after another: nothing to wait for
            pass
        else:
            gdc_wait()


@triton.jit
def release_dependents(PDL: tl.constexpr):
    """With PDL: let the next PDL-launched kernel start (it still waits for our completion before it
    touches memory). Call after ``wait_prior_grid``, once the main loop's loads are issued."""
    if PDL:
        if INTERPRETED:
            pass
        else:
            gdc_launch_dependents()
