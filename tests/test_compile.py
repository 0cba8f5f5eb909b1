"""Every kernel the library launches compiles for sm_90 on a machine with no GPU, its waits spin on
atomics or volatile loads only, and no ``@triton.jit`` kernel of the package goes unchecked.

The specs are not written by hand: kernel_specs.py records the launches every registered algorithm
makes (on meta tensors, nothing runs) and compiles exactly those."""

import os
import re

import pytest
import torch
import triton
import triton.language as tl

import kernel_specs
from symmcoll import launcher
from symmcoll.fused.gemm_configs import GemmConfig

SPECS = kernel_specs.compile_specs()


@pytest.fixture(scope="module", autouse=True)
def _cache_filled_on_every_core(request):
    """Every core compiles the specs of the selected tests (a cold cache: ~200 s on one core for all of
    them); the tests then read their kernels from Triton's cache and check them. Where the cache is warm
    this costs the workers' start (~5 s); a run of other tests (-k) compiles nothing here."""
    selected = [item.callspec.params["spec"].name for item in request.session.items
                if item.module is request.module and "spec" in getattr(getattr(item, "callspec", None), "params", {})]
    workers = min(len(os.sched_getaffinity(0)), 8, len(selected))
    if workers > 1 and os.environ.get("TRITON_INTERPRET") != "1":
        kernel_specs.compile_in_parallel(selected, workers)


# The spin count is stored so the compiler cannot delete the loops (a side-effect-free infinite loop
# is removed outright, which is one more reason a plain-load spin is wrong).
@triton.jit
def _plain_spin(flag_ptr, spins_ptr):
    spins = 0
    while tl.load(flag_ptr) == 0:
        spins += 1
    tl.store(spins_ptr, spins)


@triton.jit
def _volatile_spin(flag_ptr, spins_ptr):
    spins = 0
    while tl.load(flag_ptr, volatile=True) == 0:
        spins += 1
    tl.store(spins_ptr, spins)


@triton.jit
def _reduction_loop(values_ptr, n, total_ptr):
    total = 0.0
    for i in range(n):  # loads in a loop that stores nothing, but its exit tests the counter only
        total += tl.load(values_ptr + i)
    tl.store(total_ptr, total)


def test_checker_accepts_a_reduction_loop():
    sig = (("values_ptr", "*fp32"), ("n", "i32"), ("total_ptr", "*fp32"))
    assert kernel_specs.spin_loop_problems(
        kernel_specs.compile_ptx(kernel_specs.CompileSpec(_reduction_loop, sig, (), 4))) == []


def test_checker_flags_a_plain_spin_and_accepts_a_volatile_one():
    sig = (("flag_ptr", "*i32"), ("spins_ptr", "*i32"))
    bad = kernel_specs.spin_loop_problems(kernel_specs.compile_ptx(kernel_specs.CompileSpec(_plain_spin, sig, (), 4)))
    good = kernel_specs.spin_loop_problems(kernel_specs.compile_ptx(kernel_specs.CompileSpec(_volatile_spin, sig, (), 4)))
    assert bad, "a spin on a plain ld.global must be reported"
    assert good == []


# Gluon kernels: a launch on meta tensors runs their Triton twin, so no recorded launch compiles them; each has
# its own compile test below.
GLUON_CHECKED = {"symmcoll.fused.gemm_gluon.decode_kernel"}


def test_every_package_kernel_is_checked():
    jit = kernel_specs.package_jit_functions()
    kernels = {name for name in jit if name.rsplit(".", 1)[1].endswith("_kernel")}
    checked = {f"{s.kernel.__module__}.{s.kernel.__name__}" for s in SPECS} | GLUON_CHECKED
    assert kernels, "no kernels found: the walk is broken"
    assert sorted(kernels - checked) == [], "kernels no recorded launch compiles"
    assert kernel_specs.unreferenced_helpers(jit) == [], "jit functions neither *_kernel nor called by another"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_kernel_compiles_for_sm90(spec):
    ptx = kernel_specs.compile_ptx(spec)
    assert ".target sm_90" in ptx
    assert kernel_specs.spin_loop_problems(ptx) == []
    # signal sends and waits (CAS in a loop) are ordered at system scope
    assert kernel_specs.unordered_cas_in_loops(ptx) == []


