"""What the fused matmul_reduce_scatter kernel's exchange compiles to on sm_90, on a CPU machine: for
each M (x 8192 x 7168 a rank, 4 ranks, the H100 GEMM table) the launches (pieces, grid, tile), registers
and spilled bytes (ptxas), and the SASS of its peer traffic: 16-byte global stores, system-scope fences
(MEMBAR.ALL.SYS: one per peer tile sent, others in the give-up path), 64-bit CAS polls, spill
stores/loads. benchmarks/NOTES.md, "matmul_reduce_scatter fused at world size 4 (2026-11-27, seventh stop)".

    PYTHONPATH=src python3 benchmarks/mrs_exchange_census.py 16 128 512 8192 [--world 1]
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import kernel_specs  # noqa: E402
from symmcoll import launcher, plan  # noqa: E402
from symmcoll.fused import matmul_reduce_scatter as mrs  # noqa: E402

NVDISASM = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
SASS_COUNTS = {"STG.E.128 (16-byte stores)": r"STG\.E\.128", "STG.E (4-byte stores)": r"STG\.E ",
               "MEMBAR.ALL.SYS": r"MEMBAR\.ALL\.SYS", "ATOMG CAS.64 (flag polls)": r"ATOMG\.E\.CAS\.64",
               "LDG.E.128": r"LDG\.E\.128", "STL (spill stores)": r"\bSTL", "LDL (spill loads)": r"\bLDL"}


def recorded(world: int, m: int, n: int, k: int):
    with kernel_specs.h100_tables():
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((k, n), dtype=torch.bfloat16, device="meta")
        out = torch.empty((m // world, n), dtype=torch.bfloat16, device="meta")
        request = plan.Request(mrs.OP, (m, k), torch.bfloat16, torch.device("cuda"),
                               others=(((k, n), torch.bfloat16, a.device),))
        rank = 1 if world > 1 else 0
        p = plan.Plan(request, "kernel", plan.algorithms(mrs.OP)["fused"], None, world, rank,
                      kernel_specs.FakeWorkspace(world, rank), None, 3, (m // world, n))
        with launcher.recording() as launches:
            mrs._fused(p, a, out, b)
    return launches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("m", type=int, nargs="+")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=28672, help="the whole layer's K (a rank has K / world)")
    args = parser.parse_args()
    for m in args.m:
        launches = recorded(args.world, m, args.n, args.k // args.world)
        meta = launches[0].meta
        compiled = kernel_specs.compile_specialised(launches[0])
        registers, spilled = kernel_specs.ptxas_usage(compiled.asm["ptx"])
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "k.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            sass = subprocess.run([str(NVDISASM), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
        counts = ", ".join(f"{name} {len(re.findall(pattern, sass))}" for name, pattern in SASS_COUNTS.items())
        print(f"M={m} ws{args.world}: {len(launches)} launch(es), grid {[r.grid[0] for r in launches]}, "
              f"tile {meta['BM']}x{meta['BN']}x{meta['BK']} w{meta['num_warps']} s{meta['num_stages']} "
              f"one_pass={meta['ONE_PASS']}: {registers} registers, {spilled} B spilled, "
              f"{compiled.metadata.shared} B shared\n    SASS: {counts}")


if __name__ == "__main__":
    main()
