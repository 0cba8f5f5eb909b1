"""Scale-out checks of the hierarchical algorithms on one machine: emulated nodes, exact results, every phase
of every rank written down as it happens and bounded, so that a run cut short still says what happened.

    PYTHONPATH=src python3 benchmarks/scaleout_check.py --out $OUT/scaleout.json             # one GPU
    PYTHONPATH=src python3 benchmarks/scaleout_check.py --multi-gpu --out $OUT/scaleout_multi.json
    PYTHONPATH=src python3 benchmarks/scaleout_check.py --cpu --out /tmp/scaleout.json      # this script, on CPU

One GPU (scripts/gpu_check.sh scaleout):
1. NVSHMEM kernels: every exchange mode compiled for sm_90 against the image's NVSHMEM device library
   (what CI does on CPU with the nvidia-nvshmem-cu13 wheel), then *loaded* on this GPU (a CUDA module per
   kernel: registers and shared memory fit, the NVSHMEM symbols resolve). Not run: torch's NVSHMEM
   backend refuses a one-rank rendezvous, and two ranks cannot share one GPU under it.
2. The hierarchical algorithms with emulated nodes on the GPU: ranks share GPU 0 (CUDA IPC, launch device
   "cuda-shared"), SYMMCOLL_RANKS_PER_NODE splits them into nodes, and the transport is the emulated one
   (stores through its own table, release/acquire signals at system scope) compiled for sm_90: real GPU
   memory ordering across processes for every collective, exact on rank-coded data, fresh data on repeated
   calls, MoE dispatch + combine round trips; 2 nodes x 2 and 2 nodes x 1. Correctness only.

``--multi-gpu`` (issue 28 point 7; scripts/gpu_check.sh scaleout-multi on >= 2 GPUs): one rank per GPU and
the NVSHMEM transport between emulated nodes of this host, the same exact checks, configurations cheapest
first: 2 GPUs as 2 nodes of 1, then all GPUs as 2 nodes, then as nodes of 1 (``--configs`` overrides).
No compile check (the one-GPU stage has it). The stage then runs `symmcoll bench` under
SYMMCOLL_RANKS_PER_NODE when a multi-GPU all_reduce came out exact.

Bounded in time: ``--budget-s`` is shared out among the configurations (what one leaves is the next's);
inside one, the ranks agree before each case whether to go on (benchmarks/scaleout_cases.py), and every
phase of every rank has a limit past which it dumps its stacks and ends. Each rank's journal
(``<out>.journal/<config>-rank<r>.jsonl``) and the result file are written as things happen, and the
result file again after each configuration: a SIGTERM (the stage's ``timeout``) or a kill keeps what ran,
and a rank that hung is named with the phase it hung in.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import traceback

import torch

from symmcoll import launch

import scaleout_journal
from scaleout_cases import Limits, RankPlan, cases_for, nodes

# A configuration is started only with at least this much of the budget left (ranks' start, NVSHMEM's
# initialisation and one case with its compiles).
MIN_CONFIG_S = 45.0


def compile_and_load() -> list[dict]:
    """Compile each exchange mode over NVSHMEM for sm_90 and load it into a CUDA module here."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from symmcoll.comm import exchange
    from symmcoll.memory.transport import nvshmem_library

    library = nvshmem_library()
    rows = [{"check": "nvshmem_library", "path": library}]
    if library is None:
        rows[0]["error"] = "no libnvshmem_device.bc (NVSHMEM_LIB_DIR, or the nvidia-nvshmem wheel)"
        return rows
    for mode, dtype, ranks_per_node in (("all_reduce", "bf16", 8), ("reduce", "fp32", 8), ("gather", "i16", 1),
                                        ("get_gather", "i64", 2)):
        t0 = time.monotonic()
        row = {"check": "nvshmem_compile_load", "mode": mode, "dtype": dtype}
        try:
            signature = {p.name: "i32" for p in exchange.exchange_kernel.params if not p.is_constexpr}
            signature.update({"signal_pad_ptrs_dev": "i64", "status_ptr": "i64", "transport_ptrs_dev": "i64",
                              "epochs_ptr": "*i32", "signals_ptr": "*i64", "slots_ptr": f"*{dtype}",
                              "stage_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "ranks_per_node": "i32"})
            constexprs = {"NODES": 2, "MODE": exchange.MODES[mode], "REDUCE_OP": 0, "BLOCK": 4096, "TRANSPORT": 1}
            signature.update({k: "constexpr" for k in constexprs})
            compiled = triton.compile(ASTSource(exchange.exchange_kernel, signature, constexprs),
                                      target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 16, "extern_libs": (("libnvshmem_device", library),)})
            row["compile_s"] = round(time.monotonic() - t0, 1)
            row["shared_bytes"] = compiled.metadata.shared
            if torch.cuda.is_available():
                compiled._init_handles()  # cuModuleLoadData + cuModuleGetFunction on this GPU
                row.update(loaded=compiled.function is not None, registers=getattr(compiled, "n_regs", None),
                           spills=getattr(compiled, "n_spills", None))
        except Exception:  # noqa: BLE001 - report and go on with the next mode
            row["error"] = traceback.format_exc()[-1500:]
        rows.append(row)
    return rows


class Stopped(BaseException):
    """SIGTERM (the stage's timeout): stop starting anything, keep what ran."""


def _on_sigterm(signum, frame):
    raise Stopped()


def default_configs(mode: str, gpus: int) -> list[tuple[int, int, str]]:
    """(nodes, ranks per node, launch device) to run, cheapest and most decisive first."""
    if mode == "cpu":
        return [(2, 1, "cpu")]
    if mode == "shared":  # ranks sharing GPU 0: the emulated transport, compiled for sm_90
        return [(2, 2, "cuda-shared"), (2, 1, "cuda-shared")]
    configs = [(2, 1, "cuda")] if gpus >= 2 else []
    for layout in ((2, gpus // 2), (gpus, 1)):
        if gpus >= 4 and layout not in [c[:2] for c in configs]:
            configs.append((*layout, "cuda"))
    return configs


def _say(t0: float, text: str) -> None:
    scaleout_journal.emit(f"[{time.time() - t0:7.1f} s] {text}")


def run_config(index: int, label: str, nodes_n: int, per_node: int, device: str, t0: float, deadline: float,
               end: float, limits: Limits, journal_dir: str, inject: tuple,
               first_cases: int | None = None) -> tuple[list[dict], bool]:
    """One configuration in fresh rank processes: its rows (from the ranks' journals, whatever happened to
    the ranks) and whether a SIGTERM stopped it. ``first_cases``: only that many of the configuration's cases."""
    world = nodes_n * per_node
    base = {"check": "nodes", "config": label, "nodes": nodes_n, "per_node": per_node, "device": device}
    rpl = RankPlan(label, journal_dir, t0, deadline, cases_for(world, device != "cpu")[:first_cases], limits,
                   tuple((kind, rank, case) for config, kind, rank, case in inject if config == index))
    pool, outcome, stopped, ready_s = None, "finished", False, None
    started = time.time()
    _say(t0, f"{device} {label}: {nodes_n} nodes x {per_node}, {world} rank processes starting; "
             f"{len(rpl.cases)} cases, none started after {deadline - t0:.0f} s")
    try:
        pool = launch.RankPool(world, device=device, start_timeout=max(10.0, min(120.0, end - time.time())))
        ready_s = round(time.time() - started, 1)
        _say(t0, f"{device} {label}: ranks up, process group made, in {ready_s} s")
        # The ranks stop by themselves at the deadline; past this the launcher kills them (a last case
        # started before the deadline may need its phases' limits).
        timeout = max(deadline - time.time(), 0.0) + limits.init_s + limits.first_call_s + 2 * limits.sync_s
        pool.run(nodes, per_node, rpl, timeout=max(5.0, min(timeout, end + 20.0 - time.time())))
    except Stopped:
        outcome, stopped = "stopped by SIGTERM (the stage's time limit)", True
    except launch.LaunchTimeout as exc:
        outcome = f"the check killed the ranks: {exc}"
    except launch.RankError as exc:
        last = {r: (text.strip().splitlines() or ["?"])[-1][:300] for r, text in sorted(exc.failures.items())}
        outcome = f"rank failure: {last}" + (f"; ranks {exc.unfinished} killed" if exc.unfinished else "")
    except Exception:  # noqa: BLE001
        outcome = f"launch error: {traceback.format_exc()[-1500:]}"
    finally:
        if pool is not None:  # killed, not asked to exit: a rank's exit with NVSHMEM up could itself wait
            pool.close(force=True)
    rows = scaleout_journal.summarize(journal_dir, label, world, base, outcome)
    rows[-1]["ranks_up_s"] = ready_s
    cases = [r for r in rows if r["op"] not in ("phase", "phases", "left_out")]
    exact = sum(1 for r in cases if not r.get("wrong") and not r.get("error"))
    _say(t0, f"{device} {label}: {len(cases)} cases, {exact} exact, {time.time() - started:.0f} s; {outcome[:300]}")
    for r in rows:
        if r["op"] not in ("phases",):
            scaleout_journal.emit(f"    {scaleout_journal.case_line(r) if r['op'] != 'phase' else r['error'][:400]}")
    return rows, stopped


def write(path: str, info: dict, rows: list[dict]) -> None:
    """The result file, replaced whole (a reader never sees half of it)."""
    configs = {}
    for r in rows:
        if r.get("check") != "nodes":
            continue
        c = configs.setdefault(r["config"], {"cases": 0, "exact": 0, "exact_ops": []})
        if r["op"] == "phases":  # the slowest rank's seconds per phase (initialisation, agreements, resets)
            c.update(outcome=r.get("outcome"), ranks_up_s=r.get("ranks_up_s"), phase_s={
                name: max(times.get(name, 0.0) for times in r["phase_s"].values())
                for name in sorted({n for times in r["phase_s"].values() for n in times})})
        elif r["op"] == "phase":
            c.setdefault("stuck", []).append({"phase": r["stuck_phase"], "ranks": r["stuck_ranks"]})
        elif r["op"] == "left_out":
            c["left_out"] = r.get("note")
        else:
            c["cases"] += 1
            if not r.get("wrong") and not r.get("error"):
                c["exact"] += 1
                c["exact_ops"] = sorted(set(c["exact_ops"]) | {r["op"]})
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"info": info, "summary": configs, "rows": rows}, f, indent=1)
    os.replace(tmp, path)


def _parse_inject(values: list[str]) -> tuple:
    """"fail:CONFIG:RANK:CASE" / "hang:CONFIG:RANK:CASE" -> (config, kind, rank, case) tuples."""
    out = []
    for v in values:
        kind, config, rank, case = v.split(":")
        if kind not in ("fail", "hang"):
            raise SystemExit(f"--inject: kind must be fail or hang, got {kind!r}")
        out.append((int(config), kind, int(rank), int(case)))
    return tuple(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--multi-gpu", action="store_true",
                        help="one rank per GPU, the NVSHMEM transport between emulated nodes of this host")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip the NVSHMEM compile check")
    parser.add_argument("--cpu", action="store_true", help="a check of this script: interpreted ranks, 2 nodes x 1")
    parser.add_argument("--configs", default=None,
                        help="NODESxPER_NODE,... in this order (default: cheapest first for the mode)")
    parser.add_argument("--budget-s", type=float, default=280.0,
                        help="start no configuration or case past this many seconds (the stage: its timeout - 30)")
    parser.add_argument("--phase-limit-s", type=float, default=None,
                        help="one limit for every phase of a rank (default: scaleout_cases.Limits)")
    parser.add_argument("--inject", action="append", default=[], metavar="KIND:CONFIG:RANK:CASE",
                        help="tests of the failure paths: 'fail' (rank fails case alone) or 'hang' (rank hangs in it)")
    parser.add_argument("--cases", type=int, default=None, metavar="N",
                        help="only the first N cases of each configuration (a quick check; default: all)")
    args = parser.parse_args()
    if args.cases is not None and args.cases < 1:
        parser.error(f"--cases must be >= 1, got {args.cases}")
    t0 = time.time()
    end = t0 + args.budget_s
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.environ.setdefault("SYMMCOLL_TIMEOUT_S", "20")
    mode = "multi" if args.multi_gpu else "cpu" if args.cpu else "shared"
    journal_dir = f"{os.path.splitext(args.out)[0]}.journal"
    os.makedirs(journal_dir, exist_ok=True)
    limits = Limits() if args.phase_limit_s is None else Limits(*(args.phase_limit_s,) * 4)
    info = {"git": os.environ.get("SYMMCOLL_GIT_SHA", "unknown"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0, "budget_s": args.budget_s,
            "limits": vars(limits), "symmcoll_timeout_s": os.environ["SYMMCOLL_TIMEOUT_S"], "journals": journal_dir,
            "mode": "hierarchical ops with emulated nodes (correctness only)" +
                    ("" if args.multi_gpu or args.no_compile else "; NVSHMEM compile + load")}
    rows: list[dict] = []
    write(args.out, info, rows)
    if not args.multi_gpu and not args.no_compile:
        rows += compile_and_load()
        for r in rows:
            print(json.dumps(r), flush=True)
        write(args.out, info, rows)
    if args.configs:
        device = {"multi": "cuda", "cpu": "cpu", "shared": "cuda-shared"}[mode]
        configs = [(int(n), int(p), device) for n, p in (c.split("x") for c in args.configs.split(","))]
    else:
        configs = default_configs(mode, info["gpus"])
    labels = [f"{n}x{p}" for n, p, _ in configs]
    labels = [lab if labels.count(lab) == 1 else f"{lab}-{i}" for i, lab in enumerate(labels)]
    info["configs"] = labels
    inject = _parse_inject(args.inject)
    try:
        for i, (nodes_n, per_node, device) in enumerate([] if args.compile_only else configs):
            left = end - time.time()
            if left < min(MIN_CONFIG_S, args.budget_s / 2):
                rows.append({"check": "nodes", "config": labels[i], "op": "left_out", "device": device,
                             "note": f"not started: {left:.0f} s of the budget left"})
                _say(t0, f"{device} {labels[i]}: not started ({left:.0f} s of the budget left)")
                continue
            deadline = time.time() + left / (len(configs) - i)  # an equal share of what is left
            found, stopped = run_config(i, labels[i], nodes_n, per_node, device, t0, deadline, end, limits,
                                        journal_dir, inject, args.cases)
            rows += found
            write(args.out, info, rows)
            if stopped:
                break
    except Stopped:  # between configurations: what ran is already written
        rows.append({"check": "stopped", "error": "SIGTERM (the stage's time limit) between configurations"})
    write(args.out, info, rows)
    with open(args.out) as f:
        summary = json.load(f)["summary"]
    for label, c in summary.items():
        phases = ", ".join(f"{name} {s:.1f} s" for name, s in c.get("phase_s", {}).items())
        print(f"SUMMARY {label}: {c['exact']} of {c['cases']} cases exact ({', '.join(c['exact_ops']) or 'none'}); "
              f"ranks up {c.get('ranks_up_s')} s; {phases}; {c.get('outcome', '')[:200]}"
              + (f"; STUCK {c['stuck']}" if c.get("stuck") else "") + (f"; {c['left_out']}" if c.get("left_out") else ""))
    bad = [r for r in rows if r.get("wrong") or r.get("error")]
    print(f"PROBLEMS ({len(bad)}):")
    for r in bad:
        print(json.dumps(r)[:3000])
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
