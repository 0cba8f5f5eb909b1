"""Diagnostic switches for the multi-GPU slowdown of the barrier-free kernels (benchmarks/multi_gpu_regression.md).

Each switch turns off or moves one mechanism that the 2026-11-22 "one house" restructure (401756e) added
to every barrier-free kernel, so that one GPU run can say which one makes waits 25-400x slower on real
multi-GPU (one process per GPU) at mid sizes. They are read once, from the environment, when symmcoll is
imported (set them before the rank processes start). All default to off, and off they change nothing:
the kernels compile to the same PTX as without this module (benchmarks/ptx_identity.py).

Device side (``language.signals`` and ``language.polls`` turn them into constexprs):
  SYMMCOLL_DEBUG_NO_ABORT_CHECK=1      waits never look at the error record while spinning
                                       (``failed_elsewhere``): no read of pinned host memory in any spin
                                       loop. A failing program still records its own failure; the other
                                       programs of its rank give up when their own spin budget runs out
                                       (bounded, SYMMCOLL_TIMEOUT_S) instead of at their next look.
  SYMMCOLL_DEBUG_ABORT_CHECK_SPINS=N   look at the error record every N spins instead of the default
                                       (64 interpreted, 65536 compiled: ``language.signals``; N=64 on a GPU
                                       is the code before the fix of 2026-11-27).
  SYMMCOLL_DEBUG_NO_HEADERS=1          barrier-free kernels post no epoch-tagged call header and no wait
                                       polls one: a peer that made another call is no longer named (its
                                       data never comes: the wait times out, bounded).
  SYMMCOLL_DEBUG_NO_ANNOUNCE=1         program 0 stores no call descriptor into peers' signal pads (a
                                       timeout's message then cannot say what the peer called).
Host side (``symmcoll.memory``):
  SYMMCOLL_DEBUG_STATUS_ON_DEVICE=1    the error record the kernels write and poll is in this rank's
                                       device memory instead of pinned host memory. The host does not see
                                       it without a synchronisation, so the library raises no kernel
                                       failure in this mode: ``Workspace.device_record()`` reads it (the
                                       probe does, after every case).
  SYMMCOLL_DEBUG_SEPARATE_REGIONS=1    every symmetric region is its own allocation (as before 401756e)
                                       instead of one allocation holding them all.

all_gather_matmul's fused producers (benchmarks/NOTES.md, "all_gather_matmul fused: producers' pull rate"),
to compare the pull designs in one GPU call (``fused.all_gather_matmul`` reads them):
  SYMMCOLL_AGMM_PRODUCERS=N            exactly N producer programs on a GPU (capped at the chunks there are)
                                       instead of the rule ``fused_producers``.
  SYMMCOLL_AGMM_PULL_SINGLE=1          producers copy one [BM, 256] step at a time, loads then stores (the
                                       pull before 2026-11-27's change), instead of issuing the next step's
                                       loads before storing the current one.
  SYMMCOLL_AGMM_ALONE_OWN_LOOP=1       a group of one that wants no gathered A runs the kernel's own consumer
                                       loop (before 2026-11-27's change) instead of the GEMM core's persistent loop
                                       (ALONE_CORE), to time both on one GPU.

The sentinel reduce-scatter's push-ahead (benchmarks/NOTES.md, "reduce_scatter at 8-16 MB on 4 ranks"), to
time main's kernel and the pipelined one in one GPU call (``comm.sentinel`` reads it at each launch; on a
GPU a plan keeps the launch it prepared first, so set it before the process starts):
  SYMMCOLL_RS_SENTINEL_LAG=K           each program pushes its block i + K before it waits for and reduces
                                       block i (one loop), instead of pushing all its blocks and then
                                       reducing them (main). Unset: main's kernel, same PTX.
The quantized all-reduce (issue 18), to time launch configs in one GPU call (read when symmcoll is imported:
one bench process per value):
  SYMMCOLL_QUANT_CONFIG=B,P,W          every quantized launch with LaunchConfig(B, P, W) (elements a step,
                                       programs, warps) instead of the size table (GPU_CONFIGS).
  SYMMCOLL_QUANT_PREFETCH=1 / 0        every launch with / without the kernel that issues every loop step's loads
                                       (input blocks, my own block, the first poll of codes and scales) one step
                                       ahead (``comm.quantized_steps.stages_prefetched``; at most 80 registers a
                                       thread, 3 programs of 8 warps an SM). Unset: the size rule
                                       (``comm.quantized.prefetch_for``: from 16 MB a rank).
  SYMMCOLL_QUANT_MAXNREG=N             the quantized kernel compiled with at most N registers a thread (ptxas'
                                       maxnreg): 64 lets 4 programs of 8 warps share an SM, for
                                       SYMMCOLL_QUANT_CONFIG=2048,528,8 (every program must be resident).
all_gather.copy_engine (benchmarks/results/2026-11-27-ws2-leftovers-h100x2: torch's low_contention, fed from
symmetric memory, 0.85-0.92x of it from 64 MB), to time both orderings in one GPU call (read when symmcoll is
imported: one bench process per value):
  SYMMCOLL_AG_CE_PARTS=N               each chunk staged in N parts, a barrier after each; a side stream pulls
                                       part p while the main stream stages part p+1 and then copies the own
                                       slot (``comm.gather._copy_engine_overlapped``). N = 0: copy-in, own slot,
                                       barrier, pulls, barrier on one stream (the path before 2026-11-28).
                                       Unset: the size rule (``comm.gather.copy_engine_parts``).
matmul_reduce_scatter's fused kernel (and matmul_all_reduce's two_shot, which runs it):
  SYMMCOLL_MRS_GREEDY_PIECES=1         products larger than a slot go in launches filled to the slot, the
                                       rest in the last (before 2026-11-27's seventh stop), instead of
                                       launches of equal size (``fused.matmul_reduce_scatter.pieces``).
"""

