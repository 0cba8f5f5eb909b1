"""Data as 4-byte words: how the barrier-free protocols carry bf16/fp16/fp32 values.

A word holds two bf16, two fp16 or one fp32 (``FORMAT`` 0, 1, 2). ``unpack`` gives the fp32 values of a
block of words (low, high halves), ``pack`` rounds fp32 back into words, rounding bf16 to nearest-even
on every machine (``blocks.narrow``). The sentinel protocol reserves one word value, ``EMPTY``
(0x80008000: two 16-bit negative zeros; for fp32 a negative denormal), and ``sanitize`` makes sure no
data word ever equals it (16-bit negative zeros become +0; an fp32 word equal to EMPTY becomes -0.0,
a change of 4.6e-41).
"""

import torch
import triton
import triton.language as tl

from .blocks import narrow

EMPTY: tl.constexpr = tl.constexpr(-2147450880)  # 0x80008000 as int32
_NEG_ZERO_F32: tl.constexpr = tl.constexpr(-2147483648)  # 0x80000000
_HIGH_HALF: tl.constexpr = tl.constexpr(-65536)  # 0xFFFF0000

# How a 4-byte word holds data, by dtype (the kernels' FORMAT constexpr).
WORD_FORMAT = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


@triton.jit
def unpack(words, FORMAT: tl.constexpr):
    """The fp32 values in a block of int32 words: (low, high) halves for 16-bit formats."""
    if FORMAT == 2:
        return words.to(tl.float32, bitcast=True), words.to(tl.float32, bitcast=True)
    else:
        half_ty = tl.bfloat16 if FORMAT == 0 else tl.float16
        lo = (words & 0xFFFF).to(tl.int16).to(half_ty, bitcast=True).to(tl.float32)
        hi = ((words >> 16) & 0xFFFF).to(tl.int16).to(half_ty, bitcast=True).to(tl.float32)
        return lo, hi


@triton.jit
def pack(lo, hi, FORMAT: tl.constexpr):
    """Words from fp32 (low, high) halves, rounded to nearest-even; fp32: ``lo`` alone."""
    if FORMAT == 2:
        return lo.to(tl.int32, bitcast=True)
    else:
        half_ty = tl.bfloat16 if FORMAT == 0 else tl.float16
        lo_bits = narrow(lo, half_ty).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        hi_bits = narrow(hi, half_ty).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        return lo_bits | (hi_bits << 16)


@triton.jit
def sanitize(words, FORMAT: tl.constexpr):
    """Make sure no word equals EMPTY: 16-bit negative zeros -> +0; fp32 EMPTY -> -0.0."""
    if FORMAT == 2:
        return tl.where(words == EMPTY, _NEG_ZERO_F32, words)
    else:
        words = tl.where((words & 0xFFFF) == 0x8000, words & _HIGH_HALF, words)
        return tl.where((words & _HIGH_HALF) == _NEG_ZERO_F32, words & 0xFFFF, words)


@triton.jit
def sanitize_values(values, FORMAT: tl.constexpr):
    """fp32 values of the format (bf16/fp16 values, or fp32) as they read after a trip through
    sanitised words (``values`` -> ``pack`` -> ``sanitize`` -> ``unpack``), without the trip: 16-bit
    negative zeros -> +0; the fp32 value whose bits are EMPTY -> -0.0."""
    if FORMAT == 2:
        return sanitize(values.to(tl.int32, bitcast=True), FORMAT).to(tl.float32, bitcast=True)
    else:
        return tl.where(values == 0.0, 0.0, values)


def padded_words(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``x`` flattened to a whole number of int32 words (a 16-bit tensor of odd length gets one
    spare element), and whether it was padded."""
    flat = x.reshape(-1)
    padded = (flat.numel() * flat.element_size()) % 4 != 0
    if padded:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return flat, padded
