"""Random calls of every op, checked against ``symmcoll.reference``: the property test's generator and
checker (tests/test_random_calls.py on CPU ranks; ``python3 tests/random_calls.py`` on a GPU, two ranks
sharing it, for scripts/gpu_check.sh's ``semantics`` stage).

A call is drawn from (seed, index) alone, so every rank draws the same one: an op (collectives, the
quantized all-reduce, the fused ops), an algorithm (every registered one, "auto", "nccl"), a dtype, a
shape (0, 1, odd, a few thousand elements) and values (small integers, so every exact result is exact;
NaN and +-Inf in about half the reductions). About one call in five differs between ranks in one
field (x's shape, the dtype, the reduce op, the root, the algorithm, the op, the group size, B's shape,
the splits, ...), on one rank or (root) on all. Every rank's inputs follow from (seed, index, rank),
so every rank computes the expected result locally with symmcoll.reference's functions.

Outcomes, per call and rank: "ok", "wrong: ..." or the error raised. A call that differs must raise
SymmcollMismatchError on every rank, naming the field that differs and a rank whose call differs; any
other call must return reference's answer. After a failed call every rank resets together.

Differences between protocols that never meet (a barrier against a barrier-free kernel) are found
only when a wait times out: call 250 of every thousand at world size 2 is one (``SLOW_EVERY``); every
other difference is drawn where both sides meet in one protocol and is found at once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from unittest import mock

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference
from symmcoll.comm.quantized import size_threshold

REDUCE = ("sum", "avg", "max", "min")
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
MOVE_DTYPES = (torch.bfloat16, torch.float32, torch.int8, torch.uint8, torch.float8_e4m3fn, torch.int64, torch.bool,
               torch.int16)
# Kernels that meet their peers through barrier signals (a barrier-free kernel keeps its own headers):
# two calls in this set find out about each other at once, whatever the op.
BARRIER = {("all_reduce", "one_shot"), ("all_reduce", "two_shot"), ("all_reduce", "push_copy_engine"),
           ("reduce_scatter", "pull"), ("reduce_scatter", "push"), ("all_gather", "pull"),
           ("all_gather", "copy_engine"), ("broadcast", "pull"), ("all_to_all", "pull"),
           *(("all_gather_matmul", a) for a in ("naive_remote", "gather_then_gemm", "gather_then_cublas",
                                                "copy_engine_producer", "fused"))}
DIFFER_RATE = 0.2
# Differences found only when a wait times out: call 250 of every 1000 at world size 2, a barrier
# all-reduce against a barrier-free one, waits SLOW_TIMEOUT_S. Every call that differs between ranks runs
# with that timeout too: where the generator cannot tell that the ranks' calls take different protocols (the
# resolver sends a sentinel call whose rows are not whole 4-byte words to pull; the interpreter runs a tree's
# programs one after another, so the program that would see a neighbour's descriptor runs after the one that
# waits) the difference is found when a wait gives up -- 2.7-5.2 s a call at the default timeout of 5 s, 38 of
# the 81 s of the 1200 calls at world size 2 (CPU, 2026-11-28), the same error either way.
SLOW_EVERY, SLOW_AT, SLOW_TIMEOUT_S = 1000, 250, 2.0


@dataclass
class Call:
    """One call, the same on every rank except ``odd`` ranks, which change ``differ`` to ``other``."""

    index: int
    op: str
    algorithm: str
    dtype: str
    params: dict = field(default_factory=dict)
    differ: str | None = None       # the field that differs (its name in SymmcollMismatchError.fields)
    odd: tuple = ()
    other: dict = field(default_factory=dict)  # what the odd ranks call instead (overrides)
    specials: bool = False          # NaN / Inf among the values

    def on(self, rank: int) -> "Call":
        """What ``rank`` calls."""
        if rank not in self.odd:
            return self
        merged = {**asdict(self), **{k: v for k, v in self.other.items() if k != "params"}}
        merged["params"] = {**self.params, **self.other.get("params", {})}
        return Call(**merged)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---- drawing calls ---------------------------------------------------------------------------------------

def _size(rng: random.Random, large: bool = True) -> int:
    """0, 1, odd and small, or (one time in ten, where ``large``) a few thousand: several blocks or
    pieces on CPU."""
    if large and rng.random() < 0.1:
        return rng.randrange(1000, 3000)
    return rng.choice([0, 1, rng.randrange(1, 40, 2), rng.randrange(2, 64)])


def _choices(op: str, process_group: bool) -> list[str]:
    """What ``algorithm=`` may be: every kernel, "auto", and "nccl" where the process group runs the
    call's tensors (not gloo on GPU tensors: ranks sharing one GPU)."""
    return [*symmcoll.ALGORITHMS[op], "auto", *(["nccl"] if process_group else [])]


