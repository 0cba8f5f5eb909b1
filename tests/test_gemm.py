"""The GEMM core (fused/gemm.py, gemm_kernel.py, gemm_configs.py, gemm_tables.py, gemm_candidates.py):
every path of the one K-loop under the interpreter at tiny shapes (straight and swapped tiles, stream-K,
B given transposed, odd K and N, bf16/fp16/fp32), the config picker, the table format; on the GPU machine the
same paths compiled, and split-K inside CUDA graphs (its counters must come back to zero every
launch). Kernels run in a one-rank pool (the interpreter must be on before symmcoll is imported
there)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from symmcoll.fused import gemm, gemm_candidates, gemm_configs, gemm_kernel, gemm_tables
from symmcoll.fused.gemm_split import wave_part
from symmcoll.fused.gemm_configs import GemmConfig

DEVICE = os.environ.get("SYMMCOLL_TEST_DEVICE", "cpu")

SRC = Path(gemm.__file__).resolve().parent.parent

# (M, N, K, config, B given as W^T, how tiles are shared, programs): every branch of k_loop and the
# scheduler, tiny enough for the interpreter (4 programs unless given). Configs are explicit: the CPU
# default never swaps or splits. Sharing: "" none, "wave" the wave split, "stream" stream-K.
STREAM = dict(stream_k=True)
CASES = [
    (33, 100, 72, None, False, "", None),                                           # odd M, N, K; pointer loads
    # 3 tiles of 32 k-steps (odd K) shared by 9 of 10 programs (10.7 k-steps each: ranges cross tiles)
    (5, 70, 1000, GemmConfig(16, 32, 32, 1, 3, True, 4, 1, **STREAM), False, "stream", 10),  # swapped
    (5, 70, 1000, GemmConfig(16, 32, 32, 1, 3, True, 4, 1, **STREAM), True, "stream", 10),   # the same, W [N, K]
    (1, 48, 512, GemmConfig(16, 16, 16, 1, 4, True, 4, 1, **STREAM), False, "stream", 10),   # M = 1, 3 tiles
    # the same 3 tiles by the wave split: 4 parts of 8 k-steps each, 12 parts in 3 rounds of 4 programs
    (5, 70, 1000, GemmConfig(16, 32, 32, 1, 4, True, 4, 1), False, "wave", None),
    (5, 70, 1000, GemmConfig(16, 32, 32, 1, 4, True, 4, 1), True, "wave", None),
    (1, 16, 200, GemmConfig(16, 16, 16, 1, 3, True, 4, 1), False, "wave", None),    # 13 k-steps: parts 5, 5, 3
    (40, 64, 100, GemmConfig(32, 32, 32, 2, 4, False, 4, 1), False, "", None),      # 4 tiles on 4 programs
    (40, 64, 96, GemmConfig(32, 32, 32, 2, 2, False, 4, 1), True, "", None),        # straight, W [N, K], no split
    (70, 40, 48, GemmConfig(32, 16, 16, 2, 1, False, 4, 1), False, "", None),       # narrow N, tiles > programs
    # 13 tiles on 4 programs: 12 whole (the flattened loop), the 13th shared by 3 programs / in 4 parts
    (416, 16, 512, GemmConfig(32, 16, 16, 2, 3, False, 4, 1, 1, True, **STREAM), False, "stream", None),
    (416, 16, 512, GemmConfig(32, 16, 16, 2, 4, False, 4, 1, 1, True), False, "wave", None),
    # the last full wave shared too: 5 tiles of 32 k-steps, 40 per program (a range holding a whole tile
    # stores it without a partial), straight and swapped
    (416, 16, 512, GemmConfig(32, 16, 16, 2, 3, False, 4, 1, 1, True, split_wave=True, **STREAM), False, "stream",
     None),
    (12, 208, 64, GemmConfig(16, 16, 16, 1, 4, True, 4, 1, split_wave=True, **STREAM), True, "stream", None),
    # 2 tiles of 2 k-steps: too short to share (each range would be under MIN_PART_STEPS)
    (20, 64, 40, GemmConfig(32, 32, 32, 1, 4, False, 4, 1, **STREAM), False, "", 10),
    # C stored in two column halves (tma_store, 256 columns: GemmConfig.c_halves; pointer stores on CPU):
    # the second column block's right half wholly past N, straight and swapped (the wave split, 2 parts)
    (40, 304, 64, GemmConfig(32, 256, 32, 2, 1, False, 4, 1, tma_store=True), False, "", None),
    (5, 300, 256, GemmConfig(16, 256, 32, 1, 4, True, 4, 1, tma_store=True), True, "wave", None),
    # two-part tiles (block_n2): 48 columns as 32 + 16, odd M and K; the last column block's first part
    # partly and its second part wholly past N (96..143 of 100), B and W [N, K]
    (37, 100, 45, GemmConfig(16, 32, 16, 2, 1, False, 4, 1, block_n2=16), False, "", None),
    (37, 100, 45, GemmConfig(16, 32, 16, 2, 1, False, 4, 1, block_n2=16), True, "", None),
    # 96 = 64 + 32 columns: N = 192 in exactly 2 tiles a row block, 12 tiles on 4 programs (flattened)
    (90, 192, 70, GemmConfig(32, 64, 16, 2, 1, False, 4, 1, flatten=True, block_n2=32), True, "", None),
    # two-part tiles wave-split: 9 tiles of 16 x (32+16) on 4 programs, 8 whole, the last (a partial wave)
    # in 3 parts of 13 k-steps (odd K: 5, 5, 3), its second part partly past N (128..143 of 136); B and W [N, K]
    (37, 136, 200, GemmConfig(16, 32, 16, 2, 3, False, 4, 1, block_n2=16), False, "wave", None),
    (37, 136, 200, GemmConfig(16, 32, 16, 2, 3, False, 4, 1, block_n2=16), True, "wave", None),
    # 2 tiles of 16 x (64+32), all shared: 4 parts each on 8 programs (odd K: 16 k-steps, the last short)
    (20, 96, 250, GemmConfig(16, 64, 16, 1, 4, False, 4, 1, block_n2=32), True, "wave", 8),
    # a small product's tile (gemm_candidates.small_candidates): 128 x 64, two programs per SM, flattened --
    # 12 tiles on 8 programs, odd M, N and K
    (300, 200, 150, GemmConfig(128, 64, 64, 8, 1, False, 8, 8, occupancy=2, flatten=True), False, "", None),
]


def _operands(m, n, k, dtype, b_t, device, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn((m, k), generator=gen).to(dtype).to(device)
    if b_t:
        b = torch.randn((n, k), generator=gen).to(dtype).to(device).t()
    else:
        b = torch.randn((k, n), generator=gen).to(dtype).to(device)
    return a, b


def _rel_err(got, a, b):
    ref = a.double() @ b.double()
    return float((got.double() - ref).norm() / ref.norm())


# bf16 and fp32 for every case; fp16 shares bf16's code, so three cases of it suffice.
DTYPE_CASES = [(c, d) for c in CASES for d in (torch.bfloat16, torch.float32)] + \
    [(CASES[i], torch.float16) for i in (0, 2, 5, len(CASES) - 6, len(CASES) - 3)]


@pytest.mark.parametrize("case,dtype", DTYPE_CASES,
                         ids=lambda v: str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else
                         f"{v[0]}x{v[1]}x{v[2]}-{v[3].label if v[3] else 'auto'}{'-bT' if v[4] else ''}"
                         f"{'-' + v[5] if v[5] else ''}{'-P%d' % v[6] if v[6] else ''}")
def test_matmul_matches_fp32(pools, case, dtype):
    pools(1).run(_matmul_matches_fp32, case, dtype)


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def _matmul_matches_fp32(case, dtype):
    m, n, k, config, b_t, sharing, programs = case
    used = (config or gemm_configs.CPU_CONFIG).for_itemsize(dtype.itemsize)
    if _device() == "cpu":  # the case covers the path it says it does
        plan = gemm_configs.split_plan(used, gemm_configs.tiles_of(used, m, n), k, programs or 4 * used.occupancy)
        assert (plan.shared, plan.stream) == (bool(sharing), sharing == "stream"), plan
    a, b = _operands(m, n, k, dtype, b_t, _device(), seed=m * 7 + n)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=_device())
    gemm.matmul(a, b, out=out, config=config, programs=programs if _device() == "cpu" else None)
    tolerance = 1e-5 if dtype == torch.float32 and _device() == "cpu" else 4e-3 if dtype != torch.float32 else 2e-3
    assert not out.isnan().any(), "an element of C was never written"
    assert _rel_err(out, a, b) < tolerance, f"{case}, {dtype}: {_rel_err(out, a, b)}"


def test_halved_c_store_writes_the_bits_of_the_whole_tile_store(pools):
    pools(1).run(_halved_c_store)


def _halved_c_store():
    """A 256-column tile stored as two halves of 128 (tma_store: GemmConfig.c_halves, the TMA path on
    the GPU where C's rows are 16-byte aligned) writes exactly what the whole-tile store writes, whole
    tiles and split ones, and nothing outside C (a guard column past N stays as it was)."""
    for config, m, n, k in ((GemmConfig(32, 256, 32, 2, 1, False, 4, 1), 40, 304, 64),
                            (GemmConfig(16, 256, 32, 1, 4, True, 4, 1), 5, 300, 256)):
        halved = replace(config, tma_store=True)
        assert (halved.c_halves, config.c_halves) == (2, 1)
        a, b = _operands(m, n, k, torch.bfloat16, False, _device(), 11)
        results = []
        for used in (config, halved):
            padded = torch.full((m, n + 8), 7.0, dtype=torch.bfloat16, device=_device())
            gemm.matmul(a, b, out=padded[:, :n], config=used)
            assert bool((padded[:, n:] == 7.0).all()), f"{used.label} wrote past N"
            results.append(padded[:, :n])
        assert torch.equal(results[0], results[1]), f"{halved.label}: halves differ from the whole tile"
        assert _rel_err(results[1], a, b) < 4e-3


def test_split_k_counters_return_to_zero_and_repeat_exactly(pools):
    pools(1).run(_split_k_counters)


def _split_k_counters():
    """Calls with fresh data, the wave split and stream-K: the counters are zero after each (the next
    launch, or graph replay, starts clean) and the sum does not depend on which part finished last
    (fixed order)."""
    programs = gemm.num_sms(torch.device(_device()))
    for config, n in ((GemmConfig(16, 32, 32, 1, 4, True, 4, 1), 64),
                      (GemmConfig(16, 32, 32, 1, 4, True, 4, 1, stream_k=True), 32),
                      (GemmConfig(16, 32, 32, 1, 4, False, 4, 1, block_n2=16), 48)):  # two-part, 4 parts
        assert gemm_configs.split_plan(config, gemm_configs.tiles_of(config, 9, n), 256, programs).shared
        counters = gemm.split_counters(torch.device(_device()))
        results = []
        for seed in (1, 2, 2):
            a, b = _operands(9, n, 256, torch.bfloat16, False, _device(), seed)
            results.append(gemm.matmul(a, b, config=config))
            assert int(counters.abs().sum()) == 0
        assert torch.equal(results[1], results[2])
        assert not torch.equal(results[0], results[1])
        assert _rel_err(results[1], *_operands(9, n, 256, torch.bfloat16, False, _device(), 2)) < 4e-3


def test_split_sum_bits_do_not_depend_on_slots_loaded_at_once(pools):
    pools(1).run(_split_sum_bits)


def _split_sum_bits():
    """The last part of a shared tile sums the partials in part order whether it loads 1, 2 or 4 slots
    at once (gemm_split.reduce_loads): bit-identical results for 3, 4 and 5 parts (the wave split)
    and stream-K's uneven parts, where a round trip's later slots past the last part read as zeros."""
    real = gemm.reduce_loads
    # 2 tiles, each in `cap` parts on 2 * cap programs (one round)
    cases = [(GemmConfig(16, 32, 32, 1, cap, True, 4, 1), 9, 64, 32 * steps, 2 * cap)
             for cap, steps in ((3, 12), (4, 8), (5, 10))]
    cases.append((GemmConfig(16, 32, 32, 1, 3, True, 4, 1, stream_k=True), 5, 70, 1000, 10))
    cases.append((GemmConfig(16, 32, 32, 1, 3, False, 4, 1, block_n2=16), 9, 96, 32 * 12, 6))  # two-part tiles
    try:
        for config, m, n, k, programs in cases:
            tiles = gemm_configs.tiles_of(config, m, n)
            plan = gemm_configs.split_plan(config, tiles, k, programs or gemm.num_sms(torch.device(_device())))
            assert plan.shared and (plan.stream or plan.sharing == config.split_k), (config.label, plan)
            a, b = _operands(m, n, k, torch.bfloat16, False, _device(), 4)
            results = []
            for loads in (1, 2, 4):
                gemm.reduce_loads = lambda *_, loads=loads: loads
                results.append(gemm.matmul(a, b, config=config, programs=programs))
            assert all(torch.equal(results[0], r) for r in results[1:]), f"{config.label}: sums differ"
            assert _rel_err(results[0], a, b) < 4e-3
    finally:
        gemm.reduce_loads = real
    assert gemm.reduce_loads(16, 64, 4) == 4 and gemm.reduce_loads(128, 128, 8) == 2
    assert gemm.reduce_loads(128, 256, 8) == 1


def test_two_part_tiles_summed_in_pairs_get_the_bits_of_the_part_order_sum(pools):
    pools(1).run(_pair_reduce_bits)


def _pair_reduce_bits():
    """The wave split in exactly two parts sums a tile by gemm_split.pair_reduce (the first part to finish
    stores its partial, the second adds it to its own): the bits split_reduce's part-order sum gives (IEEE
    addition commutes), counters zero after every call, fresh data giving fresh results; and only where the
    plan is the wave split in two parts whose two slots fit the registers (not stream-K, three parts, a
    two-part tile, sums apart, or 128 x 256 tiles of 8 warps)."""
    device = torch.device(_device())
    # 4 tiles of 16 x 32 in 2 parts on 8 programs (one round, odd K: the last part short); swapped and
    # straight; W [N, K]; 6 tiles on 4 programs: a round of whole tiles, then 2 tiles in 2 parts
    cases = [(GemmConfig(16, 32, 32, 1, 2, True, 4, 1), 9, 128, 32 * 7 + 5, False, 8),
             (GemmConfig(16, 32, 32, 1, 2, False, 4, 1), 30, 64, 32 * 6, True, 8),
             (GemmConfig(16, 32, 16, 2, 2, False, 4, 1), 45, 64, 16 * 9, False, 4)]
    for config, m, n, k, b_t, programs in cases:
        fitted = config.fitted(2)
        plan = gemm_configs.split_plan(fitted, gemm_configs.tiles_of(fitted, m, n), k, programs)
        assert plan.shared and not plan.stream and plan.sharing == 2, (config.label, plan)
        assert gemm.pairs(fitted, plan, False, True) and not gemm.pairs(fitted, plan, False, False)
        counters = gemm.split_counters(device)
        for seed in (5, 6):
            a, b = _operands(m, n, k, torch.bfloat16, b_t, _device(), seed)
            results = []
            for on in (True, False, True):
                with gemm.pair_reduce_switched(on):
                    results.append(gemm.matmul(a, b, config=config, programs=programs))
                assert int(counters.abs().sum()) == 0, f"{config.label}: a counter left set"
            assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2]), config.label
            assert _rel_err(results[0], a, b) < 4e-3
    two = gemm_configs.SplitPlan(0, 2, 2)
    assert not gemm.pairs(GemmConfig(16, 32, 32, 1, 2, True, 4, 1), gemm_configs.SplitPlan(0, 3, 3), False, True)
    assert not gemm.pairs(GemmConfig(16, 32, 32, 1, 2, True, 4, 1), gemm_configs.SplitPlan(0, 2, 3, stream=True),
                          False, True)
    assert not gemm.pairs(GemmConfig(16, 32, 32, 1, 2, True, 4, 1), two, True, True)  # summed apart
    assert not gemm.pairs(GemmConfig(16, 32, 32, 1, 2, False, 4, 1, block_n2=16), two, False, True)
    assert not gemm.pairs(GemmConfig(128, 256, 64, 8, 2, False, 8, 3), two, False, True)  # 128 fp32 a thread
    assert gemm.pairs(GemmConfig(128, 128, 64, 8, 2, False, 8, 5), two, False, True)


def test_split_tiles_summed_apart_get_the_bits_their_last_part_sums(pools):
    pools(1).run(_split_sum_apart)


def _split_sum_apart():
    """GemmConfig.sum_apart: the parts of a shared tile store their partials and split_sum_kernel sums them,
    a few rows of a tile per program, in part order -- the very bits the tile's last part sums in the
    kernel, for whole tiles beside shared ones (12 whole + 1 in 4 parts, flattened), swapped tiles with
    B and W^T (3 tiles in 4 parts, odd K), tiles past M and N, and C's tile in halves (4 whole + 2 in
    2 parts), the parts' loads unrolled (PARTS, the plan's sharing); stream-K too (3 tiles shared by 9
    ranges of 12 programs, a tile meeting 3 or 4 of them: PARTS the plan's slots, the sum kernel working
    out each tile's parts; 12 whole + 2 shared by 12 ranges); one sum launch per call, the counters never
    touched."""
    from symmcoll import launcher
    device = torch.device(_device())
    cases = [(416, 16, 512, GemmConfig(32, 16, 16, 2, 4, False, 4, 1, 1, True), False, 4),
             (5, 70, 1000, GemmConfig(16, 32, 32, 1, 4, True, 4, 1), False, 4),
             (5, 70, 1000, GemmConfig(16, 32, 32, 1, 4, True, 4, 1), True, 4),
             (70, 300, 256, GemmConfig(32, 256, 32, 2, 4, False, 4, 1, tma_store=True), False, 4),
             (5, 70, 1000, GemmConfig(16, 32, 32, 1, 3, True, 4, 1, stream_k=True), True, 12),
             (40, 112, 2000, GemmConfig(32, 16, 32, 2, 8, False, 4, 1, stream_k=True), False, 12)]
    counters = gemm.split_counters(device)
    for m, n, k, config, b_t, programs in cases:
        apart = replace(config, sum_apart=True)
        tiles = gemm_configs.tiles_of(apart, m, n)
        plan = gemm_configs.split_plan(apart, tiles, k, programs)
        assert plan.shared and plan.sharing >= 2 and plan.stream == config.stream_k, (apart.label, plan)
        assert plan == gemm_configs.split_plan(config, tiles, k, programs), (apart.label, plan)
        a, b = _operands(m, n, k, torch.bfloat16, b_t, _device(), m + n)
        before = launcher.LAUNCH_COUNTS["split_sum_kernel"]
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
        gemm.matmul(a, b, out=out, config=apart, programs=programs)
        assert launcher.LAUNCH_COUNTS["split_sum_kernel"] == before + 1, apart.label
        assert torch.equal(out, gemm.matmul(a, b, config=config, programs=programs)), f"{apart.label}: sums differ"
        assert _rel_err(out, a, b) < 4e-3 and int(counters.abs().sum()) == 0
        meta = gemm._core_shape(m, n, k, apart, 2, programs, device, gemm.PDL_DECODE)[5][1]
        assert meta["PARTS"] == (plan.slots if plan.stream else plan.sharing) and meta["STREAM"] == plan.stream
    # no shared tile (4 tiles on 4 programs): no second launch
    before = launcher.LAUNCH_COUNTS["split_sum_kernel"]
    gemm.matmul(*_operands(40, 64, 100, torch.bfloat16, False, _device(), 1), programs=4,
                config=GemmConfig(32, 32, 32, 2, 4, False, 4, 1, sum_apart=True))
    assert launcher.LAUNCH_COUNTS["split_sum_kernel"] == before


def test_sum_apart_configs_round_trip_and_are_offered_for_big_split_tiles():
    """A config that sums apart says so (label /r, the 15th list field; a list without it sums in the
    kernel), refuses two-part tiles, and is a tune candidate for big tiles past decode: the wave split in
    many parts (128 x 1280 x 8192: 128 x 128 in 13 parts; 2048 x 2304 x 16384: the last 12 of 144 tiles of
    128 x 256 in 11 parts) and, past M = 512, stream-K -- which, summed apart, may share a last wave of more
    than a third of the programs (2048 x 2560: 28 of 160 tiles; 4096 x 2560 x 8192: 56 of 320) -- never at
    decode."""
    config = GemmConfig(128, 128, 64, 8, 16, False, 8, 5, sum_apart=True)
    assert config.label.endswith("/r") and len(config.as_list()) == 15
    assert GemmConfig.from_list(config.as_list()) == config
    assert not GemmConfig.from_list(replace(config, sum_apart=False).as_list()).sum_apart
    with pytest.raises(ValueError, match="sum_apart"):
        GemmConfig(128, 128, 64, split_k=16, sum_apart=True, block_n2=32)
    streamed = GemmConfig(128, 256, 64, 8, 4, False, 8, 3, stream_k=True)
    assert not gemm_configs.split_plan(streamed, 320, 8192, 132).shared  # 56 of 132 programs: past a third
    assert gemm_configs.split_plan(replace(streamed, sum_apart=True), 320, 8192, 132).stream
    for m, n, k, tile, parts in ((128, 1280, 8192, (128, 128), 13), (2048, 2304, 16384, (128, 256), 11)):
        offered = [c for c in gemm_candidates.candidates(m, n, k) if c.sum_apart]
        plans = {c: gemm_configs.split_plan(c, gemm_configs.tiles_of(c, m, n), k, 132 * c.occupancy) for c in offered}
        assert any((c.block_m, c.block_n) == tile and p.sharing == parts and not p.stream for c, p in plans.items())
        assert any(p.stream for p in plans.values()) == (m > 512)
        for c, plan in plans.items():
            assert plan.shared and (plan.stream or plan.sharing >= gemm_candidates.SUM_APART_MIN_PARTS), c.label
    assert any(c.sum_apart and c.stream_k for c in gemm_candidates.candidates(4096, 2560, 8192))
    assert not any(c.sum_apart for c in gemm_candidates.candidates(64, 1280, 8192))


@triton.jit
def _wave_units(out_ptr, shared_tiles, parts, steps, rounds):
    """(tile, part, first step, end step) of every wave-split unit a program meets, as matmul_kernel walks them."""
    program = tl.program_id(0)
    for r in range(0, rounds):
        unit = program + r * tl.num_programs(0)
        if unit < shared_tiles * parts:
            t, part, lo, hi = wave_part(unit, shared_tiles, parts, steps)
            tl.store(out_ptr + unit * 4 + tl.arange(0, 4), tl.join(tl.join(t, lo), tl.join(part, hi)).reshape(4))  # t, part, lo, hi


def test_wave_split_units_leave_every_tile_open_until_the_last_round(pools):
    pools(1).run(_wave_units_part_major)


def _wave_units_part_major():
    """gemm_split.wave_part, as matmul_kernel walks it (unit = program + round * programs): every
    (tile, part) once, each part's k-steps the part's own, and -- where the units take more than
    one round -- the last round holds a part of as many tiles as it has units (all 80 at 128x256 in
    3 parts on 132 programs: no reduction before the last round; tile-major units finished 44 tiles
    in round 1, and their reductions delayed round 2; 7 tiles in 5 parts on 6 programs: 5 tiles, 1
    tile-major)."""
    for shared_tiles, parts, steps, programs in ((80, 3, 128, 132), (3, 4, 32, 4), (7, 5, 13, 6)):
        count = shared_tiles * parts
        rounds = -(-count // programs)
        out = torch.full((count, 4), -1, dtype=torch.int32, device=_device())
        _wave_units[(programs,)](out, shared_tiles, parts, steps, rounds)
        seen = {(int(t), int(p)) for t, p in out[:, :2]}
        assert seen == {(t, p) for t in range(shared_tiles) for p in range(parts)}, "a part missing or twice"
        chunk = -(-steps // parts)
        for t, p, lo, hi in out.tolist():
            assert (lo, hi) == (p * chunk, min(p * chunk + chunk, steps))
        last_round = out[(rounds - 1) * programs:, 0]
        # as many tiles as the last round has units, up to all of them (fewer units: some tile must end before)
        assert len(set(last_round.tolist())) == min(shared_tiles, len(last_round)), f"{shared_tiles}x{parts}"


def test_captured_split_launches_take_arena_slices_without_a_fill(pools):
    pools(1).run(_captured_split_launches)


def _captured_split_launches():
    """Launches made while a CUDA graph is captured (the capture flag stood in for on CPU) take
    counters from the arena made by an eager launch: no zero-filled table (a fill kernel in the
    graph) per launch, each launch a slice of its own, left zero; an exhausted arena falls back to a
    table of the launch's own, and the next eager launch replaces it (the old one kept)."""
    from symmcoll.fused import gemm_split
    config = GemmConfig(16, 32, 32, 1, 4, True, 4, 1)  # wave split: 2 tiles of N = 64 in parts
    a, b = _operands(9, 64, 256, torch.bfloat16, False, _device(), 3)
    device = a.device  # (with its index on a GPU: the arenas are keyed by it)
    expected = gemm.matmul(a, b, config=config)  # eager: makes the stream's table and the arena
    arena, _ = gemm_split._ARENAS[(device.type, device.index)]
    handed, fills = [], []
    real_counters, real_zeros, real_capturing = gemm_split.split_counters, gemm_split._zeros, gemm_split.capturing

    def recording_counters(dev, needed=gemm_split.MAX_SPLIT_TILES):
        handed.append(real_counters(dev, needed))
        return handed[-1]

    def recording_zeros(dev, entries):
        fills.append(entries)
        return real_zeros(dev, entries)
    gemm_split.capturing, gemm_split._zeros, gemm.split_counters = (lambda dev: True), recording_zeros, \
        recording_counters
    try:
        outs = [gemm.matmul(a, b, config=config) for _ in range(3)]
        assert fills == [], f"captured launches made tables: {fills}"
        spans = sorted(((t.data_ptr() - arena.data_ptr()) // 4, t.numel()) for t in handed)
        assert all(start + size <= after for (start, size), (after, _) in zip(spans, spans[1:])), spans
        assert [size for _, size in spans] == [2, 2, 2], spans  # (2 shared tiles each)
        assert all(t.untyped_storage().data_ptr() == arena.untyped_storage().data_ptr() for t in handed)
        assert all(torch.equal(out, expected) for out in outs)
        assert int(arena.abs().sum()) == 0
        gemm_split._ARENAS[(device.type, device.index)][1] = arena.numel() - 1  # (nearly) exhausted
        assert torch.equal(gemm.matmul(a, b, config=config), expected)
        assert fills == [gemm_split.MAX_SPLIT_TILES], fills
        gemm_split.capturing = lambda dev: False  # the next eager launch: a new arena, the old one kept
        assert torch.equal(gemm.matmul(a, b, config=config), expected)
        assert fills == [gemm_split.MAX_SPLIT_TILES, gemm_split.CAPTURE_ARENA], fills
        assert gemm_split._ARENAS[(device.type, device.index)][0] is not arena
        assert any(old is arena for old in gemm_split._RETIRED)
    finally:
        gemm_split.capturing, gemm_split._zeros, gemm.split_counters = real_capturing, real_zeros, real_counters


def test_empty_and_degenerate_shapes(pools):
    pools(1).run(_empty_and_degenerate)


def _empty_and_degenerate():
    dev = _device()
    a = torch.randn(0, 8).to(dev)
    assert gemm.matmul(a, torch.randn(8, 4).to(dev)).shape == (0, 4)
    out = gemm.matmul(torch.randn(3, 0).to(dev), torch.randn(0, 5).to(dev))
    assert out.shape == (3, 5) and torch.equal(out, torch.zeros(3, 5, device=dev))
    with pytest.raises(ValueError, match="a \\[M, K\\] and b \\[K, N\\]"):
        gemm.matmul(torch.randn(3, 4), torch.randn(5, 6))
    with pytest.raises(ValueError, match="b.dtype"):
        gemm.matmul(torch.randn(3, 4), torch.randn(4, 6).to(torch.bfloat16))


def test_only_the_core_calls_tl_dot():
    """The package's K-loops: ``tl.dot`` appears in fused/gemm_kernel.py's ``mma`` and nowhere else, and the one
    other tensor-core call, Gluon's ``warpgroup_mma``, in fused/gemm_gluon.py's decode kernel alone (the plain
    matmul's decode tiles on sm_90, docs/algorithms.md "Decode in Gluon")."""
    calls = {"tl.dot(": "gemm_kernel.py", "warpgroup_mma(": "gemm_gluon.py"}
    offenders = [(str(p.relative_to(SRC)), call) for p in SRC.rglob("*.py") for call, home in calls.items()
                 if call in p.read_text() and p.name != home]
    assert offenders == []
    assert gemm_kernel.__file__.endswith("gemm_kernel.py") and "tl.dot(" in gemm_kernel.mma.src
    from symmcoll.fused import gemm_gluon
    assert gemm_gluon.decode_kernel.src.count("warpgroup_mma(") == 1


# ---- the config picker ---------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(1, 1280, 8192), (16, 8192, 8192), (64, 4096, 7168), (128, 8192, 1024),
                                   (512, 1280, 8192), (4096, 28672, 8192), (16384, 8192, 8192)])
def test_untuned_rule_covers_the_regimes(m, n, k):
    config = gemm_configs.untuned_config(m, n, k, sms=132)
    tiles = gemm_configs.tiles_of(config, m, n)
    if m <= 64:
        assert config.swap_ab and m <= config.block_m <= 64
    assert config.smem_bytes(2) <= gemm_configs.SMEM_BYTES
    assert not config.stream_k, "the untuned rule splits the way the tables before stream-K were measured"
    plan = gemm_configs.split_plan(config, tiles, k, 132)
    assert plan.whole_tiles % 132 == 0 or (plan.whole_tiles == tiles and not plan.shared)
    if tiles < 66 and k >= 4096:
        assert plan.shared, "few tiles and a long K: the SMs must share the K range"
    assert gemm_configs.untuned_config(m, n, k, 132, split=False).split_k == 1


@pytest.mark.parametrize("m,n,k,split", [(1024, 1024, 1024, False), (1024, 1024, 1024, True), (2048, 1024, 1024, False),
                                         (512, 1280, 8192, False), (4096, 1024, 1024, True)])
def test_untuned_rule_fills_the_sms_where_no_split_shares_a_long_k(m, n, k, split):
    """Without a split (what every fused op asks for), or with K too short to share, the rule's tiles
    make at least one wave on 132 SMs where any tile of the ladder does (1024^3 had 32 tiles of
    128 x 256: 2.8x cuBLAS in all_gather_matmul at world size 1, H100, 2026-11-27)."""
    config = gemm_configs.untuned_config(m, n, k, 132, split=split)
    assert gemm_configs.tiles_of(config, m, n) >= 132
    assert config.smem_bytes(2) <= gemm_configs.SMEM_BYTES


def test_untuned_rule_keeps_the_big_tile_where_it_fills_or_a_split_shares_k():
    big = gemm_configs.FILLING_TILES[0]
    for m, n, k, split in ((16384, 8192, 8192, False), (1024, 8192, 8192, False), (512, 1280, 8192, True)):
        config = gemm_configs.untuned_config(m, n, k, 132, split=split)
        assert (config.block_m, config.block_n) == (big.block_m, big.block_n), (m, n, k, split)


def S(whole_tiles, sharing=0, slots=1):
    """A stream-K plan (a plan that shares nothing is one whatever the config asked for)."""
    return gemm_configs.SplitPlan(whole_tiles, sharing, slots, stream=bool(sharing))


def SK(*args, **kwargs):
    return GemmConfig(*args, stream_k=True, **kwargs)


@pytest.mark.parametrize("tiles,k,config,expect", [
    (80, 8192, SK(128, 128, 64, split_k=16), S(80)),                 # 256x5120: 0.61 of a wave (measured: slower)
    (40, 8192, SK(128, 128, 64, split_k=16), S(0, 132, 5)),          # 0.30 of a wave: shared
    (160, 8192, SK(128, 128, 64, split_k=16), S(132, 132, 6)),       # one wave whole, 28 tiles shared
    (160, 8192, SK(128, 128, 64, split_k=16, split_wave=True), S(0, 132, 2)),
    (160, 8192, SK(128, 128, 64, split_k=4), S(132, 112, 5)),        # <= 4 programs a tile on average
    (128, 8192, SK(128, 128, 64, split_k=16), S(128)),               # 97% of a wave
    (20, 256, SK(64, 64, 128, split_k=8), S(20)),                    # 2 k-steps a tile: too short
    (264, 8192, SK(64, 64, 128, split_k=8), S(264)),                 # whole waves
    (20, 8192, SK(64, 64, 128), S(20)),                              # split_k = 1
    (1, 64, SK(64, 64, 64, split_k=16), S(1)),                       # one k-step: nothing to share
])
def test_stream_split_shares_only_a_small_last_wave(tiles, k, config, expect):
    assert gemm_configs.stream_split(config, tiles, k, 132) == expect
    assert gemm_configs.split_plan(config, tiles, k, 132) == expect


W = gemm_configs.SplitPlan


@pytest.mark.parametrize("tiles,k,config,expect", [
    # what the pre-stream-K kernel (git 193949b^) ran for the shipped tables' split entries: the plan
    # is the meaning of an entry, so these must not move
    (36, 16384, GemmConfig(128, 128, 64, split_k=4), W(0, 3, 3)),        # 256x2304x16384
    (160, 8192, GemmConfig(128, 128, 64, split_k=16), W(132, 4, 4)),     # 512x5120x8192: 28 tiles in 4 parts
    (256, 14336, GemmConfig(128, 256, 64, split_k=8), W(256)),           # 1024x8192x14336: a split would cost more
    (128, 14336, GemmConfig(16, 64, 128, split_k=8, swap_ab=True), W(128)),  # decode, 97% of a wave: whole
    (20, 8192, GemmConfig(16, 64, 128, split_k=16, swap_ab=True), W(0, 6, 6)),
    (80, 8192, GemmConfig(128, 256, 64, split_k=16), W(0, 3, 3)),        # 240 parts: two rounds of thirds
    (4096, 8192, GemmConfig(128, 256, 64, split_k=16), W(4092, 16, 16)),
    (20, 8192, GemmConfig(64, 64, 128), W(20)),                           # split_k = 1
])
def test_wave_split_is_the_rule_the_older_entries_were_measured_under(tiles, k, config, expect):
    assert gemm_configs.wave_split(config, tiles, k, 132) == expect
    assert gemm_configs.split_plan(config, tiles, k, 132) == expect


def test_stream_split_counts_two_programs_on_one_sm_as_one_sm():
    """Two programs per SM share its throughput: 128 tiles on 264 programs are one round of whole tiles
    on 132 SMs, not half a round (sharing them would only add partials); 80 tiles still share."""
    two = SK(128, 128, 64, split_k=4, num_warps=8, num_stages=3, occupancy=2)
    assert gemm_configs.stream_split(two, 128, 1024, 264) == S(128)
    assert gemm_configs.stream_split(two, 80, 8192, 264).sharing == 264


@pytest.mark.parametrize("tiles,steps,programs,cap,wave", [(80, 128, 132, 16, False), (160, 128, 132, 16, False),
                                                          (160, 128, 132, 16, True), (13, 4, 4, 3, False),
                                                          (13, 4, 4, 3, True), (3, 7, 4, 3, False),
                                                          (20, 64, 132, 16, False), (7, 5, 264, 16, False),
                                                          (290, 9, 132, 4, True), (133, 3, 132, 16, False)])
def test_stream_split_slots_hold_every_part_of_a_tile(tiles, steps, programs, cap, wave):
    """Cut the shared k-steps as the kernel's stream_range does (``least`` each, one more for the first
    ``longer``): every shared tile meets at most ``slots`` ranges, and every range is >= 2 k-steps
    (whatever share of a wave the last wave is: max_tail=1)."""
    plan = gemm_configs.stream_split(SK(16, 16, 16, split_k=cap, split_wave=wave), tiles, steps * 16, programs,
                                     max_tail=1.0)
    if not plan.shared:
        return
    shared_steps = (tiles - plan.whole_tiles) * steps
    least, longer = divmod(shared_steps, plan.sharing)
    assert least >= gemm_configs.MIN_PART_STEPS
    starts = [p * least + min(p, longer) for p in range(plan.sharing + 1)]
    assert starts[-1] == shared_steps
    for t in range(tiles - plan.whole_tiles):
        meeting = [p for p in range(plan.sharing) if starts[p] < (t + 1) * steps and starts[p + 1] > t * steps]
        assert 1 <= len(meeting) <= plan.slots


@pytest.mark.parametrize("m,n,k", [(1, 1280, 8192), (128, 8192, 3584), (16384, 28672, 8192)])
def test_candidates_fit_and_include_the_rule(m, n, k):
    found = gemm_candidates.candidates(m, n, k, 132)
    assert gemm_configs.untuned_config(m, n, k, 132) in found
    assert all(c.smem_bytes(2) <= gemm_configs.SMEM_BYTES for c in found)
    assert len(found) == len(set(found)) and len(found) <= 80
    assert not any(c.split_wave for c in found), "measured slower than the tile unsplit in 251 of 287 pairs"
    plans = [gemm_configs.split_plan(c, gemm_configs.tiles_of(c, m, n), k, 132 * c.occupancy) for c in found]
    if m < 16384:  # both ways of splitting where a wave is partial
        assert any(p.shared and not p.stream for p in plans) and any(p.shared and p.stream for p in plans)
    for config, plan in zip(found, plans):  # a config whose split splits nothing is measured once, unsplit
        assert plan.shared or config.split_k == 1 or config == gemm_configs.untuned_config(m, n, k, 132)


def test_mid_m_candidates_hold_the_big_tiles_deeper_and_two_part_splits():
    """M = 128-512 (the H100 grid's worst cells): 128x256 / 256x128 tiles at four stages, 128x128 at five
    and six, 64x128 at six and eight, 64x64x128 at six (B from DRAM: deeper pipelines), and a two-part
    wave split where it is another plan than the caps 4 and 16 make (40 tiles of 128x256 at
    256x5120x8192: 2 parts on 80 programs against 3 on 120); none of it at M = 64 or 1024."""
    found = gemm_candidates.candidates(256, 5120, 8192)
    labels = {c.label for c in found}
    assert {"N128x256x64/g8/s1/w8/p4", "N256x128x64/g8/s1/w8/p4", "N128x128x64/g8/s1/w8/p5",
            "N128x128x64/g8/s1/w8/p6", "N64x128x64/g8/s1/w4/p6", "N64x128x64/g8/s1/w4/p8",
            "N64x64x128/g8/s1/w4/p6"} <= labels, labels
    assert all(c.smem_bytes(2) <= gemm_configs.SMEM_BYTES for c in found)
    two = GemmConfig(128, 256, 64, 8, 2, False, 8, 4)
    assert two in found
    tiles = gemm_configs.tiles_of(two, 256, 5120)
    assert gemm_configs.split_plan(two, tiles, 8192, 132) == gemm_configs.SplitPlan(0, 2, 2)
    assert gemm_configs.split_plan(replace(two, split_k=4), tiles, 8192, 132) == gemm_configs.SplitPlan(0, 3, 3)
    assert not any(c.num_stages == 4 and c.block_m * c.block_n == 128 * 256 or c.split_k == 2
                   or c.num_stages >= 6 and not c.swap_ab for c in gemm_candidates.candidates(64, 5120, 8192))
    assert not any(c.split_k == 2 for c in gemm_candidates.candidates(1024, 5120, 8192))


def test_narrow_n_candidates_above_m_512_hold_the_deep_pipelines_and_halved_c_stores():
    """M = 1024-4096 at K >= 4096 where 128x128 tiles make <= 3 waves (the round-5 H100 grid's QKV cells at
    1.19-1.28x): 128x128 at five and six stages (five with the TMA store), 128x256 / 256x128 at four; not at
    wide N (2048x28672) nor short K; 128x256 with the TMA store keeps three stages (C staged in halves)."""
    deep = {"N128x128x64/g8/s1/w8/p5", "N128x128x64/g8/s1/w8/p6", "N128x128x64/g8/s1/w8/p5/f/t",
            "N128x256x64/g8/s1/w8/p4", "N256x128x64/g8/s1/w8/p4"}
    for m, n in ((1024, 2560), (2048, 1280), (2048, 2560), (4096, 1280), (1024, 5120)):
        found = gemm_candidates.candidates(m, n, 8192)
        labels = {c.label for c in found}
        assert deep <= labels, (m, n, deep - labels)
        assert "N128x256x64/g8/s1/w8/p3/f/t" in labels, "the halved C store keeps three stages"
        # (~20 of them the split tiles summed apart, wave split and stream-K)
        assert len(found) <= 90 and all(c.smem_bytes(2) <= gemm_configs.SMEM_BYTES for c in found)
    for m, n, k in ((2048, 28672, 8192), (1024, 2560, 2048), (8192, 1280, 8192)):
        assert not deep & {c.label for c in gemm_candidates.candidates(m, n, k)}, (m, n, k)
    halved = GemmConfig(128, 256, 64, 8, 1, False, 8, 3, flatten=True, tma_store=True)
    assert halved.c_halves == 2 and halved.fitted(2).num_stages == 3
    assert halved.smem_bytes(2) == 3 * (128 + 256) * 64 * 2 + 128 * 128 * 2
    assert GemmConfig(128, 128, 64, num_stages=4, tma_store=True).c_halves == 1


def test_fp32_halves_the_k_step_and_cpu_gets_small_tiles():
    config = gemm_tables.gemm_config(4096, 8192, 8192, torch.float32, torch.device("meta"))
    assert config.smem_bytes(4) <= gemm_configs.SMEM_BYTES
    assert gemm_tables.gemm_config(4096, 8192, 8192, torch.bfloat16, torch.device("cpu")) == gemm_configs.CPU_CONFIG


def test_table_lookup_round_trip(tmp_path, monkeypatch):
    """A written table is what gemm_config reads: exact (N, K), the smallest measured M >= M, the
    no-split entry for fused ops; other shapes fall back to the rule."""
    best = GemmConfig(16, 64, 256, 1, 6, True, 4, 4)
    plain = GemmConfig(16, 32, 256, 1, 1, True, 4, 4)
    big = GemmConfig(128, 256, 64, 8, 1, False, 8, 3)
    mid = SK(128, 128, 64, 8, 4, False, 8, 4)
    rows = [dict(m=16, n=1280, k=8192, config=best.as_list(), no_split=plain.as_list()),
            dict(m=8192, n=1280, k=8192, config=big.as_list(), no_split=big.as_list()),
            dict(m=128, n=1536, k=8192, config=mid.as_list(), no_split=big.as_list())]
    monkeypatch.setattr(gemm_tables, "DATA", tmp_path)
    gemm_tables.write_table("h200", dict(gpu="NVIDIA H200"), rows)
    try:
        assert json.loads((tmp_path / "gemm_h200.json").read_text())["gpu"] == "NVIDIA H200"
        pick = lambda m, n, k, split=True: gemm_tables.gemm_config(m, n, k, torch.bfloat16, torch.device("meta"),
                                                                   split)
        assert pick(9, 1280, 8192) == best
        assert pick(9, 1280, 8192, split=False) == plain
        assert pick(1000, 1280, 8192) == big
        assert pick(9, 1280, 4096) == best, "the nearest measured (N, K) within 2x answers"
        assert pick(9, 1280, 2048) == gemm_configs.untuned_config(9, 1280, 2048)
        # (1536, 8192) was measured at M = 128 only: it answers there (and for its neighbours at M = 128),
        # never at M = 16 -- the nearest shape measured at M = 16 does (2026-11-27: T128 tiles at M = 1-64)
        assert pick(16, 1536, 8192) == best and pick(1, 1536, 8192) == best
        assert pick(100, 1536, 8192) == mid and pick(128, 1280, 8192) == mid
        assert pick(200, 1536, 8192) == big
    finally:
        gemm_tables.load_table.cache_clear()


@pytest.mark.parametrize("key", ["h100", "h200"])
def test_shipped_table_answers_every_cell_with_its_own_entry(key):
    """The config a cell of the grid gets is the table's entry for that cell where the table has one,
    else an entry measured at the same M (a neighbouring shape) or the rule -- never an entry of
    another M; the no-split answer likewise."""
    from symmcoll.bench.gemm import GRID_M, SHAPES
    from symmcoll.bench.gemm_tune import FUSED_SHAPES
    table = gemm_tables.load_table(key)
    assert table, f"data/gemm_{key}.json ships"
    for (m, n, k), (best, no_split) in table.items():
        assert gemm_tables.lookup(table, m, n, k, True) == best
        assert gemm_tables.lookup(table, m, n, k, False) == no_split
    for _, n, k in SHAPES + FUSED_SHAPES:
        for m in GRID_M:
            answer = gemm_tables.lookup(table, m, n, k, True)
            answered_by = [(tm, tn, tk) for (tm, tn, tk), (best, _) in table.items() if best == answer]
            assert answer is None or any(tm == m for tm, _, _ in answered_by), (m, n, k, answer.label)


@pytest.mark.parametrize("key", ["h100", "h200"])
def test_shipped_entries_run_what_they_were_measured_as(key):
    """Entries measured before stream-K (the wave split) say so; a stream-K entry's plan at its own cell
    is the plan it was measured with (the rule before the measured limit on the last wave, which
    must not move it)."""
    rows = json.loads(gemm_tables.table_path(key).read_text())["entries"]
    for row in rows:
        # every field spelled out; a two-part tile adds its second width (the 14th), a config that sums apart
        # the 14th and 15th, a Gluon decode tile the 14th-16th (17th: A's own ring); a no-split config has one part,
        # on the Triton core
        one_part = len(GemmConfig(16, 16, 16).as_list())
        assert len(row["no_split"]) == one_part and len(row["config"]) in range(one_part, one_part + 5), \
            "shipped tables spell every field out"
        assert not GemmConfig.from_list(row["no_split"]).gluon
        config = GemmConfig.from_list(row["config"]).fitted(2)
        assert row["label"] == config.label
        # rows without a source are the first tune's (2026-11-24, before stream-K)
        if row.get("source", "tune 2026-11-24").startswith("tune 2026-11-24"):
            assert not config.stream_k, (row["m"], row["n"], row["k"], row["label"])
        if config.stream_k:
            tiles, programs = gemm_configs.tiles_of(config, row["m"], row["n"]), 132 * config.occupancy
            assert gemm_configs.stream_split(config, tiles, row["k"], programs) == gemm_configs.stream_split(
                config, tiles, row["k"], programs, max_tail=1.0)


def test_config_list_round_trip_reads_older_tables():
    """A list means what it meant when it was written: up to 11 fields the wave split (tables before
    stream-K), 12 fields stream-K (the tune of git 50c1510), 13 fields say which."""
    config = GemmConfig(128, 128, 64, 8, 16, False, 8, 3, 2, True, True, True, True)
    assert GemmConfig.from_list(config.as_list()) == config
    wave = GemmConfig(128, 128, 64, 8, 16, False, 8, 3)
    assert GemmConfig.from_list(wave.as_list()) == wave and not wave.stream_k
    assert GemmConfig.from_list([64, 128, 64, 8, 4, 0, 4, 4]) == GemmConfig(64, 128, 64, 8, 4, False, 4, 4)
    assert GemmConfig.from_list([16, 64, 128, 1, 8, 1, 4, 5, 1, 0, 0]) == GemmConfig(16, 64, 128, 1, 8, True, 4, 5)
    assert GemmConfig.from_list([128, 128, 64, 8, 4, 0, 8, 4, 1, 0, 0, 0]) == SK(128, 128, 64, 8, 4, False, 8, 4)
    unsplit = GemmConfig(128, 128, 64, 8, 1, False, 8, 4)
    assert GemmConfig.from_list([128, 128, 64, 8, 1, 0, 8, 4, 1, 0, 0, 0]) == unsplit and not unsplit.stream_k
    assert "sk16+" in config.label and "/s16/" in wave.label
    with pytest.raises(ValueError, match="split_wave"):
        GemmConfig(128, 128, 64, split_k=16, split_wave=True)


def test_written_tables_spell_out_what_older_rows_meant(tmp_path):
    """A table written from kept rows of older tables (tune --base) keeps their meaning explicitly."""
    rows = [dict(m=8, n=8192, k=14336, config=[16, 64, 128, 1, 8, 1, 4, 5, 1, 0, 0], no_split=[16, 64, 128, 1, 1, 1,
                                                                                                4, 5, 1, 0, 0]),
            dict(m=256, n=2560, k=8192, config=[64, 64, 128, 8, 4, 0, 4, 4, 1, 1, 0, 0],
                 no_split=[64, 64, 128, 8, 1, 0, 4, 4, 1, 1, 0, 0], label="N64x64x128/g8/s4/w4/p4/f")]
    path = gemm_tables.write_table("h100", dict(gpu="NVIDIA H100"), rows, tmp_path / "t.json")
    written = json.loads(path.read_text())["entries"]
    assert [GemmConfig.from_list(r["config"]).stream_k for r in written] == [False, True]
    assert [r["label"] for r in written] == ["T16x64x128/g1/s8/w4/p5", "N64x64x128/g8/sk4/w4/p4/f"]
    gemm_tables.load_table.cache_clear()


def test_two_part_tiles_are_one_wave_whole_and_read_from_older_lists():
    """A two-part tile (block_n2) is block_n + block_n2 columns wide in every count (tiles, shared
    memory), labelled with both parts, round-trips through its list (14 fields), and a list without the
    14th field (every table before it) means one part; it is whole, straight and masked-stored only."""
    config = GemmConfig(64, 128, 64, 8, 1, False, 4, 4, block_n2=32)
    assert config.tile_n == 160 and config.label == "N64x128+32x64/g8/s1/w4/p4"
    assert gemm_configs.tiles_of(config, 512, 2560) == 8 * 16 == 128
    assert config.smem_bytes(2) == 4 * (64 + 160) * 64 * 2
    assert GemmConfig.from_list(config.as_list()) == config and len(config.as_list()) == 14
    plain = GemmConfig(64, 128, 64, 8, 1, False, 4, 4)
    assert len(plain.as_list()) == 13 and GemmConfig.from_list(plain.as_list()).block_n2 == 0
    assert gemm_configs.split_plan(config, 128, 8192, 132) == gemm_configs.SplitPlan(128)
    # the wave split shares whole two-part tiles: 32 of 128 x (128+32) at 256x2560 in 4 parts, one wave
    split = GemmConfig(128, 128, 64, 8, 4, False, 8, 4, block_n2=32)
    assert gemm_configs.split_plan(split, gemm_configs.tiles_of(split, 256, 2560), 8192, 132) == \
        gemm_configs.SplitPlan(0, 4, 4)
    for bad, field in ((dict(split_k=4, stream_k=True), "stream_k"), (dict(swap_ab=True), "swap_ab"),
                       (dict(tma_store=True), "tma_store")):
        with pytest.raises(ValueError, match=f"two-part tile.*{field}"):
            GemmConfig(64, 128, 64, block_n2=32, **bad)
    for width in (8, 48, 128, 256):  # not a power of two >= 16, or a whole power-of-two tile
        with pytest.raises(ValueError, match="block_n2"):
            GemmConfig(64, 128, 64, block_n2=width)


def test_tuner_offers_one_wave_two_part_tiles_for_the_narrow_n_cells():
    """The QKV cells at 1.10-1.22x on the settled H100 grid (N = 1280-5120, K = 8192, M = 256-4096) get
    two-part tiles that make 128 tiles -- one wave, less 4 SMs -- on 132 SMs: 512x2560 in 64 x (128+32)
    and 128 x (64+16); every whole two-part candidate fills its last wave to >= 90%; none at decode or short K;
    a fused op (split=False) never gets one from a table."""
    from symmcoll.bench.gemm_tune import cell_candidates
    labels = {c.label for c in cell_candidates(512, 2560, 8192, 132, {})}
    assert {"N64x128+32x64/g8/s1/w4/p4", "N64x128+32x64/g8/s1/w4/p6", "N128x64+16x64/g8/s1/w8/p4"} <= labels
    for m, n, tile in ((512, 5120, "N128x128+32x64"), (2048, 1280, "N128x128+32x64"), (256, 2560, "N64x64+16x64"),
                       (2048, 2560, "N128x256+64x64"), (4096, 1280, "N128x256+64x64"), (1024, 2560, "N128x128+32x64")):
        found = [c for c in gemm_candidates.candidates(m, n, 8192) if c.block_n2 and c.split_k == 1]  # (whole tiles)
        assert tile in {c.label.split("/")[0] for c in found}, (m, n, [c.label for c in found])
        for config in found:
            tiles = gemm_configs.tiles_of(config, m, n)
            one_wave = 0.8 * 132 <= tiles <= 132
            assert one_wave or gemm_candidates.wave_fill(tiles, 132) >= 0.9 and tiles <= 2 * 132, \
                (m, n, config.label, tiles)
            assert config.smem_bytes(2) <= gemm_configs.SMEM_BYTES
    # cuBLAS's tilings where it beat us by 1.10-1.20x (one H100, 2026-11-27: nvjet 128x96 / 64x96 in one wave of
    # 108-112 tiles, 6-8 stages): whole, one wave, the deepest pipeline that fits among them
    for m, n, tile, tiles in ((512, 2560, "N128x64+32x64", 108), (256, 5120, "N128x64+32x64", 108),
                              (256, 2560, "N64x64+32x64", 108), (512, 1280, "N64x64+32x64", 112)):
        found = [c for c in gemm_candidates.two_part_candidates(m, n, 8192) if c.label.startswith(tile + "/")]
        assert found and all(c.split_k == 1 and gemm_configs.tiles_of(c, m, n) == tiles for c in found), (m, n)
        assert max(c.num_stages for c in found) >= 7 and all(c.smem_bytes(2) <= gemm_configs.SMEM_BYTES
                                                             for c in found)
    assert not gemm_candidates.two_part_candidates(64, 2560, 8192)
    assert not gemm_candidates.two_part_candidates(512, 2560, 512)
    two_part = GemmConfig(64, 128, 64, 8, 1, False, 4, 4, block_n2=32)
    table = gemm_tables.table_of([dict(m=512, n=2560, k=8192, config=two_part.as_list(), no_split=two_part.as_list())])
    assert gemm_tables.lookup(table, 512, 2560, 8192, True) == two_part
    assert gemm_tables.lookup(table, 512, 2560, 8192, False) == replace(two_part, block_n2=0)


# The H100 grid's cells above 1.10x after round 8 (Llama-3-70B QKV, K = 8192) and the wave-split two-part
# tilings that make one wave there: (m, n, tile, parts) -- tiles x parts = 128 units on 132 SMs.
SPLIT_TWO_PART_CELLS = [(256, 2560, "N128x128+32x64", 4), (512, 2560, "N128x128+32x64", 2),
                        (256, 5120, "N128x128+32x64", 2), (128, 1280, "N64x64+16x64", 4),
                        (512, 1280, "N128x128+32x64", 4)]


def test_tuner_offers_wave_split_two_part_tiles_under_one_wave():
    """Where M <= 512 leaves too few two-part tiles for a wave, the tune gets them wave-split: the
    decompositions of SPLIT_TWO_PART_CELLS among the candidates, each split two-part candidate's
    (tile, part) units >= 90% of the SMs and at most all of them, parts of >= 16 k-steps, no tile wider
    than 96 accumulator values a thread (ptxas spills beyond), at most ~150 candidates a cell (120 before the
    configs that sum apart: 18 more at 128x1280; then the deep pipelines: up to 11 more); 128x128
    in 3 parts (40 tiles: 120 units) at the 40-tile cells; none past M = 512, at decode or short K."""
    for m, n, tile, parts in SPLIT_TWO_PART_CELLS:
        found = gemm_candidates.candidates(m, n, 8192)
        assert len(found) <= 150, (m, n, len(found))
        split = [c for c in found if c.block_n2 and c.split_k > 1]
        assert any(c.label.startswith(tile) and c.split_k == parts for c in split), (m, n, [c.label for c in split])
        for config in split:
            tiles = gemm_configs.tiles_of(config, m, n)
            plan = gemm_configs.split_plan(config, tiles, 8192, 132)
            assert plan == gemm_configs.SplitPlan(0, config.split_k, config.split_k), (config.label, plan)
            assert 0.9 * 132 <= tiles * plan.sharing <= 132 and 8192 // 64 >= 16 * plan.sharing, config.label
            assert config.block_m * config.tile_n // (32 * config.num_warps) <= 96 and config.num_stages >= 5
        if gemm_configs.tiles_of(GemmConfig(128, 128, 64), m, n) == 40:
            assert any(gemm_configs.split_plan(c, 40, 8192, 132) == gemm_configs.SplitPlan(0, 3, 3)
                       for c in found if (c.block_m, c.block_n, c.block_n2, c.stream_k) == (128, 128, 0, False))
    for m, n, k in ((1024, 2560, 8192), (64, 1280, 8192), (256, 2560, 1024)):
        assert not any(c.block_n2 and c.split_k > 1 for c in gemm_candidates.candidates(m, n, k)), (m, n, k)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="block_n"):
        GemmConfig(16, 48, 64)
    with pytest.raises(ValueError, match="split_k"):
        GemmConfig(16, 64, 64, split_k=0)


