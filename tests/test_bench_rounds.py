"""Interleaved timing rounds (bench/rounds.py) and the two benches that time that way: the fused bench
(bench/fused.py run_shape) and the decoder-block bench (bench/tp_block.py run_case). On CPU ranks the
GPU parts (graph capture, CUDA-event timing) are replaced by recorders: the tests see in which order
the implementations were timed, which samples each row's median is over, and that a failing
implementation is still an error row while the others go on."""

from dataclasses import replace

import pytest
import torch

from symmcoll.bench.rounds import interleave, per_round, rotation

# Per (name, round): the samples a fake timer gives. Over all rounds "a" has the median 3; the median of
# its round medians would be 2, of its first round 1, of its last 9: only the median of every sample is 3.
SAMPLES = {"a": ([1, 1, 9], [2, 2, 9], [3, 9, 9]), "b": ([5, 5, 5], [6, 6, 6], [7, 7, 7]),
           "local": ([4, 4, 4], [4, 4, 4], [4, 4, 4])}


def test_rounds_rotate_and_a_failure_drops_out():
    log, failed = [], []

    def time_one(name, r):
        log.append(name)
        if name == "c" and r == 1:
            raise RuntimeError("deliberate")
        return [10 * r + len(log)]
    result = interleave(["a", "b", "c"], 3, time_one, on_failure=lambda name, error: failed.append((name, error)))
    assert result.orders == [["a", "b", "c"], ["b", "c", "a"], ["a", "b"]]   # c is out after its failure
    assert log == ["a", "b", "c", "b", "c", "a", "a", "b"]
    assert failed == [("c", "round 2: RuntimeError: deliberate")] and result.errors == {"c": failed[0][1]}
    assert result.samples == {"a": [1, 16, 27], "b": [2, 14, 28], "c": [3]}
    assert result.median("a") == 16 and result.round_medians["b"] == [2, 14, 28]
    assert rotation([], 2) == [] and rotation(["x", "y", "z"], 4) == ["y", "z", "x"]
    assert [per_round(20, 3), per_round(3, 3), per_round(1, 3), per_round(5, 1)] == [7, 1, 1, 5]


def test_rounds_agree_on_errors():
    """``agree`` decides: an error only another rank saw (here, in the second turn) takes the name out here too."""
    turns = []

    def agree(error):
        turns.append(error)
        return error or ("rank 1: RuntimeError: boom" if len(turns) == 2 else None)
    result = interleave(["a", "b"], 2, lambda name, r: [1.0], agree=agree)
    assert result.errors == {"b": "rank 1: RuntimeError: boom"} and result.orders == [["a", "b"], ["a"]]
    assert result.samples == {"a": [1.0, 1.0], "b": []}


# ---- the fused bench --------------------------------------------------------------------------------

def _labelled(name, fn):
    fn.label = name
    return fn


def _fused_rows_with_recorders(low_memory: bool):
    """run_shape on all_gather_matmul's spec with its implementations replaced by labelled CPU thunks:
    a and b (correct), bad_check (wrong before timing), bad_round (raises in round 2 on rank 1); graph
    capture and timing replaced by recorders. Returns (rows, the timing order, plans' iters)."""
    import torch.distributed as dist

    from symmcoll.bench import fused
    rank = dist.get_rank()
    order, iters, rounds_seen = [], set(), {}

    def product(inputs, group):
        return inputs[0].float() @ inputs[1].float()

    def maker(name):
        def make(inputs, group):
            if name == "bad_check":
                return _labelled(name, lambda: torch.zeros(inputs[0].shape[0], inputs[1].shape[1]))

            def call():
                turn = rounds_seen.get(name, -1)
                if name == "bad_round" and turn == 1 and rank == 1:
                    raise RuntimeError("deliberate failure in round 2")
                return product(inputs, group)
            return _labelled(name, call)
        return make
    names = ("a", "bad_check", "b", "bad_round")
    spec = replace(fused.SPECS["all_gather_matmul"], local=lambda s, dt, dev: _labelled("local", lambda: None),
                   baselines={f"test:{n}": maker(n) for n in names},
                   baseline_references={f"test:{n}": product for n in names},
                   reference=product)

    def prepare(thunk, calls_per_graph, group):
        return fused.Prepared(thunk, calls_per_graph, "captured", None)

    def time_round(prepared, plan, group):
        name = prepared.thunk.label
        rounds_seen[name] = rounds_seen.get(name, -1) + 1
        order.append(name)
        iters.add(plan.iters)
        prepared.thunk()
        samples = SAMPLES.get(name, SAMPLES["b"])
        return fused.Timing(tuple(float(v) for v in samples[rounds_seen[name] % 3]), "graph", 20)
    saved = {k: getattr(fused, k) for k in ("prepare", "time_round", "_device", "_release", "_free_share")}
    saved_spec = fused.SPECS["all_gather_matmul"]
    try:
        fused.SPECS["all_gather_matmul"] = spec
        fused.prepare, fused.time_round = prepare, time_round
        fused._device, fused._release = (lambda: torch.device("cpu")), (lambda: None)
        fused._free_share = lambda group: 0.0 if low_memory else 1.0
        rows = fused.run_shape("all_gather_matmul", (8, 16, 32), "bf16", tuple(f"test:{n}" for n in names),
                               replays=6, calls_per_graph=20, rounds=3)
    finally:
        fused.SPECS["all_gather_matmul"] = saved_spec
        for k, v in saved.items():
            setattr(fused, k, v)
    return rows, order, sorted(iters)


