"""Experiment (issue 22, 2026-11-28): one more pipeline stage than the 200 KB budget allows, on the
one-wave cells whose best config is at that budget.

Why: 70b-tp2 qkv at M = 128 (N 5120, K 8192: 80 tiles of 64 x 128 on 132 SMs) ran 42.4 us with 4 stages,
30.7 with 6, 29.1 with 8 (192 KB of operands in flight per SM; cuBLAS 26.0-26.9, 13 stages of 64 x 64
tiles): the time follows the bytes each SM keeps in flight. gemm_configs.SMEM_BYTES (200 KB: the
227 KB a Hopper block may use, less room for the epilogue's layout conversion) stops at 8. Here it is
raised to 227 KB, so 64 x 128 x 64 keeps 9 stages (216 KB) and 64 x 64 x 128 7 (224 KB) -- where Triton
compiles them -- timed beside the table's config and cuBLAS (benchmarks/streamk_all_tiles.run_probe).

    python3 benchmarks/gemm_deep_stages.py --out $OUT/deep.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from streamk_all_tiles import run_probe  # noqa: E402

from symmcoll.fused import gemm_configs  # noqa: E402
from symmcoll.fused.gemm_configs import GemmConfig  # noqa: E402

CELLS = [("70b-tp2 qkv", 128, 5120, 8192), ("70b-tp4 qkv", 128, 2560, 8192), ("70b-tp8 qkv", 128, 1280, 8192),
         ("70b-tp8 qkv", 256, 1280, 8192), ("70b-tp8 gate_up", 128, 7168, 8192), ("70b-tp4 gate_up", 128, 14336, 8192),
         ("70b-tp2 qkv", 256, 5120, 8192), ("405b-tp8 qkv", 128, 2304, 16384)]


def candidates(cell) -> list[GemmConfig]:
    found = []
    for split in (1, 4):
        found += [GemmConfig(64, 128, 64, 8, split, num_warps=4, num_stages=stages) for stages in (8, 9)]
        found += [GemmConfig(64, 64, 128, 8, split, num_warps=4, num_stages=stages) for stages in (6, 7)]
    found += [GemmConfig(64, 128, 64, 8, 16, num_warps=4, num_stages=stages, sum_apart=True) for stages in (8, 9)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args()
    gemm_configs.SMEM_BYTES = 227 * 1024  # (read by GemmConfig.fitted at each call)
    run_probe(CELLS, candidates, args.out, args.replays)


if __name__ == "__main__":
    main()
