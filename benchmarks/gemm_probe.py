"""The persistent GEMM alone (one GPU) against cuBLAS, at the all-gather + matmul shapes of issue 14.

    PYTHONPATH=src python3 benchmarks/gemm_probe.py --out $OUT/gemm_probe.json

For every (M, N, K) and tile config: check against torch.matmul (relative error of the bf16 result
against an fp32 reference; nothing is timed unless it matches), then time with CUDA events
(triton.testing.do_bench, median). TMA = device-side tensor descriptors, ptr = masked pointer loads.
Picks fused/gemm.py's GPU_GEMM; the fused ops' tile loops are built on the same kernel.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from symmcoll.fused import gemm

SHAPES = [(16384, 8192, 8192), (16384, 6656, 16384), (16384, 3584, 8192), (4096, 8192, 8192),
          (1024, 8192, 8192), (1024, 1024, 1024), (256, 8192, 8192)]
CONFIGS = [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4), (128, 128, 64, 8, 8, 4),
           (128, 128, 128, 8, 8, 3), (256, 128, 64, 8, 8, 3), (64, 256, 64, 8, 4, 4), (64, 128, 64, 8, 4, 4)]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.float() - ref).norm() / ref.norm())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", type=int, default=len(SHAPES))
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for M, N, K in SHAPES[: args.shapes]:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16) / K ** 0.5
        ref = a.float() @ b.float()
        flops = 2 * M * N * K
        cublas_out = torch.matmul(a, b)
        cublas_us = triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100, return_mode="median") * 1e3
        row = {"M": M, "N": N, "K": K, "impl": "cublas", "us": cublas_us, "tflops": flops / cublas_us / 1e6,
               "rel_err": rel_err(cublas_out, ref)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        for cfg in CONFIGS:
            for use_tma in (True, False):
                saved = gemm.tma_ok
                if not use_tma:
                    gemm.tma_ok = lambda *t: False
                try:
                    out = gemm.matmul(a, b, config=cfg)
                    torch.cuda.synchronize()
                    err = rel_err(out, ref)
                    us = None
                    if err < 1e-2:
                        us = triton.testing.do_bench(lambda: gemm.matmul(a, b, out=out, config=cfg), warmup=25,
                                                     rep=100, return_mode="median") * 1e3
                    row = {"M": M, "N": N, "K": K, "impl": "tma" if use_tma else "ptr", "config": cfg, "us": us,
                           "tflops": flops / us / 1e6 if us else None, "rel_err": err,
                           "vs_cublas": us / cublas_us if us else None}
                except Exception as exc:  # noqa: BLE001 - a config that does not compile is a finding
                    row = {"M": M, "N": N, "K": K, "impl": "tma" if use_tma else "ptr", "config": cfg,
                           "error": f"{type(exc).__name__}: {exc}"[:300]}
                finally:
                    gemm.tma_ok = saved
                rows.append(row)
                print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=0)
    print("best per shape (us, x cuBLAS):")
    for M, N, K in SHAPES[: args.shapes]:
        mine = [r for r in rows if (r["M"], r["N"], r["K"]) == (M, N, K) and r.get("us") and r["impl"] != "cublas"]
        cub = next(r for r in rows if (r["M"], r["N"], r["K"]) == (M, N, K) and r["impl"] == "cublas")
        best = min(mine, key=lambda r: r["us"], default=None)
        if best:
            print(f"{M}x{N}x{K}: cublas {cub['us']:.1f} us ({cub['tflops']:.0f} TF/s), ours {best['us']:.1f} "
                  f"({best['tflops']:.0f} TF/s, {best['vs_cublas']:.3f}x) {best['impl']} {best['config']}")


if __name__ == "__main__":
    main()