def test_bench_summary_flags_targets():
    from symmcoll.bench.gemm import summarize
    rows = [dict(shape="a", m=16, ratio=0.9, weight_tbs=3.8, weight_mb=64.0, read_tbs_same_bytes=3.7),
            dict(shape="b", m=16, ratio=1.2, weight_tbs=2.9, weight_mb=40.0, read_tbs_same_bytes=3.0),
            dict(shape="c", m=16, error="wrong", rel_err=1.0, cublas_rel_err=1e-3),
            dict(shape="d", m=16, ratio=0.5, weight_tbs=9.0, weight_mb=64.0, error="wrong after the timed replays"),
            dict(shape="e", m=128, ratio=1.0, weight_tbs=1.0, weight_mb=64.0)]
    s = summarize(rows)
    assert s["timed"] == 3 and s["wrong"] == 2 and s["above_1_10"] == 1 and s["worst_cell"] == "b M=16"
    assert abs(s["geomean_ratio"] - (0.9 * 1.2) ** (1 / 3)) < 1e-12 and s["min_decode_weight_tbs"] == 2.9
    # the decode target (M <= 64, B >= 32 MB): 1 of 2 at 3.6 TB/s; 1 of the 2 read-timed at the read kernel's rate
    assert (s["decode_at_3_6_tbs"], s["decode_cells"], s["decode_at_read_rate"], s["decode_read_timed"]) == (1, 2, 1, 2)


