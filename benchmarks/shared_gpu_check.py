"""Every kernel on a real GPU when only one GPU is lent: N ranks share GPU 0 (``launch`` device
"cuda-shared": gloo host group, torch symmetric memory between processes on one device).

    PYTHONPATH=src python3 benchmarks/shared_gpu_check.py --world-size 2 --out $OUT/shared_gpu.json

What this shows: the kernels compile and run on sm_90 with real memory ordering across processes (the
ranks' kernels are time-sliced, so every wait for a peer really waits), exact results for every
algorithm of every op against locally computed answers (rank-coded integers), mismatched calls
detected on every rank, CUDA-graph capture and replays, torch.compile (inductor, reduce-overhead) on
CUDA tensors, and the host time of an eager call (CPU time per call over calls queued without
synchronising). What it cannot show: bandwidth or latency between GPUs (one GPU; every wait costs a
context switch), so nothing here is a performance figure for collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch, plan
from symmcoll.bench.checks import rank_coded
from symmcoll.bench.timing import host_time_us

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _expected(op, x_of, world, rank, src=0):
    """The exact result of ``op`` for inputs ``x_of(r)``, computed locally (no communication)."""
    xs = [x_of(r) for r in range(world)]
    if op == "all_reduce":
        return sum(x.float() for x in xs).to(xs[0].dtype)
    if op == "reduce_scatter":
        return sum(x.float() for x in xs).to(xs[0].dtype).chunk(world)[rank]
    if op == "all_gather":
        return torch.cat(xs)
    if op == "all_to_all":
        return torch.cat([x.chunk(world)[rank] for x in xs])
    return xs[src]


def _correctness(rank, world, rows):
    dev = torch.device("cuda", 0)
    for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast"):
        for name in ["auto", *plan.algorithms(op)]:
            for dtype in DTYPES:
                for numel in (1 if op in ("all_gather", "broadcast") else world, 4097 * world, (1 << 20) * world):
                    if op in ("reduce_scatter", "all_to_all") and numel % world:
                        continue
                    wrong, error = 0, None
                    try:
                        for call in range(3):
                            x_of = lambda r: rank_coded(numel, dtype, r, call, dev)
                            fn = getattr(symmcoll, op)
                            got = fn(x_of(rank), 1, algorithm=name) if op == "broadcast" else fn(x_of(rank),
                                                                                                  algorithm=name)
                            torch.cuda.synchronize()
                            symmcoll.check()
                            wrong += int((got != _expected(op, x_of, world, rank, 1)).sum())
                    except Exception as exc:  # noqa: BLE001 - recorded per case
                        error = f"{type(exc).__name__}: {exc}"[:300]
                        symmcoll.reset()
                    rows.append({"check": "exact", "op": op, "algorithm": name, "dtype": str(dtype), "numel": numel,
                                 "wrong": wrong, "error": error})


def _all_gather_matmul(rank, world, rows):
    """Every variant of the ladder, fresh data per call, against the fp32 product of the gathered A."""
    dev = torch.device("cuda", 0)
    for M, N, K in ((2048, 512, 256), (1000 * world, 296, 264)):
        for name in ["auto", *plan.algorithms("all_gather_matmul")]:
            worst, error = 0.0, None
            try:
                for call in range(3):
                    gen = lambda r: torch.Generator(device=dev).manual_seed(100 * call + r)
                    a_of = lambda r: torch.randn(M // world, K, generator=gen(r), device=dev).to(torch.bfloat16)
                    b = (torch.randn(K, N, generator=gen(99), device=dev) / K ** 0.5).to(torch.bfloat16)
                    out, g = symmcoll.all_gather_matmul(a_of(rank), b, algorithm=name, return_gathered=True)
                    torch.cuda.synchronize()
                    symmcoll.check()
                    full = torch.cat([a_of(r) for r in range(world)])
                    assert torch.equal(g, full), "gathered A differs"
                    ref = full.float() @ b.float()
                    worst = max(worst, float((out.float() - ref).norm() / ref.norm()))
            except Exception as exc:  # noqa: BLE001
                error = f"{type(exc).__name__}: {exc}"[:300]
                symmcoll.reset()
            rows.append({"check": "all_gather_matmul", "algorithm": name, "shape": [M, N, K], "rel_err": worst,
                         "wrong": int(worst > 1e-2), "error": error})


def _row_parallel(rank, world, rows):
    """matmul_reduce_scatter, matmul_all_reduce and all_reduce_rms_norm, every variant, against fp32
    answers computed locally from every rank's (seeded) inputs; odd sizes; bf16."""
    dev = torch.device("cuda", 0)
    gen = lambda seed: torch.Generator(device=dev).manual_seed(seed)
    for M, N, K in ((256, 512, 384), (6 * world, 296, 200)):
        a_of = lambda r: torch.randn(M, K, generator=gen(10 + r), device=dev).to(torch.bfloat16)
        b_of = lambda r: (torch.randn(K, N, generator=gen(50 + r), device=dev) / K ** 0.5).to(torch.bfloat16)
        total = sum(a_of(r).float() @ b_of(r).float() for r in range(world))
        for op, want in (("matmul_reduce_scatter", total.chunk(world)[rank]), ("matmul_all_reduce", total)):
            for name in ["auto", *plan.algorithms(op, kernels_only=False)]:
                error, err = None, None
                try:
                    got = getattr(symmcoll, op)(a_of(rank), b_of(rank), algorithm=name)
                    torch.cuda.synchronize()
                    symmcoll.check()
                    err = float((got.float() - want).norm() / want.norm())
                except Exception as exc:  # noqa: BLE001
                    error = f"{type(exc).__name__}: {exc}"[:300]
                    symmcoll.reset()
                rows.append({"check": op, "algorithm": name, "shape": [M, N, K], "rel_err": err,
                             "wrong": int(err is None or err > 1e-2), "error": error})
    for tokens, hidden in ((6, 8192), (138, 6144), (512, 1024)):
        x_of = lambda r: torch.randn(tokens, hidden, generator=gen(200 + r), device=dev).to(torch.bfloat16)
        residual = torch.randn(tokens, hidden, generator=gen(300), device=dev).to(torch.bfloat16)
        weight = torch.randn(hidden, generator=gen(301), device=dev).to(torch.bfloat16)
        new_res = residual.float() + sum(x_of(r).float() for r in range(world))
        normed = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
        for name in ["auto", *plan.algorithms("all_reduce_rms_norm", kernels_only=False)]:
            error, err = None, None
            try:
                out = symmcoll.all_reduce_rms_norm(x_of(rank), residual.clone(), weight, 1e-6, algorithm=name)
                torch.cuda.synchronize()
                symmcoll.check()
                got_n, got_r = out[0], out[1]
                err = max(float((got_r.float() - new_res).norm() / new_res.norm()),
                          float((got_n.float() - normed).norm() / normed.norm()))
            except Exception as exc:  # noqa: BLE001
                error = f"{type(exc).__name__}: {exc}"[:300]
                symmcoll.reset()
            rows.append({"check": "all_reduce_rms_norm", "algorithm": name, "shape": [tokens, hidden],
                         "rel_err": err, "wrong": int(err is None or err > 2e-2), "error": error})


