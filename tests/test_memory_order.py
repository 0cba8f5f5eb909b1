"""Memory order of every wait: a walk over the source of every ``@triton.jit`` function of the package.

A ``while`` loop in a kernel is a wait (kernels loop over data with ``for``). Each one that reads memory
must be language/flags.py's ``acquire_flag`` (the reader of every flag that guards data: acquire CAS),
or a loop listed in ``flags.SPIN_LOOPS`` that does what its entry says: "acquire" (polls with an
acquire or acq_rel atomic), "release" (retries a release atomic) or "data" (polls the data itself with
volatile loads only: each word carries its own readiness). A spin on a flag with a volatile or plain
load outside that list fails, naming the function. Flags are published only through
``release_flag``: no ``tl.atomic_xchg`` / ``tl.atomic_cas`` outside language/ but resets to 0.

The pair itself is compiled for sm_90 here and its PTX checked for acquire / release atomics at the
scope asked for."""

import ast
import importlib
import textwrap

import triton
import triton.language as tl

import kernel_specs
from symmcoll.language import acquire_flag, release_flag
from symmcoll.language.signals import block_max
from symmcoll.language.flags import SPIN_LOOPS

# Waits that are known not to order what they guard, each with who fixes it. The test fails when one
# is fixed and still listed here, so the list cannot outlive the problem.
PENDING: dict[str, str] = {}
ACQUIRE = {"acquire", "acq_rel"}
RELEASE = {"release", "acq_rel"}


def _sem(call: ast.Call) -> str:
    for kw in call.keywords:
        if kw.arg == "sem" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return "acq_rel"  # triton's default


def _volatile(call: ast.Call) -> bool:
    return any(kw.arg == "volatile" and isinstance(kw.value, ast.Constant) and kw.value.value for kw in call.keywords)


class Source:
    """Every jit function of the package, parsed; memory operations per loop, through called helpers."""

    def __init__(self):
        self.jit = kernel_specs.package_jit_functions()
        self.trees = {name: ast.parse(textwrap.dedent(fn.src)) for name, fn in self.jit.items()}
        self._ops = {}

    def callee(self, name: str, call: ast.Call) -> str | None:
        """The package jit function ``call`` (inside function ``name``) calls, by qualified name."""
        if not isinstance(call.func, ast.Name):
            return None
        module = importlib.import_module(name.rsplit(".", 1)[0])
        target = getattr(module, call.func.id, None)
        if isinstance(target, triton.runtime.jit.JITFunction):
            qualified = f"{target.__module__}.{target.__name__}"
            return qualified if qualified in self.jit else None
        return None

    def ops(self, name: str, node: ast.AST, seen=()) -> list[tuple]:
        """("load", volatile) and ("atomic", kind, sem) of ``node`` (in function ``name``) and of the jit
        functions it calls."""
        found = []
        for sub in ast.walk(node):
            if not isinstance(sub, ast.Call):
                continue
            func = sub.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "tl":
                if func.attr == "load":
                    found.append(("load", _volatile(sub)))
                elif func.attr.startswith("atomic_"):
                    found.append(("atomic", func.attr, _sem(sub)))
            callee = self.callee(name, sub)
            if callee is not None and callee not in seen:
                if callee not in self._ops:
                    self._ops[callee] = self.ops(callee, self.trees[callee], (*seen, name))
                found += self._ops[callee]
        return found

    def spin_loops(self):
        """(function, loop, direct operations, all operations) of every while loop that reads memory."""
        for name, tree in self.trees.items():
            for loop in ast.walk(tree):
                if isinstance(loop, ast.While):
                    direct = [op for op in self.ops_without_calls(loop)]
                    every = self.ops(name, loop)
                    if every:
                        yield name, loop, direct, every

    @staticmethod
    def ops_without_calls(node):
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and \
                    isinstance(sub.func.value, ast.Name) and sub.func.value.id == "tl":
                if sub.func.attr == "load":
                    yield ("load", _volatile(sub))
                elif sub.func.attr.startswith("atomic_"):
                    yield ("atomic", sub.func.attr, _sem(sub))


