"""``symmcoll bench --op tp_block``: the tensor-parallel decoder block of ``symmcoll.models`` in every mode
(nccl, torch_async_tp, symmcoll), one JSON result per world size. GPUs only.

Cases (``--shapes`` keeps those whose name starts with one of its values, e.g. ``decode`` or
``prefill:1x2048``):

* ``decode:B`` (B = 1, 8, 64): one token per sequence after a cache of 2048 tokens; classic TP; a CUDA
  graph of ``STEPS_PER_GRAPH`` steps (the layers of a model, replayed as one graph), timed per step.
* ``prefill:BxS:eager`` / ``prefill:BxS:compile`` (1 x 2048, 4 x 4096): sequence-parallel, eager and
  ``torch.compile`` (default mode, static shapes).

Per case, on every rank, with the same weights (seeded, 70B-class: hidden 8192, 64 heads, 8 KV heads,
ffn 28672) and inputs:
1. every mode warms up (compile, plan, allocate), then captures its graph (decode);
2. the relative difference of the block's update (output - input) against mode nccl's, of the first
   eager step and again of what the timed runs computed (nccl's row: its timed output against its
   first); must stay under ``TOLERANCE``;
3. the modes timed in interleaved rounds (bench/rounds.py: each round every mode in turn, the order
   rotated, the replays split over the rounds; ``rounds`` of them, or as many as keep a round within
   ROUND_BUDGET_S at the modes' pace, measured once each); the median time per step of all samples
   (slowest rank), and tokens/s; the speedup over mode nccl as the ratio of the medians
   (``speedup_vs_nccl``) and as the median of the per-round ratios (``speedup_vs_nccl_paired``, of
   ``speedup_vs_nccl_per_round``: drift of the GPU's speed between rounds cancels; the table shows it);
   a compiled mode that compiled again during the rounds says so (``recompiles_in_rounds``);
4. the shares of GPU time in communication and in fused compute+communication kernels, from a
   torch.profiler trace of the same runs (``kernel_share``).
A mode that fails is a row with its error; the sweep goes on.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from ..models import LLAMA_70B, MODES, BlockConfig, BlockWeights, DecoderBlock, KVCache
from . import kernel_share, provenance
from .rounds import (ROUND_BUDGET_S, ROUNDS, agreed, first_error, interleave, paired_ratio, paired_ratios, per_round,
                     plan_rounds, slowest_rounds)
from .timing import capture_steps, event_times_us
from .timing import release_gpu_memory as _release  # (a module name: the CPU tests replace it)

DECODE_BATCHES = (1, 8, 64)
CACHE_TOKENS = 2048
PREFILLS = ((1, 2048), (4, 4096))
STEPS_PER_GRAPH = 8
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Relative difference (Frobenius) of the block's update against mode nccl's: bf16 rounds each of the
# ~8 intermediate results to 2^-9 relative, and the modes round at different points (fused epilogues,
# fp32 vs bf16 reductions); 2e-2 leaves a margin over the ~7e-3 measured against fp32 on CPU.
TOLERANCE = {"bf16": 2e-2, "fp16": 5e-3}
SEED = 0


def case_names() -> list[str]:
    names = [f"decode:{b}" for b in DECODE_BATCHES]
    return names + [f"prefill:{b}x{s}:{t}" for b, s in PREFILLS for t in ("eager", "compile")]


def parse_case(name: str) -> dict:
    parts = name.split(":")
    if parts[0] == "decode" and len(parts) == 2:
        return {"name": name, "phase": "decode", "batch": int(parts[1]), "seq": 1, "timing": "graph"}
    if parts[0] == "prefill" and len(parts) == 3 and parts[2] in ("eager", "compile"):
        batch, seq = (int(v) for v in parts[1].lower().split("x"))
        return {"name": name, "phase": "prefill", "batch": batch, "seq": seq, "timing": parts[2]}
    raise ValueError(f"tp_block case {name!r}: want decode:B or prefill:BxS:eager|compile")


# ---- rank side ---------------------------------------------------------------------------------------

_STATE: dict = {}   # per rank process: the weights and blocks of the current (config, world, dtype)


def _blocks(config: BlockConfig, dtype: torch.dtype, modes) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    key = (config, world, dtype)
    if _STATE.get("key") != key:
        _STATE.clear()
        device = torch.device("cuda", torch.cuda.current_device())
        weights = BlockWeights.random(config, rank, world, seed=SEED, dtype=dtype, device=device)
        _STATE.update(key=key, weights=weights, blocks={})
        torch.cuda.empty_cache()
    blocks = _STATE["blocks"]
    for mode in modes:
        if mode not in blocks:
            blocks[mode] = DecoderBlock(config, _STATE["weights"], mode,
                                        algorithms=symmcoll_algorithms() if mode == "symmcoll" else None)
    return blocks


def mode_order() -> tuple[str, ...]:
    """The order the modes of a case run in, in one process: MODES, or SYMMCOLL_TP_ORDER=
    "nccl,symmcoll,torch_async_tp" (nccl must stay first). Before settle_graphs() the order decided the
    figures: the first three graphs a process captures replay faster than all later ones, so whichever
    mode came third (and every later case) ran ~20 us a decode step slower (2026-11-27-graph-position-h100:
    symmcoll third 706 us, second 688 us; torch_async_tp second 715 us, third 738 us). Settled, any
    order gives the same figures; the variable reorders them to check that. The modes are prepared in
    this order and timed in rounds that rotate it (bench/rounds.py)."""
    spec = os.environ.get("SYMMCOLL_TP_ORDER", "").strip()
    if not spec:
        return MODES
    order = tuple(m.strip() for m in spec.split(",") if m.strip())
    if sorted(order) != sorted(MODES) or order[0] != "nccl":
        raise ValueError(f"SYMMCOLL_TP_ORDER must order {', '.join(MODES)} with nccl first, got {spec!r}")
    return order


def symmcoll_algorithms() -> dict[str, str] | None:
    """SYMMCOLL_TP_ALGORITHMS="op=algorithm,..." (e.g. "matmul_all_reduce=unfused"): the symmcoll mode's
    algorithm per op in place of "auto" (which op of the mode costs what)."""
    spec = os.environ.get("SYMMCOLL_TP_ALGORITHMS", "").strip()
    if not spec:
        return None
    pairs = [item.split("=", 1) for item in spec.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"SYMMCOLL_TP_ALGORITHMS must be op=algorithm,..., got {spec!r}")
    return {op.strip(): algorithm.strip() for op, algorithm in pairs}


def _inputs(config: BlockConfig, case: dict, dtype: torch.dtype):
    """(x this rank feeds the block, make: block -> a thunk running one step): the same values in
    every mode (seeded; prefill: this rank's rows of the tokens; decode: the cache filled at random)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=device).manual_seed(SEED + 100)
    batch, seq = case["batch"], case["seq"]
    if case["phase"] == "decode":
        x = torch.randn(batch, config.hidden, generator=g, device=device).to(dtype)
        cache = KVCache.empty(config, world, batch, CACHE_TOKENS + 64, dtype=dtype, device=device)
        cache.fill_random(rank, world, CACHE_TOKENS, seed=SEED + 200)
        positions = torch.full((batch,), CACHE_TOKENS, dtype=torch.int64, device=device)
        return x, lambda block: (lambda: block.decode(x, positions, cache))
    tokens = batch * seq
    if tokens % world:
        raise ValueError(f"{case['name']}: {tokens} tokens are not divisible by the world size {world}")
    rows = tokens // world
    x = torch.randn(tokens, config.hidden, generator=g, device=device)[rank * rows:(rank + 1) * rows].to(dtype)
    cache = KVCache.empty(config, world, batch, seq, dtype=dtype, device=device)

    def make(block):
        prefill = block.prefill
        if case["timing"] == "compile":
            # Each (case, mode) compiles afresh: one code object (prefill) across modes and shapes
            # would reach dynamo's recompile limit and run eager without saying so.
            torch._dynamo.reset()
            prefill = torch.compile(block.prefill, dynamic=False)
        return lambda: prefill(x, cache)
    return x, make


def _prepare(step, timing: str):
    """(run, steps per run, output of a first eager step, output the timed runs leave or None). Warms
    up first: compiles, plans, allocates symmetric buffers, none of which may happen during capture.
    (``run``, a graph's bound replay, keeps its graph alive.)"""
    first = step()
    torch.cuda.synchronize()
    if timing != "graph":
        return step, 1, first, None
    graph, captured = capture_steps(step, STEPS_PER_GRAPH)
    return graph.replay, STEPS_PER_GRAPH, first, captured


def _rel_diff(update: torch.Tensor, reference: torch.Tensor | None) -> float | None:
    if reference is None:
        return None
    return float((update.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-30))


def _compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process (a count that grows on every recompile)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


def _run_seconds(run, group) -> float:
    """One run of a prepared mode (a graph replay, or an eager step), the slowest rank's: plans the rounds."""
    return max(agreed(event_times_us(run, 1, group=group)[0], group)) * 1e-6


def run_case(config: BlockConfig, case_name: str, modes, dtype_name: str, replays: int,
             rounds: int | None = None) -> list[dict]:
    """Every mode on one case (collective; the same rows on every rank): each prepared (compiled,
    captured) and checked first, then all timed in interleaved rounds (bench/rounds.py: ``rounds``, or
    planned from the modes' pace when None), then profiled and checked again."""
    group, world = dist.group.WORLD, dist.get_world_size()
    case, dtype = parse_case(case_name), TORCH_DTYPES[dtype_name]
    modes = [m for m in mode_order() if m in modes]   # nccl first: the reference of the others
    blocks = _blocks(config, dtype, modes)
    x, make = _inputs(config, case, dtype)
    tokens = case["batch"] * case["seq"]
    if case["timing"] == "compile":
        # Once per case, not per mode: the modes' compiled prefills are called in turn, and a reset
        # would drop the compiled code of the others (they would compile again inside the rounds).
        torch._dynamo.reset()
    rows = {mode: {"case": case_name, "phase": case["phase"], "batch": case["batch"], "seq": case["seq"],
                   "cache_tokens": CACHE_TOKENS if case["phase"] == "decode" else 0, "timing": case["timing"],
                   "mode": mode, "world_size": world, "ms_per_step": None, "tokens_per_s": None,
                   "rel_diff_vs_nccl": None, "comm_share": None, "fused_share": None, "profiled": None,
                   "top_kernels": None, "busy_us": None, "kernels": None, "idle_us": None, "idle_before": None,
                   "error": None, "rounds": rounds, "replays_per_round": None, "samples": None, "round_ms": None,
                   "recompiles_in_rounds": None}
            for mode in modes}
    ready, reference = {}, None
    for mode in modes:
        error = None
        try:
            step = make(blocks[mode])
            run, per, first, captured = _prepare(step, case["timing"])
            diff = _rel_diff(first - x, reference)
            if mode == "nccl":
                reference = first - x
        except Exception as exc:  # noqa: BLE001 - reported in the row; the sweep goes on
            error = f"{type(exc).__name__}: {exc}"
        error = first_error(error, group)
        if error is None:
            ready[mode] = {"step": step, "run": run, "per": per, "captured": captured, "diff": diff}
        else:
            rows[mode]["error"] = error
        step = run = first = captured = None

    count = rounds or ROUNDS
    each = per_round(replays, count)
    if not rounds and ready:   # one warm-up run a turn, as time_one makes
        planned = plan_rounds([_run_seconds(ready[m]["run"], group) for m in ready], [1] * len(ready), replays)
        count, each = planned.rounds, planned.per_round
    for mode in modes:
        rows[mode].update(rounds=count, replays_per_round=each)

    def time_one(mode: str, _round: int):
        run, per = ready[mode]["run"], ready[mode]["per"]
        run()
        return event_times_us(run, each, group=group, per=per)
    compiled = _compiled_graphs()
    timed = interleave(list(ready), count, time_one, agree=lambda e: first_error(e, group))
    recompiles = _compiled_graphs() - compiled
    for mode, error in timed.errors.items():
        rows[mode]["error"] = error
    for mode, prepared in ready.items():
        if mode in timed.errors:
            continue
        error, shares, diff = None, None, prepared["diff"]
        try:
            run, per, captured, step = prepared["run"], prepared["per"], prepared["captured"], prepared["step"]
            tag = f"{case_name}-{mode}-rank{dist.get_rank()}".replace(":", "_")
            shares = kernel_share.profile(run, tag=tag, steps=per)  # (a graph replay is `per` steps)
            if shares["comm_share"] is None and captured is not None:
                # No kernels seen inside graph replays (CUPTI without graph-node tracing): the same
                # kernels, launched eagerly.
                shares = dict(kernel_share.profile(step, tag=tag), profiled="eager steps")
            # What the timed runs compute (a graph's replayed output; nccl's against its first).
            last = captured if captured is not None else step()
            after = _rel_diff(last - x, reference)
            diff = max(d for d in (diff, after) if d is not None) if after is not None else diff
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"
        error = first_error(error, group)
        if error is not None:
            rows[mode]["error"] = error
            continue
        ms = max(agreed(statistics.median(timed.samples[mode]) / 1e3, group))     # the slowest rank
        round_ms = [us / 1e3 for us in slowest_rounds(timed.round_medians[mode], group)]
        diffs = [d for d in agreed(diff, group) if d is not None]
        per_rank = agreed(shares, group)
        rows[mode].update(ms_per_step=ms, tokens_per_s=tokens / ms * 1e3,
                          rel_diff_vs_nccl=max(diffs) if diffs else None,
                          comm_share=_mean(s["comm_share"] for s in per_rank),
                          fused_share=_mean(s["fused_share"] for s in per_rank),
                          profiled=per_rank[0].get("profiled", "timed runs"),
                          top_kernels=per_rank[0].get("top_kernels"),  # rank 0's, us a step
                          busy_us=per_rank[0].get("busy_us"), kernels=per_rank[0].get("activities"),
                          idle_us=per_rank[0].get("idle_us"), idle_before=per_rank[0].get("idle_before"),
                          samples=len(timed.samples[mode]), round_ms=round_ms,
                          recompiles_in_rounds=max(agreed(recompiles, group)))
    # Nothing of this case (its graphs and the pools their replays write, its compiled code) outlives
    # its rows: the next case captures on an allocator as the first found it.
    ready.clear()
    prepared = timed = None
    _release()
    return [rows[mode] for mode in modes]


# ---- driver ------------------------------------------------------------------------------------------

def run(world_sizes, cases, modes, dtype: str, replays: int, out_dir, console,
        config: BlockConfig = LLAMA_70B, rounds: int | None = None) -> int:
    """Every case in every mode at each world size; one JSON per world size. Returns 1 if a symmcoll
    row failed or differs from nccl beyond the tolerance."""
    from ..launch import RankPool
    status = 0
    for world in world_sizes:
        rows = []
        with RankPool(world, device="cuda") as pool:
            info = pool.run(provenance.collect, "cuda")[0]
            for case in cases:
                t0 = time.monotonic()
                rows += pool.run(run_case, config, case, tuple(modes), dtype, replays, rounds, timeout=900)[0]
                console.print(f"ws{world} tp_block {case}: {time.monotonic() - t0:.0f} s", highlight=False)
        _add_speedups(rows)
        for r in rows:
            bad_diff = (r["rel_diff_vs_nccl"] or 0) > TOLERANCE[dtype]
            status |= int(r["mode"] == "symmcoll" and (r["error"] is not None or bad_diff))
        console.print(table(rows, f"tp_block (decoder block, {_dims(config)}), world size {world}, {dtype}: "
                                  f"ms per step (slowest rank)"))
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"tp_block-ws{world}-{info.created_utc.replace(':', '')}.json"
        path.write_text(json.dumps({
            "schema": "symmcoll.bench.tp_block/1", "provenance": asdict(info), "world_size": world,
            "config": asdict(config), "dtype": dtype, "replays": replays,
            "rounds": rounds or f"planned: at least {ROUNDS}, a round within {ROUND_BUDGET_S} s of GPU time "
                                f"(bench/rounds.py)",
            "steps_per_graph": STEPS_PER_GRAPH,
            "tolerance": {"rel_diff_vs_nccl": TOLERANCE[dtype],
                          "measure": "||update - update_nccl|| / ||update_nccl||, update = block output - input, "
                                     "max over ranks, of the first eager step and of what the timed runs "
                                     "computed (nccl: its timed output against its first)"},
            "comm_share": kernel_share.__doc__.strip(), "rows": rows}, indent=1))
        console.print(f"result written: {path}", highlight=False)
    return status


def table(rows: list[dict], title: str):
    """The printed table; its speedup column is the paired one (median of per-round ratios) where rows
    have it, and says so."""
    from rich.table import Table
    out = Table(title=title)
    paired = any(r.get("speedup_vs_nccl_paired") is not None for r in rows)
    speedup = "speedup_vs_nccl_paired" if paired else "speedup_vs_nccl"
    for column in ("case", "mode", "ms/step", "tokens/s", "x nccl (paired rounds)" if paired else "x nccl",
                   "comm %", "fused %", "rel diff", "note"):
        out.add_column(column)
    for r in rows:
        out.add_row(r["case"], r["mode"], _fmt(r["ms_per_step"], "{:.3f}"), _fmt(r["tokens_per_s"], "{:,.0f}"),
                    _fmt(r.get(speedup), "{:.3f}"), _fmt(r["comm_share"], "{:.0%}"),
                    _fmt(r["fused_share"], "{:.0%}"), _fmt(r["rel_diff_vs_nccl"], "{:.1e}"),
                    (r["error"] or (f"recompiled {r['recompiles_in_rounds']}x in the rounds"
                                    if r.get("recompiles_in_rounds") else ""))[:70])
    return out


def _add_speedups(rows: list[dict]) -> None:
    """Each row's speedup over mode nccl in its case: of the medians over all samples, and round by round
    (nccl's round median over the row's of the same round) with the median of those."""
    nccl = {r["case"]: r for r in rows if r["mode"] == "nccl"}
    for r in rows:
        base = nccl.get(r["case"], {})
        r["speedup_vs_nccl"] = base["ms_per_step"] / r["ms_per_step"] \
            if base.get("ms_per_step") and r["ms_per_step"] else None
        ratios = paired_ratios(base.get("round_ms") or [], r["round_ms"] or []) if r["ms_per_step"] else []
        r["speedup_vs_nccl_per_round"] = ratios or None
        r["speedup_vs_nccl_paired"] = paired_ratio(ratios)


def _dims(c: BlockConfig) -> str:
    return f"hidden {c.hidden}, {c.n_heads}/{c.n_kv_heads} heads x {c.head_dim}, ffn {c.ffn}"


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _fmt(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)
