"""Programmatic dependent launch (SYMMCOLL_PDL; launcher.pdl_meta, language/pdl.py) on the decode path's
kernels: a chain in which each kernel reads what the one before wrote -- all_reduce_rms_norm's one-shot
kernel, the GEMM core (whole tiles, then stream-K, then whole tiles of B the kernel before wrote),
matmul_all_reduce's one-shot kernel, the norm again -- gives the same bits with the switch on as off, and with it on every launch carries
the kernel's PDL constexpr and Triton's launch_pdl option (off: neither; the default in between: the GEMM
core's whole-tile decode launches carry both, and release the next kernel right after their wait --
gemm.launch_meta). CPU: the interpreter at world
sizes 1 and 2 (the wait and release are no-ops there; the launches and constexpr paths are what is
checked). GPU: also the compiled kernels' metadata (the fast path launches with it) and CUDA-graph
replays of the chain with changing data, against the switch off: a wait placed after a dependent
access would show here as a race. The PTX of the compiled kernels is checked in test_compile.py."""

from __future__ import annotations

import torch
import torch.distributed as dist

import pytest

import symmcoll
from symmcoll import launcher, plan
from symmcoll.fused import gemm, gemm_configs
from symmcoll.fused.gemm_configs import GemmConfig

from conftest import DEVICE

PDL_KERNELS = {"matmul_kernel", "matmul_all_reduce_kernel", "rms_norm_one_shot_kernel"}


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _dims():
    """(tokens, hidden, ffn, stream-K config of the down projection [ffn -> hidden], its programs):
    decode-sized on the GPU, tiny for the interpreter."""
    if torch.cuda.is_available():
        return 8, 2048, 8192, GemmConfig(16, 64, 128, 1, 4, True, 4, 6, stream_k=True), None
    return 3, 64, 256, GemmConfig(16, 32, 32, 1, 3, True, 4, 1, stream_k=True), 10


def _weights(seed: int):
    tokens, hidden, ffn, config, programs = _dims()
    g = torch.Generator().manual_seed(seed)
    scale = hidden ** -0.5
    w_up = (torch.randn(ffn, hidden, generator=g) * scale).bfloat16().to(_device()).t()  # nn.Linear's W.t()
    w_down = (torch.randn(ffn, hidden, generator=g) * ffn ** -0.5).bfloat16().to(_device())
    w_mix = (torch.randn(hidden, hidden, generator=g) * scale).bfloat16().to(_device())
    norm = (1 + 0.1 * torch.randn(hidden, generator=g)).bfloat16().to(_device())
    w_tok = (torch.randn(tokens, tokens, generator=g) * tokens ** -0.5).bfloat16().to(_device())
    return w_up, w_down, w_mix, norm, w_tok


def _inputs(call: int):
    tokens, hidden = _dims()[:2]
    g = torch.Generator().manual_seed(100 + call)
    return (torch.randn(tokens, hidden, generator=g).bfloat16().to(_device()),
            torch.randn(tokens, hidden, generator=g).bfloat16().to(_device()))


def _chain(x, residual, w_up, w_down, w_mix, norm, w_tok):
    """Six kernels, each reading the previous one's output -- the fourth as its B (a PDL-launched GEMM must
    wait before it loads B too, not only A)."""
    _, _, _, config, programs = _dims()
    normed, h = symmcoll.all_reduce_rms_norm(x, residual, norm, 1e-5, algorithm="one_shot")
    up = gemm.matmul(normed, w_up)
    down = gemm.matmul(up, w_down, config=config, programs=programs)
    mixing = gemm.matmul(w_tok, down)
    mixed = symmcoll.matmul_all_reduce(mixing, w_mix, algorithm="one_shot")
    return symmcoll.all_reduce_rms_norm(mixed, h, norm, 1e-5, algorithm="one_shot")


def _with_pdl(on: bool, fn, *args, decode: bool | None = None, small: bool | None = None):
    """``fn(*args)`` with the SYMMCOLL_PDL switch ``on``, the whole-tile decode GEMMs' own PDL
    (gemm.PDL_DECODE) ``decode`` and the small products' (gemm.PDL_SMALL) ``small`` (each default: as ``on``)."""
    saved = launcher.PDL, gemm.PDL_DECODE, gemm.PDL_SMALL
    launcher.PDL, gemm.PDL_DECODE, gemm.PDL_SMALL = (on, on if decode is None else decode,
                                                     on if small is None else small)
    plan.clear_cache()  # plans keep their launches' constexprs
    try:
        return fn(*args)
    finally:
        launcher.PDL, gemm.PDL_DECODE, gemm.PDL_SMALL = saved
        plan.clear_cache()


