"""Probe (issue 22, point 3): can a decode GEMM read its weights across the kernel boundary?

At M <= 64 the 32-40 MB weights (70b-tp4 qkv / o) read 2.5-3.3 TB/s where point 3 asks 3.6; an SM read kernel
over the same bytes reads 2.93-3.06 (results/2026-11-29-decode-narrow-h200). Every earlier try to move bytes
across the boundary between two decode GEMMs of a chain went through the plain-Triton core, whose software
pipeline cannot start before the PDL wait: B prefetched into L2 (14th stop), B's first k-steps loaded into
registers before the wait (16th), W's lines prefetched by the LSU (17th) -- none gained. Gluon (triton 3.6)
puts the ring in our hands: this kernel issues the TMA loads of its first STAGES k-steps of B (a weight,
which no kernel before writes) into shared memory BEFORE ``griddepcontrol.wait``, then waits, releases the
next launch, and loads A (the activations, which the kernel before may write) -- so a launch that became
resident under PDL's early release has its first ~200 KB of B in flight while the kernel before it drains.
The same kernel with PREFETCH off waits first (the core's order). Swapped tiles as the core's decode
configs: tokens on wgmma's narrow N side, 64 columns of B a program, whole K, one program per column block.
Timed as the grid times decode cells (rotating weight sets, paired rounds, PDL-launched chains) beside the
core and cuBLAS, every side checked against fp32 first. Gluon does not run under the interpreter: a
measurement, not a core path.

    PYTHONPATH=src python3 benchmarks/gluon_decode_probe.py --out decode.json     # GPU
    PYTHONPATH=src python3 benchmarks/gluon_decode_probe.py --compile-only        # sm_90 build, no GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import kernel_specs  # noqa: E402  (ptxas_usage: registers and spills of the sm_90a build)


@gluon.jit
def issue_step(b_desc, a_desc, b_bufs, a_bufs, b_ready, a_ready, col0, step, stage, steps, LOAD_B: gl.constexpr,
               LOAD_A: gl.constexpr):
    """TMA loads of k-step ``step`` (if < steps) of B [BK, 64 columns] and/or A [tokens, BK] into ``stage``."""
    BK: gl.constexpr = b_desc.block_type.shape[0]
    live = step < steps
    if LOAD_B:
        mbarrier.expect(b_ready.index(stage), b_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(b_desc, [step * BK, col0], b_ready.index(stage), b_bufs.index(stage), live)
    if LOAD_A:
        mbarrier.expect(a_ready.index(stage), a_desc.block_type.nbytes, pred=live)
        tma.async_copy_global_to_shared(a_desc, [0, step * BK], a_ready.index(stage), a_bufs.index(stage), live)


@gluon.jit
def decode_kernel(a_desc, b_desc, c_ptr, partials_ptr, counters_ptr, M, N, K, stride_c, STAGES: gl.constexpr,
                  PREFETCH: gl.constexpr, num_warps: gl.constexpr):
    # C [M, N] = A [M, K] @ B [K, N] (row-major, M <= the tokens tile): program (t, p) computes part p of
    # C[:, 64t : 64t + 64] as acc^T [64, tokens] = B^T tile @ A^T over its share of the k-steps -- the
    # tokens on wgmma's N side. Parts > 1 (the grid's second dimension): each part stores its fp32 partial,
    # the last to finish (a counter a tile) sums all of them in part order and stores the tile.
    BK: gl.constexpr = b_desc.block_type.shape[0]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    BT: gl.constexpr = a_desc.block_type.shape[0]
    dtype: gl.constexpr = b_desc.dtype
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    a_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(b_ready.index(i), count=1)
        mbarrier.init(a_ready.index(i), count=1)
    tile = gl.program_id(0)
    part = gl.program_id(1)
    parts = gl.num_programs(1)
    col0 = tile * BN
    steps = gl.cdiv(K, BK)
    first = part * steps // parts
    last = (part + 1) * steps // parts
    if PREFETCH:  # B is a weight: no kernel before this one writes it
        for s in gl.static_range(STAGES):
            issue_step(b_desc, a_desc, b_bufs, a_bufs, b_ready, a_ready, col0, first + s, s, last, True, False)
    # griddepcontrol.wait: the kernel before has completed and its stores are visible (A may be its output)
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)
    for s in gl.static_range(STAGES):
        issue_step(b_desc, a_desc, b_bufs, a_bufs, b_ready, a_ready, col0, first + s, s, last, not PREFETCH, True)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BT, 16])
    acc = gl.zeros([BN, BT], gl.float32, layout)
    for i in range(last - first):
        stage = i % STAGES
        phase = (i // STAGES) & 1
        mbarrier.wait(b_ready.index(stage), phase)
        mbarrier.wait(a_ready.index(stage), phase)
        acc = warpgroup_mma(b_bufs.index(stage).permute((1, 0)), a_bufs.index(stage).permute((1, 0)), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        gl.thread_barrier()  # every warp's wgmma has read the stage before the TMA refills it
        issue_step(b_desc, a_desc, b_bufs, a_bufs, b_ready, a_ready, col0, first + i + STAGES, stage, last, True,
                   True)
    local = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    tokens = gl.arange(0, BT, layout=gl.SliceLayout(0, layout))
    cols = col0 + local
    mask = (cols[:, None] < N) & (tokens[None, :] < M)
    if parts == 1:
        gl.store(c_ptr + tokens[None, :] * stride_c + cols[:, None], acc.to(dtype), mask=mask)
    else:
        offsets = local[:, None] * BT + tokens[None, :]
        slots = partials_ptr + tile.to(gl.int64) * parts * (BN * BT)
        gl.store(slots + part * (BN * BT) + offsets, acc)
        gl.thread_barrier()  # every thread's partial is stored before the counter says so
        arrived = gl.atomic_add(counters_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == parts - 1:  # the last part: every partial is visible
            total = gl.zeros([BN, BT], gl.float32, layout)
            for q in range(parts):
                total += gl.load(slots + q * (BN * BT) + offsets, cache_modifier=".cg")
            gl.store(c_ptr + tokens[None, :] * stride_c + cols[:, None], total.to(dtype), mask=mask)
            gl.store(counters_ptr + tile, 0)  # for the next call (it waits for this kernel first)


BN = 64


def _layouts(bt: int, bk: int, dtype) -> tuple:
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    return gl.NVMMASharedLayout.get_default_for([bt, bk], gdt), gl.NVMMASharedLayout.get_default_for([bk, BN], gdt)


def tokens_tile(m: int) -> int:
    return max(16, triton.next_power_of_2(m))


_SCRATCH: dict = {}


def decode_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bk: int = 256, stages: int = 5,
                  prefetch: bool = True, parts: int = 1) -> torch.Tensor:
    """C = A @ B (A [M <= 64, K], B [K, N], row-major), launched with PDL; ``parts`` programs a column block
    share its k-steps (fp32 partials and zeroed counters: scratch made once per shape, before capture)."""
    (m, k), n = a.shape, b.shape[1]
    bt = tokens_tile(m)
    tiles = triton.cdiv(n, BN)
    la, lb = _layouts(bt, bk, a.dtype)
    a_desc = TensorDescriptor.from_tensor(a, [bt, bk], la)
    b_desc = TensorDescriptor.from_tensor(b, [bk, BN], lb)
    key = (tiles, parts, bt, a.device)
    if key not in _SCRATCH:
        _SCRATCH[key] = (torch.empty(tiles * parts * BN * bt, device=a.device, dtype=torch.float32),
                         torch.zeros(tiles, device=a.device, dtype=torch.int32))
    partials, counters = _SCRATCH[key]
    decode_kernel[(tiles, parts)](a_desc, b_desc, c, partials, counters, m, n, k, c.stride(0), stages, prefetch,
                                  num_warps=4, launch_pdl=True)
    return c


def compile_sm90(bt: int = 16, bk: int = 256, stages: int = 5, prefetch: bool = True):
    """The kernel built for sm_90 without a GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    la, lb = _layouts(bt, bk, torch.bfloat16)
    signature = {"a_desc": f"tensordesc<bf16[{bt}, {bk}],{la!r}>", "b_desc": f"tensordesc<bf16[{bk}, {BN}],{lb!r}>",
                 "c_ptr": "*bf16", "partials_ptr": "*fp32", "counters_ptr": "*i32", "M": "i32", "N": "i32",
                 "K": "i32", "stride_c": "i32", "STAGES": "constexpr", "PREFETCH": "constexpr",
                 "num_warps": "constexpr"}
    constexprs = {(9, ): stages, (10, ): prefetch, (11, ): 4}
    attrs = {(i, ): [["tt.divisibility", 16]] for i in (2, 3, 4, 6, 7, 8)}
    src = GluonASTSource(decode_kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": True})


# (label, k-step, stages, prefetch, split): ~200 KB of shared memory at 16 tokens; "split": the column blocks'
# k-steps shared by 132 // blocks programs each (>= 2; else not run)
VARIANTS = (("g256p5", 256, 5, False, False), ("g256p5 pf", 256, 5, True, False), ("g256p5 split", 256, 5, False, True),
            ("g256p5 pf split", 256, 5, True, True), ("g128p10 pf", 128, 10, True, False))
CELLS = (("70b-tp4 qkv", 2560, 8192), ("70b-tp4 o", 8192, 2048), ("405b-tp8 qkv", 2304, 16384),
         ("dsv3-expert gate_up", 4096, 7168), ("70b-tp2 qkv", 5120, 8192), ("70b-tp2 gate_up", 28672, 8192))
MS = (1, 16, 32, 64)
SMS = 132


def variants_for(m: int, n: int):
    """(label, k-step, stages, prefetch, parts) of VARIANTS at ``m`` tokens and ``n`` columns: the ring cut to
    what fits shared memory (A's stage grows with the tokens tile; "@stages" in the label then)."""
    blocks = triton.cdiv(n, BN)
    for label, bk, stages, prefetch, split in VARIANTS:
        parts = SMS // blocks if split else 1
        if split and parts < 2:
            continue
        fitted = stages
        while (bk * BN + tokens_tile(m) * bk) * 2 * fitted > 220 * 1024:
            fitted -= 1
        yield (label.replace("split", f"s{parts}") + (f"@{fitted}" if fitted != stages else "")), bk, fitted, \
            prefetch, parts


def run(out_path: str | None, rounds: int, replays: int, cells, ms) -> dict:
    from symmcoll.bench import bandwidth
    from symmcoll.bench import gemm as grid
    from symmcoll.bench.provenance import collect
    from symmcoll.bench.timing import graph_us
    device = torch.device("cuda")
    rows = []
    result = {"provenance": dataclasses.asdict(collect("cuda")), "rows": rows}
    started = time.time()
    for name, n, k in cells:
        read_tbs = None
        for m in ms:
            cell = grid.make_cell(name, m, n, k, torch.bfloat16, device)
            sides = {"cublas": grid.cublas(cell), "core": grid.ours(cell, None)}
            for label, bk, stages, prefetch, parts in variants_for(m, n):
                sides[label] = [lambda a=a, b=b, c=c, bk=bk, s=stages, p=prefetch, q=parts:
                                decode_matmul(a, b, c, bk, s, p, q) for a, b, c in cell.sets]
            errors = {side: grid.check(cell, calls) for side, calls in sides.items()}
            wrong = [s for s, e in errors.items() if not e <= max(2 * errors["cublas"], 1e-2)]
            timed = [s for s in sides if s not in wrong]
            per_round = {s: [] for s in timed}
            for r in range(rounds):
                for side in timed[r % len(timed):] + timed[:r % len(timed)]:
                    per_round[side].append(statistics.median(graph_us(sides[side], replays)))
            if read_tbs is None:
                read_tbs = bandwidth.read_same_bytes_tbs([b for _, b, _ in cell.sets])[0]
            us = {s: statistics.median(v) for s, v in per_round.items()}
            row = {"shape": name, "m": m, "n": n, "k": k, "sets": len(cell.sets), "weight_mb": cell.weight_bytes / 2**20,
                   "core_config": grid.gemm.gemm_config(m, n, k, torch.bfloat16, device).label, "rel_err": errors,
                   "wrong": wrong, "us": us, "round_us": per_round,
                   "ratio_to_cublas": {s: statistics.median([x / y for x, y in zip(v, per_round["cublas"])])
                                       for s, v in per_round.items()},
                   "weight_tbs": {s: cell.weight_bytes / u / 1e6 for s, u in us.items()},
                   "read_tbs_same_bytes": read_tbs,
                   "rel_err_after": {s: grid.check(cell, sides[s]) for s in timed}}
            rows.append(row)
            print(f"{name:20s} M={m:3d} {row['weight_mb']:6.1f} MB read {read_tbs:.2f}  " + "  ".join(
                f"{s} {us[s]:.2f}us {row['weight_tbs'][s]:.2f}TB/s" for s in timed)
                + (f"  WRONG {wrong} {errors}" if wrong else "") + f"  [{time.time() - started:.0f}s]", flush=True)
            if out_path:
                Path(out_path).write_text(json.dumps(result, indent=1))
            del cell, sides
            torch.cuda.empty_cache()
    result["summary"] = summary(rows)
    print("summary:", json.dumps(result["summary"]), flush=True)
    if out_path:
        Path(out_path).write_text(json.dumps(result, indent=1))
    return result


def summary(rows: list[dict], target_tbs: float = 3.6) -> dict:
    """Cells whose weights are read at >= target_tbs: cuBLAS, the core, the best Gluon variant, the best of the
    core and every variant (what a table choosing among them would reach)."""
    gluon = lambda row: max((v for s, v in row["weight_tbs"].items() if s not in ("cublas", "core")), default=0.0)
    best = lambda row: max(v for s, v in row["weight_tbs"].items() if s != "cublas")
    return {"cells": len(rows), "target_tbs": target_tbs,
            "cublas": sum(r["weight_tbs"].get("cublas", 0.0) >= target_tbs for r in rows),
            "core": sum(r["weight_tbs"].get("core", 0.0) >= target_tbs for r in rows),
            "best_gluon": sum(gluon(r) >= target_tbs for r in rows),
            "best_of_core_and_gluon": sum(best(r) >= target_tbs for r in rows),
            "wrong": sum(bool(r["wrong"]) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=6)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--all-decode", action="store_true",
                        help="every grid shape with >= 32 MB of weights (bench/gemm.py's SHAPES, DECODE_MB) at M = 1-64")
    args = parser.parse_args()
    if args.compile_only:
        for bt in (16, 64):
            for label, bk, stages, prefetch, _ in variants_for(bt, 2560):
                kernel = compile_sm90(bt, bk, stages, prefetch)
                regs, spills = kernel_specs.ptxas_usage(kernel.asm["ptx"])
                ptx = kernel.asm["ptx"]
                print(f"tokens {bt} {label}: smem {kernel.metadata.shared} B, registers {regs}, spills {spills}, "
                      f"griddepcontrol.wait at line {ptx.splitlines().index(next(l for l in ptx.splitlines() if 'griddepcontrol.wait' in l))}"
                      f" of {len(ptx.splitlines())}, first bulk tensor load at line "
                      f"{ptx.splitlines().index(next(l for l in ptx.splitlines() if 'cp.async.bulk.tensor' in l))}")
        return
    if args.all_decode:
        from symmcoll.bench import gemm as grid
        cells = [(name, n, k) for name, n, k in grid.SHAPES if n * k * 2 >= grid.DECODE_MB * 2**20]
        run(args.out, args.rounds, args.replays, cells, (1, 8, 16, 32, 64))
    else:
        run(args.out, args.rounds, args.replays, CELLS, MS)


if __name__ == "__main__":
    sys.exit(main())