def _draw(rng: random.Random, world: int, process_group: bool) -> Call:
    # Collectives three times in four (they are cheap on CPU), each fused op one time in twenty.
    op = rng.choices(["all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "quantized",
                      "matmul_reduce_scatter", "matmul_all_reduce", "all_reduce_rms_norm", "all_gather_matmul"],
                     weights=[25, 12, 12, 10, 12, 5, 5, 5, 5, 5])[0]
    if op in ("all_reduce", "reduce_scatter"):
        algorithm = rng.choice(_choices(op, process_group))
        dtype = rng.choice(FLOATS + ((torch.int32,) if algorithm in ("auto", "nccl") and process_group else ()))
        reduce_op = rng.choice(REDUCE if dtype.is_floating_point else ("sum", "max", "min"))
        if algorithm == "nccl" and reduce_op in ("max", "min"):
            reduce_op = "sum"  # NaN through the process group's max/min is its own business (test_special_values)
        rows = _size(rng) if op == "all_reduce" else world * rng.choice([0, 1, 3, 40])
        params = dict(reduce_op=reduce_op, shape=(rows,) if rng.random() < 0.7 or op == "reduce_scatter" and
                      rows == 0 else (rows, rng.choice([1, 3])))
        if op == "reduce_scatter":
            params["shape"] = (rows, rng.choice([1, 2, 3]))
        return Call(0, op, algorithm, _name(dtype), params, specials=dtype.is_floating_point and rng.random() < 0.5)
    if op in ("all_gather", "broadcast"):
        algorithm = rng.choice(_choices(op, process_group))
        dtype = rng.choice(MOVE_DTYPES)
        params = dict(shape=(_size(rng),) if rng.random() < 0.5 else (rng.choice([0, 1, 5]), rng.choice([1, 3])))
        if op == "broadcast":
            params["src"] = rng.randrange(world)
        return Call(0, op, algorithm, _name(dtype), params)
    if op == "all_to_all":
        algorithm = rng.choice(_choices(op, process_group))
        kind = rng.choice(["equal", "equal", "list", "device"])
        if kind == "device" and algorithm in ("copy_engine",):
            kind = "list"
        params = dict(kind=kind, rows=world * rng.choice([0, 1, 3]), cols=rng.choice([1, 2, 5]), max_rows=None)
        if kind == "device":  # at least what can arrive (3 rows from each rank): test_all_to_all covers less
            params["max_rows"] = rng.choice([3 * world, 3 * world + 5])
        return Call(0, op, algorithm, _name(rng.choice(MOVE_DTYPES)), params)
    if op == "quantized":
        dtype = rng.choice(FLOATS)
        # min_bytes: SYMMCOLL_QUANTIZE_MIN_BYTES for the call, the same on CPU and GPU: 0 runs the kernel,
        # 1 MB (the GPU's default) the exact all-reduce, so both machines see both sides of the rule.
        return Call(0, op, "auto", _name(dtype), dict(quantize=rng.choice(["int8", "fp8", "int4"]),
                                                      group_size=rng.choice([32, 64, 128]),
                                                      reduce_op=rng.choice(["sum", "avg"]),
                                                      shape=(_size(rng, large=False),),
                                                      min_bytes=rng.choice([0, 1 << 20])),
                    specials=rng.random() < 0.3)
    if op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        algorithm = rng.choice(_choices(op, process_group))
        m = world * rng.choice([0, 1, 2, 9]) if op == "matmul_reduce_scatter" else rng.choice([0, 1, 5, 33])
        params = dict(m=m, k=rng.choice([0, 1, 7, 16]), n=rng.choice([0, 1, 9, 33]))
        return Call(0, op, algorithm, _name(rng.choice(FLOATS)), params, specials=rng.random() < 0.5)
    if op == "all_reduce_rms_norm":
        algorithm = rng.choice(_choices(op, process_group))
        quant = rng.choice([None, None, "fp8_per_token", "fp8_per_tensor"])
        params = dict(rows=rng.choice([0, 1, 5, 13]), h=rng.choice([1, 16, 33]), quant=quant, eps=1e-6)
        return Call(0, op, algorithm, _name(rng.choice(FLOATS)), params, specials=rng.random() < 0.3)
    algorithm = rng.choice(_choices("all_gather_matmul", process_group))
    params = dict(rows=rng.choice([0, 1, 3, 17]), k=rng.choice([0, 8, 24]), ns=rng.choice([(5,), (16, 3)]))
    return Call(0, "all_gather_matmul", algorithm, _name(rng.choice((torch.bfloat16, torch.float16))), params)


