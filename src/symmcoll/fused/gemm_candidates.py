"""The configs ``symmcoll tune --op gemm`` measures for one shape (``candidates``): the untuned rule's
picks and their neighbours in the dimensions each regime cares about, the two-part tiles that make
whole waves (``two_part_candidates``), the deep pipelines of small products (``small_candidates``) and
the Gluon decode kernel's tiles (``gluon_candidates``).

Its own module because only the tune (bench/gemm_tune.py) and the compile checks ask it: the config
type, the rule and the split plans it builds on are gemm_configs.py's, the measured tables it feeds
gemm_tables.py's (see gemm_configs.py's docstring for the three parts).
"""

from __future__ import annotations

import math
from dataclasses import replace

from .gemm_configs import (MAX_SPLIT, SMEM_BUDGET, SMEM_BYTES, GemmConfig, SplitPlan, pow2_at_least, split_plan,
                           tiles_of, untuned_config)

# Deep-pipeline candidates above M = 512 where the tiles of 128x128 make at most this many waves.
DEEP_MAX_WAVES = 3
# Pipelines past SMEM_BUDGET, up to what a block may take (SMEM_BYTES), at M = 128-512: there the one-wave
# cells' time follows the operand bytes each SM keeps in flight (70b-tp2 qkv M = 128 on an H200: 64x128x64
# 42.4 us at 4 stages, 30.7 at 6, 29.1 at 8, 28.7 at 9; 70b-tp4 qkv M = 128: 64x64x128 18.2 us at 6
# stages, 17.4 at 7 -- results/2026-11-28-sum-apart-h200/deep-stages; slower at 70b gate_up, M = 128).
DEEP_STAGES = (GemmConfig(64, 128, 64, group_m=8, num_warps=4, num_stages=9),
               GemmConfig(64, 64, 128, group_m=8, num_warps=4, num_stages=7))


# Two-part tiles (GemmConfig.block_n2): (rows, warps, first part, second part) -- widths 80, 96, 144, 160,
# 192, 320 -- and the pipeline depths tried of each.
TWO_PART_TILES = ((64, 4, 64, 16), (64, 4, 64, 32), (64, 4, 128, 16), (64, 4, 128, 32), (64, 4, 128, 64),
                  (64, 4, 256, 64), (128, 8, 64, 16), (128, 8, 64, 32), (128, 8, 128, 16), (128, 8, 128, 32),
                  (128, 8, 128, 64), (128, 8, 256, 64))
TWO_PART_STAGES = (4, 6)
# A two-part tiling is a candidate where its tiles fill its last wave of SMs to at least this fraction,
# in at most TWO_PART_MAX_WAVES waves, with at most TWO_PART_MAX_WASTE of its columns past N.
TWO_PART_MIN_FILL = 0.9
TWO_PART_MAX_WAVES = 2
TWO_PART_MAX_WASTE = 0.05
# ... or in one wave that leaves at most a fifth of the SMs idle, with deeper pipelines: the tiling cuBLAS
# runs at the QKV cells we lost by 1.10-1.20x on one H100 (2026-11-27, results/2026-11-27-paired-qkv-h100/
# call2/qkv: nvjet 128x96 with 6 stages at 512x2560 and 256x5120, 64x96 with 8 at 256x2560 and 512x1280 --
# 108-112 tiles on 132 SMs, whole, no split), where 90% fill found no tiling and the wave split of 108
# tiles has no second part to give.
ONE_WAVE_MIN_FILL = 0.8
ONE_WAVE_STAGES = (4, 6, 8)


def wave_fill(tiles: int, programs: int) -> float:
    """How full the last wave of ``tiles`` tiles on ``programs`` programs is (1: whole waves)."""
    return tiles / (math.ceil(tiles / programs) * programs)


