"""The quantized all-reduce (comm/quantized.py, ``all_reduce(x, quantize=...)``): bit-exact against the
reference emulation, inside the error bound docs/algorithms.md states (``bench.accuracy.error_bound``)
against the exact sum, bit-identical on every rank and on repeated calls; every format, group size
and dtype, odd sizes and several pieces, at world sizes 2-4; changing launch configs; the data kinds
of the accuracy table; validation, the exact-path fallback, mismatched calls, the torch op; and the
codecs on edge values (ties, subnormal fp8, non-finite groups, the sentinel never produced)."""

import os

import pytest
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import symmcoll
from symmcoll import plan, reference
from symmcoll.bench.accuracy import KINDS, error_bound, make_input
from symmcoll.language.codecs import dequantize_groups, pack_words, quantize_groups, unpack_words

from rank_checks import assert_close, device

FORMATS = ["int8", "fp8", "int4"]
BITS = {"int8": 8, "fp8": 8, "int4": 4}
# (numel, group size, dtype): one element, odd sizes, partial last groups, and several pieces (a CPU
# launch takes 8K elements).
PIECE = 8192
CASES = [(1, 64, torch.bfloat16), (7, 32, torch.float16), (4099, 128, torch.bfloat16),
         (2 * PIECE + 1001, 64, torch.float32), (PIECE + 3, 32, torch.bfloat16)]
_INT_VIEW = {2: torch.int16, 4: torch.int32}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(_INT_VIEW[t.element_size()])


def _kernel_at_every_size() -> None:
    """Run the quantized kernel whatever the size (on GPU the exact path takes calls below 1 MB)."""
    os.environ["SYMMCOLL_QUANTIZE_MIN_BYTES"] = "0"
    plan.clear_cache()


def _input(numel: int, dtype: torch.dtype, rank: int, call: int) -> torch.Tensor:
    """Gaussian values with a sprinkling of 50x outliers (they set their groups' scales)."""
    g = torch.Generator().manual_seed(7919 * call + rank)
    x = torch.randn(numel, generator=g)
    x[::97] *= 50
    return x.to(dtype).to(device())


def _check(got, x, op, quantize, group_size, what):
    """Bit-exact against the emulation; every rank holds the same bits; inside the documented bound."""
    world = dist.get_world_size()
    assert_close(got, reference.all_reduce_quantized(x, None, op, quantize, group_size), f"{what}: emulation",
                 exact=True)
    every = reference.all_gather(_bits(got)).reshape(world, -1)
    differ = (every != every[0]).any(dim=0).nonzero().reshape(-1)
    assert differ.numel() == 0, f"rank {dist.get_rank()}: {what}: ranks disagree at {differ[:8].tolist()}"
    parts = reference.all_gather(x.reshape(-1).float()).reshape(world, -1).cpu()
    exact = parts.double().sum(dim=0) / (world if op == "avg" else 1)
    bound = error_bound(parts, quantize, group_size, op, x.dtype)
    err = (got.reshape(-1).cpu().double() - exact).abs()
    bad = (err > bound).nonzero().reshape(-1)
    if bad.numel():
        i = int(bad[0])
        raise AssertionError(f"rank {dist.get_rank()}: {what}: {bad.numel()} elements outside the bound, first "
                             f"at {i}: got {got.reshape(-1)[i].item()}, exact {exact[i].item()}, bound "
                             f"{bound[i].item()}")