def _recorded_pdl(weights) -> list[tuple[str, bool, bool, bool]]:
    """(kernel, PDL constexpr, launch_pdl option, EARLY_RELEASE constexpr) of every launch of the chain,
    nothing run."""
    x, residual = _inputs(0)
    with launcher.recording() as launches:
        _chain(x, residual, *weights)
    return [(r.kernel.__name__, r.meta.get("PDL", False), r.meta.get("launch_pdl", False),
             r.meta.get("EARLY_RELEASE", False)) for r in launches]


def _eager(weights, calls: int) -> list[torch.Tensor]:
    outs = []
    for call in range(calls):
        normed, h = _chain(*_inputs(call), *weights)
        outs += [normed.clone(), h.clone()]
    return outs


def _pdl_on_and_off(calls: int):
    """Per switch state: the recorded launches and the chain's results for ``calls`` inputs (the first call
    compiles, later ones take the launcher's fast path on the GPU)."""
    weights = _weights(dist.get_world_size())
    tokens, hidden, ffn, config, programs = _dims()
    assert gemm_configs.split_plan(config, gemm_configs.tiles_of(config, tokens, hidden), ffn,
                                   programs or gemm.programs_for(config, _device())).stream, \
        "the chain's down projection must take the stream-K path"
    found = {}
    # off: no PDL at all; decode: the switch off, the whole-tile decode GEMMs' own PDL (the default); on
    for state, on, decode in (("off", False, False), ("decode", False, True), ("on", True, True)):
        _with_pdl(on, _eager, weights, 1, decode=decode)  # workspaces, plans, compiled kernels
        found[state] = (_with_pdl(on, _recorded_pdl, weights, decode=decode),
                        _with_pdl(on, _eager, weights, calls, decode=decode))
    return found


def _check_pdl_on_and_off(found):
    (off_launches, off_outs) = found["off"]
    (decode_launches, decode_outs), (on_launches, on_outs) = found["decode"], found["on"]
    assert {name for name, *_ in on_launches} == PDL_KERNELS, on_launches
    assert all(not pdl and not option and not early for _, pdl, option, early in off_launches), off_launches
    assert all(pdl and option for _, pdl, option, _ in on_launches), on_launches
    # the decode GEMMs of whole tiles (up, mixing) with PDL and early release, the stream-K one (down) and
    # the other kernels as the switch says (off)
    gemms = [(pdl, option, early) for name, pdl, option, early in decode_launches if name == "matmul_kernel"]
    assert len(gemms) == 3 and gemms[1] == (False, False, False) and (True, True, True) in gemms and all(
        g in ((True, True, True), (False, False, False)) for g in gemms), decode_launches
    assert all(not pdl for name, pdl, *_ in decode_launches if name != "matmul_kernel"), decode_launches
    assert [early for name, _, _, early in on_launches if name == "matmul_kernel"] == [g[2] for g in gemms], on_launches
    for i, (off, decode, on) in enumerate(zip(off_outs, decode_outs, on_outs)):
        for state, out in (("decode", decode), ("on", on)):
            assert torch.equal(off, out), \
                f"output {i}: PDL {state} differs from off (max {float((off.float() - out.float()).abs().max())})"
        assert torch.isfinite(on.float()).all()


@pytest.mark.parametrize("world", [1, 2], ids=lambda w: f"ws{w}")
def test_pdl_switch_sets_the_launch_option_and_changes_no_bit(pools, world):
    if DEVICE != "cpu" and world > 1:
        pytest.skip("on the GPU machine: world 1 (the decode path measured by gpu_check.sh's pdl stage)")
    for found in pools(world).run(_pdl_on_and_off, 3):
        _check_pdl_on_and_off(found)


