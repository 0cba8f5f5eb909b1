"""The docs/results.md table of a GEMM grid result (``symmcoll bench --op gemm``'s JSON): ours / cuBLAS per
(layer, M), the summary line and the decode weight-read rates.

    python3 benchmarks/gemm_markdown.py benchmarks/results/<run>/gemm-<gpu>-bf16-*.json
"""

from __future__ import annotations

import json
import sys

from symmcoll.bench import cublas_kernels
from symmcoll.bench.gemm import SHOW_CUBLAS_ABOVE, decided_ratio


def markdown(path: str) -> str:
    data = json.loads(open(path).read())
    rows, summary, prov = data["rows"], data["summary"], data["provenance"]
    ms = sorted({r["m"] for r in rows})
    layers = list(dict.fromkeys((r["shape"], r["n"], r["k"]) for r in rows))
    cell = {(r["shape"], r["m"]): r for r in rows}
    out = [f"**one {prov['gpu']}** (`{path}`, git {str(prov['git'])[:10]}, torch {prov['torch']}, "
           f"triton {prov['triton']}): time / cuBLAS time ({summary.get('ratio', 'median over median')}), bf16, "
           f"CUDA-graph replays; geomean "
           f"**{summary['geomean_ratio']:.3f}**, worst {summary['worst_ratio']:.2f} ({summary['worst_cell']}), "
           f"{summary['above_1_10']} of {summary['cells']} cells above 1.10x, {summary['wrong']} wrong.", "",
           "| layer (N, K) | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
    for shape, n, k in layers:
        out.append(f"| {shape} ({n}, {k}) | "
                   + " | ".join(f"{decided_ratio(cell[(shape, m)]):.2f}" if (shape, m) in cell else "-" for m in ms) + " |")
    decode = [r for r in rows if r["m"] <= 64 and r["weight_mb"] >= 32]
    if decode:
        out += ["", f"Weight-read rate at M <= 64 for B >= 32 MB: ours {min(r['weight_tbs'] for r in decode):.2f}-"
                f"{max(r['weight_tbs'] for r in decode):.2f} TB/s, cuBLAS {min(r['cublas_weight_tbs'] for r in decode):.2f}-"
                f"{max(r['cublas_weight_tbs'] for r in decode):.2f} TB/s ({sum(r['weight_tbs'] >= 3.6 for r in decode)} "
                f"of {len(decode)} cells at >= 3.6 TB/s)."]
    return "\n".join(out + beside_cublas(rows))


def beside_cublas(rows: list[dict]) -> list[str]:
    """The cells slower than SHOW_CUBLAS_ABOVE x cuBLAS whose rows name cuBLAS's kernels: our config beside
    what cuBLAS's kernel name says (tile in torch's M x N x K, stages, cluster, split), worst first."""
    slow = sorted((r for r in rows if "ratio" in r and r.get("cublas_kernels") and decided_ratio(r) > SHOW_CUBLAS_ABOVE),
                  key=lambda r: -decided_ratio(r))
    if not slow:
        return []
    out = ["", f"Cells above {SHOW_CUBLAS_ABOVE:.2f}x: our config beside cuBLAS's kernel (its name read by "
               f"`bench/cublas_kernels.py`; tile as torch's M x N x K).", "",
           "| layer | M | ours / cuBLAS | ours | cuBLAS | cuBLAS kernels (share of its time) |", "|---|---|---|---|---|---|"]
    for r in slow:
        shares = r.get("cublas_kernel_shares") or [None] * len(r["cublas_kernels"])
        names = "; ".join(f"`{name[:80]}`" + (f" {share * 100:.0f}%" if share is not None and len(shares) > 1 else "")
                          for name, share in zip(r["cublas_kernels"], shares))
        out.append(f"| {r['shape']} ({r['n']}, {r['k']}) | {r['m']} | {decided_ratio(r):.3f} | {r['config']} | "
                   f"{cublas_kernels.describe(r)} | {names} |")
    return out


if __name__ == "__main__":
    print("\n\n".join(markdown(p) for p in sys.argv[1:]))