def test_bench_summary_judges_by_the_paired_ratio():
    """A row with ratio_paired (the median of per-round ratios) is judged by it: geomean, worst and cells
    above 1.10x; the pooled figures stay beside them; rows without one (older results) by ratio."""
    from symmcoll.bench.gemm import summarize
    from symmcoll.bench.rounds import paired_ratio, paired_ratios
    mine, theirs = [10.0, 13.0, 11.5], [9.5, 12.0, 10.0]          # cuBLAS's round 1 slow with ours'
    paired = paired_ratio(paired_ratios(mine, theirs))
    rows = [dict(shape="a", m=16, ratio=sorted(mine)[1] / sorted(theirs)[1], ratio_paired=paired, weight_tbs=3.8,
                 weight_mb=64.0),
            dict(shape="b", m=16, ratio=1.05, weight_tbs=2.9, weight_mb=40.0)]
    assert rows[0]["ratio"] == pytest.approx(1.15) and paired == pytest.approx(13.0 / 12.0)
    s = summarize(rows)
    assert s["ratio"] == "paired rounds" and s["above_1_10"] == 0 and s["above_1_10_pooled"] == 1
    assert s["geomean_ratio"] == pytest.approx((paired * 1.05) ** 0.5) and s["worst_ratio"] == pytest.approx(paired)
    assert s["geomean_ratio_pooled"] == pytest.approx((1.15 * 1.05) ** 0.5)