def _compiled_and_graphed():
    """On the GPU: the launcher's compiled kernels keep launch_pdl in their metadata (its fast path launches
    them with it); the chain captured in a CUDA graph with PDL on, replayed on changing inputs, gives the
    bits the switch-off chain gives eagerly."""
    weights = _weights(1)
    x, residual = (t.clone() for t in _inputs(0))
    references = _with_pdl(False, _eager, weights, 6)  # (no PDL at all: decode follows the switch here)

    def capture_and_replay():
        _eager(weights, 2)  # compiled, and the fast path taken once
        compiled = {}
        for key, kernel in launcher._COMPILED.items():
            if key[0].__name__ in PDL_KERNELS and ("launch_pdl", True) in key[1]:
                compiled.setdefault(key[0].__name__, []).append(bool(kernel.metadata.launch_pdl))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _chain(x, residual, *weights)  # warm up on the capture stream
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            normed, h = _chain(x, residual, *weights)
        replayed = []
        for call in range(6):
            new_x, new_residual = _inputs(call)
            x.copy_(new_x)
            residual.copy_(new_residual)
            graph.replay()
            replayed += [normed.clone(), h.clone()]
        torch.cuda.synchronize()
        return compiled, replayed

    compiled, replayed = _with_pdl(True, capture_and_replay)
    return compiled, [torch.equal(a, b) for a, b in zip(references, replayed)]


@pytest.mark.gpu
def test_pdl_kernels_keep_the_option_compiled_and_in_graph_replays(pools):
    compiled, equal = pools(1).run(_compiled_and_graphed)[0]
    assert set(compiled) == PDL_KERNELS and all(all(v) for v in compiled.values()), compiled
    assert all(equal), f"graph replays with PDL differ from the eager chain without it: {equal}"


@pytest.mark.parametrize("m, n, k, config, expected", [
    (16, 8192, 2048, GemmConfig(16, 64, 128, 1, 1, True, 4, 5), True),  # 70b-tp4 o: 128 whole tiles, 32 MB
    (64, 8192, 4096, GemmConfig(64, 64, 256, 1, 1, True, 4, 3), True),  # 64 MB: the limit, inclusive
    (16, 5120, 8192, GemmConfig(16, 64, 128, 1, 1, True, 4, 6), False),  # 70b-tp2 qkv: 80 MB
    (16, 8192, 2048, GemmConfig(16, 64, 128, 1, 1, True, 4, 3, occupancy=2), False),  # two programs an SM
    (16, 2560, 8192, GemmConfig(16, 64, 128, 1, 4, True, 4, 5), False),  # the wave split (3 parts)
    (65, 8192, 2048, GemmConfig(128, 64, 128, 1, 1, True, 4, 4), False),  # past decode
], ids=["o-32MB", "64MB", "qkv-80MB", "occupancy2", "split", "M65"])
def test_decode_gemms_launch_with_pdl_and_early_release_by_rule(m, n, k, config, expected):
    """gemm.launch_meta: with the SYMMCOLL_PDL switch off, exactly the whole-tile decode launches of one
    program an SM and at most 64 MB of weights carry PDL, launch_pdl and EARLY_RELEASE (measured faster
    on one H200; the others were slower so); SYMMCOLL_PDL_DECODE=0 takes it away."""
    def record():
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((n, k), dtype=torch.bfloat16, device="meta").t()
        with launcher.recording() as launches:
            gemm.matmul(a, b, config=config, programs=132 * config.occupancy)
        return launches[0].meta
    meta = _with_pdl(False, record, decode=True)
    assert bool(meta.get("PDL")) == bool(meta.get("launch_pdl")) == bool(meta.get("EARLY_RELEASE")) == expected, meta
    assert not _with_pdl(False, record, decode=False).get("PDL")


