"""Probe (issue 22, point 4): does warp specialisation close the GEMM core's large-M gap on sm_90?

The core (fused/gemm_kernel.py) is plain Triton: on sm_90 with triton 3.6 its tiles run without warp
specialisation (``tl.range(warp_specialize=True)`` compiles to the same PTX there) and without CTA clusters
(TMA multicast is "NYI" in 3.6's lowering). At 1024x8192x8192 and 4096x8192x8192 its 128 x 256 tiles run
1.02-1.05x cuBLAS in every capture (results/2026-11-29-ws1-repeats-h200). triton 3.6 does ship Gluon, whose
``gl.warp_specialize`` runs on Hopper: this probe writes the warp-specialised Hopper GEMM in it -- one
producer warp issuing the TMA loads of a STAGES-deep ring, two consumer warpgroups (the default partition)
issuing wgmma on 128 x 256 tiles and storing C through shared memory by TMA, the store of one tile under
the next tile's main loop -- and times it beside cuBLAS and the core in one run, each checked against fp32
first. Gluon kernels do not run under the interpreter, so this is a measurement, not a core path.

    PYTHONPATH=src python3 benchmarks/gluon_ws_probe.py --out ws.json                 # GPU
    PYTHONPATH=src python3 benchmarks/gluon_ws_probe.py --compile-only                # sm_90 build, no GPU
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import kernel_specs  # noqa: E402  (ptxas_usage: registers and spills of the sm_90a build)

# Registers: 8 consumer warps + the producer's warpgroup (register allocation is by warpgroup) = 12 warps at
# MAXNREG each = 64512 of the SM's 65536; the producer keeps PRODUCER_REGS, the consumers get the rest (232).
MAXNREG = 168
PRODUCER_REGS = gl.constexpr(40)


@gluon.jit
def grouped_tile(tile, num_m, num_n, GROUP_M: gl.constexpr):
    """(row block, column block) of ``tile`` in grouped order (the core's order: gemm_kernel.grouped_tile)."""
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_m = min(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@gluon.jit
def tile_counts(M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr):
    """(row blocks, column blocks, k-steps): both partitions walk the same tiles."""
    return gl.cdiv(M, BM), gl.cdiv(N, BN), gl.cdiv(K, BK)


@gluon.jit
def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M: gl.constexpr,
                   STAGES: gl.constexpr):
    """The producer warp: every k-step of every tile of this program, into the ring's next free stage."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[1]
    num_m, num_n, steps = tile_counts(M, N, K, BM, BN, BK)
    count = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
        for ks in range(steps):
            stage = count % STAGES
            # (a fresh barrier counts as phase 1 complete: the first lap does not wait)
            mbarrier.wait(empty.index(stage), ((count // STAGES) & 1) ^ 1)
            bar = ready.index(stage)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [pid_m * BM, ks * BK], bar, a_bufs.index(stage))
            tma.async_copy_global_to_shared(b_desc, [ks * BK, pid_n * BN], bar, b_bufs.index(stage))
            count += 1


@gluon.jit
def mma_partition(c_desc, a_bufs, b_bufs, c_smem, ready, empty, M, N, K, GROUP_M: gl.constexpr,
                  STAGES: gl.constexpr, num_warps: gl.constexpr):
    """The consumers (the default partition, num_warps warps: a warpgroup per 64 rows): wgmma over the
    ring, a stage freed once the wgmma after it is issued and it has retired; C by TMA from shared memory."""
    BM: gl.constexpr = c_desc.block_type.shape[0]
    BN: gl.constexpr = c_desc.block_type.shape[1]
    BK: gl.constexpr = a_bufs.shape[2]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, BN, 16])
    num_m, num_n, steps = tile_counts(M, N, K, BM, BN, BK)
    count = 0
    for tile in range(gl.program_id(0), num_m * num_n, gl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, GROUP_M)
        acc = gl.zeros([BM, BN], gl.float32, layout)
        for ks in range(steps):
            stage = count % STAGES
            mbarrier.wait(ready.index(stage), (count // STAGES) & 1)
            acc = warpgroup_mma(a_bufs.index(stage), b_bufs.index(stage), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            # every warpgroup's previous wgmma has retired before its stage is handed back (the arrive is
            # one thread's)
            gl.thread_barrier()
            mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES), pred=ks > 0)
            count += 1
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        gl.thread_barrier()
        mbarrier.arrive(empty.index((count + STAGES - 1) % STAGES))
        c = acc.to(c_desc.dtype)
        tma.store_wait(0)  # the previous tile's store has read c_smem
        c_smem.store(c)
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [pid_m * BM, pid_n * BN], c_smem)
    tma.store_wait(0)


@gluon.jit
def ws_matmul_kernel(a_desc, b_desc, c_desc, M, N, K, GROUP_M: gl.constexpr, STAGES: gl.constexpr,
                     num_warps: gl.constexpr):
    dtype: gl.constexpr = a_desc.dtype
    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (mma_partition, (c_desc, a_bufs, b_bufs, c_smem, ready, empty, M, N, K, GROUP_M, STAGES, num_warps)),
        (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, GROUP_M, STAGES)),
    ], [1], [PRODUCER_REGS])


def _layouts(bm: int, bn: int, bk: int, dtype) -> tuple:
    gdt = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    return (gl.NVMMASharedLayout.get_default_for([bm, bk], gdt), gl.NVMMASharedLayout.get_default_for([bk, bn], gdt),
            gl.NVMMASharedLayout.get_default_for([bm, bn], gdt))


def ws_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, bm: int = 128, bn: int = 256, bk: int = 64,
              stages: int = 3, group_m: int = 8, programs: int | None = None) -> torch.Tensor:
    """C = A @ B (A [M, K], B [K, N], both row-major) with the warp-specialised kernel."""
    (m, k), n = a.shape, b.shape[1]
    la, lb, lc = _layouts(bm, bn, bk, a.dtype)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk], la)
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn], lb)
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn], lc)
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    sms = programs or torch.cuda.get_device_properties(a.device).multi_processor_count
    ws_matmul_kernel[(min(sms, tiles), )](a_desc, b_desc, c_desc, m, n, k, group_m, stages, num_warps=8,
                                          maxnreg=MAXNREG)
    return c


def compile_sm90(bm: int = 128, bn: int = 256, bk: int = 64, stages: int = 3, group_m: int = 8):
    """The kernel built for sm_90 without a GPU (what the GPU's launch compiles, 16-aligned sizes)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    la, lb, lc = _layouts(bm, bn, bk, torch.bfloat16)
    desc = lambda shape, layout: f"tensordesc<bf16[{shape[0]}, {shape[1]}],{layout!r}>"
    signature = {"a_desc": desc((bm, bk), la), "b_desc": desc((bk, bn), lb), "c_desc": desc((bm, bn), lc),
                 "M": "i32", "N": "i32", "K": "i32", "GROUP_M": "constexpr", "STAGES": "constexpr",
                 "num_warps": "constexpr"}
    constexprs = {(6, ): group_m, (7, ): stages, (8, ): 8}
    attrs = {(i, ): [["tt.divisibility", 16]] for i in (3, 4, 5)}
    src = GluonASTSource(ws_matmul_kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "maxnreg": MAXNREG})


# (name, M, N, K): point 4's all_gather_matmul cells at world size 1, then other large-M shapes of the grid
SHAPES = (("agmm", 4096, 8192, 8192), ("agmm", 1024, 8192, 8192), ("agmm", 16384, 3584, 8192),
          ("70b-tp4 gate_up", 4096, 14336, 8192), ("70b-tp8 o", 8192, 8192, 1024), ("square", 8192, 8192, 8192))
# (label, stages, group_m)
VARIANTS = (("ws p3 g8", 3, 8), ("ws p3 g16", 3, 16))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def smoke(device) -> dict:
    """Every variant on small shapes first (several tiles a program, K not a multiple of 64, N not of 256):
    relative error against fp32 beside cuBLAS's; raises on a wrong answer before anything is timed."""
    found = {}
    for m, n, k, programs in ((512, 768, 320, 5), (384, 1000, 1000, 3), (1024, 4096, 2048, 132)):
        torch.manual_seed(1)
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        cublas = rel_err(a @ b, ref)
        for label, stages, group in VARIANTS:
            out = ws_matmul(a, b, torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16),
                            stages=stages, group_m=group, programs=programs)
            err = rel_err(out, ref)
            found[f"{m}x{n}x{k}/{programs} {label}"] = (err, cublas)
            print(f"smoke {m}x{n}x{k} programs {programs} {label}: rel err {err:.2e} (cuBLAS {cublas:.2e})", flush=True)
            if not err <= max(2 * cublas, 1e-2):
                raise RuntimeError(f"{label} wrong at {m}x{n}x{k}: rel err {err} (cuBLAS {cublas})")
    return found


