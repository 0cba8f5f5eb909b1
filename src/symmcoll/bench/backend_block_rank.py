"""The rank side of ``symmcoll bench --op backend_block`` (bench/backend_block.py says what is measured and
how): build the block in fp32 and bf16, compile it per mode, check it against the fp32 run, time it."""

from __future__ import annotations

import gc
import logging
import statistics
import time
from collections import Counter

import torch
import torch.distributed as dist

from .. import launcher
from ..models.dtensor_llama import KVCache, TransformerBlock, parallelize
from . import kernel_share
from .backend_block import (CASE_BUDGET_S, MIN_SAMPLES, MODES, PROFILE_TOP, SEED, STEPS, TIMING, TOKEN_TOLERANCE,
                            TOLERANCE, Case, Setup, parse_case)
from .plan import TimingPlan
from .rounds import agreed
from .timing import agreed_iters, capture_steps, event_times_us, settle_graphs

# A logger for the backend's reports: with a report asked for, Inductor does not serve the graph from
# its cache, so every compile runs the rewrite and reports it.
REPORTS = logging.getLogger("symmcoll.bench.backend_block")

# A profiled row: runs of STEPS steps under the profiler (a session can lose the GPU records of its first
# kernels, pytorch/pytorch#192021: several runs dilute that), and runs its host time is the median of.
PROFILE_RUNS, HOST_SAMPLES = 3, 5
_STATE: dict = {}   # per rank process: the mesh and the parallelised blocks of the current (setup, world)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _block(setup: Setup, dtype: torch.dtype, sequence_parallel: bool) -> TransformerBlock:
    """The block parallelised over all ranks; every dtype holds the bf16 weights exactly."""
    from torch.distributed.device_mesh import init_device_mesh

    world, device = dist.get_world_size(), _device()
    args = setup.args
    for what, n in (("n_heads", args.n_heads), ("n_kv_heads", args.n_kv_heads), ("ffn_dim", args.ffn_dim)):
        if n % world:
            raise ValueError(f"{what} {n} is not divisible by the world size {world}")
    if _STATE.get("key") != (setup.args, world):
        _STATE.clear()
        _STATE.update(key=(setup.args, world), mesh=init_device_mesh(device.type, (world,)))
    key = (dtype, sequence_parallel)
    if key not in _STATE:
        torch.manual_seed(SEED)
        with torch.device(device):
            block = TransformerBlock(args)
        block = parallelize(block.to(torch.bfloat16).to(dtype), _STATE["mesh"], sequence_parallel)
        _STATE[key] = block.requires_grad_(False)
    return _STATE[key]


def _inputs(case: Case, setup: Setup, dtype: torch.dtype):
    """(x this rank feeds the block, input_pos or None); the same values in every dtype (seeded)."""
    rank, world, device = dist.get_rank(), dist.get_world_size(), _device()
    g = torch.Generator(device=device).manual_seed(SEED + 100)
    x = torch.randn(case.batch, case.seq, setup.args.dim, generator=g, device=device).to(torch.bfloat16)
    if case.sequence_parallel:
        if case.seq % world:
            raise ValueError(f"{case.name}: {case.seq} tokens per sequence are not divisible by {world} ranks")
        x = x.chunk(world, 1)[rank].contiguous()
    pos = torch.tensor([setup.cache_tokens], device=device) if case.phase == "decode" else None
    return x.to(dtype), pos


