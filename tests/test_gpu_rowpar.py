"""GPU checks of the row-parallel fused ops (scripts/gpu_check.sh; NOT RUN elsewhere): realistic shapes
(TMA-aligned and odd N, several pieces), back-to-back calls with fresh data and changing shapes, CUDA-graph
replays with new inputs copied in, and results the same on every rank for the all-reduces."""

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference

from rank_checks import FP8_TOL, REL_TOL, assert_rel_close, assert_same_on_every_rank, assert_slots_empty

pytestmark = pytest.mark.gpu
WORLDS = [1, 2, 4]  # (1: the group-of-one paths, e.g. matmul_all_reduce one_shot without stage 2)


def _needs(ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")


def _randn(shape, seed, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def _matmul_inputs(m, n, k, rank, call):
    return _randn((m, k), 1000 * call + rank), _randn((k, n), 1000 * call + rank + 500, k ** -0.5)


def _norm_inputs(tokens, h, rank, call):
    # residual and weight are the same on every rank (seeds without the rank)
    return _randn((tokens, h), 1000 * call + rank), _randn((tokens, h), 1000 * call + 777), _randn((h,), 31 + call)


def _matmul_case(op, algorithm, m, n, k, call):
    rank = dist.get_rank()
    a, b = _matmul_inputs(m, n, k, rank, call)
    got = getattr(symmcoll, op)(a, b, algorithm=algorithm)
    what = f"{op}.{algorithm} {m}x{n}x{k} call {call}"
    assert_rel_close(got, getattr(reference, op)(a, b), what, REL_TOL[torch.bfloat16])
    if op == "matmul_all_reduce" and algorithm != "nccl":
        assert_same_on_every_rank(got, what)


def _norm_case(algorithm, tokens, h, quant, call):
    rank = dist.get_rank()
    x, residual, weight = _norm_inputs(tokens, h, rank, call)
    want = reference.all_reduce_rms_norm(x, residual, weight, 1e-6)
    scale = (want[0].abs().max() / 300).reshape(1) if quant == "fp8_per_tensor" else None
    if quant:
        want = reference.all_reduce_rms_norm(x, residual, weight, 1e-6, quant=quant, scale=scale)
    got = symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6, algorithm=algorithm, quant=quant, scale=scale)
    what = f"all_reduce_rms_norm.{algorithm} {tokens}x{h} {quant} call {call}"
    assert_rel_close(got[0].float(), want[0], f"{what}: normed", FP8_TOL if quant else REL_TOL[torch.bfloat16])
    assert_rel_close(got[1], want[1], f"{what}: new residual", REL_TOL[torch.bfloat16])
    if algorithm != "nccl":
        for t in got:
            assert_same_on_every_rank(t, what)


MATMUL_SHAPES = {  # (M, N, K) per world size W: K = 28672 / W (70B-class down-projection) and odd shapes
    "matmul_reduce_scatter": lambda w: [(2048, 8192, 28672 // w), (16384, 8192, 2048), (128 * w, 8190, 1000),
                                        (2 * w, 8192, 28672 // w), (2048, 8192, 28672 // w)],
    "matmul_all_reduce": lambda w: [(1, 8192, 28672 // w), (16, 8192, 28672 // w), (128, 8190, 1000),
                                    (256, 8192, 28672 // w), (2048, 8192, 28672 // w), (1, 8192, 28672 // w)],
}
NORM_SHAPES = [(1, 8192, None), (6, 6144, None), (138, 6144, "fp8_per_token"), (512, 8192, "fp8_per_tensor"),
               (2048, 8192, None), (7, 4099, None), (8192, 8192, None), (1, 8192, None)]


def _back_to_back():
    """Every algorithm of every op, shape after shape with fresh data (changing sizes between calls
    of one kernel: slots and flags must be right whatever the previous call was)."""
    world = dist.get_world_size()
    for op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        for algorithm in [*symmcoll.ALGORITHMS[op], "nccl", "auto"]:
            for call, (m, n, k) in enumerate(MATMUL_SHAPES[op](world)):
                _matmul_case(op, algorithm, m, n, k, call)
    for algorithm in [*symmcoll.ALGORITHMS["all_reduce_rms_norm"], "nccl", "auto"]:
        for call, (tokens, h, quant) in enumerate(NORM_SHAPES):
            _norm_case(algorithm, tokens, h, quant, call)
    torch.cuda.synchronize()
    symmcoll.check()
    assert_slots_empty()
    return True


@pytest.mark.parametrize("ws", WORLDS)
def test_row_parallel_back_to_back(pools, ws):
    _needs(ws)
    assert pools(ws).run(_back_to_back, timeout=900) == [True] * ws


def _graph_replays(op, algorithm, shape, replays):
    """Three calls captured in one graph; each replay gets fresh inputs copied into the captured ones."""
    rank = dist.get_rank()
    if op == "all_reduce_rms_norm":
        tokens, h, quant = shape
        static = list(_norm_inputs(tokens, h, rank, 0))
        scale = torch.full((1,), 0.01, device="cuda") if quant == "fp8_per_tensor" else None

        def call():
            return symmcoll.all_reduce_rms_norm(*static, 1e-6, algorithm=algorithm, quant=quant, scale=scale)

        def want():
            return reference.all_reduce_rms_norm(*static, 1e-6, quant=quant, scale=scale)
    else:
        static = list(_matmul_inputs(*shape, rank, 0))

        def call():
            return (getattr(symmcoll, op)(*static, algorithm=algorithm),)

        def want():
            return (getattr(reference, op)(*static),)
    call()  # workspace, plan and compilation before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call() for _ in range(3)]
    for replay in range(1, replays + 1):
        fresh = _norm_inputs(*shape[:2], rank, replay) if op == "all_reduce_rms_norm" else \
            _matmul_inputs(*shape, rank, replay)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        expected = want()
        for i, out in enumerate(outs):
            for got, w in zip(out, expected):
                tol = FP8_TOL if got.dtype == torch.float8_e4m3fn else REL_TOL[torch.bfloat16]
                assert_rel_close(got.float(), w, f"{op}.{algorithm} {shape} replay {replay} call {i}", tol)
    torch.cuda.synchronize()
    symmcoll.check()
    return replays


GRAPH_CASES = [("matmul_reduce_scatter", "fused", (2048, 8192, 4096)),
               ("matmul_reduce_scatter", "fused", (16384, 8192, 1024)),  # several pieces per call
               ("matmul_reduce_scatter", "chunked", (2048, 8192, 4096)),
               # chunks of 48 MB (ws 4) / 96 MB (ws 2): 2 / 3 units a step in the 32 MB slots of the 64 MB
               # workspace the mrs-chunked stage of scripts/gpu_check.sh gives these tests (one at the default)
               ("matmul_reduce_scatter", "chunked", (8192, 12288, 512)),
               ("matmul_all_reduce", "one_shot", (16, 8192, 7168)),
               ("matmul_all_reduce", "two_shot", (1000, 8190, 1024)),
               ("all_reduce_rms_norm", "one_shot", (6, 6144, None)),
               ("all_reduce_rms_norm", "one_shot", (138, 8192, "fp8_per_token")),
               ("all_reduce_rms_norm", "two_shot", (2048, 8192, "fp8_per_tensor")),
               ("all_reduce_rms_norm", "two_shot", (8192, 6144, None))]


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("op, algorithm, shape", GRAPH_CASES, ids=lambda v: str(v))
def test_row_parallel_cuda_graph(pools, ws, op, algorithm, shape):
    _needs(ws)
    assert pools(ws).run(_graph_replays, op, algorithm, shape, 10, timeout=600) == [10] * ws