def _quantized_and_moe(rank, world, rows):
    """The quantized all-reduce within its error bound and identical on every rank; MoE dispatch then
    combine with an identity expert gives every token times the sum of its weights."""
    dev = torch.device("cuda", 0)
    n = 1 << 20
    x_of = lambda r: torch.randn(n, generator=torch.Generator(device=dev).manual_seed(400 + r), device=dev).to(
        torch.bfloat16)
    exact = sum(x_of(r).float() for r in range(world))
    for quantize, bound in (("int8", 2e-2), ("fp8", 6e-2), ("int4", 0.3)):
        error, err, digest = None, None, None
        try:
            got = symmcoll.all_reduce(x_of(rank), quantize=quantize)
            torch.cuda.synchronize()
            symmcoll.check()
            err = float((got.float() - exact).norm() / exact.norm())
            digest = int(got.view(torch.int16).to(torch.int64).sum())
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"[:300]
            symmcoll.reset()
        digests = [None] * world
        dist.all_gather_object(digests, digest)
        rows.append({"check": "all_reduce_quantized", "algorithm": quantize, "rel_err": err,
                     "same_on_every_rank": len(set(digests)) == 1,
                     "wrong": int(err is None or err > bound or len(set(digests)) != 1), "error": error})
    T, H, E, k = 512, 1024, 8, 2
    g = torch.Generator(device=dev).manual_seed(500 + rank)
    tokens = torch.randn(T, H, generator=g, device=dev).to(torch.bfloat16)
    topk_ids = torch.stack([torch.randperm(E, generator=g, device=dev)[:k] for _ in range(T)])
    weights = torch.rand(T, k, generator=g, device=dev)
    error, err = None, None
    try:
        for _ in range(3):
            recv, counts, handle = symmcoll.moe_dispatch(tokens, topk_ids, E)
            out = symmcoll.moe_combine(recv, weights, handle)
        torch.cuda.synchronize()
        symmcoll.check()
        want = tokens.float() * weights.sum(1, keepdim=True)
        err = float((out.float() - want).norm() / want.norm())
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"[:300]
        symmcoll.reset()
    rows.append({"check": "moe_dispatch_combine", "algorithm": "auto", "rel_err": err,
                 "wrong": int(err is None or err > 1e-2), "error": error})


