"""GPU-only (scripts/gpu_check.sh; NOT RUN elsewhere): the decoder block of symmcoll.models with small
dims in every mode -- decode captured in a CUDA graph and replayed with fresh tokens and positions
against eager decode and against mode nccl; torch.compile'd prefill (fullgraph) against eager; and the
benchmark's rank side (timing, profile shares, differences) on a tiny case. The modes against the
unsharded block run in tests/test_tp_block.py with SYMMCOLL_TEST_DEVICE=cuda."""

import pytest
import torch
import torch.distributed as dist

from symmcoll.models import MODES, BlockConfig, BlockWeights, DecoderBlock, KVCache

from rank_checks import TP_BLOCK_TOLERANCE as TOLERANCE, relative_update_error

pytestmark = pytest.mark.gpu

# 4 KV heads: shardable over 2 and 4 ranks; dims multiples of 16 (TMA-friendly rows)
SMALL = BlockConfig(hidden=256, n_heads=8, n_kv_heads=4, head_dim=32, ffn=512)
BATCH, CACHE = 4, 40


def _world_sizes():
    return [w for w in (2, 4) if w <= torch.cuda.device_count()]


def _block(mode):
    rank, world = dist.get_rank(), dist.get_world_size()
    weights = BlockWeights.random(SMALL, rank, world, seed=11, device="cuda")
    return DecoderBlock(SMALL, weights, mode)


def _token(step):
    g = torch.Generator(device="cuda").manual_seed(500 + step)
    return torch.randn(BATCH, SMALL.hidden, generator=g, device="cuda").to(torch.bfloat16)


def _decode_graphs(replays):
    rank, world = dist.get_rank(), dist.get_world_size()
    outputs = {}
    for mode in MODES:
        block = _block(mode)
        graph_cache = KVCache.empty(SMALL, world, BATCH, CACHE + 8, device="cuda").fill_random(rank, world, CACHE)
        eager_cache = KVCache(graph_cache.k.clone(), graph_cache.v.clone())
        x = _token(0)
        positions = torch.full((BATCH,), CACHE, dtype=torch.int64, device="cuda")
        block.decode(x, positions, KVCache(graph_cache.k.clone(), graph_cache.v.clone()))   # warm-up
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = block.decode(x, positions, graph_cache)
        for step in range(1, replays + 1):
            token = _token(step)
            where = torch.tensor([CACHE + step % 4, CACHE, CACHE + 1, CACHE - step], device="cuda")
            x.copy_(token)
            positions.copy_(where)
            graph.replay()
            want = block.decode(token, where, eager_cache)
            err = relative_update_error(out, want, token)
            assert err < 1e-3, f"rank {rank} {mode}: replay {step} differs from eager decode: {err:.2e}"
            outputs.setdefault(mode, []).append(out.clone())
        for name in ("k", "v"):
            got, want = getattr(graph_cache, name).float(), getattr(eager_cache, name).float()
            err = float((got - want).norm() / want.norm())
            assert err < 1e-3, f"rank {rank} {mode}: graph and eager {name} caches differ: {err:.2e}"
    for mode in MODES[1:]:
        for step, (got, want) in enumerate(zip(outputs[mode], outputs["nccl"])):
            err = relative_update_error(got, want, _token(step + 1))
            assert err < TOLERANCE, f"rank {rank} {mode} vs nccl, replay {step + 1}: {err:.2e}"
    return True


@pytest.mark.parametrize("world", [2, 4])
def test_decode_in_a_cuda_graph(pools, world):
    if world not in _world_sizes():
        pytest.skip(f"NOT RUN: needs {world} GPUs")
    assert pools(world).run(_decode_graphs, 5) == [True] * world


def _compiled_prefill():
    rank, world = dist.get_rank(), dist.get_world_size()
    batch, seq = 2, 64
    rows = batch * seq // world
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(batch * seq, SMALL.hidden, generator=g, device="cuda")[rank * rows:(rank + 1) * rows]
    x = x.to(torch.bfloat16)
    for mode in MODES:
        block = _block(mode)
        eager = block.prefill(x, KVCache.empty(SMALL, world, batch, seq, device="cuda"))
        torch._dynamo.reset()
        compiled = torch.compile(block.prefill, fullgraph=True, dynamic=False)
        cache = KVCache.empty(SMALL, world, batch, seq, device="cuda")
        got = compiled(x, cache)
        err = relative_update_error(got, eager, x)
        assert err < TOLERANCE, f"rank {rank} {mode}: compiled prefill vs eager {err:.2e}"
        assert cache.k.abs().sum() > 0, f"rank {rank} {mode}: compiled prefill left the cache empty"
    return True


def test_compiled_prefill(pools):
    if 2 not in _world_sizes():
        pytest.skip("NOT RUN: needs 2 GPUs")
    assert pools(2).run(_compiled_prefill, timeout=600) == [True, True]


def _bench_rows(cases):
    from symmcoll.bench import tp_block
    rows = []
    for case in cases:
        rows += tp_block.run_case(SMALL, case, MODES, "bf16", 3)
    return rows


def test_bench_rank_side(pools):
    if 2 not in _world_sizes():
        pytest.skip("NOT RUN: needs 2 GPUs")
    import symmcoll
    missing = [op for op in ("matmul_reduce_scatter", "matmul_all_reduce", "all_reduce_rms_norm")
               if not hasattr(symmcoll, op)]
    rows = pools(2).run(_bench_rows, ["decode:2", "prefill:2x32:eager"], timeout=600)[0]
    assert [(r["case"], r["mode"]) for r in rows] == [(c, m) for c in ("decode:2", "prefill:2x32:eager") for m in MODES]
    for r in rows:
        if r["mode"] == "symmcoll" and missing:
            assert r["error"] and "has no attribute" in r["error"], r   # the bench runs no stand-ins
            continue
        assert r["error"] is None, r
        assert r["ms_per_step"] > 0 and r["tokens_per_s"] > 0
        assert 0 < (r["comm_share"] or 0) + (r["fused_share"] or 0) <= 1, f"no communication seen: {r}"
        if r["mode"] != "nccl":
            assert r["rel_diff_vs_nccl"] < TOLERANCE, r
