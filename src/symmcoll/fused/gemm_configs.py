"""Which tile config the GEMM core runs for a problem: the one config type, the measured tables, the
untuned rule, and the candidates ``symmcoll tune --op gemm`` measures.

``gemm_config(M, N, K, dtype, device, split=True)`` answers from the table measured on this GPU model
(``data/gemm_<gpu>.json``, written by ``symmcoll tune --op gemm``) when it holds the (N, K) shape,
else from ``untuned_config``, a rule that follows from what bounds each regime:

* decode (M <= 64): the product is bound by reading B (K x N weights). The token count is the narrow
  side of the tile (``swap_ab``: C^T = B^T A^T, so B's columns fill the tensor core's 64-row side and
  the tokens its 8..256-wide side), B's columns are cut into narrow column tiles.
* mid M (<= 512): 64-row tiles (one warpgroup's wgmma).
* large M: 128 x 256 tiles, grouped order, persistent over the SMs (compute-bound); where they would
  not fill one wave of the SMs and no split along a long K can share them, smaller tiles that do
  (``FILLING_TILES``: 1024^3 runs 256 tiles of 64 x 64, not 32 of 128 x 256).

In every regime the tiles of the last, partial wave (all tiles, where they are fewer than the
programs) may be split along K so that no SM idles while a few finish the product; the parts of a tile
are summed by the last program to finish, in a fixed order. Two ways, a config says which
(``split_plan``):

* the wave split (``wave_split``, the default): each of those tiles cut into the same number of
  whole parts, one program each (part 0 of every tile first, then part 1, ...);
* stream-K (``stream_k``, ``stream_split``): their k-steps laid end to end and cut into one contiguous
  range per program. Measured on one H100 (2026-11-27, 836 pairs of the same tile with and without
  it): faster where those tiles fill at most a third of the programs (median 0.82x), slower beyond
  (median 1.20x), so it shares only there.

Fused ops ask with ``split=False``: their tiles are messages to peers the moment they are finished,
which a split tile never is in one program.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent.parent / "data"
# Shared memory a Hopper block may use (227 KB), less what the epilogue's layout conversion needs.
SMEM_BYTES = 200 * 1024
# Split-K completion counters per stream (a split config is used only where tiles are fewer).
MAX_SPLIT_TILES = 4096
MAX_SPLIT = 16


@dataclass(frozen=True)
class GemmConfig:
    """One GEMM tile config. ``block_m`` rows of A (tokens) by ``block_n`` columns of B per tile,
    ``block_k`` deep per step; ``swap_ab`` computes the tile transposed (tokens on the tensor core's
    narrow side); ``group_m`` row blocks sweep the columns together (L2 reuse of B); ``occupancy``
    persistent programs per SM (two hide more memory latency where shared memory allows);
    ``split_k``: the tiles of the last, partial wave of tiles (the tiles that would leave SMs idle;
    all tiles when they are fewer than the programs) are cut into at most this many parts each (the
    wave split, ``wave_split``), or, with ``stream_k``, shared by on average at most this many
    programs each (``stream_split``); ``split_wave`` (stream-K only): the last full wave joins that
    partial wave; ``flatten`` pipelines the next tile's loads under this tile's epilogue;
    ``tma_store`` writes C through a tensor descriptor (asynchronous, staged in shared memory);
    ``block_n2`` (0: off) a second column part: tiles ``block_n + block_n2`` columns wide (``tile_n``,
    e.g. 128 + 32 = 160: N = 2560 in 16 column blocks, so 512 x 2560 makes 128 tiles of 64 rows -- one
    wave on 132 SMs), computed as two accumulators from one A block per k-step. Two-part tiles are
    whole or wave-split (``split_k``; no stream-K), straight (no swap) and stored by masked stores (no
    tma_store)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    split_k: int = 1
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 3
    occupancy: int = 1
    flatten: bool = False
    tma_store: bool = False
    split_wave: bool = False
    stream_k: bool = False
    block_n2: int = 0

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {value}")
        if not 1 <= self.split_k <= MAX_SPLIT:
            raise ValueError(f"split_k must be in [1, {MAX_SPLIT}], got {self.split_k}")
        if self.occupancy not in (1, 2):
            raise ValueError(f"occupancy must be 1 or 2, got {self.occupancy}")
        if self.split_wave and not self.stream_k:
            raise ValueError("split_wave shares the last full wave by stream-K: it needs stream_k")
        if self.block_n2:
            if self.block_n2 < 16 or self.block_n2 & (self.block_n2 - 1) or self.block_n2 >= self.block_n:
                raise ValueError(f"block_n2 must be 0 or a power of two >= 16 below block_n ({self.block_n}): "
                                 f"got {self.block_n2}")
            # (split_k > 1 is the wave split: whole tiles' parts; stream-K's ranges cross tiles)
            unsupported = [name for name, on in (("stream_k", self.stream_k), ("split_wave", self.split_wave),
                                                 ("swap_ab", self.swap_ab), ("tma_store", self.tma_store)) if on]
            if unsupported:
                raise ValueError(f"a two-part tile (block_n2={self.block_n2}) is whole or wave-split, straight and "
                                 f"stored by masked stores: {', '.join(unsupported)} not supported")

    def meta(self) -> dict:
        """The kernel's constexprs and launch options (split_k is a runtime argument)."""
        return dict(BM=self.block_m, BN=self.block_n, BK=self.block_k, GROUP_M=self.group_m, SWAP_AB=self.swap_ab,
                    num_warps=self.num_warps, num_stages=self.num_stages)

    @property
    def tile_n(self) -> int:
        """Columns of C a tile covers: ``block_n``, plus ``block_n2`` for a two-part tile."""
        return self.block_n + self.block_n2

    @property
    def c_halves(self) -> int:
        """Pieces C's tile is stored in through its tensor descriptor: tiles 256 columns wide go in two
        halves of 128 (Triton tutorial 09's epilogue subtiling), so the staging buffer is half the
        tile and 128x256x64 keeps three stages beside it (a whole 64 KB tile pushed it to two)."""
        return 2 if self.tma_store and self.block_n >= 256 else 1

    def smem_bytes(self, itemsize: int) -> int:
        staged_c = self.block_m * self.block_n * itemsize // self.c_halves if self.tma_store else 0
        return self.num_stages * (self.block_m + self.tile_n) * self.block_k * itemsize + staged_c

    def for_itemsize(self, itemsize: int) -> GemmConfig:
        """4-byte operands: half the k-step, so the pipeline fits (then ``fitted``)."""
        config = replace(self, block_k=max(16, self.block_k // 2)) if itemsize > 2 else self
        return config.fitted(itemsize)

    def fitted(self, itemsize: int) -> GemmConfig:
        """The same with fewer pipeline stages where its buffers would not fit shared memory."""
        config = self
        while config.num_stages > 2 and config.smem_bytes(itemsize) > SMEM_BYTES:
            config = replace(config, num_stages=config.num_stages - 1)
        return config

    @property
    def label(self) -> str:
        return (f"{'T' if self.swap_ab else 'N'}{self.block_m}x{self.block_n}"
                f"{f'+{self.block_n2}' if self.block_n2 else ''}x{self.block_k}"
                f"/g{self.group_m}/s{'k' if self.stream_k else ''}{self.split_k}{'+' if self.split_wave else ''}"
                f"/w{self.num_warps}"
                f"/p{self.num_stages}"
                f"{'/o2' if self.occupancy == 2 else ''}{'/f' if self.flatten else ''}{'/t' if self.tma_store else ''}")

    def as_list(self) -> list:
        """Every field, in order; ``block_n2`` (the 14th) only where it is set, so the tables written before
        two-part tiles stay as they are (``from_list``: no 14th field, one part)."""
        return [self.block_m, self.block_n, self.block_k, self.group_m, self.split_k, int(self.swap_ab),
                self.num_warps, self.num_stages, self.occupancy, int(self.flatten), int(self.tma_store),
                int(self.split_wave), int(self.stream_k)] + ([self.block_n2] if self.block_n2 else [])

    @staticmethod
    def from_list(values) -> GemmConfig:
        """The inverse of ``as_list``. Older tables' shorter lists mean what they meant when measured:
        up to 11 fields (before stream-K existed) a split is the wave split; 12 fields (written by
        the tune of git 50c1510, where every split was stream-K) a split is stream-K; up to 13 fields
        (before two-part tiles) a tile has one part (block_n2 = 0)."""
        bm, bn, bk, group, split, swap, warps, stages, *rest = values
        if len(rest) == 4:  # (occupancy, flatten, tma_store, split_wave): the 50c1510 format
            rest = [*rest, int(split > 1)]
        defaults = [1, 0, 0, 0, 0, 0]
        occupancy, flatten, tma_store, split_wave, stream_k, block_n2 = (list(rest) + defaults[len(rest):])[:6]
        return GemmConfig(bm, bn, bk, group, split, bool(swap), warps, stages, occupancy, bool(flatten),
                          bool(tma_store), bool(split_wave), bool(stream_k), block_n2)


# Under the interpreter every program costs ~0.7 ms: small tiles, few programs (tests pick others).
CPU_CONFIG = GemmConfig(32, 32, 32, group_m=4, num_warps=4, num_stages=1)


def _pow2_at_least(x: int, floor: int) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(1, x)))))


