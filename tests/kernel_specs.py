"""What the compile checks compile: every kernel launch the library makes, recorded (not run) on meta
tensors for every registered algorithm at several world sizes, dtypes and sizes, and every
``@triton.jit`` kernel of the package found by walking it."""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass, field

import torch
from triton.tools.tensor_descriptor import TensorDescriptor
import triton

import symmcoll
from symmcoll import launcher, plan
from symmcoll.memory import regions

_TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
                 torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
                 torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}


@dataclass(frozen=True)
class CompileSpec:
    kernel: object
    signature: tuple  # ((name, type or "constexpr"), ...)
    constexprs: tuple  # ((name, value), ...)
    num_warps: int
    label: str = field(default="", compare=False)
    num_stages: int = 3
    extern_libs: tuple = ()  # device libraries linked in (NVSHMEM's for the cross-node transport)

    @property
    def name(self) -> str:
        const = ",".join(f"{k}={v}" for k, v in self.constexprs if k != "num_warps")
        return f"{self.kernel.__name__}[{self.label}{const}]"


class _FakeRegion:
    def __init__(self, name, nbytes, world, base):
        self.name, self.ptrs_dev = name, base
        self.local = torch.empty(nbytes, dtype=torch.uint8, device="meta")
        self.peers = [torch.empty(nbytes, dtype=torch.uint8, device="meta") for _ in range(world)]


class FakeWorkspace:
    """Enough of a Workspace for an algorithm's host code to make its launches on meta tensors."""

    def __init__(self, world: int, rank: int, buffer_bytes: int = 256 << 20):
        self.world_size, self.rank = world, rank
        self.device = torch.device("cuda")
        geometry = regions.Geometry(world, buffer_bytes, "cuda")
        self.regions, self.state = {}, {}
        for i, spec in enumerate(regions.declared()):
            if spec.symmetric:
                self.regions[spec.name] = _FakeRegion(spec.name, spec.size(geometry), world, 1 << 40 | i << 20)
            else:
                self.state[spec.name] = torch.empty(spec.size(geometry), dtype=torch.int32, device="meta")
        self.buffer = self.regions["buffer"].local
        self.buffer_ptrs_dev = self.regions["buffer"].ptrs_dev
        self.kernel_args = (self.regions["signal_pad"].ptrs_dev, 1 << 41, 20_000_000, rank)

    def region(self, name):
        return self.regions[name]

    def local_state(self, name):
        return self.state[name]

    def peer_buffer(self, peer):
        return self.regions["buffer"].peers[peer]

    @property
    def buffer_bytes(self):
        return self.buffer.numel()

    def capacity(self, dtype):
        return self.buffer_bytes // dtype.itemsize

    def check(self):
        pass


def _arg_type(value):
    if isinstance(value, torch.Tensor):
        return "*" + _TRITON_TYPES[value.dtype]
    if isinstance(value, TensorDescriptor):
        return f"tensordesc<{_TRITON_TYPES[value.base.dtype]}[{', '.join(map(str, value.block_shape))}]>"
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2 ** 31) <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unexpected kernel argument {value!r}")


def spec_of(rec: launcher.Recorded, label: str = "") -> CompileSpec:
    """The compile spec of a recorded launch, specialised as Triton does at run time (integer
    arguments equal to 1 become constexprs, unless the kernel says ``do_not_specialize``; None
    arguments always)."""
    names = [p.name for p in rec.kernel.params]
    signature, constexprs = [], []
    for param, name, value in zip(rec.kernel.params, names, rec.args):
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 1
                             and not param.do_not_specialize):  # (None: a constant, as Triton makes it)
            signature.append((name, "constexpr"))
            constexprs.append((name, value))
        else:
            signature.append((name, _arg_type(value)))
    for p in rec.kernel.params[len(rec.args):]:
        value = rec.meta[p.name] if p.name in rec.meta else p.default
        signature.append((p.name, "constexpr"))
        constexprs.append((p.name, value))
    return CompileSpec(rec.kernel, tuple(signature), tuple(constexprs), rec.meta.get("num_warps", 4), label,
                       rec.meta.get("num_stages", 3), tuple(rec.meta.get("extern_libs", ())))


