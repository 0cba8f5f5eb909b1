"""Device state that outlives the call making it, allocated outside any CUDA-graph memory pool.

symmcoll keeps device memory across calls: the workspace (``memory/creation.py``: address tables,
state tensors, a ranks-sharing-a-GPU buffer), a plan's chunk flags and epoch table
(``fused/all_gather_matmul.py``), the split-K counters (``fused/gemm_split.py``), device splits
(``comm/splits.py``). The first call that needs one makes it, and under ``torch.compile(mode=
"reduce-overhead")`` that first call runs inside the warm-up of cudagraph trees
(``torch/_inductor/cudagraph_trees.py``, ``_use_cuda_memory_pool_manager``). The warm-up calls
``torch._C._cuda_beginAllocateCurrentThreadToPool(device, pool)``: from then on the caching
allocator gives every block that *the warming-up thread* asks for, on whatever stream, from the
graph's private pool (its filter compares thread ids; torch >= 2.8, the GPU image's 2.11 and 2.13
alike). After the warm-up, ``check_memory_pool`` fails on any block of that pool still alive that
is not an output of the graph: "Detected N tensor(s) in the cudagraph pool not tracked as outputs".
State kept across calls is exactly such a block.

``persistent(device, make)`` runs ``make`` on an allocation thread while the caller waits, with the
caller's CUDA device and current stream. The pool's filter does not match that thread, so the blocks
come from the ordinary pools; the stream is the caller's, so the allocation and its initialisation
(zero fills, copies) are ordered with the caller's work exactly as if made inline: no cross-stream
wait, and each block belongs to the stream that uses it. ``make`` may also rendezvous with the other
ranks (a workspace creation does): the caller only waits. The threads are kept, so that a call costs
a hand-over rather than a thread start (about 60 us against 190 us on a busy 2-core machine; plans of
all_to_all with host splits make state once per distinct splits), one thread per caller waiting at
once (up to 8), so that two threads creating two groups' workspaces do not wait on each other.

Why not the alternatives:

* another stream on the same thread (tried in 8707cd0, reverted): the filter ignores streams;
* a ``torch.cuda.MemPool`` of our own (``use_mem_pool``): it registers a second filter for the same
  thread, and the allocator serves an allocation from the first registered filter that matches,
  which is the graph's;
* making the state before cudagraph trees start (in the backend's compile step): it depends on the
  first real call's shapes and plans and on tables that grow, and a user's own graph warm-up around
  an eager symmcoll call would still catch it;
* cudagraph trees have no way to exempt an allocation from the check.

Inline, as before: CPU and meta tensors (no pools), calls already on the allocation thread (``make``
asking for more state), and stream capture itself (``torch.cuda.graph``), where what a first call
makes belongs to the graph being captured (it cannot be made elsewhere and waited for).
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

# Device types whose allocations a graph pool may capture; tests add "cpu" to run the thread path
# (tests/test_compile_backend.py: a dispatch mode stands in for the pool's thread filter).
THREADED_DEVICE_TYPES = {"cuda"}
_MAX_THREADS = 8
_THREAD = threading.local()
_THREADS: tuple[int, ThreadPoolExecutor] | None = None  # (the process that started them, the threads)


def persistent(device: torch.device | str, make: Callable[[], T]) -> T:
    """``make()`` (which allocates tensors kept after the call) run where no CUDA-graph pool takes
    its allocations: on an allocation thread, with this thread's device and current stream."""
    device = torch.device(device)
    if device.type not in THREADED_DEVICE_TYPES or getattr(_THREAD, "allocating", False):
        return make()
    where = contextlib.nullcontext()
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return make()
        index = device.index if device.index is not None else torch.cuda.current_device()
        where = _cuda_context(index, torch.cuda.current_stream(index))

    def run() -> T:
        with where:
            return make()

    return _threads().submit(run).result()  # make's exception is raised here


def _threads() -> ThreadPoolExecutor:
    global _THREADS
    if _THREADS is None or _THREADS[0] != os.getpid():  # a forked child has none of its parent's threads
        _THREADS = (os.getpid(), ThreadPoolExecutor(_MAX_THREADS, "symmcoll-persistent", _mark_allocating))
    return _THREADS[1]


def _mark_allocating() -> None:
    _THREAD.allocating = True  # make() asking for more state: made inline, on this thread


@contextlib.contextmanager
def _cuda_context(index: int, stream: torch.cuda.Stream):
    with torch.cuda.device(index), torch.cuda.stream(stream):
        yield


__all__ = ["persistent", "THREADED_DEVICE_TYPES"]
