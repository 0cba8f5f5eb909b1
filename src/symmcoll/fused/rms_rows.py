"""Device code that all_reduce_rms_norm's kernels (fused/rms_one_shot.py, fused/rms_two_shot.py; host side
in fused/all_reduce_rms_norm.py) share: rows (or chunks of rows) as sentinel words, their sum over
ranks, and the epilogue (new residual, RMSNorm, optional fp8).

A step of a kernel handles R rows. In the slots a row takes ROW_BLOCK words (its H values, two 16-bit
or one fp32 to a word, rounded up to a power of two: BLOCK_H values), so R rows are R * ROW_BLOCK
consecutive words. A step moves its rows in chunks of CHUNK values (CHUNK / (values per word) words):

* CHUNK == BLOCK_H (whole rows, one pass): the new residual stays in registers from the sum to the
  normalised output (``finish_rows``).
* CHUNK < BLOCK_H (one row per step, long rows): pass 1 stores each chunk of the new residual and
  keeps per-thread partial sums of squares (``keep_chunk``); pass 2 reads the row back (it was just
  written: L2) and normalises it chunk by chunk (``norm_chunks``). A program holds CHUNK values instead
  of a whole row: more programs per SM, each with loads in flight while another reduces.

Both ways the output is residual * weight times one factor per row (``norm_factors``: 1 / rms, over the
fp8 scale): per-token fp8 scales take max |residual * weight| times the row's 1 / rms (within 2 ulp of
max |normed|), the maximum found in the same reduction as the sum of squares; fp8 saturates at +-448 in
the conversion itself (the reference's clamp) and is stored 8 values to an access, the layout of the
16-bit tensors' 16-byte accesses (``store_normed``: no layout conversion through shared memory).

A rank's own rows never make the trip through words: the kernels use them as the peers will read them
(``own_values``; on one rank, with no peer, x as given and the rounded sum + 0.0, the same values), so
the local work is one read of x, residual and weight and one write of each
output, with 16-byte accesses (rows start 16-byte aligned when H is a multiple of 8; fp8 8 bytes). Whole
rows read the weight once per program; chunked rows load the next chunk (``load_chunk``) before the
current one is summed, stored and reduced.
"""

import triton
import triton.language as tl

from ..language import INTERPRETED, nan_maximum, narrow, sanitize_values, values_of, words_of

FP8_MAX: tl.constexpr = tl.constexpr(448.0)  # largest float8_e4m3fn
MIN_AMAX: tl.constexpr = tl.constexpr(1e-12)  # per-token scales of all-zero rows stay finite


@triton.jit
def load_rows(ptr, row_ids, row_ok, H, start, BLOCK: tl.constexpr):
    """Elements [start, start + BLOCK) of rows ``row_ids`` ([R]) of a [rows, H] tensor as fp32 [R, BLOCK]
    (zeros past H and where not ``row_ok``)."""
    elems = start + tl.arange(0, BLOCK)
    mask = row_ok[:, None] & (elems < H)[None, :]
    return tl.load(ptr + row_ids[:, None].to(tl.int64) * H + elems[None, :], mask=mask, other=0).to(tl.float32)


@triton.jit
def load_weight(weight_ptr, H, start, BLOCK: tl.constexpr):
    """Elements [start, start + BLOCK) of the weight as fp32 [BLOCK] (zeros past H)."""
    elems = start + tl.arange(0, BLOCK)
    return tl.load(weight_ptr + elems, mask=elems < H, other=0).to(tl.float32)


@triton.jit
def load_chunk(x_ptr, residual_ptr, weight_ptr, row_ids, row_ok, H, start, CHUNK: tl.constexpr, WEIGHT: tl.constexpr):
    """A chunk's x and residual (fp32 [R, CHUNK]) and, if WEIGHT, the weight its pass 1 needs (whole rows:
    the norm, unless the program holds the weight, ``row_weight``; chunked rows: per-token fp8's peak), as
    loads only: the kernels issue them a chunk ahead of their use (x is sanitised where it is used)."""
    x = load_rows(x_ptr, row_ids, row_ok, H, start, CHUNK)
    residual = load_rows(residual_ptr, row_ids, row_ok, H, start, CHUNK)
    weight = load_weight(weight_ptr, H, start, CHUNK) if WEIGHT else tl.zeros([CHUNK], tl.float32)
    return x, residual, weight


