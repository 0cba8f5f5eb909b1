"""Group quantization on the device: fp32 values <-> (codes, one scale per group of G), and codes
packed into int32 words. Used by the quantized all-reduce (comm/quantized.py).

Formats (``FMT`` constexpr; ``FORMATS`` maps the public names):

    0 int8   codes in [-127, 127], 4 per word     scale = amax / 127
    1 fp8    e4m3fn codes, 4 per word             scale = amax / 448
    2 int4   codes in [-7, 7], 8 per word         scale = amax / 7

``amax`` is the largest magnitude in the group, at least TINY_AMAX; a group holding Inf or NaN gets a
NaN scale (and zero codes), so non-finite input turns its whole group into NaN instead of being lost. Every step is IEEE
fp32 arithmetic with a fixed rounding (``div_rn``; half away from zero for the integer formats;
nearest-even for fp8 through ``blocks.narrow``, the package's one fp8 rounding, on which the
interpreter and the GPU agree bit for bit): the same values give the same codes on every machine, and
``symmcoll.reference`` emulates it exactly. Launches of these helpers must pass
``enable_fp_fusion=False`` (a fused multiply-add would round ``x * inv + 0.5`` once instead of twice).

Byte values the codes never take, which the sentinel protocol relies on: the integer formats never
produce -128 (0x80) or -8 (nibble 0x8), and fp8 never produces 0x80 (negative zero becomes +0), so
a data word never contains the byte 0x80 -- and ``words.EMPTY`` (0x80008000) does. Scales are
non-negative or a positive NaN: their sign bit is clear, and EMPTY's is set.
"""

import triton
import triton.language as tl

from .blocks import narrow

FORMATS = {"int8": 0, "fp8": 1, "int4": 2}
FORMAT_BITS = {0: 8, 1: 8, 2: 4}

_POSITIVE_NAN: tl.constexpr = tl.constexpr(0x7FC00000)
_EXPONENT_ALL_ONES: tl.constexpr = tl.constexpr(0x7F800000)
_SIGN_BIT: tl.constexpr = tl.constexpr(-2147483648)  # 0x80000000
_HALF_BITS: tl.constexpr = tl.constexpr(0x3F000000)  # 0.5
# Half e4m3's smallest step (2^-10): what rounds to zero, ties to even included.
_E4M3_HALF_STEP: tl.constexpr = tl.constexpr(2.0 ** -10)
# Smallest group maximum a scale is taken from (2^-118): qmax / TINY_AMAX stays finite for every
# format, so t never overflows; a group of smaller values is quantized in steps of TINY_AMAX / qmax.
TINY_AMAX: tl.constexpr = tl.constexpr(2.0 ** -118)


@triton.jit
def _qmax(FMT: tl.constexpr):
    if FMT == 0:
        return 127.0
    elif FMT == 1:
        return 448.0
    else:
        return 7.0


@triton.jit
def _e4m3_encode(t):
    """fp32 (|t| <= 448 (1 + 2^-23)) -> e4m3fn code (int32 0..255), rounded to nearest-even by
    ``blocks.narrow`` (the GPU's conversion, saturating; emulated bit for bit under the interpreter).
    Negative zero never appears: t in [-2^-10, 0] (what rounds to -0) is taken as |t| first, so the
    code is never 0x80."""
    t = tl.where(t < -_E4M3_HALF_STEP, t, tl.abs(t))
    return narrow(t, tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)