def two_part_candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """Tiles of a width no power of two is (two column parts) that cut (m, n) into whole waves of the
    SMs, or nearly: where the power-of-two tiles make ~1.2 waves (QKV of Llama-3-70B, N = 1280-5120 at
    M = 256-4096: 160 tiles of 128x128 on 132 SMs, whose split along K costs more than it saves on one
    H100) -- e.g. 512 x 2560 in 8 x 16 tiles of 64 x (128+32), or 4 x 32 of 128 x (64+16): 128 tiles.
    Where they are fewer than the SMs (M <= 512), whole in one wave of >= ONE_WAVE_MIN_FILL of the SMs
    (cuBLAS's 108 tiles of 128 x 96 at 512 x 2560), or wave-split along K into one wave
    (``two_part_split``). Only past decode (M > 64: there the swapped tiles read B) and for a long K (a
    k-loop to amortise the extra B load per k-step)."""
    if m <= 64 or k < 1024:
        return []
    found = []
    for bm, warps, bn, bn2 in TWO_PART_TILES:
        width = bn + bn2
        columns = math.ceil(n / width)
        tiles = math.ceil(m / bm) * columns
        if columns * width > n * (1 + TWO_PART_MAX_WASTE):
            continue
        one_wave = ONE_WAVE_MIN_FILL * sms <= tiles <= sms
        if one_wave or (tiles <= TWO_PART_MAX_WAVES * sms and wave_fill(tiles, sms) >= TWO_PART_MIN_FILL):
            split = 1
        else:
            split = two_part_split(bm, bn, bn2, tiles, m, k, sms)
        if split:
            depths = ONE_WAVE_STAGES if one_wave else TWO_PART_STAGES if split == 1 else TWO_PART_SPLIT_STAGES
            for stages in depths:
                found.append(GemmConfig(bm, bn, 64, group_m=8, split_k=split, num_warps=warps, num_stages=stages,
                                        block_n2=bn2).fitted(2, SMEM_BUDGET))
    return list(dict.fromkeys(found))


# Wave-split two-part tiles (M <= TWO_PART_SPLIT_MAX_M): tiles of at most this many fp32 accumulator values a
# thread (sm_90 ptxas, split at 256x5120x8192: 128 x (128+64) on 8 warps, 96 values, 178 registers; 128 x
# (256+64) and 64 x (256+64), 160 values, 255 registers and 72 bytes spilled).
TWO_PART_SPLIT_MAX_M = 512
TWO_PART_SPLIT_MAX_VALUES = 96
TWO_PART_MIN_PART_STEPS = 16
# Their pipelines: deep (fitted to shared memory), as B comes from DRAM at these M -- on one H100
# (2026-11-27 tune) 64x(128+32) ran 43.5 us at 6 stages against 45.9 at 4 (512x2560x8192), 42.4 against
# 48.8 (256x5120), 64x(64+16) 31.4 against 38.8 (256x2560).
TWO_PART_SPLIT_STAGES = (6, 8)


def two_part_split(bm: int, bn: int, bn2: int, tiles: int, m: int, k: int, sms: int) -> int:
    """Parts (>= 2; 0: none) of the wave split that makes ``tiles`` two-part tiles (fewer than the SMs) one
    wave, or nearly: (tile, part) units >= TWO_PART_MIN_FILL of the SMs and at most all of them -- where
    M <= 512 leaves too few rows for whole two-part tiles to fill the SMs (256 x 2560 in 32 tiles of
    128 x (128+32), 4 parts each: 128 units on 132 SMs; 512 x 2560 in 64 of them, 2 parts). Each part
    keeps >= TWO_PART_MIN_PART_STEPS k-steps of 64: a 128 x 160 fp32 partial moves as many bytes as ~2.2
    k-steps of loads, written by every part and read back, every part's, by the last."""
    warps = 8 if bm == 128 else 4
    if m > TWO_PART_SPLIT_MAX_M or tiles >= sms or bm * (bn + bn2) // (32 * warps) > TWO_PART_SPLIT_MAX_VALUES:
        return 0
    parts = sms // tiles
    if parts < 2 or tiles * parts < TWO_PART_MIN_FILL * sms or k // 64 < TWO_PART_MIN_PART_STEPS * parts:
        return 0
    return min(parts, MAX_SPLIT)


