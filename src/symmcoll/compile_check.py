"""Compile every kernel for sm_90 without a GPU, and check its spin loops in the PTX.

The interpreter accepts things the GPU compiler rejects (``break``, block-valued loop conditions, calls of
plain Python functions) and hides memory-order bugs (a spin on a plain ``ld.global`` may never see a
peer's write on the GPU). ``check_all()`` compiles each registered kernel for ``GPUTarget("cuda", 90, 32)``
(the wheel bundles ptxas) and fails if a spin loop -- a loop that stores nothing to global memory, i.e. one
that only waits -- reads global memory with a plain load instead of an atomic or a volatile/acquire load.

Kernel modules register what to compile with ``register``: (kernel, signature, constexprs, num_warps).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field

# Modules whose kernels are compiled; each calls ``register`` at import.
KERNEL_MODULES = [
    "symmcoll.comm.all_reduce",
    "symmcoll.comm.all_reduce_low_latency",
    "symmcoll.comm.all_reduce_tree",
    "symmcoll.comm.reduce_scatter",
    "symmcoll.comm.all_gather",
    "symmcoll.comm.broadcast",
    "symmcoll.comm.all_to_all",
]

WORKSPACE_SIGNATURE = {"buffer_ptrs_dev": "i64", "signal_pad_ptrs_dev": "i64", "status_ptr": "i64",
                       "max_spins": "i32"}


@dataclass(frozen=True)
class CompileSpec:
    kernel: object
    signature: dict
    constexprs: dict
    num_warps: int = 4
    label: str = field(default="")

    @property
    def name(self) -> str:
        const = ",".join(f"{k}={v}" for k, v in self.constexprs.items())
        return f"{self.kernel.__name__}[{self.label}{const}]"


_SPECS: list[CompileSpec] = []


def register(kernel, signature: dict, constexprs: dict, num_warps: int = 4, label: str = "") -> None:
    sig = dict(signature)
    for name in constexprs:
        sig[name] = "constexpr"
    _SPECS.append(CompileSpec(kernel, sig, dict(constexprs), num_warps, label))


def specs() -> list[CompileSpec]:
    for module in KERNEL_MODULES:
        importlib.import_module(module)
    return list(_SPECS)


def compile_ptx(spec: CompileSpec) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = spec.kernel
    if not hasattr(fn, "arg_names") or type(fn).__name__ == "InterpretedFunction":
        raise RuntimeError("compile check needs TRITON_INTERPRET unset when symmcoll is imported")
    src = ASTSource(fn, spec.signature, spec.constexprs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": spec.num_warps})
    return compiled.asm["ptx"]


_LABEL = re.compile(r"^(\$L__\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")
_GLOBAL_LOAD = re.compile(r"\bld\.global\.(\S+)")
_ORDERED = ("volatile", "acquire", "relaxed")


def spin_loop_problems(ptx: str) -> list[str]:
    """Wait loops in ``ptx`` (loops storing nothing to global memory) with no atomic and no
    volatile/acquire load: they spin on plain loads, which may never see a peer's write."""
    lines = ptx.splitlines()
    labels = {}
    problems = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
        b = _BRANCH.search(line)
        if b and b.group(1) in labels and labels[b.group(1)] < i:
            body = lines[labels[b.group(1)]:i + 1]
            if any("st.global" in l for l in body):
                continue  # a loop that writes data, not a wait
            plain = [l.strip() for l in body
                     if (g := _GLOBAL_LOAD.search(l)) and not g.group(1).startswith(_ORDERED)]
            waits = [l for l in body if "atom." in l or "ld.volatile" in l or "ld.acquire" in l]
            if not waits:
                problems.append(f"loop at {b.group(1)} spins on plain loads {plain[:3]}")
    return problems


def check_all() -> list[str]:
    """Compile every registered kernel; return a list of failures (empty when all is well)."""
    failures = []
    for spec in specs():
        try:
            ptx = compile_ptx(spec)
        except Exception as exc:  # noqa: BLE001 - every compile error is a finding
            failures.append(f"{spec.name}: does not compile for sm_90: {exc}")
            continue
        failures += [f"{spec.name}: {p}" for p in spin_loop_problems(ptx)]
    return failures
