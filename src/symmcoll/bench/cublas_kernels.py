"""Which kernels ``torch.matmul`` (cuBLAS) runs for a cell of the GEMM grid, and what their names say.

cuBLAS on Hopper names its kernels after their tiling, e.g.

* ``nvjet_sm90_tst_128x8_64x12_4x1_v_bz_splitK_TNT``: tile 128 x 8, k-step 64 x 12 stages, a 4 x 1
  cluster, split along K (a ``cublasLt::splitKreduce_kernel`` then sums the parts);
* ``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas``:
  tile 128 x 128 x 64, two consumer warpgroups, segment-K off;
* CUTLASS's own: ``cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x128x64_2x1x1_0_tnn_align8_warpspecialized_cooperative_epi_tma``
  (tile, cluster, stages: 0 = as many as fit) and 2.x's ``..._128x128_32x5_tn_align8`` (tile, k-step x stages).

What the nvjet fields mean is not documented by NVIDIA; read here from names seen in public traces
(serving profiles of vLLM / SGLang on H100 / H200): the first ``AxB`` is the tile, the second the k-step and
the stages (``64x16``: deep pipelines for the 8-wide decode tiles), the third the cluster (``4x1`` with grid
[4, 16] for a 64 x 8 tile over N = 4096: the cluster's first dimension runs along the tile's first);
``v`` / ``h`` pair with Mx1 / 1xN clusters (raster order, kept as it is); ``coopA`` / ``coopB``: two consumer
warpgroups sharing the tile (kept as the schedule); ``splitK``: a split along K; the three capitals the
operands' layouts. Fields a name does not carry are None.

Orientation: torch's row-major ``C[M, N] = A[M, K] @ B[K, N]`` is cuBLAS's column-major ``C^T = B^T A^T``,
so cuBLAS's tile M runs along torch's N (the weights' columns) and its tile N along torch's M (the tokens):
``tile_m`` / ``tile_n`` below are the name's, ``torch_tile`` turns them round.

The kernels are found in a process of their own (``start`` / ``collect``): ``torch.profiler`` leaves CUPTI
attached to the process that used it (Kineto does not tear it down by default), and the process that times
the grid must not run under it. Each cell: REPLAYS replays of a CUDA graph of ``torch.matmul(a, b, out=c)``
(what the grid times), CUDA activities only, one short profiling session per cell.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from .kernel_share import KERNEL_CATEGORIES

# The profiling process starts no new cell past this many seconds (the grid's cells it left get no names):
# the grid waits for it after its ~10 s of compiles, and the whole grid must fit one 10-minute GPU call.
BUDGET_S = 45.0
# Replays of a cell's graph in its profile: a profiling session can lose the GPU records of its first
# kernels (pytorch/pytorch#192021); the names and shares are the same summed over a few replays.
REPLAYS = 3


@dataclass(frozen=True)
class CublasTiling:
    """What a kernel's name says about its tiling; None where the name does not say."""

    family: str | None                  # nvjet | xmma | cutlass3x | cutlass2x | split-K reduction | None
    tile_m: int | None = None           # cuBLAS's M (torch's N)
    tile_n: int | None = None           # cuBLAS's N (torch's M)
    tile_k: int | None = None           # the k-step
    stages: int | None = None           # (cutlass3x's 0: as many as fit)
    cluster: tuple[int, ...] | None = None
    warpgroups: tuple[int, ...] | None = None
    split_k: bool | None = None
    stream_k: bool | None = None
    segment_k: bool | None = None
    schedule: str | None = None         # coopA | coopB | cooperative | pingpong
    raster: str | None = None           # nvjet's v | h
    layout: str | None = None           # nvjet's TNT, xmma's tn_n, cutlass's tnn
    types: str | None = None            # nvjet's tst, xmma's bf16bf16_bf16f32_f32
    arch: str | None = None             # sm90 ...
    flags: tuple[str, ...] = ()         # the name's other tokens (nvjet's bz, bias, 2cta)

    def torch_tile(self) -> tuple[int | None, int | None, int | None]:
        """(rows of torch's C, columns, k-step): cuBLAS's tile turned round (see the module's note)."""
        return self.tile_n, self.tile_m, self.tile_k

    def short(self) -> str:
        """e.g. ``nvjet M8xN128xK64/s12/c4x1/v/splitK`` (torch's M and N); the family alone where no tile is known."""
        if self.tile_m is None:
            return self.family or "?"
        rows, cols, k = self.torch_tile()
        parts = [f"M{rows}xN{cols}x" + (f"K{k}" if k else "K?")]
        if self.stages is not None:
            parts.append(f"s{self.stages}")
        if self.cluster:
            parts.append("c" + "x".join(map(str, self.cluster)))
        if self.warpgroups:
            parts.append("wg" + "x".join(map(str, self.warpgroups)))
        parts += [p for p in (self.raster, self.schedule) if p]
        parts += [label for on, label in ((self.split_k, "splitK"), (self.stream_k, "streamK"),
                                           (self.segment_k, "segK")) if on]
        return f"{self.family} " + "/".join(parts)