@triton.jit
def _e4m3_decode(codes):
    """e4m3fn codes (low 8 bits of int32; never a NaN code) -> fp32 values (exact)."""
    return (codes & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def quantize_groups(x, ROWS: tl.constexpr, N: tl.constexpr, G: tl.constexpr, FMT: tl.constexpr):
    """fp32 [ROWS, N] -> (int32 codes [ROWS, N], fp32 scales [ROWS, N // G]); groups of G along a row.

    Per group: amax = max(max |v|, TINY_AMAX), scale = amax / qmax and inverse = qmax / amax (both
    ``div_rn``), t = v * inverse, then the format's rounding; a group holding Inf or NaN gets zero codes
    and a NaN scale. |t| <= qmax (1 + 2^-23) needs no clamp: the integer formats' rounding of t + 1/2
    truncates it to qmax, e4m3's saturates. Per value: the magnitude's bits and their integer maximum
    (which is max |v| for finite values and above every finite one for Inf and NaN: no separate
    non-finite test), a multiply, the rounding, a select for the non-finite groups."""
    v = tl.reshape(x, (ROWS, N // G, G))
    peak = tl.max(v.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
    finite = peak < _EXPONENT_ALL_ONES
    amax = tl.maximum(tl.where(finite, peak, 0).to(tl.float32, bitcast=True), TINY_AMAX)
    qmax = tl.zeros_like(amax) + _qmax(FMT)
    nan = (tl.zeros_like(peak) + _POSITIVE_NAN).to(tl.float32, bitcast=True)
    scale = tl.where(finite, tl.math.div_rn(amax, qmax), nan)
    t = v * tl.math.div_rn(qmax, amax)[:, :, None]
    if FMT == 1:
        codes = _e4m3_encode(t)
    else:
        # Half away from zero: t + 0.5 with t's sign (one bit operation; t is finite), truncated.
        half = ((t.to(tl.int32, bitcast=True) & _SIGN_BIT) | _HALF_BITS).to(tl.float32, bitcast=True)
        codes = (t + half).to(tl.int32)
    return tl.reshape(tl.where(finite[:, :, None], codes, 0), (ROWS, N)), scale


@triton.jit
def dequantize_groups(codes, scales, ROWS: tl.constexpr, N: tl.constexpr, G: tl.constexpr, FMT: tl.constexpr):
    """int32 codes [ROWS, N] and fp32 scales [ROWS, N // G] -> fp32 values [ROWS, N]."""
    if FMT == 1:
        values = _e4m3_decode(codes)
    else:
        values = codes.to(tl.float32)
    return tl.reshape(tl.reshape(values, (ROWS, N // G, G)) * scales[:, :, None], (ROWS, N))


@triton.jit
def shard_geometry(shard_len, BLOCK: tl.constexpr, BITS: tl.constexpr, G: tl.constexpr):
    """A shard of ``shard_len`` values (a multiple of G and of 32 // BITS) in steps of BLOCK: (steps,
    code words, groups)."""
    return tl.cdiv(shard_len, BLOCK), shard_len // (32 // BITS), shard_len // G


@triton.jit
def _pair(fields, ROWS: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """[ROWS, N] fields of BITS bits -> [ROWS, N // 2] fields of 2 * BITS bits (element 2i low).
    Only the low field needs masking: the high one's sign bits land above 2 * BITS, where the next
    level masks them or shifts them out of the word."""
    low, high = tl.split(tl.reshape(fields, (ROWS, N // 2, 2)))
    return (low & ((1 << BITS) - 1)) | (high << BITS)


@triton.jit
def _unpair(fields, ROWS: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """Inverse of ``_pair`` for sign-extended fields: [ROWS, N] -> [ROWS, 2 N], sign-extended."""
    low = (fields << (32 - BITS)) >> (32 - BITS)
    high = fields >> BITS
    return tl.reshape(tl.join(low, high), (ROWS, 2 * N))


@triton.jit
def pack_words(codes, ROWS: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """int32 codes [ROWS, N] of BITS (4 or 8) bits -> int32 words [ROWS, N * BITS // 32], code i of a
    word in bits [i * BITS, (i + 1) * BITS) (little-endian byte order for 8-bit codes)."""
    if BITS == 4:
        bytes_ = _pair(codes, ROWS, N, 4)
        halves = _pair(bytes_, ROWS, N // 2, 8)
        return _pair(halves, ROWS, N // 4, 16)
    else:
        halves = _pair(codes, ROWS, N, 8)
        return _pair(halves, ROWS, N // 2, 16)


@triton.jit
def unpack_words(words, ROWS: tl.constexpr, N: tl.constexpr, BITS: tl.constexpr):
    """Inverse of ``pack_words``: int32 words -> [ROWS, N] sign-extended codes."""
    if BITS == 4:
        halves = _unpair(words, ROWS, N // 8, 16)
        bytes_ = _unpair(halves, ROWS, N // 4, 8)
        return _unpair(bytes_, ROWS, N // 2, 4)
    else:
        halves = _unpair(words, ROWS, N // 4, 16)
        return _unpair(halves, ROWS, N // 2, 8)
