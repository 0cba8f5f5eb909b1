"""Block helpers every kernel shares: copies, reductions in fp32, and narrowing that rounds the same
way on every machine.

Reductions give torch's answers for special values: a sum is IEEE addition (NaN propagates, +Inf + -Inf
is NaN), and max/min propagate NaN as ``torch.amax`` / ``torch.amin`` do. The GPU's plain ``max.f32``
(``tl.maximum``, ``tl.max``) returns the other operand when one is NaN, so every max/min here asks for
NaN propagation explicitly (``nan_maximum``, ``nan_max``). Under ``TRITON_INTERPRET=1`` the
interpreter would propagate NaN through ``tl.maximum`` anyway (it maps it to numpy's ``maximum``);
``_interpret_like_the_gpu`` makes it drop NaN as the GPU does, so CPU runs show what the GPU computes
and a max/min without explicit propagation fails the CPU tests too.

``narrow`` converts fp32 to a kernel's element type. On the GPU ``.to(tl.bfloat16)`` rounds to
nearest-even; triton 3.6's interpreter truncates instead, so under ``TRITON_INTERPRET=1`` bf16 is
rounded with integer operations on the fp32 bits (the same result, bit for bit); fp8 e4m3 likewise
(the interpreter rounds its ties away and loses mantissa carries). fp16 and fp32 need no help (the
interpreter uses numpy's rounding conversions).
"""

import os

import triton
import triton.language as tl

# Reduction ops as kernel constexprs (REDUCE_OP).
OP_SUM, OP_AVG, OP_MAX, OP_MIN = 0, 1, 2, 3
REDUCE_OPS = {"sum": OP_SUM, "avg": OP_AVG, "max": OP_MAX, "min": OP_MIN}

INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def _interpret_like_the_gpu() -> None:
    """Map the interpreter's NaN-ignoring float min/max (``tl.maximum`` / ``tl.minimum`` without
    ``propagate_nan``: LLVM maxnum/minnum, PTX ``max.f32``) to numpy's NaN-ignoring ``fmax`` / ``fmin``
    instead of the NaN-propagating ``maximum`` / ``minimum`` triton 3.6 uses. (Its ``tl.max`` / ``tl.min``
    reductions already ignore NaN, as the GPU's do.)"""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)


