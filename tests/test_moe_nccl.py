"""The "nccl" MoE algorithm (fused/moe_nccl.py) against the oracle (reference.moe_dispatch / moe_combine),
bit for bit, over random routings drawn by hypothesis at 2 and 3 ranks (gloo): uneven loads, experts
nobody picks, ids outside [0, E) (-2, -1, E, E + 1), a token picking one expert twice, ranks that send
or receive nothing, max_recv_rows truncation (0 to the worst case), T = 0, random (inexact) values and
weights, so a different fp32 summation order in the combine would show; every output of dispatch (recv
with its zeroed tail, expert_counts, row_origin, self_rows: values, dtypes, shapes) and of combine. The
combine runs twice: with the route the dispatch kept (the op's path) and with one rebuilt from a copy of
row_origin (the path for a row_origin from elsewhere). Host reads: one ``.tolist()`` per dispatch, none
per combine, and the collectives each calls; and a census of every op (OpCensus) on tensors that stand
for a device other than the host, so that a host-built tensor or a host<->device copy fails on the CPU too."""

import collections
import random

import pytest
import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import symmcoll
from symmcoll import reference
from symmcoll.fused import moe_nccl

from rank_checks import CountedCalls, device

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(_bits(got), _bits(want))


def _inputs(case, rank):
    """Random tokens, expert outputs (max_rows rows: the tail past the received rows is not zero) and
    weights of both signs, seeded by the case and the rank."""
    gen = torch.Generator().manual_seed(case["seed"] * 16 + rank)
    tokens_n, hidden, k = case["tokens"], case["hidden"], case["k"]
    dtype = DTYPES[case["dtype"]]
    tokens = torch.randn((tokens_n, hidden), generator=gen).mul(3).to(dtype)
    expert_out = torch.randn((case["max_rows"], hidden), generator=gen).mul(3).to(dtype)
    weights = torch.randn((tokens_n, k), generator=gen)
    ids = torch.tensor(case["ids"][rank], dtype=torch.int64).reshape(tokens_n, k)
    ids = ids.to(torch.int32) if case["seed"] % 2 else ids
    return tokens.to(device()), expert_out.to(device()), weights.to(device()), ids.to(device())


def _check(case):
    """One rank: every output of the library's nccl dispatch and combine against the oracle's; returns
    the names of the outputs that differ."""
    rank = torch.distributed.get_rank()
    tokens, expert_out, weights, ids = _inputs(case, rank)
    experts, max_rows = case["experts"], case["max_rows"]
    recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts, max_recv_rows=max_rows, algorithm="nccl")
    want = reference.moe_dispatch(tokens, ids, experts, max_rows=max_rows)
    got = (recv, counts, handle.row_origin, handle.self_rows)
    wrong = [name for name, g, w in zip(("recv", "expert_counts", "row_origin", "self_rows"), got, want)
             if not _same(g, w)]
    if tokens.dtype in (torch.bfloat16, torch.float16, torch.float32) and not len(tokens):
        # The oracle cannot combine no tokens (its reshape to [0, k, -1] is ambiguous): an empty result.
        if not _same(symmcoll.moe_combine(expert_out, weights, handle, algorithm="nccl"), tokens):
            wrong.append("combine of no tokens")
    elif tokens.dtype in (torch.bfloat16, torch.float16, torch.float32):
        want_combined = reference.moe_combine(expert_out, weights, ids, want[2], experts)
        if not _same(symmcoll.moe_combine(expert_out, weights, handle, algorithm="nccl"), want_combined):
            wrong.append("combine")
        rebuilt = moe_nccl.route_for(handle.row_origin.clone(), ids, experts)
        if not _same(moe_nccl.combine(expert_out, weights, ids, experts, rebuilt), want_combined):
            wrong.append("combine with a rebuilt route")
    return wrong