@triton.jit
def row_weight(weight_ptr, H, BLOCK_H: tl.constexpr):
    """The weight as fp32 [BLOCK_H], for a program that holds it through its steps (whole rows with loads
    ahead: loaded after the first step's x and residual, so in flight with them)."""
    return load_weight(weight_ptr, H, 0, BLOCK_H)


@triton.jit
def own_values(x, FORMAT: tl.constexpr):
    """language.sanitize_values of this rank's own (16-bit) values as one add: x + 0.0 is x except that
    -0 becomes +0 (round to nearest), as the words peers read have it. No compare: the compares' predicates
    crowded out the loads' masks and the compiler issued the next loads only after this one had arrived.
    (A NaN may lose its payload, as it does in the sum's add anyway.)"""
    if FORMAT == 2:
        return sanitize_values(x, FORMAT)
    else:
        return x + 0.0


@triton.jit
def step_lanes(rank, WORLD: tl.constexpr, ROWS: tl.constexpr, WORDS: tl.constexpr, PEERS: tl.constexpr):
    """A step's index vectors: ``lanes`` over its ROWS * WORDS words of a chunk, ``in_step`` over its rows,
    ``peers`` over the PEERS ranks and ``is_peer`` (a rank other than me, below WORLD)."""
    lanes = tl.arange(0, ROWS * WORDS)
    in_step = tl.arange(0, ROWS)
    peers = tl.arange(0, PEERS)
    return lanes, in_step, peers, (peers < WORLD) & (peers != rank)


@triton.jit
def chunk_words(start, lanes, H, VALUES_PER_WORD: tl.constexpr, WORDS: tl.constexpr):
    """(the first word in its row of the chunk of values [start, start + WORDS * VALUES_PER_WORD), which
    of a step's ``lanes`` (WORDS per row) hold values of the row rather than padding to BLOCK_H)."""
    word0 = start // VALUES_PER_WORD
    return word0, word0 + lanes % WORDS < tl.cdiv(H, 4 * VALUES_PER_WORD) * 4


