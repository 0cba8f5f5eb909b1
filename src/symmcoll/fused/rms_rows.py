"""Device code of all_reduce_rms_norm (fused/all_reduce_rms_norm.py): rows (or chunks of rows) as
sentinel words, their sum over ranks, and the epilogue (new residual, RMSNorm, optional fp8).

A step of a kernel handles R rows. In the slots a row takes ROW_BLOCK words (its H values, two 16-bit
or one fp32 to a word, rounded up to a power of two: BLOCK_H values), so R rows are R * ROW_BLOCK
consecutive words. A step moves its rows in chunks of CHUNK values (CHUNK / (values per word) words):

* CHUNK == BLOCK_H (whole rows, one pass): the new residual stays in registers from the sum to the
  normalised output (``finish_rows``).
* CHUNK < BLOCK_H (one row per step, long rows): pass 1 stores each chunk of the new residual and
  keeps per-thread partial sums of squares (``keep_chunk``); pass 2 reads the row back (it was just
  written: L2) and normalises it chunk by chunk (``norm_chunks``). A program holds CHUNK values instead
  of a whole row: more programs per SM, each with loads in flight while another reduces; the fp8
  output and the 16-bit tensors never share a tile, so no layout conversion through shared memory.
  Per-token fp8 scales (both ways) take max |residual * weight| times the row's 1 / rms (within 2 ulp
  of max |normed|; the quotient is clamped to +-448 as always): the maximum does not wait for the sum.

A rank's own rows never make the trip through words: the kernels use them as the peers will read them
(``sanitize_values``), so the local work is one read of x, residual and weight and one write of each
output, with 16-byte accesses (rows start 16-byte aligned when H is a multiple of 8). Chunked rows load
the next chunk (``load_chunk``) before the current one is summed, stored and reduced.
"""

import triton
import triton.language as tl

from ..language import nan_max, nan_maximum, nan_minimum, narrow, values_of, words_of

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
def load_chunk(x_ptr, residual_ptr, weight_ptr, row_ids, row_ok, H, start, QUANT: tl.constexpr, CHUNK: tl.constexpr):
    """A chunk's x and residual (fp32 [R, CHUNK]) and the weight pass 1 needs (per-token fp8), as loads
    only: the kernels issue them a chunk ahead of their use (x is sanitised where it is used)."""
    x = load_rows(x_ptr, row_ids, row_ok, H, start, CHUNK)
    residual = load_rows(residual_ptr, row_ids, row_ok, H, start, CHUNK)
    weight = load_weight(weight_ptr, H, start, CHUNK) if QUANT == 2 else tl.zeros([CHUNK], tl.float32)
    return x, residual, weight


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
    return word0, word0 + lanes % WORDS < tl.cdiv(H, VALUES_PER_WORD)


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
def _store_normed(normed, offs, mask, row_ids, row_ok, scale_ptr, normed_ptr, scales_ptr, peak,
                  QUANT: tl.constexpr):
    """Store normalised values (QUANT 0: in normed's dtype; 1: divided by the scale at ``scale_ptr``;
    2: by the row's scale ``peak`` / 448, stored too), clamped to +-448 when quantized. NaN propagates
    into the scale and the row, as in torch (the GPU's plain max drops it: language.nan_maximum)."""
    if QUANT == 0:
        tl.store(normed_ptr + offs, narrow(normed, normed_ptr.dtype.element_ty), mask=mask)
    else:
        if QUANT == 1:
            scaled = normed / tl.load(scale_ptr)
        else:
            scales = nan_maximum(peak, MIN_AMAX) / FP8_MAX
            tl.store(scales_ptr + row_ids, scales, mask=row_ok)
            scaled = normed / scales[:, None]
        clamped = nan_minimum(nan_maximum(scaled, -FP8_MAX), FP8_MAX)
        tl.store(normed_ptr + offs, narrow(clamped, normed_ptr.dtype.element_ty), mask=mask)