# Small products (M x N <= SMALL_MAX_OUTPUTS, 128 <= M, K <= SMALL_MAX_K: 1024^3 and its neighbours), where
# the H100 table's best of 25 candidates ran 1.21x cuBLAS at 1024^3 (8.0 us against 6.6; 2026-11-27) and every
# whole-tile candidate landed at 8.3-9.4 us whatever its shape (benchmarks/NOTES.md, "Issue 22: the GEMM
# core at 1024^3"). Each SM computes one or two tiles of 8-16 k-steps whose operands come from DRAM or a
# loaded L2; a program's load rate is then about (bytes its pipeline has in flight) / (load latency), and
# those candidates had 72-96 KB in flight. These keep up to ~192 KB in flight -- deeper pipelines of the
# one-wave tiles (64 x 128 and its transpose 128 x 64 with two warpgroups: 128 tiles at 1024^2), k-steps of
# 128, and two programs per SM of half that -- and 128 x 128 deeper for M = 2048 (128 tiles). Whole tiles
# only: a split tile's partials cost ~1.4 us a 64 KB slot here (the split candidates ran 11-20 us).
SMALL_MAX_OUTPUTS = 1 << 21
SMALL_MAX_K = 2048
# (block_m, block_n, block_k, warps, stages, programs per SM)
SMALL_TILES = ((64, 128, 64, 4, 6, 1), (64, 128, 64, 4, 8, 1), (64, 128, 128, 4, 4, 1), (64, 128, 64, 8, 8, 1),
               (128, 64, 64, 8, 4, 1), (128, 64, 64, 8, 6, 1), (128, 64, 64, 8, 8, 1), (128, 64, 128, 8, 4, 1),
               (64, 64, 128, 4, 6, 1), (64, 64, 64, 4, 8, 1), (64, 64, 64, 4, 12, 1),
               (64, 64, 128, 4, 3, 2), (64, 64, 64, 4, 6, 2), (128, 64, 64, 8, 4, 2),
               (128, 128, 64, 8, 6, 1))


def small_candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """SMALL_TILES where (m, n, k) is a small product: two programs per SM only where the tiles outnumber
    the SMs (else the launch is the one-program one); a tiling that gives some program two or more tiles
    comes flattened too (the next tile's loads under this one's epilogue)."""
    if not (128 <= m and m * n <= SMALL_MAX_OUTPUTS and k <= SMALL_MAX_K):
        return []
    found = []
    for bm, bn, bk, warps, stages, occupancy in SMALL_TILES:
        config = GemmConfig(bm, bn, bk, group_m=8, num_warps=warps, num_stages=stages, occupancy=occupancy)
        tiles = tiles_of(config, m, n)
        if occupancy > 1 and tiles <= sms:
            continue
        found.append(config)
        if tiles > sms * occupancy:
            found.append(replace(config, flatten=True))
    return found


# Split tiles' parts summed by a second kernel (GemmConfig.sum_apart) where a big tile is cut into many parts:
# the wave split in at least SUM_APART_MIN_PARTS parts -- at M = 65-512 the narrow-N QKV cells (128 x 1280 x
# 8192 ran 12.6 us against cuBLAS's 10.9 on one H200, 2026-11-28, as 40 tiles of 64 x 64 in 3 parts; 10 tiles
# of 128 x 128 in 13 parts load half the bytes per SM but ran 21 us, their last parts reading 13 partials of
# 64 KB each alone), past 512 the big tiles of a short last wave (2048 x 2304 x 16384: 144 tiles of 128 x 256,
# the last 12 in 11 parts, each tile's last part reading 11 partials of 128 KB alone: ~11 us at the ~64 bytes
# a cycle one SM loads from L2; 1.08-1.10x cuBLAS, 2026-11-28) -- and past M = 512 stream-K too (its ranges
# end anywhere, so a last wave of 28 tiles is shared evenly by 132 programs where the wave split gives 112
# parts of a quarter tile; with the sum apart any last wave may be shared, gemm_configs.stream_split; at
# M <= 512 every tile is in the one partial wave, which the wave split already cuts into a part a program),
# tiles of at least SUM_APART_MIN_TILE outputs (past M = 512 SUM_APART_BIG_TILE: a 64 x 128 partial, 32 KB,
# costs its last part ~0.25 us a slot; one program an SM: the tune's ~80 candidates a narrow-N cell stay ~90).
SUM_APART_MIN_TILE = 64 * 128
SUM_APART_BIG_TILE = 128 * 128
SUM_APART_MIN_PARTS = 6