def _differ(rng: random.Random, call: Call, world: int) -> Call | None:
    """``call`` with one field changed on some ranks (None where this call has no field to change that
    every algorithm compares: "nccl" is the process group's, unchecked)."""
    if call.algorithm == "nccl":
        return None
    odd = (rng.randrange(world),)
    p = call.params
    choices = []
    if call.op in ("all_reduce", "reduce_scatter"):
        choices += ["x.shape", "reduce_op", "dtype", "op", "algorithm"]
    elif call.op in ("all_gather", "broadcast"):
        choices += ["x.shape", "dtype", "op"] + (["src"] if call.op == "broadcast" else [])
    elif call.op == "all_to_all" and p["kind"] != "list":
        choices += ["x.shape" if p["kind"] == "equal" else "max_rows", "splits"]
    elif call.op == "quantized":
        choices += ["group_size", "quantize", "x.shape"]
    elif call.op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        choices += ["a.shape", "b.shape"]
    elif call.op == "all_reduce_rms_norm":
        choices += ["x.shape", "eps", "quant"]
    elif call.op == "all_gather_matmul":
        choices += ["a_shard.shape", "b.shape"]
    if not choices:
        return None
    what = rng.choice(choices)
    other: dict = {}
    if what == "x.shape" and call.op in ("all_reduce", "all_gather", "broadcast", "quantized"):
        shape = p["shape"]
        other["params"] = dict(shape=(0 if shape[0] and rng.random() < 0.3 else shape[0] + 1, *shape[1:]))
    elif what == "x.shape" and call.op == "reduce_scatter":
        other["params"] = dict(shape=(p["shape"][0], p["shape"][1] + 1))
    elif what == "x.shape" and call.op == "all_to_all":
        other["params"] = dict(cols=p["cols"] + 1)
    elif what == "x.shape":  # rms norm rows
        other["params"] = dict(rows=p["rows"] + 1)
    elif what == "reduce_op":
        other["params"] = dict(reduce_op=rng.choice([r for r in REDUCE if r != p["reduce_op"]]
                                                    if call.torch_dtype.is_floating_point else
                                                    [r for r in ("sum", "max", "min") if r != p["reduce_op"]]))
    elif what == "dtype":
        floats = call.op in ("all_reduce", "reduce_scatter")
        pool = FLOATS if floats else MOVE_DTYPES
        other["dtype"] = _name(rng.choice([d for d in pool if _name(d) != call.dtype]))
        if floats and p["reduce_op"] == "avg" and not getattr(torch, other["dtype"]).is_floating_point:
            return None
    elif what == "src":
        odd = tuple(range(world))  # every rank names itself the root
        other["params"] = dict(src=None)  # filled per rank in inputs(): src = rank
    elif what == "op":
        targets = [("all_reduce", "one_shot"), ("all_gather", "pull"), ("reduce_scatter", "pull"),
                   ("broadcast", "pull")]
        op, algorithm = rng.choice([t for t in targets if t[0] != call.op])
        needs_float = op in ("all_reduce", "reduce_scatter") and call.torch_dtype not in FLOATS
        other.update(op=op, algorithm=algorithm, dtype="float32" if needs_float else call.dtype)
        other["params"] = _params_for(op, p, world)
    elif what == "algorithm":
        names = [a for a in symmcoll.ALGORITHMS[call.op] if a != call.algorithm]
        other["algorithm"] = rng.choice(names)
    elif what in ("group_size", "quantize", "eps", "quant", "max_rows"):
        values = {"group_size": [32, 64, 128], "quantize": ["int8", "fp8", "int4"], "eps": [1e-6, 1e-3],
                  "quant": [None, "fp8_per_token"], "max_rows": [3 * world, 3 * world + 5, 4 * world]}[what]
        new = rng.choice([v for v in values if v != p.get(what)])
        other["params"] = {what: new}
        if what == "quant" and p["quant"] == "fp8_per_tensor":
            return None
    elif what == "splits":
        other["params"] = dict(kind="list" if p["kind"] == "equal" else "equal", max_rows=None)
    elif what == "a.shape":
        other["params"] = dict(m=p["m"] + world)
    elif what == "b.shape" and call.op == "all_gather_matmul":
        other["params"] = dict(ns=tuple(n + 1 for n in p["ns"]))
        what = "b.shape" if len(p["ns"]) == 1 else "b[0].shape"
    elif what == "b.shape":
        other["params"] = dict(n=p["n"] + 1)
    elif what == "a_shard.shape":
        other["params"] = dict(rows=p["rows"] + 1)
    return Call(call.index, call.op, call.algorithm, call.dtype, call.params, what, odd, other, call.specials)


