"""``symmcoll bench --op backend_block``: a model nobody wrote for symmcoll, compiled two ways in one
process and timed side by side. GPUs only.

The model is ``symmcoll.models.dtensor_llama``: torchtitan's Llama block at Llama-3-70B sizes (hidden
8192, 64 query / 8 KV heads of 128, ffn 28672; each of W ranks holds 1/W of it), bf16, weights from one
seed, made tensor-parallel by torch's ``parallelize_module`` plans. It knows nothing of symmcoll. Modes:

* ``inductor``: ``torch.compile(block)``, the baseline (1.000x);
* ``symmcoll``: ``torch.compile(block, backend=symmcoll.backend(inner="inductor"))`` (copy_weights="auto",
  the default): the same Inductor, after the backend has rewritten the graph's functional collectives
  (its report: how many, into which ops; and which symmcoll kernels the first calls launched).
At world size 1 DTensor leaves no collective in the graph: both modes compile the same graph, and the
ratio shows only what the backend itself costs.

Cases (``--shapes``: full names, or prefixes such as ``decode`` or ``prefill:1x2048``; ``select_cases``):

* ``decode:B:tp`` (B = 1, 8, 64): one token per sequence at position 2048 (``Setup.cache_tokens``) through a
  static KV cache holding 2048 tokens (64 more positions masked); tensor parallel (activations replicated);
* ``prefill:BxS:tp``, ``prefill:BxS:tp_sp`` (1 x 2048, 4 x 4096): causal attention over the sequence, no
  cache; tensor parallel, and tensor + sequence parallel (the sequence sharded over the ranks between the
  attention and the feed-forward).

Per case, in every rank process, after ``settle_graphs``:
1. the reference: the same parallelised block in fp32 (weights and inputs equal to the bf16 ones), eager;
2. per mode, inductor first: ``torch._dynamo.reset()``, ``torch.compile(fullgraph=True, dynamic=False,
   mode=compile_mode)`` with Inductor's FX-graph cache off (both modes compile cold); "compile s" is the
   first call's wall time (Dynamo, Inductor, kernel JIT; the slowest rank). Under reduce-overhead two more
   calls follow (cudagraph trees record, then replay); in compile mode "default" STEPS calls are captured
   in a CUDA graph of our own. The relative error of the block's update (output - input) against the fp32
   run, and its difference from the inductor mode's, of the first call and of the replayed one, over the
   whole update and of the worst token: past TOLERANCE / TOKEN_TOLERANCE the mode is not timed;
3. ``replays`` samples (fewer past CASE_BUDGET_S, at least MIN_SAMPLES) of STEPS calls back to back
   between CUDA events (decode 8, prefill 1): the median per step, slowest rank; then the last output is
   checked again;
4. with ``--profile`` (``Setup.profile``), ahead of 3 (the profiler's CUPTI stays attached: every mode
   is then timed alike): a few samples under torch.profiler, every rank's GPU activities by name (us and
   calls a step, the PROFILE_TOP longest), busy and idle us a step, and the host's time to issue a step
   (near ms/step: the step waits for the host, not the GPU); in the JSON (``profile``: one entry per
   rank) and the log.
The driver runs a case with ``mode="reduce-overhead"``; where a mode fails there (an error, a mismatch, or
cudagraph trees leaving a partition outside CUDA graphs), it runs the case again in compile mode "default"
(every mode), keeping both sets of rows; "x inductor" compares rows of one compile mode.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass

from ..models.dtensor_llama import LLAMA3_70B, ModelArgs
from . import provenance

MODES = ("inductor", "symmcoll")
COMPILE_MODES = ("reduce-overhead", "default")
DECODE_BATCHES = (1, 8, 64)
PREFILLS = ((1, 2048), (4, 4096))
STEPS = {"decode": 8, "prefill": 1}   # calls per timed sample (and per captured graph)
CASE_BUDGET_S, MIN_SAMPLES = 2.0, 5
TIMING = {"reduce-overhead": "cudagraph-tree replays, back to back",
          "default": f"one CUDA graph of {STEPS['decode']} decode steps or {STEPS['prefill']} prefill step, replayed"}
# Relative errors of the block's update (output - input) against the fp32 block and against the
# inductor mode's: over all of it (Frobenius) and of the worst token (one row of hidden values). The
# update is ~0.1 of the residual stream here, so the bf16 rounding of the output alone is 1.4-1.6e-2 of
# it, and eager bf16 is 2.1-2.3e-2 (whole and worst token alike; measured on CPU at these sizes, decode 8
# and prefill 256). A wrong token or a lost rank's share is >= 0.3 on its rows.
TOLERANCE = 5e-2
TOKEN_TOLERANCE = 8e-2
SEED = 0
PROFILE_TOP = 20   # GPU activities (by name) a profiled row lists
# Short names of the ops a rewrite produces, for the table (the JSON keeps the full names).
SHORT = {"all_gather_matmul": "ag_mm", "matmul_reduce_scatter": "mm_rs", "matmul_all_reduce": "mm_ar",
         "all_reduce_rms_norm": "ar_rms", "all_reduce": "ar", "all_gather": "ag", "reduce_scatter": "rs",
         "all_to_all": "a2a", "broadcast": "bcast"}


@dataclass(frozen=True)
class Setup:
    """What the rank side builds and compiles. inner: the Inductor of both modes ("aot_eager" on CPU,
    where the tests run the checks without timing: ``timed=False``)."""

    args: ModelArgs = LLAMA3_70B
    inner: str = "inductor"
    copy_weights: str = "auto"
    cache_tokens: int = 2048
    timed: bool = True
    compile_modes: tuple[str, ...] = COMPILE_MODES   # the first, then the next where a mode failed
    profile: bool = False   # each timed mode also profiled (``backend_block_rank.profile_step``)


@dataclass(frozen=True)
class Case:
    name: str
    phase: str              # decode | prefill
    batch: int
    seq: int                # tokens per sequence in this step
    sequence_parallel: bool


def case_names() -> list[str]:
    names = [f"decode:{b}:tp" for b in DECODE_BATCHES]
    return names + [f"prefill:{b}x{s}:{p}" for b, s in PREFILLS for p in ("tp", "tp_sp")]


def parse_case(name: str) -> Case:
    parts = name.split(":")
    try:
        if parts[0] == "decode" and len(parts) == 3 and parts[2] == "tp":
            return Case(name, "decode", int(parts[1]), 1, False)
        if parts[0] == "prefill" and len(parts) == 3 and parts[2] in ("tp", "tp_sp"):
            batch, seq = (int(v) for v in parts[1].lower().split("x"))
            return Case(name, "prefill", batch, seq, parts[2] == "tp_sp")
    except ValueError:
        pass
    raise ValueError(f"backend_block case {name!r}: want decode:B:tp or prefill:BxS:tp|tp_sp")


def select_cases(wanted: list[str]) -> list[str]:
    """The cases ``--shapes`` names: a full name selects that case (prefill:1x2048:tp, not its _sp twin),
    a prefix every case it starts (decode, prefill:4x4096); a name outside the list is parsed as given
    (decode:16:tp). Raises ValueError for a name that is not a case."""
    names = case_names()
    cases = [c for c in names if not wanted or any(c == w or (c.startswith(w) and w not in names) for w in wanted)]
    cases += [w for w in wanted if not any(c.startswith(w) for c in names)]
    for case in cases:
        parse_case(case)
    return cases


def unfit(case: Case, world: int, setup: Setup) -> str | None:
    """Why ``case`` cannot run at ``world`` ranks (None: it can)."""
    args = setup.args
    for what, n in (("query heads", args.n_heads), ("KV heads", args.n_kv_heads), ("ffn", args.ffn_dim)):
        if n % world:
            return f"{n} {what} are not divisible by {world} ranks"
    if case.sequence_parallel and case.seq % world:
        return f"{case.seq} tokens per sequence are not divisible by {world} ranks"
    last = setup.cache_tokens if case.phase == "decode" else case.seq - 1
    if last >= args.max_seq_len:
        return f"position {last} is past the rotary tables' {args.max_seq_len}"
    return None


# ---- driver ------------------------------------------------------------------------------------------

CASE_TIMEOUT_S = 600


def run(world_sizes, cases, modes, replays: int, out_dir, console, time_limit_s: float | None = None,
        setup: Setup = Setup(), device: str = "cuda") -> int:
    """Every case in every mode at each world size; one JSON per world size, rewritten after every case
    (a run cut short keeps what it measured). ``time_limit_s``: start no case after that many seconds;
    the JSON names the cases left out. Returns 1 if a symmcoll row failed where inductor's did not.
    (device="cpu" with an untimed ``setup``: the tests' run of everything but the timing.)"""
    from ..launch import RankPool
    from .backend_block_rank import run_case
    status, start = 0, time.monotonic()
    for world in world_sizes:
        rows, left_out = [], []
        with RankPool(world, device=device) as pool:
            info = pool.run(provenance.collect, device)[0]
            path = out_dir / f"backend_block-ws{world}-{info.created_utc.replace(':', '')}.json"
            stopped = False
            for case in cases:
                stopped = stopped or (time_limit_s is not None and time.monotonic() - start > time_limit_s)
                reason = "time limit" if stopped else unfit(parse_case(case), world, setup)
                if reason:
                    left_out.append(f"{case} ({reason})")
                    continue
                t0 = time.monotonic()
                try:
                    case_rows, latest = [], []
                    for compile_mode in setup.compile_modes:
                        if case_rows and not any(r["error"] for r in latest):
                            break
                        latest = pool.run(run_case, case, tuple(modes), compile_mode, replays, setup,
                                          timeout=CASE_TIMEOUT_S)[0]
                        case_rows += latest
                except Exception as exc:  # noqa: BLE001 - the pool is gone: keep what ran, name the rest
                    console.print(f"[bold red]ws{world} backend_block {case}: {type(exc).__name__}: {exc}[/]")
                    left_out.append(f"{case} (failed: {type(exc).__name__})")
                    status, stopped = 1, True
                    continue
                rows += case_rows
                console.print(f"ws{world} backend_block {case}: {time.monotonic() - t0:.0f} s", highlight=False)
                for r in case_rows:   # (in the log as it goes: a run cut by its timeout still shows them)
                    console.print(f"  {r['mode']:<8} {r['compile_mode']}: {_fmt(r['ms_per_step'], '{:.3f}')} ms/step, "
                                  f"err fp32 {_sci(r['rel_err_fp32'])}, vs ind. {_sci(r['rel_diff_vs_inductor'])}, "
                                  f"first call {_fmt(r['compile_s'], '{:.0f}')} s, "
                                  f"{r['error'] or rewrite_text(r['rewrites'])}", highlight=False)
                    if r.get("profile"):
                        console.print(profile_text(r), highlight=False)
                _write(path, info, world, setup, replays, rows, left_out)
        add_speedups(rows)
        for table in tables(rows, world, setup.args):
            console.print(table)
        for r in rows:
            if r["error"]:
                console.print(f"{r['case']} {r['mode']} ({r['compile_mode']}): {r['error']}", highlight=False)
        if left_out:
            console.print(f"[yellow]left out: {', '.join(left_out)}[/]", highlight=False)
        _write(path, info, world, setup, replays, rows, left_out)
        console.print(f"result written: {path}", highlight=False)
        status |= failed(rows)
    return status


def _write(path, info, world, setup, replays, rows, left_out) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    add_speedups(rows)
    path.write_text(json.dumps({
        "schema": "symmcoll.bench.backend_block/1", "provenance": asdict(info), "world_size": world,
        "model": {"module": "symmcoll.models.dtensor_llama", **asdict(setup.args)}, "dtype": "bf16",
        "setup": {k: v for k, v in asdict(setup).items() if k != "args"}, "replays": replays, "steps": STEPS,
        "tolerance": {"rel_err": TOLERANCE, "token_err": TOKEN_TOLERANCE,
                      "measure": "||update - update_ref|| / ||update_ref|| over the whole update (rel_*) and of the "
                      "worst token's row (token_*), update = block output - input, max over ranks, of the first "
                      "call, a replayed one and the last timed one; ref: the fp32 block (*_fp32), the inductor "
                      "mode (*_vs_inductor)"},
        "timing": TIMING, "compile_s": "wall time of the first call (Dynamo, Inductor with its FX-graph cache "
                                       "off, kernel JIT), slowest rank",
        "rows": rows, "left_out": left_out}, indent=1))


def add_speedups(rows: list[dict]) -> None:
    """x inductor: the inductor row's time over this row's, within one (case, compile mode)."""
    base = {(r["case"], r["compile_mode"]): r["ms_per_step"] for r in rows if r["mode"] == "inductor"}
    for r in rows:
        b = base.get((r["case"], r["compile_mode"]))
        r["speedup_vs_inductor"] = b / r["ms_per_step"] if b and r["ms_per_step"] else None


def failed(rows: list[dict]) -> int:
    """1 if a symmcoll row has an error where the inductor row of its case and compile mode has none."""
    plain_ok = {(r["case"], r["compile_mode"]) for r in rows if r["mode"] == "inductor" and not r["error"]}
    return int(any(r["mode"] == "symmcoll" and r["error"] and (r["case"], r["compile_mode"]) in plain_ok
                   for r in rows))


def profile_text(row: dict, top: int = PROFILE_TOP) -> str:
    """A profiled row in the log: every rank's busy / idle GPU time and host time a step, then rank 0's
    longest GPU activities (us and calls a step, name)."""
    ranks = row["profile"]

    def each(key: str, spec: str) -> str:
        return " / ".join(_fmt(p[key], spec) for p in ranks)
    lines = [f"  profile {row['case']} {row['mode']} ({row['compile_mode']}), a step, ranks 0..{len(ranks) - 1}: "
             f"GPU busy {each('busy_us', '{:.1f}')} us, idle {each('idle_us', '{:.1f}')} us, host "
             f"{each('host_ms', '{:.3f}')} ms; ms/step {_fmt(row['ms_per_step'], '{:.3f}')}; rank 0's longest:"]
    calls = dict(map(tuple, ranks[0]["top_calls"]))
    lines += [f"    {us:9.2f} us {calls.get(name, 0):6.2f}x  {name}" for name, us in ranks[0]["top_kernels"][:top]]
    return "\n".join(lines)


NOTE = 24   # characters of an error in the table (the widest rewrite: "4/4: 2 ag_mm, 2 mm_rs")


def rewrite_text(summary: dict | None) -> str:
    """"4/4: 2 ag_mm, 2 mm_rs": collectives rewritten of those seen, and into what (SHORT names)."""
    if summary is None:
        return "-"
    if not summary["collectives"]:
        return "0/0 (no collective)"
    into = ", ".join(f"{n} {SHORT.get(op, op)}" for op, n in sorted(summary["into"].items()))
    return f"{summary['rewritten']}/{summary['collectives']}" + (f": {into}" if into else "")


def tables(rows: list[dict], world: int, args: ModelArgs) -> list:
    """One table per compile mode, laid out for 120 columns."""
    from rich import box
    from rich.table import Table

    out = []
    for compile_mode in COMPILE_MODES:
        mine = [r for r in rows if r["compile_mode"] == compile_mode]
        if not mine:
            continue
        table = Table(
            title=f"backend_block: DTensor Llama block (hidden {args.dim}, {args.n_heads}/{args.n_kv_heads} heads, ffn "
                  f"{args.ffn_dim}), world size {world}, bf16, torch.compile(mode={compile_mode!r}), "
                  f"{TIMING[compile_mode]}: ms per step (slowest rank)",
            caption="x ind.: inductor's time / this row's; err fp32: relative error of the block's update against "
                    "the fp32 block; vs ind.: against the inductor mode's; comp. s: first call, compile cold; "
                    "rewrites: collectives rewritten/seen by symmcoll.backend, into " +
                    ", ".join(f"{v} {k}" for k, v in SHORT.items()),
            box=box.SIMPLE_HEAD, show_edge=False, title_justify="left", caption_justify="left", pad_edge=False)
        for name in ("case", "mode", "ms/step", "tokens/s", "x ind.", "err fp32", "vs ind.", "comp. s",
                     "rewrites / error"):
            table.add_column(name, justify="left" if name in ("case", "mode", "rewrites / error") else "right",
                             no_wrap=True)
        for r in mine:   # (errors in full below the table)
            note = re.sub(r"^rank \d+: ", "", r["error"])[:NOTE] if r["error"] else rewrite_text(r["rewrites"])
            table.add_row(r["case"], r["mode"], _fmt(r["ms_per_step"], "{:.3f}"), _fmt(r["tokens_per_s"], "{:,.0f}"),
                          _fmt(r.get("speedup_vs_inductor"), "{:.3f}"), _sci(r["rel_err_fp32"]),
                          _sci(r["rel_diff_vs_inductor"]), _fmt(r["compile_s"], "{:.0f}"), note)
        out.append(table)
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else spec.format(value)


def _sci(value) -> str:
    """2.2e-2 (the table's width has no room for 2.2e-02)."""
    return "-" if value is None else re.sub(r"e([+-])0(\d)$", r"e\1\2", f"{value:.1e}")