def h100_tables():
    """A context in which the GEMM core's configs come from the H100 table (132 SMs), on any machine."""
    import contextlib
    from symmcoll.fused import gemm_tables

    @contextlib.contextmanager
    def patched():
        facts = gemm_tables.device_facts
        gemm_tables.device_facts = lambda device: ("h100", 132)
        try:
            yield
        finally:
            gemm_tables.device_facts = facts
    return patched()


def alone_launch(m, n, k, algorithm):
    """all_gather_matmul's launch at world size 1 without a gathered A, on meta tensors (record it)."""
    from symmcoll.fused import all_gather_matmul as agmm
    request = plan.Request(agmm.OP, (m, k), torch.bfloat16, torch.device("cuda"),
                           others=(((k, n), torch.bfloat16, None),), options=(("return_gathered", False),))
    p = plan.Plan(request, "kernel", plan.algorithms(agmm.OP)[algorithm], None, 1, 0, FakeWorkspace(1, 0), None, 3,
                  None)
    plan.algorithms(agmm.OP)[algorithm].run(p, torch.empty((m, k), dtype=torch.bfloat16, device="meta"), None,
                                            torch.empty((k, n), dtype=torch.bfloat16, device="meta"))


def recorded_alone_and_core(m, n, k, algorithm, table="h100"):
    """(``alone_launch``'s recorded launches, gemm.matmul's) for the same product with the H100 GEMM table
    (``table="h200"``: the H200's, what a machine without a GPU answers from; nothing runs)."""
    import contextlib
    from symmcoll.fused import gemm
    with h100_tables() if table == "h100" else contextlib.nullcontext():
        with launcher.recording() as ours:
            alone_launch(m, n, k, algorithm)
        with launcher.recording() as core:
            gemm.matmul(torch.empty((m, k), dtype=torch.bfloat16, device="meta"),
                        torch.empty((k, n), dtype=torch.bfloat16, device="meta"))
    return ours, core


# (world, rank, dtype): every world size, rank 1 somewhere (specialised to a constexpr on GPU), each
# dtype somewhere.
REDUCTION_CASES = [(2, 0, torch.bfloat16), (3, 1, torch.float16), (4, 0, torch.float32), (8, 1, torch.bfloat16)]
MOVE_CASES = [(2, 1, torch.uint8), (3, 0, torch.int16), (4, 1, torch.float32), (8, 0, torch.int64)]
# Input elements: tiny and odd, and 4 M elements (large-size launch configs).
NUMELS = [7, 4 << 20]


def _request(op, dtype, numel, world, splits=None):
    shape = (world * numel,) if op in ("reduce_scatter", "all_to_all") else (numel,)
    others, options = (), ()
    if splits == plan.DEVICE_SPLITS:  # device-side splits: rows of 4 elements, a bound of 37 rows
        shape, others, options = (5, 4), (((world,), torch.int32, torch.device("cuda")),), (("max_rows", 37),)
    elif splits is not None:
        shape = (sum(splits), 3)
    return plan.Request(op, shape, dtype, torch.device("cuda"), "sum" if op in plan.REDUCTIONS else None,
                        0 if op == "broadcast" else None, splits, others, options)


def recorded_launches() -> list[tuple[str, launcher.Recorded]]:
    """(label, launch) of every registered kernel algorithm over the cases above."""
    found = []
    for op in plan.OPS:  # the collectives; fused ops record their own cases (compile_cases)
        for name, algorithm in plan.algorithms(op).items():
            cases = REDUCTION_CASES if op in plan.REDUCTIONS else MOVE_CASES
            for world, rank, dtype in cases:
                for numel in NUMELS + (["list", "device"] if op == "all_to_all" else []):
                    splits = {"list": tuple(range(1, world + 1)), "device": plan.DEVICE_SPLITS}.get(numel)
                    numel = numel if splits is None else None
                    request = _request(op, dtype, numel or 1, world, splits)
                    if algorithm.accepts and algorithm.accepts(request, world):
                        continue
                    ws = FakeWorkspace(world, rank)
                    cfg = algorithm.gpu_configs(request, world) if callable(algorithm.gpu_configs) else (
                        algorithm.gpu_configs.pick(request.nbytes, world) if algorithm.gpu_configs else None)
                    out_shape, size_key = plan.shape_rule(op)(request, world)
                    p = plan.Plan(request, "kernel", algorithm, None, world, rank, ws, cfg, 3, out_shape)
                    x = torch.empty(request.shape, dtype=dtype, device="meta")
                    out = None if out_shape is None else torch.empty(out_shape, dtype=dtype, device="meta")
                    others = [torch.empty(shape, dtype=t, device="meta") for shape, t, _ in request.others]
                    with launcher.recording() as launches:
                        algorithm.run(p, x, out, *others)
                    found += [(f"{op}.{name},", rec) for rec in launches]
    return found