# (tokens, hidden, dtype, quant) and (tokens, hidden, experts per rank, top-k) of stage roofline_protocols
ROOFLINE_NORM_CASES = [(6, 16384, torch.bfloat16, None), (139, 4096, torch.bfloat16, "fp8_per_token"),
                       (33, 4099, torch.float16, "fp8_per_tensor"), (2049, 8192, torch.bfloat16, None),
                       (64, 1024, torch.float32, None)]
ROOFLINE_MOE_CASES = [(300, 7168, 8, 2), (128, 4096, 32, 8), (1000, 1000, 4, 3), (7, 16, 2, 1), (2048, 7168, 8, 8)]


def _roofline_protocols(rank, world, rows):
    """The protocols issue 23 changed, against answers computed locally from every rank's (seeded)
    inputs, every result the same on every rank where it must be: all_reduce_rms_norm one_shot and
    two_shot (own rows as values, peer code only on several ranks) at hidden sizes of every tile shape
    (whole rows and rows in chunks of 1024; 4099: no 16-byte rows), bf16 / fp16 / fp32, fp8 outputs, several
    pieces, three calls and a CUDA graph replayed with new data; MoE dispatch and combine (per-token
    items, in-block ranks, push only across ranks, combine in rounds) bit-exact, graph replays."""
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # CPU: a dry run
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = lambda seed: torch.Generator(device=dev).manual_seed(seed)  # noqa: E731
    from symmcoll import plan
    from symmcoll.plan import LaunchConfig

    def norm(x, residual, weight, name, quant, scale, chunk):
        """The public call, or (``chunk``: values of a row per step) the chunked two-pass rows."""
        if not chunk:
            return symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6, algorithm=name, quant=quant, scale=scale)
        others = (residual, weight) if scale is None else (residual, weight, scale)
        out = plan.resolve("all_reduce_rms_norm", x, None, name, config=LaunchConfig(chunk, 528, max(4, chunk // 256)),
                           others=others, options=(("eps", 1e-6), ("quant", quant))).execute(x, others=others)
        return out if quant == "fp8_per_token" else out[:2]
    # Every case with whole rows (the default config) and, for rows longer than 1024, in chunks of 1024.
    for (tokens, hidden, dtype, quant), name, chunk in [(case, name, chunk) for case in ROOFLINE_NORM_CASES
                                                         for name in ("one_shot", "two_shot")
                                                         for chunk in ((0, 1024) if case[1] > 1024 else (0,))]:
        error, err, digest = None, None, None
        try:
            for call in range(3):
                x_of = lambda r: torch.randn(tokens, hidden, generator=gen(600 + 10 * call + r),  # noqa: E731
                                             device=dev).to(dtype)
                residual = torch.randn(tokens, hidden, generator=gen(700 + call), device=dev).to(dtype)
                weight = torch.randn(hidden, generator=gen(701), device=dev).to(dtype)
                new_res = (residual.float() + sum(x_of(r).float() for r in range(world))).to(dtype).float()
                normed = new_res * torch.rsqrt(new_res.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
                scale = (normed.abs().max() / 300).reshape(1) if quant == "fp8_per_tensor" else None
                out = norm(x_of(rank), residual, weight, name, quant, scale, chunk)
                sync()
                symmcoll.check()
                got = out[0].float() * (out[2] if quant == "fp8_per_token" else scale if quant else 1.0)
                err = max(err or 0.0, float((out[1].float() - new_res).norm() / new_res.norm()),
                          float((got - normed).norm() / normed.norm()))
            word = torch.int16 if dtype != torch.float32 else torch.int32
            digest = int(out[1].view(word).to(torch.int64).sum()) + \
                int(out[0].view(torch.uint8 if quant else word).to(torch.int64).sum())
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"[:300]
            symmcoll.reset()
        digests = [None] * world
        dist.all_gather_object(digests, digest)
        bound = 0.07 if quant else 2e-2
        same = len(set(digests)) == 1
        rows.append({"check": "roofline_rms_norm", "algorithm": name, "shape": [tokens, hidden], "chunk": chunk,
                     "dtype": str(dtype), "quant": quant, "rel_err": err, "same_on_every_rank": same,
                     "wrong": int(err is None or err > bound or not same), "error": error})
    # A CUDA graph of the fused op, replayed with new x.
    for name in ("one_shot", "two_shot"):
        error, err = None, None
        try:
            x = torch.zeros(40, 2048, device=dev, dtype=torch.bfloat16)
            residual = torch.randn(40, 2048, generator=gen(800), device=dev).to(torch.bfloat16)
            weight = torch.ones(2048, device=dev, dtype=torch.bfloat16)
            symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6, algorithm=name)
            sync()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = [symmcoll.all_reduce_rms_norm(x, residual, weight, 1e-6, algorithm=name) for _ in range(2)]
            for replay in range(3):
                x_of = lambda r: torch.randn(40, 2048, generator=gen(900 + 10 * replay + r),  # noqa: E731
                                             device=dev).to(torch.bfloat16)
                x.copy_(x_of(rank))
                graph.replay()
                sync()
                want = (residual.float() + sum(x_of(r).float() for r in range(world))).to(torch.bfloat16).float()
                err = max(err or 0.0, max(float((o[1].float() - want).norm() / want.norm()) for o in out))
            symmcoll.check()
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"[:300]
            symmcoll.reset()
        rows.append({"check": "roofline_rms_norm_graph", "algorithm": name, "rel_err": err,
                     "wrong": int(err is None or err > 1e-2), "error": error})
    for T, H, per_rank, k in ROOFLINE_MOE_CASES:
        E = per_rank * world
        error, wrong = None, None
        try:
            wrong = sum(_moe_exact(rank, world, T, H, E, k, call, dev, sync) for call in range(2))
            symmcoll.check()
        except Exception as exc:  # noqa: BLE001
            error, wrong = f"{type(exc).__name__}: {exc}"[:300], None
            symmcoll.reset()
        rows.append({"check": "roofline_moe", "algorithm": "auto", "shape": [T, H, E, k], "wrong_elements": wrong,
                     "wrong": int(wrong is None or wrong > 0), "error": error})
    error, wrong = None, None
    try:
        wrong = _moe_graph(rank, world, dev, sync)
        symmcoll.check()
    except Exception as exc:  # noqa: BLE001
        error = f"{type(exc).__name__}: {exc}"[:300]
        symmcoll.reset()
    rows.append({"check": "roofline_moe_graph", "algorithm": "auto", "wrong_elements": wrong,
                 "wrong": int(wrong is None or wrong > 0), "error": error})


def _moe_routing(r, T, H, E, k, call, dev):
    """Rank r's tokens (rank-, token- and call-coded, exact in bf16), ids (distinct experts per token,
    a dropped slot every 7th token) and dyadic weights."""
    i = torch.arange(T * H, device=dev).reshape(T, H)
    tokens = ((i * 7 + r * 5 + call * 3) % 9 - 4).to(torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(1000 + 10 * call + r)
    ids = torch.argsort(torch.rand(T, E, generator=g, device=dev), dim=1)[:, :k].contiguous()
    ids[3::7, -1] = -1
    weights = torch.tensor([0.5, 0.25, 2.0, 1.0, 0.125, 4.0, 1.0, 0.5][:k], device=dev).repeat(T, 1)
    return tokens, ids, weights


def _moe_expected(rank, world, T, H, E, k, call, dev):
    """What dispatch must give this rank (rows by local expert, then source, token, slot) and, with the
    experts multiplying their rows by (local expert + 1), what combine must give."""
    local = E // world
    rows = []
    for e in range(rank * local, (rank + 1) * local):
        for src in range(world):
            tokens, ids, _ = _moe_routing(src, T, H, E, k, call, dev)
            hit = (ids == e).nonzero()
            rows.append(tokens[hit[:, 0]])
    recv = torch.cat(rows)
    tokens, ids, weights = _moe_routing(rank, T, H, E, k, call, dev)
    scale = torch.where(ids >= 0, weights * (ids % local + 1).float(), 0.0).sum(1, keepdim=True)
    return recv, (tokens.float() * scale + 0.0).to(torch.bfloat16)  # + 0.0: a token with no slot sums to +0


def _moe_exact(rank, world, T, H, E, k, call, dev, sync):
    tokens, ids, weights = _moe_routing(rank, T, H, E, k, call, dev)
    recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, E)
    want_recv, want_out = _moe_expected(rank, world, T, H, E, k, call, dev)
    n = want_recv.shape[0]
    wrong = int((recv[:n].view(torch.int16) != want_recv.view(torch.int16)).sum()) + int(counts.sum()) - n
    expert = torch.repeat_interleave(torch.arange(counts.numel(), device=dev), counts)
    expert_out = torch.zeros_like(recv)
    expert_out[:n] = (recv[:n].float() * (expert[:, None] + 1)).to(torch.bfloat16)
    out = symmcoll.moe_combine(expert_out, weights, handle)
    sync()
    return wrong + int((out.view(torch.int16) != want_out.view(torch.int16)).sum())


def _moe_graph(rank, world, dev, sync):
    """dispatch + combine captured once, replayed with new tokens (same routing): exact each time."""
    T, H, E, k = 256, 2048, 4 * world, 4
    tokens, ids, weights = _moe_routing(rank, T, H, E, k, 0, dev)
    recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, E)
    symmcoll.moe_combine(recv, weights, handle)
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, E)
        out = symmcoll.moe_combine(recv, weights, handle)
    wrong = 0
    for replay in range(3):
        tokens.copy_(_moe_routing(rank, T, H, E, k, replay, dev)[0].roll(replay, 1))
        graph.replay()
        sync()
        want = (tokens.float() * torch.where(ids >= 0, weights, 0.0).sum(1, keepdim=True) + 0.0).to(torch.bfloat16)
        wrong += int((out.view(torch.int16) != want.view(torch.int16)).sum())
    return wrong