# The GEMM core's tune candidates for the narrow-N cells at M = 1024-4096 (gemm_candidates.candidates): C
# stored in halves through TMA (128x256, whole and split: 166-254 registers), the deep pipelines (128x128 at
# five and six stages, 128x256 / 256x128 at four), whole and shared (the wave split, stream-K, summed apart).
NARROW_N_TILES = [(8192, 8192, 1024, (128, 256, 64, 16, 1, False, 8, 3, 1, True, True)),
                  (1024, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 3, 1, True, True)),
                  (1024, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 3, 1, False, True)),
                  (2048, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 3, 1, True, True, False, True)),
                  (1024, 2560, 8192, (128, 128, 64, 8, 4, False, 8, 6, 1, False, False, False, True)),
                  (1024, 2560, 8192, (128, 128, 64, 8, 4, False, 8, 5, 1, True, True)),
                  (1024, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 4)),
                  (1024, 2560, 8192, (256, 128, 64, 8, 4, False, 8, 4)),
                  # the wave split summed apart (sum_apart, the 15th field) at the QKV cell 128x1280: 10 tiles in 13
                  # parts (128x128 p6: 98 registers against 128 summing in the kernel), 5 in 16 (128x256 p4: 181)
                  (128, 1280, 8192, (128, 128, 64, 8, 16, False, 8, 6, 1, False, False, False, False, 0, True)),
                  (128, 1280, 8192, (128, 256, 64, 8, 16, False, 8, 4, 1, False, False, False, False, 0, True)),
                  # summed apart past M = 512: the wave split of a short last wave (2048x2304x16384: 12 tiles of
                  # 128x256 in 11 parts, C through TMA) and stream-K over a last wave of 28 tiles (2048x2560)
                  (2048, 2304, 16384, (128, 256, 64, 8, 16, False, 8, 3, 1, False, True, False, False, 0, True)),
                  (2048, 2560, 8192, (128, 256, 64, 8, 16, False, 8, 3, 1, False, False, False, True, 0, True)),
                  # the deep pipelines past the candidates' 200 KB budget (gemm_candidates.DEEP_STAGES): 216 / 224 KB
                  (128, 5120, 8192, (64, 128, 64, 8, 1, False, 4, 9)),
                  (128, 2560, 8192, (64, 64, 128, 8, 4, False, 4, 7))]


@pytest.mark.parametrize("m, n, k, fields", NARROW_N_TILES, ids=lambda v: str(v))
def test_gemm_tiles_of_the_narrow_n_cells_compile_without_spills(m, n, k, fields):
    """Compiled as the GPU specialises the launch (kernel_specs.compile_specialised; the unspecialised
    specs above count other registers): ptxas spills nothing, and shared memory stays within
    GemmConfig.smem_bytes' budget plus the epilogue's layout conversion."""
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_configs import SMEM_BYTES, GemmConfig

    config = GemmConfig(*fields)
    with launcher.recording() as recorded:
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((k, n), dtype=torch.bfloat16, device="meta")
        gemm.matmul(a, b, config=config, programs=132)
    compiled = kernel_specs.compile_specialised(recorded[0])
    registers, spilled = kernel_specs.ptxas_usage(compiled.asm["ptx"])
    assert spilled == 0, f"{config.label}: {spilled} bytes spilled at {registers} registers"
    assert config.smem_bytes(2) <= SMEM_BYTES and compiled.metadata.shared <= kernel_specs.SHARED_MEMORY_LIMIT


# Two-part tiles (GemmConfig.block_n2) as the tuner offers them at 512x2560x8192 (one wave of 128 tiles on
# 132 SMs; 108 of cuBLAS's 128 x 96 with 7 stages), B row-major and W^T: ptxas on CPU (triton 3.6) read
# 144 / 138 registers at 64x(128+32)x64 p4, no spills; the widest, 128x(256+64)x64 p3, 242 / 188.
TWO_PART_TILES = [(64, 128, 64, 8, 1, False, 4, 4, 1, False, False, False, False, 32),
                  (128, 64, 64, 8, 1, False, 8, 7, 1, False, False, False, False, 32),
                  (128, 256, 64, 8, 1, False, 8, 3, 1, False, False, False, False, 64)]


@pytest.mark.parametrize("b_t", [False, True], ids=["B", "W^T"])
@pytest.mark.parametrize("fields", TWO_PART_TILES, ids=lambda v: f"{v[0]}x{v[1]}+{v[13]}x{v[2]}")
def test_gemm_two_part_tiles_run_two_wgmma_widths_from_three_tma_loads(fields, b_t):
    """Compiled as the GPU specialises the launch: both column parts are tensor-core dots (wgmma of
    n = block_n and n = block_n2, fp32 accumulators), B's two parts and A come by TMA, the pipeline keeps
    its stages in shared memory, and ptxas spills nothing."""
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_configs import SMEM_BYTES, GemmConfig

    config = GemmConfig(*fields).fitted(2)
    with launcher.recording() as recorded:
        a = torch.empty((512, 8192), dtype=torch.bfloat16, device="meta")
        b = (torch.empty((2560, 8192), dtype=torch.bfloat16, device="meta").t() if b_t else
             torch.empty((8192, 2560), dtype=torch.bfloat16, device="meta"))
        gemm.matmul(a, b, config=config, programs=132)
    assert dict(kernel_specs.spec_of(recorded[0]).constexprs)["BN2"] == config.block_n2
    compiled = kernel_specs.compile_specialised(recorded[0])
    ptx = compiled.asm["ptx"]
    widths = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16", ptx))
    assert widths == {str(config.block_n), str(config.block_n2)}, widths
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d", ptx)) >= 3 * (config.num_stages - 1)
    assert config.smem_bytes(2) <= SMEM_BYTES and compiled.metadata.shared >= config.smem_bytes(2)
    registers, spilled = kernel_specs.ptxas_usage(ptx)
    assert spilled == 0, f"{config.label}: {spilled} bytes spilled at {registers} registers"


