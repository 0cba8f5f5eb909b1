"""Device code of all_reduce_rms_norm (fused/all_reduce_rms_norm.py): whole rows as sentinel words,
their sum over ranks, and the epilogue (new residual, RMSNorm, optional fp8 quantization).

A step of a kernel handles a block of R rows. In the slots a row takes ROW_BLOCK words (its H values,
two 16-bit or one fp32 to a word, rounded up to a power of two), so R rows are R * ROW_BLOCK
consecutive words and a [PEERS, R * ROW_BLOCK] tile holds every peer's part of a step. A rank's own
rows never make the trip through words: ``own_values`` gives them as the peers will read them
(``sanitize_values``), so the local work of a step is one read of x, residual and weight and one write
of each output, with 16-byte accesses (rows start 16-byte aligned when H is a multiple of 8).
"""

import triton
import triton.language as tl

from ..language import narrow, sanitize_values, values_of, words_of

FP8_MAX: tl.constexpr = tl.constexpr(448.0)  # largest float8_e4m3fn
MIN_AMAX: tl.constexpr = tl.constexpr(1e-12)  # per-token scales of all-zero rows stay finite


@triton.jit
def load_rows(ptr, row_ids, row_ok, H, BLOCK_H: tl.constexpr):
    """Rows ``row_ids`` ([R]) of a [rows, H] tensor as fp32 [R, BLOCK_H] (zeros where not ``row_ok``)."""
    elems = tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (elems < H)[None, :]
    return tl.load(ptr + row_ids[:, None].to(tl.int64) * H + elems[None, :], mask=mask, other=0).to(tl.float32)


@triton.jit
def own_values(x_ptr, row_ids, row_ok, H, FORMAT: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rows ``row_ids`` of x as fp32 [R, BLOCK_H], exactly as a peer decodes them from my words."""
    return sanitize_values(load_rows(x_ptr, row_ids, row_ok, H, BLOCK_H), FORMAT)


@triton.jit
def row_words(x_ptr, row_ids, row_ok, H, FORMAT: tl.constexpr, ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rows ``row_ids`` ([R]) of x as sanitised words, flat: [R * ROW_BLOCK]."""
    R: tl.constexpr = row_ids.shape[0]
    return words_of(tl.reshape(load_rows(x_ptr, row_ids, row_ok, H, BLOCK_H), [R * BLOCK_H]), FORMAT, R * ROW_BLOCK)


@triton.jit
def word_values(words, FORMAT: tl.constexpr, WORDS: tl.constexpr, VALUES: tl.constexpr):
    """[R, WORDS] words -> [R, VALUES] fp32 values."""
    R: tl.constexpr = words.shape[0]
    return tl.reshape(values_of(tl.reshape(words, [R * WORDS]), FORMAT, R * WORDS), [R, VALUES])


@triton.jit
def rank_sum(tile, own, peers, rank, WORLD: tl.constexpr, FORMAT: tl.constexpr, ROWS: tl.constexpr,
             ROW_BLOCK: tl.constexpr, BLOCK_H: tl.constexpr):
    """[ROWS, BLOCK_H] fp32: the sum over ranks of a step's rows, the same bits on every rank (every
    rank reduces the same [PEERS, ...] matrix, row i = rank i): peers' words in ``tile``
    [PEERS, ROWS * ROW_BLOCK], mine as values in ``own`` [ROWS, BLOCK_H]."""
    values = word_values(tile, FORMAT, ROWS * ROW_BLOCK, ROWS * BLOCK_H)
    values = tl.where(peers[:, None] == rank, tl.reshape(own, [ROWS * BLOCK_H])[None, :], values)
    return tl.reshape(tl.sum(tl.where((peers < WORLD)[:, None], values, 0.0), axis=0), [ROWS, BLOCK_H])


@triton.jit
def finish_rows(new_residual, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H,
                eps, QUANT: tl.constexpr, BLOCK_H: tl.constexpr):
    """Store rows ``row_ids`` of the new residual ([R, BLOCK_H] fp32, already rounded to the output
    dtype) and of the normalised (and maybe quantized) rows; per-token scales as well."""
    elems = tl.arange(0, BLOCK_H)
    in_row = (elems < H)[None, :]
    mask = row_ok[:, None] & in_row
    offs = row_ids[:, None].to(tl.int64) * H + elems[None, :]
    weight = tl.load(weight_ptr + elems, mask=elems < H, other=0).to(tl.float32)
    tl.store(residual_out_ptr + offs, narrow(new_residual, residual_out_ptr.dtype.element_ty), mask=mask)
    inv_rms = tl.rsqrt(tl.sum(new_residual * new_residual, axis=1) / H + eps)
    normed = new_residual * inv_rms[:, None] * weight[None, :]
    if QUANT == 0:
        tl.store(normed_ptr + offs, narrow(normed, normed_ptr.dtype.element_ty), mask=mask)
    else:
        if QUANT == 1:
            scaled = normed / tl.load(scale_ptr)
        else:
            scales = tl.maximum(tl.max(tl.abs(normed), axis=1), MIN_AMAX) / FP8_MAX
            tl.store(scales_ptr + row_ids, scales, mask=row_ok)
            scaled = normed / scales[:, None]
        clamped = tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX)
        tl.store(normed_ptr + offs, narrow(clamped, normed_ptr.dtype.element_ty), mask=mask)