@st.composite
def cases(draw, world):
    """A routing for every rank: ids from [-2, E + 2) with some ranks' tokens all invalid, all on one
    rank, or all on one expert; max_rows from 0 to the worst case (most often the worst case)."""
    local = draw(st.integers(1, 3))
    experts = world * local
    tokens_n, k = draw(st.integers(0, 12)), draw(st.integers(1, 4))
    ids = []
    for _ in range(world):
        style = draw(st.sampled_from(["any", "any", "invalid", "one_rank", "one_expert"]))
        if style == "invalid":
            pool = [-2, -1, experts, experts + 1]
        elif style == "one_rank":
            owner = draw(st.integers(0, world - 1))
            pool = list(range(owner * local, (owner + 1) * local)) + [-1]
        elif style == "one_expert":
            pool = [draw(st.integers(0, experts - 1))]
        else:
            pool = list(range(-2, experts + 2))
        ids.append(draw(st.lists(st.sampled_from(pool), min_size=tokens_n * k, max_size=tokens_n * k)))
    worst = world * tokens_n * min(k, local)
    max_rows = draw(st.one_of(st.just(worst), st.integers(0, worst)))
    return {"tokens": tokens_n, "k": k, "experts": experts, "hidden": draw(st.integers(1, 6)),
            "dtype": draw(st.sampled_from(sorted(DTYPES))), "max_rows": max_rows, "ids": ids,
            "seed": draw(st.integers(0, 2 ** 16))}


def _dense_case(world):
    """Every token with k = 4 valid slots over 2 experts per rank (repeats too: more rows than the default
    max_rows W * T * min(k, E/W), so some are dropped), in random order, in fp32 (bf16's
    rounding hides most one-ulp fp32 differences): a combine that adds a token's slots in any order but
    the oracle's (slot 0, 1, 2, 3) shows at once (the returned rows arrive by owner rank)."""
    rng = random.Random(world)
    return {"tokens": 12, "k": 4, "experts": 2 * world, "hidden": 5, "dtype": "fp32", "max_rows": 12 * world * 2,
            "ids": [[rng.randrange(2 * world) for _ in range(48)] for _ in range(world)], "seed": 7}


def _one_receiver_case(world):
    """Every slot on rank 0's experts or invalid: the other ranks receive nothing; rank 0 keeps 5 rows."""
    rng = random.Random(world + 10)
    return {"tokens": 7, "k": 3, "experts": 2 * world, "hidden": 3, "dtype": "fp32", "max_rows": 5,
            "ids": [[rng.choice([0, 1, -1, 2 * world]) for _ in range(21)] for _ in range(world)], "seed": 9}


@pytest.mark.parametrize("world", [2, 3])
def test_nccl_algorithm_equals_the_oracle(pools, world):
    # No shrinking: a failure closes the rank pool, and every shrink step would start new ranks (minutes).
    @settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.reuse, Phase.generate))
    @given(cases(world))
    @example(_dense_case(world))
    @example(_one_receiver_case(world))
    def check(case):
        results = pools(world).run(_check, case)  # a failure closes the pool: the next example reopens it
        assert results == [[]] * world, (case, results)

    check()


