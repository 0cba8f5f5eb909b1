"""The inference block's communication tail -- the two ops symmcoll.backend puts there -- run alone, per
call, against answers every rank computes locally, to say which op goes wrong, on which rank, in which
call and how (the GPU stage "backend" runs it; tests/test_compile_backend.py).

    normed, h, _ = symmcoll.all_reduce_rms_norm(x, residual, weight)     (x: this rank's partial sum)
    z = symmcoll.all_reduce(normed @ b)                                  (b: this rank's weight shard)

Calls are queued back to back (results cloned on the stream, checked once all are in). Runs: "eager"
(host code between the calls' kernels), "cuda_graph" (torch.cuda.graph captured
after one eager call, replayed back to back with inputs copied into the captured ones) and
"reduce-overhead" (torch.compile: cudagraph trees' warm-up, record, replays; fresh input tensors per call,
as the block test passes them). Every call's inputs differ, so a stale result shows.

Hidden sizes: the block's 64, where the one-shot kernels poll a [2 peers, 32 words] tile with 128
threads (every word loaded by two warps: a replicated layout, whose copies Triton assumes equal; the
sm_90 code stores both copies to shared memory unpredicated after the volatile polling loads), and
4096, where nothing is replicated: a failure at 64 only points at the replicated polling.

Each wrong row (relative error above ROW_TOLERANCE) is named by what it equals: "own lost" (the other
ranks' contributions only), "peer lost" (this rank's only), "stale" (the previous call's answer),
"zero", "residual only" (h: nothing added), or "other". Besides, ``fresh_memory`` checks what
cudagraph trees assume of a custom op: inputs left as they were, outputs sharing no memory with the
inputs, with each other, with the previous call's outputs or with symmcoll's workspace, and the fake
implementation giving the real outputs' shapes, dtypes and strides.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import memory, ops

EPS = 1e-6
ROW_TOLERANCE = 5e-2
RUNS = ("reduce-overhead", "cuda_graph", "eager")
OUT_FEATURES = 64  # b: [hidden, 64], so that the all_reduce is the block's size whatever the hidden size


def _inputs(call: int, rank: int, world: int, rows: int, hidden: int, dev):
    """(every rank's x, residual, weight, every rank's b) of call ``call``: seeded, the same on every rank."""
    def randn(seed, *shape, scale=1.0):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(*shape, generator=g) * scale).to(dev, torch.bfloat16)
    xs = [randn(1000 + 16 * call + r, rows, hidden) for r in range(world)]
    residual = randn(1000 + 16 * call + 15, rows, hidden)
    weight = randn(7, hidden, scale=0.5) + 1
    bs = [randn(50 + r, hidden, OUT_FEATURES, scale=hidden ** -0.5) for r in range(world)]
    return xs, residual, weight, bs


def _answers(xs, residual, weight, bs, rank):
    """fp32 answers, as the kernels round: (h, normed, z) and each one's wrong-but-recognisable forms."""
    f32 = [x.float() for x in xs]
    total = sum(f32)

    def tail(part):
        h = (residual.float() + part).to(torch.bfloat16).float()
        normed = (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + EPS) * weight.float()).to(torch.bfloat16)
        return h, normed.float()
    h, normed = tail(total)
    products = [(normed.to(torch.bfloat16) @ b).float() for b in bs]
    z = sum(products)
    return {"h": h, "normed": normed, "z": z,
            "own lost": {"h": tail(total - f32[rank])[0], "normed": tail(total - f32[rank])[1],
                         "z": z - products[rank]},
            "peer lost": {"h": tail(f32[rank])[0], "normed": tail(f32[rank])[1], "z": products[rank]},
            "residual only": {"h": residual.float()}}


def _rel(got, want) -> torch.Tensor:
    """Relative error of each row (Frobenius over the last dim)."""
    return (got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)


def classify(got: torch.Tensor, name: str, answers: dict, previous: dict | None) -> dict:
    """{"rel": relative error of the whole tensor, "rows": {what a wrong row equals: count}}."""
    got, want = got.detach().float().cpu(), answers[name].cpu()
    rel = float((got - want).norm() / want.norm().clamp_min(1e-30))
    rows = {}
    for i in torch.nonzero(_rel(got, want) > ROW_TOLERANCE).reshape(-1).tolist():
        candidates = [(k, answers[k][name]) for k in ("own lost", "peer lost", "residual only") if name in answers[k]]
        if previous is not None:
            candidates.append(("stale", previous[name]))
        kind = "zero" if not bool(got[i].any()) else "other"
        for k, value in candidates:
            if float(_rel(got[i], value.cpu()[i])) <= ROW_TOLERANCE:
                kind = k
                break
        rows[kind] = rows.get(kind, 0) + 1
    return {"rel": round(rel, 5), "rows": rows}


def _tail(rms_algorithm: str, ar_algorithm: str, group_name: str):
    def tail(x, residual, weight, b):
        normed, h, _ = torch.ops.symmcoll.all_reduce_rms_norm(x, residual, weight, EPS, group_name, rms_algorithm, "")
        return normed, h, torch.ops.symmcoll.all_reduce(normed @ b, group_name, "sum", ar_algorithm)
    return tail


