"""The row-parallel fused ops on CPU ranks: matmul_reduce_scatter, matmul_all_reduce and
all_reduce_rms_norm, every algorithm, world sizes 2-4 (all_reduce_rms_norm also 1), bf16 and fp16, odd shapes (M not a multiple of
the tile, N not a multiple of 16), back-to-back calls with fresh data, against the fp32 reference
(normwise relative error, a tolerance per dtype)."""

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launcher, reference

from rank_checks import FP8_TOL, REL_TOL, assert_rel_close, assert_same_on_every_rank, assert_slots_empty, device

DTYPES = [torch.bfloat16, torch.float16]


def operand(shape, dtype, rank, call, salt=0):
    g = torch.Generator().manual_seed(7919 * call + 104729 * salt + rank)
    return torch.randn(shape, generator=g).to(dtype).to(device())


# The piece counts below follow from the CPU slot sizes (GPU slots hold these shapes in one launch).
ON_CPU = device().type == "cpu"


def launches(name):
    return launcher.LAUNCH_COUNTS[name]


# ---- matmul_reduce_scatter ---------------------------------------------------------------------------

MMRS_ALGORITHMS = ["fused", "unfused", "chunked", "nccl"]


def _mmrs_shapes(world):
    # (M, N, K): shards of 35 rows (not a multiple of the 32-row CPU tile) and N = 50 (pointer loads);
    # 33 x 150 makes 2 x 5 = 10 tiles per shard: 3 pieces of the 8 KB CPU slot (bf16 32x32 tiles of 2 KB);
    # one row per shard; K smaller than one k-step; the first shape again with fresh data.
    return [(35 * world, 50, 40), (33 * world, 150, 24), (world, 17, 9), (35 * world, 50, 40)]


def _mmrs(algorithm, dtype):
    rank, world = dist.get_rank(), dist.get_world_size()
    errs = []
    for call, (m, n, k) in enumerate(_mmrs_shapes(world)):
        a, b = operand((m, k), dtype, rank, call), operand((k, n), dtype, rank, call, salt=1)
        before = launches("matmul_reduce_scatter_kernel")
        got = symmcoll.matmul_reduce_scatter(a, b, algorithm=algorithm)
        assert got.dtype == dtype
        want = reference.matmul_reduce_scatter(a, b)
        errs.append(assert_rel_close(got, want, f"{algorithm} {m}x{n}x{k} call {call}"))
        if algorithm == "fused" and (m, n, k) == (33 * world, 150, 24) and ON_CPU:
            pieces = 3 if dtype != torch.float32 else 5  # 10 tiles of 2 KB (4 KB) in 8 KB slots
            assert launches("matmul_reduce_scatter_kernel") - before == pieces, f"10 tiles: {pieces} launches"
    return max(errs)


