"""GPU-only (scripts/gpu_check.sh; reported as NOT RUN elsewhere): symmcoll inside real model code --
CUDA graphs that mix symmcoll ops with NCCL collectives and matmuls, graphs captured per batch size the
way serving engines do (many graphs, one workspace), capture before any call, and torch.compile in every
mode, with exact results against answers computed locally from rank-coded inputs."""

import pytest
import torch
import torch.distributed as dist

import symmcoll

from rank_checks import assert_close, rank_coded

pytestmark = pytest.mark.gpu


def _sum_of(numel, dtype, world, call):
    acc = rank_coded(numel, torch.float32, 0, call)
    for r in range(1, world):
        acc += rank_coded(numel, torch.float32, r, call)
    return acc.to(dtype)


def _mixed_graph(replays):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = rank_coded(4096, torch.bfloat16, rank, 0)
    w = torch.eye(64, dtype=torch.bfloat16, device=x.device) * 2

    def step():
        a = symmcoll.all_reduce(x)                        # symmcoll
        b = a.reshape(64, 64) @ w                          # a matmul between collectives
        c = b.reshape(-1).clone()
        dist.all_reduce(c)                                 # NCCL in the same graph
        d = symmcoll.reduce_scatter(c.reshape(world * 8, -1))
        return a, c, d, symmcoll.all_gather(x, algorithm="copy_engine")

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for replay in range(1, replays + 1):
        x.copy_(rank_coded(4096, torch.bfloat16, rank, replay))
        graph.replay()
        total = _sum_of(4096, torch.bfloat16, world, replay)
        assert_close(outs[0], total, f"symmcoll all_reduce, replay {replay}", exact=True)
        doubled = (total.float() * 2 * world).to(torch.bfloat16)
        assert_close(outs[1], doubled, f"NCCL all_reduce of the matmul, replay {replay}", exact=True)
        want_rs = (doubled.float() * world).to(torch.bfloat16).reshape(world * 8, -1)[rank * 8:(rank + 1) * 8]
        assert_close(outs[2], want_rs, f"symmcoll reduce_scatter, replay {replay}", exact=True)
        gathered = torch.cat([rank_coded(4096, torch.bfloat16, r, replay) for r in range(world)])
        assert_close(outs[3], gathered, f"copy-engine all_gather, replay {replay}", exact=True)
    return replays


@pytest.mark.parametrize("ws", [2, 4])
def test_graph_mixing_symmcoll_nccl_and_matmuls(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_mixed_graph, 10) == [10] * ws


def _per_batch_graphs():
    """One graph per batch size, as serving engines capture them, all sharing one workspace; replayed
    in a scrambled order with fresh data each time."""
    rank, world = dist.get_rank(), dist.get_world_size()
    hidden = 1024
    batches = [1, 8, 64, 512]
    statics, graphs, outs = {}, {}, {}
    for b in batches:
        statics[b] = rank_coded(b * hidden, torch.bfloat16, rank, 0)
        symmcoll.all_reduce(statics[b])  # warm-up: compile and plan before the capture
    torch.cuda.synchronize()
    for b in batches:
        graphs[b] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[b]):
            outs[b] = symmcoll.all_reduce(statics[b])
    assert len(symmcoll.memory.workspaces()) == 1
    for step, b in enumerate([64, 1, 512, 8, 8, 1, 64, 512] * 2):
        statics[b].copy_(rank_coded(b * hidden, torch.bfloat16, rank, step + 1))
        graphs[b].replay()
        assert_close(outs[b], _sum_of(b * hidden, torch.bfloat16, world, step + 1), f"batch {b}, step {step}",
                     exact=True)
    return True


@pytest.mark.parametrize("ws", [2, 4])
def test_graphs_per_batch_size_share_one_workspace(pools, ws):
    if ws > torch.cuda.device_count():
        pytest.skip(f"NOT RUN: needs {ws} GPUs")
    assert pools(ws).run(_per_batch_graphs) == [True] * ws


def _capture_before_any_call():
    symmcoll.reset()
    x = torch.ones(1024, device="cuda")
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            symmcoll.all_reduce(x)
    except Exception as exc:  # noqa: BLE001 - the error is the point
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_capture_before_any_call_raises_clearly(pools):
    if torch.cuda.device_count() < 2:
        pytest.skip("NOT RUN: needs 2 GPUs")
    for message in pools(2).run(_capture_before_any_call):
        assert "SymmcollError" in message and "before capturing" in message, message
    pools(2).close()  # the failed capture may leave the stream unusable: fresh ranks for later tests


def _compile_modes():
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        fn = torch.compile(lambda t: symmcoll.all_reduce(t * 2) + 1, fullgraph=True, mode=mode)
        for call, tokens in enumerate([4, 4, 9, 17, 4]):
            x = rank_coded(tokens * 256, torch.bfloat16, rank, call).reshape(tokens, 256)
            got = fn(x).clone()
            want = (_sum_of(tokens * 256, torch.float32, world, call).reshape(tokens, 256) * 2 + 1).to(torch.bfloat16)
            assert_close(got, want, f"compiled ({mode}) call {call}", exact=True)
        results[mode] = True
    return results


def test_torch_compile_modes_on_gpu(pools):
    if torch.cuda.device_count() < 2:
        pytest.skip("NOT RUN: needs 2 GPUs")
    assert all(all(r.values()) for r in pools(2).run(_compile_modes, timeout=900))
