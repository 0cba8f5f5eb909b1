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


def test_every_package_kernel_is_checked():
    jit = kernel_specs.package_jit_functions()
    kernels = {name for name in jit if name.rsplit(".", 1)[1].endswith("_kernel")}
    checked = {f"{s.kernel.__module__}.{s.kernel.__name__}" for s in SPECS}
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


# The GEMM core's tune candidates for the narrow-N cells at M = 1024-4096 (gemm_configs.candidates): C
# stored in halves through TMA (128x256, whole and split: 166-254 registers), the deep pipelines (128x128 at
# five and six stages, 128x256 / 256x128 at four), whole and shared (the wave split, stream-K).
NARROW_N_TILES = [(8192, 8192, 1024, (128, 256, 64, 16, 1, False, 8, 3, 1, True, True)),
                  (1024, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 3, 1, True, True)),
                  (1024, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 3, 1, False, True)),
                  (2048, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 3, 1, True, True, False, True)),
                  (1024, 2560, 8192, (128, 128, 64, 8, 4, False, 8, 6, 1, False, False, False, True)),
                  (1024, 2560, 8192, (128, 128, 64, 8, 4, False, 8, 5, 1, True, True)),
                  (1024, 2560, 8192, (128, 256, 64, 8, 4, False, 8, 4)),
                  (1024, 2560, 8192, (256, 128, 64, 8, 4, False, 8, 4))]


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