def _remote_tma(rank, world, rows):
    """Can a device-side TMA descriptor address a peer's mapped memory? Here the peer's buffer is an IPC
    mapping of memory on the same GPU (between GPUs the mapping is over NVLink; not tested here)."""
    from remote_tma_probe import probe
    rows.append({"check": "remote_tma", **probe(rank, world)})


def _mismatch(rank, world, rows):
    dev = torch.device("cuda", 0)
    cases = {
        "size (one_shot)": lambda: symmcoll.all_reduce(torch.ones(100 + (rank == 1), device=dev), algorithm="one_shot"),
        "size (sentinel_one_shot)": lambda: symmcoll.all_reduce(torch.ones(100 + (rank == 1), device=dev),
                                                                algorithm="sentinel_one_shot"),
        "dtype (two_shot)": lambda: symmcoll.all_reduce(
            torch.ones(1000, device=dev, dtype=torch.float32 if rank == 0 else torch.bfloat16), algorithm="two_shot"),
        "algorithm one_shot/two_shot": lambda: symmcoll.all_reduce(
            torch.ones(1000, device=dev), algorithm="one_shot" if rank == 0 else "two_shot"),
        "broadcast src=rank": lambda: symmcoll.broadcast(torch.ones(64, device=dev), rank),
        "all_gather rows": lambda: symmcoll.all_gather(torch.ones(100 + (rank == 1), device=dev)),
    }
    for case, fn in cases.items():
        t0 = time.monotonic()
        try:
            fn()
            torch.cuda.synchronize()
            symmcoll.check()
            outcome = "NO ERROR"
        except Exception as exc:  # noqa: BLE001
            outcome = f"{type(exc).__name__}: {exc}"[:300]
        rows.append({"check": "mismatch", "case": case, "outcome": outcome, "seconds": time.monotonic() - t0})
        symmcoll.reset()
        dist.barrier()