_DIMS = re.compile(r"^(\d+)x(\d+)$")
_NVJET_TYPES = re.compile(r"^[a-z]{3}$")
_NVJET_LAYOUT = re.compile(r"^[TN]{3}$")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("x"))


def _streamk(lowered: str) -> bool | None:
    return True if re.search(r"stream_?k", lowered) else None


def _nvjet(name: str) -> CublasTiling:
    tokens = name.split("_")[1:]
    arch = tokens.pop(0) if tokens and re.fullmatch(r"sm\d+", tokens[0]) else None
    types = tokens.pop(0) if tokens and _NVJET_TYPES.fullmatch(tokens[0]) else None
    dims, rest = [], []
    for token in tokens:
        match = _DIMS.match(token)
        (dims if match and len(dims) < 3 else rest).append(_ints(token) if match else token)
    tile, kstep, cluster = (dims + [None, None, None])[:3]
    raster = next((t for t in rest if t in ("v", "h")), None)
    schedule = next((t for t in rest if t.startswith("coop")), None)
    layout = next((t for t in rest if _NVJET_LAYOUT.fullmatch(t)), None)
    flags = tuple(t for t in rest if t not in (raster, schedule, layout, "splitK"))
    return CublasTiling("nvjet", tile[0] if tile else None, tile[1] if tile else None,
                        kstep[0] if kstep else None, kstep[1] if kstep else None, cluster, None,
                        split_k="splitK" in rest, stream_k=_streamk(name.lower()), segment_k=None,
                        schedule=schedule, raster=raster, layout=layout, types=types, arch=arch, flags=flags)


def _xmma(name: str) -> CublasTiling:
    lowered = name.lower()
    tile = re.search(r"tilesize(\d+)x(\d+)x(\d+)", lowered)
    stages = re.search(r"_stages?_?(\d+)(?:_|$)", lowered) or re.search(r"stages_\d+x(\d+)", lowered)
    cluster = re.search(r"(?:cgasize|cluster)(\d+x\d+x\d+)", lowered)
    groups = re.search(r"warpgroupsize(\d+x\d+x\d+)", lowered)
    segment = re.search(r"segment_k_(on|off)", lowered)
    layout = re.search(r"_([tn]{2}_[tn])_", lowered)
    types = re.search(r"xmma_gemm_([a-z0-9]+_[a-z0-9]+_[a-z0-9]+)_", lowered)
    arch = re.match(r"(sm\d+)_", lowered)
    split = True if re.search(r"split_?k(?!_?reduce)", lowered) else None
    return CublasTiling("xmma", *(int(x) for x in tile.groups()) if tile else (None, None, None),
                        stages=int(stages.group(1)) if stages else None,
                        cluster=_ints(cluster.group(1)) if cluster else None,
                        warpgroups=_ints(groups.group(1)) if groups else None,
                        split_k=split, stream_k=_streamk(lowered),
                        segment_k=(segment.group(1) == "on") if segment else None,
                        layout=layout.group(1) if layout else None, types=types.group(1) if types else None,
                        arch=arch.group(1) if arch else None)