def sum_apart_candidates(base: GemmConfig, m: int, tiles: int, k: int, programs: int) -> list[GemmConfig]:
    """``base`` split to sum apart where M is past decode and the tile big (see SUM_APART_MIN_TILE): the wave
    splits of at least SUM_APART_MIN_PARTS parts and, past M = 512, the stream-K plans (up to 16 programs a
    tile), one config a plan."""
    smallest = SUM_APART_MIN_TILE if m <= 512 else SUM_APART_BIG_TILE
    if m <= 64 or base.block_m * base.block_n < smallest or base.block_n2 or (m > 512 and base.occupancy > 1):
        return []
    found: dict = {}
    for cap, stream in ((4, False), (16, False)) + (((4, True), (16, True)) if m > 512 else ()):
        config = replace(base, split_k=cap, stream_k=stream, sum_apart=True)
        plan = split_plan(config, tiles, k, programs)
        if plan.shared and (plan.stream or plan.sharing >= SUM_APART_MIN_PARTS):
            found.setdefault(plan, config)
    return list(found.values())


# Decode tiles of gemm_gluon.py's kernel (GemmConfig.gluon: B's first k-steps loaded before the PDL wait):
# (k-step, stages) -- on one H200 (results/2026-11-29-gluon-h200) 256 x 5 stages won most decode cells it won,
# 128 x 10 a few (70b-tp8 gate_up M = 8, the o / down cells at M = 64) -- each whole (one program a column
# block) and, where the column blocks leave SMs idle, their k-steps split over the SMs (132 // blocks parts:
# 405b-tp8 qkv's 36 blocks in 3 parts, 3.68 TB/s at M = 1 against the core's 3.40).
GLUON_TILES = ((256, 5), (128, 10))
# ... and at 32-64 tokens, where A's tile takes a third to a half of each stage (64 tokens: 3 stages of 256 in 200 KB),
# A in a ring of its own depth (GemmConfig.a_stages; A's tiles come from L2) so that B keeps more k-steps in flight:
# (k-step, A's stages) -- 64 tokens: B 4 stages of 256 beside A's 2, or 9 of 128 beside A's 3. Not yet measured.
GLUON_A_RINGS = ((256, 2), (128, 3))