def _graphs(rank, world, rows):
    dev = torch.device("cuda", 0)
    x = rank_coded(8192, torch.bfloat16, rank, 0, dev)
    w = torch.randn(64, 64, device=dev, dtype=torch.bfloat16)
    # a matmul between collectives, as in a model step
    step = lambda: (symmcoll.all_reduce(x).reshape(128, 64) @ w, symmcoll.all_gather(x, algorithm="copy_engine"),
                    symmcoll.reduce_scatter(x))
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    wrong = 0
    for replay in range(1, 6):
        x.copy_(rank_coded(8192, torch.bfloat16, rank, replay, dev))
        graph.replay()
        torch.cuda.synchronize()
        x_of = lambda r: rank_coded(8192, torch.bfloat16, r, replay, dev)
        wrong += int((outs[1] != _expected("all_gather", x_of, world, rank)).sum())
        wrong += int((outs[2] != _expected("reduce_scatter", x_of, world, rank)).sum())
    rows.append({"check": "cuda_graph", "replays": 5, "wrong": wrong})
    symmcoll.reset()
    dist.barrier()


def _capture_without_warmup(rank, world, rows):
    """Last stage (a failed capture may leave the stream unusable): no workspace yet, capture -> error."""
    dev = torch.device("cuda", 0)
    symmcoll.reset()
    x = rank_coded(8192, torch.bfloat16, rank, 0, dev)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            symmcoll.all_reduce(x)
        outcome = "NO ERROR"
    except Exception as exc:  # noqa: BLE001 - the workspace cannot be created during capture
        outcome = f"{type(exc).__name__}: {exc}"[:300]
    rows.append({"check": "capture_without_warmup", "outcome": outcome})