# Two-part tiles wave-split (round 9) as the tuner offers them under one wave: 256x2560 in 32 tiles of
# 128x(128+32), 4 parts; 128x1280 in 32 of 64x(64+16), 4 parts; 128x1280 in 16 of 128x(64+16), 8 parts.
# ptxas on CPU (triton 3.6): 140, 78 and 78 registers (B and W^T alike), no spills.
SPLIT_TWO_PART_TILES = [(256, 2560, (128, 128, 64, 8, 4, False, 8, 5, 1, False, False, False, False, 32)),
                        (128, 1280, (64, 64, 64, 8, 4, False, 4, 6, 1, False, False, False, False, 16)),
                        (128, 1280, (128, 64, 64, 8, 8, False, 8, 6, 1, False, False, False, False, 16))]


@pytest.mark.parametrize("b_t", [False, True], ids=["B", "W^T"])
@pytest.mark.parametrize("m, n, fields", SPLIT_TWO_PART_TILES, ids=lambda v: str(v) if isinstance(v, int) else
                         f"{v[0]}x{v[1]}+{v[13]}-s{v[4]}")
def test_gemm_two_part_tiles_wave_split_store_both_partials_from_registers(m, n, fields, b_t):
    """Compiled as the GPU specialises the launch: the split kernel (SPLIT) runs both column parts as
    tensor-core dots, stores both fp32 partials 16 bytes at a time straight from the accumulators (no
    tile through shared memory but a 16-wide second part), bumps the tile's counter once, and ptxas
    spills nothing."""
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_configs import GemmConfig

    config = GemmConfig(*fields)
    with launcher.recording() as recorded:
        a = torch.empty((m, 8192), dtype=torch.bfloat16, device="meta")
        b = (torch.empty((n, 8192), dtype=torch.bfloat16, device="meta").t() if b_t else
             torch.empty((8192, n), dtype=torch.bfloat16, device="meta"))
        gemm.matmul(a, b, config=config, programs=132)
    constexprs = dict(kernel_specs.spec_of(recorded[0]).constexprs)
    assert constexprs["SPLIT"] and not constexprs["STREAM"] and constexprs["BN2"] == config.block_n2
    ptx = kernel_specs.compile_specialised(recorded[0]).asm["ptx"]
    widths = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16", ptx))
    assert widths == {str(config.block_n), str(config.block_n2)}, widths
    per_thread = config.block_m * config.tile_n // (32 * config.num_warps)
    assert len(re.findall(r"\bst\.global\.v4\.b32", ptx)) >= per_thread // 4  # both partials, 16 bytes a store
    # a 16-wide second part's [BM, 16] is converted through shared memory (4 KB at 64 rows; in the whole tile's
    # store too), never the first part: at most 2 such conversions, 16 bytes a thread's 4 values
    second_values = config.block_m * config.block_n2 // (32 * config.num_warps)
    allowed = 2 * second_values // 4 if config.block_n2 == 16 else 0
    assert len(re.findall(r"\bld\.shared\.v4", ptx)) <= allowed, "an fp32 tile converted through shared memory"
    assert len(re.findall(r"\batom\.[\w.]*\.add\.", ptx)) == 1, "one counter bump a shared tile"
    registers, spilled = kernel_specs.ptxas_usage(ptx)
    assert spilled == 0, f"{config.label}: {spilled} bytes spilled at {registers} registers"


@pytest.mark.parametrize("fields", [(128, 256, 64, 8, 4, False, 8, 3, 1, False, True), (128, 128, 64, 8, 4, False, 8, 6)],
                         ids=lambda v: "x".join(map(str, v[:3])))
def test_gemm_split_partials_go_from_the_accumulators_registers(fields):
    """The wave split's fp32 partials at 2048x1280x8192 (80 tiles of 128x256 in 3 parts; 160 of
    128x128, 28 in 4 parts), compiled as the GPU specialises them: the partial is stored and read back
    in the wgmma accumulator's own order (gemm_split.to_slot_order), 16-byte accesses straight from
    and into registers -- no fp32 tile staged through shared memory (ld.shared.v4: 64 a thread at
    128x256 before, 16 at 128x128) -- and nothing spilled."""
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_configs import GemmConfig

    config = GemmConfig(*fields)
    with launcher.recording() as recorded:
        a = torch.empty((2048, 8192), dtype=torch.bfloat16, device="meta")
        b = torch.empty((1280, 8192), dtype=torch.bfloat16, device="meta").t()
        gemm.matmul(a, b, config=config, programs=132)
    assert dict(kernel_specs.spec_of(recorded[0]).constexprs)["SPLIT"]
    ptx = kernel_specs.compile_specialised(recorded[0]).asm["ptx"]
    per_thread = config.block_m * config.block_n // (32 * config.num_warps)
    assert len(re.findall(r"\bst\.global\.v4\.b32", ptx)) >= per_thread // 4  # the partial: 16 bytes a store
    assert len(re.findall(r"\bld\.shared\.v4", ptx)) == 0, "an fp32 tile converted through shared memory"
    registers, spilled = kernel_specs.ptxas_usage(ptx)
    assert spilled == 0, f"{config.label}: {spilled} bytes spilled at {registers} registers"