def _attach_cache(block: TransformerBlock, case: Case, setup: Setup, dtype: torch.dtype) -> None:
    """Decode: a cache of this rank's KV heads, CACHE_TOKENS positions filled (seeded by rank, the same
    values in every dtype), 64 more masked; None for prefill."""
    if case.phase != "decode":
        block.attention.cache = None
        return
    args, rank, world, device = setup.args, dist.get_rank(), dist.get_world_size(), _device()
    head_dim = args.dim // args.n_heads
    cache = KVCache(case.batch, setup.cache_tokens + 64, args.n_kv_heads // world, head_dim, dtype, device)
    g = torch.Generator(device=device).manual_seed(SEED + 200 + rank)
    for buffer in (cache.k, cache.v):
        buffer.copy_(torch.randn(buffer.shape, generator=g, device=device).to(torch.bfloat16))
        torch._dynamo.mark_static_address(buffer)   # written in place every step: a static CUDA-graph input
    block.attention.cache = cache


def _compile(block, mode: str, compile_mode: str, setup: Setup):
    """(compiled block, the symmcoll backend or None)."""
    import symmcoll

    torch._dynamo.reset()   # (also frees the last mode's cudagraph trees)
    options = {"fullgraph": True, "dynamic": False, **({} if compile_mode == "default" else {"mode": compile_mode})}
    if mode == "inductor":
        return torch.compile(block, backend=setup.inner, **options), None
    backend = symmcoll.backend(inner=setup.inner, report=REPORTS, copy_weights=setup.copy_weights)
    return torch.compile(block, backend=backend, **options), backend


def rewrite_summary(reports) -> dict:
    """What the backend did, from its GraphReports: collectives seen, rewritten, into which ops, and
    why the rest were left."""
    into = Counter(e.result.removeprefix("symmcoll.") for r in reports for e in r.rewritten)
    return {"graphs": [r.kind for r in reports], "collectives": sum(len(r.entries) for r in reports),
            "rewritten": sum(into.values()), "into": dict(into),
            "left": [f"{e.collective}: {e.detail}" for r in reports for e in r.left]}


def compare_updates(updates, reference: torch.Tensor | None) -> tuple[float | None, float | None]:
    """The largest relative error of ``updates`` against ``reference``: (whole, worst token)."""
    if reference is None:
        return None, None
    want = reference.float().flatten(0, -2)
    whole, token = 0.0, 0.0
    for update in updates:
        diff = update.float().flatten(0, -2) - want
        whole = max(whole, float(diff.norm() / want.norm().clamp_min(1e-30)))
        token = max(token, float((diff.norm(dim=1) / want.norm(dim=1).clamp_min(1e-30)).max()))
    return whole, token


def _prepare(compiled, x, pos, compile_mode: str, steps: int):
    """Compile and warm up; returns (run: one timed sample of ``steps`` calls, the updates of the first
    call and of a replayed one, compile seconds, the output the timed runs leave or None, the step)."""
    cuda = x.device.type == "cuda"

    def step():
        if compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()   # a new iteration: the last outputs are dead
        out = compiled(x, input_pos=pos)
        return out.to_local() if hasattr(out, "to_local") else out

    start = time.perf_counter()
    with torch._inductor.config.patch(fx_graph_cache=False):
        first = step() - x
    if cuda:
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    if not cuda or compile_mode == "reduce-overhead":
        if cuda:
            step(), step()                                  # cudagraph trees: record, then replay
        replayed = step() - x
        return (lambda: [step() for _ in range(steps)]), first, replayed, compile_s, None, step
    step()
    graph, captured = capture_steps(step, steps)
    graph.replay()
    torch.cuda.synchronize()
    _STATE["graph"] = graph   # kept alive until the mode's row is done
    return graph.replay, first, captured - x, compile_s, captured, step


def run_case(case_name: str, modes, compile_mode: str, replays: int, setup: Setup = Setup()) -> list[dict]:
    """Every mode on one case in one compile mode (collective; the same rows on every rank)."""
    from torch._dynamo.utils import counters

    group, world = dist.group.WORLD, dist.get_world_size()
    case = parse_case(case_name)
    if setup.timed:
        settle_graphs()
    tokens, steps = case.batch * case.seq, STEPS[case.phase]
    rows, baseline = [], None
    with torch.no_grad():
        x32, pos = _inputs(case, setup, torch.float32)
        reference = _block(setup, torch.float32, case.sequence_parallel)
        _attach_cache(reference, case, setup, torch.float32)
        want = reference(x32, input_pos=pos) - x32
        reference.attention.cache = None
        x, _ = _inputs(case, setup, torch.bfloat16)
        block = _block(setup, torch.bfloat16, case.sequence_parallel)
        for mode in [m for m in MODES if m in modes]:
            row = {"case": case.name, "phase": case.phase, "batch": case.batch, "seq": case.seq,
                   "parallel": "tp_sp" if case.sequence_parallel else "tp", "tokens": tokens, "mode": mode,
                   "compile_mode": compile_mode, "world_size": world, "ms_per_step": None, "tokens_per_s": None,
                   "rel_err_fp32": None, "token_err_fp32": None, "rel_diff_vs_inductor": None,
                   "token_diff_vs_inductor": None, "symmcoll_kernels": None, "compile_s": None, "samples": None,
                   "timing": None, "rewrites": None, "report": None, "cudagraph_skips": None, "profile": None,
                   "error": None}
            error, measured, backend = None, {}, None
            try:
                _attach_cache(block, case, setup, torch.bfloat16)
                skips, launched = counters["inductor"]["cudagraph_skips"], Counter(launcher.LAUNCH_COUNTS)
                compiled, backend = _compile(block, mode, compile_mode, setup)
                run, first, replayed, compile_s, captured, step = _prepare(compiled, x, pos, compile_mode, steps)
                measured = {"compile_s": compile_s, "skips": counters["inductor"]["cudagraph_skips"] - skips,
                            "kernels": dict(Counter(launcher.LAUNCH_COUNTS) - launched)}
                measured["err"], measured["token"] = compare_updates((first, replayed), want)
                measured["diff"], measured["diff_token"] = compare_updates((first, replayed), baseline)
                if mode == "inductor":
                    baseline = replayed.clone()
            except Exception as exc:  # noqa: BLE001 - reported in the row; the sweep goes on
                error = f"rank {dist.get_rank()}: {type(exc).__name__}: {exc}"[:300]
            error = verdict(agreed(error, group), agreed(measured, group), compile_mode)
            if error is None and setup.timed:
                try:
                    if setup.profile:
                        # Before the timing: torch.profiler leaves CUPTI attached to the process, so every
                        # mode of a profiled run is timed alike, after a profile (cublas_kernels.py).
                        measured["profile"] = profile_step(run, steps, f"{case.name}-{mode}-rank{dist.get_rank()}")
                    measured.update(_timed(run, steps, replays, group))
                    last = (captured if captured is not None else step()) - x
                    err, token = compare_updates((last,), want)
                    measured.update(err=max(measured["err"], err), token=max(measured["token"], token))
                except Exception as exc:  # noqa: BLE001
                    error = f"rank {dist.get_rank()}: {type(exc).__name__}: {exc}"[:300]
                error = next((e for e in agreed(error, group) if e), None)
            per_rank = agreed(measured, group)
            if backend is not None:
                row.update(rewrites=rewrite_summary(backend.reports), report="\n".join(map(str, backend.reports)))
            row.update(_agreed(per_rank, tokens), error=error)
            if error is None and any(m.get("profile") for m in per_rank):
                row["profile"] = [m.get("profile") for m in per_rank]
            if row["ms_per_step"] is not None:
                row["timing"] = TIMING[compile_mode]
            if error is not None and mode == "inductor":
                baseline = None
            rows.append(row)
            _STATE.pop("graph", None)
            run = step = compiled = captured = first = replayed = None
            torch._dynamo.reset()
            gc.collect()
            if x.device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        block.attention.cache = None
    return rows


def verdict(errors: list, per_rank: list[dict], compile_mode: str) -> str | None:
    """Why a mode is not timed, from every rank's error (or None) and measurements: the first rank's
    error, a mismatch (any rank, whole update or worst token, against fp32 or inductor), CUDA graphs
    skipped under reduce-overhead. None: time it."""
    error = next((e for e in errors if e), None)
    if error is not None:
        return error
    for key, against, tolerance in (("err", "fp32", TOLERANCE), ("token", "fp32", TOKEN_TOLERANCE),
                                    ("diff", "inductor", TOLERANCE), ("diff_token", "inductor", TOKEN_TOLERANCE)):
        values = [m[key] for m in per_rank if m[key] is not None]
        if values and max(values) > tolerance:
            return (f"mismatch {max(values):.1e} {'worst token ' if 'token' in key else ''}against {against}: "
                    f"relative error > {tolerance:.0e}, not timed")
    skips = max(m["skips"] for m in per_rank)
    if compile_mode == "reduce-overhead" and skips:
        return f"cudagraph trees left {skips} partition(s) outside CUDA graphs: not timed"
    return None


def _timed(run, steps: int, replays: int, group) -> dict:
    """Median ms per step of ``replays`` samples (fewer past CASE_BUDGET_S), back to back."""
    run()
    probe_s = event_times_us(run, 1, group=group)[0] * 1e-6
    plan = TimingPlan("graph", 0, replays, min(MIN_SAMPLES, replays), steps, CASE_BUDGET_S)
    samples = agreed_iters(probe_s, plan, group)
    times = event_times_us(run, samples, group=group, per=steps, isolated=False)
    return {"ms": statistics.median(times) / 1e3, "samples": samples}


def profile_step(run, steps: int, tag: str) -> dict:
    """Where a step's time goes on this rank: kernel_share.profile of PROFILE_RUNS runs of ``run``
    (``steps`` steps each): GPU activities by name, us and calls a step (the PROFILE_TOP longest), busy
    and idle us a step (SYMMCOLL_TRACE_DIR keeps the trace as ``tag``.json); and host_ms, the host's
    time to issue a step (median of HOST_SAMPLES runs, each started on an idle GPU, timed until it
    returns, no sync): near ms/step, the step waits for the host."""
    shares = kernel_share.profile(run, calls=PROFILE_RUNS, tag=tag, steps=steps, top=PROFILE_TOP)
    host = []
    for _ in range(HOST_SAMPLES):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        host.append((time.perf_counter() - start) * 1e3 / steps)
    torch.cuda.synchronize()
    keep = ("busy_us", "idle_us", "activities", "comm_us", "fused_us", "compute_us")
    return {**{k: shares[k] for k in keep}, "host_ms": statistics.median(host),
            **{k: shares[k] for k in ("top_kernels", "top_calls", "idle_before")}}


def _agreed(per_rank: list[dict], tokens: int) -> dict:
    """The row's figures from every rank's: the slowest time and compile, the largest errors."""
    def worst(key):
        values = [m[key] for m in per_rank if m.get(key) is not None]
        return max(values) if values else None
    ms = worst("ms")
    return {"ms_per_step": ms, "tokens_per_s": tokens / ms * 1e3 if ms else None, "rel_err_fp32": worst("err"),
            "token_err_fp32": worst("token"), "rel_diff_vs_inductor": worst("diff"),
            "token_diff_vs_inductor": worst("diff_token"), "compile_s": worst("compile_s"), "samples": worst("samples"),
            "cudagraph_skips": worst("skips"), "symmcoll_kernels": per_rank[0].get("kernels")}
