"""The tensor-parallel decoder block (symmcoll.models) at world size 2 with tiny dims: a sequence-parallel
prefill and two decode steps (per-sequence positions) in every mode that runs here, each against the
unsharded block in fp32 (the same bf16 weights) and against mode "nccl"; the KV cache shards against
the reference's heads; the block's own semantics (a decode step equals the last row of a longer
prefill); bad configurations; ``symmcoll bench --op tp_block`` skipping without GPUs.

The block needs matmul_reduce_scatter, matmul_all_reduce and all_reduce_rms_norm from symmcoll: a
missing one fails the tests (test_symmcoll_has_the_ops_the_block_needs), no stand-in replaces it."""

import os

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll.models import BlockConfig, BlockWeights, DecoderBlock, KVCache

from rank_checks import TP_BLOCK_TOLERANCE, assert_clean_finish, device, relative_update_error

DEVICE = os.environ.get("SYMMCOLL_TEST_DEVICE", "cpu")
TINY = BlockConfig(hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128)
BATCH, SEQ, MAX_SEQ = 2, 4, 8
DECODE_POSITIONS = ([SEQ, SEQ], [SEQ + 1, SEQ - 1])   # step 2: sequence 1 rewrites its last position
# Relative error (Frobenius) of the block's update (output - input: the residual would hide errors in
# the branches) in bf16 against fp32 arithmetic on the same weights: each of the ~8 roundings to bf16
# between the input and the output adds up to 2^-9 relative; measured 5e-3 to 7.5e-3 here.
TOLERANCE = TP_BLOCK_TOLERANCE
OPS_THE_BLOCK_NEEDS = ("matmul_reduce_scatter", "matmul_all_reduce", "all_reduce_rms_norm", "all_gather_matmul",
                       "all_reduce")


def test_symmcoll_has_the_ops_the_block_needs():
    assert [name for name in OPS_THE_BLOCK_NEEDS if not hasattr(symmcoll, name)] == []


# ---- rank side ---------------------------------------------------------------------------------------

def _tokens(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SEQ + len(DECODE_POSITIONS), TINY.hidden, generator=g).to(torch.bfloat16).to(device())


def _steps(block, x, rank, world, dtype):
    """Prefill of SEQ tokens (this rank's rows), then the decode steps: (outputs, inputs, cache)."""
    cache = KVCache.empty(TINY, world, BATCH, MAX_SEQ, dtype=dtype, device=device())
    rows = BATCH * SEQ // world
    prompt = x[:, :SEQ].reshape(BATCH * SEQ, -1)[rank * rows:(rank + 1) * rows].to(dtype)
    outs, ins = [block.prefill(prompt, cache)], [prompt]
    for step, positions in enumerate(DECODE_POSITIONS):
        token = x[:, SEQ + step].to(dtype)
        outs.append(block.decode(token, torch.tensor(positions, device=device()), cache))
        ins.append(token)
    return outs, ins, cache


