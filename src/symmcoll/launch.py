"""Run a function on N ranks: the one way tests, the CLI and users start symmcoll programs.

* CPU (no GPU, or ``device="cpu"``): N processes, a gloo group, emulated symmetric memory and
  ``TRITON_INTERPRET=1`` (set before the children import symmcoll, as the interpreter requires).
* GPU: one process per GPU, an NCCL group, ``torch.cuda.set_device(rank)``, multicast disabled.
* ``device="cuda-shared"``: N processes sharing GPU 0 over a gloo group (NCCL refuses two ranks on one
  GPU). The GPU time-slices the ranks' kernels, so every wait for a peer costs a context switch: for
  correctness checks and host-overhead measurements on a one-GPU machine, never for bandwidth.

``RankPool`` keeps the rank processes alive across calls (tests reuse them); ``run`` is a one-off pool.
The function and its arguments must be picklable (defined at module level). A hard timeout kills every
rank and names the ranks that had not finished; an exception in any rank is raised here as
``RankError`` with its rank and traceback.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import socket
import threading
import time
import traceback
import uuid
from typing import Any, Callable

__all__ = ["RankPool", "RankError", "LaunchTimeout", "run", "default_device_type"]

# Children inherit os.environ at start: pools started from threads take turns setting it.
_SPAWN_LOCK = threading.Lock()
# How long the other ranks get to finish after one rank has failed, before they are killed.
_GRACE_AFTER_ERROR_S = 30.0


class RankError(RuntimeError):
    """One or more ranks raised; ``failures`` maps rank -> traceback text, ``results`` rank -> return
    value of the ranks that finished (what the survivors of a crashed rank saw)."""

    def __init__(self, failures: dict[int, str], unfinished: list[int] | None = None,
                 results: dict[int, Any] | None = None):
        self.failures = failures
        self.unfinished = unfinished or []
        self.results = results or {}
        first = min(failures)
        lines = [f"rank {first} failed:\n{failures[first]}"]
        others = sorted(set(failures) - {first})
        if others:
            lines.append(f"ranks {others} failed as well")
        if self.unfinished:
            lines.append(f"ranks {self.unfinished} had not finished and were killed")
        super().__init__("\n".join(lines))


class LaunchTimeout(TimeoutError):
    def __init__(self, timeout: float, unfinished: list[int]):
        self.unfinished = unfinished
        super().__init__(f"timed out after {timeout:.0f} s; ranks {unfinished} had not finished "
                         f"(all ranks were killed)")


def default_device_type() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() > 0 else "cpu"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, device_type: str, port: int, tasks, results) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    # Host-side collectives of the process group (references, the bench's exchanges) give up after this
    # long instead of torch's 30 min default; symmcoll's own rendezvous are bounded by SYMMCOLL_TIMEOUT_S.
    from .memory import timeout_seconds
    default = 3 * timeout_seconds() + 30
    pg_timeout = datetime.timedelta(seconds=float(os.environ.get("SYMMCOLL_PG_TIMEOUT_S", default)))
    try:
        if device_type == "cuda-shared":
            torch.cuda.set_device(0)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world, timeout=pg_timeout)
        elif device_type == "cuda":
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world, device_id=torch.device("cuda", rank),
                                    timeout=pg_timeout)
        else:
            torch.set_num_threads(1)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=world, timeout=pg_timeout)
        results.put(("ready", rank, None))
    except BaseException:
        results.put(("err", rank, traceback.format_exc()))
        return
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put(("ok", rank, fn(*args, **kwargs)))
        except BaseException:
            results.put(("err", rank, traceback.format_exc()))
    with contextlib.suppress(Exception):
        from . import memory
        memory.reset()
        dist.destroy_process_group()


class RankPool:
    """``world_size`` rank processes that run functions together, until closed.

    >>> with RankPool(2) as pool:
    ...     results = pool.run(my_function, arg)      # my_function(arg) on every rank
    """

    def __init__(self, world_size: int, device: str = "auto", start_timeout: float = 120.0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.device_type = default_device_type() if device == "auto" else device
        if self.device_type not in ("cpu", "cuda", "cuda-shared"):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda-shared', got {device!r}")
        if self.device_type == "cuda":
            import torch
            if world_size > torch.cuda.device_count():
                raise ValueError(f"world_size {world_size} > {torch.cuda.device_count()} visible GPUs")
        self.world_size = world_size
        self.shm_prefix = f"symmcoll-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        ctx = mp.get_context("spawn")
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        port = _free_port()
        env = {"SYMMCOLL_SHM_PREFIX": self.shm_prefix, "NCCL_NVLS_ENABLE": "0",
               "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
        if self.device_type == "cpu":
            env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
        if self.device_type == "cuda-shared":
            env.update(SYMMCOLL_MEMORY="ipc")  # torch's symmetric memory refuses two ranks on one GPU
        self._procs = []
        with _SPAWN_LOCK, _environ(env):  # pools started from several threads each pass their own environment
            for r in range(world_size):
                p = ctx.Process(target=_worker, daemon=True, name=f"symmcoll-rank{r}",
                                args=(r, world_size, self.device_type, port, self._tasks[r], self._results))
                p.start()
                self._procs.append(p)
        self._closed = False
        self._collect("ready", start_timeout)

    @property
    def closed(self) -> bool:
        """True once ``close`` ran (or a failed run closed the pool): make a new pool to go on."""
        return self._closed

    def run(self, fn: Callable, *args: Any, timeout: float = 300.0, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every rank; return the per-rank results, rank order."""
        if self._closed:
            raise RuntimeError("RankPool is closed")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        return self._collect("ok", timeout)

    def _collect(self, expect: str, timeout: float) -> list[Any]:
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        first_failure: float | None = None
        while len(results) + len(failures) < self.world_size:
            if first_failure is not None:  # the others get a grace period to finish or fail
                deadline = min(deadline, first_failure + _GRACE_AFTER_ERROR_S)
            remaining = deadline - time.monotonic()
            dead = [r for r, p in enumerate(self._procs)
                    if not p.is_alive() and r not in results and r not in failures]
            try:
                kind, rank, payload = self._results.get(timeout=max(0.0, min(remaining, 1.0)))
            except queue.Empty:
                for r in dead:  # died without reporting (segfault, os._exit, killed)
                    first_failure = first_failure or time.monotonic()
                    failures[r] = f"rank {r} process exited with code {self._procs[r].exitcode}"
                if remaining <= 0:
                    unfinished = sorted(set(range(self.world_size)) - set(results) - set(failures))
                    self.close(force=True)
                    if failures:
                        raise RankError(failures, unfinished, results) from None
                    raise LaunchTimeout(timeout, unfinished) from None
                continue
            if kind == "err":
                first_failure = first_failure or time.monotonic()
                failures[rank] = payload
            else:
                results[rank] = payload
        if failures:
            self.close(force=True)
            raise RankError(failures, results=results)
        return [results[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not force:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=30)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        from .memory.emulated import leftover_files
        for path in leftover_files(self.shm_prefix):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close(force=exc[0] is not None)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close(force=True)


def run(fn: Callable, world_size: int, *args: Any, device: str = "auto", timeout: float = 300.0,
        **kwargs: Any) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` once on ``world_size`` fresh ranks and return their results."""
    with RankPool(world_size, device=device) as pool:
        return pool.run(fn, *args, timeout=timeout, **kwargs)


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