@triton.jit
def row_words(x_ptr, row_ids, row_ok, H, start, FORMAT: tl.constexpr, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    """Elements [start, start + BLOCK) of rows ``row_ids`` ([R]) of x as sanitised words, flat: [R * WORDS]."""
    R: tl.constexpr = row_ids.shape[0]
    return words_of(tl.reshape(load_rows(x_ptr, row_ids, row_ok, H, start, BLOCK), [R * BLOCK]), FORMAT, R * WORDS)


@triton.jit
def word_values(words, FORMAT: tl.constexpr, WORDS: tl.constexpr, VALUES: tl.constexpr):
    """[R, WORDS] words -> [R, VALUES] fp32 values."""
    R: tl.constexpr = words.shape[0]
    return tl.reshape(values_of(tl.reshape(words, [R * WORDS]), FORMAT, R * WORDS), [R, VALUES])


@triton.jit
def rank_sum(tile, own, peers, rank, WORLD: tl.constexpr, FORMAT: tl.constexpr, ROWS: tl.constexpr,
             WORDS: tl.constexpr, BLOCK: tl.constexpr):
    """[ROWS, BLOCK] fp32: the sum over ranks of a step's (chunk of) rows, the same bits on every rank
    (every rank reduces the same [PEERS, ...] matrix, row i = rank i): peers' words in ``tile``
    [PEERS, ROWS * WORDS], mine as values in ``own`` [ROWS, BLOCK]."""
    values = word_values(tile, FORMAT, ROWS * WORDS, ROWS * BLOCK)
    values = tl.where(peers[:, None] == rank, tl.reshape(own, [ROWS * BLOCK])[None, :], values)
    return tl.reshape(tl.sum(tl.where((peers < WORLD)[:, None], values, 0.0), axis=0), [ROWS, BLOCK])


@triton.jit
def magnitude_bits(values):
    """|values| as int32 bit patterns: non-negative floats order as their bits do, and a NaN (sign
    cleared) lies above +Inf, so the integer max of these is torch.amax(|values|) with NaN propagating,
    and a plain (fast) max on CPU and GPU alike."""
    return values.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _sum_and_max(sum_a, max_a, sum_b, max_b):
    return sum_a + sum_b, tl.maximum(max_a, max_b)


@triton.jit
def row_reductions(squares, peaks, QUANT: tl.constexpr):
    """Per row (axis 1): the sum of ``squares`` [R, N] and (per-token fp8) the max of ``peaks``
    (magnitude bits). On the GPU both in one reduction: one round through shared memory and its
    barriers, not two. The interpreter runs a reduction with its own combine element by element, so
    there the same two results come from tl.sum and tl.max."""
    if QUANT != 2:
        return tl.sum(squares, 1), tl.zeros([squares.shape[0]], tl.int32)
    elif INTERPRETED:
        return tl.sum(squares, 1), tl.max(peaks, 1)
    else:
        return tl.reduce((squares, peaks), 1, _sum_and_max)


@triton.jit
def norm_factors(sums, peak_bits, row_ids, row_ok, scale_ptr, scales_ptr, H, eps, QUANT: tl.constexpr):
    """Per row, what turns residual * weight into the output: 1 / rms (QUANT 0), 1 / (rms * scale) (1:
    the scale at ``scale_ptr``), 1 / (rms * the row's scale) (2: max |normed| / 448 from the max of
    |residual * weight| times 1 / rms, within 2 ulp of max |normed|; stored). One division per row, none
    per value. NaN propagates into the scale and the row, as in torch."""
    inv_rms = tl.rsqrt(sums / H + eps)
    if QUANT == 0:
        return inv_rms
    elif QUANT == 1:
        return inv_rms / tl.load(scale_ptr)
    else:
        scales = nan_maximum(peak_bits.to(tl.float32, bitcast=True) * inv_rms, MIN_AMAX) / FP8_MAX
        tl.store(scales_ptr + row_ids, scales, mask=row_ok)
        return inv_rms / scales


@triton.jit
def normalised(new_residual, weight, factors, QUANT: tl.constexpr):
    """residual * weight * factor (``norm_factors``) per row: per-token fp8 from residual * weight (the
    product its peak was taken over), the others as the reference multiplies, residual * (1 / rms) first
    (the weight is not needed before the row's reduction: the compiler issues its load after x's)."""
    if QUANT == 2:
        return new_residual * weight[None, :] * factors[:, None]
    else:
        return new_residual * factors[:, None] * weight[None, :]


@triton.jit
def store_normed(values, offs, mask, normed_ptr):
    """Normalised values in normed's dtype. fp8 saturates at +-448 (NaN stays NaN): language.narrow, the
    GPU's cvt.rn.satfinite, is the reference's clamp."""
    normed = narrow(values, normed_ptr.dtype.element_ty)
    # A row tile one value wide (hidden 1, fp32) takes no hint: triton 3.6's coalesce pass fails on it
    # (seen in issue 24's random calls on an H100).
    if (normed_ptr.dtype.element_ty.primitive_bitwidth == 8) and (values.shape[1] > 1):
        # fp8 stored 8 values (8 bytes) to an access, the values a thread holds in the 16-bit tensors'
        # 16-byte accesses: told nothing, the compiler stored 16 in one access, in a layout of their own,
        # and moved the new residual and the weight into it through shared memory (16-32 KB, 4 barriers).
        RUN: tl.constexpr = 8 if values.shape[1] >= 8 else values.shape[1]
        tl.store(tl.max_contiguous(normed_ptr + offs, [1, RUN]), normed, mask=mask)
    else:
        tl.store(normed_ptr + offs, normed, mask=mask)


@triton.jit
def finish_rows(new_residual, weight, row_ids, row_ok, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H,
                eps, QUANT: tl.constexpr, BLOCK_H: tl.constexpr):
    """Whole rows, one pass: store rows ``row_ids`` of the new residual ([R, BLOCK_H] fp32, already
    rounded to the output dtype) and of the normalised (and maybe quantized) rows; per-token scales."""
    elems = tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (elems < H)[None, :]
    offs = row_ids[:, None].to(tl.int64) * H + elems[None, :]
    tl.store(residual_out_ptr + offs, narrow(new_residual, residual_out_ptr.dtype.element_ty), mask=mask)
    peaks = magnitude_bits(new_residual * weight[None, :]) if QUANT == 2 else tl.zeros([1, 1], tl.int32)
    sums, peak_bits = row_reductions(new_residual * new_residual, peaks, QUANT)
    factors = norm_factors(sums, peak_bits, row_ids, row_ok, scale_ptr, scales_ptr, H, eps, QUANT)
    store_normed(normalised(new_residual, weight, factors, QUANT), offs, mask, normed_ptr)


@triton.jit
def keep_chunk(new_residual, weight, squares, peaks, row_ids, row_ok, start, residual_out_ptr, H, QUANT: tl.constexpr,
               CHUNK: tl.constexpr):
    """Pass 1 of a chunked row: store elements [start, start + CHUNK) of the new residual ([R, CHUNK]
    fp32, rounded to the output dtype); returns the per-thread partial sums of squares and (per-token
    fp8: ``weight`` [CHUNK] given) partial maxima of |residual * weight| (magnitude bits, int32), reduced
    once in ``norm_chunks``."""
    elems = start + tl.arange(0, CHUNK)
    mask = row_ok[:, None] & (elems < H)[None, :]
    tl.store(residual_out_ptr + row_ids[:, None].to(tl.int64) * H + elems[None, :],
             narrow(new_residual, residual_out_ptr.dtype.element_ty), mask=mask)
    squares += new_residual * new_residual
    if QUANT == 2:
        peaks = tl.maximum(peaks, magnitude_bits(new_residual * weight[None, :]))
    return squares, peaks


@triton.jit
def norm_chunks(squares, peaks, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr,
                H, eps, QUANT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_H: tl.constexpr):
    """Pass 2 of a chunked row: the rows' factors from pass 1's partial sums, then the new residual read
    back (this program wrote it: visible after the barrier) chunk by chunk, normalised, stored; the
    next chunk's loads are issued before this one's arithmetic."""
    sums, peak_bits = row_reductions(squares, peaks, QUANT)
    factors = norm_factors(sums, peak_bits, row_ids, row_ok, scale_ptr, scales_ptr, H, eps, QUANT)
    tl.debug_barrier()
    residual_next = load_rows(residual_out_ptr, row_ids, row_ok, H, 0, CHUNK)
    weight_next = load_weight(weight_ptr, H, 0, CHUNK)
    for start in range(0, BLOCK_H, CHUNK):
        residual, weight = residual_next, weight_next
        residual_next = load_rows(residual_out_ptr, row_ids, row_ok, H, start + CHUNK, CHUNK)
        weight_next = load_weight(weight_ptr, H, start + CHUNK, CHUNK)
        elems = start + tl.arange(0, CHUNK)
        mask = row_ok[:, None] & (elems < H)[None, :]
        store_normed(normalised(residual, weight, factors, QUANT), row_ids[:, None].to(tl.int64) * H + elems[None, :],
                     mask, normed_ptr)


@triton.jit
def end_step(new_residual, weight, squares, peaks, row_ids, row_ok, start, weight_ptr, scale_ptr, normed_ptr,
             residual_out_ptr, scales_ptr, H, eps, QUANT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_H: tl.constexpr):
    """A step's chunk of new residual: whole rows are finished here; a chunk of a row is kept (pass 1;
    ``weight``: the chunk's, for per-token fp8)."""
    if CHUNK == BLOCK_H:
        finish_rows(new_residual, weight, row_ids, row_ok, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H,
                    eps, QUANT, BLOCK_H)
    else:
        squares, peaks = keep_chunk(new_residual, weight, squares, peaks, row_ids, row_ok, start, residual_out_ptr, H,
                                    QUANT, CHUNK)
    return squares, peaks


@triton.jit
def end_rows(squares, peaks, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H, eps,
             QUANT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_H: tl.constexpr):
    """After a step's chunks: pass 2 of chunked rows (whole rows are done)."""
    if CHUNK < BLOCK_H:
        norm_chunks(squares, peaks, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr,
                    H, eps, QUANT, CHUNK, BLOCK_H)