def norm_tail_run(variants, calls: int = 4, rows: int = 16, deadline_s: float = 240.0) -> list[dict]:
    """On each rank: ``calls`` calls of the tail per (rms algorithm, all_reduce algorithm, run, hidden
    size) in ``variants``; per call, ``classify`` of h, normed and z. Returns one dict per variant; variants not
    started within ``deadline_s`` (failed waits cost SYMMCOLL_TIMEOUT_S each) are returned as skipped."""
    import time
    start = time.monotonic()
    world, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    name = ops.group_name(None)
    out = []
    for rms_algorithm, ar_algorithm, run, hidden in variants:
        if any(_everyone(time.monotonic() - start > deadline_s)):
            out.append({"rms": rms_algorithm, "all_reduce": ar_algorithm, "run": run, "hidden": hidden, "rank": rank,
                        "worst": None, "calls": [], "error": f"skipped: past the {deadline_s:g} s deadline"})
            continue
        tail = _tail(rms_algorithm, ar_algorithm, name)
        graph = static = outputs = None
        if run == "reduce-overhead":
            torch._dynamo.reset()
            tail = torch.compile(tail, mode="reduce-overhead", fullgraph=True)
        per_call, previous, error, results = [], None, None, []
        inputs = [_inputs(call, rank, world, rows, hidden, dev) for call in range(calls)]
        try:
            # Calls are queued back to back (no host synchronisation until every call is in): each
            # result is cloned on the stream before the next call may overwrite it (graph outputs).
            for call, (xs, residual, weight, bs) in enumerate(inputs):
                args = (xs[rank], residual, weight, bs[rank])
                if run == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                    got = tail(*args)
                elif run == "cuda_graph" and graph is not None:
                    for s, a in zip(static, args):
                        s.copy_(a)
                    graph.replay()
                    got = outputs
                else:
                    got = tail(*args)
                    if run == "cuda_graph":  # this first call was eager: capture the next ones
                        static = [a.clone() for a in args]
                        torch.cuda.synchronize()
                        graph = torch.cuda.CUDAGraph()
                        with torch.cuda.graph(graph):
                            outputs = tail(*static)
                results.append([t.clone() for t in got])
            for (xs, residual, weight, bs), got in zip(inputs, results):
                answers = _answers(xs, residual, weight, bs, rank)
                per_call.append({k: classify(v, k, answers, previous) for k, v in zip(("normed", "h", "z"), got)})
                previous = {k: answers[k] for k in ("h", "normed", "z")}
            symmcoll.check()
        except Exception as exc:  # noqa: BLE001 - recorded per variant, every variant runs
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
        if any(_everyone(error)):  # a failed wait breaks the workspace: start afresh
            symmcoll.reset()
        worst = max((c[k]["rel"] for c in per_call for k in c), default=None)
        out.append({"rms": rms_algorithm, "all_reduce": ar_algorithm, "run": run, "hidden": hidden, "rank": rank,
                    "worst": worst,
                    "calls": per_call, "error": error})
        del graph
    return out


def _everyone(value) -> list:
    """``value`` of every rank (collective)."""
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def fresh_memory(rms_algorithm: str, ar_algorithm: str, rows: int = 4, hidden: int = 32) -> list[str]:
    """Two eager calls of the tail on this rank: what cudagraph trees assume of a custom op that does not
    hold (a list of findings, empty when none)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    world, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cpu")
    name = ops.group_name(None)
    tail = _tail(rms_algorithm, ar_algorithm, name)
    findings, kept = [], []

    def span(t):
        start = t.untyped_storage().data_ptr()
        return start, start + t.untyped_storage().nbytes()

    for call in range(2):
        xs, residual, weight, bs = _inputs(call, rank, world, rows, hidden, dev)
        args = (xs[rank], residual, weight, bs[rank])
        before = [a.clone() for a in args]
        outs = tail(*args)
        for label, a, b in zip(("x", "residual", "weight", "b"), args, before):
            if not torch.equal(a, b):
                findings.append(f"call {call}: {label} was written (the schema declares no mutation)")
        held = [(f"workspace {n}", t) for ws in memory.workspaces() for n, r in ws.regions.items()
                for t in [r.local, *(p for p in r.peers if p is not None)]]
        held += [(f"workspace state {n}", t) for ws in memory.workspaces() for n, t in ws.state.items()]
        others = [(label, a) for label, a in zip(("x", "residual", "weight", "b"), args)] + held + kept
        for label, o in zip(("normed", "h", "z"), outs):
            lo, hi = span(o)
            for other_label, other in others:
                olo, ohi = span(other)
                if lo < ohi and olo < hi:
                    findings.append(f"call {call}: {label} shares memory with {other_label}")
            others.append((f"{label} of call {call}", o))
        kept += [(f"{label} of call {call}", o) for label, o in zip(("normed", "h", "z"), outs)]
    with FakeTensorMode() as mode:
        fakes = tail(*(mode.from_tensor(a) for a in args))
    for label, real, fake in zip(("normed", "h", "z"), outs, fakes):
        if (real.shape, real.dtype, real.stride()) != (fake.shape, fake.dtype, fake.stride()):
            findings.append(f"{label}: the fake implementation gives {tuple(fake.shape)} {fake.dtype} "
                            f"{fake.stride()}, the op {tuple(real.shape)} {real.dtype} {real.stride()}")
    return findings