def _cutlass3x(name: str) -> CublasTiling:
    lowered = name.lower()
    found = re.search(r"_(\d+)x(\d+)x(\d+)_(\d+)x(\d+)x(\d+)_(\d+)_([tn]{3})", lowered)
    schedule = next((s for s in ("cooperative", "pingpong") if s in lowered), None)
    arch = re.search(r"(sm\d+)", lowered)
    if not found:
        return CublasTiling("cutlass3x", schedule=schedule, stream_k=_streamk(lowered),
                            arch=arch.group(1) if arch else None)
    bm, bn, bk, cx, cy, cz, stages, layout = found.groups()
    return CublasTiling("cutlass3x", int(bm), int(bn), int(bk), int(stages), (int(cx), int(cy), int(cz)),
                        split_k=True if "splitk" in lowered or "split_k" in lowered else None,
                        stream_k=_streamk(lowered), schedule=schedule, layout=layout,
                        arch=arch.group(1) if arch else None)


def _cutlass2x(name: str) -> CublasTiling | None:
    """CUTLASS 2.x / Ampere cuBLAS: ``..._128x128_32x5_tn_...`` or ``..._128x128_ldg8_..._stages_32x5_tn``."""
    lowered = name.lower()
    found = re.search(r"_(\d+)x(\d+)_(\d+)x(\d+)_([tn]{2})(?:_|$)", lowered)
    if found:
        bm, bn, bk, stages, layout = found.groups()
    else:
        tile = re.search(r"_(\d+)x(\d+)_", lowered)
        kstep = re.search(r"stages_(\d+)x(\d+)_?([tn]{2})?", lowered)
        if not (tile and kstep):
            return None
        (bm, bn), (bk, stages, layout) = tile.groups(), kstep.groups()
    return CublasTiling("cutlass2x", int(bm), int(bn), int(bk), int(stages), layout=layout,
                        split_k=True if "splitk" in lowered else None, stream_k=_streamk(lowered))


def cublas_tiling(name: str) -> CublasTiling:
    """Best effort: what ``name`` (as a profiler shows it) says about the kernel's tiling; a name of no
    known family gives ``CublasTiling(None)``."""
    base = name.strip()
    if base.startswith("void "):
        base = base[5:]
    lowered = base.lower()
    if "splitkreduce" in lowered or "split_k_reduce" in lowered or "reduce_splitk" in lowered:
        return CublasTiling("split-K reduction")
    if lowered.startswith("nvjet_"):
        return _nvjet(base)
    if "xmma_gemm" in lowered:
        return _xmma(base)
    if "cutlass3x" in lowered:
        return _cutlass3x(base)
    return _cutlass2x(base) or CublasTiling(None)


# ---- the kernels of one call ------------------------------------------------------------------------

def kernels_of(events: Iterable[dict]) -> dict:
    """The row fields from a call's chrome-trace events (CUDA activities): ``cublas_kernels`` (names, in
    the order they first ran) and, where more than one ran, ``cublas_kernel_shares`` (each one's share
    of the call's GPU time, the same order)."""
    busy: dict[str, float] = {}
    for event in sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATEGORIES),
                        key=lambda e: float(e.get("ts", 0))):
        busy[event["name"]] = busy.get(event["name"], 0.0) + float(event.get("dur", 0))
    total = sum(busy.values())
    row: dict = {"cublas_kernels": list(busy)}
    if len(busy) > 1:
        row["cublas_kernel_shares"] = [round(us / total, 3) if total else None for us in busy.values()]
    return row


def main_kernel(row: dict) -> str | None:
    """The kernel that took most of the call (the first where the row has no shares)."""
    names = row.get("cublas_kernels") or []
    shares = row.get("cublas_kernel_shares")
    if not names:
        return None
    return names[max(range(len(names)), key=lambda i: shares[i] or 0)] if shares else names[0]


def describe(row: dict) -> str | None:
    """cuBLAS's side for a bench line: the main kernel's tiling, and the other kernels' shares
    (``+ split-K reduction 14%``); None where the row has no kernel names."""
    name = main_kernel(row)
    if name is None:
        return None
    tiling = cublas_tiling(name)
    text = tiling.short() if tiling.family else name[:60]
    names, shares = row["cublas_kernels"], row.get("cublas_kernel_shares") or []
    for other, share in zip(names, shares):
        if other != name:
            kind = cublas_tiling(other).family or other[:30]
            text += f" + {kind} {share * 100:.0f}%" if share is not None else f" + {kind}"
    return text