@pytest.mark.parametrize("algorithm", MMRS_ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_reduce_scatter(pools, world_size, dtype, algorithm):
    pools(world_size).run(_mmrs, algorithm, dtype)


# ---- one pass over B: shards shorter than a tile ----------------------------------------------------


def _cut(rows_per_shard, n, k, dtype, world):
    from symmcoll.fused import matmul_reduce_scatter as mrs
    from symmcoll.memory import get_workspace
    slot = mrs.slot_bytes(device().type, get_workspace(device=device()).buffer_bytes, world)
    return mrs.tiling(rows_per_shard, n, k, dtype, device(), world, slot, dtype.itemsize, mrs.MAX_TILES[device().type])


def _one_pass(dtype):
    """Shards shorter than the 32-row CPU tile: tiles over every shard's rows, each row block's rows
    sent to their owners (matmul_reduce_scatter fused; matmul_all_reduce two_shot, whose last shard is
    cut short by M and whose later shards may be empty). M = W (one row a shard), 5 rows a shard (the
    whole grid one row block), 13 (shard 2 split between two row blocks at 3-4 ranks), odd N, several
    launches (bf16 32x32 tiles: 4 per 8 KB slot, whole columns of row blocks a launch), each shape
    twice with fresh data. One rank: per-shard tiles (the same grid)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    errs = []
    for call, (m, n, k) in enumerate([(world, 17, 9), (5 * world, 150, 40), (13 * world, 150, 24), (world, 17, 9),
                                      (13 * world, 150, 24)]):
        a, b = operand((m, k), dtype, rank, call), operand((k, n), dtype, rank, call, salt=1)
        cut = _cut(m // world, n, k, dtype, world)
        assert cut.one_pass == (world > 1), f"{m}x{n}x{k} at {world} ranks: one_pass {cut.one_pass}"
        before = launches("matmul_reduce_scatter_kernel")
        got = symmcoll.matmul_reduce_scatter(a, b, algorithm="fused")
        errs.append(assert_rel_close(got, reference.matmul_reduce_scatter(a, b), f"fused {m}x{n}x{k} call {call}"))
        if ON_CPU:
            want = -(-cut.tiles // cut.per_piece)
            assert launches("matmul_reduce_scatter_kernel") - before == want, f"{m}x{n}x{k}: {want} launches"
    for call, (m, n, k) in enumerate([(1, 17, 9), (29, 150, 24), (29, 50, 40), (world, 17, 9)]):
        a, b = operand((m, k), dtype, rank, call, salt=2), operand((k, n), dtype, rank, call, salt=3)
        assert _cut(-(-m // world), n, k, dtype, world).one_pass == (world > 1)
        got = symmcoll.matmul_all_reduce(a, b, algorithm="two_shot")
        errs.append(assert_rel_close(got, reference.matmul_all_reduce(a, b), f"two_shot {m}x{n}x{k} call {call}"))
        assert_same_on_every_rank(got, f"two_shot {m}x{n}x{k}")
    return max(errs)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_one_pass_small_shards(pools, world, dtype):
    pools(world).run(_one_pass, dtype)


# ---- launches of equal size --------------------------------------------------------------------------


def test_pieces_are_equal_and_cover_every_tile_once(monkeypatch):
    """A product larger than a slot goes in as few launches as before, of equal size in whole units: on
    4 H100s at M = 8192 (512 tiles a shard, 341 a slot) 256 + 256 (8 + 8 waves of 132 programs) where
    filling the first launch gave 341 + 171 (11 + 6); one pass keeps whole columns of row blocks."""
    from symmcoll import debug_switches
    from symmcoll.fused import matmul_reduce_scatter as mrs
    from symmcoll.fused.gemm_configs import CPU_CONFIG
    monkeypatch.setattr(debug_switches, "MRS_GREEDY_PIECES", False)

    def sizes(tiles, per_piece, unit=1):
        got = mrs.pieces(mrs.Tiling(CPU_CONFIG, unit > 1, tiles, per_piece, unit))
        assert [first for first, _ in got] == [sum(n for _, n in got[:i]) for i in range(len(got))]
        assert sum(n for _, n in got) == tiles and all(0 < n <= per_piece and n % unit == 0 for _, n in got)
        assert len(got) == -(-tiles // per_piece)
        return [n for _, n in got]

    assert sizes(512, 341) == [256, 256]
    assert sizes(1024, 341) == [256] * 4
    assert sizes(9, 4) == [3, 3, 3]
    assert sizes(10, 4) == [4, 4, 2]
    assert sizes(128, 8192) == [128]
    assert sizes(6 * 4, 12, unit=4) == [12, 12]  # one pass: 4 row blocks, at most 3 columns a launch
    assert sizes(5 * 4, 12, unit=4) == [12, 8]
    monkeypatch.setattr(debug_switches, "MRS_GREEDY_PIECES", True)
    assert sizes(512, 341) == [341, 171]


def _even_pieces(dtype):
    """3 x 3 tiles a shard (bf16 32x32 tiles, 4 in an 8 KB CPU slot): three launches of 3 tiles (filled
    launches would run 4 + 4 + 1), twice with fresh data."""
    rank, world = dist.get_rank(), dist.get_world_size()
    errs = []
    for call in range(2):
        m, n, k = 70 * world, 90, 24
        a, b = operand((m, k), dtype, rank, call), operand((k, n), dtype, rank, call, salt=1)
        before = launches("matmul_reduce_scatter_kernel")
        got = symmcoll.matmul_reduce_scatter(a, b, algorithm="fused")
        errs.append(assert_rel_close(got, reference.matmul_reduce_scatter(a, b), f"fused {m}x{n}x{k} call {call}"))
        if ON_CPU:
            assert launches("matmul_reduce_scatter_kernel") - before == 3, "9 tiles in launches of 3"
    return max(errs)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_fused_launches_of_equal_size(pools, world):
    pools(world).run(_even_pieces, torch.bfloat16)


# ---- matmul_reduce_scatter chunked: cuBLAS on row chunks, pulled from double-buffered slots ------------


def _chunked_case(dtype):
    """chunked, shape after shape with fresh data: chunks of odd row counts, products of one and of two
    8 KB CPU slot pieces (150 bf16 columns: 27 rows a piece, 33 rows a chunk), one row a chunk, B given as
    nn.Linear's W.t(), and integer-valued operands whose sum is exact (so the result is too). Every call:
    within the op's tolerance of the fp32 reference, inputs unchanged, one barrier kernel per unit plus
    the exit barrier and one sum kernel (no launch at all on one rank), the same bits for the same inputs.
    M not a multiple of W is refused as the shape rule says."""
    from symmcoll.fused import matmul_reduce_scatter_chunked as chunked
    rank, world = dist.get_rank(), dist.get_world_size()
    errs = []
    shapes = [(35 * world, 50, 40, False), (33 * world, 150, 24, False), (world, 17, 9, False),
              (33 * world, 150, 24, True), (35 * world, 50, 40, False)]
    for call, (m, n, k, transposed) in enumerate(shapes):
        a = operand((m, k), dtype, rank, call)
        b = operand((n, k), dtype, rank, call, salt=1).t() if transposed else operand((k, n), dtype, rank, call, salt=1)
        a_before, b_before = a.clone(), b.clone()
        barriers, sums = launches("barrier_kernel"), launches("sum_partials_kernel")
        got = symmcoll.matmul_reduce_scatter(a, b, algorithm="chunked")
        what = f"chunked {m}x{n}x{k}{' B^T' if transposed else ''} call {call}"
        assert got.dtype == dtype and got.shape == (m // world, n), what
        errs.append(assert_rel_close(got, reference.matmul_reduce_scatter(a, b), what))
        assert torch.equal(a, a_before) and torch.equal(b, b_before), f"rank {rank}: {what}: inputs changed"
        if ON_CPU:
            pieces = -(-(m // world) // chunked.cut(m // world, n * a.element_size(), "cpu", 32 << 20).piece_rows)
            if n == 150:  # 300 (600) bytes a row: 27 (13) rows of 33 in a slot
                assert pieces == (2 if a.element_size() == 2 else 3), pieces
            want = ((world - 1) * pieces + 1, 1) if world > 1 else (0, 0)
            assert (launches("barrier_kernel") - barriers, launches("sum_partials_kernel") - sums) == want, what
        assert torch.equal(symmcoll.matmul_reduce_scatter(a, b, algorithm="chunked"), got), f"{what}: not deterministic"
    # Integers in [-1, 1], K = 24: partials within +-24 and sums within +-96 are exact in every dtype, so the
    # result equals the sum exactly (a row or a slot mixed up would not).
    m, n, k = 6 * world, 150, 24
    a = operand((m, k), torch.float32, rank, 9).round().clamp(-1, 1).to(dtype)
    b = operand((k, n), torch.float32, rank, 9, salt=1).round().clamp(-1, 1).to(dtype)
    got = symmcoll.matmul_reduce_scatter(a, b, algorithm="chunked")
    want = reference.matmul_reduce_scatter(a, b)
    assert torch.equal(got.float(), want), f"rank {rank}: chunked integers: {(got.float() - want).abs().max()}"
    # A row longer than a slot (half the shared buffer: rows of 128 MB on GPU) runs the unfused path.
    from symmcoll.fused import matmul_reduce_scatter as mrs
    real_cut, mrs.chunked.cut = mrs.chunked.cut, lambda *args: None
    try:
        sums = launches("sum_partials_kernel")
        got = symmcoll.matmul_reduce_scatter(a, b, algorithm="chunked")
    finally:
        mrs.chunked.cut = real_cut
    assert torch.equal(got.float(), want) and launches("sum_partials_kernel") == sums, "a row past a slot: unfused"
    if world > 1:
        with pytest.raises(ValueError, match="divisible by the world size"):
            symmcoll.matmul_reduce_scatter(torch.ones(2 * world + 1, 8, dtype=dtype, device=device()),
                                           torch.ones(8, 5, dtype=dtype, device=device()), algorithm="chunked")
    return max(errs)


@pytest.mark.parametrize("world, dtype", [(1, torch.bfloat16), (2, torch.float16), (3, torch.float32),
                                          (4, torch.bfloat16)], ids=lambda v: str(v))
def test_chunked(pools, world, dtype):
    pools(world).run(_chunked_case, dtype)


def test_chunked_units_cover_every_row_once():
    """Units: W-1 steps, each the chunk's rows in slot-sized pieces (the same on every rank); slots whole
    pages apart and both inside the buffer; a row larger than a slot: no units (the unfused path runs)."""
    from symmcoll.fused.matmul_reduce_scatter_chunked import PAGE, SLOTS, cut
    gpu = cut(2048, 8192 * 2, "cuda", 256 << 20)
    assert (gpu.piece_rows, gpu.slot_bytes) == (2048, 2048 * 8192 * 2)  # 4x H100 at M = 8192: one unit a step
    assert len(gpu.units(4)) == 3
    big = cut(8192, 16384 * 2, "cuda", 256 << 20)  # 256 MB a chunk: two pieces of 4096 rows
    assert big.units(2) == [(0, 0, 4096), (0, 4096, 4096)] and SLOTS * big.slot_bytes <= 256 << 20
    for rows, row_bytes in ((33, 300), (35, 100), (1, 34), (100, 20000)):
        units = cut(rows, row_bytes, "cpu", 32 << 20)
        assert units.slot_bytes % PAGE == 0 and units.piece_rows * row_bytes <= units.slot_bytes
        for world in (2, 3, 4):
            got = units.units(world)
            for step in range(world - 1):
                covered = [r for s, first, n in got if s == step for r in range(first, first + n)]
                assert covered == list(range(rows)), (rows, row_bytes, world, step)
    assert cut(4, 200 << 20, "cuda", 256 << 20) is None


# ---- matmul_all_reduce -------------------------------------------------------------------------------

MMAR_ALGORITHMS = ["one_shot", "two_shot", "unfused", "nccl"]


def _mmar_shapes(world):
    # (M, N, K): 35 rows (not a multiple of the 32-row tile, nor of the world size 2 or 4), N = 50;
    # 33 x 150 = 2 x 5 tiles: one_shot runs 3 pieces of its 2048-word CPU slot rows (bf16 32x32 tiles are
    # 512 words); M = 1 (decode; two_shot: most shards empty); the first shape again with fresh data.
    return [(35, 50, 40), (33, 150, 24), (1, 17, 9), (35, 50, 40)]


def _mmar(algorithm, dtype):
    rank = dist.get_rank()
    errs = []
    for call, (m, n, k) in enumerate(_mmar_shapes(dist.get_world_size())):
        a, b = operand((m, k), dtype, rank, call), operand((k, n), dtype, rank, call, salt=1)
        before = launches("matmul_all_reduce_kernel")
        got = symmcoll.matmul_all_reduce(a, b, algorithm=algorithm)
        assert got.dtype == dtype
        errs.append(assert_rel_close(got, reference.matmul_all_reduce(a, b), f"{algorithm} {m}x{n}x{k} call {call}"))
        if algorithm == "one_shot" and (m, n, k) == (33, 150, 24) and dtype != torch.float32 and ON_CPU:
            pieces = 3 if dist.get_world_size() > 1 else 1  # (a group of one sends nothing: one launch)
            assert launches("matmul_all_reduce_kernel") - before == pieces, "10 tiles in 4-tile pieces: 3 launches"
        if algorithm != "nccl":
            assert_same_on_every_rank(got, f"{algorithm} {m}x{n}x{k}")
    assert_slots_empty()
    return max(errs)


@pytest.mark.parametrize("algorithm", MMAR_ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matmul_all_reduce(pools, world_size, dtype, algorithm):
    pools(world_size).run(_mmar, algorithm, dtype)


def _mmar_alone(algorithm):
    """A group of one: one_shot's kernel leaves its tiles in out (no stage 2), two_shot's kernel writes the whole
    product in place (no all-gather launched); both as the reference."""
    from symmcoll import plan
    resolved, resolve = [], plan.resolve

    def recording(op, *args, **kwargs):
        resolved.append(op)
        return resolve(op, *args, **kwargs)

    plan.resolve = recording
    try:
        err = _mmar(algorithm, torch.bfloat16)
    finally:
        plan.resolve = resolve
    assert "all_gather" not in resolved, f"{algorithm} gathered at world size 1: {resolved}"
    return err


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
def test_matmul_all_reduce_group_of_one(pools, algorithm):
    pools(1).run(_mmar_alone, algorithm)


# ---- all_reduce_rms_norm -----------------------------------------------------------------------------

ARN_ALGORITHMS = ["one_shot", "two_shot", "unfused", "nccl"]
EPS = 1e-5


def _arn_cases():
    # (tokens, hidden, quant): H = 48 (24 words, 32 in the slots: the 256-word CPU one-shot slot rows
    # hold 8 rows, the 64-word two-shot rows 2 rows of each of the W shards: 11 tokens take several
    # launches); odd H = 33 (a half-filled last word); one token (two-shot: the other shards are
    # empty); fp8 per token and per tensor; the first case again with fresh data.
    return [(11, 48, None), (7, 33, None), (1, 64, None), (5, 48, "fp8_per_token"), (6, 40, "fp8_per_tensor"),
            (11, 48, None)]


def _arn_pieces(algorithm, tokens, world, dtype):
    """Launches of the 48-element rows (32 slot words in 16-bit formats, 64 in fp32): 8 (4) rows per
    one-shot launch, 2 (1) per shard per two-shot launch; one launch on one rank (no slots used)."""
    if world == 1:
        return 1
    rows = (8 if algorithm == "one_shot" else 2 * world) // (2 if dtype == torch.float32 else 1)
    return -(-tokens // rows)


def _arn(algorithm, dtype, config=None, cases=None):
    """The cases through the public function, or with ``config`` through plan.resolve (the launch
    config the GPU sweep names: a ``block`` of less than a row runs the chunked two-pass path)."""
    from symmcoll import plan
    rank = dist.get_rank()
    for call, (tokens, h, quant) in enumerate(cases or _arn_cases()):
        what = f"{algorithm} {tokens}x{h} {quant} call {call}"
        x = operand((tokens, h), dtype, rank, call)
        residual = operand((tokens, h), dtype, 0, call, salt=2)  # the same on every rank
        weight = operand((h,), dtype, 0, call, salt=3)
        want = reference.all_reduce_rms_norm(x, residual, weight, EPS)
        scale = None
        if quant == "fp8_per_tensor":
            scale = (want[0].abs().max() / 300).reshape(1)
            want = reference.all_reduce_rms_norm(x, residual, weight, EPS, quant=quant, scale=scale)
        elif quant:
            want = reference.all_reduce_rms_norm(x, residual, weight, EPS, quant=quant)
        before = launches(f"rms_norm_{algorithm}_kernel")
        if config is None:
            got = symmcoll.all_reduce_rms_norm(x, residual, weight, EPS, algorithm=algorithm, quant=quant, scale=scale)
        else:
            others = (residual, weight) if scale is None else (residual, weight, scale)
            got = plan.resolve("all_reduce_rms_norm", x, None, algorithm, config=config, others=others,
                               options=(("eps", EPS), ("quant", quant))).execute(x, others=others)
            got = got[:3] if quant == "fp8_per_token" else got[:2]
        assert len(got) == (3 if quant == "fp8_per_token" else 2)
        assert got[0].dtype == (torch.float8_e4m3fn if quant else dtype) and got[1].dtype == dtype
        assert_rel_close(got[0].float(), want[0], f"{what}: normed", FP8_TOL if quant else REL_TOL[dtype])
        assert_rel_close(got[1], want[1], f"{what}: new residual")
        if quant == "fp8_per_token":
            assert_rel_close(got[2], want[2], f"{what}: scales", REL_TOL[dtype])
        if algorithm != "nccl":
            for t, name in zip(got, ("normed", "new residual", "scales")):
                assert_same_on_every_rank(t, f"{what}: {name}")
        if algorithm in ("one_shot", "two_shot") and h == 48 and ON_CPU:
            pieces = _arn_pieces(algorithm, tokens, dist.get_world_size(), dtype)
            assert launches(f"rms_norm_{algorithm}_kernel") - before == pieces, f"{what}: {pieces} launches"
    assert_slots_empty()
    return True


@pytest.mark.parametrize("algorithm", ARN_ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_rms_norm(pools, world_size, dtype, algorithm):
    pools(world_size).run(_arn, algorithm, dtype)


def _arn_chunked():
    """Rows in chunks of 32 values (``block`` 32 < the rows' 64 values: two passes per row, the next
    chunk's loads issued ahead), bf16: the one-shot kernel on an odd H (a chunk past the row's end; its
    17 words a row go as 20, padded to whole 16-byte groups), the two-shot kernel (all three stages) with
    per-token fp8 (scales from pass 1). On 4 ranks as gpu_config's bulk rule launches them (chunked rows,
    4 programs looping)."""
    from symmcoll.plan import LaunchConfig
    _arn("one_shot", torch.bfloat16, LaunchConfig(32, 4, 4), [(3, 33, None)])
    _arn("two_shot", torch.bfloat16, LaunchConfig(32, 4, 4), [(3, 48, "fp8_per_token")])
    return True


@pytest.mark.parametrize("world", [1, 2, 4])
def test_all_reduce_rms_norm_chunked_rows(pools, world):
    assert pools(world).run(_arn_chunked) == [True] * world


def _arn_one_rank():
    """World size 1: the kernels with no peer code (own rows as values, one launch), every dtype, the
    cases above, and the words the sentinel protocol never sends."""
    for algorithm in ("one_shot", "two_shot"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            _arn(algorithm, dtype)
        for dtype in (torch.bfloat16, torch.float32):
            _sentinel_words(algorithm, dtype)
    return True


def test_all_reduce_rms_norm_one_rank(pools):
    assert pools(1).run(_arn_one_rank) == [True]


# ---- all three: choices, errors, mismatched calls, fake implementations, torch.compile ------------------

def _choices_and_errors():
    from symmcoll import plan
    rank, world, dev = dist.get_rank(), dist.get_world_size(), device()
    bf = dict(dtype=torch.bfloat16, device=dev)

    def chosen(op, x, others, options=()):
        return plan.resolve(op, x, None, "auto", others=others, options=options).name
    b = torch.zeros(8, 16, **bf)
    # Without a table rule: one_shot only where its tiles fill the GPU (8 x 16 is one tile), never two_shot,
    # and matmul_reduce_scatter unfused (tests/test_row_parallel_auto.py has the rule's cases)
    assert chosen("matmul_all_reduce", torch.zeros(8, 8, **bf), (b,)) == "unfused"
    assert chosen("matmul_all_reduce", torch.zeros(300, 8, **bf), (b,)) == "unfused"
    assert chosen("matmul_reduce_scatter", torch.zeros(4 * world, 8, **bf), (b,)) == "unfused"
    opts = (("eps", 1e-5), ("quant", None))
    small, big = torch.zeros(4, 64, **bf), torch.zeros(8192, 128, **bf)  # 512 B and 2 MiB per rank
    assert chosen("all_reduce_rms_norm", small, (small, small[0]), opts) == "one_shot"
    assert chosen("all_reduce_rms_norm", big, (big, big[0]), opts) == "two_shot"
    wide = torch.zeros(1, 40000, **bf)  # longer than the kernels' rows: the unfused path, same result
    assert plan.resolve("all_reduce_rms_norm", wide, None, "one_shot", others=(wide, wide[0]),
                        options=opts).name == "unfused"

    a, b = torch.ones(2 * world, 8, **bf), torch.ones(8, 5, **bf)
    for fn in (symmcoll.matmul_reduce_scatter, symmcoll.matmul_all_reduce):
        with pytest.raises(ValueError, match="a must be a 2-D"):
            fn(a[0], b)
        with pytest.raises(ValueError, match=r"b.shape\[0\] must equal a.shape\[1\]"):
            fn(a, b[:7])
        with pytest.raises(ValueError, match="b.dtype must equal a.dtype"):
            fn(a, b.half())
        with pytest.raises(ValueError, match="a.dtype must be"):
            fn(a.int(), b.int())
        with pytest.raises(ValueError, match="b must be contiguous"):
            fn(a, torch.ones(8, 10, **bf)[:, ::2])  # neither contiguous nor the transpose of a contiguous W
        with pytest.raises(ValueError, match="a must be a torch.Tensor"):
            fn([[1.0]], b)
        with pytest.raises(ValueError, match="algorithm"):
            fn(a, b, algorithm="nope")
    with pytest.raises(ValueError, match="divisible by the world size"):
        symmcoll.matmul_reduce_scatter(torch.ones(2 * world + 1, 8, **bf), b)
    x, w = torch.ones(3, 16, **bf), torch.ones(16, **bf)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        symmcoll.all_reduce_rms_norm(x, x[:2], w, 1e-5)
    with pytest.raises(ValueError, match="weight must be a float vector of shape"):
        symmcoll.all_reduce_rms_norm(x, x, w[:8], 1e-5)
    with pytest.raises(ValueError, match="quant must be"):
        symmcoll.all_reduce_rms_norm(x, x, w, 1e-5, quant="int8")
    with pytest.raises(ValueError, match="scale .* is required"):
        symmcoll.all_reduce_rms_norm(x, x, w, 1e-5, quant="fp8_per_tensor")
    with pytest.raises(ValueError, match="eps must be"):
        symmcoll.all_reduce_rms_norm(x, x, w, -1.0)
    with pytest.raises(ValueError, match="residual must be a torch.Tensor"):
        symmcoll.all_reduce_rms_norm(x, None, w, 1e-5)
    return True


def _transposed_weights():
    """B given as nn.Linear's ``weight.t()`` (a transposed view of W [N, K]): every kernel variant reads
    it as it is and gives the bits it gives for the same B made contiguous."""
    rank, world, dev = dist.get_rank(), dist.get_world_size(), device()
    a = operand((35 * world, 40), torch.bfloat16, rank, 0)
    w = operand((50, 40), torch.bfloat16, rank, 0, salt=1)  # [N, K]
    shard = operand((13, 40), torch.bfloat16, rank, 0)
    w_shared = operand((24, 40), torch.bfloat16, 0, 0, salt=2)
    for fn, x, weight, algorithm in ((symmcoll.matmul_reduce_scatter, a, w, "fused"),
                                     (symmcoll.matmul_all_reduce, a, w, "one_shot"),
                                     (symmcoll.matmul_all_reduce, a, w, "two_shot"),
                                     (symmcoll.all_gather_matmul, shard, w_shared, "fused"),
                                     (symmcoll.all_gather_matmul, shard, w_shared, "naive_remote")):
        got = fn(x, weight.t(), algorithm=algorithm)
        want = fn(x, weight.t().contiguous(), algorithm=algorithm)
        assert torch.equal(got, want), f"rank {rank}: {fn.__name__} {algorithm}: B^T view differs from contiguous B"
    return True


def test_weight_given_transposed(pools):
    assert pools(2).run(_transposed_weights) == [True] * 2


def test_choices_and_input_errors(pools):
    assert pools(2).run(_choices_and_errors) == [True] * 2


def _mismatched_calls(op, algorithm):
    """Ranks that make different calls (another K: the same tiles, another descriptor) are told so by a
    SymmcollMismatchError on every rank, not given a wrong sum."""
    rank = dist.get_rank()
    k = 8 + 4 * rank
    a, b = operand((4, k), torch.bfloat16, rank, 0), operand((k, 24), torch.bfloat16, rank, 0, salt=1)
    try:
        with pytest.raises(symmcoll.SymmcollMismatchError, match="different call"):
            getattr(symmcoll, op)(a, b, algorithm=algorithm)
            if torch.cuda.is_available():  # kernels run asynchronously: their error surfaces here
                torch.cuda.synchronize()
                symmcoll.check()
    finally:
        symmcoll.reset()
    good = getattr(symmcoll, op)(a[:, :8].contiguous(), b[:8].contiguous(), algorithm=algorithm)
    assert got_finite(good)
    return True


def got_finite(t):
    return bool(t.float().isfinite().all())


@pytest.mark.parametrize("op, algorithm", [("matmul_reduce_scatter", "fused"), ("matmul_reduce_scatter", "chunked"),
                                           ("matmul_all_reduce", "one_shot")])
def test_mismatched_calls_are_reported(pools, op, algorithm):
    assert pools(2).run(_mismatched_calls, op, algorithm) == [True] * 2


def _tp_block(x, w_down, residual, weight, w_next):
    """A row-parallel layer's tail touching all three ops."""
    h = symmcoll.matmul_all_reduce(x, w_down)
    normed, new_residual = symmcoll.all_reduce_rms_norm(h * 0.5, residual, weight, 1e-5)
    q, _, scales = symmcoll.all_reduce_rms_norm(h, new_residual, weight, 1e-5, quant="fp8_per_token")
    return symmcoll.matmul_reduce_scatter(normed, w_next) + 1, q.float() * scales


