"""Call descriptors: every dtype its own code; the cases issue 24 found, each raising on every rank within
milliseconds, naming the field (names only) and the other rank; empty inputs meeting their peers;
shapes with 0 rows everywhere; errors naming the public argument; the descriptor-cost probe of the GPU
stage compiles for sm_90."""

import importlib.util
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist

import kernel_specs
import symmcoll
from symmcoll import calls

from rank_checks import device

FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\[\]:]*$")


def test_every_dtype_has_its_own_code():
    dtypes = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    codes = [calls.DTYPE_CODES[d] for d in dtypes]
    assert len(set(codes)) == len(dtypes) and all(0 < c < calls.OTHER_DTYPE for c in codes)
    fields = {"op": "all_gather", "algorithm": "pull", "x.shape": (64,)}
    assert calls.encode(30, torch.int8, fields) != calls.encode(30, torch.float8_e4m3fn, fields)


def test_descriptor_bits():
    fields = {"op": "all_reduce", "algorithm": "one_shot", "dtype": "torch.bfloat16", "reduce_op": "max",
              "x.shape": (100,)}
    desc = calls.encode(2, torch.bfloat16, fields)
    assert desc & 1 and 0 < desc < 2 ** 31
    assert calls.decode(desc)["algorithm"] == 2 and calls.decode(desc)["argument"] == 2
    assert calls.decode(desc)["dtype"] == calls.DTYPE_CODES[torch.bfloat16]
    # one dimension off by less than 16384: never the same descriptor
    for shape in ((100,), (7, 33), (0, 5, 3)):
        for dim in range(len(shape)):
            descs = {calls.encode(2, torch.bfloat16, {**fields, "x.shape": shape[:dim] + (n,) + shape[dim + 1:]})
                     for n in range(0, 16384, 7)}
            assert len(descs) == len(range(0, 16384, 7)), (shape, dim)


def _timed(fn):
    t0 = time.monotonic()
    try:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        symmcoll.check()
    except symmcoll.SymmcollMismatchError as exc:
        return dict(fields=exc.fields, peer=exc.peer, seconds=time.monotonic() - t0, message=str(exc))
    return dict(fields=None, seconds=time.monotonic() - t0)


def _issue_cases():
    rank = dist.get_rank()
    bf = torch.bfloat16
    dev = device()
    cases = {
        # the bytes of one read as the other before: the two dtypes shared a code
        "int8 / fp8 all_gather": lambda: symmcoll.all_gather(
            torch.zeros(64, dtype=torch.int8 if rank == 0 else torch.float8_e4m3fn, device=dev)),
        # the empty rank returned at once, its peer timed out asking whether it called
        "empty / 1024": lambda: symmcoll.all_reduce(torch.ones(0 if rank == 0 else 1024, device=dev),
                                                    algorithm="one_shot"),
        # found after three timeouts, prose in .fields
        "all_reduce / all_gather": lambda: (symmcoll.all_reduce(torch.ones(64, device=dev), algorithm="one_shot")
                                            if rank == 0 else symmcoll.all_gather(torch.ones(64, device=dev))),
        # K differs: the unfused variant's reduce-scatter carries the fused op's descriptor
        "matmul K, unfused": lambda: symmcoll.matmul_reduce_scatter(
            torch.ones(4, 8 + rank, dtype=bf, device=dev), torch.ones(8 + rank, 5, dtype=bf, device=dev),
            algorithm="unfused"),
        "quantize group_size": lambda: symmcoll.all_reduce(torch.ones(256, device=dev), quantize="int8",
                                                           group_size=32 if rank else 64),
    }
    found = {}
    for name, fn in cases.items():
        found[name] = _timed(fn)
        dist.barrier()
        symmcoll.reset()
    return found


EXPECTED = {"int8 / fp8 all_gather": "dtype", "empty / 1024": "x.shape", "all_reduce / all_gather": "op",
            "matmul K, unfused": "a.shape", "quantize group_size": "group_size"}


def test_the_issues_cases_raise_at_once_on_every_rank(pools):
    for rank, found in enumerate(pools(2).run(_issue_cases)):
        for name, got in found.items():
            what = f"rank {rank}, {name}: {got}"
            assert got["fields"] is not None, f"{what}: no SymmcollMismatchError"
            assert EXPECTED[name] in got["fields"] and all(FIELD_NAME.match(f) for f in got["fields"]), what
            assert got["peer"] == 1 - rank, what
            assert got["seconds"] < 5, f"{what}: took {got['seconds']:.1f} s (SYMMCOLL_TIMEOUT_S is 20)"


def _world4_cases():
    """Rank 3 differs from ranks 0-2 in the header-polled kernels (sentinel, low latency): at world 4 the
    header poll is language.header_state's vector form (one load of every peer's header)."""
    rank = dist.get_rank()
    dev = device()
    found = {}
    for algorithm in ("sentinel_one_shot", "sentinel_two_shot"):
        found[algorithm] = _timed(lambda: symmcoll.all_reduce(torch.ones(96 + (rank == 3), device=dev),
                                                               algorithm=algorithm))
        dist.barrier()
        symmcoll.reset()
    return found


