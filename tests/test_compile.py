"""Every kernel compiles for sm_90 on a machine with no GPU, and waits spin on atomics only."""

import pytest
import triton
import triton.language as tl

from symmcoll import compile_check


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


def test_checker_flags_a_plain_spin_and_accepts_a_volatile_one():
    bad = compile_check.spin_loop_problems(compile_check.compile_ptx(
        compile_check.CompileSpec(_plain_spin, {"flag_ptr": "*i32", "spins_ptr": "*i32"}, {})))
    good = compile_check.spin_loop_problems(compile_check.compile_ptx(
        compile_check.CompileSpec(_volatile_spin, {"flag_ptr": "*i32", "spins_ptr": "*i32"}, {})))
    assert bad, "a spin on a plain ld.global must be reported"
    assert good == []


@pytest.mark.parametrize("spec", compile_check.specs(), ids=lambda s: s.name)
def test_kernel_compiles_for_sm90(spec):
    ptx = compile_check.compile_ptx(spec)
    assert ".target sm_90" in ptx
    assert compile_check.spin_loop_problems(ptx) == []
    if "signal_pad_ptrs_dev" in spec.signature:
        assert "atom.global.acquire.sys.cas" in ptx or "atom.acquire.sys" in ptx.replace("global.", "")