@pytest.mark.parametrize("m, n, k, b_t, mode", [(256, 4096, 7168, False, 1), (256, 4096, 7168, False, 2),
                                                (1024, 1024, 1024, True, 2)],
                         ids=["dsv3-256-pair_reduce", "dsv3-256-exchange_halves", "1024-W^T-exchange_halves"])
def test_gemm_pairs_add_the_partner_partial_in_registers(m, n, k, b_t, mode):
    """Two parts a tile summed in pairs (64 tiles of 128 x 128 on 132 SMs), compiled as the GPU specialises them:
    gemm_split.pair_reduce (the first part's 64 KB partial stored, the second's load) or exchange_halves (each
    part stores 32 KB and loads 32 KB), in the accumulator's own order (16-byte accesses, no fp32 tile through
    shared memory), two atomic adds a tile (pair_reduce: the ticket and the release; exchange_halves: arrival and
    departure; the wait's ``atomic_add(0)`` compiles to an acquire load), nothing spilled."""
    from symmcoll.fused import gemm
    from symmcoll.fused.gemm_configs import GemmConfig

    config = GemmConfig(128, 128, 64, 8, 2, False, 8, 6 if m == 256 else 4)
    with launcher.recording() as recorded, gemm.pair_reduce_switched(mode):
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = (torch.empty((n, k), dtype=torch.bfloat16, device="meta").t() if b_t
             else torch.empty((k, n), dtype=torch.bfloat16, device="meta"))
        gemm.matmul(a, b, config=config, programs=132)
    constexprs = dict(kernel_specs.spec_of(recorded[0]).constexprs)
    assert constexprs["SPLIT"] and constexprs["PAIR"] == mode
    ptx = kernel_specs.compile_specialised(recorded[0]).asm["ptx"]
    values = 64 if mode == 1 else 32  # fp32 values of a thread's partial stored, and of the partner's loaded
    assert len(re.findall(r"\bst\.global\.v4\.b32", ptx)) >= values // 4
    assert len(re.findall(r"\bld\.global\.cg\.v4\.b32", ptx)) >= values // 4
    assert len(re.findall(r"\bld\.shared\.v4", ptx)) == 0, "an fp32 tile converted through shared memory"
    assert len(re.findall(r"\batom\.[\w.]*\.add\.", ptx)) == 2, "two counter bumps a tile"
    assert re.search(r"\bld\.global\.gpu\.acquire\.b32", ptx), "the wait reads the counter with acquire"
    assert kernel_specs.spin_loop_problems(ptx) == []
    registers, spilled = kernel_specs.ptxas_usage(ptx)
    assert spilled == 0, f"{config.label}: {spilled} bytes spilled at {registers} registers"


@pytest.mark.parametrize("quant", [None, "fp8_per_token"])
@pytest.mark.parametrize("tokens, hidden, block, warps, ahead", [
    (32, 16384, 16384, 32, False), (32, 4096, 4096, 8, True), (8192, 6144, 8192, 32, False),
    (512, 16384, 4096, 16, False)], ids=["16-per-thread", "ahead", "8-per-thread", "chunked"])
def test_rms_local_path_accesses(quant, tokens, hidden, block, warps, ahead):
    """all_reduce_rms_norm's one-shot kernel on one rank, compiled as the GPU specialises it: every load and
    the 16-bit stores 16 bytes wide, fp8 stores 8 (no layout of their own: no trip through shared memory,
    which holds only the reductions' per-warp partials), and no division per value."""
    from symmcoll import plan
    from symmcoll.fused import all_reduce_rms_norm as arn
    from symmcoll.fused.memory_bound_configs import RmsConfig
    x = torch.empty((tokens, hidden), dtype=torch.bfloat16, device="meta")
    request = plan.Request(arn.OP, x.shape, x.dtype, torch.device("cuda"), options=(("eps", 1e-6), ("quant", quant)))
    p = plan.Plan(request, "kernel", plan.algorithms(arn.OP)["one_shot"], None, 1, 0, kernel_specs.FakeWorkspace(1, 0),
                  RmsConfig(block, 528, warps, ahead), 3, None)
    with launcher.recording() as launches:
        p.algorithm.run(p, x, None, torch.empty_like(x), torch.empty((hidden,), dtype=x.dtype, device="meta"))
    compiled = kernel_specs.compile_specialised(launches[0])
    ptx = compiled.asm["ptx"]
    assert compiled.metadata.shared <= 8 * warps, f"{compiled.metadata.shared} bytes of shared memory"
    assert set(re.findall(r"ld\.global\S*", ptx)) == {"ld.global.v4.b32"}
    stores = set(re.findall(r"st\.global\S*", ptx))
    assert stores == ({"st.global.v4.b32", "st.global.v2.b32", "st.global.b32"} if quant else {"st.global.v4.b32"})
    assert len(re.findall(r"\bdiv\.", ptx)) <= 3, "a division per value"