def test_world4_mismatch_names_the_rank_that_differs(pools):
    for rank, found in enumerate(pools(4).run(_world4_cases)):
        for algorithm, got in found.items():
            what = f"rank {rank}, {algorithm}: {got}"
            assert got["fields"] is not None and "x.shape" in got["fields"], what
            if rank != 3:
                assert got["peer"] == 3, what
            assert got["seconds"] < 5, what


def _shapes_and_names():
    world = dist.get_world_size()
    bf, dev = torch.bfloat16, device()
    out = {}
    ones = lambda *shape: torch.ones(shape, dtype=bf, device=dev)  # noqa: E731
    for algorithm in sorted(symmcoll.ALGORITHMS["all_gather_matmul"]) + ["nccl"]:
        c, g = symmcoll.all_gather_matmul(ones(0, 16), ones(16, 5), algorithm=algorithm, return_gathered=True)
        c2 = symmcoll.all_gather_matmul(ones(3, 0), ones(0, 5), algorithm=algorithm)
        out[algorithm] = (tuple(c.shape), tuple(g.shape), tuple(c2.shape), bool((c2 == 0).all()))
    errors = []
    a = torch.ones(4, 16, dtype=bf, device=dev)
    b = torch.ones(16, 10, dtype=bf, device=dev)[:, ::2]  # strided: neither contiguous nor a transposed W
    for fn in (lambda: symmcoll.all_gather_matmul(a, b),
               lambda: symmcoll.all_gather_matmul(a.t().contiguous().t(), a.t()),
               lambda: symmcoll.matmul_reduce_scatter(torch.ones(2 * world, 16, dtype=bf, device=dev), b),
               lambda: symmcoll.all_reduce_rms_norm(a, a.t().contiguous().t(), torch.ones(16, dtype=bf, device=dev),
                                                    1e-6)):
        try:
            fn()
            errors.append("returned")
        except ValueError as exc:
            errors.append(str(exc))
    return out, errors


def test_zero_rows_and_argument_names(pools):
    for out, errors in pools(2).run(_shapes_and_names):
        for algorithm, (c, g, c2, zeros) in out.items():
            assert (c, g, c2, zeros) == ((0, 5), (0, 16), (6, 5), True), algorithm
        assert errors[0].startswith("b must be contiguous"), errors[0]
        assert errors[1].startswith(("a_shard must be contiguous", "b must be contiguous")), errors
        assert errors[2].startswith("b must be contiguous"), errors[2]
        assert errors[3].startswith("residual must be contiguous"), errors[3]
        assert all("input 1" not in e and "call .contiguous()" in e for e in errors), errors


def test_descriptor_cost_probe_compiles_for_sm90():
    """Every variant of benchmarks/desc_check_cost.py compiles; the library's puts no load behind its
    stores before the first poll (run 1's did: +0.55 us per launch on one H200)."""
    import re
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "desc_check_cost.py"
    spec = importlib.util.spec_from_file_location("desc_check_cost", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sig = (("signal_pad_ptrs_dev", "i64"), ("status_ptr", "i64"), ("max_spins", "i32"), ("rank", "i32"),
           ("desc", "i32"), ("slot_ptrs_dev", "i64"), ("epochs_ptr", "*i32"), ("out_ptr", "*i32"), ("n_words", "i32"),
           ("slots_at", "i32"))
    loads_behind_stores = {}
    for variant, name in enumerate(module.VARIANTS):
        constexprs = (("WORLD", 2), ("BLOCK", module.BLOCK), ("VARIANT", variant), ("ROW", module.BLOCK))
        ptx = kernel_specs.compile_ptx(kernel_specs.CompileSpec(
            module.probe_kernel, sig + tuple((k, "constexpr") for k, _ in constexprs), constexprs, 4))
        assert "ld.volatile" in ptx and kernel_specs.spin_loop_problems(ptx) == [], name
        memory = re.findall(r"\b(ld\.volatile\.global|ld\.global|st\.global)", ptx)
        before = memory[:memory.index("ld.volatile.global")]
        if name != "split":  # split: program 0's path (the stores and its poll) may come second
            assert ("st.global" in before) == (name != "none"), f"{name}: the checks' stores are not where expected"
        if name != "none":
            after = memory[memory.index("st.global"):]
            loads_behind_stores[name] = after[:after.index("ld.volatile.global")].count("ld.global")
    assert loads_behind_stores["run 1"] >= 1, loads_behind_stores  # the walk can see what it guards against
    assert all(n == 0 for name, n in loads_behind_stores.items() if name != "run 1"), loads_behind_stores
    assert len(loads_behind_stores) == len(module.VARIANTS) - 1, loads_behind_stores