def _compile(rank, world, rows):
    dev = torch.device("cuda", 0)
    for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        fn = torch.compile(lambda t: symmcoll.all_reduce(t * 2) + 1, fullgraph=True, mode=mode)
        wrong, error = 0, None
        try:
            for call in range(4):
                x_of = lambda r: rank_coded(4096 + 8 * call, torch.bfloat16, r, call, dev)
                got = fn(x_of(rank)).clone()
                torch.cuda.synchronize()
                want = _expected("all_reduce", lambda r: (x_of(r).float() * 2).to(torch.bfloat16), world, rank)
                wrong += int((got != (want.float() + 1).to(torch.bfloat16)).sum())
        except Exception as exc:  # noqa: BLE001
            error = f"{type(exc).__name__}: {exc}"[:400]
        rows.append({"check": "compile", "mode": mode, "wrong": wrong, "error": error})


def _host_overhead(rank, world, rows, rounds=30, calls=20):
    """CPU time per eager call: rounds of ``calls`` calls queued on an idle GPU (few enough that the
    launch queue never fills, so the host never waits for the GPU), median over rounds. Also the same
    with kernel launches replaced by a no-op (the Python path alone) and Triton's own launch path."""
    from symmcoll import launcher
    dev = torch.device("cuda", 0)
    x = rank_coded(2048, torch.bfloat16, rank, 0, dev)  # 4 KB
    name = dist.group.WORLD.group_name
    cases = {
        "symmcoll.all_reduce sentinel_one_shot": lambda: symmcoll.all_reduce(x, algorithm="sentinel_one_shot"),
        "symmcoll.all_reduce one_shot": lambda: symmcoll.all_reduce(x, algorithm="one_shot"),
        "symmcoll.all_reduce auto": lambda: symmcoll.all_reduce(x),
        "torch.ops.symmcoll.all_reduce (dispatcher)": lambda: torch.ops.symmcoll.all_reduce(x, name, "sum",
                                                                                            "sentinel_one_shot"),
        "plan.resolve only": lambda: plan.resolve("all_reduce", x, None, "sentinel_one_shot", reduce_op="sum"),
        "torch.empty_like only": lambda: torch.empty_like(x),
    }

    def measure(fn):
        return host_time_us(fn, dist.group.WORLD, rounds, calls)

    for case, fn in cases.items():
        for _ in range(5):
            fn()
        rows.append({"check": "host_us_per_call", "case": case, "us": measure(fn), "calls": calls, "rounds": rounds})
    # Without the prepared launches: every launch through Triton's JIT binding.
    launcher.FAST = False
    try:
        rows.append({"check": "host_us_per_call", "case": "sentinel_one_shot via Triton's own launch path",
                     "us": measure(cases["symmcoll.all_reduce sentinel_one_shot"]), "calls": calls})
    finally:
        launcher.FAST = True


