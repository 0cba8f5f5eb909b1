"""Interleaved timing rounds (bench/rounds.py) and the two benches that time that way: the fused bench
(bench/fused.py run_shape) and the decoder-block bench (bench/tp_block.py run_case). On CPU ranks the
GPU parts (graph capture, CUDA-event timing) are replaced by recorders: the tests see in which order
the implementations were timed, which samples each row's median is over, and that a failing
implementation is still an error row while the others go on."""

from dataclasses import replace

import pytest
import torch

from symmcoll.bench.rounds import interleave, per_round, rotation
from symmcoll.bench.timing import Timing

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

    from symmcoll.bench import fused, fused_timing
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
        return fused_timing.Prepared(thunk, calls_per_graph, "captured", None)

    def time_round(prepared, plan, group):
        name = prepared.thunk.label
        rounds_seen[name] = rounds_seen.get(name, -1) + 1
        order.append(name)
        iters.add(plan.iters)
        prepared.thunk()
        samples = SAMPLES.get(name, SAMPLES["b"])
        return Timing(tuple(float(v) for v in samples[rounds_seen[name] % 3]), "graph", 20)
    rows = _run_shape_patched(spec, prepare, time_round, low_memory, tuple(f"test:{n}" for n in names),
                              replays=6, rounds=3)
    return rows, order, sorted(iters)


def _run_shape_patched(spec, prepare, time_round, low_memory: bool, algorithms, **kwargs):
    """fused.run_shape on all_gather_matmul with ``spec``, and ``prepare`` and ``time_round`` in place of
    fused_timing's, on CPU (free memory: none if ``low_memory``, every implementation its own batch)."""
    from symmcoll.bench import fused, fused_timing
    saved = {k: getattr(fused_timing, k) for k in ("prepare", "time_round", "rank_device", "release", "free_share")}
    saved_spec = fused.SPECS["all_gather_matmul"]
    try:
        fused.SPECS["all_gather_matmul"] = spec
        fused_timing.prepare, fused_timing.time_round = prepare, time_round
        fused_timing.rank_device, fused_timing.release = (lambda: torch.device("cpu")), (lambda: None)
        fused_timing.free_share = lambda group: 0.0 if low_memory else 1.0
        return fused.run_shape("all_gather_matmul", (8, 16, 32), "bf16", algorithms, calls_per_graph=20, **kwargs)
    finally:
        fused.SPECS["all_gather_matmul"] = saved_spec
        for k, v in saved.items():
            setattr(fused_timing, k, v)


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

def _tp_block_rows_with_recorders(run_s: float | None = None):
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
        return [float(v) for v in samples_us[mode][turns[mode] % 3]]
    patches = {"_blocks": lambda config, dtype, modes: {m: m for m in modes},
               "_inputs": lambda config, case, dtype: (x, make),
               "_prepare": lambda step, timing: (step, 1, step(), None),
               "event_times_us": event_times_us, "_release": lambda: None,
               "_run_seconds": lambda run, group: run_s}
    saved = {k: getattr(tp_block, k) for k in patches}
    saved_profile = kernel_share.profile
    try:
        for k, v in patches.items():
            setattr(tp_block, k, v)
        kernel_share.profile = lambda run, tag, steps=1: {"comm_share": 0.25, "fused_share": 0.5, "busy_us": 1.0}
        rows = tp_block.run_case(None, "prefill:1x8:eager", tp_block.MODES, "bf16", 6 if run_s is None else 20,
                                 rounds=3 if run_s is None else None)
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


# ---- paired rounds: ratios that drift of the GPU's speed leaves alone ---------------------------------

# Per round, a factor the GPU's speed moves every implementation by (as measured on one H100: 5-28% at
# millisecond shapes); the implementation is TRUE_RATIO x the baseline in every round, with more spread
# between its samples than the baseline (the same median a round). The ratio of medians over all
# samples lands on samples of different rounds: off by 8%.
DRIFT = (1.0, 1.2, 1.2, 1.3, 0.9, 1.1)
TRUE_RATIO = 1.02