@pytest.mark.parametrize("world, dtype", [(4, torch.bfloat16), (2, torch.float32)], ids=str)
def test_chunked_sum_accesses(world, dtype):
    """matmul_reduce_scatter chunked's sum of the W partials (4x H100 bench shape, 8192 x 8192 a layer),
    compiled as the GPU specialises it: every load and store 16 bytes wide, no spills."""
    from symmcoll import plan
    from symmcoll.fused import matmul_reduce_scatter as mrs
    m, n, k = 8192, 8192, 28672 // world
    a, b = torch.empty((m, k), dtype=dtype, device="meta"), torch.empty((k, n), dtype=dtype, device="meta")
    request = plan.Request(mrs.OP, a.shape, dtype, torch.device("cuda"), others=((b.shape, dtype, a.device),))
    p = plan.Plan(request, "kernel", plan.algorithms(mrs.OP)["chunked"], None, world, 1,
                  kernel_specs.FakeWorkspace(world, 1), None, 3, (m // world, n))
    with launcher.recording() as launches:
        p.algorithm.run(p, a, torch.empty((m // world, n), dtype=dtype, device="meta"), b)
    names = [rec.kernel.__name__ for rec in launches]
    assert names == ["barrier_kernel"] * world + ["sum_partials_kernel"], names  # W-1 steps, the exit
    ptx = kernel_specs.compile_specialised(launches[-1]).asm["ptx"]
    assert set(re.findall(r"ld\.global\S*", ptx)) == {"ld.global.v4.b32"}
    assert set(re.findall(r"st\.global\S*", ptx)) == {"st.global.v4.b32"}
    assert kernel_specs.ptxas_usage(ptx)[1] == 0


@pytest.mark.parametrize("quant", ["fp8_per_tensor", "fp8_per_token"])
@pytest.mark.parametrize("dtype, hidden", [(torch.float32, 1), (torch.bfloat16, 1), (torch.float32, 3)])
def test_rms_fp8_tiny_rows_compile(dtype, hidden, quant):
    """all_reduce_rms_norm's one-shot kernel with fp8 output at rows one or a few values wide, as the GPU
    specialises it: a one-value fp32 row made triton 3.6's coalesce pass fail on the fp8 store's
    contiguity hint (call 150 of issue 24's random calls on an H100)."""
    from symmcoll import plan
    from symmcoll.fused import all_reduce_rms_norm as arn
    x = torch.empty((1, hidden), dtype=dtype, device="meta")
    request = plan.Request(arn.OP, x.shape, x.dtype, torch.device("cuda"), options=(("eps", 1e-6), ("quant", quant)))
    chosen = plan.algorithms(arn.OP)["one_shot"]
    p = plan.Plan(request, "kernel", chosen, None, 1, 0, kernel_specs.FakeWorkspace(1, 0),
                  chosen.gpu_configs(request, 1), 3, None)
    with launcher.recording() as launches:
        p.algorithm.run(p, x, None, torch.empty_like(x), torch.empty((hidden,), dtype=dtype, device="meta"))
    assert ".target sm_90" in kernel_specs.compile_specialised(launches[0]).asm["ptx"]


def _pdl_cases():
    """(label, thunk) of the decode path's PDL kernels (launcher.pdl_meta) on meta tensors: the GEMM core
    (decode tiles whole, by the wave split and stream-K; B^T; the large-M TMA tile with its flattened
    loop and C stored in halves; pointer loads), matmul_all_reduce's one-shot kernel at the tensor-parallel
    block's world-1 down projection and at two ranks, all_reduce_rms_norm's one-shot kernel at decode
    sizes on one rank and at two."""
    from symmcoll import plan
    from symmcoll.fused import all_reduce_rms_norm as arn
    from symmcoll.fused import gemm
    from symmcoll.fused import matmul_all_reduce as mar
    from symmcoll.fused.gemm_configs import GemmConfig

    def matmul(m, n, k, config=None, b_t=False):
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((n, k) if b_t else (k, n), dtype=torch.bfloat16, device="meta")
        gemm.matmul(a, b.t() if b_t else b, config=config, programs=132)

    def one_shot(world, m, n, k):
        a = torch.empty((m, k), dtype=torch.bfloat16, device="meta")
        b = torch.empty((n, k), dtype=torch.bfloat16, device="meta").t()
        request = plan.Request(mar.OP, (m, k), a.dtype, torch.device("cuda"), others=(((k, n), a.dtype, a.device),))
        p = plan.Plan(request, "kernel", plan.algorithms(mar.OP)["one_shot"], None, world, 0,
                      kernel_specs.FakeWorkspace(world, 0), None, 3, (m, n))
        mar._one_shot(p, a, torch.empty((m, n), dtype=a.dtype, device="meta"), b)

    def rms(world, tokens, hidden):
        x = torch.empty((tokens, hidden), dtype=torch.bfloat16, device="meta")
        request = plan.Request(arn.OP, x.shape, x.dtype, torch.device("cuda"), options=(("eps", 1e-6), ("quant", None)))
        chosen = plan.algorithms(arn.OP)["one_shot"]
        p = plan.Plan(request, "kernel", chosen, None, world, 0, kernel_specs.FakeWorkspace(world, 0),
                      chosen.gpu_configs(request, world), 3, None)
        p.algorithm.run(p, x, None, torch.empty_like(x), torch.empty((hidden,), dtype=x.dtype, device="meta"))

    def alone(m, n, k, algorithm):
        with kernel_specs.h100_tables():
            kernel_specs.alone_launch(m, n, k, algorithm)

    return [("gemm 16x1280x8192 auto", lambda: matmul(16, 1280, 8192)),
            ("gemm 16x8192x2048 whole, early release", lambda: matmul(16, 8192, 2048, GemmConfig(16, 64, 128, 1, 1, True,
                                                                                              4, 5), True)),
            ("gemm 16x1280x8192 stream-K", lambda: matmul(16, 1280, 8192, GemmConfig(16, 64, 128, 1, 4, True, 4, 6,
                                                                                     stream_k=True))),
            ("gemm 64x8192x8192 B^T", lambda: matmul(64, 8192, 8192, GemmConfig(64, 128, 64, 8, 1, False, 4, 4), True)),
            ("gemm 8192^3 flattened, C halves", lambda: matmul(8192, 8192, 8192, GemmConfig(128, 256, 64, 8, 1, False, 8,
                                                                                            3, 1, True, True))),
            ("gemm 33x100x72 pointers", lambda: matmul(33, 100, 72)),
            ("matmul_all_reduce ws1 1x8192x28672", lambda: one_shot(1, 1, 8192, 28672)),
            ("matmul_all_reduce ws2 8x8192x14336", lambda: one_shot(2, 8, 8192, 14336)),
            ("rms ws1 1x8192", lambda: rms(1, 1, 8192)),
            ("rms ws1 8x8192", lambda: rms(1, 8, 8192)),
            ("rms ws1 2048x4096", lambda: rms(1, 2048, 4096)),
            ("rms ws2 6x8192", lambda: rms(2, 6, 8192)),
            # all_gather_matmul alone, C only: the GEMM core's loop inside the op's kernel (ALONE_CORE)
            ("all_gather_matmul ws1 1024^3", lambda: alone(1024, 1024, 1024, "fused")),
            ("all_gather_matmul ws1 16384x8192x8192", lambda: alone(16384, 8192, 8192, "copy_engine_producer"))]


# Instructions that touch global memory (or may: generic addresses): everything but the state spaces a
# kernel owns (.param, .shared, .local, .const).
_MEMORY_OP = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st|atom|red|cp\.async|cp\.reduce|tensormap|prefetch|multimem)\S*)")
_OWN_SPACE = re.compile(r"^(?:ld|st)\.(?:param|shared|local|const)")


@pytest.mark.parametrize("case", _pdl_cases(), ids=lambda c: c[0])
def test_pdl_kernels_wait_before_any_global_access(monkeypatch, case):
    """With SYMMCOLL_PDL on, each decode-path kernel compiled for sm_90 as the GPU specialises it: one
    unpredicated griddepcontrol.wait in the entry block (every thread passes it, before any branch) and
    no instruction that touches global memory before it (device-side descriptors are written there too);
    griddepcontrol.launch_dependents present; Triton's launch_pdl in the compiled metadata (what the
    launcher's fast path launches with). The same launch without PDL: no griddepcontrol at all, and the
    PDL build costs at most 2 registers more and spills nothing more."""
    label, thunk = case
    monkeypatch.setattr(launcher, "PDL", True)
    with launcher.recording() as launches:
        thunk()
    assert launches and all(r.meta.get("PDL") and r.meta.get("launch_pdl") for r in launches), label
    for rec in launches:
        on = kernel_specs.compile_specialised(rec)
        off_meta = {k: v for k, v in rec.meta.items() if k not in ("PDL", "launch_pdl")}
        off = kernel_specs.compile_specialised(launcher.Recorded(rec.kernel, rec.grid, rec.args, off_meta))
        ptx = on.asm["ptx"]
        assert on.metadata.launch_pdl and not off.metadata.launch_pdl
        assert "griddepcontrol" not in off.asm["ptx"]
        assert ptx.count("griddepcontrol.wait") == 1, f"{label}: {ptx.count('griddepcontrol.wait')} waits"
        assert "griddepcontrol.launch_dependents" in ptx
        body = ptx[ptx.index(".entry"):].splitlines()
        wait = next(i for i, line in enumerate(body) if "griddepcontrol.wait" in line)
        if rec.meta.get("EARLY_RELEASE"):  # (gemm.launch_meta: the whole-tile decode launches)
            following = [line for line in body[wait + 1:] if line.strip() and not line.strip().startswith(
                (".loc", "//", "$L__"))]
            assert "griddepcontrol.launch_dependents" in following[0], \
                f"{label}: early release is not right after the wait ({following[0]})"
        assert not re.match(r"^\s*@", body[wait]), f"{label}: the wait is predicated"
        before = body[:wait]
        assert not [line for line in before if re.match(r"^\s*\$L__BB\w+:", line) or re.search(r"\bbra\b", line)], \
            f"{label}: the wait is not in the entry block"
        touching = [m.group(1) for m in map(_MEMORY_OP.match, before) if m and not _OWN_SPACE.match(m.group(1))]
        assert touching == [], f"{label}: {touching} before griddepcontrol.wait"
        (regs_on, spill_on), (regs_off, spill_off) = kernel_specs.ptxas_usage(ptx), kernel_specs.ptxas_usage(
            off.asm["ptx"])
        assert regs_on <= regs_off + 2 and spill_on <= spill_off, \
            f"{label}: {regs_on} registers ({spill_on} B spilled) with PDL, {regs_off} ({spill_off} B) without"


@pytest.mark.parametrize("kind", ["two_shot", "one_shot"])
@pytest.mark.parametrize("world, dtype, quant", [(4, torch.bfloat16, None), (4, torch.bfloat16, "fp8_per_token"),
                                                 (3, torch.bfloat16, "fp8_per_token"), (4, torch.float32, None)],
                         ids=str)
def test_rms_bulk_launches_on_several_ranks(kind, world, dtype, quant):
    """all_reduce_rms_norm's kernels on several ranks past the one-shot sizes (8192 x 16384, gpu_config's
    bulk rule), compiled as the GPU specialises them: nothing spilled (whole rows at 32 warps spilled 412
    bytes at 64 registers in the two-shot kernel), one program an SM, and the words to and from peers
    in 16-byte accesses -- stores into peers' slots, polls, EMPTY resets (a mask on the row's exact
    word count made them 4-byte: 140 scalar stores and 194 scalar polls)."""
    from symmcoll import plan
    from symmcoll.fused import all_reduce_rms_norm as arn
    x = torch.empty((8192, 16384), dtype=dtype, device="meta")
    request = plan.Request(arn.OP, x.shape, x.dtype, torch.device("cuda"), options=(("eps", 1e-6), ("quant", quant)))
    chosen = plan.algorithms(arn.OP)[kind]
    config = chosen.gpu_configs(request, world)
    p = plan.Plan(request, "kernel", chosen, None, world, 1, kernel_specs.FakeWorkspace(world, 1), config, 3, None)
    with launcher.recording() as launches:
        p.algorithm.run(p, x, None, torch.empty_like(x), torch.empty((x.shape[1],), dtype=dtype, device="meta"))
    assert config.max_programs == 132 and config.block < x.shape[1], config
    ptx = kernel_specs.compile_specialised(launches[0]).asm["ptx"]
    registers, spilled = kernel_specs.ptxas_usage(ptx)
    assert spilled == 0, f"{spilled} bytes spilled at {registers} registers"
    assert len(re.findall(r"\bld\.volatile\.global\.v4\.b32", ptx)) >= 4
    assert len(re.findall(r"\bst\.global\.v4\.b32", ptx)) >= 4
    # what stays 4 bytes wide: headers, the epoch table, the error record, the wait's give-up path
    assert len(re.findall(r"\bst\.global\.b32", ptx)) <= 24


def _opcodes(ptx: str) -> dict:
    """How many times each PTX instruction occurs (predicates, operands, labels, directives and debug
    lines left out)."""
    counts: dict = {}
    for line in ptx.splitlines():
        text = re.sub(r"^@!?%p\d+\s+", "", line.strip())
        if text and not text.startswith(("//", ".", "$L", "{", "}", "(", ")")):
            op = text.split()[0].rstrip(";")
            counts[op] = counts.get(op, 0) + 1
    return counts


@pytest.mark.parametrize("m, n, k", [(1024, 1024, 1024), (16384, 8192, 8192)], ids=lambda v: str(v))
def test_all_gather_matmul_alone_compiles_to_the_gemm_core(m, n, k):
    """all_gather_matmul's kernel at world size 1 without a gathered A, compiled as the GPU specialises
    it with the H100 table's configs (1024^3: 64x64x128 flattened, 2 tiles a program; 16384x8192x8192:
    128x256 with the last wave split and C by descriptor): the same registers, shared memory and
    instructions as the GEMM core's matmul_kernel. Its own consumer loop (SYMMCOLL_AGMM_ALONE_OWN_LOOP)
    compiled to 86 registers, 131104 bytes of shared memory and a pipeline refilled every tile at 1024^3
    (the core: 68, 139296, one pipeline over all of a program's tiles)."""
    (ours,), (core,) = kernel_specs.recorded_alone_and_core(m, n, k, "fused")
    mine, theirs = kernel_specs.compile_specialised(ours), kernel_specs.compile_specialised(core)
    assert kernel_specs.ptxas_usage(mine.asm["ptx"]) == kernel_specs.ptxas_usage(theirs.asm["ptx"])
    assert mine.metadata.shared == theirs.metadata.shared
    assert _opcodes(mine.asm["ptx"]) == _opcodes(theirs.asm["ptx"])


def test_all_gather_matmul_alone_runs_the_h200_tables_deep_pipeline_as_the_core_does():
    """At 256 x 1280 x 8192 the H200 table's config is a deep pipeline (64x128x64, 9 stages: 216 KB, past the
    candidates' 200 KB budget; wave-split): all_gather_matmul's kernel alone (the core's loop) compiles with it
    to the core's shared memory, within what a block may take, and spills nothing."""
    (ours,), (core,) = kernel_specs.recorded_alone_and_core(256, 1280, 8192, "fused", table="h200")
    mine, theirs = kernel_specs.compile_specialised(ours), kernel_specs.compile_specialised(core)
    assert theirs.metadata.num_stages == 9 and mine.metadata.num_stages == 9
    assert mine.metadata.shared == theirs.metadata.shared <= kernel_specs.SHARED_MEMORY_LIMIT
    assert theirs.metadata.shared >= 216 * 1024
    assert kernel_specs.ptxas_usage(mine.asm["ptx"])[1] == 0 == kernel_specs.ptxas_usage(theirs.asm["ptx"])[1]


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("prefetch, registers, at_most, spill", [(False, None, 80, 0), (True, None, 80, 20),
                                                                  (False, 64, 64, 0)], ids=lambda v: str(v))
def test_quantized_programs_fit_on_their_sms(monkeypatch, fmt, prefetch, registers, at_most, spill):
    """Every program of a quantized launch must be resident at once (a program waits for a peer's program
    of the same id): LaunchConfig(2048, 396, 8) puts 3 programs of 8 warps on each of 132 SMs, which
    65536 registers hold at <= 80 a thread; SYMMCOLL_QUANT_MAXNREG=64 holds 4 (528 programs). The
    prefetched kernel (SYMMCOLL_QUANT_PREFETCH, 110-128 registers unbounded) is capped at 80; at int8 it
    spills 20 bytes (5 words stored before stage 1 and read back after it, none in a loop's step)."""
    from symmcoll import debug_switches, plan
    from symmcoll.comm import quantized
    monkeypatch.setattr(quantized, "PREFETCH", prefetch)
    monkeypatch.setattr(debug_switches, "QUANT_MAXNREG", registers)
    numel = 8 << 20
    request = plan.Request(quantized.OP, (numel,), torch.bfloat16, torch.device("cuda"), "sum", None, None, (),
                           (("group_size", 64),))
    p = plan.Plan(request, "kernel", plan.algorithms(quantized.OP)[f"quantized_{fmt}"], None, 2, 1,
                  kernel_specs.FakeWorkspace(2, 1), quantized.GPU_CONFIGS.pick(request.nbytes, 2), 3, (numel,))
    x = torch.empty((numel,), dtype=torch.bfloat16, device="meta")
    with launcher.recording() as launches:
        quantized._run(fmt, p, x, torch.empty_like(x))
    compiled = kernel_specs.compile_specialised(launches[0])
    used, spilled = kernel_specs.ptxas_usage(compiled.asm["ptx"])
    assert used <= at_most and spilled <= (spill if fmt == "int8" else 0), (used, spilled)


def test_pdl_placement_probe_builds_for_sm90():
    """benchmarks/pdl_placement_probe.py (the next GPU session's probe of where a chain of decode GEMMs' programs
    run under PDL): its kernel -- the GEMM core's K-loop with %smid and %globaltimer records -- builds for sm_90 with
    PDL, so the probe cannot fail on the device for want of compiling."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "pdl_placement_probe.py"
    spec = importlib.util.spec_from_file_location("pdl_placement_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    probe.compile_only()


# The Gluon decode kernel (fused/gemm_gluon.py): tokens tiles 16 / 32 / 64, B and W^T, k-steps of 256 and 128, with
# PDL and without, B's first k-steps before the wait and (the probe's comparison) after it.
GLUON_DECODE = [(GemmConfig(16, 64, 256, 1, 1, True, 4, 5, gluon=True), False, True, True),
                (GemmConfig(64, 64, 256, 1, 3, True, 4, 3, gluon=True), True, True, True),
                (GemmConfig(32, 64, 128, 1, 3, True, 4, 9, gluon=True), False, False, True),
                (GemmConfig(16, 64, 256, 1, 1, True, 4, 5, gluon=True), True, True, False),
                (GemmConfig(64, 64, 128, 1, 3, True, 4, 9, gluon=True, a_stages=3), False, True, True)]


@pytest.mark.parametrize("config, b_t, pdl, b_early", GLUON_DECODE,
                         ids=lambda v: v.label if isinstance(v, GemmConfig) else str(v))
def test_gluon_decode_kernel_loads_b_before_the_pdl_wait(config, b_t, pdl, b_early):
    """sm_90 build without spills, one program an SM by shared memory; with PDL exactly the ring's first STAGES
    TMA loads (B's, a weight's) come before ``griddepcontrol.wait`` and every load of A after it (none at all
    before it with B_EARLY off); without PDL no grid-dependency instruction at all; no spin on a plain load."""
    from symmcoll.fused import gemm_gluon
    compiled = gemm_gluon.compile_sm90(config, b_t, pdl, b_early=b_early)
    ptx = compiled.asm["ptx"]
    assert ".target sm_90" in ptx and kernel_specs.spin_loop_problems(ptx) == []
    assert kernel_specs.ptxas_usage(ptx)[1] == 0
    assert compiled.metadata.shared <= kernel_specs.SHARED_MEMORY_LIMIT
    lines = ptx.splitlines()
    loads = [i for i, line in enumerate(lines) if "cp.async.bulk.tensor" in line]
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    if pdl:
        assert len(waits) == 1 and sum(i < waits[0] for i in loads) == (config.num_stages if b_early else 0)
    else:
        assert waits == [] and "griddepcontrol" not in ptx