def cell_kernels(m: int, n: int, k: int, dtype, device, trace: Callable[[Callable[[], None]], list[dict]]) -> dict:
    """The row fields of ``torch.matmul(a, b, out=c)`` at (m, n, k): ``trace`` (e.g. kernel_share.trace_events)
    gives the CUDA activities of replays of a CUDA graph of the call (on CPU, of the call itself)."""
    import torch

    a = torch.randn((m, k), device=device, dtype=dtype)
    b = torch.randn((k, n), device=device, dtype=dtype)
    c = torch.empty((m, n), device=device, dtype=dtype)

    def call():
        torch.matmul(a, b, out=c)

    call()  # cuBLAS's handle and workspace before the capture
    run = call
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        run = graph.replay
    row = kernels_of(trace(run))
    if not row["cublas_kernels"] and run is not call:  # no kernel seen in the replay: the eager call's
        row = dict(kernels_of(trace(call)), cublas_kernels_from="eager call")
    return row


def record_cells(cells: list[tuple[int, int, int]], dtype, device, trace, budget_s: float = BUDGET_S) -> dict:
    """{(m, n, k): row fields} of every cell begun within ``budget_s`` (``cell_kernels`` with ``trace``); a cell
    that fails gets ``cublas_kernels_error`` instead."""
    import torch

    started = time.time()
    found: dict = {}
    for m, n, k in cells:
        if time.time() - started > budget_s:
            break
        try:
            found[(m, n, k)] = cell_kernels(m, n, k, dtype, device, trace)
        except Exception as exc:  # noqa: BLE001 - a cell without names is reported in its row, not fatal
            found[(m, n, k)] = {"cublas_kernels_error": f"{type(exc).__name__}: {str(exc)[:160]}"}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return found


def profile_cells(cells: list[tuple[int, int, int]], dtype_name: str, device_index: int,
                  budget_s: float = BUDGET_S) -> dict:
    """The profiling process's entry: ``record_cells`` on the GPU under torch.profiler, and its seconds."""
    import torch

    from .gemm import DTYPES
    from .kernel_share import trace_events

    started = time.time()
    device = torch.device("cuda", device_index)
    torch.cuda.set_device(device)
    found = record_cells(cells, DTYPES[dtype_name], device, lambda run: trace_events(run, REPLAYS), budget_s)
    return {"cells": found, "seconds": time.time() - started}


def _answer(send, cells, dtype_name: str, device_index: int) -> None:
    """The profiling process: ``profile_cells``' result or its error, through the pipe."""
    import os

    # (this process only profiles: no CUPTI teardown, whose re-initialisation around CUDA graphs has crashed)
    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    try:
        send.send(("done", profile_cells(cells, dtype_name, device_index)))
    except Exception as exc:  # noqa: BLE001 - said to the parent, which runs the grid without the names
        send.send(("error", f"{type(exc).__name__}: {str(exc)[:200]}"))


def start(cells: list[tuple[int, int, int]], dtype_name: str, device_index: int):
    """Start finding the cells' kernels in a process of its own (spawned: this one has CUDA up); it runs
    while the grid's Triton kernels compile on the CPUs. ``collect`` waits for it."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_answer, args=(send, list(dict.fromkeys(cells)), dtype_name, device_index),
                              daemon=True)
    process.start()
    send.close()  # (the child's end only: a child that dies closes the pipe, and collect hears it at once)
    return process, receive


def collect(handle, timeout_s: float = BUDGET_S + 60) -> tuple[dict, float | None, str | None]:
    """({(m, n, k): row fields}, seconds, error) of ``start``'s process; the process is ended either way
    (a late one must not run on the GPU while the grid is timed)."""
    process, receive = handle
    try:
        if not receive.poll(timeout_s):
            return {}, None, f"no answer from the profiling process in {timeout_s:.0f} s"
        status, payload = receive.recv()
        if status != "done":
            return {}, None, payload
        return payload["cells"], payload["seconds"], None
    except EOFError:
        process.join(5)
        return {}, None, f"the profiling process ended without an answer (exit code {process.exitcode})"
    finally:
        if process.is_alive():
            process.terminate()
        process.join(5)
        receive.close()
