"""The sentinel slot layout: where the barrier-free kernels' data lands in a receiver's region, and how a
launch opens its slot set and takes what arrived.

Every sentinel (Lamport) kernel -- the all-reduces and reduce-scatter of comm/sentinel.py, the
quantized all-reduce, matmul_all_reduce and all_reduce_rms_norm -- lays its region out alike, in int32
words::

    [0, HEADER_WORDS)       int64 call headers [PHASES][MAX_WORLD] (polls.post_header)
    slot set p (p < PHASES), stage s (s < SETS), source r:
                            HEADER_WORDS + ((p * SETS + s) * WORLD + r) * ROW, ROW words

A launch uses slot set ``epoch % PHASES`` of its per-rank launch counter (polls.launch_epoch): a rank
is at most one launch ahead of any peer (finishing launch k+1 needs every peer's launch k+1 data, sent
after that peer finished launch k, its resets included), so a set is EMPTY again before anybody writes
it again. Sender s writes only its row of each receiver's set (and its header); the receiver polls
it (``take`` / ``take_rows``: volatile loads until no word is EMPTY) and writes EMPTY back.

Host side: ``declare_slots`` declares a family's slot region (filled with EMPTY, the headers excluded
from the emptiness checks) and its launch-epoch table, with the reuse rule above.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..memory.regions import RegionSpec, declare
from .polls import EPOCH_SLOTS, launch_epoch, post_header_at, wait_filled, wait_filled_rows
from .signals import MAX_WORLD, announce_at, peer_ptr, program0_peer_bases
from .words import EMPTY

PHASES: tl.constexpr = tl.constexpr(3)
# int32 words of the int64 headers [PHASES][MAX_WORLD] at the start of each region
HEADER_WORDS: tl.constexpr = tl.constexpr(2 * PHASES.value * MAX_WORLD.value)

SLOT_RULE = ("rank s writes only its row of slot set epoch % 3 (and its header) in each receiver; the receiver "
             "empties what it read; a set is written again only after every receiver emptied it (one launch "
             "ahead at most)")


def declare_slots(name: str, owner: str, sets: int, row_words):
    """Declare region ``{name}.slots`` (PHASES slot sets of ``sets`` x world rows of
    ``row_words(device_type, world)`` words, after the headers) and the per-rank table ``{name}.epochs``;
    returns both specs."""
    def nbytes(g):
        return (HEADER_WORDS.value + PHASES.value * sets * g.world_size * row_words(g.device_type, g.world_size)) * 4

    slots = declare(RegionSpec(f"{name}.slots", owner, nbytes, SLOT_RULE, fill_int32=EMPTY.value,
                               header_words=HEADER_WORDS.value))
    epochs = declare(RegionSpec(f"{name}.epochs", owner, lambda g: EPOCH_SLOTS.value,
                                "this rank's launch-epoch table (kernels only)", symmetric=False))
    return slots, epochs


@triton.jit
def open_slots(slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc, rank, WORLD: tl.constexpr,
               SETS: tl.constexpr, ROW: tl.constexpr):
    """Start a launch over a slot region, loads only: this launch's epoch, the word offset of its slot
    set, my own region (int32), my headers of the set (int64, for the waits' ``check``), and (program 0)
    every peer's pad and region, through which ``post_call`` announces the call and posts its header.

    Call it first, ``post_call`` after the launch's first pushes: the loads go out with the kernel's
    other first loads, and program 0's stores find their addresses there. Loading and storing here
    (run 1 of issue 24's GPU stage) put two dependent round trips before everything else program 0
    did: +0.55 us per launch on one H200."""
    epoch = launch_epoch(epochs_ptr)
    phase = epoch % PHASES
    region = peer_ptr(slot_ptrs_dev, rank, tl.int32)
    headers = region.to(tl.pointer_type(tl.int64)) + phase * MAX_WORLD
    pad_bases = program0_peer_bases(signal_pad_ptrs_dev, rank, WORLD, tl.int32)
    header_bases = program0_peer_bases(slot_ptrs_dev, rank, WORLD, tl.int64)
    return epoch, HEADER_WORDS + phase * SETS * WORLD * ROW, region, headers, pad_bases, header_bases


@triton.jit
def open_two_stage_slots(slot_ptrs_dev, epochs_ptr, signal_pad_ptrs_dev, desc, rank, WORLD: tl.constexpr,
                         ROW: tl.constexpr):
    """``open_slots`` for a kernel with a scatter and a gather stage (two slot sets per launch): (epoch,
    the scatter set's offset, the gather set's offset, region, headers, pads, peer headers)."""
    epoch, scatter_base, region, headers, pads, peer_headers = open_slots(slot_ptrs_dev, epochs_ptr,
                                                                          signal_pad_ptrs_dev, desc, rank, WORLD, 2,
                                                                          ROW)
    return epoch, scatter_base, scatter_base + WORLD * ROW, region, headers, pads, peer_headers


@triton.jit
def post_call(pad_bases, header_bases, epoch, desc, rank, WORLD: tl.constexpr):
    """Program 0 announces the call and posts its epoch-tagged header into every peer's region
    (``open_slots``' bases). Before the launch's first wait: peers' first waits need the header."""
    announce_at(pad_bases, desc, rank, WORLD)
    post_header_at(header_bases, epoch % PHASES, epoch, desc, rank, WORLD)


@triton.jit
def checks_headers(check):
    """Whether a wait polls the call headers: the first wait (``check``) of program 0. The other
    programs proceed without: when a peer made another call, program 0 records the mismatch and their
    waits give up at their next look at the error record (``signals.failed_elsewhere``); what they
    wrote meanwhile is undefined, as every output of a call that raised. One program's look at the
    headers (one line every program would read at once) keeps the check's cost per launch flat."""
    return check * (tl.program_id(0) == 0).to(tl.int32)


@triton.jit
def take(ptrs, mask, src, rank, budget, status_ptr, desc, headers, epoch, check, WORLD: tl.constexpr):
    """``src``'s words from my slots at ``ptrs`` once filled; the slots are emptied for reuse. Returns
    (words, spins left: 0 if the wait gave up, recorded). ``check``: see ``checks_headers``."""
    words, budget = wait_filled(ptrs, mask, EMPTY, budget, status_ptr, rank, src, desc, headers, epoch,
                                checks_headers(check), WORLD)
    tl.store(ptrs, tl.zeros_like(words) + EMPTY, mask=mask)
    return words, budget


@triton.jit
def take_rows(ptrs, mask, rows, rank, budget, status_ptr, desc, headers, epoch, check, WORLD: tl.constexpr):
    """A [PEERS, BLOCK] tile of my slots once filled (row i from peer ``rows[i]``), emptied for reuse."""
    words, budget = wait_filled_rows(ptrs, mask, rows, EMPTY, budget, status_ptr, rank, desc, headers, epoch,
                                     checks_headers(check), WORLD)
    tl.store(ptrs, tl.zeros_like(words) + EMPTY, mask=mask)
    return words, budget


@triton.jit
def take_rows_pair(ptrs, mask, ptrs2, mask2, rows, rank, budget, status_ptr, desc, headers, epoch, check,
                   WORLD: tl.constexpr, loaded=None, loaded2=None):
    """``take_rows`` of two tiles of the same rows at once (a row's codes and its scales): their loads in
    flight together, one decision per spin. Returns (words, words2, spins left). ``loaded`` /
    ``loaded2``: the first poll's words, read earlier by the caller (``wait_filled_rows``)."""
    words, words2, budget = wait_filled_rows(ptrs, mask, rows, EMPTY, budget, status_ptr, rank, desc, headers, epoch,
                                             checks_headers(check), WORLD, ptrs2, mask2, loaded, loaded2)
    tl.store(ptrs, tl.zeros_like(words) + EMPTY, mask=mask)
    tl.store(ptrs2, tl.zeros_like(words2) + EMPTY, mask=mask2)
    return words, words2, budget
