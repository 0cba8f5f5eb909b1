"""Where a chain of decode GEMMs' programs run under PDL, and when (issue 22, written 2026-11-28 for the next GPU
session; NOTES.md, "sixteenth stop").

Why: launched with programmatic dependent launch and the next kernel released right after the wait
(gemm.launch_meta), whole-tile decode GEMMs ran 0.90-0.96x the time of no PDL at 128 tiles of 32 MB (70b-tp4 o)
but 1.24-1.31x at 80 tiles of 80 MB (70b-tp2 qkv), and the wave split lost too
(results/2026-11-28-pdl-early-h200). Where the next kernel's programs land -- beside ours, on idle SMs, or as ours
exit -- is the first suspect. Here the GEMM core's own K-loop and tile order (gemm_kernel.k_loop, grouped_tile,
store_result) run in a probe kernel that also records, per program, its SM (``%smid``) and the global timer at
its start, after PDL's wait and at its exit. A chain of CALLS launches over rotating weight sets is captured in a
CUDA graph, PDL off and on (early release), every output checked against fp32 first; per state it prints the time
a call, the most programs of one launch on one SM, how many programs started before the launch before them had
ended, the wait (start to the wait's return) and the work (the wait's return to exit) in percentiles.

    python3 benchmarks/pdl_placement_probe.py --out $OUT/pdl_placement.json
    python3 benchmarks/pdl_placement_probe.py --compile-only   # sm_90 build on a machine without a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl

from symmcoll.fused import gemm
from symmcoll.fused.gemm_configs import GemmConfig
from symmcoll.fused.gemm_kernel import grouped_tile, k_loop, store_result
from symmcoll.language import release_dependents, wait_prior_grid

CALLS = 20
REPLAYS = 10
# (name, M, N, K, config): the whole-tile decode cells PDL with early release won and lost on one H200
CELLS = [("70b-tp4 o M=16 (won 0.94x)", 16, 8192, 2048, GemmConfig(16, 64, 128, 1, 1, True, 4, 5)),
         ("70b-tp2 qkv M=16 (lost 1.30x)", 16, 5120, 8192, GemmConfig(16, 64, 256, 1, 1, True, 4, 5)),
         ("70b-tp2 qkv M=1 (lost 1.31x)", 1, 5120, 8192, GemmConfig(16, 64, 128, 1, 1, True, 4, 6))]


@triton.jit
def _global_ns():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _sm_id():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def probe_kernel(a_desc, b_desc, c_ptr, times_ptr, M, N, K, stride_c,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SWAP_AB: tl.constexpr, B_T: tl.constexpr,
                 PDL: tl.constexpr, EARLY_RELEASE: tl.constexpr):
    """matmul_kernel's whole-tile path (host descriptors, one K-loop a tile, masked stores) with a record a
    program: times_ptr[program] = (SM, start ns, after the wait ns, exit ns)."""
    program = tl.program_id(0)
    started = _global_ns()
    sm = _sm_id()
    wait_prior_grid(PDL)
    waited = _global_ns()
    if EARLY_RELEASE:
        release_dependents(PDL)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    for tile in tl.range(program, num_m * num_n, tl.num_programs(0)):
        pid_m, pid_n = grouped_tile(tile, num_m, num_n, 1)
        acc = k_loop(a_desc, b_desc, pid_m * BM, pid_n * BN, 0, K, M, N, K, 0, 0, BM, BN, BK, True, SWAP_AB, B_T,
                     "tf32")
        release_dependents(PDL)
        store_result(c_ptr, acc, pid_m * BM, pid_n * BN, M, N, stride_c, BM, BN, False)
    ended = _global_ns()
    record = times_ptr + program * 4
    tl.store(record, sm.to(tl.int64))
    tl.store(record + 1, started)
    tl.store(record + 2, waited)
    tl.store(record + 3, ended)


def _launch(a, w, c, times, config: GemmConfig, pdl: bool):
    """One probe launch of C = A @ W^T (W [N, K], nn.Linear's weight): the grid the GEMM core gives it."""
    (m, k), n = a.shape, w.shape[0]
    a_desc, b_desc = gemm.host_descriptors(config, a, w, True)
    grid = min(triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n), gemm.num_sms(a.device))
    probe_kernel[(grid,)](a_desc, b_desc, c, times, m, n, k, c.stride(0), BM=config.block_m, BN=config.block_n,
                          BK=config.block_k, SWAP_AB=config.swap_ab, B_T=True, PDL=pdl, EARLY_RELEASE=pdl,
                          num_warps=config.num_warps, num_stages=config.num_stages, launch_pdl=pdl)
    return grid