@triton.jit
def finish_rows(new_residual, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H,
                eps, QUANT: tl.constexpr, BLOCK_H: tl.constexpr):
    """Whole rows, one pass: store rows ``row_ids`` of the new residual ([R, BLOCK_H] fp32, already
    rounded to the output dtype) and of the normalised (and maybe quantized) rows; per-token scales."""
    elems = tl.arange(0, BLOCK_H)
    mask = row_ok[:, None] & (elems < H)[None, :]
    offs = row_ids[:, None].to(tl.int64) * H + elems[None, :]
    weight = tl.load(weight_ptr + elems, mask=elems < H, other=0).to(tl.float32)
    tl.store(residual_out_ptr + offs, narrow(new_residual, residual_out_ptr.dtype.element_ty), mask=mask)
    inv_rms = tl.rsqrt(tl.sum(new_residual * new_residual, axis=1) / H + eps)
    # Per-token fp8: max |normed| as max |residual * weight| / rms (as in chunked rows): the two
    # reductions do not wait for each other.
    peak = nan_max(tl.abs(new_residual * weight[None, :]), 1) * inv_rms if QUANT == 2 else inv_rms
    normed = new_residual * inv_rms[:, None] * weight[None, :]
    _store_normed(normed, offs, mask, row_ids, row_ok, scale_ptr, normed_ptr, scales_ptr, peak, QUANT)


@triton.jit
def keep_chunk(new_residual, weight, squares, peaks, row_ids, row_ok, start, residual_out_ptr, H, QUANT: tl.constexpr,
               CHUNK: tl.constexpr):
    """Pass 1 of a chunked row: store elements [start, start + CHUNK) of the new residual ([R, CHUNK]
    fp32, rounded to the output dtype); returns the per-thread partial sums of squares and (per-token
    fp8: ``weight`` [CHUNK] given) partial maxima of |residual * weight|, reduced once in ``norm_chunks``."""
    elems = start + tl.arange(0, CHUNK)
    mask = row_ok[:, None] & (elems < H)[None, :]
    tl.store(residual_out_ptr + row_ids[:, None].to(tl.int64) * H + elems[None, :],
             narrow(new_residual, residual_out_ptr.dtype.element_ty), mask=mask)
    squares += new_residual * new_residual
    if QUANT == 2:
        peaks = nan_maximum(peaks, tl.abs(new_residual * weight[None, :]))
    return squares, peaks


@triton.jit
def norm_chunks(squares, peaks, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr,
                H, eps, QUANT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_H: tl.constexpr):
    """Pass 2 of a chunked row: the rows' 1 / rms from pass 1's partial sums, then the new residual read
    back (this program wrote it: visible after the barrier) chunk by chunk, normalised, stored; the
    next chunk's loads are issued before this one's arithmetic."""
    inv_rms = tl.rsqrt(tl.sum(squares, axis=1) / H + eps)
    peak = nan_max(peaks, 1) * inv_rms
    tl.debug_barrier()
    residual_next = load_rows(residual_out_ptr, row_ids, row_ok, H, 0, CHUNK)
    weight_next = load_weight(weight_ptr, H, 0, CHUNK)
    for start in range(0, BLOCK_H, CHUNK):
        residual, weight = residual_next, weight_next
        residual_next = load_rows(residual_out_ptr, row_ids, row_ok, H, start + CHUNK, CHUNK)
        weight_next = load_weight(weight_ptr, H, start + CHUNK, CHUNK)
        elems = start + tl.arange(0, CHUNK)
        mask = row_ok[:, None] & (elems < H)[None, :]
        offs = row_ids[:, None].to(tl.int64) * H + elems[None, :]
        _store_normed(residual * inv_rms[:, None] * weight[None, :], offs, mask, row_ids, row_ok, scale_ptr, normed_ptr,
                      scales_ptr, peak, QUANT)


@triton.jit
def end_step(new_residual, weight, squares, peaks, row_ids, row_ok, start, weight_ptr, scale_ptr, normed_ptr,
             residual_out_ptr, scales_ptr, H, eps, QUANT: tl.constexpr, CHUNK: tl.constexpr, BLOCK_H: tl.constexpr):
    """A step's chunk of new residual: whole rows are finished here; a chunk of a row is kept (pass 1;
    ``weight``: the chunk's, for per-token fp8)."""
    if CHUNK == BLOCK_H:
        finish_rows(new_residual, row_ids, row_ok, weight_ptr, scale_ptr, normed_ptr, residual_out_ptr, scales_ptr, H,
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