def test_tune_cells_from_a_bench_result_worst_first(tmp_path):
    from symmcoll.bench.gemm_tune import cells_above
    rows = [dict(shape="a", m=16, n=1280, k=8192, ratio=1.02), dict(shape="b", m=256, n=5120, k=8192, ratio=1.35),
            dict(shape="c", m=512, n=2560, k=8192, ratio=1.2), dict(shape="d", m=8, n=64, k=64, error="wrong")]
    result = tmp_path / "gemm.json"
    result.write_text(json.dumps(dict(rows=rows)))
    assert cells_above(result, 1.05) == [("d", 8, 64, 64), ("b", 256, 5120, 8192), ("c", 512, 2560, 8192)]
    assert cells_above(result, 1.3) == [("d", 8, 64, 64), ("b", 256, 5120, 8192)]
    assert cells_above(result, 1.05, {256, 512}) == [("b", 256, 5120, 8192), ("c", 512, 2560, 8192)]
    import gzip  # a result kept gzipped (benchmarks/results/README.md) reads the same
    packed = tmp_path / "gemm.json.gz"
    packed.write_bytes(gzip.compress(result.read_bytes()))
    assert cells_above(packed, 1.3) == [("d", 8, 64, 64), ("b", 256, 5120, 8192)]


# ---- on the GPU machine --------------------------------------------------------------------------------