STAGES = (_correctness, _all_gather_matmul, _row_parallel, _quantized_and_moe, _roofline_protocols, _remote_tma,
          _mismatch, _graphs, _compile, _host_overhead, _capture_without_warmup)


def _all_checks(stages=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for stage in STAGES:
        if stages and stage.__name__.lstrip("_") not in stages:
            continue
        t0 = time.monotonic()
        try:
            stage(rank, world, rows)
        except Exception:  # noqa: BLE001 - one stage's failure must not hide the others
            rows.append({"check": stage.__name__, "error": traceback.format_exc()[-1500:]})
            symmcoll.reset()
        rows.append({"check": "stage_seconds", "stage": stage.__name__, "seconds": time.monotonic() - t0})
        if rank == 0:
            print(f"stage {stage.__name__} done in {time.monotonic() - t0:.1f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--out", required=True)
    parser.add_argument("--stages", nargs="+", default=None, choices=[s.__name__.lstrip("_") for s in STAGES],
                        help="only these stages (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("SYMMCOLL_TIMEOUT_S", "10")
    results = launch.run(_all_checks, args.world_size, args.stages, device="cuda-shared", timeout=540)
    info = {"git": os.environ.get("SYMMCOLL_GIT_SHA", "unknown"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0), "world_size": args.world_size,
            "mode": "ranks share one GPU (time-sliced): correctness and host overhead only"}
    with open(args.out, "w") as f:
        json.dump({"info": info, "ranks": results}, f, indent=1)
    rows = results[0]
    bad = [r for r in rows if r.get("wrong") or r.get("error") or r.get("outcome") == "NO ERROR"]
    for r in rows:
        if r["check"] in ("host_us_per_call", "mismatch", "compile", "cuda_graph", "capture_without_warmup",
                          "stage_seconds", "all_gather_matmul", "remote_tma", "matmul_reduce_scatter",
                          "matmul_all_reduce", "all_reduce_rms_norm", "all_reduce_quantized", "moe_dispatch_combine",
                          "roofline_rms_norm", "roofline_rms_norm_graph", "roofline_moe", "roofline_moe_graph"):
            print(json.dumps(r))
    exact = [r for r in rows if r["check"] == "exact"]
    print(f"exact checks: {len(exact)} cases, {sum(1 for r in exact if not r['wrong'] and not r['error'])} exact")
    print(f"PROBLEMS ({len(bad)}):")
    for r in bad:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