def _summary(records: torch.Tensor, grid: int) -> dict:
    """records [CALLS, grid, 4] (SM, start, after wait, exit) of one replay -> placement and timing facts."""
    r = records.tolist()
    most_on_one_sm, early = 0, 0
    waits, works = [], []
    for i, call in enumerate(r):
        counts: dict = {}
        for sm, start, waited, ended in call:
            counts[sm] = counts.get(sm, 0) + 1
            waits.append((waited - start) / 1e3)
            works.append((ended - waited) / 1e3)
        most_on_one_sm = max(most_on_one_sm, max(counts.values()))
        if i:
            before_end = max(p[3] for p in r[i - 1])
            early += sum(1 for p in call if p[1] < before_end)
    span = (max(p[3] for p in r[-1]) - min(p[1] for p in r[0])) / 1e3
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]
    return dict(us_per_call=span / len(r), most_programs_on_one_sm=most_on_one_sm,
                programs_started_before_the_launch_before_ended=early / max(1, len(r) - 1),
                wait_us_p10_p50_p90=[q(waits, 0.1), q(waits, 0.5), q(waits, 0.9)],
                work_us_p10_p50_p90=[q(works, 0.1), q(works, 0.5), q(works, 0.9)], programs=grid)


def probe_cell(name, m, n, k, config, device) -> dict:
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=g).bfloat16().to(device)
    weights = [(torch.randn(n, k, generator=g) * k ** -0.5).bfloat16().to(device) for _ in range(CALLS)]
    outs = [torch.empty(m, n, dtype=torch.bfloat16, device=device) for _ in range(CALLS)]
    reference = a.float() @ weights[0].float().t()
    found = {"cell": name, "m": m, "n": n, "k": k, "config": config.label, "weight_mb": n * k * 2 / 2 ** 20}
    for pdl in (False, True):
        times = torch.zeros(CALLS, gemm.num_sms(device), 4, dtype=torch.int64, device=device)
        grid = _launch(a, weights[0], outs[0], times[0], config, pdl)
        torch.cuda.synchronize()
        err = float((outs[0].float() - reference).norm() / reference.norm())
        if not err < 1e-2:
            found[f"pdl_{pdl}"] = {"error": f"relative error {err:.2e} against fp32: nothing timed"}
            continue
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in range(CALLS):
                _launch(a, weights[i], outs[i], times[i], config, pdl)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(CALLS):
                _launch(a, weights[i], outs[i], times[i], config, pdl)
        replays = []
        for _ in range(REPLAYS):
            graph.replay()
            torch.cuda.synchronize()
            replays.append(_summary(times[:, :grid].cpu(), grid))
        found[f"pdl_{pdl}"] = dict(rel_err=err, replays=replays,
                                   median_us_per_call=statistics.median(r["us_per_call"] for r in replays))
    return found


def compile_only() -> None:
    """The probe kernel built for sm_90 with PDL (no GPU needed): what a CPU test checks."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature = {"a_desc": "tensordesc<bf16[16, 128]>", "b_desc": "tensordesc<bf16[64, 128]>", "c_ptr": "*bf16",
                 "times_ptr": "*i64", "M": "i32", "N": "i32", "K": "i32", "stride_c": "i32",
                 "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "SWAP_AB": "constexpr", "B_T": "constexpr",
                 "PDL": "constexpr", "EARLY_RELEASE": "constexpr"}
    constexprs = {"BM": 16, "BN": 64, "BK": 128, "SWAP_AB": True, "B_T": True, "PDL": True, "EARLY_RELEASE": True}
    compiled = triton.compile(ASTSource(probe_kernel, signature, constexprs),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 5,
                                                                        "launch_pdl": True})
    ptx = compiled.asm["ptx"]
    for needed in ("%globaltimer", "%smid", "griddepcontrol.wait", "griddepcontrol.launch_dependents"):
        assert needed in ptx, f"{needed} missing from the probe's sm_90 build"
    print("probe_kernel builds for sm_90 with PDL: %globaltimer, %smid, griddepcontrol present")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--compile-only", action="store_true")
    args = parser.parse_args()
    if args.compile_only:
        compile_only()
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    results = []
    for name, m, n, k, config in CELLS:
        cell = probe_cell(name, m, n, k, config, device)
        results.append(cell)
        for state in ("pdl_False", "pdl_True"):
            s = cell[state]
            if "error" in s:
                print(f"{name:32s} {state}: {s['error']}")
                continue
            r = s["replays"][len(s["replays"]) // 2]
            print(f"{name:32s} {'PDL early' if state == 'pdl_True' else 'no PDL   '} {s['median_us_per_call']:.2f} us a call "
                  f"(rel err {s['rel_err']:.1e}); {r['programs']} programs, at most {r['most_programs_on_one_sm']} "
                  f"on one SM; {r['programs_started_before_the_launch_before_ended']:.0f} started before the launch "
                  f"before ended; wait p10/50/90 {', '.join(f'{x:.1f}' for x in r['wait_us_p10_p50_p90'])} us, "
                  f"work {', '.join(f'{x:.1f}' for x in r['work_us_p10_p50_p90'])} us")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"gpu": torch.cuda.get_device_name(device), "cells": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