GPU_CONFIGS = [None, GemmConfig(16, 64, 128, 1, 4, True, 4, 5), GemmConfig(64, 128, 64, 8, 2, False, 4, 4),
               GemmConfig(128, 256, 64, 8, 1, False, 8, 3), GemmConfig(32, 128, 256, 1, 8, True, 4, 3),
               GemmConfig(64, 128, 64, 8, 1, False, 4, 4, block_n2=32), GemmConfig(128, 64, 64, 8, 1, False, 8, 4,
                                                                                   block_n2=16),
               GemmConfig(128, 128, 64, 8, 4, False, 8, 4, block_n2=32),  # two-part, wave-split
               GemmConfig(128, 64, 64, 8, 1, False, 8, 7, block_n2=32),  # cuBLAS's 128 x 96, one wave, deep
               GemmConfig(128, 64, 64, 8, 1, False, 8, 8),  # (a small product's one-wave tile, eight stages)
               GemmConfig(128, 128, 64, 8, 16, False, 8, 5, sum_apart=True),  # split tiles summed by a second kernel
               GemmConfig(128, 256, 64, 8, 16, False, 8, 3, stream_k=True, sum_apart=True),  # ... stream-K's too
               GemmConfig(64, 128, 64, 8, 1, False, 4, 9), GemmConfig(64, 64, 128, 8, 4, False, 4, 7)]  # 216 / 224 KB


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=lambda c: c.label if c else "auto")
@pytest.mark.parametrize("shape", [(1, 1280, 8192), (37, 4096, 7160), (300, 2304, 1000), (2048, 8192, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("b_t", [False, True], ids=["B", "W^T"])
def test_gpu_matmul_configs(config, shape, b_t):
    m, n, k = shape
    a, b = _operands(m, n, k, torch.bfloat16, b_t, "cuda", seed=m + k)
    got = gemm.matmul(a, b, config=config)
    want = torch.matmul(a, b)
    assert _rel_err(got, a, b) <= max(1.25 * _rel_err(want, a, b), 5e-3)


def _captured_matmul(a, b, config):
    """(a CUDA graph of gemm.matmul(a, b, config), its output): replays read a's and b's current data."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemm.matmul(a, b, config=config)
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("config", [GemmConfig(16, 64, 128, 1, 8, True, 4, 5),
                                    GemmConfig(64, 64, 64, 8, 4, False, 4, 6, block_n2=16),  # two-part, 4 parts
                                    GemmConfig(64, 128, 64, 8, 16, False, 4, 4, sum_apart=True),  # a second kernel
                                    GemmConfig(64, 128, 64, 8, 16, False, 4, 4, stream_k=True, sum_apart=True)],
                         ids=lambda c: c.label)
def test_gpu_split_k_in_graph_replays_with_fresh_data(config):
    a = torch.empty((16, 8192), dtype=torch.bfloat16, device="cuda")
    b = torch.randn((8192, 1280), dtype=torch.bfloat16, device="cuda")
    a.normal_()
    gemm.matmul(a, b, config=config)  # compile outside the capture
    graph, out = _captured_matmul(a, b, config)
    for _ in range(5):
        a.normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(out, a, b) < 5e-3
    assert int(gemm.split_counters(a.device).abs().sum()) == 0
    from symmcoll.fused import gemm_split  # the captured launch's counters: a slice of the arena, zero again
    assert int(gemm_split._ARENAS[(a.device.type, a.device.index)][0].abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("config,m,n,k", [
    (GemmConfig(128, 128, 64, 8, 2, False, 8, 6), 256, 4096, 7168),   # 64 tiles in 2 parts on 128 programs
    (GemmConfig(128, 128, 64, 8, 2, False, 8, 4), 1024, 1024, 1024),
    (GemmConfig(64, 128, 64, 8, 2, False, 4, 6), 512, 2560, 4096),    # a wave whole first, then 28 tiles' pairs
], ids=lambda v: v.label if isinstance(v, GemmConfig) else str(v))
def test_gpu_two_part_tiles_give_the_same_bits_every_way(config, m, n, k):
    """Tiles in two parts summed by split_reduce (0), pair_reduce (1) and exchange_halves (2, where both parts run
    at once: these launches): the same bits eagerly, the counters zero after each, and a CUDA graph of the
    halves exchange replayed on fresh data gives what split_reduce gives eagerly on that data."""
    programs = gemm.programs_for(config, torch.device("cuda"))
    assert gemm.launch_pair_mode(config, m, n, k, 2, programs, "cuda", 2) == 2
    a, b = _operands(m, n, k, torch.bfloat16, False, "cuda", seed=m + n)
    results = []
    for mode in (0, 1, 2, 2):
        with gemm.pair_reduce_switched(mode):
            results.append(gemm.matmul(a, b, config=config))
        torch.cuda.synchronize()
        assert int(gemm.split_counters(a.device).abs().sum()) == 0, f"mode {mode} left a counter set"
    assert all(torch.equal(results[0], r) for r in results[1:]), "the ways of summing two parts differ"
    assert _rel_err(results[0], a, b) < 5e-3
    with gemm.pair_reduce_switched(2):
        graph, out = _captured_matmul(a, b, config)
    for _ in range(3):
        a.normal_()
        graph.replay()
        with gemm.pair_reduce_switched(0):
            want = gemm.matmul(a, b, config=config)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
    from symmcoll.fused import gemm_split  # the captured launch's counters: a slice of the arena, zero again
    assert int(gemm_split._ARENAS[(a.device.type, a.device.index)][0].abs().sum()) == 0


def test_pair_mode_exchanges_halves_only_where_both_parts_run_at_once():
    """exchange_halves (2) needs both parts of a tile resident and running: a GPU (or a compile on meta), one
    round of parts, C stored by pointer or in half tiles; else pair_reduce (1) where two parts fit the registers;
    the switch caps it."""
    two = GemmConfig(128, 128, 64, 8, 2, False, 8, 6)
    assert gemm.launch_pair_mode(two, 256, 4096, 7168, 2, 132, "cuda", 2) == 2
    assert gemm.launch_pair_mode(two, 256, 4096, 7168, 2, 132, "meta", 2) == 2
    assert gemm.launch_pair_mode(two, 256, 4096, 7168, 2, 132, "cpu", 2) == 1   # the interpreter: one at a time
    assert gemm.launch_pair_mode(two, 256, 4096, 7168, 2, 132, "cuda", 1) == 1
    assert gemm.launch_pair_mode(two, 256, 4096, 7168, 2, 132, "cuda", 0) == 0
    assert gemm.launch_pair_mode(replace(two, tma_store=True), 256, 4096, 7168, 2, 132, "cuda", 2) == 1
    assert gemm.launch_pair_mode(GemmConfig(128, 256, 64, 8, 2, False, 8, 4, tma_store=True), 256, 2048, 7168, 2,
                                 132, "cuda", 2) == 0  # 128 fp32 a thread: split_reduce
    assert gemm.launch_pair_mode(replace(two, split_k=4), 256, 4096, 7168, 2, 132, "cuda", 2) == 2  # still 2 parts
    assert gemm.launch_pair_mode(replace(two, split_k=4), 256, 2304, 16384, 2, 132, "cuda", 2) == 0  # 3 parts
    assert gemm.launch_pair_mode(replace(two, stream_k=True), 256, 2560, 8192, 2, 132, "cuda", 2) == 0
    # two rounds of parts (more parts than programs: never the wave split's own choice) -> pairs
    plan = gemm_configs.SplitPlan(0, 2, 2)
    assert gemm.pair_mode(two, plan, 80, False, 2, 132, "cuda") == 1
    assert gemm.pair_mode(two, plan, 66, False, 2, 132, "cuda") == 2


@pytest.mark.parametrize("config,m,n,k", [
    (SK(128, 128, 64, 8, 16, False, 8, 4), 256, 2560, 8192),                         # stream-K
    (SK(128, 128, 64, 8, 16, False, 8, 4, split_wave=True), 512, 5120, 8192),
    (SK(64, 128, 64, 8, 4, False, 4, 4, occupancy=2), 256, 2560, 8192),
    (GemmConfig(128, 128, 64, 8, 16, False, 8, 4), 256, 5120, 8192),                 # the wave split
    (GemmConfig(128, 128, 64, 8, 2, False, 8, 6), 256, 4096, 7168),                   # two parts: halves exchanged
    (GemmConfig(128, 128, 64, 8, 8, False, 8, 6), 256, 4096, 7168),                   # ... from split_k 8
    (GemmConfig(64, 128, 64, 8, 2, False, 4, 6), 512, 2560, 4096),                    # a wave whole, 28 tiles' halves
    (GemmConfig(128, 128, 64, 8, 2, False, 8, 4, tma_store=True), 256, 4096, 7168),   # whole C tiles by TMA: pairs
    (GemmConfig(16, 64, 256, 1, 4, True, 4, 5), 1, 1280, 8192),                       # M = 1 specialised
    (SK(16, 64, 256, 1, 4, True, 4, 5), 1, 1280, 8192),
    (GemmConfig(128, 128, 64, 8, 16, False, 8, 4), 256, 8192, 1024),                 # 128 tiles: whole
    (SK(128, 128, 64, 8, 16, False, 8, 4), 256, 5120, 8192),                         # 0.61 of a wave: whole
    (GemmConfig(128, 256, 64, 8, 1, False, 8, 3), 16384, 8192, 8192),
    (GemmConfig(64, 128, 64, 8, 1, False, 4, 4, block_n2=32), 512, 2560, 8192),        # two-part: one wave
    (GemmConfig(128, 128, 64, 8, 4, False, 8, 5, block_n2=32), 256, 2560, 8192),       # two-part, wave-split
    (GemmConfig(64, 64, 64, 8, 4, False, 4, 6, block_n2=16), 128, 1280, 8192),
    (GemmConfig(64, 64, 128, 8, 1, False, 4, 3, occupancy=2, flatten=True), 2048, 1024, 1024),  # a small product
    # decode whole tiles: PDL with early release at 32 MB of B (gemm.decode_pdl), none at 80 MB -- decided by the
    # real shape, not the tiny launch's
    (GemmConfig(16, 64, 128, 1, 1, True, 4, 5), 16, 8192, 2048),
    (GemmConfig(16, 64, 128, 1, 1, True, 4, 6), 16, 5120, 8192),
    # a small product: PDL by the small-product rule (gemm.small_pdl), released after the main loop
    (GemmConfig(64, 128, 128, 8, 1, False, 4, 4), 1024, 1024, 1024),
])
def test_precompile_warms_the_kernel_the_cell_runs(config, m, n, k):
    """The tiny launch a precompile worker makes compiles what the real cell launches: the same
    constexprs (SPLIT, PDL and EARLY_RELEASE included) and the same argument specialisation."""
    from symmcoll import launcher
    from symmcoll.bench.gemm import compile_job, warm_launch

    def recorded(cfg, mm, nn, kk, programs, early=None, pair=None, small=None):
        with launcher.recording() as launches:
            a = torch.empty((mm, kk), dtype=torch.bfloat16, device="meta")
            b = torch.empty((kk, nn), dtype=torch.bfloat16, device="meta")
            if early is None:
                gemm.matmul(a, b, config=cfg, programs=programs)
            else:  # (as compile_in_worker launches it)
                with gemm.decode_pdl_switched(early, small), gemm.pair_reduce_switched(pair):
                    gemm.matmul(a, b, config=cfg, programs=programs)
        (rec,) = launches
        specialised = tuple((v == 1, v % 16 == 0) for v, param in zip(rec.args, rec.kernel.params)
                            if isinstance(v, int) and not param.do_not_specialize)
        return rec.meta, specialised

    job = compile_job(config, m, n, k, "bf16", 132)
    real = recorded(config, m, n, k, 132 * config.occupancy)
    assert recorded(*warm_launch(job), early=job[6], pair=job[7], small=job[8]) == real
    assert real[0]["PAIR"] == job[7]
    whole = not real[0]["SPLIT"] and config.occupancy == 1
    assert bool(real[0].get("EARLY_RELEASE")) == job[6] == (m <= 64 and n * k * 2 <= 64 << 20 and whole)
    assert job[8] == (not job[6] and m * n * k <= 1 << 30 and n * k * 2 <= 2 << 20 and whole)
    assert bool(real[0].get("PDL")) == (job[6] or job[8])


WARM_SCRIPT = """
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver


class NoGpu:  # what JITFunction.warmup asks of the driver; nothing is launched
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("meta")
    def get_device_interface(self): return torch.cuda


driver.set_active(NoGpu())
from symmcoll.bench.gemm import compile_in_worker, compile_job
from symmcoll.fused.gemm_configs import GemmConfig
for m in (16, 1):  # a stream-K launch, then M = 1 (another specialisation of the same config)
    print(repr(compile_in_worker(compile_job(GemmConfig(16, 64, 128, 1, 4, True, 4, 3, stream_k=True), m, 1280,
                                             8192, "bf16", 132))))
"""


@pytest.mark.skipif(DEVICE != "cpu", reason="compiles on the CPU machine (sm_90 target, no GPU)")
def test_compile_worker_fills_the_cache_without_a_gpu(tmp_path):
    """The tuner's compile workers warm Triton's cache from meta tensors (launcher.warming): the
    kernels a cell runs are compiled, nothing runs."""
    import subprocess
    import sys
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(SRC.parent))
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", WARM_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["''", "''"], done.stdout
    assert len(list(tmp_path.rglob("matmul_kernel.cubin"))) == 2  # SPLIT and whole-tile kernels


def test_a_retune_measures_what_the_cell_runs_today():
    """The base table's answer for a cell (and its no-split answer) is among the cell's candidates, so a
    re-tune replaces it only with a config measured faster in the same run (2026-11-27: a tune without
    the wave split replaced faster wave-split entries)."""
    from symmcoll.bench.gemm_tune import cell_candidates
    today, plain = GemmConfig(32, 32, 64, 2, 3, True, 4, 2), GemmConfig(32, 32, 64, 2, 1, True, 4, 2)
    base = gemm_tables.table_of([dict(m=16, n=1280, k=8192, config=today.as_list(), no_split=plain.as_list())])
    assert today not in gemm_candidates.candidates(16, 1280, 8192, 132)
    found = cell_candidates(16, 1280, 8192, 132, base)
    assert today in found and plain in found and len(found) == len(set(found))
    assert cell_candidates(16, 1280, 8192, 132, {}) == gemm_candidates.candidates(16, 1280, 8192, 132)


def test_tune_loop_keeps_the_base_writes_every_cell_and_stops_at_the_budget(tmp_path, monkeypatch):
    """The tuner's bookkeeping without a GPU (the measurement of a cell stubbed): cells in the order
    given, the table rewritten after each (the base's other cells kept), no cell started past the
    budget, a failed compile reported and not fatal."""
    from concurrent.futures import ThreadPoolExecutor
    from rich.console import Console
    from symmcoll.bench import gemm_tune

    measured_order = []

    def tune_cell(name, m, n, k, *rest):
        measured_order.append((m, n, k))
        config = GemmConfig(128, 128, 64, split_k=16)
        return dict(m=m, n=n, k=k, shape=name, config=config.as_list(), no_split=config.as_list(),
                    label=config.label, us=1.0, cublas_us=1.0, ratio=1.0, candidates=3)

    monkeypatch.setattr(gemm_tune, "current_gpu", lambda: torch.device("cpu"))
    monkeypatch.setattr(gemm_tune, "gpu_facts", lambda: dict(gpu="NVIDIA H200", sms=132))
    monkeypatch.setattr(gemm_tune, "_tune_cell", tune_cell)
    monkeypatch.setattr(gemm_tune, "compile_pool", lambda workers: ThreadPoolExecutor(2))
    monkeypatch.setattr(gemm_tune, "compile_in_worker", lambda job: "" if job[1] != 1 else "T16: failed")
    base = tmp_path / "base.json"
    old = GemmConfig(64, 64, 128).as_list()
    base.write_text(json.dumps(dict(entries=[dict(m=m, n=1280, k=8192, config=old, no_split=old) for m in (1, 256)])))
    cells = [("qkv", 256, 1280, 8192), ("qkv", 1, 1280, 8192), ("o", 512, 8192, 1024)]
    out = tmp_path / "gemm_h200.json"
    console = Console(file=open(os.devnull, "w"))
    try:
        gemm_tune.tune("bf16", (), None, 3, out, console, base=base, cells=cells)
        entries = {(e["m"], e["n"], e["k"]): e for e in json.loads(out.read_text())["entries"]}
        assert measured_order == [c[1:] for c in cells]
        assert set(entries) == {c[1:] for c in cells} and entries[(256, 1280, 8192)]["config"] != old
        measured_order.clear()
        gemm_tune.tune("bf16", (), None, 3, out, console, base=base, cells=cells, budget_s=0.0)
        assert measured_order == [] and json.loads(out.read_text())["entries"]  # nothing started, table kept
    finally:
        gemm_tables.load_table.cache_clear()


def test_small_products_get_one_wave_tiles_and_deep_pipelines():
    """1024^3 (the H100 table's best of 25 at 1.21x cuBLAS, every whole tile at 8.3-9.4 us with 72-96 KB of
    loads in flight a program): one wave of 128 tiles as 64 x 128 and 128 x 64 (two warpgroups) at up to eight
    stages, k-steps of 128, 64 x 64 at up to twelve stages, two programs per SM only where the tiles
    outnumber the SMs; whole tiles of one part, each within shared memory (a program's share of it); none
    for long K, wide products or decode."""
    found = gemm_candidates.small_candidates(1024, 1024, 1024, 132)
    labels = {c.label for c in found}
    assert {"N64x128x64/g8/s1/w4/p8", "N128x64x64/g8/s1/w8/p8", "N128x64x128/g8/s1/w8/p4", "N64x64x64/g8/s1/w4/p12",
            "N64x64x128/g8/s1/w4/p6/f", "N64x64x128/g8/s1/w4/p3/o2"} <= labels, labels
    assert all(c.split_k == 1 and not c.block_n2 and not c.swap_ab for c in found)
    assert all(c.smem_bytes(2) <= gemm_configs.SMEM_BYTES // c.occupancy and c.fitted(2) == c for c in found)
    assert all(gemm_configs.tiles_of(c, 1024, 1024) > 132 for c in found if c.occupancy == 2)
    assert all(gemm_configs.tiles_of(c, 1024, 1024) > 132 for c in found if c.flatten)
    assert gemm_configs.tiles_of(GemmConfig(128, 64, 64), 1024, 1024) == 128
    assert not any(c.occupancy == 2 for c in gemm_candidates.small_candidates(512, 1024, 1024, 132))
    everything = gemm_candidates.candidates(1024, 1024, 1024, 132)
    assert set(found) <= set(everything) and len(everything) <= 80 and len(set(everything)) == len(everything)
    for m, n, k in ((1024, 8192, 8192), (1024, 1024, 4096), (64, 1024, 1024), (4096, 1024, 1024)):
        assert not gemm_candidates.small_candidates(m, n, k, 132), (m, n, k)


def test_one_fused_shape_can_be_named_on_a_command_line():
    """GEMM_SHAPES="fused-1024x1024" (a word: the shell splits "fused 1024x1024") selects that fused shape
    alone; "fused" every one; a layer prefix the layers it names."""
    from symmcoll.bench.gemm import SHAPES, named
    from symmcoll.bench.gemm_tune import FUSED_SHAPES
    assert [s[0] for s in FUSED_SHAPES if named(s[0], ["fused-1024x1024"])] == ["fused 1024x1024"]
    assert [s[0] for s in FUSED_SHAPES if named(s[0], ["fused 1024x1024"])] == ["fused 1024x1024"]
    assert all(named(s[0], ["fused"]) for s in FUSED_SHAPES) and all(named(s[0], None) for s in SHAPES)
    assert {s[0] for s in SHAPES if named(s[0], ["70b-tp8"])} == {"70b-tp8 qkv", "70b-tp8 o", "70b-tp8 gate_up",
                                                                  "70b-tp8 down"}
    assert not any(named(s[0], ["fused-1024x1024"]) for s in SHAPES)



def test_only_the_deep_pipelines_pass_the_candidates_shared_memory_budget():
    """GemmConfig.fitted cuts a pipeline to what a block may take (SMEM_BYTES, 224 KB); the untuned rule, the
    shipped tables' entries and the tune's candidates stay within SMEM_BUDGET (200 KB, the limit every entry
    was measured under: each runs as measured), except gemm_candidates.DEEP_STAGES' 216-224 KB pipelines,
    offered at M = 128-512 only."""
    from symmcoll.fused.gemm_candidates import DEEP_STAGES
    from symmcoll.fused.gemm_configs import SMEM_BUDGET, SMEM_BYTES
    deep_bytes = [c.smem_bytes(2) for c in DEEP_STAGES]
    assert SMEM_BUDGET < min(deep_bytes) <= max(deep_bytes) <= SMEM_BYTES
    assert all(c.fitted(2) == c and c.fitted(2, SMEM_BUDGET).num_stages < c.num_stages for c in DEEP_STAGES)
    for m in (1, 16, 64, 128, 200, 256, 512, 1024, 4096, 16384):
        for n, k in ((1280, 8192), (28672, 8192), (1024, 1024), (100, 72), (8192, 1000)):
            for split in (True, False):
                rule = gemm_configs.untuned_config(m, n, k, split=split)
                assert rule.smem_bytes(2) <= SMEM_BUDGET and rule.fitted(2) == rule, (m, n, k, rule.label)
                assert rule.for_itemsize(4).smem_bytes(4) <= SMEM_BUDGET, (m, n, k, rule.label)
    data = Path(gemm_tables.__file__).parent.parent / "data"
    for table in sorted(data.glob("gemm_*.json")):
        for entry in json.loads(table.read_text())["entries"]:
            for fields in (entry["config"], entry.get("no_split") or entry["config"]):
                config = GemmConfig.from_list(fields)
                assert config.fitted(2) == config, (table.name, entry["m"], entry["n"], entry["k"], config.label)
                assert config.smem_bytes(2) <= SMEM_BUDGET // config.occupancy or config.num_stages in (7, 9), \
                    (table.name, config.label)
    # the fused ops' kernels (split=False) keep the budget's room for their epilogues: the H200 table's deep
    # entries come to them one stage shallower; the core (split=True) runs them as measured
    meta = torch.device("meta")
    for m, n, k in ((128, 5120, 8192), (128, 2560, 8192), (256, 1280, 8192)):
        fused = gemm_tables.gemm_config(m, n, k, torch.bfloat16, meta, split=False)
        assert fused.smem_bytes(2) <= SMEM_BUDGET and fused.split_k == 1, (m, n, k, fused.label)
    deep_core = gemm_tables.gemm_config(256, 1280, 8192, torch.bfloat16, meta)  # (70b-tp8 qkv M = 256)
    assert (deep_core.num_stages, deep_core.smem_bytes(2)) == (9, 216 * 1024), deep_core.label
    assert deep_core.fitted(2, SMEM_BUDGET).num_stages == 8  # what a fused op's kernel would run of it
    for m, n, k in ((128, 5120, 8192), (256, 1280, 8192), (512, 2560, 8192), (64, 1280, 8192), (1024, 2560, 8192)):
        found = gemm_candidates.candidates(m, n, k)
        deep = [c for c in found if c.smem_bytes(2) > SMEM_BUDGET // c.occupancy]
        assert all(c.smem_bytes(2) <= SMEM_BYTES and (c.num_stages, c.num_warps) in ((9, 4), (7, 4)) for c in deep)
        assert bool(deep) == (128 <= m <= 512), (m, n, k, [c.label for c in deep])

def test_fused_shapes_are_tuned_with_the_inputs_their_bench_reuses():
    """The tune times FUSED_SHAPES' cells on one input set (the fused ops' bench calls the same tensors every
    time: L2-warm where they fit) and the grid's cells rotating through sets past L2 (weights from HBM)."""
    from symmcoll.bench.gemm import MAX_SETS, SHAPES, make_cell
    from symmcoll.bench.gemm_tune import FUSED_SHAPES, is_fused_shape
    assert all(is_fused_shape(name) for name, _, _ in FUSED_SHAPES)
    assert not any(is_fused_shape(name) for name, _, _ in SHAPES) and not is_fused_shape("fused")
    device = torch.device("cpu")
    rotating = make_cell("70b-tp8 qkv", 4, 32, 64, torch.bfloat16, device)
    warm = make_cell("fused 1024x1024", 4, 32, 64, torch.bfloat16, device, rotate=False)
    assert len(rotating.sets) == MAX_SETS and len(warm.sets) == 1  # (tiny sets: the most there may be)
    # the same seed, the same first set either way
    assert torch.equal(rotating.sets[0][0], warm.sets[0][0]) and torch.equal(rotating.sets[0][1], warm.sets[0][1])

# ---- which kernels cuBLAS runs (bench/cublas_kernels.py) -------------------------------------------------

# Names cuBLAS gave its kernels in public Hopper traces (vLLM / SGLang profiles), what they say.
CUBLAS_NAMES = [
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT",
     dict(family="nvjet", tile_m=64, tile_n=8, tile_k=64, stages=16, cluster=(4, 1), split_k=False, raster="v",
          schedule=None, layout="TNT", types="tst", arch="sm90")),
    ("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_coopB_NNT",
     dict(family="nvjet", tile_m=256, tile_n=128, tile_k=64, stages=4, cluster=(2, 1), schedule="coopB",
          split_k=False, layout="NNT")),
    ("nvjet_sm90_tst_128x72_64x8_1x2_h_bz_splitK_TNT",
     dict(tile_m=128, tile_n=72, stages=8, cluster=(1, 2), raster="h", split_k=True, flags=("bz",))),
    ("nvjet_tst_128x8_64x12_2x1_v_bz_splitK_TNT", dict(family="nvjet", arch=None, tile_m=128, tile_n=8, stages=12,
                                                       split_k=True)),
    ("nvjet_sm90_tst_192x208_64x4_2x1_v_bz_coopB_bias_TNT", dict(tile_m=192, tile_n=208, flags=("bz", "bias"))),
    ("nvjet_sm100_tst_64x32_64x16_2x2_2cta_h_bz_splitK_TNT",
     dict(arch="sm100", tile_m=64, tile_n=32, cluster=(2, 2), flags=("2cta", "bz"), split_k=True)),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel"
     "__5x_cublas",
     dict(family="xmma", tile_m=128, tile_n=128, tile_k=64, stages=None, warpgroups=(2, 1, 1), segment_k=False,
          layout="tn_n", types="bf16bf16_bf16f32_f32", split_k=None)),
    ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize64x128x64_warpgroupsize1x1x1_execute_segment_k_on_kernel"
     "__5x_cublas", dict(tile_m=64, tile_n=128, segment_k=True)),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize_cgasize1x1x1_warpgroupsize1x1x1_aligna4_alignc4_execute_"
     "segment_k_off_kernel__5x_cublas", dict(family="xmma", tile_m=None, cluster=(1, 1, 1))),
    ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize96x64x32_stage3_warpsize2x2x1_tensor16x8x16_kernel",
     dict(tile_m=96, tile_n=64, tile_k=32, stages=3, layout="nn_n")),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_2x1x1_0_tnn_align8_warpspecialized_"
     "cooperative_epi_tma", dict(family="cutlass3x", tile_m=128, tile_n=256, tile_k=64, stages=0, cluster=(2, 1, 1),
                                 schedule="cooperative")),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_32x5_tn", dict(family="cutlass2x", tile_m=128, tile_n=64,
                                                                        tile_k=32, stages=5, layout="tn")),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, "
     "false>(cublasLt::cublasSplitKParams<float>, float const*, __nv_bfloat16 const*, __nv_bfloat16*)",
     dict(family="split-K reduction", tile_m=None)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
     "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", dict(family=None, tile_m=None, stages=None)),
]