def _resets(call: ast.Call) -> bool:
    """tl.atomic_xchg(ptr, 0, ...): a counter set back to 0, publishing nothing."""
    value = call.args[1] if len(call.args) > 1 else next((kw.value for kw in call.keywords if kw.arg == "val"), None)
    return call.func.attr == "atomic_xchg" and isinstance(value, ast.Constant) and value.value == 0


def _problem(kind: str | None, direct: list, every: list) -> str | None:
    """What is wrong with a spin loop of this kind (None: nothing)."""
    atomics = [op for op in direct if op[0] == "atomic"]
    if kind is None:
        return "spins on memory outside language/flags.py's pair and SPIN_LOOPS (use language.acquire_flag)"
    if kind == "acquire":
        if not atomics or any(op[2] not in ACQUIRE for op in atomics):
            return f"listed as an acquire wait, but polls with {atomics or 'no atomic'}"
    elif kind == "release":
        if not atomics or any(op[2] not in RELEASE for op in atomics):
            return f"listed as a release retry, but uses {atomics or 'no atomic'}"
    elif kind == "data":
        plain = [op for op in every if op[0] == "load" and not op[1]]
        if plain or atomics:
            return f"listed as a data poll, but reads with {plain + atomics}"
    return None


def test_every_spin_loop_orders_what_it_guards():
    source = Source()
    problems, pending_seen, listed_seen = [], set(), set()
    for name, loop, direct, every in source.spin_loops():
        listed_seen.add(name)
        problem = _problem(SPIN_LOOPS.get(name), direct, every)
        if problem and name in PENDING:
            pending_seen.add(name)
        elif problem:
            problems.append(f"{name} (line {loop.lineno} of its source): {problem}")
    # Flags are published by release_flag only (an exchange of 0 resets a counter for the next launch).
    for name, tree in source.trees.items():
        if name.startswith("symmcoll.language."):
            continue
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and \
                    call.func.attr in ("atomic_xchg", "atomic_cas") and not _resets(call):
                if name in PENDING:
                    pending_seen.add(name)
                else:
                    problems.append(f"{name}: publishes a flag with tl.{call.func.attr} (use language.release_flag)")
    assert problems == [], "\n".join(problems)
    assert sorted(set(SPIN_LOOPS) - listed_seen) == [], "SPIN_LOOPS entries without a spin loop (stale)"
    fixed = sorted(set(PENDING) - pending_seen)
    assert fixed == [], f"fixed, remove from PENDING: {fixed}"
    assert "symmcoll.language.flags.acquire_flag" in listed_seen, "the walk did not find acquire_flag's loop"


def test_the_walk_catches_a_volatile_flag_wait():
    """A hand-written flag wait with a volatile load (what all_gather_matmul had) is reported; a data
    poll listed as such is not."""
    tree = ast.parse(textwrap.dedent('''
        def wait(flag_ptr, epoch, budget):
            value = tl.load(flag_ptr, volatile=True)
            while (value != epoch) & (budget > 0):
                value = tl.load(flag_ptr, volatile=True)
                budget -= 1
    '''))
    loop = next(n for n in ast.walk(tree) if isinstance(n, ast.While))
    ops = list(Source.ops_without_calls(loop))
    assert ops == [("load", True)]
    assert _problem(None, ops, ops) is not None
    assert _problem("acquire", ops, ops) is not None
    assert _problem("data", ops, ops) is None
    cas = [("atomic", "atomic_cas", "relaxed")]
    assert _problem("acquire", cas, cas) is not None


# ---- the pair on sm_90 ----------------------------------------------------------------------------------