def _modes_against_reference(modes, seed):
    rank, world = dist.get_rank(), dist.get_world_size()
    x = _tokens(seed)
    # Drawn on the device the shards are drawn on (CPU and CUDA generators give different numbers).
    full = BlockWeights.random(TINY, 0, 1, seed=seed, device=device()).to(torch.float32)
    reference = DecoderBlock(TINY, full, "local")
    want, _, want_cache = _steps(reference, x, 0, 1, torch.float32)
    rows = BATCH * SEQ // world
    want[0] = want[0][rank * rows:(rank + 1) * rows]          # this rank's rows of the prefill
    heads = slice(rank * TINY.n_kv_heads // world, (rank + 1) * TINY.n_kv_heads // world)
    weights = BlockWeights.random(TINY, rank, world, seed=seed, device=device())
    errors, results = {}, {}
    for mode in modes:
        got, ins, cache = _steps(DecoderBlock(TINY, weights, mode), x, rank, world, torch.bfloat16)
        results[mode] = got, ins
        for i, (g, w, base) in enumerate(zip(got, want, ins)):
            assert g.shape == w.shape and g.dtype == torch.bfloat16, f"{mode} step {i}: {g.dtype}{tuple(g.shape)}"
            errors[(mode, i, "vs fp32 reference")] = relative_update_error(g, w, base)
        for name, buf, ref in (("k", cache.k, want_cache.k), ("v", cache.v, want_cache.v)):
            ref = ref[:, heads]
            errors[(mode, "cache " + name, "vs fp32 reference")] = float((buf.float() - ref).norm() / ref.norm())
    for mode in modes:
        if mode != "nccl" and "nccl" in modes:
            for i, (g, w, base) in enumerate(zip(results[mode][0], results["nccl"][0], results[mode][1])):
                errors[(mode, i, "vs nccl")] = relative_update_error(g, w, base)
    if "symmcoll" in modes:
        assert_clean_finish("tp block, mode symmcoll")
    return errors


_TORCH_FALLBACKS = []


def _torch_fallbacks_as_cpu_kernels():
    """Register torch's own reference compositions of its async-TP ops (all-gather / reduce-scatter by
    functional collectives, then matmul) as their CPU kernels, once per rank process."""
    if _TORCH_FALLBACKS:
        return
    import torch.distributed._symmetric_memory as symm
    lib = torch.library.Library("symm_mem", "IMPL")
    lib.impl("fused_all_gather_matmul", symm._fused_all_gather_matmul_fallback, "CPU")
    lib.impl("fused_matmul_reduce_scatter", symm._fused_matmul_reduce_scatter_fallback, "CPU")
    _TORCH_FALLBACKS.append(lib)  # the registrations live as long as the library object


def _torch_async_tp_wiring(seed):
    from symmcoll.models import tp_comm
    _torch_fallbacks_as_cpu_kernels()
    # Decode's symmetric-memory one-shot all-reduce has no CPU form: gloo's in its place.
    original = tp_comm.TorchAsyncTPComm.all_reduce
    tp_comm.TorchAsyncTPComm.all_reduce = tp_comm.NcclComm.all_reduce
    try:
        return _modes_against_reference(("nccl", "torch_async_tp"), seed)
    finally:
        tp_comm.TorchAsyncTPComm.all_reduce = original


def _assert_within(errors, limit):
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v < limit}
    assert not bad, f"relative errors above {limit}: {bad}"


# ---- tests ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nccl", "torch_async_tp", "symmcoll"])
def test_mode_matches_the_unsharded_block(pools, mode):
    if mode == "torch_async_tp" and DEVICE != "cuda":
        pytest.skip("torch.ops.symm_mem's fused_all_gather_matmul / fused_matmul_reduce_scatter and "
                    "one_shot_all_reduce_copy have CUDA kernels only (the mode's wiring is checked on CPU "
                    "by test_torch_async_tp_wiring_with_torch_fallbacks)")
    modes = ("nccl",) if mode == "nccl" else ("nccl", mode)
    for errors in pools(2).run(_modes_against_reference, modes, 3):
        _assert_within(errors, TOLERANCE)


def test_torch_async_tp_wiring_with_torch_fallbacks(pools):
    if DEVICE == "cuda":
        pytest.skip("on GPU test_mode_matches_the_unsharded_block runs the real torch ops")
    for errors in pools(2).run(_torch_async_tp_wiring, 4):
        _assert_within(errors, TOLERANCE)