@pytest.mark.parametrize("name, says", CUBLAS_NAMES, ids=lambda v: v[:40] if isinstance(v, str) else "")
def test_cublas_kernel_names_say_their_tiling(name, says):
    from symmcoll.bench.cublas_kernels import cublas_tiling
    tiling = cublas_tiling(name)
    assert {field: getattr(tiling, field) for field in says} == says


def test_cublas_tiling_turns_the_tile_round_to_torchs_m_and_n():
    """torch's row-major C = A @ B is cuBLAS's C^T = B^T A^T: the name's 64x8 decode tile is 8 tokens
    (torch's M) by 64 weight columns (torch's N)."""
    from symmcoll.bench.cublas_kernels import cublas_tiling
    tiling = cublas_tiling("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_NNT")
    assert tiling.torch_tile() == (8, 64, 64)
    assert tiling.short() == "nvjet M8xN64xK64/s16/c4x1/v/splitK"


# One graph replay of a split-K cuBLAS call as kernel_share.trace_events returns it (a runtime event, the
# main kernel, its reduction; microseconds).
SPLIT_K_TRACE = [
    dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=0.0, dur=6.0),
    dict(ph="X", cat="kernel", name="void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)", ts=30.0, dur=4.0),
    dict(ph="X", cat="kernel", name="nvjet_sm90_tst_128x8_64x12_4x1_v_bz_splitK_NNT", ts=10.0, dur=16.0),
    dict(ph="i", cat="kernel", name="an instant event", ts=40.0),
]


