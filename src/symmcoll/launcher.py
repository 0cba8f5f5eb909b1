"""The one way symmcoll launches a Triton kernel: ``launch(kernel, grid, args, meta)``.

* CPU (``TRITON_INTERPRET=1``): the interpreter runs ``kernel[grid](*args, **meta)``.
* GPU: the first launch of a (kernel, meta, argument specialisation) goes through Triton's JIT, which
  compiles and returns the compiled kernel; later launches call its launcher directly with the current
  stream, skipping Triton's per-call binding and cache lookup (the bulk of its host overhead). The key
  mirrors Triton's own specialisation: per pointer argument whether it is 16-byte aligned, per integer
  argument whether it is 1 or a multiple of 16 and whether it needs 64 bits.
* Recording (``recording()``): nothing runs; every launch is appended to a list, with its arguments.
  The compile checks (tests/test_compile.py) build each algorithm's launches this way, on meta
  tensors, and compile exactly what the library launches.
* Warming (``warming()``): nothing runs; every launch is compiled into Triton's cache as the same
  launch would be (``JITFunction.warmup``), so a later real launch loads it. The GEMM tuner's
  compile workers use it on meta tensors: no kernel of theirs runs on the GPU being timed.
* Programmatic dependent launch (``SYMMCOLL_PDL=1``, read once at import; default off): the decode
  path's kernels -- the GEMM core's ``matmul_kernel``, ``matmul_all_reduce_kernel`` and
  ``rms_norm_one_shot_kernel`` -- take ``pdl_meta(device)`` in their meta: their ``PDL`` constexpr
  (language/pdl.py: ``griddepcontrol.wait`` before any global access, ``launch_dependents`` after the
  main loop) and Triton's ``launch_pdl`` option, which the compiled kernel keeps in its metadata, so
  the fast path's ``compiled.run`` and CUDA-graph capture (the launch attribute becomes a
  programmatic edge of the graph) launch it with PDL too. GPUs below sm_90 never get it; the
  interpreter runs the kernels with ``PDL`` set (a no-op there) and ignores ``launch_pdl``. The plain
  GEMM's whole-tile decode launches take it whatever the switch (fused/gemm.py ``launch_meta``,
  ``SYMMCOLL_PDL_DECODE``).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import threading
import time
from dataclasses import dataclass

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor
from triton.tools.tensor_descriptor import TensorDescriptor

from .language import INTERPRETED


@dataclass(frozen=True)
class Recorded:
    kernel: object
    grid: tuple
    args: tuple
    meta: dict


_RECORDING: list | None = None
_WARMING = False
_COMPILED: dict = {}
# SYMMCOLL_FAST_LAUNCH=0 sends every launch through Triton's JIT (for comparing the two paths).
FAST = os.environ.get("SYMMCOLL_FAST_LAUNCH", "1") != "0"
# SYMMCOLL_PDL=1 launches the decode path's kernels with programmatic dependent launch (``pdl_meta``).
PDL = os.environ.get("SYMMCOLL_PDL", "0") == "1"
# Launches per kernel name in this process (tests use it to prove that chunked paths ran).
LAUNCH_COUNTS: collections.Counter = collections.Counter()


_PDL_META = {"PDL": True, "launch_pdl": True}
_NO_PDL_META: dict = {}
_PDL_CAPABLE: dict = {}


def pdl_meta(device: torch.device, on: bool | None = None) -> dict:
    """The meta entries that launch a PDL-aware kernel with programmatic dependent launch: ``PDL`` (the
    kernel's constexpr) and ``launch_pdl`` (Triton's launch option), where ``PDL`` is on (``on``, default
    the SYMMCOLL_PDL switch) and the device has it (sm_90+; meta tensors stand for the sm_90 compile
    checks; CPU runs the no-op twin). Empty otherwise: the kernels' defaults (off). Do not mutate the
    returned dict."""
    if not (PDL if on is None else on):
        return _NO_PDL_META
    if device.type != "cuda" or not torch.cuda.is_available():  # (no GPU: recording for the sm_90 checks)
        return _PDL_META
    index = device.index if device.index is not None else torch.cuda.current_device()
    capable = _PDL_CAPABLE.get(index)
    if capable is None:
        capable = _PDL_CAPABLE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _PDL_META if capable else _NO_PDL_META


@contextlib.contextmanager
def recording():
    """Collect the launches made inside the block instead of running them."""
    global _RECORDING
    saved, _RECORDING = _RECORDING, []
    try:
        yield _RECORDING
    finally:
        _RECORDING = saved


@contextlib.contextmanager
def warming():
    """Compile the launches made inside the block (into Triton's cache) instead of running them."""
    global _WARMING
    saved, _WARMING = _WARMING, True
    try:
        yield
    finally:
        _WARMING = saved


def _spec(arg) -> object:
    if type(arg) is int:  # the most frequent argument: decided before the isinstance chain (host time per launch)
        return (arg == 1, arg % 16 == 0, -(2 ** 31) <= arg < 2 ** 31)
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, TensorDescriptor):  # a host-made TMA descriptor: its type is its dtype and block
        return ("desc", arg.base.dtype, tuple(arg.block_shape))
    if isinstance(arg, GluonTensorDescriptor):  # ... and a Gluon kernel's, whose type holds its layout too
        return ("gluon desc", arg.base.dtype, tuple(arg.block_shape), arg.layout)
    if isinstance(arg, bool) or not isinstance(arg, int):
        return type(arg)
    return (arg == 1, arg % 16 == 0, -(2 ** 31) <= arg < 2 ** 31)


