"""Two wrong answers of issue 24's GPU stage, run 1 (one H200, two ranks sharing it), made many times:

  A. all_reduce_rms_norm one_shot, fp8_per_tensor, bf16 [5, 18]: rank 1's new residual of row 1 was
     residual + rank 0's x (rank 1's own x missing), 15 of 90 values.
  B. all_reduce sentinel_two_shot, fp32 min, shape (1, 3), the first call after a reset (fresh
     workspace): rank 1 got [-4, 0, 0] for [-4, -1, -2] (words 1 and 2 read as 0: the gather slots
     are EMPTY until written, so 0 is neither the peer's word nor a slot's content).

Neither happens on CPU ranks (tests/test_special_values.py, tests/random_calls.py --only 259
--without-process-group). Here: every barrier-free reduction kernel (sentinel one/two-shot, the
reduce-scatter, rms one/two-shot with every quant, the quantized kernel) over small shapes, fresh data
each trial, a reset every ``RESET_EVERY`` trials (fresh regions, as in B), and in every other trial one
rank starting each call ``LATE_S`` after the other (``late``: as rank 1 did in A and B while it compiled
a kernel that rank 0 had compiled and launched: the peer's data is there before the first poll), each
output compared bit for bit with the reference; a wrong element is classified against what a lost contribution would give
("own lost": the peers' sum only, "peer lost": my own value only, "zero", "other"), so one GPU run says
which side went missing and where (rank, trial, first call of a kernel or not).

    PYTHONPATH=src python3 benchmarks/semantics_races.py --out $OUT/semantics_races.json --deadline 90
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

RESET_EVERY = 7
LATE_S = 0.02
SHAPES_B = ((1, 3), (3,), (1,), (7,), (5, 2), (33,))


def _classify(got, want, own, peers_only):
    """Names of what each wrong element of flat fp32 ``got`` equals."""
    kinds = []
    for g, w, o, p in zip(got.tolist(), want.tolist(), own.tolist(), peers_only.tolist()):
        if g == w or (g != g and w != w):
            continue
        kinds.append("own lost" if g == p else "peer lost" if g == o else "zero" if g == 0 else "other")
    return kinds


def _report(failures, what, trial, first, got, want, own, peers_only, late=None):
    g, w = got.float().reshape(-1).cpu(), want.float().reshape(-1).cpu()
    bad = ~((g == w) | (g.isnan() & w.isnan()))
    if not bool(bad.any()):
        return
    idx = bad.nonzero().reshape(-1)
    kinds = _classify(g[idx], w[idx], own.float().reshape(-1).cpu()[idx], peers_only.float().reshape(-1).cpu()[idx])
    failures.append(dict(rank=dist.get_rank(), what=what, trial=trial, first_call=first, late_rank=late,
                         wrong=int(idx.numel()),
                         of=int(g.numel()), first_index=int(idx[0]), got=g[idx[:6]].tolist(), want=w[idx[:6]].tolist(),
                         kinds={k: kinds.count(k) for k in set(kinds)}))


def _trials(deadline_s: float, world_check: int = 2) -> dict:
    import symmcoll
    from symmcoll import reference
    from symmcoll.comm.quantized import size_threshold
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == world_check
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    failures, seen, counts = [], set(), {}
    t0 = time.monotonic()
    trial = 0
    while True:
        # Every rank stops at the same trial: rank 0's clock decides.
        go = torch.tensor([int(time.monotonic() - t0 < deadline_s)])
        dist.broadcast(go, 0)
        if not go.item():
            break
        if trial % RESET_EVERY == 0:
            symmcoll.reset()
        late = {1: 1, 3: 0}.get(trial % 4)  # the rank that starts every call of this trial late, if any

        def start():
            if late == rank:
                time.sleep(LATE_S)
        # A: the fused rms kernels, the special-values inputs shifted by the trial.
        x = ((torch.arange(5 * 18, device=dev).reshape(5, 18) + trial) % 5 - 2 + rank).to(torch.bfloat16)
        residual = torch.ones_like(x)
        weight = torch.full((18,), 0.5, dtype=torch.bfloat16, device=dev)
        every = reference.stacked(x).float()
        own, total = x.float(), every.sum(0)
        for algorithm in ("one_shot", "two_shot"):
            for quant in (None, "fp8_per_token", "fp8_per_tensor"):
                extra = dict(scale=torch.full((1,), 0.25, device=dev)) if quant == "fp8_per_tensor" else {}
                start()
                got = symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6, algorithm=algorithm, quant=quant, **extra)
                sync()
                what = f"rms {algorithm} {quant}"
                want = (residual.float() + total).to(torch.bfloat16)
                _report(failures, what + " new residual", trial, what not in seen, got[1], want,
                        (residual.float() + own).to(torch.bfloat16),
                        (residual.float() + total - own).to(torch.bfloat16), late)
                seen.add(what)
                counts[what] = counts.get(what, 0) + 1
        # B: the sentinel reductions over small shapes (and the quantized kernel, forced).
        for shape in SHAPES_B:
            g = torch.Generator().manual_seed(1000 * trial + 17 * rank + len(shape))
            xs = torch.randint(-4, 5, shape, generator=g).float().to(dev)
            every = reference.stacked(xs).float()
            for algorithm in ("sentinel_one_shot", "sentinel_two_shot"):
                for op in ("sum", "min", "max"):
                    start()
                    got = symmcoll.all_reduce(xs, op=op, algorithm=algorithm)
                    sync()
                    want = reference.reduce_stacked(every, op)
                    others = torch.cat([every[:rank], every[rank + 1:]])
                    peers_only = reference.reduce_stacked(others, op)
                    what = f"all_reduce {algorithm} {op} {shape}"
                    _report(failures, what, trial, what not in seen, got, want, xs, peers_only, late)
                    seen.add(what)
                    counts[what] = counts.get(what, 0) + 1
            if shape[0] % world == 0 and len(shape) == 2:
                start()
                got = symmcoll.reduce_scatter(xs, op="sum", algorithm="sentinel")
                sync()
                rows = shape[0] // world
                want = every.sum(0)[rank * rows:(rank + 1) * rows]
                what = f"reduce_scatter sentinel sum {shape}"
                _report(failures, what, trial, what not in seen, got, want, xs[rank * rows:(rank + 1) * rows],
                        (every.sum(0) - xs)[rank * rows:(rank + 1) * rows], late)
                seen.add(what)
        with size_threshold(0):
            q = torch.randint(-4, 5, (300,), generator=torch.Generator().manual_seed(trial * 7 + rank)).float().to(dev)
            start()
            got = symmcoll.all_reduce(q, quantize="int8", group_size=32)
            want = reference.all_reduce_quantized(q, None, "sum", "int8", 32)
            _report(failures, "quantized int8", trial, trial == 0, got, want, q, want - q, late)
        symmcoll.check()
        trial += 1
    return dict(trials=trial, failures=failures, calls=sum(counts.values()), seconds=round(time.monotonic() - t0, 1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline", type=float, default=90.0, help="seconds of trials (compiles included)")
    parser.add_argument("--device", default="cuda-shared", help="cuda-shared (the GPU stage) or cpu (a smoke run)")
    args = parser.parse_args(argv)
    from symmcoll import launch
    from symmcoll.bench import provenance
    results = launch.run(_trials, 2, args.deadline, device=args.device, timeout=args.deadline + 300)
    failures = [f for r in results for f in r["failures"]]
    out = dict(provenance=asdict(provenance.collect("cpu" if args.device == "cpu" else "cuda")), trials=results[0]["trials"],
               calls_per_rank=results[0]["calls"], seconds=results[0]["seconds"], failures=failures)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{out['trials']} trials, {out['calls_per_rank']} calls per rank, {out['seconds']} s: "
          f"{len(failures)} wrong outputs")
    for f in failures[:20]:
        print(f"  rank {f['rank']} trial {f['trial']}{' (first call)' if f['first_call'] else ''}"
              f"{'' if f['late_rank'] is None else ' (rank %d late)' % f['late_rank']}: {f['what']}: "
              f"{f['wrong']} of {f['of']} wrong from index {f['first_index']}: got {f['got']}, want {f['want']}; "
              f"{f['kinds']}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