def other_launches() -> list[tuple[str, launcher.Recorded]]:
    """Kernels outside the algorithms: the benchmark's link measurement."""
    from symmcoll.bench import link
    with launcher.recording() as launches:
        link.pull(torch.empty(1 << 20, dtype=torch.bfloat16, device="meta"),
                  torch.empty(1 << 20, dtype=torch.bfloat16, device="meta"))
    return [("bench.link,", rec) for rec in launches]


def module_cases() -> list[tuple[str, launcher.Recorded]]:
    """Launches of modules that define ``compile_cases(make_workspace)`` (fused ops): a list of
    (label, thunk), each thunk making its launches on meta tensors over ``make_workspace(world, rank)``."""
    found = []
    for info in pkgutil.walk_packages(symmcoll.__path__, "symmcoll."):
        if info.name.endswith("__main__"):
            continue
        cases = getattr(importlib.import_module(info.name), "compile_cases", None)
        if cases is None:
            continue
        for label, thunk in cases(FakeWorkspace):
            with launcher.recording() as launches:
                thunk()
            found += [(f"{label},", rec) for rec in launches]
    return found


def compile_specs() -> list[CompileSpec]:
    specs = {}
    for label, rec in recorded_launches() + other_launches() + module_cases():
        spec = spec_of(rec, label)
        specs.setdefault(spec, spec)
    return list(specs)


def compile_in_parallel(names: list[str], workers: int) -> None:
    """Compile the specs named ``names`` in ``workers`` processes at once, filling Triton's disk cache
    (nothing is checked here: each test compiles its spec again, from the cache, and checks it).
    Compiling is single-threaded: on a cold cache test_compile waited ~200 s on one core of two."""
    import concurrent.futures
    import multiprocessing
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_named, [names[i::workers] for i in range(workers)]))


def _compile_named(names: list[str]) -> None:
    wanted = set(names)
    for spec in compile_specs():
        if spec.name in wanted:
            try:
                compile_ptx(spec)
            except Exception:  # noqa: BLE001 - the spec's own test compiles it again and reports
                pass