def tiles_of(config: GemmConfig, m: int, n: int) -> int:
    return math.ceil(m / config.block_m) * math.ceil(n / config.tile_n)


# Fewest k-steps of one program's range of shared k-steps.
MIN_PART_STEPS = 2


def share_cost(config: GemmConfig, steps: int, parts: float) -> float:
    """What sharing a tile of ``steps`` k-steps in ``parts`` parts costs a program, as a fraction of a
    whole tile's time: its fp32 partial written and, when it finishes last, the tile's parts read
    back -- traffic that nothing overlaps, counted as the k-steps whose operand loads move as many
    bytes (a 128 x 128 partial: 2 k-steps of 64; a 16 x 64 one: 0.2 of a k-step of 128)."""
    partial = config.block_m * config.block_n * 4
    step_loads = (config.block_m + config.block_n) * config.block_k * 2
    return (1 + parts) * partial / step_loads / steps


@dataclass(frozen=True)
class SplitPlan:
    """How a launch splits tiles along K: tiles [0, whole_tiles) are computed whole (full waves,
    round-robin over the programs); the other tiles are shared -- by stream-K (``stream``): their
    k-steps, laid end to end, cut into ``sharing`` contiguous ranges as even as whole k-steps allow
    (programs 0 .. sharing-1 take one each); by the wave split: each cut into ``sharing`` equal parts
    of whole k-steps, the parts round-robin over the programs, part-major (gemm_split.wave_part: no
    tile finished before the last round). A shared tile's parts fill at most
    ``slots`` partial slots."""

    whole_tiles: int
    sharing: int = 0
    slots: int = 1
    stream: bool = False

    @property
    def shared(self) -> bool:
        return self.sharing > 0