from __future__ import annotations

import os


def _on_off(name: str) -> bool | None:
    """1 / 0 from the environment, or None where unset (the default rule applies)."""
    value = os.environ.get(name)
    if value is None:
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _flag(name: str) -> bool:
    """A switch that is off unless set to 1."""
    return _on_off(name) is True


def _count(name: str, what: str, least: int = 1) -> int | None:
    """A count >= ``least`` (spins, programs; parts, where 0 names a path) from the environment, or None where
    unset (the default applies)."""
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.isdigit() or int(value) < least:
        raise ValueError(f"{name} must be a {what} >= {least}, got {value!r}")
    return int(value)


NO_ABORT_CHECK = _flag("SYMMCOLL_DEBUG_NO_ABORT_CHECK")
ABORT_CHECK_SPINS = _count("SYMMCOLL_DEBUG_ABORT_CHECK_SPINS", "number of spins")
NO_HEADERS = _flag("SYMMCOLL_DEBUG_NO_HEADERS")
NO_ANNOUNCE = _flag("SYMMCOLL_DEBUG_NO_ANNOUNCE")
STATUS_ON_DEVICE = _flag("SYMMCOLL_DEBUG_STATUS_ON_DEVICE")
SEPARATE_REGIONS = _flag("SYMMCOLL_DEBUG_SEPARATE_REGIONS")
AGMM_PRODUCERS = _count("SYMMCOLL_AGMM_PRODUCERS", "number of programs")
AGMM_PULL_SINGLE = _flag("SYMMCOLL_AGMM_PULL_SINGLE")
AGMM_ALONE_OWN_LOOP = _flag("SYMMCOLL_AGMM_ALONE_OWN_LOOP")
RS_SENTINEL_LAG = _count("SYMMCOLL_RS_SENTINEL_LAG", "number of blocks")
MRS_GREEDY_PIECES = _flag("SYMMCOLL_MRS_GREEDY_PIECES")


def _triple(name: str) -> tuple[int, int, int] | None:
    """Three positive counts ``a,b,c`` from the environment, or None where unset."""
    value = os.environ.get(name)
    if value is None:
        return None
    parts = value.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"{name} must be three positive counts a,b,c, got {value!r}")
    return tuple(int(p) for p in parts)


QUANT_CONFIG = _triple("SYMMCOLL_QUANT_CONFIG")
QUANT_PREFETCH = _on_off("SYMMCOLL_QUANT_PREFETCH")
QUANT_MAXNREG = _count("SYMMCOLL_QUANT_MAXNREG", "number of registers")
AG_CE_PARTS = _count("SYMMCOLL_AG_CE_PARTS", "number of parts (0: the one-stream path)", least=0)


# Switches whose 0 is a choice, not the default (unset is): a result file names them when set to 0.
_TRI_STATE = ("QUANT_PREFETCH",)


def active() -> dict[str, object]:
    """The switches that differ from their defaults (for result files)."""
    values = {"NO_ABORT_CHECK": NO_ABORT_CHECK, "ABORT_CHECK_SPINS": ABORT_CHECK_SPINS, "NO_HEADERS": NO_HEADERS,
              "NO_ANNOUNCE": NO_ANNOUNCE, "STATUS_ON_DEVICE": STATUS_ON_DEVICE, "SEPARATE_REGIONS": SEPARATE_REGIONS,
              "AGMM_PRODUCERS": AGMM_PRODUCERS, "AGMM_PULL_SINGLE": AGMM_PULL_SINGLE,
              "AGMM_ALONE_OWN_LOOP": AGMM_ALONE_OWN_LOOP, "RS_SENTINEL_LAG": RS_SENTINEL_LAG,
              "MRS_GREEDY_PIECES": MRS_GREEDY_PIECES, "QUANT_CONFIG": QUANT_CONFIG,
              "QUANT_PREFETCH": QUANT_PREFETCH, "QUANT_MAXNREG": QUANT_MAXNREG, "AG_CE_PARTS": AG_CE_PARTS}
    return {k: v for k, v in values.items() if v is not None and (v is not False or k in _TRI_STATE)}