def _fakes_and_compile():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    torch._dynamo.reset()
    rank, world, name = dist.get_rank(), dist.get_world_size(), dist.group.WORLD.group_name
    dt = torch.bfloat16
    x, w_down = operand((2 * world, 12), dt, rank, 0), operand((12, 16), dt, rank, 0, salt=1)
    residual, weight = operand((2 * world, 16), dt, 0, 0, salt=2), operand((16,), dt, 0, 0, salt=3)
    w_next = operand((16, 8), dt, rank, 0, salt=4)
    ops = torch.ops.symmcoll
    cases = [lambda a, b: ops.matmul_reduce_scatter(a, b, name, "auto"),
             lambda a, b: ops.matmul_all_reduce(a, b, name, "auto")]
    for fn in cases:
        real = fn(x, w_down)
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            fake = fn(mode.from_tensor(x), mode.from_tensor(w_down))
        assert fake.shape == real.shape and fake.dtype == real.dtype, (fake.shape, real.shape)
    for quant in ("", "fp8_per_token"):
        real = ops.all_reduce_rms_norm(residual, residual, weight, 1e-5, name, "auto", quant, None)
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            fake = ops.all_reduce_rms_norm(*(mode.from_tensor(t) for t in (residual, residual, weight)), 1e-5, name,
                                           "auto", quant, None)
        assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real], (fake, real)
    args = (x, w_down, residual, weight, w_next)
    explanation = torch._dynamo.explain(_tp_block)(*args)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(_tp_block, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(*args), _tp_block(*args)):
        assert torch.equal(got, want), "compiled (aot_eager) against eager"
    return True