# What one part of a wave-split tile costs beyond its share of the tile's k-steps (pipeline fill and
# drain, its partial written and read back), as a fraction of a whole tile's time.
PART_OVERHEAD = 0.05


def wave_split(config: GemmConfig, tiles: int, k: int, programs: int) -> SplitPlan:
    """The full waves whole; the last, partial wave's tiles cut into the number of parts (at most
    ``config.split_k``, each >= 2 k-steps) that finishes them soonest: rounds of parts over the
    programs, each part 1/parts of a tile plus PART_OVERHEAD (the rule every table entry before
    stream-K was measured under)."""
    full = tiles // programs * programs
    tail = tiles - full
    if config.split_k == 1 or tail == 0 or tail > MAX_SPLIT_TILES:
        return SplitPlan(tiles)
    best, best_cost = 1, 1.0
    for parts in range(2, min(config.split_k, math.ceil(k / config.block_k) // 2) + 1):
        cost = math.ceil(tail * parts / programs) * (1 / parts + PART_OVERHEAD)
        if cost < best_cost - 1e-9:
            best, best_cost = parts, cost
    return SplitPlan(tiles) if best == 1 else SplitPlan(full, best, best)


# Stream-K shares only where the partial wave's tiles are at most this fraction of the programs: on
# one H100 (benchmarks/results/2026-11-27-gemm-streamk-h100, every candidate of 70 cells against the
# same tile unsplit) stream-K was faster in 344 of 448 pairs there (median 0.82x) and slower in 307
# of 388 beyond (median 1.20x), though share_cost said it would pay nearly everywhere.
STREAM_K_MAX_TAIL = 1 / 3


def stream_split(config: GemmConfig, tiles: int, k: int, programs: int,
                 max_tail: float = STREAM_K_MAX_TAIL) -> SplitPlan:
    """The full waves whole; the last, partial wave's tiles (with the last full wave too if
    ``config.split_wave``) shared along K by at most ``programs`` programs, about ``config.split_k``
    per tile, each >= MIN_PART_STEPS k-steps -- where the partial wave is at most ``max_tail`` of the
    programs and sharing finishes sooner than computing them whole: a share of shared/SMs tiles plus
    ``share_cost`` against one more round of whole tiles per SM."""
    waves, tail = divmod(tiles, programs)
    if config.split_k == 1 or tail == 0 or tail > max_tail * programs:
        return SplitPlan(tiles)
    shared = tail + (programs if config.split_wave and waves else 0)
    steps = math.ceil(k / config.block_k)
    sharing = min(programs, shared * config.split_k, shared * steps // MIN_PART_STEPS)
    sms = max(1, programs // config.occupancy)  # (two programs on one SM share its throughput)
    if sharing == 0 or shared > MAX_SPLIT_TILES or shared / min(sharing, sms) + share_cost(
            config, steps, sharing / shared + 1) >= math.ceil(shared / sms) - 1e-9:
        return SplitPlan(tiles)
    least = shared * steps // sharing  # the shortest range; a tile meets at most this many ranges:
    return SplitPlan(tiles - shared, sharing, math.ceil(steps / least) + 1, stream=True)


def split_plan(config: GemmConfig, tiles: int, k: int, programs: int) -> SplitPlan:
    """The plan ``config`` runs ``tiles`` tiles of depth ``k`` with on ``programs`` programs."""
    return (stream_split if config.stream_k else wave_split)(config, tiles, k, programs)


def untuned_config(m: int, n: int, k: int, sms: int = 132, split: bool = True) -> GemmConfig:
    """The rule for shapes no table holds (bf16/fp16 operands; see the module docstring). Up to 256
    rows one row block covers every token, so B is read once."""
    if m <= 128:
        config = GemmConfig(_pow2_at_least(m, 16), 64, 128, group_m=1, swap_ab=True, num_warps=4,
                            num_stages=5 if m <= 64 else 4)
    elif m <= 256:
        config = GemmConfig(256, 64, 64, group_m=1, swap_ab=True, num_warps=8, num_stages=4)
    else:
        config = _filling_tile(m, n, k, sms, split)
    return replace(config, split_k=8 if m <= 2048 else 4) if split else config


# Deep-pipeline candidates above M = 512 where the tiles of 128x128 make at most this many waves.
DEEP_MAX_WAVES = 3

# Tiles of the compute-bound regime, largest first: each loads less per flop than the next, which
# gives the SMs more tiles. The last is the H200 table's pick at 1024^3 (64 x 64 x 128, flattened:
# 7.9 us, where 128 x 256 without a split ran 32 tiles on 132 SMs).
FILLING_TILES = (GemmConfig(128, 256, 64, group_m=8, num_warps=8, num_stages=3),
                 GemmConfig(128, 128, 64, group_m=8, num_warps=8, num_stages=4),
                 GemmConfig(64, 128, 64, group_m=8, num_warps=4, num_stages=4),
                 GemmConfig(64, 64, 128, group_m=8, num_warps=4, num_stages=4, flatten=True))
# K up to which a split along K is no way to fill the SMs (parts of >= MIN_PART_STEPS k-steps of 64,
# each writing and reading back a whole fp32 tile): smaller tiles instead.
SHORT_K = 2048


def _filling_tile(m: int, n: int, k: int, sms: int, split: bool) -> GemmConfig:
    """M > 256: 128 x 256 tiles (128 x 128 where N < 2048 and M > 1024) where they make at least one
    wave on the SMs, otherwise the largest tile of FILLING_TILES that does (the smallest if none) --
    always without a split (fused ops: a tile is finished in one program), and with one where K is
    short. Where a split may share a long K, the big tile stays (its last wave is split)."""
    first = 0 if n >= 2048 or m <= 1024 else 1
    if split and k > SHORT_K:
        return FILLING_TILES[first]
    for config in FILLING_TILES[first:]:
        if tiles_of(config, m, n) >= sms:
            return config
    return FILLING_TILES[-1]


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


def wave_fill(tiles: int, programs: int) -> float:
    """How full the last wave of ``tiles`` tiles on ``programs`` programs is (1: whole waves)."""
    return tiles / (math.ceil(tiles / programs) * programs)


def two_part_candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """Tiles of a width no power of two is (two column parts) that cut (m, n) into whole waves of the
    SMs, or nearly: where the power-of-two tiles make ~1.2 waves (QKV of Llama-3-70B, N = 1280-5120 at
    M = 256-4096: 160 tiles of 128x128 on 132 SMs, whose split along K costs more than it saves on one
    H100) -- e.g. 512 x 2560 in 8 x 16 tiles of 64 x (128+32), or 4 x 32 of 128 x (64+16): 128 tiles.
    Where they are fewer than the SMs (M <= 512), wave-split along K into one wave instead
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
        if tiles <= TWO_PART_MAX_WAVES * sms and wave_fill(tiles, sms) >= TWO_PART_MIN_FILL:
            split = 1
        else:
            split = two_part_split(bm, bn, bn2, tiles, m, k, sms)
        if split:
            for stages in TWO_PART_STAGES if split == 1 else TWO_PART_SPLIT_STAGES:
                found.append(GemmConfig(bm, bn, 64, group_m=8, split_k=split, num_warps=warps, num_stages=stages,
                                        block_n2=bn2).fitted(2))
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


def candidates(m: int, n: int, k: int, sms: int = 132) -> list[GemmConfig]:
    """What ``symmcoll tune --op gemm`` measures for one shape: the rule's picks and their neighbours in
    the dimensions each regime cares about (wave splits and stream-K where the last wave of tiles is
    partial, two programs per SM where shared memory and registers allow), and the two-part tiles that
    make whole waves (``two_part_candidates``): ~10-80 configs a shape."""
    bases: list[GemmConfig] = []
    if m <= 256:  # bound by reading B: tile widths, k-steps, pipeline depth, programs per SM
        bm = min(256, _pow2_at_least(m, 16))
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
        # on sm_90 in triton 3.6: tl.range(warp_specialize=True) compiles to the same code there)
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
        base = base.fitted(2)
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
    found.extend(two_part_candidates(m, n, k, sms))  # (whole, or wave-split where under one wave)
    found.extend(small_candidates(m, n, k, sms))  # (whole tiles only)
    unique = list(dict.fromkeys(found))
    return [c for c in unique if c.smem_bytes(2) <= SMEM_BYTES // c.occupancy]


# ---- measured tables -----------------------------------------------------------------------------------

def gpu_key(name: str) -> str | None:
    """The table a GPU reads: 'h200' or 'h100' (other GPUs: the rule only)."""
    lowered = name.lower()
    for key in ("h200", "h100"):
        if key in lowered:
            return key
    return None


def table_path(key: str, kind: str = "gemm") -> Path:
    """Where the ``kind`` table of GPU model ``key`` ships: "gemm" (this module's tile configs),
    "roofline" (the memory-bound kernels', fused/memory_bound_configs.py) or "dispatch" (algorithm="auto"
    of the collectives, dispatch.py)."""
    return DATA / f"{kind}_{key}.json"


def read_table(key: str | None, kind: str = "gemm") -> dict:
    """The JSON of the ``kind`` table of GPU model ``key`` (empty where none ships)."""
    if key is None or not table_path(key, kind).exists():
        return {}
    return json.loads(table_path(key, kind).read_text())


@functools.lru_cache(maxsize=None)
def load_table(key: str | None) -> dict:
    """{(m, n, k): (best config, best config without split)} of a shipped table (empty if none)."""
    data = read_table(key)
    return table_of(data["entries"]) if data else {}


def table_of(rows: list[dict]) -> dict:
    """``lookup``'s table of a table file's rows."""
    return {(e["m"], e["n"], e["k"]): (GemmConfig.from_list(e["config"]), GemmConfig.from_list(e["no_split"]))
            for e in rows}


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple[str | None, int]:
    props = torch.cuda.get_device_properties(index)
    return gpu_key(props.name), props.multi_processor_count


def device_facts(device: torch.device) -> tuple[str | None, int]:
    """(table key, SM count) of the GPU ``device`` names; an H200's (``"h200"``, 132) where there is
    no GPU to ask (meta tensors of the compile checks, a CPU-side choice of what a GPU would run)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return _device_facts(device.index if device.index is not None else torch.cuda.current_device())
    return "h200", 132


def lookup(table: dict, m: int, n: int, k: int, split: bool) -> GemmConfig | None:
    """The table's config for M's bucket -- the smallest M the table measured (at any shape) >= m, or
    its largest -- at the measured (N, K) nearest to (n, k) (log distance; each within a factor of 2)
    that holds that M; None if none does. A shape measured at a few M only (a tune cut short, or
    one run on the cells a bench found slow) answers for those M, never for the others: a config
    measured at M = 128 is no answer at M = 16."""
    def distance(shape):
        return abs(math.log2(shape[0] / n)) + abs(math.log2(shape[1] / k)), shape
    measured_ms = sorted({tm for tm, _, _ in table})
    bucket = next((tm for tm in measured_ms if tm >= m), measured_ms[-1] if measured_ms else None)
    near = [(tn, tk) for tm, tn, tk in table if tm == bucket and max(n, tn) <= 2 * min(n, tn)
            and max(k, tk) <= 2 * min(k, tk)]
    if not near:
        return None
    best, no_split = table[(bucket, *min(near, key=distance))]
    # split=False asks for a fused op's tile, which has one column part (the tune never writes another)
    return best if split else no_split if not no_split.block_n2 else replace(no_split, block_n2=0)


def gemm_config(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, split: bool = True) -> GemmConfig:
    """The tile config for C[m, n] = A[m, k] @ B[k, n] on ``device`` (every rank of a fused op passes
    the same shape and gets the same config)."""
    if device.type == "cpu":
        return CPU_CONFIG
    key, sms = device_facts(device)
    table = load_table(key)
    # Every eager call of a fused op asks again; the table lookup scans every measured (N, K) (most of
    # the op's host time before this cache). An answer holds while its table is the one loaded.
    picked_key = (m, n, k, dtype, key, sms, split)
    picked = _PICKED.get(picked_key)
    if picked is not None and picked[0] is table:
        return picked[1]
    config = lookup(table, m, n, k, split) if dtype in (torch.bfloat16, torch.float16) else None
    config = (config or untuned_config(m, n, k, sms, split)).for_itemsize(dtype.itemsize)
    if len(_PICKED) >= _MAX_PICKED:
        _PICKED.clear()
    _PICKED[picked_key] = (table, config)
    return config


# gemm_config's answers: (m, n, k, dtype, table key, SMs, split) -> (the table they came from, config).
_PICKED: dict[tuple, tuple[dict, GemmConfig]] = {}
_MAX_PICKED = 4096


def explicit_entry(row: dict) -> dict:
    """A table row with its configs written out in full (``as_list``): a row kept from an older table
    says in so many fields what it was measured as (``from_list``), and its label follows."""
    config, no_split = GemmConfig.from_list(row["config"]), GemmConfig.from_list(row["no_split"])
    return {**row, "config": config.as_list(), "no_split": no_split.as_list(), "label": config.label}


def write_table(key: str, provenance: dict, rows: list[dict], path: Path | None = None) -> Path:
    """Write a tuned table: rows of {m, n, k, config, no_split, us, ...} (symmcoll tune --op gemm)."""
    path = path or table_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [explicit_entry(row) for row in rows]
    path.write_text(json.dumps({"gpu": provenance.get("gpu"), "provenance": provenance, "entries": rows}, indent=1)
                    + "\n")
    load_table.cache_clear()
    return path


__all__ = ["GemmConfig", "CPU_CONFIG", "SplitPlan", "split_plan", "stream_split", "wave_split", "gemm_config",
           "untuned_config", "candidates", "device_facts", "two_part_candidates", "small_candidates", "load_table", "read_table",
           "table_of", "lookup", "write_table", "gpu_key", "tiles_of", "asdict"]