def _drifting(name: str, round_index: int, count: int = 3) -> list[float]:
    factor = DRIFT[round_index % len(DRIFT)]
    if name == "base":
        return [100.0 * factor] * count
    spread = [0.9 + 0.2 * i / (count - 1) for i in range(count)] if count > 1 else [1.0]   # median 1.0
    return [100.0 * TRUE_RATIO * factor * s for s in spread]


def test_paired_ratio_cancels_drift_that_pooled_medians_keep():
    from symmcoll.bench.rounds import paired_ratio, paired_ratios
    result = interleave(["base", "ours"], 3, _drifting)
    pooled = result.median("ours") / result.median("base")
    ratios = paired_ratios(result.round_medians["ours"], result.round_medians["base"])
    assert ratios == pytest.approx([TRUE_RATIO] * 3)
    assert paired_ratio(ratios) == pytest.approx(TRUE_RATIO)
    assert abs(pooled - TRUE_RATIO) > 0.05              # 112.2 / 120: 0.935
    assert paired_ratios([1.0, None, 3.0], [2.0, 2.0, 0.0]) == [0.5] and paired_ratio([]) is None


def test_plan_rounds_makes_rounds_short_where_calls_are_long():
    from symmcoll.bench.rounds import DRIFT_ROUNDS, MAX_ROUNDS, ROUND_BUDGET_S, RoundPlan, plan_rounds
    assert plan_rounds([1e-4] * 9, [3] * 9, 20) == RoundPlan(3, 7)      # us-scale: three rounds, as before
    # nine implementations of 10 ms replays: no round of 3+ replays fits; the floor, DRIFT_ROUNDS rounds of 2
    assert plan_rounds([1e-2] * 9, [1] * 9, 20) == RoundPlan(DRIFT_ROUNDS, 2)
    # three of 8 ms: 5 replays + 1 warm-up = 0.144 s fits, 6 + 1 does not -- and the budget bound, so 25 rounds
    plan = plan_rounds([8e-3] * 3, [1] * 3, 20)
    assert plan == RoundPlan(DRIFT_ROUNDS, 5) and 3 * 8e-3 * (plan.per_round + 1) <= ROUND_BUDGET_S
    for replay_s in (1e-4, 1e-3):                                       # the budget does not bind: the replays asked
        plan = plan_rounds([replay_s] * 6, [1] * 6, 20)
        assert 20 <= plan.rounds * plan.per_round <= 24, (replay_s, plan)
    for replay_s in (4e-3, 8e-3, 2e-2):                                 # it binds: >= 25 rounds, short ones
        plan = plan_rounds([replay_s] * 6, [1] * 6, 20)
        assert DRIFT_ROUNDS <= plan.rounds <= MAX_ROUNDS and plan.rounds * plan.per_round >= 20, (replay_s, plan)
        assert plan.per_round == 2 or 6 * replay_s * (plan.per_round + 1) <= ROUND_BUDGET_S, (replay_s, plan)
    assert plan_rounds([1e-2] * 9, [1] * 9, 50) == RoundPlan(DRIFT_ROUNDS, 2)   # 50 replays: 25 rounds of 2
    assert plan_rounds([1e-2] * 9, [1] * 9, 100) == RoundPlan(DRIFT_ROUNDS, 4)  # 100: 4 a round (100 / MAX_ROUNDS)
    # at least min_rounds (the GEMM grid's 5): us-scale 30 replays in 5 rounds of 6, not 3 of 10
    assert plan_rounds([1e-4] * 2, [2] * 2, 30, min_rounds=5) == RoundPlan(5, 6)
    assert plan_rounds([1e-2] * 2, [1] * 2, 30, min_rounds=5) == RoundPlan(5, 6)   # 2 x 7 x 10 ms fits 0.15 s