@pytest.mark.parametrize("m, n, k, config, expected", [
    (1024, 1024, 1024, GemmConfig(64, 128, 128, 8, 1, False, 4, 4), True),  # the fused ops' 1024^3: 128 whole tiles
    (512, 1024, 1024, GemmConfig(64, 128, 128, 8, 1, False, 4, 4), True),   # smaller still
    (2048, 1024, 1024, GemmConfig(64, 128, 128, 8, 1, False, 4, 4), False),  # 2^31 multiply-adds
    (128, 8192, 1024, GemmConfig(64, 128, 128, 8, 1, False, 4, 4), False),  # 70b-tp8 o: 2^30, but 16 MB of B
    (1024, 1024, 1024, GemmConfig(64, 64, 128, 8, 1, False, 4, 3, occupancy=2), False),  # two programs an SM
    (1024, 1024, 1024, GemmConfig(128, 128, 64, 8, 2, False, 8, 4), False),  # split along K
], ids=["1024^3", "512x1024^2", "2048x1024^2", "70b-tp8-o", "occupancy2", "split"])
def test_small_products_launch_with_pdl_by_rule(m, n, k, config, expected):
    """gemm.small_pdl: with the SYMMCOLL_PDL switch off, exactly the core's whole-tile launches of one program an
    SM within the H200 table's "pdl_small" (<= 2^30 multiply-adds, <= 2 MB of B) carry PDL and launch_pdl --
    the plain matmul's and all_gather_matmul's lone-rank core alike -- and release the next kernel after their
    main loop (no EARLY_RELEASE); SYMMCOLL_PDL_SMALL=0 takes it away."""
    def record():
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((k, n), dtype=torch.bfloat16, device="meta")
        with launcher.recording() as launches:
            gemm.matmul(a, b, config=config, programs=132 * config.occupancy)
        return launches[0].meta
    meta = _with_pdl(False, record, small=True)
    assert bool(meta.get("PDL")) == bool(meta.get("launch_pdl")) == expected, meta
    assert not meta.get("EARLY_RELEASE")
    assert not _with_pdl(False, record, small=False).get("PDL")
    if expected:  # the fused op's lone-rank core carries the core's meta
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((k, n), dtype=torch.bfloat16, device="meta")
        out = torch.empty((m, n), dtype=torch.bfloat16, device="meta")
        core = _with_pdl(False, gemm.core_launch, a, b, False, out, config, 132, small=True)
        assert core.meta.get("PDL") and core.meta.get("launch_pdl"), core.meta


