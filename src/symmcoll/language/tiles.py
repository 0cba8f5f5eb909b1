"""Results of a computation as messages: rows and GEMM tiles turned into sentinel words, and per-tile
ready flags.

Words (the sentinel protocol, words.py): ``words_of`` packs a flat block of fp32 values into sanitised
int32 words (two bf16/fp16 values or one fp32 per word, rounded to nearest-even on every machine) and
``values_of`` unpacks them. A [BM, BN] tile or a row is flattened row-major first, so a word always
holds two neighbouring elements of one row. Senders store whole words (never 16-bit halves): only an
aligned 4-byte store is guaranteed to land whole, which is what lets a receiver take any word that is
not EMPTY as final.

Tile flags (the reduce-scatter GEMM): an int64 flag per (source, tile) in the receiver's region holds
``(epoch << 32) | desc`` once the tile's data is there, handed over with language/flags.py's pair
(``send_tile_flag`` / ``wait_tile_flag``: ``release_flag`` / ``acquire_flag`` at system scope). Flags
are epoch-tagged (the launch counter of language.polls), so nobody resets them and graph replays need
no host work; a flag of this epoch carrying another descriptor is a peer that made a different call
(recorded as a mismatch).
"""

import triton
import triton.language as tl

from .flags import acquire_flag, release_flag
from .words import pack, sanitize, unpack


@triton.jit
def words_of(values, FORMAT: tl.constexpr, WORDS: tl.constexpr):
    """Sanitised int32 words [WORDS] of flat fp32 ``values`` ([2 * WORDS] for bf16/fp16 (FORMAT 0, 1),
    [WORDS] for fp32 (FORMAT 2)); element 2i goes to the low half of word i."""
    if FORMAT == 2:
        return sanitize(values.to(tl.int32, bitcast=True), FORMAT)
    else:
        lo, hi = tl.split(tl.reshape(values, [WORDS, 2]))
        return sanitize(pack(lo, hi, FORMAT), FORMAT)


@triton.jit
def values_of(words, FORMAT: tl.constexpr, WORDS: tl.constexpr):
    """The flat fp32 values of int32 ``words`` [WORDS] (inverse of ``words_of``)."""
    if FORMAT == 2:
        return words.to(tl.float32, bitcast=True)
    else:
        lo, hi = unpack(words, FORMAT)
        return tl.reshape(tl.join(lo, hi), [2 * WORDS])


@triton.jit
def tile_words(tile, FORMAT: tl.constexpr):
    """``words_of`` for a 2-D fp32 tile [R, C], kept 2-D: [R, C // 2] words (bf16/fp16; word (r, i)
    holds elements (r, 2i), (r, 2i+1), the same row-major order as the flat form) or [R, C] (fp32).
    A GEMM accumulator keeps neighbouring columns in one thread, so no data moves between threads
    (flattening a 128 x 256 accumulator first costs a shared-memory round trip)."""
    if FORMAT == 2:
        return sanitize(tile.to(tl.int32, bitcast=True), FORMAT)
    else:
        lo, hi = tl.split(tl.reshape(tile, [tile.shape[0], tile.shape[1] // 2, 2]))
        return sanitize(pack(lo, hi, FORMAT), FORMAT)


@triton.jit
def tile_values(words, FORMAT: tl.constexpr):
    """The fp32 tile of 2-D ``words`` (inverse of ``tile_words``)."""
    if FORMAT == 2:
        return words.to(tl.float32, bitcast=True)
    else:
        lo, hi = unpack(words, FORMAT)
        return tl.reshape(tl.join(lo, hi), [words.shape[0], words.shape[1] * 2])


@triton.jit
def send_tile_flag(flag_ptr, ready):
    """``release_flag`` at system scope: the tile this block stored, then its flag."""
    release_flag(flag_ptr, ready, "sys")


@triton.jit
def wait_tile_flag(flag_ptr, ready, budget, status_ptr, rank, peer, desc):
    """``acquire_flag`` at system scope on a tile's (epoch << 32) | desc flag; returns the spins left."""
    return acquire_flag(flag_ptr, ready, budget, status_ptr, rank, peer, desc, "sys")