def _count_calls(tokens_n, hidden, experts, k):
    """One rank: calls of host reads and collectives in the module's dispatch and combine, and
    ``.tolist()`` calls in the ops' (algorithm="nccl"; the op adds its own bookkeeping, no host read of
    the routing)."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    ids = torch.tensor([[(t + j + rank) % (experts + 1) - (j == 1) for j in range(k)] for t in range(tokens_n)],
                       device=device())
    tokens = torch.randn((tokens_n, hidden)).to(torch.bfloat16).to(device())
    weights = torch.rand((tokens_n, k), device=device())
    with CountedCalls() as in_dispatch:
        recv, counts, origin, _, route = moe_nccl.dispatch(tokens, ids, experts)
    with CountedCalls() as in_combine:
        moe_nccl.combine(recv, weights, ids, experts, route)
    with CountedCalls() as in_op_dispatch:
        recv, _, handle = symmcoll.moe_dispatch(tokens, ids, experts, algorithm="nccl")
    with CountedCalls() as in_op_combine:
        symmcoll.moe_combine(recv, weights, handle, algorithm="nccl")
    return (in_dispatch.calls, in_combine.calls, in_op_dispatch.calls.get("tolist", 0),
            in_op_combine.calls.get("tolist", 0), world)


def test_one_host_read_per_dispatch_none_per_combine(pools):
    for rank_calls in pools(3).run(_count_calls, 12, 8, 6, 3):
        dispatch, combine, op_dispatch_reads, op_combine_reads, _ = rank_calls
        gathers = sum(dispatch.pop(name, 0) for name in ("all_gather_single", "all_gather_into_tensor"))
        assert gathers == 1 and dispatch == {"tolist": 1, "all_to_all_single": 1}, rank_calls
        assert combine == {"all_to_all_single": 1}, rank_calls
        assert (op_dispatch_reads, op_combine_reads) == (1, 0), rank_calls


# What a CUDA host would wait for, besides the one .tolist() of the counts: a tensor made from Python
# data (lift_fresh), a scalar read (_local_scalar_dense: item, int(), bool()), ops whose output size
# depends on the data (nonzero, masked_select, unique, bincount's minlength read, repeat_interleave
# without output_size, indexing with a mask). Copies between host and device are told by OpCensus.
SYNCING_OPS = {"lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "nonzero", "masked_select", "_unique",
               "_unique2", "unique_dim", "unique_consecutive", "bincount", "masked_scatter"}
# Ops that launch no kernel: allocations (views are told by the op itself).
NO_KERNEL_OPS = {"empty", "empty_strided", "new_empty"}
# Kernel-launching torch ops allowed per call (every slot valid, no row dropped, recv padded; at world size 1
# the layer made 78 and 13 before it was rewritten for few ops): a new op per call fails here.
MOST_DISPATCH_OPS, MOST_COMBINE_OPS = 32, 6
# The device the census's tensors say they are on: "meta" stands for "not the host" (a GPU) while their
# data stays in the real tensors the OnDevice wrappers hold (on the CPU in the CPU tests).
CENSUS_DEVICE = torch.device("meta")
COLLECTIVES = ("all_to_all_single", "all_gather_single", "all_gather_into_tensor")


class OnDevice(torch.Tensor):
    """A tensor on CENSUS_DEVICE: a wrapper with the real tensor's shape, strides and dtype that holds it
    (``data_held``); only OpCensus runs ops on it."""

    @staticmethod
    def __new__(cls, real: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(cls, real.shape, strides=real.stride(),
                                                      storage_offset=real.storage_offset(), dtype=real.dtype,
                                                      device=CENSUS_DEVICE)
        wrapper.data_held = real
        return wrapper

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on an OnDevice tensor outside OpCensus")


def _real(a):
    return a.data_held if isinstance(a, OnDevice) else a


class OpCensus(TorchDispatchMode):
    """Every aten op in a ``with`` block, run on a device that is not the host even in the CPU tests.

    The census's inputs are OnDevice tensors: they say they live on CENSUS_DEVICE, so a factory given
    ``device=tokens.device`` makes an OnDevice tensor too (its real tensor on ``real_device``), while a
    tensor made any other way -- from Python data, by a factory that names no device or the CPU, by
    ``.cpu()`` / ``.to("cpu")`` -- is a plain tensor: a HOST tensor, as it would be next to a GPU. An op
    that makes or takes a host tensor is what a CUDA host would copy (pageable: it waits) or compute
    itself, so it is named in ``syncing``: "host->device copy" / "device->host copy" for a ``_to_copy``
    or ``copy_`` across the two, "host tensor" for any other; with the ops of SYNCING_OPS and mask
    indexing. The one exception is the counts' read: ``.tolist()`` of an OnDevice tensor copies it to
    the host (as torch does for a CUDA tensor: one ``_to_copy``, which a plain CPU tensor never makes),
    counted in ``read_copies``. Collectives are handed the real tensors (gloo cannot move wrappers);
    the ops they run themselves are counted, not judged. ``work`` counts the ops that launch a kernel."""

    def __init__(self, real_device: torch.device):
        super().__init__()
        self.real_device = real_device

    def __enter__(self):
        self.work, self.syncing, self.read_copies = collections.Counter(), [], 0
        self._reading = self._in_collective = False
        self._saved = [(torch.Tensor, "tolist", torch.Tensor.__dict__.get("tolist"), torch.Tensor.tolist)]
        self._saved += [(dist, name, getattr(dist, name), getattr(dist, name)) for name in COLLECTIVES
                        if hasattr(dist, name)]
        torch.Tensor.tolist = self._read(torch.Tensor.tolist)
        for owner, name, _, current in self._saved[1:]:
            setattr(owner, name, self._collective(current))
        return super().__enter__()

    def __exit__(self, *exc):
        for owner, name, original, _ in self._saved:
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        return super().__exit__(*exc)

    def _read(self, tolist):
        def read(tensor):
            if not isinstance(tensor, OnDevice):
                return tolist(tensor)
            self._reading = True
            try:
                host = tensor.to("cpu")                   # as torch's tolist of a CUDA tensor does
            finally:
                self._reading = False
            return tolist(host)
        return read

    def _collective(self, call):
        def collective(*args, **kwargs):
            real_args, real_kwargs = pytree.tree_map(_real, (args, kwargs))
            self._in_collective = True
            try:
                return call(*real_args, **real_kwargs)
            finally:
                self._in_collective = False
        return collective

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if not func.is_view and name not in NO_KERNEL_OPS:
            self.work[name] += 1
        if self._in_collective:
            return func(*args, **kwargs)
        leaves = pytree.tree_leaves((args, kwargs))
        on_device = [a for a in leaves if isinstance(a, OnDevice)]
        on_host = [a for a in leaves if isinstance(a, torch.Tensor) and not isinstance(a, OnDevice)]
        to = kwargs.get("device")
        to_device = bool(on_device) if to is None else torch.device(to) == CENSUS_DEVICE
        real_args, real_kwargs = pytree.tree_map(_real, (args, kwargs))
        if to is not None and to_device:
            real_kwargs["device"] = self.real_device
        out = func(*real_args, **real_kwargs)
        same = {id(a.data_held): a for a in on_device}      # an in-place or out= op returns its argument

        def placed(o):
            if not isinstance(o, torch.Tensor):
                return o
            if id(o) in same:
                return same[id(o)]
            return OnDevice(o) if to_device else o
        out = pytree.tree_map(placed, out)
        made_on_host = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor)
                        and not isinstance(o, OnDevice)]
        if self._reading and name == "_to_copy" and on_device and not to_device:
            self.read_copies += 1
            self.work[name] -= 1                        # the read's copy, not a kernel of the layer
        elif name in ("_to_copy", "copy_", "_copy_from") and (on_device or to_device) and (on_host or made_on_host):
            source = args[1] if name == "copy_" else args[0]
            self.syncing.append(f"{func}: {'device->host' if isinstance(source, OnDevice) else 'host->device'} copy")
        elif on_host or made_on_host:
            self.syncing.append(f"{func}: host tensor")
        elif name in SYNCING_OPS \
                or (name in ("index", "index_put", "index_put_")
                    and any(t.dtype in (torch.bool, torch.uint8) for t in leaves[1:]
                            if isinstance(t, torch.Tensor))) \
                or (name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 3):
            self.syncing.append(str(func))
        return out


def _forget_census_constants() -> None:
    """Drop the layer's cached constants made for CENSUS_DEVICE (OnDevice tensors, usable only in a census)."""
    moe_nccl._ARANGES.pop(CENSUS_DEVICE, None)
    for cache in (moe_nccl._SCALARS, moe_nccl._TABLES):
        for key in [key for key in cache if key[0] == CENSUS_DEVICE]:
            del cache[key]