def _small_chain_bits(calls: int):
    """1024^3 products (the small-product rule's launches), each reading the one before -- the third takes it as
    B -- and the last through all_gather_matmul's lone-rank core (algorithm "fused"), eagerly without PDL and
    with the rule (eager, then a CUDA graph replayed on fresh inputs): whether each pair is bitwise equal, and
    which launches carried PDL."""
    dev = _device()
    g = torch.Generator().manual_seed(7)
    w = [(torch.randn(1024, 1024, generator=g) / 32).bfloat16().to(dev) for _ in range(3)]
    xs = [torch.randn(1024, 1024, generator=g).bfloat16().to(dev) for _ in range(calls)]

    def chain(x):
        h = gemm.matmul(x, w[0])
        h = gemm.matmul(h, w[1])
        h = gemm.matmul(w[2], h)
        return symmcoll.all_gather_matmul(h, w[0], algorithm="fused")

    references = [_with_pdl(False, chain, x, small=False).clone() for x in xs]

    def with_rule():
        eager = [chain(x).clone() for x in xs]  # (first: workspaces, plans and kernels made before the recording)
        with launcher.recording() as launches:
            chain(xs[0])
        flags = [(r.kernel.__name__, bool(r.meta.get("PDL")), bool(r.meta.get("launch_pdl"))) for r in launches
                 if r.kernel.__name__ in ("matmul_kernel", "ag_matmul_kernel")]
        x = xs[0].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            chain(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain(x)
        replayed = []
        for fresh in xs:
            x.copy_(fresh)
            graph.replay()
            replayed.append(out.clone())
        torch.cuda.synchronize()
        return flags, eager, replayed

    flags, eager, replayed = _with_pdl(False, with_rule, small=True)
    return flags, [torch.equal(a, b) for a, b in zip(references, eager)], \
        [torch.equal(a, b) for a, b in zip(references, replayed)]


@pytest.mark.gpu
def test_gpu_small_products_with_pdl_give_the_bits_of_no_pdl(pools):
    """On the GPU: a chain of 1024^3 products under the small-product rule (each launch waits for the one before
    it, which released it after its main loop) gives the bits of the chain without PDL, eagerly and in graph
    replays on fresh inputs; every GEMM launch of it carried PDL."""
    flags, eager, replayed = pools(1).run(_small_chain_bits, 4)[0]
    assert [name for name, *_ in flags] == ["matmul_kernel"] * 3 + ["ag_matmul_kernel"], flags
    assert all(pdl and option for _, pdl, option in flags), flags
    assert all(eager), f"eager chain with the small-product PDL differs from no PDL: {eager}"
    assert all(replayed), f"graph replays with the small-product PDL differ from no PDL: {replayed}"


def test_small_pdl_limits_come_from_the_gpu_models_table(monkeypatch):
    """The small products' limits are a measured setting of the GPU model's table ("pdl_small", kept through a
    re-tune's rewrite like "pdl_decode"): the H200's ships them, the H100's not. A decode launch within the
    decode rule takes early release instead (gemm._core_shape: never both)."""
    from symmcoll.fused import gemm_tables
    assert "pdl_small" in gemm_tables.TABLE_SETTINGS
    assert gemm_tables.pdl_small_limits("h200") == (1 << 30, 2 << 20)
    assert gemm_tables.pdl_small_limits("h100") is None
    assert gemm.small_pdl(1024, 1024, 1024, 2, False, 1, "h200") and not gemm.small_pdl(1024, 1024, 1024, 2, False,
                                                                                         1, "h100")
    # a decode-sized small product: early release by the decode rule, not both
    a = torch.empty((16, 256), dtype=torch.bfloat16, device="meta")
    b = torch.empty((256, 256), dtype=torch.bfloat16, device="meta")
    with launcher.recording() as launches:
        _with_pdl(False, gemm.matmul, a, b, decode=True, small=True)
    assert launches[0].meta.get("EARLY_RELEASE") and launches[0].meta.get("PDL")


def test_decode_pdl_limits_come_from_the_gpu_models_table(tmp_path):
    """The decode rule's limits are a measured setting of the GPU model's table ("pdl_decode"): the H200's
    ships them (M <= 64, B <= 64 MB), the H100's not (never measured there: no decode launch takes PDL),
    and gemm_tables.write_table keeps them through a re-tune's rewrite (the tune passes table_settings)."""
    from symmcoll.fused import gemm_tables
    assert gemm_tables.pdl_decode_limits("h200") == (64, 64 << 20)
    assert gemm_tables.pdl_decode_limits("h100") is None
    assert not gemm.decode_pdl(16, 8192, 2048, 2, False, 1, "h100")
    assert gemm.decode_pdl(16, 8192, 2048, 2, False, 1, "h200")
    h200 = gemm_tables.read_table("h200")
    rows = h200["entries"][:2]
    path = gemm_tables.write_table("h200", h200["provenance"], rows, tmp_path / "gemm_h200.json",
                                   gemm_tables.table_settings(h200))
    import json
    written = json.loads(path.read_text())
    assert written["pdl_decode"] == h200["pdl_decode"] and len(written["entries"]) == 2


@pytest.mark.parametrize("override, limits, rule, value, inside, outside, variable", [
    ("_LIMITS_OVERRIDE", "pdl_decode_limits", "decode_pdl", "32,1048576", (16, 512, 1024), (64, 512, 1024),
     "SYMMCOLL_PDL_DECODE_LIMITS"),
    ("_SMALL_OVERRIDE", "pdl_small_limits", "small_pdl", "4096,8192", (16, 16, 16), (16, 16, 32),
     "SYMMCOLL_PDL_SMALL_LIMITS"),
], ids=["decode", "small"])
def test_pdl_limits_override_stands_for_every_table(monkeypatch, override, limits, rule, value, inside, outside,
                                                    variable):
    """SYMMCOLL_PDL_DECODE_LIMITS / SYMMCOLL_PDL_SMALL_LIMITS (for measuring a rule where a table has none): its two
    limits stand for every GPU model's; a malformed value names the variable."""
    from symmcoll.fused import gemm_tables
    limits_of, takes = getattr(gemm_tables, limits), getattr(gemm, rule)
    monkeypatch.setattr(gemm_tables, override, value)
    limits_of.cache_clear()
    try:
        expected = tuple(int(v) for v in value.split(","))
        assert limits_of("h100") == limits_of("h200") == expected
        assert takes(*inside, 2, False, 1, "h100") and not takes(*outside, 2, False, 1, "h100")
        monkeypatch.setattr(gemm_tables, override, value.split(",")[0])
        limits_of.cache_clear()
        with pytest.raises(ValueError, match=variable):
            limits_of("h100")
    finally:
        monkeypatch.undo()
        limits_of.cache_clear()