def test_cublas_kernels_of_a_call_and_their_shares():
    from symmcoll.bench.cublas_kernels import describe, kernels_of, main_kernel
    row = kernels_of(SPLIT_K_TRACE)
    assert row == {"cublas_kernels": ["nvjet_sm90_tst_128x8_64x12_4x1_v_bz_splitK_NNT",
                                      "void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)"],
                   "cublas_kernel_shares": [0.8, 0.2]}
    assert main_kernel(row) == row["cublas_kernels"][0]
    assert describe(row) == "nvjet M8xN128xK64/s12/c4x1/v/splitK + split-K reduction 20%"
    one = kernels_of(SPLIT_K_TRACE[2:3])
    assert one == {"cublas_kernels": ["nvjet_sm90_tst_128x8_64x12_4x1_v_bz_splitK_NNT"]}  # no shares for one
    assert kernels_of([]) == {"cublas_kernels": []} and describe({"cublas_kernels": []}) is None


def test_cell_rows_get_the_kernels_a_fake_profiler_recorded():
    """record_cells: each cell's call runs under the trace (here a fake standing for torch.profiler on the
    GPU: it runs the call and returns recorded events) and its row fields come from those events; a cell
    whose trace fails gets an error, not an exception; no cell starts past the budget."""
    from symmcoll.bench.cublas_kernels import record_cells
    ran = []

    def fake_trace(run):
        run()
        ran.append(run)
        if len(ran) == 2:
            raise RuntimeError("CUPTI said no")
        return SPLIT_K_TRACE

    cells = [(4, 8, 16), (2, 8, 16), (3, 8, 16)]
    found = record_cells(cells, torch.float32, torch.device("cpu"), fake_trace)
    assert list(found) == cells and len(ran) == 3
    assert found[(4, 8, 16)] == kernels_of_split_k() == found[(3, 8, 16)]
    assert found[(2, 8, 16)] == {"cublas_kernels_error": "RuntimeError: CUPTI said no"}
    assert record_cells(cells, torch.float32, torch.device("cpu"), fake_trace, budget_s=-1.0) == {}