def run(out_path: str | None, rounds: int, replays: int, shapes) -> dict:
    import dataclasses
    from symmcoll.bench.provenance import collect
    from symmcoll.bench.rounds import interleave, paired_ratio, paired_ratios
    from symmcoll.bench.timing import graph_us
    from symmcoll.fused import gemm
    device = torch.device("cuda")
    rows = []
    result = {"provenance": dataclasses.asdict(collect("cuda")), "rows": rows, "variants": [v[0] for v in VARIANTS]}
    started = time.time()
    result["smoke"] = smoke(device)
    for name, m, n, k in shapes:
        torch.manual_seed(0)
        sets = []
        for _ in range(2):  # two sets: every call reads its operands from HBM (A + B >= 48 MB a set)
            a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            b = torch.randn(k, n, device=device, dtype=torch.bfloat16) / k ** 0.5
            sets.append((a, b, torch.empty(m, n, device=device, dtype=torch.bfloat16)))
        a0, b0, _ = sets[0]
        ref = a0[:256].float() @ b0.float()
        sides = {"cublas": lambda a, b, c: torch.matmul(a, b, out=c), "core": lambda a, b, c: gemm.matmul(a, b, out=c)}
        for label, stages, group in VARIANTS:
            sides[label] = (lambda a, b, c, s=stages, g=group: ws_matmul(a, b, c, stages=s, group_m=g))
        row = {"shape": name, "m": m, "n": n, "k": k, "core_config": gemm.gemm_config(m, n, k, torch.bfloat16,
                                                                                      device).label}
        errors, wrong = {}, []
        for side, fn in sides.items():
            c = fn(*sets[0])
            torch.cuda.synchronize()
            errors[side] = rel_err(c[:256], ref)
        limit = max(errors["cublas"] * 1.0001, 1e-6) if errors["cublas"] > 0 else 1e-6
        wrong = [s for s, e in errors.items() if s not in ("cublas", "core") and e > max(limit, 2e-2)]
        row["rel_err"] = errors
        row["wrong"] = wrong
        timed = [s for s in sides if s not in wrong]
        # rotated paired rounds (bench/rounds.py), each round's median over cuBLAS's of the same round
        per_round = interleave(timed, rounds, lambda side, _: graph_us(
            [lambda st=st, fn=sides[side]: fn(*st) for st in sets], replays)).round_medians
        flops = 2.0 * m * n * k
        row["us"] = {s: statistics.median(v) for s, v in per_round.items()}
        row["round_us"] = per_round
        row["ratio_to_cublas"] = {s: paired_ratio(paired_ratios(v, per_round["cublas"])) for s, v in per_round.items()}
        row["tflops"] = {s: flops / u / 1e6 for s, u in row["us"].items()}
        # the answers again after the timed replays
        row["rel_err_after"] = {s: rel_err(sides[s](*sets[0])[:256], ref) for s in timed}
        rows.append(row)
        print(f"{name:16s} {m}x{n}x{k} core {row['core_config']}  " + "  ".join(
            f"{s} {row['us'][s]:.1f}us x{row['ratio_to_cublas'][s]:.3f} err {errors[s]:.1e}" for s in timed)
            + (f"  WRONG {wrong}" if wrong else "") + f"  [{time.time() - started:.0f}s]", flush=True)
        if out_path:
            Path(out_path).write_text(json.dumps(result, indent=1))
        del sets, a0, b0, ref
        torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--replays", type=int, default=8)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--shapes", nargs="*", help="MxNxK (default: SHAPES)")
    args = parser.parse_args()
    if args.compile_only:
        for _, stages, group in VARIANTS[:1]:
            kernel = compile_sm90(stages=stages, group_m=group)
            ptx = kernel.asm["ptx"]
            regs, spills = kernel_specs.ptxas_usage(ptx)
            setmaxnreg = re.findall(r"setmaxnreg[.a-z0-9]*\s+\d+", ptx)
            print(f"stages {stages}: smem {kernel.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, "
                  f"setmaxnreg {setmaxnreg}, registers {regs}, spills {spills}")
        return
    shapes = SHAPES if not args.shapes else [("cli", *map(int, s.split("x"))) for s in args.shapes]
    run(args.out, args.rounds, args.replays, shapes)


if __name__ == "__main__":
    sys.exit(main())