def package_jit_functions() -> dict[str, object]:
    """Every ``@triton.jit`` function defined in the package, by qualified name (``*_kernel`` is the
    convention for what is launched; the rest are helpers called from kernels)."""
    found = {}
    for info in pkgutil.walk_packages(symmcoll.__path__, "symmcoll."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for attr, value in vars(module).items():
            if isinstance(value, triton.runtime.jit.JITFunction) and value.__module__ == info.name:
                found[f"{info.name}.{attr}"] = value
    return found


def unreferenced_helpers(jit_functions: dict[str, object]) -> list[str]:
    """Jit functions that are not named ``*_kernel`` and that no other jit function calls (or hands to
    tl.reduce / tl.associative_scan as its combine function): launched from somewhere without following
    the convention, so nothing would check them."""
    sources = {name: fn.src for name, fn in jit_functions.items()}
    out = []
    for name, fn in jit_functions.items():
        short = name.rsplit(".", 1)[1]
        if short.endswith("_kernel"):
            continue
        # called, or passed to tl.reduce / tl.associative_scan as the combine function
        used = re.compile(rf"\b{re.escape(short)}\(|tl\.(?:reduce|associative_scan)\([^()]*(?:\([^()]*\)[^()]*)*"
                          rf"\b{re.escape(short)}\b")
        called = any(used.search(src) for other, src in sources.items() if other != name)
        if not called:
            out.append(name)
    return out


# Shared memory a block may use on an H100/H200 (227 KB): a kernel asking for more fails at launch.
SHARED_MEMORY_LIMIT = 232448


def compile_ptx(spec: CompileSpec) -> str:
    """PTX of ``spec`` for sm_90, compiled on this machine (the triton wheel bundles ptxas); raises if
    the kernel needs more shared memory than a Hopper block has."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = spec.kernel
    if type(fn).__name__ == "InterpretedFunction":
        raise RuntimeError("compile checks need TRITON_INTERPRET unset when symmcoll is imported")
    src = ASTSource(fn, dict(spec.signature), dict(spec.constexprs))
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.extern_libs:
        options["extern_libs"] = spec.extern_libs
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    if compiled.metadata.shared > SHARED_MEMORY_LIMIT:
        raise AssertionError(f"{spec.name}: needs {compiled.metadata.shared} bytes of shared memory, "
                             f"more than the {SHARED_MEMORY_LIMIT} a Hopper block has")
    return compiled.asm["ptx"]


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """(registers per thread, bytes of spill stores) of the kernel in ``ptx``, from the ptxas the triton
    wheel bundles (sm_90a, as the GPU's load compiles it)."""
    import subprocess
    import tempfile
    from pathlib import Path

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        out = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Used (\d+) registers", out).group(1)), int(re.search(r"(\d+) bytes spill stores",
                                                                                 out).group(1))


def compile_specialised(rec: launcher.Recorded):
    """A recorded launch compiled for sm_90 as the GPU's runtime specialises it (what ``compile_ptx``'s
    specs leave out): tensors 16-byte aligned, integer arguments that are multiples of 16 marked so
    (unless ``do_not_specialize``): the accesses get the vector width they have on the GPU; the launch's
    ``enable_fp_fusion`` and ``maxnreg`` where it sets them."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    spec = spec_of(rec)
    attrs = {(i,): [["tt.divisibility", 16]] for i, (param, value) in enumerate(zip(rec.kernel.params, rec.args))
             if isinstance(value, torch.Tensor) or (type(value) is int and value and value % 16 == 0
                                                    and not param.do_not_specialize)}
    src = ASTSource(spec.kernel, dict(spec.signature), dict(spec.constexprs), attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": spec.num_warps, "num_stages": spec.num_stages,
                                   "launch_pdl": bool(rec.meta.get("launch_pdl", False)),
                                   **{k: rec.meta[k] for k in ("enable_fp_fusion", "maxnreg") if k in rec.meta}})


_LABEL = re.compile(r"^(\$L__\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")
_GLOBAL_LOAD = re.compile(r"\bld\.global\.(\S+)")
# Stores to memory: st.global, and generic or volatile ones (NVSHMEM's copy loops), not to params or shared.
_MEMORY_STORE = re.compile(r"\bst\.(?!param|shared|local)")
_ORDERED = ("volatile", "acquire", "relaxed")


_BLOCK = re.compile(r"^(?:(\$L__BB\w+):|// (%bb\.\d+):)")  # labelled and fall-through blocks (not $L__tmp)
_LOOP_HEADER = re.compile(r"Loop Header: Depth=")
_IN_LOOP = re.compile(r"in Loop: Header=(BB\w+) Depth=")
_CHILD_LOOP = re.compile(r"Child Loop (BB\w+) Depth")


def _loop_bodies(lines: list[str]) -> tuple[dict, dict]:
    """From LLVM's loop comments in the PTX: (the innermost loop of each block label, the line numbers
    of every loop's blocks, its inner loops' included). The compiler may lay an inner loop out after
    its outer loop's backward branch; the outer loop still contains it."""
    starts = [(i, m.group(1) or m.group(2)) for i, l in enumerate(lines) if (m := _BLOCK.match(l.strip()))]
    innermost, own, children = {}, {}, {}
    for n, (start, label) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        notes = [lines[start]] + [l for l in lines[start + 1:end] if l.strip().startswith("//")][:4]
        name = label.removeprefix("$L__")
        header = name if any(_LOOP_HEADER.search(l) for l in notes) else None
        parent = next((m.group(1) for l in notes if (m := _IN_LOOP.search(l))), None)
        loop = header or parent
        if loop is None:
            continue
        innermost[label] = loop
        own.setdefault(loop, set()).update(range(start, end))
        if header:
            children.setdefault(header, set()).update(m.group(1) for line in lines[start:end]
                                                      if (m := _CHILD_LOOP.search(line)))

    def body(loop, seen=()):
        lines_of = set(own.get(loop, ()))
        for child in children.get(loop, ()):
            if child not in seen:
                lines_of |= body(child, (*seen, loop))
        return lines_of
    return innermost, {loop: body(loop) for loop in own}