def test_fused_bench_interleaves_rounds(pools):
    results = pools(2).run(_fused_rows_with_recorders, False)
    assert results[0][0] == results[1][0], "every rank returns the same rows"
    rows, order, iters = results[0]
    assert order == ["local", "a", "b", "bad_round",       # round 1: in order
                     "a", "b", "bad_round", "local",        # round 2: rotated; bad_round fails on rank 1
                     "b", "local", "a"]                     # round 3: rotated again, bad_round out
    assert iters == [2]                                     # 6 replays over 3 rounds
    by_name = {r["implementation"]: r for r in rows}
    assert [r["implementation"] for r in rows] == ["cublas (whole problem, one GPU)", "test:a", "test:bad_check",
                                                   "test:b", "test:bad_round"]
    assert by_name["test:a"]["median_us"] == 3.0            # the median of all 9 samples
    assert by_name["test:a"]["round_median_us"] == [1.0, 2.0, 9.0]
    assert by_name["test:a"]["samples"] == 9 and by_name["test:a"]["rounds"] == 3
    assert by_name["test:a"]["x_cublas"] == pytest.approx(3.0 / 4.0)
    assert "relative error" in by_name["test:bad_check"]["error"] and by_name["test:bad_check"]["median_us"] is None
    bad = by_name["test:bad_round"]
    assert bad["error"].startswith("rank 1: round 2: RuntimeError: deliberate failure") and bad["median_us"] is None
    good_keys = set(by_name["test:a"])
    assert all(set(r) <= good_keys for r in rows) and set(by_name["test:bad_check"]) | {"rounds"} <= good_keys


def test_fused_bench_times_in_batches_when_memory_runs_low(pools):
    """Free memory below MIN_FREE_SHARE after a capture: the captured ones are timed (with cuBLAS) and
    freed before the next is captured; cuBLAS's samples gather over every batch."""
    rows, order, _ = pools(1).run(_fused_rows_with_recorders, True)[0]
    assert order[:6] == ["local", "a", "a", "local", "local", "a"]
    assert order[6:12] == ["local", "b", "b", "local", "local", "b"]
    local = rows[0]
    assert local["samples"] == 3 * 3 * 3 and len(local["round_median_us"]) == 9   # three batches of three rounds


# ---- the decoder-block bench --------------------------------------------------------------------------

def _tp_block_rows_with_recorders():
    """run_case on a prefill case with the blocks replaced by labelled CPU steps (update 1.0 in mode nccl,
    1.001 in symmcoll, 0.999 in torch_async_tp) and CUDA-event timing, profiling and the first capture
    replaced by recorders; torch_async_tp fails in round 2 on rank 1. Returns (rows, timing order)."""
    import torch.distributed as dist

    from symmcoll.bench import kernel_share, tp_block
    rank, order, turns = dist.get_rank(), [], {}
    x = torch.ones(4, 8)
    update = {"nccl": 1.0, "symmcoll": 1.001, "torch_async_tp": 0.999}
    samples_us = {"nccl": ([1000, 1000, 9000], [2000, 2000, 9000], [3000, 9000, 9000]),
                  "symmcoll": ([500] * 3, [600] * 3, [700] * 3), "torch_async_tp": ([800] * 3,) * 3}

    def make(mode):
        return _labelled(mode, lambda: x + update[mode])

    def event_times_us(run, samples, group=None, per=1):
        mode = run.label
        turns[mode] = turns.get(mode, -1) + 1
        order.append(mode)
        if mode == "torch_async_tp" and turns[mode] == 1 and rank == 1:
            raise RuntimeError("deliberate failure in round 2")
        assert samples == 2 and per == 1   # 6 replays over 3 rounds
        return [float(v) for v in samples_us[mode][turns[mode]]]
    patches = {"_blocks": lambda config, dtype, modes: {m: m for m in modes},
               "_inputs": lambda config, case, dtype: (x, make),
               "_prepare": lambda step, timing: (step, 1, step(), None),
               "event_times_us": event_times_us, "_release": lambda: None}
    saved = {k: getattr(tp_block, k) for k in patches}
    saved_profile = kernel_share.profile
    try:
        for k, v in patches.items():
            setattr(tp_block, k, v)
        kernel_share.profile = lambda run, tag, steps=1: {"comm_share": 0.25, "fused_share": 0.5, "busy_us": 1.0}
        rows = tp_block.run_case(None, "prefill:1x8:eager", tp_block.MODES, "bf16", 6, rounds=3)
    finally:
        kernel_share.profile = saved_profile
        for k, v in saved.items():
            setattr(tp_block, k, v)
    return rows, order


def test_tp_block_bench_interleaves_rounds(pools):
    results = pools(2).run(_tp_block_rows_with_recorders)
    assert results[0][0] == results[1][0], "every rank returns the same rows"
    rows, order = results[0]
    assert order == ["nccl", "torch_async_tp", "symmcoll",     # round 1: MODES' order
                     "torch_async_tp", "symmcoll", "nccl",     # round 2: rotated; torch_async_tp fails on rank 1
                     "nccl", "symmcoll"]                       # round 3: rotated again, torch_async_tp out
    nccl, async_tp, ours = rows
    assert [r["mode"] for r in rows] == ["nccl", "torch_async_tp", "symmcoll"]
    assert nccl["ms_per_step"] == 3.0 and nccl["round_ms"] == [1.0, 2.0, 9.0]   # the median of all 9 samples
    assert nccl["samples"] == 9 and nccl["rounds"] == 3 and nccl["recompiles_in_rounds"] == 0
    assert ours["ms_per_step"] == 0.6 and ours["tokens_per_s"] == pytest.approx(8 / 0.6e-3)
    assert ours["rel_diff_vs_nccl"] == pytest.approx(1e-3, rel=1e-3) and ours["comm_share"] == 0.25
    assert async_tp["error"].startswith("rank 1: round 2: RuntimeError: deliberate") and async_tp["ms_per_step"] is None
    assert set(async_tp) == set(ours) == set(nccl)