def _slots_empty(what):
    from symmcoll.comm.quantized import SLOTS
    from symmcoll.language import EMPTY, HEADER_WORDS
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()
    region = symmcoll.get_workspace().region(SLOTS.name)
    words = region.local[: region.local.numel() // 4 * 4].view(torch.int32)[HEADER_WORDS.value:]
    left = (words != EMPTY.value).nonzero().reshape(-1)
    dist.barrier()
    assert left.numel() == 0, f"rank {dist.get_rank()}: {what}: slots not EMPTY at {left[:8].tolist()}"


def _launches() -> int:
    """Launches of the quantized kernel."""
    from symmcoll.launcher import LAUNCH_COUNTS
    return LAUNCH_COUNTS["quantized_two_shot_kernel"]


def _calls(quantize, cases, op):
    _kernel_at_every_size()
    rank = dist.get_rank()
    for call, (numel, group_size, dtype) in enumerate(cases):
        x = _input(numel, dtype, rank, call)
        snapshot = x.clone()
        before = _launches()
        got = symmcoll.all_reduce(x, op=op, quantize=quantize, group_size=group_size)
        launches = _launches() - before
        pieces = len(list(symmcoll.comm.quantized.pieces(numel, dist.get_world_size(), x.device.type)))
        assert launches == pieces >= (3 if numel > 2 * PIECE else 1), (launches, pieces)
        what = f"{quantize} {op} numel={numel} G={group_size} {dtype}"
        _check(got, x, op, quantize, group_size, what)
        if call == len(cases) - 1:
            again = symmcoll.all_reduce(x, op=op, quantize=quantize, group_size=group_size)
            assert torch.equal(_bits(again), _bits(got)), f"{what}: a repeated call gave other bits"
        assert torch.equal(_bits(x), _bits(snapshot)), f"{what}: the input changed"
    _slots_empty(f"after {quantize} {op}")


@pytest.mark.parametrize("quantize", FORMATS)
def test_quantized_sum(pools, world_size, quantize):
    pools(world_size).run(_calls, quantize, CASES, "sum")


def test_quantized_avg(pools, world_size):
    pools(world_size).run(_calls, "fp8", [(5003, 64, torch.bfloat16), (PIECE + 77, 128, torch.float32)], "avg")


def _data_kinds():
    _kernel_at_every_size()
    rank, world = dist.get_rank(), dist.get_world_size()
    for kind in KINDS:
        x = make_input(kind, 4096, rank, world).to(torch.bfloat16).to(device())
        for quantize in FORMATS:
            for group_size in ((32, 64, 128) if kind == "outliers" else (64,)):
                got = symmcoll.all_reduce(x, quantize=quantize, group_size=group_size)
                _check(got, x, "sum", quantize, group_size, f"{kind} {quantize} G={group_size}")


def test_quantized_accuracy_data_kinds(pools, world_size):
    pools(world_size).run(_data_kinds)


def _changing_configs(calls):
    """Several programs and several blocks per program, a different grid every call (the slot-set
    rotation must not depend on which program handles a slot)."""
    configs = [plan.LaunchConfig(128, 4, 4), plan.LaunchConfig(1024, 2, 4), plan.LaunchConfig(256, 3, 4)]
    _kernel_at_every_size()
    rank = dist.get_rank()
    for call in range(calls):
        quantize, group_size = FORMATS[call % 3], (32, 64, 128)[call % 3 - (call // 3) % 2]
        x = _input(1500 + 129 * call, torch.bfloat16, rank, call)
        got = plan.resolve("all_reduce_quantized", x, None, f"quantized_{quantize}", reduce_op="sum",
                           config=configs[call % len(configs)], options=(("group_size", group_size),)).execute(x)
        _check(got, x, "sum", quantize, group_size, f"config {call % len(configs)} call {call}")
    _slots_empty("after changing configs")


def test_quantized_changing_configs(pools, world_size):
    pools(world_size).run(_changing_configs, 4)


def _prefetched(calls):
    """SYMMCOLL_QUANT_PREFETCH's kernel (every load a loop step ahead): the same bits as the emulation
    with several blocks per program and several (block, peer) items (_changing_configs), and across
    pieces, odd sizes and avg (_calls); the slots left empty."""
    from symmcoll.comm import quantized
    saved = quantized.PREFETCH
    quantized.PREFETCH = True
    try:
        _changing_configs(calls)
        _calls("int4", CASES[2:4], "sum")
        _calls("int8", [(5003, 64, torch.bfloat16)], "avg")
    finally:
        quantized.PREFETCH = saved


def test_quantized_prefetched(pools, world_size):
    pools(world_size).run(_prefetched, 6)


def _validation_and_fallback():
    dev, rank, world = device(), dist.get_rank(), dist.get_world_size()
    x = torch.ones(300, device=dev)
    with pytest.raises(ValueError, match="quantize"):
        symmcoll.all_reduce(x, quantize="int3")
    with pytest.raises(ValueError, match="group_size"):
        symmcoll.all_reduce(x, quantize="int8", group_size=48)
    with pytest.raises(ValueError, match="group_size"):
        symmcoll.all_reduce(x, group_size=64)
    with pytest.raises(ValueError, match="op"):
        symmcoll.all_reduce(x, op="max", quantize="int8")
    with pytest.raises(ValueError, match="x.dtype"):
        symmcoll.all_reduce(torch.ones(3, dtype=torch.int32, device=dev), quantize="int4")
    with pytest.raises(ValueError, match="algorithm"):
        symmcoll.all_reduce(x, quantize="int8", algorithm="one_shot")
    # Below the threshold the exact path runs (no quantized launch; the exact result), at it the kernel.
    os.environ["SYMMCOLL_QUANTIZE_MIN_BYTES"] = "4096"
    try:
        small, large = _input(1023, torch.float32, rank, 1), _input(1024, torch.float32, rank, 2)
        assert plan.resolve("all_reduce_quantized", small, None, "quantized_int8", reduce_op="sum",
                            options=(("group_size", 64),)).name == "exact"
        before = _launches()
        got = symmcoll.all_reduce(small, quantize="int8")
        assert _launches() == before
        assert torch.equal(_bits(got), _bits(symmcoll.all_reduce(small)))
        got = symmcoll.all_reduce(large, quantize="int8")
        assert _launches() == before + 1
        _check(got, large, "sum", "int8", 64, "at the threshold")
    finally:
        _kernel_at_every_size()
    # Another group size on one rank is another wire format: every rank reports it, nobody decodes it.
    with pytest.raises(symmcoll.SymmcollMismatchError, match="size"):
        symmcoll.all_reduce(_input(3000, torch.bfloat16, rank, 3), quantize="int4", group_size=32 if rank else 64)
    symmcoll.reset()
    assert world >= 2


def test_prefetch_and_copy_engine_parts_follow_their_size_rules_unless_forced(monkeypatch):
    """The measured defaults (prefetching quantized stages from 16 MB a rank; the copy-engine all-gather in 2
    parts below 128 MB, 4 from there), and the switches that force either side (0 = off / one stream)."""
    from symmcoll import debug_switches
    from symmcoll.comm import gather, quantized
    monkeypatch.setattr(quantized, "PREFETCH", None)
    assert [quantized.prefetch_for(n) for n in (4 << 20, (16 << 20) - 1, 16 << 20, 1 << 30)] == [False, False, True, True]
    for forced in (True, False):
        monkeypatch.setattr(quantized, "PREFETCH", forced)
        assert quantized.prefetch_for(1) is forced and quantized.prefetch_for(1 << 30) is forced
    monkeypatch.setattr(debug_switches, "AG_CE_PARTS", None)
    assert [gather.copy_engine_parts(n) for n in (1, 64 << 20, (128 << 20) - 1, 128 << 20, 1 << 33)] == [2, 2, 2, 4, 4]
    monkeypatch.setattr(debug_switches, "AG_CE_PARTS", 0)
    assert gather.copy_engine_parts(256 << 20) == 0
    for name, value, parsed in (("SYMMCOLL_QUANT_PREFETCH", "0", False), ("SYMMCOLL_AG_CE_PARTS", "0", 0)):
        monkeypatch.setenv(name, value)
        read = debug_switches._on_off(name) if "PREFETCH" in name else debug_switches._count(name, "count", least=0)
        assert read == parsed
    monkeypatch.setenv("SYMMCOLL_QUANT_PREFETCH", "2")
    with pytest.raises(ValueError, match="SYMMCOLL_QUANT_PREFETCH"):
        debug_switches._on_off("SYMMCOLL_QUANT_PREFETCH")


def test_quantized_validation_fallback_mismatch(pools):
    pools(2).run(_validation_and_fallback)


def _torch_op():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    _kernel_at_every_size()
    rank, world, name = dist.get_rank(), dist.get_world_size(), dist.group.WORLD.group_name
    x = _input(3000, torch.bfloat16, rank, 4).reshape(30, 100)
    got = torch.ops.symmcoll.all_reduce_quantized(x, name, "sum", "fp8", 32)
    public = symmcoll.all_reduce(x, quantize="fp8", group_size=32)
    assert got.shape == x.shape and torch.equal(_bits(got), _bits(public))
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        fake = torch.ops.symmcoll.all_reduce_quantized(mode.from_tensor(x), name, "sum", "int8", 64)
    assert fake.shape == x.shape and fake.dtype == x.dtype
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: symmcoll.all_reduce(t * 2, quantize="int8") + 1, fullgraph=True,
                             backend="eager")
    assert torch.equal(_bits(compiled(x)), _bits(symmcoll.all_reduce(x * 2, quantize="int8") + 1))
    # Straight-through gradient: the exact all-reduce of the output gradient.
    w = _input(2000, torch.float32, rank, 5).requires_grad_()
    (symmcoll.all_reduce(w, quantize="int4") * (rank + 1)).sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, world * (world + 1) / 2))
    return True


