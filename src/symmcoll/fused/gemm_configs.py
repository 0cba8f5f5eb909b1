"""The GEMM core's one tile config type and what follows from a config without a measurement: the
untuned rule (``untuned_config``) and how a launch splits tiles along K (``split_plan``).

The question "which config does the core run" is answered by three modules, one part each:

* this one: ``GemmConfig``, the rule, the split plans -- what every other part builds on (it imports
  neither of the others);
* gemm_tables.py: ``gemm_config``, the function the core and the fused ops ask -- the table measured
  on this GPU model where it holds the shape, else this module's rule;
* gemm_candidates.py: the configs ``symmcoll tune --op gemm`` measures to write those tables.

(The candidates are the largest of the three parts and the tables the smallest; moving only the
tables out would have left this file over 500 lines, so each part has its own file.)

``untuned_config`` is the rule for shapes no table holds; it follows from what bounds each regime:

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

import math
from dataclasses import dataclass, replace

# Shared memory a config's operand pipeline may take (``fitted`` cuts its stages to this): a Hopper block
# may use 227 KB, and Triton reuses the pipeline's buffers for the epilogue's layout conversion (H200,
# 2026-11-28: 64x128x64 with 9 stages, 216 KB, and 64x64x128 with 7, 224 KB, compiled and ran correct).
SMEM_BYTES = 224 * 1024
# What the untuned rule and the tune's candidates stay within, the deep pipelines of gemm_candidates
# (DEEP_STAGES) aside: the limit every table entry measured before 2026-11-28 was fitted to, so none of
# them runs otherwise under the larger limit above.
SMEM_BUDGET = 200 * 1024
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
    tma_store). ``sum_apart``: a split tile's parts store their fp32 partials and a second kernel
    sums them, every SM a few rows of a tile (gemm_kernel.split_sum_kernel), instead of the tile's last
    part reading all of them back alone -- one SM's load rate over ``parts`` partials, ~1.4 us per
    64 KB partial (128 x 128 tiles on one H100; an SM loads ~64 bytes a cycle from L2), which caps the
    parts a big tile can be cut into. One-part tiles, the wave split or stream-K (no two-part tile).
    ``gluon``: the plain matmul runs the tile as gemm_gluon.py's decode kernel on sm_90 (its first k-steps of
    B loaded before the PDL wait; ``split_k`` programs a column block share its k-steps) -- swapped
    tiles 64 columns wide, a warpgroup, nothing else; everywhere else (the interpreter, other GPUs, the
    fused ops' own kernels) the same tile runs on the Triton core. ``a_stages`` (gluon only; 0: ``num_stages``):
    A's ring its own depth, so that at 32-64 tokens (A's tile a third to a half of a stage) B keeps more of
    its k-steps in flight -- before the wait among them."""

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
    sum_apart: bool = False
    gluon: bool = False
    a_stages: int = 0

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
        if self.sum_apart and self.block_n2:
            raise ValueError("sum_apart sums the parts of one-part tiles: not with block_n2")
        if self.gluon:
            unsupported = [name for name, on in (("stream_k", self.stream_k), ("split_wave", self.split_wave),
                                                 ("block_n2", self.block_n2), ("sum_apart", self.sum_apart),
                                                 ("tma_store", self.tma_store), ("flatten", self.flatten),
                                                 ("occupancy 2", self.occupancy != 1)) if on]
            if not self.swap_ab or self.block_n != 64 or self.block_m > 64 or self.num_warps != 4 or unsupported:
                raise ValueError(f"a gluon config is a swapped decode tile (swap_ab, block_n 64, block_m <= 64, "
                                 f"4 warps), whole or split along K: got {self.label}")
        if self.a_stages and (not self.gluon or self.a_stages < 2):
            raise ValueError(f"a_stages (A's own ring) is a gluon config's, at least 2: got {self.a_stages}")

    def meta(self) -> dict:
        """The kernel's constexprs and launch options (split_k is a runtime argument)."""
        return dict(BM=self.block_m, BN=self.block_n, BK=self.block_k, GROUP_M=self.group_m, SWAP_AB=self.swap_ab,
                    num_warps=self.num_warps, num_stages=self.num_stages)

    @property
    def a_ring(self) -> int:
        """Stages of A's ring: ``a_stages``, or B's depth where it is 0 (every config but a Gluon one's)."""
        return self.a_stages or self.num_stages

    @property
    def core_twin(self) -> GemmConfig:
        """The config the Triton core runs for this one: a ``gluon`` config's tile without the Gluon kernel's own
        fields (its A ring is B's depth there, ``fitted`` again)."""
        return replace(self, gluon=False, a_stages=0) if self.gluon else self

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
        return (self.num_stages * self.tile_n + self.a_ring * self.block_m) * self.block_k * itemsize + staged_c

    def for_itemsize(self, itemsize: int) -> GemmConfig:
        """4-byte operands: half the k-step, so the pipeline fits (then ``fitted``)."""
        config = replace(self, block_k=max(16, self.block_k // 2)) if itemsize > 2 else self
        return config.fitted(itemsize)

    def fitted(self, itemsize: int, limit: int = SMEM_BYTES) -> GemmConfig:
        """The same with fewer pipeline stages where its buffers would not fit ``limit`` bytes of shared
        memory (default: what a block may take; the tune's candidates: SMEM_BUDGET)."""
        config = self
        while config.num_stages > 2 and config.smem_bytes(itemsize) > limit:
            config = replace(config, num_stages=config.num_stages - 1)
        return config

    @property
    def label(self) -> str:
        return (f"{'T' if self.swap_ab else 'N'}{self.block_m}x{self.block_n}"
                f"{f'+{self.block_n2}' if self.block_n2 else ''}x{self.block_k}"
                f"/g{self.group_m}/s{'k' if self.stream_k else ''}{self.split_k}{'+' if self.split_wave else ''}"
                f"/w{self.num_warps}"
                f"/p{self.num_stages}"
                f"{'/o2' if self.occupancy == 2 else ''}{'/f' if self.flatten else ''}{'/t' if self.tma_store else ''}"
                f"{'/r' if self.sum_apart else ''}{'/G' if self.gluon else ''}{f'/a{self.a_stages}' if self.a_stages else ''}")

    def as_list(self) -> list:
        """Every field, in order; ``block_n2`` (the 14th) only where it, ``sum_apart`` (the 15th), ``gluon``
        (the 16th) or ``a_stages`` (the 17th) is, and each of those only where it or a later one is set, so the tables written before
        them stay as they are (``from_list``: no 14th field, one part; no 15th, the last part sums; no 16th,
        the Triton core)."""
        tail = ([self.block_n2, int(self.sum_apart), 1, self.a_stages] if self.a_stages
                else [self.block_n2, int(self.sum_apart), 1] if self.gluon else [self.block_n2, 1] if self.sum_apart
                else [self.block_n2] if self.block_n2 else [])
        return [self.block_m, self.block_n, self.block_k, self.group_m, self.split_k, int(self.swap_ab),
                self.num_warps, self.num_stages, self.occupancy, int(self.flatten), int(self.tma_store),
                int(self.split_wave), int(self.stream_k)] + tail

    @staticmethod
    def from_list(values) -> GemmConfig:
        """The inverse of ``as_list``. Older tables' shorter lists mean what they meant when measured:
        up to 11 fields (before stream-K existed) a split is the wave split; 12 fields (written by
        the tune of git 50c1510, where every split was stream-K) a split is stream-K; up to 13 fields
        (before two-part tiles) a tile has one part (block_n2 = 0); up to 14 (before ``sum_apart``) the
        last part of a split tile sums it; up to 15 (before ``gluon``) the Triton core runs it; up to 16 (before
        ``a_stages``) A's ring is B's depth."""
        bm, bn, bk, group, split, swap, warps, stages, *rest = values
        if len(rest) == 4:  # (occupancy, flatten, tma_store, split_wave): the 50c1510 format
            rest = [*rest, int(split > 1)]
        defaults = [1, 0, 0, 0, 0, 0, 0, 0, 0]
        occupancy, flatten, tma_store, split_wave, stream_k, block_n2, sum_apart, gluon, a_stages = \
            (list(rest) + defaults[len(rest):])[:9]
        return GemmConfig(bm, bn, bk, group, split, bool(swap), warps, stages, occupancy, bool(flatten),
                          bool(tma_store), bool(split_wave), bool(stream_k), block_n2, bool(sum_apart), bool(gluon),
                          a_stages)


# Under the interpreter every program costs ~0.7 ms: small tiles, few programs (tests pick others).
CPU_CONFIG = GemmConfig(32, 32, 32, group_m=4, num_warps=4, num_stages=1)


def pow2_at_least(x: int, floor: int) -> int:
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
                 max_tail: float | None = None) -> SplitPlan:
    """The full waves whole; the last, partial wave's tiles (with the last full wave too if
    ``config.split_wave``) shared along K by at most ``programs`` programs, about ``config.split_k``
    per tile, each >= MIN_PART_STEPS k-steps -- where the partial wave is at most ``max_tail`` of the
    programs (default STREAM_K_MAX_TAIL; any tail where the config sums apart: that limit was measured
    with a tile's last range summing its parts alone) and sharing finishes sooner than computing them
    whole: a share of shared/SMs tiles plus ``share_cost`` against one more round of whole tiles per SM."""
    if max_tail is None:
        max_tail = 1.0 if config.sum_apart else STREAM_K_MAX_TAIL
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
        config = GemmConfig(pow2_at_least(m, 16), 64, 128, group_m=1, swap_ab=True, num_warps=4,
                            num_stages=5 if m <= 64 else 4)
    elif m <= 256:
        config = GemmConfig(256, 64, 64, group_m=1, swap_ab=True, num_warps=8, num_stages=4)
    else:
        config = _filling_tile(m, n, k, sms, split)
    return replace(config, split_k=8 if m <= 2048 else 4) if split else config


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