def test_fake_implementations_and_fullgraph_compile(pools):
    assert pools(2).run(_fakes_and_compile, timeout=600) == [True] * 2


def _fp32(fn, algorithm):
    """The fp32 word format (one value a word; the EMPTY pattern is an fp32 value) end to end."""
    return fn(algorithm, torch.float32) is not None


@pytest.mark.parametrize("fn, algorithm", [(_mmrs, "fused"), (_mmrs, "chunked"), (_mmar, "one_shot"),
                                           (_mmar, "two_shot"), (_arn, "one_shot"), (_arn, "two_shot")],
                         ids=lambda v: getattr(v, "__name__", v))
def test_fp32(pools, fn, algorithm):
    assert pools(3).run(_fp32, fn, algorithm) == [True] * 3


def _sentinel_words(algorithm, dtype):
    """Inputs made of the words the sentinel protocol never sends (16-bit negative zeros; the EMPTY
    pattern itself in fp32) still arrive, and every slot is EMPTY again afterwards."""
    from symmcoll.language import EMPTY
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.full((5, 40), -0.0, dtype=dtype, device=device())
    if dtype == torch.float32:
        x.view(torch.int32)[:, ::3] = EMPTY.value  # -4.6e-41: sent as -0.0
    x[:, 1::4] = rank + 1
    residual = torch.arange(200, dtype=torch.float32, device=device()).reshape(5, 40).remainder(7).to(dtype)
    normed, new_residual = symmcoll.all_reduce_rms_norm(x, residual, torch.ones(40, dtype=dtype, device=device()),
                                                        1e-5, algorithm=algorithm)
    want = residual.float().clone()
    want[:, 1::4] += world * (world + 1) / 2
    assert torch.equal(new_residual.float(), want), f"rank {rank}: {algorithm} {dtype}: negative zeros"
    a = torch.full((3, 8), -0.0, dtype=dtype, device=device())
    got = symmcoll.matmul_all_reduce(a, torch.ones(8, 6, dtype=dtype, device=device()), algorithm="one_shot")
    assert bool((got == 0).all()), f"rank {rank}: matmul_all_reduce of zeros: {got}"
    assert_slots_empty()
    return True