def kernels_of_split_k() -> dict:
    from symmcoll.bench.cublas_kernels import kernels_of
    return kernels_of(SPLIT_K_TRACE)


def test_bench_line_and_table_show_cublas_beside_ours_above_1_05(tmp_path):
    """A cell above 1.05x shows cuBLAS's tiling on its bench line and in gemm_markdown's table; one at
    1.03x does not; a row without names shows nothing of cuBLAS."""
    import importlib.util
    from symmcoll.bench.gemm import _line
    timed = dict(shape="70b-tp4 qkv", m=512, n=2560, k=8192, config="N128x128x64/g8/s1/w8/p4", us=40.0,
                 cublas_us=33.3, ratio=1.2, ratio_paired=1.207, tflops=500.0, weight_tbs=1.0, cublas_weight_tbs=1.2,
                 rel_err=1e-3, cublas_rel_err=1e-3, weight_mb=40.0, **kernels_of_split_k())
    assert _line(timed).endswith("vs cuBLAS nvjet M8xN128xK64/s12/c4x1/v/splitK + split-K reduction 20%")
    assert "cuBLAS nvjet" not in _line(dict(timed, ratio=1.03, ratio_paired=1.03))
    bare = {key: value for key, value in timed.items() if not key.startswith("cublas_kernel")}
    assert "vs cuBLAS" not in _line(bare)
    result = tmp_path / "gemm.json"
    result.write_text(json.dumps(dict(rows=[timed, dict(timed, m=256, ratio=1.0, ratio_paired=1.0), bare],
                                      summary=dict(geomean_ratio=1.1, worst_ratio=1.207, worst_cell="x", above_1_10=1,
                                                   cells=3, wrong=0),
                                      provenance=dict(gpu="H100", git="abc", torch="2", triton="3"))))
    spec = importlib.util.spec_from_file_location("gemm_markdown", SRC.parent.parent / "benchmarks" / "gemm_markdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = module.markdown(str(result))
    lines = [line for line in table.splitlines() if "nvjet" in line]
    assert len(lines) == 1 and lines[0].startswith("| 70b-tp4 qkv (2560, 8192) | 512 | 1.207 | N128x128x64")
    assert "M8xN128xK64/s12/c4x1/v/splitK" in lines[0] and "80%" in lines[0]


class FakeNvml:
    """What bench/gpu_state.py asks of pynvml, answering from lists (one value a call, the last repeated):
    an H100 whose clock drops and whose power cap and thermal slowdown come on over a cell. Only the
    older throttle-reasons name (an nvidia-ml-py before ClocksEventReasons); power not supported."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self):
        self.clock, self.temp, self.reasons = [1605, 1410], [52, 61], [0x0, 0x4 | 0x20 | 0x1000]
        self.calls, self.index = [], None

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlDeviceGetHandleByIndex(self, index):
        self.index = index
        return ("handle", index)

    @staticmethod
    def _next(values):
        return values.pop(0) if len(values) > 1 else values[0]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert handle == ("handle", self.index) and clock == self.NVML_CLOCK_SM
        self.calls.append("read")
        return self._next(self.clock)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._next(self.temp)

    def nvmlDeviceGetPowerUsage(self, handle):
        raise RuntimeError("NVMLError_NotSupported")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._next(self.reasons)


def test_bench_records_no_gpu_state_without_pynvml(monkeypatch):
    """pynvml missing (or its init failing): the reader says why once, reads None, time_pair records
    nothing worth a row's field, and the row's line, the summary and the tag carry nothing of it."""
    import sys
    from symmcoll.bench import gemm_timing, gpu_state
    from symmcoll.bench.gemm import _line, summarize
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    reader = gpu_state.open_reader(torch.device("cuda", 0))
    assert reader.read() is None and "pynvml not importable" in reader.unavailable
    assert gpu_state.announce(reader).startswith("GPU state (clock, temperature, power, throttle reasons) not recorded")
    assert gpu_state.open_reader(torch.device("cpu")).unavailable.startswith("not a CUDA device")
    broken = FakeNvml()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("driver not loaded"))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    assert "NVML failed (RuntimeError: driver not loaded)" == gpu_state.open_reader(torch.device("cuda", 0)).unavailable
    monkeypatch.setattr(gemm_timing, "eager_pass_us", lambda calls: 10.0 * len(calls))
    monkeypatch.setattr(gemm_timing, "capture_passes", lambda calls, passes: None)
    monkeypatch.setattr(gemm_timing, "replayed_us", lambda captured, replays, warmup: [10.0] * replays)
    pair = gemm_timing.time_pair({"ours": [print], "cublas": [print]}, 1, 6, observe=reader.read)
    assert pair.around_rounds == {"before": None, "after": None} and gpu_state.tag(pair.around_rounds) is None
    row = dict(shape="70b-tp4 o", m=16384, config="c", us=1012.0, cublas_us=911.0, ratio=1.11, ratio_paired=1.11,
               tflops=500.0, weight_tbs=0.1, cublas_weight_tbs=0.1, rel_err=1e-3, cublas_rel_err=1e-3, weight_mb=32.0)
    assert "MHz" not in _line(row) and summarize([row])["gpu_state"] is None


def test_bench_gpu_state_names_the_throttle_bits_and_tags_hot_cells(monkeypatch):
    """A fake NVML: torch's device index mapped the way torch.cuda maps it, the state read after the
    captures and after the last round (not between the rounds), the throttle bits named (an unknown bit
    as hex, power NotSupported: None); a cell above 1.05x tags its line 'hot: ...', one at 1.03x not;
    the summary counts the cells that ended power-capped or thermally slowed."""
    import sys
    from symmcoll.bench import gemm_timing, gpu_state
    from symmcoll.bench.gemm import _line, summarize
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "_get_nvml_device_index", lambda device: {0: 3}[device.index])
    reader = gpu_state.open_reader(torch.device("cuda", 0))
    assert reader.unavailable is None and nvml.index == 3  # CUDA_VISIBLE_DEVICES=3: torch's 0 is NVML's 3
    log = []
    monkeypatch.setattr(gemm_timing, "eager_pass_us", lambda calls: 500.0 * len(calls))
    monkeypatch.setattr(gemm_timing, "capture_passes", lambda calls, passes: log.append("capture"))
    monkeypatch.setattr(gemm_timing, "replayed_us",
                        lambda captured, replays, warmup: log.append(len(nvml.calls)) or [500.0] * replays)
    pair = gemm_timing.time_pair({"ours": [print], "cublas": [print]}, 1, 6, observe=reader.read)
    assert log[:2] == ["capture", "capture"] and set(log[2:]) == {2} and nvml.calls == ["init", "read", "read"]
    before, after = pair.around_rounds["before"], pair.around_rounds["after"]
    assert before == dict(sm_mhz=1605, temp_c=52, power_w=None, throttle_mask=0, throttle=[])
    assert after == dict(sm_mhz=1410, temp_c=61, power_w=None, throttle_mask=0x1024,
                         throttle=["power cap", "SW thermal", "0x1000"])
    assert gpu_state.reason_names(0x1 | 0x8 | 0x40 | 0x80) == ["idle", "HW slowdown", "HW thermal", "power brake"]
    row = dict(shape="70b-tp4 o", m=16384, config="c", us=1012.0, cublas_us=911.0, ratio=1.11, ratio_paired=1.11,
               tflops=500.0, weight_tbs=0.1, cublas_weight_tbs=0.1, rel_err=1e-3, cublas_rel_err=1e-3, weight_mb=32.0,
               gpu_state=pair.around_rounds)
    assert _line(row).endswith("  hot: 1605->1410 MHz 52->61 C, power cap, SW thermal, 0x1000")
    assert "MHz" not in _line(dict(row, ratio=1.03, ratio_paired=1.03))
    cool_end = dict(before, power_w=312.0, throttle_mask=1, throttle=["idle"])
    cool = dict(row, gpu_state=dict(before=before, after=cool_end))
    assert gpu_state.tag(cool["gpu_state"]) == "gpu: 1605->1605 MHz 52->52 C 312 W, no throttle"
    assert summarize([row, cool, dict(row, gpu_state=None)])["gpu_state"] == dict(
        cells=2, ended_power_cap=1, ended_thermal=1, ended_reasons={"power cap": 1, "SW thermal": 1, "0x1000": 1,
                                                                     "idle": 1})
    assert json.loads(json.dumps(row))["gpu_state"] == pair.around_rounds  # (the row goes into the JSON as is)
    assert gpu_state.announce(reader).endswith("through NVML; now 1410 MHz 61 C power cap, SW thermal, 0x1000")


@pytest.mark.skipif(DEVICE != "cpu", reason="the profiling process's failure path, on the CPU machine")
def test_the_grid_runs_without_names_when_the_profiling_process_fails():
    """start/collect on a machine without CUDA: the spawned process's call fails, collect says why and
    ends the process (the bench then times the grid without cublas_kernels)."""
    from symmcoll.bench.cublas_kernels import collect, start
    found, seconds, error = collect(start([(16, 64, 64)], "bf16", 0), timeout_s=120)
    assert found == {} and seconds is None and "cuda" in error.lower(), error  # the child's own CUDA call failed


def test_a_dead_or_silent_profiling_process_costs_the_grid_no_wait():
    """collect hears a child that died at once (its end of the pipe closes) and ends one that does not
    answer in time."""
    import multiprocessing
    import time
    from child_targets import die_holding, hold_silently
    from symmcoll.bench.cublas_kernels import collect
    context = multiprocessing.get_context("spawn")
    for target, timeout_s, said in ((die_holding, 60, "exit code 3"), (hold_silently, 3, "no answer from the profiling process in 3 s")):
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=target, args=(send,), daemon=True)
        process.start()
        send.close()
        started = time.time()
        found, seconds, error = collect((process, receive), timeout_s=timeout_s)
        assert found == {} and seconds is None and said in error, error
        assert time.time() - started < 30 and not process.is_alive()


@pytest.mark.gpu
def test_gpu_cublas_kernels_of_two_cells_are_named_and_read():
    """On the GPU: the profiling process names the kernels of a decode and a QKV cell; their names read as
    a known family."""
    from symmcoll.bench.cublas_kernels import collect, cublas_tiling, main_kernel, start
    cells = [(16, 1280, 8192), (256, 2560, 8192)]
    found, seconds, error = collect(start(cells, "bf16", torch.cuda.current_device()), timeout_s=180)
    assert error is None and set(found) == set(cells), (error, found)
    for cell in cells:
        row = found[cell]
        assert row.get("cublas_kernels"), row
        tiling = cublas_tiling(main_kernel(row))
        assert tiling.family is not None, row


def test_kernel_times_split_replays_and_count_the_gaps_between_kernels():
    """benchmarks/gemm_kernel_times.py's reading of a trace: replays told apart by gaps over 20 us, per kernel
    its median duration, per replay the span and the idle time between its kernels (what a sum kernel launched
    after the main one costs beyond its own run)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gemm_kernel_times",
                                                  SRC.parent.parent / "benchmarks" / "gemm_kernel_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    events = [dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=0.0, dur=5.0)]
    for replay, (main, gap, summing) in enumerate(((9.0, 1.5, 1.0), (10.0, 2.5, 1.2), (9.5, 1.0, 0.8))):
        start = 1000.0 * replay
        events += [dict(ph="X", cat="kernel", name="matmul_kernel", ts=start, dur=main),
                   dict(ph="X", cat="kernel", name="split_sum_kernel", ts=start + main + gap, dur=summing)]
    times = module.replay_times(events)
    assert times["replays"] == 3 and times["kernel_counts"] == {"matmul_kernel": 3, "split_sum_kernel": 3}
    assert times["kernels"] == {"matmul_kernel": 9.5, "split_sum_kernel": 1.0}
    assert times["span_us"] == pytest.approx(11.5) and times["idle_us"] == pytest.approx(1.5)