def test_decode_continues_the_prefill():
    """Semantics of the cache, positions, rotary and masks: decoding token S after a prefill of S tokens
    gives the last row of a prefill of S + 1 tokens (fp32, one rank)."""
    weights = BlockWeights.random(TINY, 0, 1, seed=5, dtype=torch.float32)
    block = DecoderBlock(TINY, weights, "local")
    x = torch.randn(BATCH, SEQ + 1, TINY.hidden, generator=torch.Generator().manual_seed(6))
    cache = KVCache.empty(TINY, 1, BATCH, MAX_SEQ, dtype=torch.float32)
    block.prefill(x[:, :SEQ].reshape(BATCH * SEQ, -1), cache)
    step = block.decode(x[:, SEQ], torch.full((BATCH,), SEQ), cache)
    longer = block.prefill(x.reshape(-1, TINY.hidden), KVCache.empty(TINY, 1, BATCH, MAX_SEQ, dtype=torch.float32))
    torch.testing.assert_close(step, longer.view(BATCH, SEQ + 1, -1)[:, SEQ], rtol=1e-5, atol=1e-5)
    # A sequence decoded at an earlier position sees fewer tokens: its output differs.
    earlier = block.decode(x[:, SEQ], torch.tensor([SEQ, SEQ - 2]), cache)
    assert torch.allclose(earlier[0], step[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(earlier[1], step[1], rtol=1e-3, atol=1e-3)


def test_weights_do_not_depend_on_the_world_size():
    full = BlockWeights.random(TINY, 0, 1, seed=2)
    halves = [BlockWeights.random(TINY, r, 2, seed=2) for r in range(2)]
    assert torch.equal(torch.cat([h.w_down for h in halves]), full.w_down)
    q = TINY.n_heads * TINY.head_dim
    assert torch.equal(torch.cat([h.w_qkv[:, :q // 2] for h in halves], 1), full.w_qkv[:, :q])
    assert torch.equal(halves[1].attn_norm, full.attn_norm)


def test_bad_configurations():
    with pytest.raises(ValueError, match="n_kv_heads=2 must be divisible by the world size 4"):
        BlockWeights.random(TINY, 0, 4)
    with pytest.raises(ValueError, match="mode must be one of"):
        DecoderBlock(TINY, BlockWeights.random(TINY, 0, 1), "gloo")
    with pytest.raises(ValueError, match="w_qkv"):
        DecoderBlock(TINY, BlockWeights.random(TINY, 0, 2), "local")   # a shard of world 2 on one rank
    block = DecoderBlock(TINY, BlockWeights.random(TINY, 0, 1), "local")
    with pytest.raises(ValueError, match="x_shard"):
        block.prefill(torch.zeros(3, TINY.hidden, dtype=torch.bfloat16), KVCache.empty(TINY, 1, 2, 8))


@pytest.mark.parametrize("args", [["tp_block"], ["backend_block"], ["backend_block", "--profile"]])
def test_bench_says_it_is_skipped_without_gpus(capsys, args):   # (backend_block: tests/test_backend_block.py)
    if torch.cuda.is_available():
        pytest.skip("GPUs present: the benchmark would run")
    from symmcoll import cli
    op = args[0]
    assert cli.main(["bench", "--op", *args]) == 0
    out = capsys.readouterr().out
    assert op in out and "skipped" in out


def test_bench_cases_and_kernel_classes():
    from symmcoll.bench import kernel_share, tp_block
    assert tp_block.case_names() == ["decode:1", "decode:8", "decode:64", "prefill:1x2048:eager",
                                     "prefill:1x2048:compile", "prefill:4x4096:eager", "prefill:4x4096:compile"]
    assert tp_block.parse_case("prefill:4x4096:compile") == {
        "name": "prefill:4x4096:compile", "phase": "prefill", "batch": 4, "seq": 4096, "timing": "compile"}
    for bad in ("decode", "prefill:4x4096", "prefill:4x4096:graph", "encode:1"):
        with pytest.raises(ValueError, match="tp_block case"):
            tp_block.parse_case(bad)
    comm, fused = kernel_share.symmcoll_kernel_names()
    assert "one_shot_kernel" in comm and "ag_matmul_kernel" in fused and "matmul_kernel" not in fused | comm

    def event(name, dur, cat="kernel", stream=7):
        return {"ph": "X", "cat": cat, "name": name, "dur": dur, "args": {"stream": stream}}
    events = [
        event("sm90_xmma_gemm_bf16bf16_bf16f32", 100),                                   # cuBLAS: compute
        event("matmul_kernel", 50),                                                      # symmcoll's GEMM
        event("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20),
        event("void c10d::symmetric_memory::one_shot_all_reduce_kernel<bf16, 2>(bf16**, ...)", 5),
        # torch 2.11's name for the same kernel: an anonymous namespace
        event("void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 2>(c10::BFloat16", 7),
        event("one_shot_kernel", 4),                                                     # symmcoll collective
        event("ag_matmul_kernel", 40),                                                   # symmcoll fused
        event("Memcpy PtoP (Device -> Device)", 3, "gpu_memcpy"),
        event("Memcpy DtoD (Device -> Device)", 6, "gpu_memcpy", stream=21),             # side-stream copy
        event("Memcpy DtoD (Device -> Device)", 2, "gpu_memcpy"),                        # local copy
        event("Memset (Device)", 1, "gpu_memset"),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 1000},     # host side: ignored
    ]
    got = kernel_share.shares(events)
    assert (got["comm_us"], got["fused_us"], got["compute_us"]) == (45, 40, 153)
    assert got["comm_share"] == pytest.approx(45 / 238) and got["fused_share"] == pytest.approx(40 / 238)
    # the longest activities by name, the two local and side-stream copies of one name summed
    assert got["top_kernels"][:3] == [["sm90_xmma_gemm_bf16bf16_bf16f32", 100], ["matmul_kernel", 50],
                                      ["ag_matmul_kernel", 40]]
    assert ["Memcpy DtoD (Device -> Device)", 8] in got["top_kernels"]
    # how often each of them ran, in the same order
    assert [name for name, _ in got["top_calls"]] == [name for name, _ in got["top_kernels"]]
    assert ["Memcpy DtoD (Device -> Device)", 2] in got["top_calls"] and got["top_calls"][0][1] == 1
    assert all(name != "cudaLaunchKernel" for name, _ in got["top_kernels"])
    assert (got["busy_us"], got["activities"]) == (238, 11)  # every GPU activity, none of the host's
    assert kernel_share.kernel_base_name("void (anonymous namespace)::two_shot_all_reduce_kernel<float, 8>(float*") \
        == "two_shot_all_reduce_kernel"
    assert kernel_share.kernel_base_name("void at::native::elementwise_kernel<128, 4>(int") == "elementwise_kernel"
    # idle time of the main stream, by the activity that followed it
    gap = [{"ph": "X", "cat": "kernel", "name": n, "dur": 5, "ts": t, "args": {"stream": 7}}
           for n, t in (("a", 0), ("b", 5), ("c", 12), ("a", 400), ("c", 406))]
    idle = kernel_share.shares(gap)
    assert idle["idle_us"] == 3 and idle["idle_before"] == [["c", 3.0]], idle  # (395 us: between calls)
    # profile(): those figures a step, for 2 calls of 3 steps each (a graph of 3 steps replayed twice)
    real = kernel_share.trace_events
    kernel_share.trace_events = lambda run, calls: gap
    try:
        step = kernel_share.profile(None, calls=2, steps=3)
    finally:
        kernel_share.trace_events = real
    assert step["busy_us"] == 25 / 6 and step["activities"] == 5 / 6 and step["idle_us"] == 3 / 6, step
    assert step["top_kernels"][0] == ["a", round(10 / 6, 2)] and step["idle_before"] == [["c", 0.5]], step
    assert step["top_calls"][0] == ["a", round(2 / 6, 2)], step
    assert kernel_share.shares([])["comm_share"] is None


def test_bench_symmcoll_algorithms_from_the_environment(monkeypatch):
    from symmcoll.bench import tp_block
    monkeypatch.delenv("SYMMCOLL_TP_ALGORITHMS", raising=False)
    assert tp_block.symmcoll_algorithms() is None
    monkeypatch.setenv("SYMMCOLL_TP_ALGORITHMS", "matmul_all_reduce=unfused, all_reduce_rms_norm=one_shot")
    assert tp_block.symmcoll_algorithms() == {"matmul_all_reduce": "unfused", "all_reduce_rms_norm": "one_shot"}
    monkeypatch.setenv("SYMMCOLL_TP_ALGORITHMS", "matmul_all_reduce")
    with pytest.raises(ValueError, match="op=algorithm"):
        tp_block.symmcoll_algorithms()


def test_bench_mode_order(monkeypatch):
    from symmcoll.bench import tp_block
    monkeypatch.delenv("SYMMCOLL_TP_ORDER", raising=False)
    assert tp_block.mode_order() == ("nccl", "torch_async_tp", "symmcoll")
    monkeypatch.setenv("SYMMCOLL_TP_ORDER", "nccl,symmcoll,torch_async_tp")
    assert tp_block.mode_order() == ("nccl", "symmcoll", "torch_async_tp")
    for bad in ("symmcoll,nccl,torch_async_tp", "nccl,symmcoll"):
        monkeypatch.setenv("SYMMCOLL_TP_ORDER", bad)
        with pytest.raises(ValueError, match="nccl first"):
            tp_block.mode_order()
