"""One-off probe, no GPU: compile the GEMM core's tune candidates for sm_90 on this machine and print
what decides whether one is worth GPU time -- registers per thread (ptxas), spills, shared memory, the
wgmma count in the PTX, and whether two programs fit one SM (registers and shared memory).

    PYTHONPATH=src python3 benchmarks/gemm_compile_probe.py 256x5120x8192 1024x2304x16384
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton

from symmcoll import launcher
from symmcoll.fused import gemm
from symmcoll.fused.gemm_candidates import candidates

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import kernel_specs  # noqa: E402  (the compile checks' launch -> signature mapping)

REGISTERS_PER_SM = 65536


def probe(m: int, n: int, k: int) -> None:
    seen = set()
    for config in candidates(m, n, k, 132):
        with launcher.recording() as recorded:
            a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
            b = torch.empty((k, n), dtype=torch.bfloat16, device="meta")
            gemm.matmul(a, b, config=config, programs=132 * config.occupancy)
        spec = kernel_specs.spec_of(recorded[0])
        if spec in seen:
            continue
        seen.add(spec)
        # specialised as the GPU's runtime does (aligned tensors, multiples of 16): without it the stores
        # and partial loads are scalar and the register counts are not the GPU's (e.g. the wave split
        # of 128x128x64 w8 p4: 134 registers, not 126)
        compiled = kernel_specs.compile_specialised(recorded[0])
        ptx = compiled.asm["ptx"]
        regs, spills = kernel_specs.ptxas_usage(ptx)
        threads = 32 * config.num_warps
        fits = regs * threads * config.occupancy <= REGISTERS_PER_SM and \
            compiled.metadata.shared * config.occupancy <= kernel_specs.SHARED_MEMORY_LIMIT
        split = dict(spec.constexprs)["SPLIT"]
        print(f"{m}x{n}x{k} {config.label:<32} split={int(split)} regs {regs:3d} spills {spills:4d} "
              f"smem {compiled.metadata.shared // 1024:3d} KB wgmma {ptx.count('wgmma.mma_async'):2d}"
              f"{'' if fits else '  DOES NOT FIT ' + str(config.occupancy) + ' per SM'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="+", help="MxNxK")
    for cell in parser.parse_args().cells:
        probe(*map(int, cell.split("x")))


if __name__ == "__main__":
    main()
