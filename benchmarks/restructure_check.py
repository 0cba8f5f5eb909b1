"""Nothing slower (issue 25, point 6): the same ops before and after a change, side by side, in one GPU call.

    git archive --prefix=old_main/ <commit before> src | tar x      # on this machine, then carry old_main
    PYTHONPATH=src python3 benchmarks/restructure_check.py --old-src old_main/src --out $OUT/restructure.json
    (--new-src new_main/src: the tree after, if not this one: a change measured without the ones after it)

Each part runs once per tree in a process of its own (this tree, then the one at ``--old-src`` with its
src first on PYTHONPATH), and again, alternating, while the deadline allows (drift between rounds shows
as spread). The workers use only what both trees have: the public functions, ``launch.run``,
``bench.checks.rank_coded`` and ``bench.timing``'s CapturedCalls / time_graph / time_eager /
host_time_us / graph_us (the one timing code of each tree).

collectives  world size 2, both ranks on GPU 0 ("cuda-shared"): all_reduce (auto, sentinel_one_shot,
             one_shot, two_shot), all_reduce_ (in place), reduce_scatter, all_gather, broadcast, all_to_all
             at 4 KB, 256 KB and 4 MB per rank, and matmul_all_reduce / all_reduce_rms_norm at decode
             sizes; bf16. The result is checked exactly (rank-coded values) first. Per call: host us (CPU
             time of an eager call queued on an idle GPU: what a host-side restructure could slow down),
             eager us and graph us (GPU time; two processes time-slice one GPU, so only the comparison
             between the trees in one run means anything).
fused        world size 1, one process: matmul_reduce_scatter (fused), matmul_all_reduce (one_shot,
             two_shot), all_gather_matmul (fused, auto), all_reduce_rms_norm (one_shot, two_shot) at
             decode and prefill sizes of Llama-70B TP8 layers, B contiguous and (``b=W.t``) given as
             nn.Linear's transposed weight (read in place; a tree that refuses it says so in the row);
             each checked against the fp32 product first. Per call: graph us (median of CUDA-graph
             replays) and host us.

The table: every case, new and old side by side (median over rounds) and new / old; the last lines list
the cases where new is more than 5% slower (host us, graph us). Exit 1 if a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

SIZES = (4 << 10, 256 << 10, 4 << 20)
# RESTRUCTURE_SIZES="4096,4194304": fewer collective sizes, so that several rounds (the spread between
# them is the noise) fit one call.
if os.environ.get("RESTRUCTURE_SIZES"):
    SIZES = tuple(int(v) for v in os.environ["RESTRUCTURE_SIZES"].split(","))
COLLECTIVES = (("all_reduce", "auto"), ("all_reduce", "sentinel_one_shot"), ("all_reduce", "one_shot"),
               ("all_reduce", "two_shot"), ("all_reduce_", "auto"), ("reduce_scatter", "auto"),
               ("all_gather", "auto"), ("broadcast", "auto"), ("all_to_all", "auto"))
# (op, algorithm, shape): matmuls (M, N, K) of Llama-70B TP8 (w2: K 28672/8, N 8192; qkv: N 10240/8, K 8192);
# all_reduce_rms_norm (tokens, hidden).
FUSED = (("matmul_reduce_scatter", "fused", (16, 8192, 3584)), ("matmul_reduce_scatter", "fused", (2048, 8192, 3584)),
         ("matmul_all_reduce", "one_shot", (16, 8192, 3584)), ("matmul_all_reduce", "two_shot", (2048, 8192, 3584)),
         ("all_gather_matmul", "fused", (16, 1280, 8192)), ("all_gather_matmul", "fused", (2048, 1280, 8192)),
         ("all_gather_matmul", "auto", (2048, 1280, 8192)),
         ("all_reduce_rms_norm", "one_shot", (16, 8192)), ("all_reduce_rms_norm", "two_shot", (4096, 8192)))
SMALL_FUSED = (("matmul_all_reduce", "one_shot", (16, 1024, 1024)), ("all_reduce_rms_norm", "one_shot", (16, 8192)))
TOLERANCE = 2e-2
# RESTRUCTURE_SMOKE=1: the harness on CPU ranks (interpreted kernels, tiny cases, one timed call each):
# a check that this script works, not a measurement.
SMOKE = os.environ.get("RESTRUCTURE_SMOKE") == "1"
if SMOKE:
    SIZES = (512,)
    FUSED = (("matmul_reduce_scatter", "fused", (16, 48, 32)), ("matmul_all_reduce", "one_shot", (16, 48, 32)),
             ("all_gather_matmul", "fused", (16, 48, 32)), ("all_reduce_rms_norm", "one_shot", (4, 64)))
    SMALL_FUSED = (("matmul_all_reduce", "one_shot", (8, 48, 32)),)
DEVICE = "cpu" if SMOKE else "cuda"


def _device():
    return torch.device("cpu") if SMOKE else torch.device("cuda", 0)


def _smoke_us(call) -> float:
    t0 = time.perf_counter()
    call()
    return (time.perf_counter() - t0) * 1e6


# ---- rank side (runs under either tree) -------------------------------------------------------------------

def _plan(graph_calls: int):
    from symmcoll.bench.plan import TimingPlan
    return TimingPlan(mode="graph", warmup=3, iters=30, min_iters=5, calls_per_graph=graph_calls, seconds_per_case=0.4)


def _collective_case(op, algorithm, nbytes, rank, world, dev):
    import symmcoll
    from symmcoll.bench.checks import rank_coded
    numel = nbytes // 2
    x_of = lambda r, call=0: rank_coded(numel, torch.bfloat16, r, call, dev)
    xs = [x_of(r) for r in range(world)]
    total = sum(x.float() for x in xs).to(torch.bfloat16)
    x = xs[rank].clone()
    if op == "all_reduce":
        return (lambda: symmcoll.all_reduce(x, algorithm=algorithm)), total
    if op == "all_reduce_":
        return (lambda: symmcoll.all_reduce_(x.copy_(xs[rank]), algorithm=algorithm)), total
    if op == "reduce_scatter":
        return (lambda: symmcoll.reduce_scatter(x, algorithm=algorithm)), total.chunk(world)[rank]
    if op == "all_gather":
        return (lambda: symmcoll.all_gather(x, algorithm=algorithm)), torch.cat(xs)
    if op == "broadcast":
        return (lambda: symmcoll.broadcast(x, 0, algorithm=algorithm)), xs[0]
    return (lambda: symmcoll.all_to_all(x, algorithm=algorithm)), torch.cat([t.chunk(world)[rank] for t in xs])


def _fused_inputs(op, shape, world, rank, dev, transposed):
    """(call(algorithm), fp32 reference) of a fused op; B (or W) the same on every rank."""
    import symmcoll
    g = torch.Generator(device=dev).manual_seed(11 + rank)
    gw = torch.Generator(device=dev).manual_seed(7)
    randn = lambda *s, gen=g: torch.randn(*s, generator=gen, device=dev).to(torch.bfloat16)
    if op == "all_reduce_rms_norm":
        tokens, hidden = shape
        x = randn(tokens, hidden, gen=torch.Generator(device=dev).manual_seed(5))   # the same on every rank
        residual, weight = randn(tokens, hidden, gen=gw), randn(hidden, gen=gw)
        return (lambda a: symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-5, algorithm=a)[0]), \
            _rms_reference(x, residual, weight, world)
    m, n, k = shape
    w = randn(n, k, gen=gw) / k ** 0.5                      # nn.Linear's weight [N, K]
    b = w.t() if transposed else w.t().contiguous()
    if op == "all_gather_matmul":
        a = randn(m // world, k, gen=torch.Generator(device=dev).manual_seed(3))   # the same shard on every rank
        want = torch.cat([a.float()] * world) @ b.float()
        return (lambda alg: symmcoll.all_gather_matmul(a, b, algorithm=alg)), want
    a = randn(m, k, gen=torch.Generator(device=dev).manual_seed(3))             # the same A on every rank
    product = world * (a.float() @ b.float())
    if op == "matmul_reduce_scatter":
        return (lambda alg: symmcoll.matmul_reduce_scatter(a, b, algorithm=alg)), product.chunk(world)[rank]
    return (lambda alg: symmcoll.matmul_all_reduce(a, b, algorithm=alg)), product


def _rms_reference(x, residual, weight, world):
    total = (x.float() * world).to(torch.bfloat16).float()
    new_residual = (residual.float() + total).to(torch.bfloat16).float()
    return new_residual * torch.rsqrt(new_residual.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()


def _rel(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def _timed_collective(call, group, row):
    if SMOKE:
        row["host_us"] = _smoke_us(call)
        return
    from symmcoll.bench.timing import CapturedCalls, time_eager, time_graph
    eager = time_eager(call, _plan(1), group)   # with the host time of an eager call (host_time_us)
    row["host_us"], row["eager_us"] = eager.host_us, statistics.median(eager.samples_us)
    captured = CapturedCalls(call, 10)
    row["graph_us"] = statistics.median(time_graph(captured, _plan(10), group).samples_us)


def collectives_worker(tree: str, round_: int):
    import symmcoll
    rank, world, dev = dist.get_rank(), dist.get_world_size(), _device()
    group = dist.group.WORLD
    rows = []
    cases = [(op, alg, nbytes, None) for op, alg in COLLECTIVES for nbytes in SIZES]
    cases += [(op, alg, None, shape) for op, alg, shape in SMALL_FUSED]
    for op, algorithm, nbytes, shape in cases:
        row = {"part": "collectives", "tree": tree, "round": round_, "op": op, "algorithm": algorithm,
               "case": f"{nbytes >> 10} KB" if nbytes else "x".join(map(str, shape))}
        try:
            if shape is None:
                call, want = _collective_case(op, algorithm, nbytes, rank, world, dev)
                got = call().clone() if op != "all_reduce_" else call()
                row["wrong"] = int((got != want).sum())
            else:
                run, want = _fused_inputs(op, shape, world, rank, dev, False)
                call = lambda run=run, a=algorithm: run(a)
                row["rel_err"] = _rel(call(), want)
                row["wrong"] = int(row["rel_err"] > TOLERANCE)
            _timed_collective(call, group, row)
        except Exception as exc:  # noqa: BLE001 - reported in the row; the others go on
            row["error"] = f"rank {rank}: {type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        errors = [None] * world
        dist.all_gather_object(errors, row.get("error"))
        if any(errors):
            symmcoll.reset()  # together (collective)
    return rows


def fused_worker(tree: str, round_: int):
    import symmcoll
    from symmcoll.bench.timing import graph_us, host_time_us
    dev = _device()
    rows = []
    for op, algorithm, shape in FUSED:
        for transposed in ((False, True) if op != "all_reduce_rms_norm" else (False,)):
            row = {"part": "fused", "tree": tree, "round": round_, "op": op, "algorithm": algorithm,
                   "case": "x".join(map(str, shape)) + (" b=W.t" if transposed else "")}
            try:
                run, want = _fused_inputs(op, shape, 1, 0, dev, transposed)
                call = lambda run=run, a=algorithm: run(a)
                row["rel_err"] = _rel(call(), want)
                row["wrong"] = int(row["rel_err"] > TOLERANCE)
                if SMOKE:
                    row["host_us"] = _smoke_us(call)
                else:
                    row["graph_us"] = statistics.median(graph_us([call], 10))
                    row["host_us"] = host_time_us(call, dist.group.WORLD)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                symmcoll.reset()
            rows.append(row)
            if not SMOKE:
                torch.cuda.empty_cache()
    return rows


def worker_main(part: str, tree: str, round_: int, out: str):
    from symmcoll import launch
    if part == "collectives":
        per_rank = launch.run(collectives_worker, 2, tree, round_, device="cpu" if SMOKE else "cuda-shared",
                              timeout=400)
        rows = [dict(r, host_us_rank1=r1.get("host_us")) for r, r1 in zip(per_rank[0], per_rank[1])]
    else:
        rows = launch.run(fused_worker, 1, tree, round_, device=DEVICE, timeout=400)[0]
    with open(out, "w") as f:
        json.dump(rows, f)


# ---- parent ------------------------------------------------------------------------------------------------

def _run_part(part, tree, src, round_, out, remaining):
    path = f"{out}.{part}.{tree}.{round_}.json"
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", part, "--tree", tree, "--round", str(round_),
           "--out", path]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(30, remaining))
        note = None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr[-600:]}"
    except subprocess.TimeoutExpired:
        note = "timed out"
    seconds = time.monotonic() - t0
    try:
        with open(path) as f:
            rows = json.load(f)
    except (OSError, ValueError):
        rows = []
    print(f"{part} {tree} round {round_}: {len(rows)} rows in {seconds:.0f} s{'; ' + note if note else ''}",
          flush=True)
    return rows, seconds, note


def _median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def table(rows) -> tuple[list[str], list[str], bool, int]:
    """(lines, slower cases, any check failed, cases timed on one tree only)."""
    keys = []
    for r in rows:
        key = (r["part"], r["op"], r["algorithm"], r["case"])
        if key not in keys:
            keys.append(key)
    lines = [f"{'part':<12}{'op':<23}{'algorithm':<18}{'case':<22}{'host new':>9}{'old':>8}{'x':>6}"
             f"{'graph new':>10}{'old':>8}{'x':>6}{'eager new':>10}{'old':>8}  check"]
    slower, failed, one_sided = [], False, 0
    for key in keys:
        mine = {t: [r for r in rows if (r["part"], r["op"], r["algorithm"], r["case"]) == key and r["tree"] == t]
                for t in ("new", "old")}
        cells = []
        for metric in ("host_us", "graph_us", "eager_us"):
            new, old = _median(mine["new"], metric), _median(mine["old"], metric)
            ratio = new / old if new and old else None
            if ratio and ratio > 1.05 and metric != "eager_us":
                slower.append(f"{' '.join(key)}: {metric} {new:.2f} vs {old:.2f} (x{ratio:.2f})")
            fmt = lambda v: f"{v:.2f}" if v is not None else "-"
            cells.append((fmt(new), fmt(old), f"{ratio:.2f}" if ratio else "-"))
        one_sided += int(not any(_median(mine[t], m) for t in ("new",) for m in ("host_us", "graph_us"))
                         or not any(_median(mine[t], m) for t in ("old",) for m in ("host_us", "graph_us")))
        errors = [r.get("error") for r in mine["new"] + mine["old"] if r.get("error")]
        wrong = sum(r.get("wrong", 0) for r in mine["new"] + mine["old"])
        new_error = any(r.get("error") for r in mine["new"])
        failed |= bool(wrong) or new_error
        check = "ok" if not errors and not wrong else (f"wrong {wrong}" if wrong else "") + \
            "; ".join(f"{r['tree']}: {r['error'][:70]}" for r in mine["new"] + mine["old"] if r.get("error"))
        (h, g, e) = cells
        lines.append(f"{key[0]:<12}{key[1]:<23}{key[2]:<18}{key[3]:<22}{h[0]:>9}{h[1]:>8}{h[2]:>6}"
                     f"{g[0]:>10}{g[1]:>8}{g[2]:>6}{e[0]:>10}{e[1]:>8}  {check}")
    return lines, slower, failed, one_sided


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="restructure.json")
    parser.add_argument("--old-src", default=None, help="src/ of the tree before the change")
    parser.add_argument("--new-src", default=None, help="src/ of the tree after the change (default: this tree's)")
    parser.add_argument("--parts", nargs="+", default=["collectives", "fused"])
    parser.add_argument("--deadline", type=float, default=440.0, help="seconds for the whole run")
    parser.add_argument("--worker", default=None)
    parser.add_argument("--tree", default="new")
    parser.add_argument("--round", type=int, default=0)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.worker, args.tree, args.round, args.out)
    start = time.monotonic()
    here = args.new_src or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    trees = [("new", here)] + ([("old", args.old_src)] if args.old_src else [])
    rows, notes, round_ = [], [], 0
    while True:
        longest = 0.0
        for part in args.parts:
            for tree, src in trees:
                remaining = args.deadline - (time.monotonic() - start)
                if round_ and remaining < 1.3 * longest:
                    break
                got, seconds, note = _run_part(part, tree, src, round_, args.out, remaining - 5)
                rows += got
                longest = max(longest, seconds)
                if note:
                    notes.append(f"{part} {tree} round {round_}: {note}")
        round_ += 1
        remaining = args.deadline - (time.monotonic() - start)
        if remaining < 1.3 * longest * len(args.parts) * len(trees) or round_ >= 4:
            break
    lines, slower, failed, one_sided = table(rows)
    print("\n".join(lines))
    print(f"rounds: {round_}; {time.monotonic() - start:.0f} s")
    if one_sided:
        print(f"NOT COMPARED: {one_sided} of {len(lines) - 1} cases were timed on one tree only")
    print("new > 5% slower than old:" if slower else "new within 5% of old (host us, graph us) in every case "
          "timed on both trees")
    for line in slower:
        print("  " + line)
    for note in notes:
        print("note: " + note)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "table": lines, "slower": slower, "notes": notes,
                   "sha": os.environ.get("SYMMCOLL_GIT_SHA")}, f, indent=1)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
