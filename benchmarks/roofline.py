"""The memory-bound kernels at world size 1 on one GPU, every candidate beside torch and the copy rate
(issue 23): all_reduce_rms_norm, moe_dispatch / moe_combine and the quantized all-reduce's codecs.

    PYTHONPATH=src python3 benchmarks/roofline.py --out $OUT/roofline.json [--parts rms moe codecs]
        [--old-src old_main/src] [--deadline 440]   (parts: also ``dispatch``, ``combine``, below; run in the
        order given)

Every candidate is checked against the fp32 reference (bit-exact where the op is: MoE rows, codecs)
before it is timed; a wrong one is reported and not timed. Times: median us per call over CUDA-graph
replays of 10 calls. GB/s: the bytes each kernel must move (symmcoll.bench.roofline) over the time; %
copy: against the best SM copy rate of the same run (a Triton copy kernel, torch copy_).

* rms: tokens {1, 6, 32, 138, 512, 2048, 8192} x hidden {4096, 6144, 8192, 16384}, bf16, bf16 or fp8
  (per token) output: torch add + RMSNorm eager and torch.compile'd, symmcoll one_shot and two_shot
  with their default config, and at every case every (values per step, warps, programs, loads ahead)
  candidate: whole rows and rows in chunks (``_rms_candidates``).
* moe: tokens {128, 1024, 4096} x hidden {4096, 7168} x experts {8, 64, 256} x top-k {2, 8}: dispatch and
  combine with the default config, torch (index_select; gather + weighted sum), at 128, 1024 and 4096
  tokens with 64 experts the (block, programs, warps, tokens per item) candidates, and the dispatch's
  two launches alone (moe_route: routing; moe_move: the row copies).
* dispatch (not in the default parts): moe_dispatch alone, the default and the variant 0 / 4 / 5 / 6
  candidates at every case (every expert count: their routing pass depends on it), then per case the best
  time of each dispatch variant (fused/moe_rules.py: 0 two launches, 1 one launch ranking every slot, 2 one
  launch routed by ranges, 3 the same with the next item's loads ahead, 4 the same with each range's slots routed
  before its copies, 5 two launches, the pull's next item ahead, 6 two launches, prefixes folded, the pull
  two items ahead); the launches of the default and of the first variant 5 and 6 candidates also alone.
* combine (not in the default parts): moe_dispatch and moe_combine with their default configs beside torch at
  >= 1024 tokens (no sweep: where the issue's bandwidth target holds, on a GPU whose table has none).
* codecs: int8 / fp8 / int4 quantize and dequantize kernels at 1-256 MB of bf16, group size 64 with
  every (block, warps) candidate, 32 and 128 with the default.
* old (``--old-src``: a tree of the code before that has bench/timing.graph_us, e.g. ``git archive
  --prefix=old_main/ 0851bfe src | tar x``):
  rms at 32, 138, 512 and 8192 tokens and MoE at hidden 7168, 64 experts, 128 and 4096 tokens, through the
  public API of that tree, in a second process, same GPU.

Sections run in the order of ``--parts`` and stop starting new work past ``--deadline`` seconds (the JSON
says what was skipped). The JSON (provenance, copy rates, every row) is rewritten after every section; the
compact table comes last. On a GPU the launch table of the run is written beside the JSON
(``roofline_<gpu>.json``): the shipped table with the cases this run measured replaced (``merge_tables``),
ready to be copied into src/symmcoll/data/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace

import torch

class Sizes:
    """What a run covers (``--smoke``: a few tiny cases on CPU ranks, interpreted: a check of this script)."""

    def __init__(self, smoke: bool):
        self.tokens = (5,) if smoke else (1, 6, 32, 138, 512, 2048, 8192)
        self.hidden = (40,) if smoke else (4096, 6144, 8192, 16384)
        self.sweep_tokens = (5,) if smoke else self.tokens  # every case: the table has an entry for each
        self.moe_cases = [(20, 16, 8, 3)] if smoke else \
            [(t, h, e, k) for t in (128, 1024, 4096) for h in (4096, 7168) for e in (8, 64, 256) for k in (2, 8)]
        # configs swept at these tokens, 64 experts (the experts do not change the data path)
        self.moe_sweep = () if smoke else ((128, 64), (1024, 64), (4096, 64))
        # the smoke: the first candidate of each dispatch variant (two launches, every slot, ranges)
        self.moe_configs = MOE_CONFIGS if not smoke else \
            [next(c for c in MOE_CONFIGS if (c[4] > 0, c[5]) == kind) for kind in ((False, 0), (True, 0), (False, 2),
                                                                                   (False, 3), (False, 4), (False, 5),
                                                                                   (False, 6))]
        # the old tree: rms at these tokens, MoE at these cases (the rest is in earlier result files)
        self.old_tokens = (5,) if smoke else (32, 138, 512, 8192)
        self.old_moe = self.moe_cases[:1] if smoke else [(t, 7168, 64, k) for t in (128, 4096) for k in (2, 8)]
        self.codec_numels = (4096,) if smoke else tuple((mb << 20) // 2 for mb in (1, 4, 16, 64, 256))
        self.group_sizes = (64,) if smoke else (64, 32, 128)
        self.codec_formats = ("int4",) if smoke else ("int8", "fp8", "int4")
        self.quants = QUANTS
        self.smoke = smoke

    def narrow(self, rms_tokens=None, quants=None, moe_tokens=None):
        """Only these rms token counts and output formats ("bf16", "fp8_per_token") and MoE token counts
        (a GPU call that measures what decides, the neighbours of a changed cell included)."""
        if rms_tokens:
            self.tokens = self.sweep_tokens = self.old_tokens = tuple(rms_tokens)
        if quants:
            self.quants = tuple(None if q == "bf16" else q for q in quants)
        if moe_tokens:
            self.moe_cases = self.old_moe = [c for c in self.moe_cases if c[0] in moe_tokens]


QUANTS = (None, "fp8_per_token")
# (block, max_programs, warps, tokens per item, LOCAL_ROUTE_SLOTS, DISPATCH_VARIANT): the first is
# fused/moe_rules.py's untuned GPU_CONFIG, timed under its own label too (a check of the spread); dispatch
# variants (fused/moe_rules.py): 0 the routing launch first, or with local > 0 variant 1 (one launch, every
# program ranks every slot) up to that many slots (T * k); 2 one launch routed by ranges of tokens
# (fused/moe_dispatch_ranges.py), 3 the same with the next item's loads ahead, 4 the same with each
# range's slots routed before its copies, 5 the routing launch, then the pull with its next item loaded
# ahead, 6 the routing launch with folded prefixes, then a pull two items ahead (combine ignores the
# variant: those rows are timed for dispatch only)
MOE_CONFIGS = ((8192, 528, 4, 1, 0, 0), (8192, 1024, 4, 1, 0, 0), (4096, 1024, 4, 1, 0, 0), (4096, 528, 4, 1, 0, 0),
               (16384, 528, 8, 1, 0, 0), (8192, 528, 4, 2, 0, 0), (16384, 528, 8, 4, 0, 0),
               (8192, 528, 4, 1, 4096, 0), (8192, 1024, 4, 1, 4096, 0), (8192, 1024, 4, 1, 8192, 0),
               (8192, 528, 4, 1, 0, 2), (8192, 264, 4, 1, 0, 2), (8192, 1024, 4, 1, 0, 2), (16384, 264, 8, 1, 0, 2),
               (16384, 132, 8, 1, 0, 2), (32768, 132, 16, 1, 0, 2), (16384, 132, 8, 2, 0, 2),
               (8192, 528, 4, 1, 0, 3), (8192, 264, 4, 1, 0, 3), (16384, 264, 8, 1, 0, 3), (16384, 132, 8, 1, 0, 3),
               (32768, 132, 16, 1, 0, 3),
               (16384, 132, 8, 1, 0, 4), (16384, 264, 8, 1, 0, 4), (8192, 264, 4, 1, 0, 4), (8192, 528, 4, 1, 0, 4),
               (32768, 132, 16, 1, 0, 4), (16384, 132, 8, 2, 0, 4),
               (8192, 528, 4, 1, 0, 5), (8192, 1024, 4, 1, 0, 5), (4096, 1024, 4, 1, 0, 5), (16384, 528, 8, 1, 0, 5),
               (16384, 264, 8, 1, 0, 5), (8192, 528, 4, 2, 0, 5),
               (8192, 528, 4, 1, 0, 6), (4096, 528, 4, 1, 0, 6), (8192, 1024, 4, 1, 0, 6), (16384, 264, 8, 1, 0, 6),
               (4096, 660, 4, 1, 0, 6), (4096, 1024, 4, 1, 0, 6))
# (block, warps, programs) of the codec kernels; the first is bench.roofline's untuned rule (CODEC_*)
CODEC_CONFIGS = ((2048, 8, 1024), (4096, 8, 1024), (8192, 8, 528), (8192, 16, 1024), (4096, 4, 2048), (4096, 4, 1024),
                 (2048, 4, 2048))
EPS = 1e-6
# Calls in one graph at least: graph_us sizes the graph from one eager call's time, which for a small
# kernel is the host's (30-100 us), so a graph held 2-7 calls and each replay's start-up cost (~2-10
# us) was shared by that few: the first run's <= 32-token and 128-token figures varied 2-4x between
# identical launches. With 20 calls the start-up is < 0.5 us of a call (ANCHORS.md's convention).
CALLS_PER_GRAPH = 20
START = time.monotonic()
# Seconds of the deadline kept for the old tree's cases (a second process: imports, compiles).
OLD_RESERVE_S = 75
SIZES = Sizes(False)


def time_us(fn, replays: int = 7) -> tuple[float, str]:
    """Median us per call over CUDA-graph replays (symmcoll.bench.timing.graph_us: CALLS_PER_GRAPH calls,
    repeated until a replay lasts ~200 us, in one graph); on CPU the wall-clock time of two calls (a check
    of the harness, not a measurement)."""
    if SIZES.smoke:
        fn()
        t0 = time.perf_counter()
        fn()
        fn()
        return (time.perf_counter() - t0) / 2 * 1e6, "cpu"
    from symmcoll.bench.timing import graph_us
    return statistics.median(graph_us([fn] * CALLS_PER_GRAPH, replays)), "graph"


def _exact(got, want) -> float:
    """0.0 if the 16-bit patterns agree, else raises naming how many differ."""
    wrong = int((got.view(torch.int16) != want.view(torch.int16)).sum())
    if wrong:
        raise AssertionError(f"{wrong} wrong elements")
    return 0.0


def rel_err(got, want) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


class Results:
    def __init__(self, out: str, deadline: float):
        self.out, self.deadline, self.rows, self.skipped, self.meta = out, deadline, [], [], {}

    def late(self, what: str) -> bool:
        if time.monotonic() - START > self.deadline:
            self.skipped.append(what)
            return True
        return False

    def add(self, section, name, case, fn, check, nbytes=None, **extra):
        """Check ``fn`` (``check(result)`` -> error measure, raises if wrong), then time it."""
        row = dict(section=section, name=name, case=list(case), bytes=nbytes, **extra)
        try:
            row["err"] = check(fn())
            row["us"], row["mode"] = time_us(fn)
            row["err"] = max(row["err"], check(fn()))  # again after timing
            copy = self.meta.get("copy", {}).get("best")
            row["gbps"] = nbytes / row["us"] / 1e3 if nbytes else None
            row["pct_copy"] = 100 * row["gbps"] / copy if row["gbps"] and copy else None
        except Exception as exc:  # noqa: BLE001 - reported; the sweep goes on
            row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            import symmcoll
            symmcoll.reset()
        self.rows.append(row)
        return row

    def save(self):
        with open(self.out, "w") as f:
            json.dump(dict(meta=self.meta, skipped=self.skipped, elapsed_s=time.monotonic() - START, rows=self.rows),
                      f, indent=1)


# ---- sections -------------------------------------------------------------------------------------------

def _rms_cases(res: Results, tokens_list):
    """(quant, hidden, tokens) of every rms case, until the deadline."""
    for quant in SIZES.quants:
        for hidden in SIZES.hidden:
            for tokens in tokens_list:
                if not res.late(f"rms {tokens}x{hidden} {quant}"):
                    yield quant, hidden, tokens


def _norm_inputs(tokens, hidden, device):
    g = torch.Generator(device=device).manual_seed(tokens * 7 + hidden)
    make = lambda *shape: torch.randn(*shape, generator=g, device=device).to(torch.bfloat16)  # noqa: E731
    return make(tokens, hidden), make(tokens, hidden), make(hidden)


def _norm_checker(x, residual, weight, quant, tolerance):
    import symmcoll.reference as ref
    want_normed, want_residual = ref.all_reduce_rms_norm(x, residual, weight, EPS)[:2]

    def check(out):
        normed, new_residual, scales = (out + (None,))[:3] if len(out) == 2 else out
        got = normed.float() * scales if quant else normed
        err = max(rel_err(got, want_normed), rel_err(new_residual, want_residual))
        if err > tolerance:
            raise AssertionError(f"relative error {err:.2e}")
        return err
    return check


def rms_section(res: Results, device, sweep_configs: bool = True):
    import symmcoll
    from symmcoll import plan
    from symmcoll.bench import memory_bound, roofline
    from symmcoll.fused import all_reduce_rms_norm as arn
    torch._dynamo.config.cache_size_limit = 64
    for quant, hidden, tokens in _rms_cases(res, SIZES.tokens):
        x, residual, weight = _norm_inputs(tokens, hidden, device)
        case = (tokens, hidden, quant or "bf16")
        check = _norm_checker(x, residual, weight, quant, 0.07 if quant else 2e-2)
        nbytes = roofline.rms_norm_bytes(tokens, hidden, 2, quant)
        res.add("rms", "torch eager", case, lambda: memory_bound.add_rms_norm(x, residual, weight, quant),
                check, nbytes)
        if not SIZES.smoke:  # inductor's CPU code is no baseline for a GPU kernel
            compiled = memory_bound.compiled_add_rms_norm((x, residual, weight), quant)
            res.add("rms", "torch.compile", case, compiled, check, nbytes)
        options = (("eps", EPS), ("quant", quant))
        request = plan.Request(arn.OP, (tokens, hidden), torch.bfloat16, device, options=options)
        default = arn.gpu_config(request, 1)
        configs = [("default", default)]
        if sweep_configs and tokens in SIZES.sweep_tokens:
            configs += [(_rms_label(c, hidden), c) for c in _rms_candidates(hidden, tokens)
                        if rms_fields(c, hidden) != rms_fields(default, hidden)]
        for algorithm in ("one_shot", "two_shot"):
            for label, cfg in configs if algorithm == "one_shot" else configs[:1]:
                def run(cfg=cfg, algorithm=algorithm):
                    return plan.resolve(arn.OP, x, None, algorithm, config=cfg, others=(residual, weight),
                                        options=options).execute(x, others=(residual, weight))
                res.add("rms", f"symmcoll:{algorithm}", case, run, check, nbytes, config=label,
                        block=cfg.block, warps=cfg.num_warps, **rms_fields(cfg, hidden))
        symmcoll.check()
    res.save()


def _rms_candidates(hidden, tokens):
    """Launch configs of the rms kernels (``block`` = values a program holds per step): whole rows with
    4, 8, 16 or 32 values per thread (2 rows at 16 for rows of <= 4096); rows in chunks of
    1024-8192 values at 8 per thread and of 4096-8192 at 16, at 528 and 1024 programs; with the next
    step's loads issued ahead (``ahead``; whole rows then hold the weight): whole rows at 8 and 16 per
    thread at 132, 264 and 528 programs, chunks of 2048 at 264 and 528. At <= 32 tokens (a row a
    program, no chunk runs in parallel) whole rows at 1024 programs, loads ahead at 8 and 16 per thread
    (one row a program: every load of the row, the weight's too, in one wait). Past MAX_PROGRAMS rows, a
    program per row (``every_step``: the grid covers the rows, as torch.compile's launch does) at 4-32
    values per thread and two rows at 16."""
    from symmcoll.fused.memory_bound_configs import RmsConfig
    from symmcoll.memory.layout import MAX_PROGRAMS
    block_h = 1 << (hidden - 1).bit_length()
    shapes = [(block_h, block_h // (32 * per_thread)) for per_thread in (4, 8, 16, 32)]
    shapes += [(2 * block_h, block_h // 256)] if block_h <= 4096 else []
    ahead = [(block_h, block_h // 256), (block_h, block_h // 512)]
    if tokens > 32:
        shapes += [(chunk, chunk // 256) for chunk in (1024, 2048, 4096, 8192) if chunk < block_h]
        shapes += [(chunk, chunk // 512) for chunk in (4096, 8192) if chunk < block_h]
    programs, ahead_programs = ((1024,), (1024,)) if tokens <= 32 else ((528, 1024), (132, 264, 528))
    configs = [RmsConfig(block, p, warps) for block, warps in shapes if 4 <= warps <= 32 for p in programs]
    configs += [RmsConfig(block, p, warps, True) for block, warps in ahead if 4 <= warps <= 32
                for p in ahead_programs]
    if tokens > 32 and 2048 < block_h:
        configs += [RmsConfig(2048, p, 8, True) for p in (264, 528)]
    if tokens > MAX_PROGRAMS:  # a program per step (torch.compile's launch): whole rows, 4-32 values per thread
        configs += [RmsConfig(block, MAX_PROGRAMS, warps, False, True) for block, warps in shapes[:4]
                    if 4 <= warps <= 32]
        configs += [RmsConfig(2 * block_h, MAX_PROGRAMS, block_h // 256, False, True)] if block_h <= 4096 else []
    return configs


def rms_fields(config, hidden) -> dict:
    """A config as the table keeps it (fused/memory_bound_configs.py): whole rows or a chunk, values per
    thread, programs, loads ahead."""
    block_h = 1 << (hidden - 1).bit_length()
    shape = {"rows": config.block // block_h} if config.block >= block_h else {"chunk": config.block}
    return dict(shape, per_thread=config.block // (32 * config.num_warps), programs=config.max_programs,
                ahead=bool(getattr(config, "ahead", False)), every_step=bool(getattr(config, "every_step", False)))


def _rms_label(config, hidden) -> str:
    fields = rms_fields(config, hidden)
    shape = f"rows{fields['rows']}" if "rows" in fields else f"chunk{fields['chunk']}"
    programs = "every" if fields["every_step"] else config.max_programs
    return f"{shape}/w{config.num_warps}/p{programs}" + ("/ahead" if fields["ahead"] else "")


def _moe_inputs(tokens_n, hidden, experts, k, device):
    i = torch.arange(tokens_n * hidden, device=device).reshape(tokens_n, hidden)
    tokens = ((i * 7 + 5) % 9 - 4).to(torch.bfloat16)
    rng = random.Random(tokens_n * 31 + experts * 7 + k)
    ids = torch.tensor([rng.sample(range(experts), k) for _ in range(tokens_n)], device=device)
    weights = torch.tensor([0.5, 0.25, 1.0, 2.0, 0.125, 0.75, 1.5, 0.375][:k], device=device).repeat(tokens_n, 1)
    return tokens, ids, weights


def dispatch_section(res: Results, device):
    """moe_dispatch alone (the ``dispatch`` part): the default and every candidate of variants 0 (two
    launches), 4 (one launch), 5 (two launches, the pull's next item ahead) and 6 (two launches, folded
    prefixes, the pull two items ahead) at every case (1 was swept
    in run 3, 2 and 3 in the 2026-11-27 H100 runs: the shipped tables hold their picks, which are the
    default rows), 1024 tokens first, then 4096, then 128 (the deadline cuts the last)."""
    order = {1024: 0, 4096: 1}
    cases = sorted(SIZES.moe_cases, key=lambda c: order.get(c[0], 2))
    candidates = [c for c in SIZES.moe_configs if c[4] == 0 and c[5] in ((0, 2, 3, 4, 5, 6) if SIZES.smoke else
                                                                          (0, 4, 5, 6))]
    moe_section(res, device, ops=("moe_dispatch",), cases=cases, candidates=candidates)


def combine_section(res: Results, device):
    """The ``combine`` part: moe_dispatch and moe_combine with their default configs (no sweep) beside
    torch at the cases of >= 1024 tokens (smoke: every case), where issue 23's bandwidth target holds."""
    moe_section(res, device, sweep_configs=False, cases=[c for c in SIZES.moe_cases if c[0] >= 1024 or SIZES.smoke])


def moe_section(res: Results, device, sweep_configs: bool = True, ops=("moe_dispatch", "moe_combine"),
                cases=None, candidates=None):
    """``cases`` (default: every MoE case) with the default config, and ``candidates`` (default:
    MOE_CONFIGS at the swept cases) beside it."""
    import symmcoll
    import symmcoll.reference as ref
    from symmcoll import plan
    from symmcoll.bench import roofline
    from symmcoll.fused import moe_rules
    from symmcoll.plan import LaunchConfig
    # the module's own settings (what the default runs with where its table has no entry), restored after
    untuned = (moe_rules.TOKENS_PER_ITEM["cuda"], moe_rules.LOCAL_ROUTE_SLOTS["cuda"],
               moe_rules.DISPATCH_VARIANT["cuda"])
    for case in cases or SIZES.moe_cases:
        tokens_n, hidden, experts, k = case
        if res.late(f"moe {case}"):
            continue
        tokens, ids, weights = _moe_inputs(*case, device)
        want_recv, want_counts, want_origin, want_self = ref.moe_dispatch(tokens, ids, experts)
        n = int(want_counts.sum())
        expert_out = want_recv * 2
        want_combined = ref.moe_combine(expert_out, weights, ids, want_origin, experts)
        dispatch_bytes, combine_bytes = roofline.moe_bytes(ids.cpu(), experts, 1, 0, hidden * 2, ids.element_size(), 4)

        def check_dispatch(out):
            if not torch.equal(out[1], want_counts):
                raise AssertionError(f"expert counts {out[1].tolist()}, want {want_counts.tolist()}")
            if len(out) == 4 and not (torch.equal(out[2], want_origin) and torch.equal(out[3], want_self)):
                raise AssertionError("row origins or own-token rows differ (combine's handle)")
            return _exact(out[0][:n], want_recv[:n])

        def check_combine(out):
            return _exact(out, want_combined)
        rows = want_origin[want_origin >= 0] // k % tokens_n
        gathered = torch.empty(n, hidden, dtype=tokens.dtype, device=device)
        res.add("moe_dispatch", "torch index_select", case,
                lambda: (torch.index_select(tokens, 0, rows, out=gathered), want_counts), check_dispatch,
                dispatch_bytes)
        self_rows = want_self.clamp(min=0)
        used = (want_self >= 0).float() * weights
        if "moe_combine" in ops:
            res.add("moe_combine", "torch gather+sum", case,
                    lambda: (expert_out[self_rows].float() * used[..., None]).sum(1).to(expert_out.dtype),
                    check_combine, combine_bytes)
        configs = [("default", None, *untuned)]
        if sweep_configs and (candidates is not None or (tokens_n, experts) in SIZES.moe_sweep):
            configs += [(f"b{b}/p{p}/w{w}/tt{tt}" + (f"/local{ls}" if ls else "") + (f"/v{v}" if v else ""),
                         LaunchConfig(b, p, w), tt, ls, v) for b, p, w, tt, ls, v in
                        (SIZES.moe_configs if candidates is None else candidates)]
        dispatch_options = (("num_experts", experts), ("max_rows", tokens_n * k))
        alone = set()  # the variants whose launches were timed alone at this case
        for label, cfg, tt, local_slots, variant in configs:
            (moe_rules.TOKENS_PER_ITEM["cuda"], moe_rules.LOCAL_ROUTE_SLOTS["cuda"],
             moe_rules.DISPATCH_VARIANT["cuda"]) = tt, local_slots, variant
            handle = {}

            def dispatch(cfg=cfg):
                out = plan.resolve("moe_dispatch", tokens, None, "pull", config=cfg, others=(ids,),
                                   options=dispatch_options).execute(tokens, others=(ids,))
                handle["out"] = out
                return out

            def combine(cfg=cfg):
                _, counts, origin, self_rows_ = handle["out"]
                return plan.resolve("moe_combine", expert_out, None, "push", config=cfg,
                                    others=(weights, ids, counts, origin, self_rows_),
                                    options=(("num_experts", experts),)).execute(
                    expert_out, others=(weights, ids, counts, origin, self_rows_))
            fields = {op: _moe_fields(op, case, device, cfg, tt, local_slots, variant)
                      for op in ("moe_dispatch", "moe_combine")}
            res.add("moe_dispatch", "symmcoll:pull", case, dispatch, check_dispatch, dispatch_bytes, config=label,
                    **fields["moe_dispatch"])
            if "out" in handle and "moe_combine" in ops and (variant == 0 or cfg is None):
                res.add("moe_combine", "symmcoll:push", case, combine, check_combine, combine_bytes, config=label,
                        **fields["moe_combine"])
            # the default's launches alone, and those of the first candidate of variants 5 and 6 (two launches)
            if "out" in handle and (cfg is None or (variant in (5, 6) and variant not in alone)):
                _moe_kernels_alone(res, case, dispatch, dispatch_bytes, label)
                alone.add(variant if cfg is not None else None)
        (moe_rules.TOKENS_PER_ITEM["cuda"], moe_rules.LOCAL_ROUTE_SLOTS["cuda"],
         moe_rules.DISPATCH_VARIANT["cuda"]) = untuned
        symmcoll.check()
    res.save()


def _moe_fields(op, case, device, cfg, tt, local_slots, variant) -> dict:
    """The launch of a MoE row as the table keeps it: the candidate's, or (``cfg`` None) the default
    fused/moe_rules.py picks for this case on one rank (its table's entry, else the untuned rule)."""
    from symmcoll.fused import memory_bound_configs as mbc
    from symmcoll.fused import moe_rules
    if cfg is None:
        tokens_n, hidden, experts, k = case
        entry = mbc.moe_entry(mbc.device_table(device), op, tokens_n, hidden, k, experts)
        cfg, tt, local_slots, variant = mbc.moe_config(entry) if entry else \
            (moe_rules.GPU_CONFIG, moe_rules.TOKENS_PER_ITEM["cuda"], moe_rules.LOCAL_ROUTE_SLOTS["cuda"],
             moe_rules.DISPATCH_VARIANT["cuda"])
    fields = dict(block=cfg.block, programs=cfg.max_programs, warps=cfg.num_warps, tt=tt)
    return dict(fields, local_slots=local_slots, variant=variant) if op == "moe_dispatch" else fields


def _moe_kernels_alone(res: Results, case, dispatch, dispatch_bytes, label="default"):
    """The launches of a dispatch timed alone (section moe_route: routing, the fixed cost; moe_move: the
    row copies, over the dispatch's bytes; a dispatch in one launch: moe_move only), replayed with the
    arguments of the call just checked: where the time that is not bandwidth goes."""
    from symmcoll import launcher
    with launcher.recording() as launches:
        dispatch()
    for section, rec in zip(("moe_route", "moe_move")[2 - len(launches):], launches):
        res.add(section, "symmcoll:" + rec.kernel.__name__, case,
                lambda rec=rec: launcher.launch(rec.kernel, rec.grid, rec.args, rec.meta), lambda _: 0.0,
                dispatch_bytes if section == "moe_move" else None, config=label)


def codec_section(res: Results, device):
    import symmcoll.reference as ref
    from symmcoll.bench import roofline
    from symmcoll.language import EMPTY
    for fmt in SIZES.codec_formats:
        for group_size in SIZES.group_sizes:
            for numel in SIZES.codec_numels:
                mb = numel * 2 / (1 << 20)
                if res.late(f"codec {fmt} G{group_size} {mb} MB"):
                    continue
                g = torch.Generator(device=device).manual_seed(numel + group_size)
                x = (torch.randn(numel, generator=g, device=device) * 3).to(torch.bfloat16)
                levels, scales_want = ref.quantize_groups(x.float(), fmt, group_size)
                want = ref.dequantize_groups(levels, scales_want).to(torch.bfloat16)
                words, scales = roofline.codec_buffers(numel, fmt, group_size, device)
                out = torch.empty_like(x)
                nbytes = roofline.codec_bytes(numel * 2, 2, fmt, group_size)

                def check_codes(_):
                    roofline.dequantize(words, scales, out, fmt, group_size)
                    wrong = int(((out != want) & ~(out.isnan() & want.isnan())).sum())  # -0 == +0 here
                    if wrong or bool((words == EMPTY.value).any()):
                        raise AssertionError(f"{wrong} values differ from the emulation (or a word is EMPTY)")
                    return 0.0
                for direction in ("q", "dq"):
                    default = roofline.codec_config(fmt, direction, group_size, numel, device)
                    configs = [default] + [c for c in CODEC_CONFIGS if c != default and not SIZES.smoke]
                    for block, warps, programs in configs:
                        label = "default" if (block, warps, programs) == default else f"b{block}/w{warps}/p{programs}"
                        if direction == "q":
                            name, check = f"{fmt} quantize", check_codes
                            fn = lambda b=block, w=warps, p=programs: roofline.quantize(  # noqa: E731
                                x, words, scales, fmt, group_size, b, w, p)
                        else:
                            name, check = f"{fmt} dequantize", lambda _: check_codes(None)
                            fn = lambda b=block, w=warps, p=programs: roofline.dequantize(  # noqa: E731
                                words, scales, out, fmt, group_size, b, w, p)
                        res.add("codec", name, (fmt, direction, group_size, f"{mb:g}M"), fn, check, nbytes,
                                config=label, block=block, warps=warps, programs=programs)
                del x, words, scales, out
                torch.cuda.empty_cache()
    res.save()


def old_section(res: Results, old_src: str, parts, smoke: bool, narrowing=()):
    """The same rms and moe cases through the public API of the tree at ``old_src`` (a second process)."""
    remaining = res.deadline - (time.monotonic() - START) - 10
    if remaining < 30:
        res.skipped.append("old (no time left)")
        return
    out = res.out + ".old.json"
    env = dict(os.environ, PYTHONPATH=old_src)
    cmd = [sys.executable, __file__, "--old-worker", "--out", out, "--deadline", str(int(remaining)),
           "--parts", *[p for p in parts if p in ("rms", "moe")], *(["--smoke"] if smoke else []), *narrowing]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=remaining + 30)
    if proc.returncode:
        res.skipped.append(f"old: exit {proc.returncode}: {proc.stderr[-300:]}")
    try:
        with open(out) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return
    res.meta["old"] = old["meta"]
    res.skipped += [f"old {s}" for s in old["skipped"]]
    res.rows += [dict(r, name="old " + r["name"]) for r in old["rows"]]
    res.save()


def old_worker(res: Results, device, parts):
    """Runs under the old tree: public API only (no bench.roofline there)."""
    import symmcoll
    import symmcoll.reference as ref
    if "rms" in parts:
        for quant, hidden, tokens in _rms_cases(res, SIZES.old_tokens):
            x, residual, weight = _norm_inputs(tokens, hidden, device)
            check = _norm_checker(x, residual, weight, quant, 0.07 if quant else 2e-2)
            for algorithm in ("one_shot", "two_shot", "auto"):
                res.add("rms", f"symmcoll:{algorithm}", (tokens, hidden, quant or "bf16"),
                        lambda a=algorithm: symmcoll.all_reduce_rms_norm(x, residual, weight, EPS, algorithm=a,
                                                                         quant=quant), check)
        res.save()
    if "moe" in parts:
        for case in SIZES.old_moe:
            if res.late(f"moe {case}"):
                continue
            tokens_n, hidden, experts, k = case
            tokens, ids, weights = _moe_inputs(*case, device)
            want = ref.moe_dispatch(tokens, ids, experts)
            n = int(want[1].sum())
            handle = {}

            def dispatch():
                handle["h"] = symmcoll.moe_dispatch(tokens, ids, experts)
                return handle["h"]
            res.add("moe_dispatch", "symmcoll:pull", case, dispatch, lambda out: _exact(out[0][:n], want[0][:n]))
            expert_out = want[0] * 2
            want_combined = ref.moe_combine(expert_out, weights, ids, want[2], experts)
            if "h" in handle:
                res.add("moe_combine", "symmcoll:push", case,
                        lambda: symmcoll.moe_combine(expert_out, weights, handle["h"][2]),
                        lambda out: _exact(out, want_combined))
        res.save()


# ---- the launch table of fused/memory_bound_configs.py ---------------------------------------------------

def _filled(row: dict) -> dict:
    """A row of an earlier result with its config's fields (runs before 2026-11-24 run 3 kept labels and
    block/warps/programs only; their defaults were the untuned rules)."""
    from symmcoll.bench import roofline
    from symmcoll.fused import moe_rules
    row = dict(row)
    label = row.get("config")
    if row["section"] == "rms" and "per_thread" not in row and "block" in row:
        config = SimpleNamespace(block=row["block"], num_warps=row["warps"], max_programs=row["programs"])
        row.update(rms_fields(config, row["case"][1]))
    elif row["section"] in ("moe_dispatch", "moe_combine") and "tt" not in row and label == "default":
        cfg = moe_rules.GPU_CONFIG
        row.update(block=cfg.block, programs=cfg.max_programs, warps=cfg.num_warps, tt=1)
    elif row["section"] == "codec" and "block" not in row and label:
        block, warps, programs = ((roofline.CODEC_BLOCK, roofline.CODEC_WARPS, roofline.CODEC_PROGRAMS)
                                  if label == "default" else (int(f[1:]) for f in label.split("/")))
        row.update(block=block, warps=warps, programs=programs)
    return row


def write_table(result_path: str, table_path: str, gpu: str, base: dict | None = None) -> dict:
    """The table (fused/memory_bound_configs.build_table) of the result at ``result_path``; with ``base``
    (a table), merged into it: base's entries stay for the cases this result did not measure."""
    from symmcoll.fused.memory_bound_configs import build_table, merge_tables
    with open(result_path) as f:
        result = json.load(f)
    result["rows"] = [_filled(r) for r in result["rows"] if not r["name"].startswith("old")]
    table = build_table(result, gpu, os.path.basename(os.path.dirname(os.path.abspath(result_path))))
    if base:
        table = merge_tables(table, base)
    with open(table_path, "w") as f:
        json.dump(table, f, indent=1)
    moved = {key: sum(e["label"] != "default" for e in entries) for key, entries in table.items()
             if isinstance(entries, list)}
    print(f"table {table_path}: entries {({k: len(v) for k, v in table.items() if isinstance(v, list)})}, "
          f"default replaced in {moved}", flush=True)
    return table


# ---- the table ------------------------------------------------------------------------------------------

COLUMNS = (("section", "<13"), ("case", "<26"), ("best us", ">9"), ("GB/s", ">6"), ("%copy", ">6"), ("config", "<20"),
           ("default", ">9"), ("torch", ">9"), ("compile", ">9"), ("x torch", ">8"), ("old", ">9"))


def summary(res: Results) -> list[tuple]:
    """One row per case: the best symmcoll candidate (and its config) beside its default config, torch
    (eager, compiled) and the old kernel; x torch = best / torch.compile (rms), else best / torch."""
    def num(v, digits):
        return f"{v:.{digits}f}" if isinstance(v, (int, float)) else "-"
    by_case = {}
    for r in res.rows:
        by_case.setdefault((r["section"], tuple(r["case"])), []).append(r)
    out = []
    for (section, case), rows in by_case.items():
        ok = [r for r in rows if "us" in r and not r["name"].startswith("old")]
        mine = [r for r in ok if r["name"].startswith("symmcoll") or section == "codec"]
        best = min(mine, key=lambda r: r["us"], default={})
        default = next((r["us"] for r in mine if r.get("config") == "default"), None)
        eager = next((r["us"] for r in ok if r["name"] in ("torch eager", "torch index_select", "torch gather+sum")),
                     None)
        compiled = next((r["us"] for r in ok if r["name"] == "torch.compile"), None)
        versus = compiled or eager
        old = [r["us"] for r in rows if r["name"].startswith("old") and "us" in r]
        wrong = [r["name"] for r in rows if "error" in r]
        out.append((section, "x".join(map(str, case)), num(best.get("us"), 1), num(best.get("gbps"), 0),
                    num(best.get("pct_copy"), 0), best.get("config", "-"), num(default, 1), num(eager, 1),
                    num(compiled, 1), num(best and versus and best["us"] / versus, 2),
                    num(min(old) if old else None, 1), f"WRONG/FAILED: {wrong}" if wrong else ""))
    return out


def table(res: Results) -> str:
    lines = [f"copy rate: {res.meta.get('copy', {}).get('best', 0):.0f} GB/s (read + write)",
             "".join(format(name[:int(width[1:])], width) + " " for name, width in COLUMNS)]
    for row in summary(res):
        lines.append("".join(format(v[:int(w[1:])], w) + " " for v, (_, w) in zip(row, COLUMNS)) + row[-1])
    if res.skipped:
        lines.append(f"skipped (deadline): {len(res.skipped)}: {res.skipped[:6]}")
    return "\n".join(lines)


def variant_table(res: Results) -> str:
    """Per moe_dispatch case, the best time (and % of copy) of each dispatch variant, and torch's."""
    best: dict[tuple, dict] = {}
    for r in res.rows:
        if r["section"] == "moe_dispatch" and "us" in r and not r["name"].startswith("old"):
            slots = 1 << (r["case"][0] * r["case"][3] - 1).bit_length()  # as fused/moe.py rounds them
            key = (r["variant"] or int(slots <= r["local_slots"])) if "variant" in r else "torch"
            slot = best.setdefault(tuple(r["case"]), {})
            if key not in slot or r["us"] < slot[key]["us"]:
                slot[key] = r
    if not best:
        return ""
    cell = lambda r: f"{r['us']:.1f} ({r['pct_copy']:.0f}%)" if r and r.get("pct_copy") else (  # noqa: E731
        f"{r['us']:.1f}" if r else "-")
    lines = ["dispatch variants: best us (% of copy) per case", f"{'case':<22}" + "".join(
        f"{name:>16}" for name in ("v0 two launches", "v1 every slot", "v2 ranges", "v3 ranges ahead",
                                   "v4 routed first", "v5 pull ahead", "v6 folded", "torch"))]
    for case, slot in best.items():
        cells = "".join(f"{cell(slot.get(key)):>16}" for key in (0, 1, 2, 3, 4, 5, 6, "torch"))
        lines.append(f"{'x'.join(map(str, case)):<22}{cells}")
    return "\n".join(lines)


def markdown(path: str) -> str:
    """The summary of a result file as a markdown table (for docs/results.md)."""
    with open(path) as f:
        data = json.load(f)
    res = Results(path, 0)
    res.meta, res.rows, res.skipped = data["meta"], data["rows"], data["skipped"]
    lines = [f"copy rate: {res.meta.get('copy', {}).get('best', 0):.0f} GB/s (read + write)", "",
             "| " + " | ".join(name for name, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row[:len(COLUMNS)]) + " |" for row in summary(res)]
    return "\n".join(lines)


def _main_rank(args):
    global SIZES
    SIZES = Sizes(args.smoke)
    SIZES.narrow(args.rms_tokens, args.quants, args.moe_tokens)
    device = torch.device("cuda", torch.cuda.current_device()) if not args.smoke else torch.device("cpu")
    res = Results(args.out, args.deadline)
    if args.old_worker:
        old_worker(res, device, args.parts)
        return
    from symmcoll.bench import provenance, roofline
    res.meta["provenance"] = provenance.collect(device.type).__dict__
    res.meta["copy"] = roofline.copy_gbps(device) if not args.smoke else {}
    print(f"copy: {res.meta['copy']}", flush=True)
    res.save()
    res.deadline = args.deadline - (OLD_RESERVE_S if args.old_src else 0)  # time kept for the old tree
    sections = {"rms": rms_section, "moe": moe_section, "dispatch": dispatch_section, "combine": combine_section,
                "codecs": codec_section}
    for part in args.parts:  # in the order given: the deadline cuts the last
        t0 = time.monotonic()
        sections[part](res, device)
        print(f"{part}: {time.monotonic() - t0:.0f} s", flush=True)
    if args.old_src:
        res.deadline = args.deadline
        narrowing = [*(["--rms-tokens", *map(str, args.rms_tokens)] if args.rms_tokens else []),
                     *(["--quants", *args.quants] if args.quants else []),
                     *(["--moe-tokens", *map(str, args.moe_tokens)] if args.moe_tokens else [])]
        old_section(res, args.old_src, [("moe" if p in ("dispatch", "combine") else p) for p in args.parts],
                    args.smoke, narrowing)
    res.save()
    print(table(res), flush=True)
    if "dispatch" in args.parts:
        print(variant_table(res), flush=True)
    if not args.smoke:  # this GPU model's launch table, to copy into src/symmcoll/data/ if it is kept: the
        # shipped one with this run's cases replaced (the parts run and the cases the deadline left)
        from symmcoll.fused.gemm_tables import gpu_key
        from symmcoll.fused.memory_bound_configs import load_table
        name = torch.cuda.get_device_name()
        write_table(args.out, os.path.join(os.path.dirname(os.path.abspath(args.out)),
                                           f"roofline_{gpu_key(name) or 'gpu'}.json"), name, load_table(gpu_key(name)))
    return res.rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--parts", nargs="+", default=["rms", "moe", "codecs"],
                        choices=["rms", "moe", "dispatch", "combine", "codecs"], help="run in the order given")
    parser.add_argument("--old-src", default=None)
    parser.add_argument("--deadline", type=float, default=440.0, help="seconds after which no new case starts")
    parser.add_argument("--smoke", action="store_true", help="tiny cases on a CPU rank (checks this script)")
    parser.add_argument("--old-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rms-tokens", type=int, nargs="+", help="only these rms token counts")
    parser.add_argument("--quants", nargs="+", choices=["bf16", "fp8_per_token"], help="only these rms outputs")
    parser.add_argument("--moe-tokens", type=int, nargs="+", help="only the MoE cases of these token counts")
    parser.add_argument("--markdown", action="store_true", help="print --out's table as markdown and exit")
    parser.add_argument("--write-table", metavar="TABLE", help="write the launch table of the result --out "
                        "(fused/memory_bound_configs.py's format) to TABLE and exit")
    parser.add_argument("--gpu", default="NVIDIA H200", help="the GPU --write-table names")
    parser.add_argument("--base", metavar="TABLE", help="with --write-table: keep TABLE's entries for the cases "
                        "the result did not measure")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(args.out))
        return
    if args.write_table:
        base = None
        if args.base:
            with open(args.base) as f:
                base = json.load(f)
        write_table(args.out, args.write_table, args.gpu, base)
        return
    from symmcoll import launch
    launch.run(_main_rank, 1, args, device="cpu" if args.smoke else "cuda", timeout=int(args.deadline) + 200)


if __name__ == "__main__":
    main()