def _params_for(op: str, p: dict, world: int) -> dict:
    """The parameters of a barrier call of ``op`` a rank makes instead of ``p``'s call."""
    shape = p.get("shape", (world,))
    if op == "reduce_scatter":
        return dict(shape=(world * max(1, shape[0] // world), 1), reduce_op="sum")
    if op == "all_reduce":
        return dict(shape=shape, reduce_op="sum")
    if op == "broadcast":
        return dict(shape=shape, src=0)
    return dict(shape=shape)


def _empty(call: Call) -> bool:
    """No work on this rank: it meets its peers with a barrier handshake (plan.Plan.handshake)."""
    p = call.params
    if call.op == "all_to_all":
        return False  # its kernels run whatever the input
    if call.op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        return 0 in (p["m"], p["k"], p["n"])
    if call.op == "all_reduce_rms_norm":
        return 0 in (p["rows"], p["h"])
    if call.op == "all_gather_matmul":
        return 0 in (p["rows"], p["k"], *p["ns"])
    return 0 in p["shape"]


def _runs(call: Call, world: int) -> str:
    """The algorithm the resolver runs for ``call``'s explicit algorithm: a sentinel call whose words are not
    whole runs pull in its place (comm/sentinel.py ``_whole_words``: reduce_scatter's segments of
    nbytes / world; comm/all_to_all_sentinel.py ``_accepts``: all_to_all's rows) -- so one rank's shape or
    dtype can send it to another protocol than its peers'."""
    if call.algorithm == "sentinel" and call.op in ("reduce_scatter", "all_to_all"):
        itemsize = call.torch_dtype.itemsize
        if call.op == "reduce_scatter":
            whole = (math.prod(call.params["shape"]) * itemsize // world) % 4 == 0
        else:
            whole = (call.params["cols"] * itemsize) % 4 == 0
        if not whole:
            return "pull"
    return call.algorithm


def _same_run(call: Call, world: int) -> bool:
    """A difference of algorithm that the resolver undoes (a sentinel call it runs as pull against pull): the
    ranks make the same call."""
    return call.differ == "algorithm" and _runs(call, world) == _runs(call.on(call.odd[0]), world)


def _protocol(call: Call, world: int):
    """Where a call meets its peers: "barrier" (signals), a barrier-free kernel's own region, or None
    where the host decides (auto, unfused variants) or only some peers meet (a tree on more than two
    ranks: a rank learns of a difference two hops away when its neighbour's wait gives up)."""
    if _empty(call) or (call.op, _runs(call, world)) in BARRIER:
        return "barrier"
    if call.op == "quantized":
        nbytes = call.torch_dtype.itemsize * call.params["shape"][0]
        return "quantized" if nbytes >= call.params["min_bytes"] else ("exact", call.params["shape"], call.dtype)
    if call.algorithm in ("auto", "unfused") or (call.algorithm == "tree" and world > 2):
        return None
    return call.op, _runs(call, world), call.params.get("kind")


def _slow(call: Call, world: int) -> bool:
    """Would this difference be found only when a wait times out?"""
    here, there = _protocol(call, world), _protocol(call.on(call.odd[0]), world)
    return here is None or here != there


def _explicit(rng: random.Random, call: Call) -> Call:
    """``call`` with a kernel algorithm of its own in place of one the host picks ("auto", "unfused":
    where the ranks meet is unknown to the generator) or of the process group's ("nccl": unchecked)."""
    if call.algorithm not in ("auto", "nccl", "unfused") or call.op == "quantized":
        return call
    kernels = [a for a in symmcoll.ALGORITHMS[call.op] if a != "unfused"]
    barrier = [a for a in kernels if (call.op, a) in BARRIER]
    dtype = call.dtype if call.torch_dtype.is_floating_point or call.op not in ("all_reduce", "reduce_scatter") \
        else "float32"
    params = dict(call.params)
    if call.op == "all_to_all" and params["kind"] == "device":
        barrier = ["pull"]
    return Call(call.index, call.op, rng.choice(barrier or kernels), dtype, params, specials=call.specials)


def _forced_slow(index: int, world: int) -> bool:
    return index % SLOW_EVERY == SLOW_AT and world == 2


def draw_calls(seed: int, first: int, count: int, world: int, process_group: bool = True,
               indices: list[int] | None = None) -> list[Call]:
    """Calls ``first``, ..., ``first + count - 1`` (or ``indices``) of the run ``seed`` (the same list on
    every rank); ``process_group``: whether calls may go to the process group's own collectives."""
    calls = []
    for index in range(first, first + count) if indices is None else indices:
        rng = random.Random(f"{seed}/{index}/{world}")
        call = _draw(rng, world, process_group)
        call.index = index
        if _forced_slow(index, world):
            call = Call(index, "all_reduce", "one_shot", "float32", dict(reduce_op="sum", shape=(17,)), "algorithm",
                        (world - 1,), dict(algorithm=rng.choice(["sentinel_one_shot", "low_latency"])))
        elif rng.random() < DIFFER_RATE:
            call = _explicit(rng, call)
            for _ in range(6):
                differing = _differ(rng, call, world)
                if differing is not None and not _slow(differing, world) and not _same_run(differing, world):
                    call = differing
                    break
        calls.append(call)
    return calls


# ---- inputs, running, expected results ------------------------------------------------------------------

def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _values(shape, dtype: torch.dtype, g: torch.Generator, specials: bool) -> torch.Tensor:
    """Small integers (exact sums in every dtype), NaN / Inf sprinkled where ``specials``; any bits for
    types without arithmetic (fp8, bool, ...)."""
    n = 1
    for s in shape:
        n *= s
    if dtype in (torch.float8_e4m3fn, torch.bool, torch.int8, torch.uint8):
        return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).view(dtype).reshape(shape) \
            if dtype != torch.bool else torch.randint(0, 2, (n,), generator=g).bool().reshape(shape)
    v = torch.randint(-4, 5, (n,), generator=g).float()
    if specials and n:
        pick = torch.rand(n, generator=g)
        v = torch.where(pick < 0.04, float("nan"), torch.where(pick < 0.07, float("inf"),
                                                                torch.where(pick < 0.10, -float("inf"), v)))
    return v.to(dtype).reshape(shape)


def _split_list(rows: int, world: int, g: torch.Generator) -> list[int]:
    cuts = sorted(torch.randint(0, rows + 1, (world - 1,), generator=g).tolist())
    return [b - a for a, b in zip([0, *cuts], [*cuts, rows])]


def inputs(call: Call, seed: int, rank: int, world: int) -> dict:
    """Rank ``rank``'s arguments of ``call`` (as that rank calls it), on the CPU."""
    c = call.on(rank)
    g = torch.Generator().manual_seed(hash((seed, c.index, rank)) & 0xFFFFFFFF)
    dtype, p = c.torch_dtype, c.params
    if c.op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "quantized"):
        args = dict(x=_values(p["shape"], dtype, g, c.specials))
        if c.op == "broadcast":
            args["src"] = rank if p["src"] is None else p["src"]
        return args
    if c.op == "all_to_all":
        rows = p["rows"] if p["kind"] != "list" else int(torch.randint(0, 7, (1,), generator=g))
        args = dict(x=_values((rows, p["cols"]), dtype, g, False))
        if p["kind"] == "list":
            args["splits"] = _split_list(rows, world, g)
        elif p["kind"] == "device":  # at most the rows x has (test_all_to_all asks for more)
            args["splits"] = torch.tensor(_split_list(min(rows, 3), world, g))
        return args
    if c.op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        a = _values((p["m"], p["k"]), dtype, g, c.specials)
        b = torch.randint(-1, 2, (p["k"], p["n"]), generator=g).to(dtype)
        return dict(a=a, b=b)
    if c.op == "all_reduce_rms_norm":
        x = _values((p["rows"], p["h"]), dtype, g, c.specials)
        common = torch.Generator().manual_seed(c.index)  # residual, weight, scale: the same on every rank
        args = dict(x=x, residual=_values((p["rows"], p["h"]), dtype, common, False),
                    weight=(torch.randint(1, 4, (p["h"],), generator=common) / 2).to(dtype))
        if p["quant"] == "fp8_per_tensor":
            args["scale"] = torch.full((1,), 0.125)
        return args
    a = _values((p["rows"], p["k"]), dtype, g, False)
    common = torch.Generator().manual_seed(c.index)
    return dict(a_shard=a, bs=[torch.randint(-1, 2, (p["k"], n), generator=common).to(dtype) for n in p["ns"]])


def run(call: Call, args: dict):
    """Make the call (this rank's version of it) with ``args`` on this rank's device."""
    dev = _device()
    a = {k: (v.to(dev) if isinstance(v, torch.Tensor) else [t.to(dev) for t in v] if isinstance(v, list) and v
             and isinstance(v[0], torch.Tensor) else v) for k, v in args.items()}
    p, op, alg = call.params, call.op, call.algorithm
    if op in ("all_reduce", "reduce_scatter"):
        return getattr(symmcoll, op)(a["x"], op=p["reduce_op"], algorithm=alg)
    if op == "all_gather":
        return symmcoll.all_gather(a["x"], algorithm=alg)
    if op == "broadcast":
        return symmcoll.broadcast(a["x"], a["src"], algorithm=alg)
    if op == "all_to_all":
        if p["kind"] == "device":
            return symmcoll.all_to_all(a["x"], splits=a["splits"], max_rows=p["max_rows"], algorithm=alg)
        return symmcoll.all_to_all(a["x"], splits=a.get("splits"), algorithm=alg)
    if op == "quantized":
        with size_threshold(p["min_bytes"]):
            return symmcoll.all_reduce(a["x"], op=p["reduce_op"], quantize=p["quantize"], group_size=p["group_size"])
    if op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        return getattr(symmcoll, op)(a["a"], a["b"], algorithm=alg)
    if op == "all_reduce_rms_norm":
        return symmcoll.all_reduce_rms_norm(a["x"], a["residual"], a["weight"], p["eps"], algorithm=alg,
                                            quant=p["quant"], scale=a.get("scale"))
    return symmcoll.all_gather_matmul(a["a_shard"], a["bs"], algorithm=alg, return_gathered=True)


def expected(call: Call, seed: int, rank: int, world: int):
    """What rank ``rank`` must get from a call every rank makes alike, from every rank's inputs, with
    symmcoll.reference's functions (no communication)."""
    every = [inputs(call, seed, r, world) for r in range(world)]
    p, op = call.params, call.op
    if op in ("all_reduce", "reduce_scatter"):
        xs = torch.stack([e["x"] for e in every])
        total = reference.reduce_stacked(xs, p["reduce_op"]).to(call.torch_dtype)
        if op == "all_reduce":
            return total
        rows = xs.shape[1] // world
        return total[rank * rows:(rank + 1) * rows]
    if op == "all_gather":
        xs = [e["x"].reshape(-1, *e["x"].shape[1:]) if e["x"].dim() else e["x"].reshape(1) for e in every]
        return torch.cat(xs)
    if op == "broadcast":
        return every[p["src"]]["x"]
    if op == "all_to_all":
        return _all_to_all_expected(every, p, rank, world)
    if op == "quantized":
        xs = torch.stack([e["x"] for e in every])
        return reference.quantized_stacked(xs, p["reduce_op"], p["quantize"], p["group_size"], _device().type,
                                           p["min_bytes"]).to(call.torch_dtype)
    if op in ("matmul_reduce_scatter", "matmul_all_reduce"):
        total = reference.reduce_stacked(torch.stack([e["a"].float() @ e["b"].float() for e in every]))
        total = total.to(call.torch_dtype)
        if op == "matmul_all_reduce":
            return total
        rows = p["m"] // world
        return total[rank * rows:(rank + 1) * rows]
    if op == "all_reduce_rms_norm":
        mine = every[rank]
        total = reference.reduce_stacked(torch.stack([e["x"] for e in every]))
        # The kernels (and torch's baselines) normalise the new residual as rounded to x's dtype.
        new_residual = (mine["residual"].float() + total).to(call.torch_dtype)
        out = reference.rms_norm_tail(torch.zeros_like(total), new_residual, mine["weight"], p["eps"], p["quant"],
                                      mine.get("scale"))
        return (out[0], new_residual, *out[2:])
    gathered = torch.cat([e["a_shard"] for e in every])
    return [(gathered.float() @ b.float()).to(call.torch_dtype) for b in every[rank]["bs"]], gathered


def _all_to_all_expected(every, p, rank, world):
    if p["kind"] == "equal":
        return torch.cat([e["x"].chunk(world)[rank] if e["x"].shape[0] else e["x"] for e in every])
    if p["kind"] == "list":
        parts = []
        for e in every:
            start = sum(e["splits"][:rank])
            parts.append(e["x"][start:start + e["splits"][rank]])
        return torch.cat(parts)
    parts, received = [], []
    for e in every:
        want = e["splits"].clamp(min=0)
        ends = want.cumsum(0).clamp(max=e["x"].shape[0])
        starts = (ends - want).clamp(max=e["x"].shape[0])
        parts.append(e["x"][int(starts[rank]):int(ends[rank])])
        received.append(int(ends[rank] - starts[rank]))
    return torch.cat(parts), torch.tensor(received)


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    g, w = got.cpu().contiguous(), want.cpu().contiguous()
    if g.dtype.is_floating_point:
        return bool(((g == w) | (g.isnan() & w.isnan())).all())
    return torch.equal(g.reshape(-1).view(torch.uint8), w.reshape(-1).view(torch.uint8))


def _close(got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float) -> bool:
    if got.shape != want.shape:
        return False
    g, w = got.float().cpu(), want.float().cpu()
    finite = g.isfinite() & w.isfinite()
    same = (g == w) | (g.isnan() & w.isnan())
    return bool(torch.where(finite, (g - w).abs() <= atol + rtol * w.abs(), same).all())


def compare(call: Call, got, want) -> str | None:
    """None if ``got`` is what the reference says, else what differs."""
    if call.op == "all_to_all" and call.params["kind"] == "device":
        out, received = got
        n = int(received.sum())
        if not torch.equal(received.cpu(), want[1]):
            return f"received {received.tolist()}, want {want[1].tolist()}"
        got, want = out[:n], want[0]
    if call.op == "all_reduce_rms_norm":
        quant = call.params["quant"]
        if not _same_bits(got[1], want[1]):
            return "new_residual differs"
        if not _close(got[0], want[0], 0.07 if quant else 2e-2, 2e-2):
            return "normed differs"
        if quant == "fp8_per_token" and not _close(got[2].reshape(-1), want[2].reshape(-1), 2e-2, 1e-6):
            return "scales differ"
        return None
    if call.op == "all_gather_matmul":
        outs, gathered = got
        if not _same_bits(gathered, want[1]):
            return "gathered A differs"
        bad = [i for i, (o, w) in enumerate(zip(outs, want[0])) if not _same_bits(o, w)]
        return f"C of b[{bad[0]}] differs" if bad else None
    if not _same_bits(got, want):
        return f"values differ (got {got.reshape(-1)[:6].tolist()}, want {want.reshape(-1)[:6].tolist()})"
    return None


# ---- a batch on every rank, and the verdict --------------------------------------------------------------

def batch(seed: int, first: int, count: int, timeout_s: float = 5.0, workspace_bytes: int = 1 << 20,
          process_group: bool = True, indices: list[int] | None = None) -> list[dict]:
    """Run calls ``first..first+count-1`` (or ``indices``) on this rank (all ranks together); one
    outcome per call."""
    rank, world = dist.get_rank(), dist.get_world_size()
    environ = mock.patch.dict(os.environ, SYMMCOLL_TIMEOUT_S=str(timeout_s),
                              SYMMCOLL_WORKSPACE_BYTES=str(workspace_bytes))
    environ.start()
    symmcoll.reset()
    outcomes = []
    try:
        for call in draw_calls(seed, first, count, world, process_group, indices):
            t0 = time.monotonic()
            os.environ["SYMMCOLL_TIMEOUT_S"] = str(SLOW_TIMEOUT_S if call.differ is not None else timeout_s)
            outcome = _outcome(call, seed, rank, world)
            outcome["seconds"] = round(time.monotonic() - t0, 3)
            outcomes.append(outcome)
            # Every rank learns whether any rank needs a fresh workspace, and they all reset together.
            failed = torch.tensor([int(outcome["kind"] not in ("ok", "wrong"))])
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if failed.item():
                symmcoll.reset()
    finally:
        environ.stop()
        symmcoll.reset()
    return outcomes


def _outcome(call: Call, seed: int, rank: int, world: int) -> dict:
    mine = call.on(rank)
    try:
        got = run(mine, inputs(call, seed, rank, world))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        symmcoll.check()
    except symmcoll.SymmcollMismatchError as exc:
        return dict(kind="SymmcollMismatchError", fields=exc.fields, peer=exc.peer, message=str(exc)[:400])
    except Exception as exc:  # noqa: BLE001 - what was raised is the outcome
        return dict(kind=type(exc).__name__, message=str(exc)[:400])
    if call.differ is not None:
        return dict(kind="ok", note="returned although the call differs between ranks")
    problem = compare(call, got, expected(call, seed, rank, world))
    return dict(kind="wrong", message=problem) if problem else dict(kind="ok")


def verdict(seed: int, world: int, first: int, outcomes_by_rank: list[list[dict]],
            process_group: bool = True, indices: list[int] | None = None) -> list[str]:
    """Every failure of the batch, each naming its seed and call (how to run it again)."""
    calls = draw_calls(seed, first, len(outcomes_by_rank[0]), world, process_group, indices)
    failures = []
    for i, call in enumerate(calls):
        per_rank = [outcomes[i] for outcomes in outcomes_by_rank]
        problem = _judge(call, per_rank, world)
        if problem:
            failures.append(f"seed {seed}, call {call.index} (world {world}): {problem}\n    call: {asdict(call)}\n"
                            f"    outcomes: {per_rank}")
    return failures


def _judge(call: Call, per_rank: list[dict], world: int) -> str | None:
    if call.differ is None:
        bad = [(r, o) for r, o in enumerate(per_rank) if o["kind"] != "ok"]
        return f"rank {bad[0][0]}: {bad[0][1]['kind']}: {bad[0][1].get('message')}" if bad else None
    for rank, o in enumerate(per_rank):
        if o["kind"] != "SymmcollMismatchError":
            return f"rank {rank} did not raise SymmcollMismatchError for a different {call.differ}: {o}"
        if call.differ not in o["fields"]:
            return f"rank {rank}: fields {o['fields']} do not name {call.differ}"
        odd = set(call.odd)
        if len(odd) < world and (o["peer"] in odd) == (rank in odd):
            return f"rank {rank} names rank {o['peer']}, which made the same call"
    return None


# ---- the GPU stage: python3 tests/random_calls.py --device cuda-shared ... ---------------------------------

def _warm_up(args, process_group: bool) -> tuple[list[str], float]:
    """Compile what the run needs before it starts: ``args.warm_pools`` pools of ranks (all sharing the
    GPU) make every call once, each pool the calls of its share of (op, algorithm, dtype) (so that few
    kernels compile twice), at once; Triton's disk cache hands the kernels to the run's own pool. On
    the GPU compiling is nearly all of a first call's time (run 1: 116 of 118 s for 350 calls). Their
    verdicts come back too (calls made with other pools' kernels time-slicing the GPU beside them)."""
    import random_calls
    import threading
    import zlib
    from symmcoll import launch
    t0 = time.monotonic()
    calls = draw_calls(args.seed, 0, args.calls, args.world_size, process_group)
    shares = [[] for _ in range(args.warm_pools)]
    for call in calls:
        shares[zlib.crc32(f"{call.op}/{call.algorithm}/{call.dtype}".encode()) % args.warm_pools].append(call.index)
    failures, errors = [], []

    def run_share(indices):
        try:
            with launch.RankPool(args.world_size, device=args.device) as pool:
                got = pool.run(random_calls.batch, args.seed, 0, 0, args.timeout_s, 8 << 20, process_group,
                               indices, timeout=args.warm_timeout_s)
            failures.extend(verdict(args.seed, args.world_size, 0, got, process_group, indices))
        except Exception as exc:  # noqa: BLE001 - a warm-up that fails only leaves kernels to compile later
            errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    threads = [threading.Thread(target=run_share, args=(share,)) for share in shares if share]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - t0
    print(f"warm-up: {len(calls)} calls in {len(threads)} pools, {seconds:.0f} s, {len(failures)} failures"
          + (f", errors: {errors}" if errors else ""), flush=True)
    for failure in failures:
        print("warm-up:", failure, flush=True)
    return failures + [f"warm-up pool error: {e}" for e in errors], seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda-shared")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--timeout-s", type=float, default=3.0)
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="start no batch after this many seconds (the JSON says how many calls ran)")
    parser.add_argument("--warm-pools", type=int, default=0,
                        help="compile first in this many pools at once (_warm_up); 0: no warm-up")
    parser.add_argument("--warm-timeout-s", type=float, default=300.0)
    parser.add_argument("--only", type=lambda v: [int(i) for i in v.split(",")], default=None,
                        help="replay these calls (comma-separated indices) instead of 0..calls-1")
    parser.add_argument("--repeat", type=int, default=1, help="with --only: make the calls this many times")
    parser.add_argument("--without-process-group", action="store_true",
                        help="draw no call of the process group's own algorithms (as --device cuda-shared does)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import random_calls  # the ranks unpickle this module's functions by its name, not as __main__
    from symmcoll import launch
    from symmcoll.bench import provenance
    t0 = time.monotonic()
    # gloo lacks most collectives on GPU tensors; --without-process-group draws on CPU what cuda-shared draws
    process_group = args.device != "cuda-shared" and not args.without_process_group
    warm_failures, warm_seconds = _warm_up(args, process_group) if args.warm_pools and not args.only else ([], 0.0)
    indices = list(range(args.calls)) if args.only is None else args.only * args.repeat
    failures, outcomes = [], []

    def write_result():
        """The JSON as it stands (after every batch: a run cut off by its timeout keeps what it found)."""
        calls = draw_calls(args.seed, 0, 0, args.world_size, process_group, indices[:len(outcomes)])
        result = dict(provenance=asdict(provenance.collect("cuda" if args.device.startswith("cuda") else "cpu")),
                      seed=args.seed, world_size=args.world_size, device=args.device, calls=len(outcomes),
                      calls_asked=len(indices), differing=sum(c.differ is not None for c in calls),
                      failures=failures, warm_up=dict(pools=args.warm_pools, seconds=round(warm_seconds, 1),
                                                      failures=warm_failures),
                      seconds=round(time.monotonic() - t0, 1),
                      by_op={op: sum(c.op == op for c in calls) for op in sorted({c.op for c in calls})},
                      outcomes=[dict(call=asdict(c), ranks=o) for c, o in zip(calls, outcomes)])
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
        return result

    with launch.RankPool(args.world_size, device=args.device) as pool:
        slowest_batch = 0.0
        for first in range(0, len(indices), args.batch):
            # No batch starts that would end past the budget at the pace of the slowest one so far.
            if time.monotonic() - t0 + slowest_batch > args.budget_s:
                print(f"time budget of {args.budget_s:g} s spent after {first} calls", flush=True)
                break
            started = time.monotonic()
            part = indices[first:first + args.batch]
            got = pool.run(random_calls.batch, args.seed, 0, 0, args.timeout_s, 8 << 20, process_group, part,
                           timeout=900)
            new = verdict(args.seed, args.world_size, 0, got, process_group, part)
            for failure in new:
                print(failure, flush=True)
            failures += new
            outcomes += [[got[r][i] for r in range(args.world_size)] for i in range(len(part))]
            slowest_batch = max(slowest_batch, time.monotonic() - started)
            write_result()
            print(f"calls {first + len(part)}/{len(indices)}: {len(failures)} failures, {time.monotonic() - t0:.0f} s",
                  flush=True)
    result = write_result()
    print(f"{len(outcomes)} calls ({result['differing']} differing between ranks), {len(failures)} failures; "
          f"{args.out}")
    # A warm-up call that timed out may have starved behind the other pools' kernels; a wrong value is wrong.
    wrong_in_warm_up = [f for f in warm_failures if ": wrong:" in f]
    return 1 if failures or wrong_in_warm_up or len(outcomes) < len(indices) else 0


if __name__ == "__main__":
    sys.exit(main())