def test_quantized_torch_op_compile_autograd(pools):
    assert pools(2).run(_torch_op) == [True, True]


# ---- the codecs, on one process -------------------------------------------------------------------

@triton.jit
def _codec_probe_kernel(x_ptr, out_ptr, words_ptr, N: tl.constexpr, G: tl.constexpr, FMT: tl.constexpr,
                        BITS: tl.constexpr):
    offs = tl.arange(0, N)
    codes, scales = quantize_groups(tl.load(x_ptr + offs)[None, :], 1, N, G, FMT)
    words = pack_words(codes, 1, N, BITS)
    tl.store(words_ptr + tl.arange(0, N * BITS // 32)[None, :], words)
    decoded = dequantize_groups(unpack_words(words, 1, N, BITS), scales, 1, N, G, FMT)
    tl.store(out_ptr + offs[None, :], decoded)


def _edge_values(quantize: str) -> torch.Tensor:
    """Groups of 32: ties of every kind, fp8 subnormal levels, zeros and negative zeros, a group with
    Inf, a group with NaN, a group of values below 2^-118, random groups."""
    qmax = {"int8": 127.0, "fp8": 448.0, "int4": 7.0}[quantize]
    g = torch.Generator().manual_seed(11)
    # amax = qmax: scale 1, so these are exact midpoints between two levels.
    j = torch.arange(31)
    if quantize == "fp8":
        mids = (1 + (2 * (j % 8) + 1) / 16) * 2.0 ** (j % 7 - 3) * (1 - 2 * (j % 2))
    else:
        span = int(min(qmax, 15))
        mids = j % (2 * span) - span + 0.5
    ties = torch.cat([torch.tensor([qmax]), mids.float()])
    tiny = torch.tensor([2.0 ** -k for k in range(4, 36)]) * torch.tensor([1.0, -1.0] * 16)
    tiny[0] = 1.0
    zeros = torch.zeros(32)
    zeros[1::2] = -0.0
    bad = torch.randn(32, generator=g)
    bad[3] = float("inf")
    nan = torch.randn(32, generator=g)
    nan[30] = float("nan")
    # A group below the smallest amax a scale is taken from (2^-118): steps of 2^-118 / qmax, zeros stay 0.
    below = torch.randint(-20, 21, (32,), generator=g).float() * 2.0 ** -125
    return torch.cat([ties, tiny, zeros, bad, nan, below, torch.randn(64, generator=g) * 10]).float()


def _codec_edges(quantize: str):
    from symmcoll.language import EMPTY, FORMATS as CODES
    x = _edge_values(quantize).to(device())
    out = torch.empty_like(x)
    words = torch.empty(x.numel() * BITS[quantize] // 32, dtype=torch.int32, device=x.device)
    _codec_probe_kernel[(1,)](x, out, words, N=x.numel(), G=32, FMT=CODES[quantize], BITS=BITS[quantize],
                              enable_fp_fusion=False)
    want = reference.dequantize_groups(*reference.quantize_groups(x, quantize, 32))
    same = (out == want) | (out.isnan() & want.isnan())
    assert bool(same.all()), f"{quantize}: codec differs from the reference at {(~same).nonzero()[:8].tolist()}"
    assert bool(out[96:128].isnan().all()) and bool(out[128:160].isnan().all()), "non-finite groups must be NaN"
    assert bool((words != EMPTY.value).all()), f"{quantize}: a data word equals the sentinel"
    fields = words.cpu().view(torch.uint8).to(torch.int32)
    if BITS[quantize] == 4:
        fields = torch.stack([fields & 0xF, fields >> 4])
        assert not bool((fields == 8).any()), "int4 codes must never be -8"
    else:
        assert not bool((fields == 0x80).any()), f"{quantize}: codes must never be 0x80"
    return True


@pytest.mark.parametrize("quantize", FORMATS)
def test_codec_edge_values(pools, quantize):
    assert pools(2).run(_codec_edges, quantize) == [True, True]


# ---- GPU only (scripts/gpu_check.sh): sizes where the kernel runs by default, graphs, stress ----------

def _gpu_fresh_data_and_graphs(quantize, numels, replays):
    """Eager calls of several sizes (one of two pieces), then CUDA-graph replays with fresh data: every
    output bit-exact against the emulation, on every rank, inside the bound; slots empty after."""
    from rank_checks import assert_clean_finish
    os.environ.pop("SYMMCOLL_QUANTIZE_MIN_BYTES", None)
    plan.clear_cache()
    rank = dist.get_rank()
    for call, numel in enumerate(numels):
        x = _input(numel, torch.bfloat16, rank, call)
        _check(symmcoll.all_reduce(x, quantize=quantize), x, "sum", quantize, 64, f"gpu {quantize} numel={numel}")
    static_x = _input(numels[0], torch.bfloat16, rank, 100)
    symmcoll.all_reduce(static_x, quantize=quantize)  # workspace and compilation before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [symmcoll.all_reduce(static_x, quantize=quantize) for _ in range(3)]
    for replay in range(replays):
        static_x.copy_(_input(numels[0], torch.bfloat16, rank, 200 + replay))
        graph.replay()
        torch.cuda.synchronize()
        want = reference.all_reduce_quantized(static_x, None, "sum", quantize, 64)
        for i, out in enumerate(outs):
            assert_close(out, want, f"{quantize} graph replay {replay} call {i}", exact=True)
    assert_clean_finish(f"after {quantize} graphs")
    _slots_empty(f"after {quantize} graphs")
    return replays


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
@pytest.mark.parametrize("quantize", FORMATS)
def test_gpu_quantized_fresh_data_and_graphs(pools, ws, quantize):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    numels = [1 << 20, 600_001, (9 << 20) + 12345]  # 2 MB; 1.2 MB odd; 18 MB in two pieces
    assert pools(ws).run(_gpu_fresh_data_and_graphs, quantize, numels, 10) == [10] * ws


def _gpu_stress(calls, seed):
    """Back-to-back quantized calls (random format, group size, dtype, 1-32 MB) between exact
    barrier-free and barrier all-reduces, new data every call."""
    import random

    from rank_checks import assert_clean_finish
    os.environ.pop("SYMMCOLL_QUANTIZE_MIN_BYTES", None)
    plan.clear_cache()
    rng = random.Random(seed)  # the same sequence on every rank
    rank = dist.get_rank()
    for call in range(calls):
        quantize, group_size = rng.choice(FORMATS), rng.choice((32, 64, 128))
        dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32])
        numel = int(2 ** rng.uniform(20, 25)) // dtype.itemsize
        x = _input(numel, dtype, rank, call)
        got = symmcoll.all_reduce(x, quantize=quantize, group_size=group_size)
        exact_algorithm = rng.choice(["sentinel_two_shot", "two_shot", "auto"])
        y = _input(numel // 3 + 1, dtype, rank, call + 10_000)
        exact = symmcoll.all_reduce(y, algorithm=exact_algorithm)
        assert_close(got, reference.all_reduce_quantized(x, None, "sum", quantize, group_size),
                     f"stress call {call}: {quantize} G={group_size} {dtype} numel={numel}", exact=True)
        assert_close(exact, reference.all_reduce(y), f"stress call {call}: {exact_algorithm}")
    assert_clean_finish("after the quantized stress")
    return calls


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [2, 4])
def test_gpu_quantized_stress(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    calls = int(os.environ.get("SYMMCOLL_STRESS_CALLS", "200"))
    assert pools(ws).run(_gpu_stress, calls, 77 + ws, timeout=900) == [calls] * ws