def _census(tokens_n, hidden, experts, k, max_rows, invalid):
    """One rank: the layer's dispatch + combine on OnDevice tensors (OpCensus: any tensor made or moved
    on the host shows, on the CPU as on a GPU) under OpCensus and CountedCalls; the outputs checked
    against the oracle's. Returns (work ops of dispatch, of combine, syncing ops, host reads with
    "read copies": the device->host copies of the reads, outputs that differ, dispatch's ops)."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens_n)])
    if invalid:
        ids[::3, 0] = -1
        ids[1::5, -1] = experts
    tokens = torch.randn((tokens_n, hidden), generator=gen).to(torch.bfloat16).to(device())
    weights = torch.randn((tokens_n, k), generator=gen).to(device())
    ids = ids.to(device())
    want = reference.moe_dispatch(tokens, ids, experts, max_rows=max_rows)
    expert_out = want[0] * 3
    want_combined = reference.moe_combine(expert_out, weights, ids, want[2], experts)
    outputs = []
    try:
        for _ in range(2):                      # the second call: with the cached constants
            with CountedCalls() as reads:
                with OpCensus(device()) as in_dispatch:
                    recv, counts, origin, self_rows, route = moe_nccl.dispatch(
                        OnDevice(tokens), OnDevice(ids), experts, max_rows=max_rows)
                with OpCensus(device()) as in_combine:
                    combined = moe_nccl.combine(OnDevice(expert_out), OnDevice(weights), OnDevice(ids), experts,
                                                route)
            outputs.append([_real(t) for t in (recv, counts, origin, self_rows, combined)])
    finally:
        _forget_census_constants()
    wrong = [name for got in outputs for name, g, w in
             zip(("recv", "expert_counts", "row_origin", "self_rows", "combine"), got, (*want, want_combined))
             if not _same(g, w)]
    calls = dict(reads.calls, read_copies=in_dispatch.read_copies + in_combine.read_copies)
    return (sum(in_dispatch.work.values()), sum(in_combine.work.values()),
            in_dispatch.syncing + in_combine.syncing, calls, wrong, dict(in_dispatch.work))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_no_host_copies_or_syncs_but_the_counts_read(pools, world):
    """Dispatch + combine build every tensor on the tokens' device, read the host once (the counts'
    .tolist(), whose one device->host copy is the only copy between host and device), call no op that
    synchronises a CUDA host, and launch at most MOST_*_OPS ops; with invalid ids and dropped rows too (a
    few more ops then: the weights' mask, the kept prefixes). The layer runs on OnDevice tensors, so a
    host-built tensor or a copy across host and device fails here on the CPU as it would on a GPU (a
    copy from the CPU to the CPU makes no op at all: a plain CPU run cannot see one)."""
    experts, tokens_n, k = 4 * world, 24, 3
    for max_rows, invalid in ((world * tokens_n * k, False), (5, True)):
        for rank, (dispatch_ops, combine_ops, syncing, reads, wrong, ops) in enumerate(
                pools(world).run(_census, tokens_n, 16, experts, k, max_rows, invalid)):
            where = f"rank {rank} of {world}, max_rows {max_rows}, invalid ids {invalid}"
            host_reads = {name: n for name, n in reads.items() if name not in COLLECTIVES}
            assert wrong == [] and syncing == [] and host_reads == {"tolist": 1, "read_copies": 1}, \
                (where, wrong, syncing, reads)
            if not invalid:
                assert dispatch_ops <= MOST_DISPATCH_OPS and combine_ops <= MOST_COMBINE_OPS, \
                    (where, dispatch_ops, combine_ops, ops)