@pytest.mark.parametrize("algorithm", ["one_shot", "two_shot"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_sentinel_bit_patterns(pools, algorithm, dtype):
    assert pools(2).run(_sentinel_words, algorithm, dtype) == [True] * 2


def test_rms_norm_auto_runs_the_kernels_at_every_size():
    # 4x H100 (2026-11-27, after the 16-byte peer words and the bulk launch rule): the two-shot kernel beat the
    # all-reduce + torch tail at every shape from 138x16384 to 8192x16384, so auto never falls back to unfused.
    from symmcoll import plan
    from symmcoll.fused import all_reduce_rms_norm as rms

    def default(rows, hidden, world, quant=None):
        shape = (rows, hidden)
        request = plan.Request("all_reduce_rms_norm", shape, torch.bfloat16, torch.device("cpu"),
                               others=((shape, torch.bfloat16, None), ((hidden,), torch.bfloat16, None)),
                               options=(("eps", 1e-5), ("quant", quant)))
        return rms._default(request, world)
    assert default(8, 4096, 4) == "one_shot"
    assert default(128, 4096, 4) == "one_shot"  # 1 MiB exactly: one-shot 16.9 against two-shot 17.9 us
    assert default(129, 4096, 4) == "two_shot"
    assert default(128, 4096, 2) == "one_shot"
    assert default(8192, 16384, 4) == "two_shot"
    assert default(8192, 8192, 8) == "two_shot"
    assert default(8192, 8192, 1) == "one_shot"
    assert default(8192, 8192, 4, "fp8_per_token") == "two_shot"