@triton.jit
def _handover_kernel(data_ptr, flag_ptr, out_ptr, status_ptr, max_spins, FLAG_SCOPE: tl.constexpr):
    """Program 0 stores data and releases the flag; program 1 acquires it and reads the data."""
    if tl.program_id(0) == 0:
        tl.store(data_ptr + tl.arange(0, 128), tl.arange(0, 128))
        release_flag(flag_ptr, 7, FLAG_SCOPE)
    else:
        budget = acquire_flag(flag_ptr, 7, max_spins, status_ptr, 0, 0, 3, FLAG_SCOPE)
        if budget > 0:
            tl.store(out_ptr + tl.arange(0, 128), tl.load(data_ptr + tl.arange(0, 128)))


def test_the_pair_compiles_to_acquire_and_release_atomics():
    sig = (("data_ptr", "*i32"), ("flag_ptr", "*i32"), ("out_ptr", "*i32"), ("status_ptr", "*i32"),
           ("max_spins", "i32"))
    for scope in ("gpu", "sys"):
        ptx = kernel_specs.compile_ptx(kernel_specs.CompileSpec(_handover_kernel, sig + (("FLAG_SCOPE", "constexpr"),),
                                                                (("FLAG_SCOPE", scope),), 4))
        atoms = [line.strip() for line in ptx.splitlines() if "atom." in line]
        assert any(".acquire" in a and f".{scope}" in a and ".cas" in a for a in atoms), atoms
        assert any(".release" in a and f".{scope}" in a and ".exch" in a for a in atoms), atoms
        assert kernel_specs.spin_loop_problems(ptx) == []


# ---- one decision per program ---------------------------------------------------------------------------

def test_every_data_poll_decides_through_wait_state():
    """A data poll's loop runs while ``state == WAIT_PENDING`` and recomputes ``state`` with
    ``wait_state`` (block-wide) each spin: a condition built from a tensor smaller than the program's
    threads is decided per copy, and warps that leave the loop at different spins run the barriers
    after it out of step (issue 24's zeros)."""
    source = Source()
    loops = {name: loop for name, loop, _, _ in source.spin_loops() if SPIN_LOOPS.get(name) == "data"}
    assert sorted(loops) == sorted(n for n, kind in SPIN_LOOPS.items() if kind == "data")
    for name, loop in loops.items():
        tested = {n.id for n in ast.walk(loop.test) if isinstance(n, ast.Name)}
        assert tested == {"state", "WAIT_PENDING", "budget"}, f"{name}: loop condition reads {sorted(tested)}"
        called = {c.func.id for c in ast.walk(loop) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
        assert "wait_state" in called, f"{name}: does not recompute state with wait_state each spin"


@triton.jit
def _block_max_kernel(flags_ptr, out_ptr):
    """Each copy of an [8] vector (held by every lane group of every warp) loads for itself."""
    local = tl.max(tl.load(flags_ptr + tl.arange(0, 8), volatile=True), axis=0)
    tl.store(out_ptr + tl.program_id(0), block_max(local))


def test_block_max_goes_through_every_warp():
    """sm_90: block_max reduces inside each warp (redux) and then across warps through shared memory
    behind a barrier, and every thread reads the result back (a compiler that folded the reduction of a
    splat away would fail here)."""
    sig = (("flags_ptr", "*i32"), ("out_ptr", "*i32"))
    for warps in (4, 8):
        ptx = kernel_specs.compile_ptx(kernel_specs.CompileSpec(_block_max_kernel, sig, (), warps))
        lines = [line.strip() for line in ptx.splitlines()]
        first_bar = next(i for i, line in enumerate(lines) if line.startswith("bar.sync"))
        assert any(line.startswith("redux.sync.max") or line.startswith("shfl.sync") for line in lines[:first_bar])
        assert any("st.shared" in line for line in lines[:first_bar])
        assert any(line.startswith("ld.shared") and "@" not in line for line in lines[first_bar:]), \
            "the result is not read back by every thread"