def gluon_candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """The Gluon decode kernel's configs at M <= 64 (its tokens tile, 16-64, on wgmma's narrow side), fitted to
    SMEM_BUDGET; none past decode."""
    if m > 64:
        return []
    blocks = math.ceil(n / 64)
    split = min(MAX_SPLIT, sms // blocks, max(1, k // 256))
    tiles = [(bk, stages, 0) for bk, stages in GLUON_TILES]
    if m > 16:
        tiles += [(bk, 16, a_stages) for bk, a_stages in GLUON_A_RINGS]  # (B's ring fitted to what is left)
    found = []
    for bk, stages, a_stages in tiles:
        for parts in dict.fromkeys((1, split if split >= 2 else 1)):
            found.append(GemmConfig(pow2_at_least(m, 16), 64, bk, group_m=1, split_k=parts, swap_ab=True, num_warps=4,
                                    num_stages=stages, gluon=True, a_stages=a_stages).fitted(2, SMEM_BUDGET))
    return found


def candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """What ``symmcoll tune --op gemm`` measures for one shape: the rule's picks and their neighbours in
    the dimensions each regime cares about (wave splits and stream-K where the last wave of tiles is
    partial, two programs per SM where shared memory and registers allow), and the two-part tiles that
    make whole waves (``two_part_candidates``): ~10-80 configs a shape."""
    bases: list[GemmConfig] = []
    if m <= 256:  # bound by reading B: tile widths, k-steps, pipeline depth, programs per SM
        bm = min(256, pow2_at_least(m, 16))
        for bn, bk in ((64, 128), (64, 256), (128, 128)):
            bases.append(GemmConfig(bm, bn, bk, group_m=1, swap_ab=True, num_warps=4 if bm <= 128 else 8,
                                    num_stages=6))
        bases.append(GemmConfig(bm, 64, 128, group_m=1, swap_ab=True, num_warps=4, num_stages=3, occupancy=2))
        bases.append(GemmConfig(min(bm, 64), 64, 128, group_m=1, num_warps=4, num_stages=5))
    if 64 < m <= 2048:  # few tiles a wave: every tile shape that stream-K can spread, two programs per SM
        for bm, bn, bk, warps, stages in ((64, 128, 64, 4, 4), (64, 256, 64, 4, 4), (128, 128, 64, 8, 4),
                                          (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 128, 8, 3)):
            bases.append(GemmConfig(bm, bn, bk, group_m=8, num_warps=warps, num_stages=stages))
        bases.append(GemmConfig(64, 64, 128, group_m=8, num_warps=4, num_stages=4, flatten=True))
        bases.append(GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=4, flatten=True))
        # one program's epilogue and pipeline fill under the other's main loop (no warp specialisation
        # on sm_90 in plain Triton 3.6: tl.range(warp_specialize=True) compiles to the same code there; Gluon's
        # gl.warp_specialize does lower -- benchmarks/gluon_ws_probe.py: 0.3-3.6% faster at large M, a probe)
        bases.append(GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3, occupancy=2))
        bases.append(GemmConfig(64, 128, 64, group_m=8, num_warps=4, num_stages=4, occupancy=2))
    if 128 <= m <= 512:
        # Where the 2026-11-27 H100 grid lost most (M = 256-512, N <= 8192, K >= 7168: 1.12-1.39x): a
        # whole 128x128 tile runs at 7.2 TFLOP/s on an SM when 20 SMs work, 5.4 when 112 do, while
        # cuBLAS reaches about the large-M rate of the whole GPU (~700 TFLOP/s). Here B is read once
        # or twice, so its k-steps come from DRAM (latency under load ~1.5-2 us) where at large M
        # they come from L2: 3-4 stages of ~0.35 us k-steps do not cover it. Deeper pipelines (up
        # to ~192 KB of shared memory, as CUTLASS's automatic stage count fills it) and tiles that
        # load less per flop (128x256, 256x128: a quarter less than 128x128). sm_90 ptxas: 113-234
        # registers, no spills (the swapped 256-token tile T256x128x64 spills 132-140 bytes when
        # split: not a candidate).
        for bm, bn, bk, warps, stages in ((128, 128, 64, 8, 5), (128, 128, 64, 8, 6), (128, 256, 64, 8, 4),
                                          (256, 128, 64, 8, 4), (64, 128, 64, 4, 6), (64, 128, 64, 4, 8),
                                          (64, 64, 128, 4, 6)):
            bases.append(GemmConfig(bm, bn, bk, group_m=8, num_warps=warps, num_stages=stages))
        bases.extend(DEEP_STAGES)
    if m > 512:  # compute-bound: the big tiles, their pipelines, the epilogue under the next tile's loads
        for bm, bn, bk, warps, stages in ((128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
                                          (128, 128, 128, 8, 3)):
            bases.append(GemmConfig(bm, bn, bk, group_m=8, num_warps=warps, num_stages=stages))
        if m >= 4096:
            bases.append(GemmConfig(128, 256, 64, group_m=16, num_warps=8, num_stages=3))
            bases.append(GemmConfig(128, 256, 64, group_m=16, num_warps=8, num_stages=3, flatten=True,
                                    tma_store=True))
        bases.append(GemmConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3, flatten=True, tma_store=True))
        bases.append(GemmConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3, tma_store=True))
        bases.append(GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=4, flatten=True, tma_store=True))
        bases.append(GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=3, occupancy=2))
    if 512 < m <= 4096 and k >= 4096 and m * n <= DEEP_MAX_WAVES * sms * 128 * 128:
        # The narrow-N cells (QKV at K = 8192: 1.19-1.28x on the round-5 H100 grid, 160 tiles of 128x128 or
        # of 128x256 a cell) are the M = 256-512 cells' regime: at most ~3 tiles per SM, so every k-step's B
        # comes from DRAM as often as from L2. At M = 512 the deeper pipelines won 9-15% on one H100
        # (gemm-round4-h100: 512x5120x8192 128x256 p3 92.8 -> p4 78.7 us whole, 128x128/s4 p4 77.0 -> p6
        # 69.8); at M > 512 they were never candidates.
        for bm, bn, bk, warps, stages, store in ((128, 128, 64, 8, 5, False), (128, 128, 64, 8, 6, False),
                                                 (128, 128, 64, 8, 5, True), (128, 256, 64, 8, 4, False),
                                                 (256, 128, 64, 8, 4, False)):
            bases.append(GemmConfig(bm, bn, bk, group_m=8, num_warps=warps, num_stages=stages, flatten=store,
                                    tma_store=store))
    found: list[GemmConfig] = [untuned_config(m, n, k, sms, split=False), untuned_config(m, n, k, sms)]
    for base in bases:
        base = base.fitted(2, _smem_limit(base))
        programs = sms * base.occupancy
        tiles = tiles_of(base, m, n)
        # caps of parts (wave split) and of programs (stream-K) per tile; only splits that differ run.
        # Cap 2 (mid M, tiles of >= 64 KB partials): each part's partial read back costs more than
        # PART_OVERHEAD says (2026-11-27 H100: ~1.4 us per 64 KB slot), so two parts may beat the
        # three or four the rule picks.
        # (Stream-K with the last full wave shared too: slower than the tile unsplit in 251 of 287
        # pairs on one H100, 2026-11-27; no longer a candidate.)
        plans = {SplitPlan(tiles): replace(base, split_k=1)}
        # (cap 2 last: where its plan is another cap's, that cap's label stays the one measured)
        two_parts = 128 <= m <= 512 and base.block_m * base.block_n >= 128 * 128
        for cap, stream in ((4, False), (16, False), (4, True), (16, True)) + (((2, False),) if two_parts else ()):
            config = replace(base, split_k=cap, stream_k=stream)
            plans.setdefault(split_plan(config, tiles, k, programs), config)
        found.extend(plans.values())
        found.extend(sum_apart_candidates(base, m, tiles, k, programs))
    found.extend(two_part_candidates(m, n, k, sms))  # (whole, or wave-split where under one wave)
    found.extend(small_candidates(m, n, k, sms))  # (whole tiles only)
    found.extend(gluon_candidates(m, n, k, sms))  # (the plain matmul's; the Triton core's tile elsewhere)
    unique = list(dict.fromkeys(found))
    return [c for c in unique if c.smem_bytes(2) <= _smem_limit(c) // c.occupancy]


def _smem_limit(config: GemmConfig) -> int:
    """The shared memory a candidate's pipeline may take: SMEM_BYTES for DEEP_STAGES' pipelines (split or
    not), SMEM_BUDGET for every other."""
    whole = replace(config, split_k=1, stream_k=False, split_wave=False, sum_apart=False)
    return SMEM_BYTES if whole in DEEP_STAGES else SMEM_BUDGET