def _patch_the_language_once_per_launch() -> None:
    """Triton 3.6's interpreter re-patches triton.language on every call of a jit helper (a walk over
    every member of the module, about 1 ms), although the launch has patched it already and restores
    it only when the launch ends: about half the time of an interpreted symmcoll kernel. A helper
    whose module sees no language module the launch has not patched now runs without it.

    triton.language's own helpers (``tl.max``, ``tl.zeros``, ``tl.sum``: triton.language.standard)
    see ``tl.core`` as well, which a kernel's launch does not patch: the first such call of a launch
    patches it the interpreter's way, and the launch counts it patched from then on (the interpreter
    never restores what a helper call patches, so this changes no attribute's value, only how often
    it is set: in the random calls, 9 of 10 helper calls had re-patched ``tl.core``)."""
    import inspect

    from triton.runtime import interpreter

    launches = interpreter.GridExecutor.__call__
    device_call = interpreter.InterpretedFunction.__call__
    patched: list[set] = []  # the language modules patched in each launch in progress
    seen: dict = {}

    def langs(fn) -> frozenset:
        if fn not in seen:
            seen[fn] = frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
        return seen[fn]

    def launch(self, *args, **kwargs):
        patched.append(set(langs(self.fn)))
        try:
            return launches(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        if not patched:
            return device_call(self, *args, **kwargs)
        needed = langs(self.fn)
        if not needed <= patched[-1]:
            patched[-1].update(needed)  # device_call patches them now, and nothing restores that
            return device_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise interpreter.InterpreterError(repr(exc)) from exc

    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = call


if INTERPRETED:
    _interpret_like_the_gpu()
    _patch_the_language_once_per_launch()


@triton.jit
def _bf16_round_bits(values):
    """fp32 -> bf16 by integer arithmetic: round to nearest, ties to even; NaN stays NaN."""
    bits = values.to(tl.int32, bitcast=True)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    high = tl.where(values != values, 0x7FC0, (rounded >> 16) & 0xFFFF)
    return high.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _e4m3_round_bits(values):
    """fp32 -> float8_e4m3fn by integer arithmetic: round to nearest, ties to even, saturating at +-448
    (as the GPU's cvt.rn.satfinite); NaN stays NaN. triton 3.6's interpreter rounds ties away and loses
    a mantissa carry (127.0 -> 64.0)."""
    bits = values.to(tl.int32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    # Normal e4m3 (>= 2^-6): round the fp32 word to 3 mantissa bits, then rebias the exponent (127 -> 7);
    # a mantissa carry moves into the exponent by itself.
    rounded = magnitude + 0x7FFFF + ((magnitude >> 20) & 1)
    normal = (rounded >> 20) - ((127 - 7) << 3)
    # Subnormal (< 2^-6): multiples of 2^-9; adding 2^23 rounds to an integer, ties to even.
    steps = (magnitude.to(tl.float32, bitcast=True) * 512.0 + 8388608.0) - 8388608.0
    subnormal = magnitude < 0x3C800000
    code = tl.where(subnormal, tl.where(subnormal, steps, 0.0).to(tl.int32), normal)
    code = tl.where(values != values, 0x7F, tl.minimum(code, 0x7E))
    return (code | ((bits >> 24) & 0x80)).to(tl.int8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def narrow(values, ELEM: tl.constexpr):
    """``values`` (fp32) as ``ELEM``, rounded to nearest-even on GPU and CPU alike (fp8 e4m3:
    saturating at +-448)."""
    if INTERPRETED and ELEM == tl.bfloat16:
        return _bf16_round_bits(values)
    elif INTERPRETED and ELEM == tl.float8e4nv:
        return _e4m3_round_bits(values)
    else:
        return values.to(ELEM)


@triton.jit
def nan_maximum(a, b):
    """Elementwise max that propagates NaN (torch.maximum); one ``max.NaN.f32`` on the GPU."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nan_minimum(a, b):
    """Elementwise min that propagates NaN (torch.minimum)."""
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nan_max(values, axis: tl.constexpr):
    """Max over ``axis`` that is NaN where any value is (torch.amax): the fast NaN-ignoring reduction,
    then the NaNs put back (a reduction with a NaN-propagating combine runs element by element in the
    interpreter)."""
    has_nan = tl.max((values != values).to(tl.int32), axis=axis) > 0
    return tl.where(has_nan, float("nan"), tl.max(values, axis=axis))


@triton.jit
def nan_min(values, axis: tl.constexpr):
    """Min over ``axis`` that is NaN where any value is (torch.amin)."""
    has_nan = tl.max((values != values).to(tl.int32), axis=axis) > 0
    return tl.where(has_nan, float("nan"), tl.min(values, axis=axis))


@triton.jit
def combine(acc, value, OP: tl.constexpr):
    """Fold ``value`` (fp32) into ``acc`` (fp32) for sum/avg/max/min (NaN propagates, as in torch)."""
    if OP == 2:
        return nan_maximum(acc, value)
    elif OP == 3:
        return nan_minimum(acc, value)
    else:
        return acc + value


@triton.jit
def finalize(acc, OP: tl.constexpr, WORLD: tl.constexpr):
    if OP == 1:
        return acc / WORLD
    else:
        return acc


@triton.jit
def reduce_rows(values, valid, OP: tl.constexpr, WORLD: tl.constexpr):
    """op over the valid rows of a [PEERS, BLOCK] fp32 tile (the same order on every rank)."""
    if OP == 2:
        acc = nan_max(tl.where(valid, values, float("-inf")), 0)
    elif OP == 3:
        acc = nan_min(tl.where(valid, values, float("inf")), 0)
    else:
        acc = tl.sum(tl.where(valid, values, 0.0), axis=0)
    return finalize(acc, OP, WORLD)


@triton.jit
def own_shard(step, STEP: tl.constexpr, in_step, rank, shard_len, total):
    """Step ``step`` (STEP positions, ``in_step`` = arange(0, STEP)) of my shard, rank's ``shard_len``
    positions of a ``total``-long range split rank by rank: the positions in the shard, in the whole
    range, and which of them exist (the last shard may be short)."""
    in_shard = step * STEP + in_step
    mine = rank * shard_len + in_shard
    return in_shard, mine, (in_shard < shard_len) & (mine < total)


@triton.jit
def move_block(src, dst, offs, mask):
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _move(src, dst_a, dst_b, offs, mask, TEE: tl.constexpr):
    v = tl.load(src + offs, mask=mask)
    tl.store(dst_a + offs, v, mask=mask)
    if TEE:
        tl.store(dst_b + offs, v, mask=mask)


@triton.jit
def _move_blocks(src, dst_a, dst_b, n, BLOCK: tl.constexpr, TEE: tl.constexpr):
    """src -> dst_a (and dst_b if TEE) over ``n`` elements; this program takes blocks pid, pid + P, ...
    Whole blocks go with a constant all-true mask (unmasked 16-byte vector accesses where aligned: the
    mask must be a constant where the access is, not a value merged from both branches); only the tail
    is masked."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    lane = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n, step):
        offs = start + lane
        if start + BLOCK <= n:
            _move(src, dst_a, dst_b, offs, tl.full([BLOCK], 1, tl.int1), TEE)
        else:
            _move(src, dst_a, dst_b, offs, offs < n, TEE)


@triton.jit
def copy_blocks(src, dst, n, BLOCK: tl.constexpr):
    """Copy ``n`` elements src -> dst; this program takes blocks pid, pid + P, ... (P programs)."""
    _move_blocks(src, dst, dst, n, BLOCK, False)


@triton.jit
def tee_blocks(src, dst_a, dst_b, n, BLOCK: tl.constexpr):
    """Copy ``n`` elements src -> dst_a and src -> dst_b in one pass; blocks split as copy_blocks."""
    _move_blocks(src, dst_a, dst_b, n, BLOCK, True)