_REGISTER = re.compile(r"%[a-z]+\d+")


def _exit_depends_on_load(body: list[str]) -> bool:
    """Whether a conditional branch in the loop body tests a value computed (inside the body) from a
    global load: what makes a loop a wait. A loop that only accumulates what it loads (a reduction)
    branches on its counter."""
    defs: dict[str, list[str]] = {}
    for line in body:
        code = line.split("//")[0].strip().rstrip(";")
        if not code or code.endswith(":") or code.startswith(("@", "bra", "{", "}", ".")):
            continue
        opcode, _, operands = code.partition(" ")
        if not operands:
            continue
        dst, _, sources = operands.partition(",") if not operands.startswith("{") else operands.partition("}")
        for reg in _REGISTER.findall(dst):
            defs.setdefault(reg, []).append(code)
    predicates = {m.group(1) for line in body if (m := re.search(r"@!?(%p\d+)\s+bra", line))}
    seen, todo = set(), list(predicates)
    while todo:
        reg = todo.pop()
        if reg in seen:
            continue
        seen.add(reg)
        for code in defs.get(reg, ()):
            if code.startswith("ld.global"):
                return True
            opcode, _, operands = code.partition(" ")
            dst_end = operands.index("}") + 1 if operands.startswith("{") else operands.find(",")
            todo.extend(_REGISTER.findall(operands[dst_end:]) if dst_end > 0 else [])
    return False


def spin_loop_problems(ptx: str) -> list[str]:
    """Wait loops in ``ptx`` (loops storing nothing to global memory, inner loops included, and doing no
    tensor-core work) with no atomic and no volatile/acquire load: they spin on plain loads, which may
    never see a peer's write."""
    lines = ptx.splitlines()
    innermost, bodies = _loop_bodies(lines)
    labels = {}
    problems = []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
        b = _BRANCH.search(line)
        if b and b.group(1) in labels and labels[b.group(1)] < i:
            span = set(range(labels[b.group(1)], i + 1)) | bodies.get(innermost.get(b.group(1)), set())
            body = [lines[n] for n in sorted(span)]
            if any(_MEMORY_STORE.search(l) for l in body):
                continue  # a loop that writes data, not a wait
            if any("mma" in l or "cp.async" in l for l in body):
                continue  # a matmul's k-loop: it computes on what it loads, it does not wait for it
            # (ordering qualifiers may follow the scope: ld.global.sys.acquire)
            plain = [l.strip() for l in body if (g := _GLOBAL_LOAD.search(l)) and not any(
                q in g.group(1).split(".") for q in _ORDERED)]
            waits = [l for l in body if "atom." in l or "ld.volatile" in l or "ld.acquire" in l]
            if not waits and plain and _exit_depends_on_load(body):
                problems.append(f"loop at {b.group(1)} spins on plain loads {plain[:3]}")
    return problems


def unordered_cas_in_loops(ptx: str) -> list[str]:
    """CAS instructions inside loops (signal sends and waits) without acquire/release ordering at
    system scope: a barrier must publish and observe peers' writes."""
    lines = ptx.splitlines()
    labels, found = {}, []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
        b = _BRANCH.search(line)
        if b and b.group(1) in labels and labels[b.group(1)] < i:
            for l in lines[labels[b.group(1)]:i + 1]:
                if "atom" in l and ".cas" in l and not any(sem in l for sem in (".acquire", ".release", ".acq_rel")):
                    found.append(l.strip())
                elif "atom" in l and ".cas" in l and ".sys" not in l:
                    found.append(l.strip())
    return found
