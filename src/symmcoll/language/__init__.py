"""@triton.jit building blocks shared by every kernel: signals, barriers and the error record
(signals.py), the barrier-free waits on data, call headers and launch epochs (polls.py), block copies
and fp32 reductions (blocks.py), word formats of the barrier-free protocols (words.py), results as
messages (tiles.py: rows and GEMM tiles as sentinel words, per-tile ready flags), epoch-tagged counts,
escaped words and device-side splits (tagged.py), a call's prologue and the one-program barrier kernel
(barrier.py), group quantization codecs (codecs.py), the sentinel slot layout and its take helpers
(slots.py), the acquire / release pair every flag that guards data goes through (flags.py), and programmatic
dependent launch's wait / release (pdl.py)."""

from .blocks import (INTERPRETED, OP_AVG, OP_MAX, OP_MIN, OP_SUM, REDUCE_OPS, combine, copy_blocks, finalize,
                     move_block, nan_max, nan_maximum, nan_min, nan_minimum, narrow, own_shard, reduce_rows,
                     tee_blocks)
from .signals import (ARG_MAX_ROWS, ARG_SPLITS, ARG_TOPK_IDS, MAX_WORLD, announce, announce_at, block_barrier,
                      peer_ptr, peer_rows, program0_peer_bases, record_argument, record_error, record_timeout,
                      send_signals, wait_signals)
from .polls import (EPOCH_SLOTS, end_launch, launch_epoch, post_header, post_header_at, wait_filled, wait_filled_rows,
                    wait_flagged)
from .slots import (HEADER_WORDS, PHASES, checks_headers, declare_slots, open_slots, open_two_stage_slots, post_call,
                    take, take_rows, take_rows_pair)
from .tagged import ESCAPE_GROUP, clamped_splits, escape, post_counts, wait_counts, wait_escaped
from .words import EMPTY, WORD_FORMAT, pack, padded_words, sanitize, sanitize_values, unpack
from .flags import acquire_flag, release_flag
from .tiles import send_tile_flag, tile_values, tile_words, values_of, wait_tile_flag, words_of
from .barrier import barrier_kernel, open_call
from .pdl import release_dependents, wait_prior_grid
from .codecs import (FORMAT_BITS, FORMATS, dequantize_groups, pack_words, quantize_groups, shard_geometry,
                     unpack_words)

__all__ = ["INTERPRETED", "OP_AVG", "OP_MAX", "OP_MIN", "OP_SUM", "REDUCE_OPS", "combine", "copy_blocks",
           "finalize", "move_block", "narrow", "own_shard", "reduce_rows", "tee_blocks", "ARG_MAX_ROWS", "ARG_SPLITS",
           "ARG_TOPK_IDS", "EPOCH_SLOTS", "MAX_WORLD", "announce", "block_barrier", "end_launch", "launch_epoch",
           "peer_ptr", "peer_rows", "post_header", "record_argument", "record_error", "record_timeout",
           "send_signals", "wait_filled", "HEADER_WORDS", "PHASES", "declare_slots", "open_slots",
           "open_two_stage_slots", "take", "take_rows", "take_rows_pair", "wait_filled_rows", "wait_flagged", "wait_signals",
           "ESCAPE_GROUP",
           "clamped_splits", "escape", "post_counts", "wait_counts", "wait_escaped", "EMPTY", "WORD_FORMAT", "pack",
           "padded_words", "sanitize", "sanitize_values", "unpack", "barrier_kernel", "open_call", "FORMAT_BITS",
           "FORMATS", "dequantize_groups", "pack_words", "quantize_groups", "unpack_words", "send_tile_flag",
           "tile_values", "tile_words", "values_of", "wait_tile_flag", "words_of"]
__all__ += ["announce_at", "post_header_at", "program0_peer_bases", "checks_headers", "post_call", "nan_max", "nan_maximum", "nan_min", "nan_minimum", "acquire_flag", "release_flag"]
__all__ += ["release_dependents", "wait_prior_grid"]
__all__ += ["shard_geometry"]

if INTERPRETED:  # (its own module: lines added above blocks.py's kernels would change their compile-cache keys)
    from .interpreter_types import cheaper_interpreted_types

    cheaper_interpreted_types()