def launch(kernel, grid: tuple, args: tuple, meta: dict) -> None:
    """Launch ``kernel`` over ``grid`` with positional ``args`` and constexpr/option ``meta``."""
    if _RECORDING is not None:
        _RECORDING.append(Recorded(kernel, tuple(grid), tuple(args), dict(meta)))
        return
    if _WARMING:
        kernel.warmup(*args, grid=grid, **meta)
        return
    LAUNCH_COUNTS[kernel.__name__] += 1
    if INTERPRETED:
        with _deadline(kernel, args):
            kernel[grid](*args, **meta)
        return
    if not FAST:
        kernel[grid](*args, **meta)
        return
    key = (kernel, tuple(sorted(meta.items())), tuple(_spec(a) for a in args))
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = kernel[grid](*args, **meta)
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        _COMPILED[key] = compiled
        return
    # Positional constexprs follow the runtime arguments in the kernel's signature: the launcher
    # takes every parameter in order (and ignores the constexpr ones).
    values = list(args) + [meta[p.name] if p.name in meta else p.default for p in kernel.params[len(args):]]
    stream = torch.cuda.current_stream().cuda_stream
    g = tuple(grid) + (1, 1)
    compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None, None, None,
                  *values)


@contextlib.contextmanager
def _deadline(kernel, args):
    """Interpreted launches of workspace kernels (their arguments start with Workspace.kernel_args): a
    watchdog thread sets the record's deadline word once this launch's waits have spun for
    SYMMCOLL_TIMEOUT_S, and every spinning wait gives up when it sees the word
    (language.signals.failed_elsewhere), as a GPU wait gives up when its spin budget is spent. The
    waits count their spins in the record; the watchdog adds up this process's CPU time over the
    ticks in which they moved: time spent computing does not count, and on a machine where the ranks
    share too few cores a wait lasts as long as a peer needs to make up SYMMCOLL_TIMEOUT_S of work (a
    spin count did that before, but an interpreted spin costs 1 to 10 ms depending on the kernel)."""
    if list(kernel.arg_names[:2]) != ["signal_pad_ptrs_dev", "status_ptr"]:
        yield
        return
    from .memory import timeout_seconds
    from .memory.layout import STATUS_DEADLINE_WORD, STATUS_SPINS_WORD
    spins = ctypes.c_int32.from_address(args[1] + 4 * STATUS_SPINS_WORD)
    deadline = ctypes.c_int32.from_address(args[1] + 4 * STATUS_DEADLINE_WORD)
    done = threading.Event()
    watchdog = threading.Thread(target=_watch, args=(spins, deadline, timeout_seconds(), done), daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        done.set()
        watchdog.join()
        deadline.value = 0


def _watch(spins, deadline, limit: float, done: threading.Event, tick: float = 0.05) -> None:
    """Add up this process's CPU time over the ticks in which ``spins`` moved; past ``limit``, set
    ``deadline``."""
    waited, last, seen = 0.0, time.process_time(), spins.value
    while not done.wait(tick):
        now, count = time.process_time(), spins.value
        if count != seen:
            waited += now - last
        seen, last = count, now
        if waited >= limit:
            deadline.value = 1
            return


class Prepared:
    """One launch whose arguments are all fixed except some tensors (a cached plan's single launch):
    later calls pass only those tensors and go straight to the compiled kernel's launcher with their
    addresses, skipping every Python-level binding step. Falls back to ``launch`` whenever the fast
    path does not apply (CPU, recording, a misaligned tensor, before the first compile)."""

    __slots__ = ("kernel", "grid", "prefix", "suffix", "meta", "compiled", "tail", "device")

    def __init__(self, kernel, grid: tuple, prefix: tuple, suffix: tuple, meta: dict):
        self.kernel, self.grid, self.prefix, self.suffix, self.meta = kernel, tuple(grid) + (1, 1), prefix, suffix, meta
        self.compiled, self.tail, self.device = None, (), None

    def try_fast(self, *tensors) -> bool:
        """Launch through the compiled kernel with these tensors' addresses (same dtypes and sizes as
        the first call); False, launching nothing, where that does not apply."""
        compiled = self.compiled
        if compiled is None or _RECORDING is not None or not FAST:
            return False
        ptrs = tuple(map(_data_ptr, tensors))  # no comprehension: each is a Python call on every eager call
        for p in ptrs:
            if p % 16:
                return False
        LAUNCH_COUNTS[self.kernel.__name__] += 1
        g = self.grid
        compiled.run(g[0], g[1], g[2], _raw_stream(self.device), compiled.function, compiled.packed_metadata,
                     None, None, None, *self.prefix, *ptrs, *self.suffix, *self.tail)
        return True

    def __call__(self, *tensors) -> None:
        """The first (or a slow-path) launch, through Triton's JIT; keeps the compiled kernel."""
        args = (*self.prefix, *tensors, *self.suffix)
        if _RECORDING is not None or INTERPRETED or not FAST or any(t.data_ptr() % 16 for t in tensors):
            launch(self.kernel, self.grid[:1], args, self.meta)
            return
        LAUNCH_COUNTS[self.kernel.__name__] += 1
        compiled = self.kernel[self.grid[:1]](*args, **self.meta)
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        self.tail = tuple(self.meta[p.name] if p.name in self.meta else p.default
                          for p in self.kernel.params[len(args):])
        self.device = tensors[0].device.index if tensors else torch.cuda.current_device()
        self.compiled = compiled


_data_ptr = torch.Tensor.data_ptr


def _raw_stream(device_index: int) -> int:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_index) if raw is not None else torch.cuda.current_stream(device_index).cuda_stream