def _fused_planned_rows(low_memory: bool):
    """run_shape with rounds planned (rounds=None) on labelled CPU thunks: cuBLAS ("base") and two
    implementations 1.02x of it (one with spread between samples), every replay 8 ms (two calls of
    4 ms), the GPU's speed drifting by DRIFT round by round. Returns (rows, the plans seen, the table)."""
    import io

    import torch.distributed as dist
    from rich.console import Console

    from symmcoll.bench import fused, fused_timing
    turns, plans = [], set()
    per_round_impls = 2 if low_memory else 3   # (a round times each of them once: the turn tells the round)

    def product(inputs, group):
        return inputs[0].float() @ inputs[1].float()

    def maker(name):
        return lambda inputs, group: _labelled(name, lambda: product(inputs, group))
    names = ("ours", "flat")
    spec = replace(fused.SPECS["all_gather_matmul"], local=lambda s, dt, dev: _labelled("base", lambda: None),
                   baselines={f"test:{n}": maker(n) for n in names},
                   baseline_references={f"test:{n}": product for n in names}, reference=product)

    def prepare(thunk, calls_per_graph, group):
        return fused_timing.Prepared(thunk, 2, "captured", None, call_us=4000.0)

    def time_round(prepared, plan, group):
        name = prepared.thunk.label
        turns.append(name)
        plans.add((plan.warmup, plan.iters, plan.min_iters))
        samples = _drifting("ours" if name == "ours" else "base", (len(turns) - 1) // per_round_impls, plan.iters)
        if name == "flat":
            samples = [v * TRUE_RATIO for v in samples]
        return Timing(tuple(samples), "graph", 2)
    rows = _run_shape_patched(spec, prepare, time_round, low_memory, tuple(f"test:{n}" for n in names), replays=20)
    out = io.StringIO()
    Console(file=out, width=200).print(fused._table("all_gather_matmul", dist.get_world_size(), "bf16", rows, spec))
    return rows, sorted(plans), out.getvalue()


def test_fused_bench_plans_rounds_and_reports_the_paired_ratio(pools):
    """Three implementations of 8 ms replays: 5 replays a round (0.144 s a round), DRIFT_ROUNDS rounds as
    the budget binds, one warm-up replay each, no probe; x_cublas_paired is the true 1.02 round by round, x_cublas (median over median) is not
    for the implementation with spread; the table's ratio column is the paired one and says so."""
    rows, plans, printed = pools(1).run(_fused_planned_rows, False)[0]
    assert plans == [(1, 5, 5)]
    base, ours, flat = rows
    from symmcoll.bench.rounds import DRIFT_ROUNDS
    assert ours["rounds"] == DRIFT_ROUNDS and ours["replays_per_round"] == 5 and ours["samples"] == 5 * DRIFT_ROUNDS
    assert ours["x_cublas_per_round"] == pytest.approx([TRUE_RATIO] * DRIFT_ROUNDS)
    assert ours["x_cublas_paired"] == pytest.approx(TRUE_RATIO) and flat["x_cublas_paired"] == pytest.approx(TRUE_RATIO)
    # (the pooled ratio's bias under drift is test_paired_ratio_cancels_drift_that_pooled_medians_keep's: over
    # 25 rounds of DRIFT's cycle the pooled median happens to land on it)
    assert ours["x_cublas"] == pytest.approx(TRUE_RATIO, abs=0.02) and base["x_cublas_paired"] == pytest.approx(1.0)
    assert "x cuBLAS (paired rounds)" in printed and f"{TRUE_RATIO:.3f}" in printed


def test_fused_bench_pairs_each_batch_with_its_own_cublas_rounds(pools):
    """Timed in batches (memory low): cuBLAS is timed with each batch, so its rounds are those of both
    batches (the GPU's speed different in each); each implementation's round ratios pair with cuBLAS's
    rounds of its own batch."""
    rows, plans, _ = pools(1).run(_fused_planned_rows, True)[0]
    base, ours, flat = rows
    assert plans == [(1, 7, 7)]                          # two of 8 ms a round: 3 rounds of 7 fit (0.128 s)
    assert base["round_median_us"] == pytest.approx([100.0 * f for f in DRIFT])
    assert ours["x_cublas_per_round"] == pytest.approx([TRUE_RATIO] * 3)
    assert flat["x_cublas_per_round"] == pytest.approx([TRUE_RATIO] * 3)
    assert flat["round_median_us"] == pytest.approx([100.0 * TRUE_RATIO * f for f in DRIFT[3:]])


def test_tp_block_speedup_is_paired_round_by_round():
    """speedup_vs_nccl_paired: nccl's round median over the row's of the same round, the median of those;
    with the drift shared, it is the true 1.05 where the medians over all samples say otherwise; the table
    shows it under a header that says so."""
    import io

    from rich.console import Console

    from symmcoll.bench import tp_block
    nccl_rounds = [1.0 * f for f in DRIFT[:3]]
    ours_rounds = [v / 1.05 for v in nccl_rounds]
    rows = [dict(case="decode:1", mode="nccl", ms_per_step=1.2, round_ms=nccl_rounds),
            dict(case="decode:1", mode="symmcoll", ms_per_step=1.0 / 1.05, round_ms=ours_rounds),
            dict(case="decode:1", mode="torch_async_tp", ms_per_step=None, round_ms=None)]
    for r in rows:
        r.update(tokens_per_s=None, comm_share=None, fused_share=None, rel_diff_vs_nccl=None, error=None)
    tp_block._add_speedups(rows)
    nccl, ours, failed = rows
    assert ours["speedup_vs_nccl_per_round"] == pytest.approx([1.05] * 3)
    assert ours["speedup_vs_nccl_paired"] == pytest.approx(1.05) and ours["speedup_vs_nccl"] == pytest.approx(1.26)
    assert nccl["speedup_vs_nccl_paired"] == 1.0 and failed["speedup_vs_nccl_paired"] is None
    out = io.StringIO()
    Console(file=out, width=200).print(tp_block.table(rows, "t"))
    assert "x nccl (paired rounds)" in out.getvalue() and "1.050" in out.getvalue() and "1.260" not in out.getvalue()


def test_tp_block_bench_plans_rounds_from_the_modes_pace(pools):
    """rounds=None: each mode's run measured once (here 20 ms); three modes of 20 ms cannot fit a round of
    2 replays + 1 warm-up in ROUND_BUDGET_S, so DRIFT_ROUNDS rounds of 2 (20 replays asked); rows say so."""
    from symmcoll.bench.rounds import DRIFT_ROUNDS
    rows, order = pools(1).run(_tp_block_rows_with_recorders, 0.02)[0]
    nccl, _, ours = rows
    assert len(order) == 3 * DRIFT_ROUNDS
    assert nccl["rounds"] == ours["rounds"] == DRIFT_ROUNDS and ours["replays_per_round"] == 2
    assert ours["samples"] == DRIFT_ROUNDS * 3   # (the recorder gives three samples a turn, whatever it is asked)
    assert len(ours["round_ms"]) == DRIFT_ROUNDS


def test_fused_bench_repeats_a_variant_under_a_label_of_its_own():
    """``--algorithms unfused unfused@2``: unfused once more as its own row (inputs, graph and memory of its own)
    -- how far two captures of one code differ in one run; an unknown algorithm or an empty label is refused
    naming the entry and the op's algorithms."""
    from symmcoll.bench import fused
    assert fused.repeats("matmul_reduce_scatter", ("unfused", "unfused@2", "auto@b")) == ["unfused@2", "auto@b"]
    assert fused.repeats("matmul_reduce_scatter", None) == [] and fused.repeats("all_gather_matmul", ("fused",)) == []
    for bad in ("nonesuch@2", "unfused@"):
        with pytest.raises(ValueError, match=f"--algorithms '{bad}'.*unfused"):
            fused.repeats("matmul_reduce_scatter", (bad,))
