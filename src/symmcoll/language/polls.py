"""Barrier-free waits: polls on the data itself, the epoch-tagged call headers polled with them, and
the per-rank launch epoch that both are tagged with.

A file of its own because it is a protocol of its own: kernels that hand data over without a barrier
(comm/low_latency.py, comm/sentinel.py, the slots of language/slots.py, language/tagged.py, the fused
ops' epoch-tagged tile flags) wait on the data itself, which carries its own readiness. What every kernel
shares -- peer pointers, the error record, the signal-pad barrier, the descriptor announce,
``block_max`` -- is language/signals.py, which this builds on.

Launch epochs: every launch of such a family advances a per-rank device counter once (``launch_epoch`` /
``end_launch``). Slots and headers are tagged with their launch's epoch (sentinel words are emptied by
their reader instead), so the host resets nothing between calls and captured CUDA graphs replay correctly.

Headers: a barrier-free kernel's program 0 posts ``(epoch << 32) | desc`` into header [phase][rank] of
every peer (``post_header_at``, through bases loaded with the kernel's first loads:
``signals.program0_peer_bases``). The receiving program 0 polls the headers of its phase together with the
data of its first block (``check`` = 1; the other programs pass 0: slots.checks_headers): both loads are
in flight in the same spin, so the check adds no round trip, and a peer that made another call (whose
data may never come) is caught at once and recorded as a mismatch naming both descriptors.

Waits: ``wait_flagged`` (8-byte slots ``(epoch << 32) | data``: data and flag in one store),
``wait_filled`` / ``wait_filled_rows`` (int32 words that are not yet EMPTY). Volatile loads only (they are
"data" polls in flags.SPIN_LOOPS); each bounded by a spin budget and by ``signals.failed_elsewhere``, and
each decides once per program (``wait_state`` / ``end_wait``, through ``signals.block_max``).
"""

import triton
import triton.language as tl

from .. import debug_switches as _debug
from ..memory.layout import MAX_PROGRAMS
from .signals import (KIND_MISMATCH, MAX_WORLD, block_max, failed_elsewhere, first_lane, program0_peer_bases,
                      record_error, record_timeout)

# Diagnostic switch (symmcoll.debug_switches; off by default, and off it generates no code).
DEBUG_NO_HEADERS: tl.constexpr = tl.constexpr(_debug.NO_HEADERS)

# A wait after a poll, as every thread of the program sees it (``wait_state``).
WAIT_DONE: tl.constexpr = tl.constexpr(0)
WAIT_PENDING: tl.constexpr = tl.constexpr(1)
WAIT_MISMATCH: tl.constexpr = tl.constexpr(2)


@triton.jit
def wait_state(data_pending, headers):
    """WAIT_MISMATCH if any thread saw a peer's header name another call, else WAIT_PENDING if any
    thread still waits for data (``data_pending``: this thread's view) or a header, else WAIT_DONE
    (``headers``: this thread's ``header_state``, or 0 for a wait without headers): one value for the
    whole program (``block_max``)."""
    return block_max(tl.maximum(headers, data_pending.to(tl.int32)))


@triton.jit
def post_header_at(header_bases, phase, epoch, desc, rank, WORLD: tl.constexpr):
    """Program 0 stores ``(epoch << 32) | desc`` into header [phase][rank] (int64) of every peer
    (``header_bases`` from ``program0_peer_bases``). Epoch-tagged, so no one ever resets a header."""
    if not DEBUG_NO_HEADERS:
        lanes = tl.arange(0, MAX_WORLD)
        mine = (lanes < WORLD) & (lanes != rank) & (tl.program_id(0) == 0)
        value = (tl.zeros([MAX_WORLD], tl.int64) + epoch) << 32 | (tl.zeros([MAX_WORLD], tl.int64) + desc)
        tl.store(header_bases + phase * MAX_WORLD + rank, value, mask=mine)


@triton.jit
def post_header(header_ptrs_dev, phase, epoch, desc, rank, WORLD: tl.constexpr):
    """``post_header_at`` with the peers' regions loaded here."""
    post_header_at(program0_peer_bases(header_ptrs_dev, rank, WORLD, tl.int64), phase, epoch, desc, rank, WORLD)


# header_state's form by world size: scalar loads up to this many ranks, one vector load above.
SCALAR_HEADERS_UP_TO: tl.constexpr = tl.constexpr(3)


@triton.jit
def _peer_state(header, matching, epoch):
    """WAIT_DONE if ``header`` is this call's, WAIT_PENDING if it is not yet this epoch's, else
    WAIT_MISMATCH (a peer of this epoch that made another call)."""
    late = (header >> 32).to(tl.int32) != epoch
    return tl.where(header == matching, WAIT_DONE, tl.where(late, WAIT_PENDING, WAIT_MISMATCH))


@triton.jit
def header_state(own_headers, check, epoch, desc, rank, WORLD: tl.constexpr):
    """This thread's view of the peers' headers of this epoch: WAIT_MISMATCH if one names another call,
    else WAIT_PENDING if one is not yet this epoch's, else WAIT_DONE (always, when ``check`` is 0).

    Two forms, the cheaper one per world size (issue 24 point 7, sm_90 SASS and one H100):
    - up to SCALAR_HEADERS_UP_TO ranks, one scalar load per peer, each compared in the thread: the
      check adds a compare and a max to the wait's decision (``wait_state``), nothing else
      (world 2: +0.02-0.05 us a launch);
    - above, one [MAX_WORLD] vector load (every peer's header in one instruction, in flight with the
      data's loads) and one max across the lanes (three shuffles). Scalar loads there cost round trips:
      ptxas issues the predicated loads two at a time, each pair after the last one's comparison, so
      world 8 waited three round trips for its seven headers (+0.115 us a launch,
      benchmarks/results/2026-11-27-desc-cost-world8-h100), where the shuffles cost a few dozen cycles."""
    matching = epoch.to(tl.int64) << 32 | desc
    if DEBUG_NO_HEADERS:
        state = tl.full([], WAIT_DONE, tl.int32)
    elif WORLD <= SCALAR_HEADERS_UP_TO:
        state = tl.full([], WAIT_DONE, tl.int32)
        for step in tl.static_range(1, WORLD):  # the peers after me, round the ring: no load of my own lane
            peer = rank + step
            peer = tl.where(peer >= WORLD, peer - WORLD, peer)
            header = tl.load(own_headers + peer, mask=check != 0, other=matching, volatile=True)
            state = tl.maximum(state, _peer_state(header, matching, epoch))
    else:
        lanes = tl.arange(0, MAX_WORLD)
        is_peer = (lanes < WORLD) & (lanes != rank) & (check != 0)
        headers = tl.load(own_headers + lanes, mask=is_peer, other=matching, volatile=True)
        state = tl.max(_peer_state(headers, matching, epoch), axis=0)
    return state


@triton.jit
def header_lanes(own_headers, check, epoch, desc, rank, WORLD: tl.constexpr):
    """(peers whose header is not yet this epoch's, peers whose header names another call, their
    descriptors) as [MAX_WORLD] lanes; nothing when ``check`` is 0. What a failed wait names
    (``end_wait``)."""
    if DEBUG_NO_HEADERS:
        check = check * 0
    lanes = tl.arange(0, MAX_WORLD)
    is_peer = (lanes < WORLD) & (lanes != rank) & (check != 0)
    headers = tl.load(own_headers + lanes, mask=is_peer, other=0, volatile=True)
    current = (headers >> 32).to(tl.int32) == epoch
    theirs = (headers & 0xFFFFFFFF).to(tl.int32)
    return is_peer & ~current, is_peer & current & (theirs != desc), theirs


@triton.jit
def end_wait(state, data_pending, budget, status_ptr, rank, peer, desc, own_headers, check, epoch,
             WORLD: tl.constexpr):
    """After a wait loop, from its last ``wait_state`` (the same in every thread): returns the spins
    left, the same in every thread: at least 1 when the wait ended (its last spin may have found the
    data), else 0 with the failure recorded. The headers are read again to name it: a mismatch if one
    names another call (preferred: it names the cause; a header of this epoch never changes), else a
    timeout naming ``peer`` if data was missing, else the first late header (``peer`` if it came
    since). The names are agreed on through ``block_max`` (a thread that saw nothing holds no name)."""
    if state == WAIT_DONE:
        budget = tl.maximum(budget, 1)
    else:
        lanes = tl.arange(0, MAX_WORLD)
        late, wrong, theirs = header_lanes(own_headers, check, epoch, desc, rank, WORLD)
        other = -block_max(-first_lane(wrong, lanes))
        if other < MAX_WORLD:
            seen = wrong & (lanes == other)
            record_error(status_ptr, KIND_MISMATCH, rank, other, desc,
                         block_max(tl.max(tl.where(seen, theirs, -2147483647), axis=0)))
        else:
            first_late = -block_max(-first_lane(late, lanes))
            data_late = block_max(data_pending.to(tl.int32)) > 0
            named = tl.where(data_late | (first_late >= MAX_WORLD), -block_max(-peer), first_late)
            record_timeout(status_ptr, rank, named, desc)
        budget = budget * 0
    return budget


@triton.jit
def wait_flagged(ptrs, mask, epoch, spin_budget, status_ptr, rank, peer, desc, own_headers, check,
                 WORLD: tl.constexpr):
    """Low-latency protocol wait: poll 8-byte slots ``(epoch << 32) | data`` until every slot under
    ``mask`` carries ``epoch`` in its high half (data and flag arrive in one single-copy-atomic store:
    no fence, no signal), and, if ``check``, until every peer's header of this epoch is here and names
    this call. Volatile loads, bounded by ``spin_budget``.

    Returns (slots, spins left): 0 spins left means the wait gave up (recorded); callers pass it on so
    that later waits of the same program give up at once."""
    ready = epoch.to(tl.int64) << 32
    slots = tl.load(ptrs, mask=mask, other=ready, volatile=True)
    headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
    pending = tl.max(((slots >> 32).to(tl.int32) != epoch).to(tl.int32), axis=0) > 0
    state = wait_state(pending, headers)
    budget = spin_budget
    spins = 0
    while (state == WAIT_PENDING) & (budget > 0):
        slots = tl.load(ptrs, mask=mask, other=ready, volatile=True)
        headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
        pending = tl.max(((slots >> 32).to(tl.int32) != epoch).to(tl.int32), axis=0) > 0
        state = wait_state(pending, headers)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    # Slots are never emptied (epoch-tagged): no barrier is needed after the re-read.
    slots = reread_stale(ptrs, mask & ((slots >> 32).to(tl.int32) != epoch), slots, ready)
    return slots, end_wait(state, pending, budget, status_ptr, rank, peer, desc, own_headers, check, epoch, WORLD)


@triton.jit
def reread_stale(ptrs, stale, values, other):
    """After a wait: a tile smaller than the program's threads is held twice (two warps a word), the
    wait's block-wide reduction decides on one copy and the values used later may come from the other,
    still behind. Where ``stale``, a copy reads once more: the reduction saw the word arrive, so one
    read finds it. Whole tiles predicate this load off."""
    return tl.where(stale, tl.load(ptrs, mask=stale, other=other, volatile=True), values)


@triton.jit
def reread_stale_copies(ptrs, mask, words, EMPTY: tl.constexpr):
    """``reread_stale`` for sentinel words (stale: still EMPTY; seen on an H200 at hidden 64, a peer's
    part summed as -0). The barrier after it: the caller empties the slots next, and a warp that empties
    them before the other copy's read would hand that copy EMPTY again."""
    words = reread_stale(ptrs, mask & (words == EMPTY), words, 0)
    tl.debug_barrier()
    return words


@triton.jit
def wait_filled(ptrs, mask, EMPTY: tl.constexpr, spin_budget, status_ptr, rank, peer, desc, own_headers, epoch,
                check, WORLD: tl.constexpr):
    """Sentinel protocol wait: poll int32 words until none under ``mask`` still holds ``EMPTY``, a
    value senders never write (each aligned 4-byte word lands whole, so a word that is not EMPTY is the
    sender's final value: no flag, no fence), and the headers as ``wait_flagged`` does. Returns
    (words, spins left)."""
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
    pending = tl.max((words == EMPTY).to(tl.int32), axis=0) > 0
    state = wait_state(pending, headers)
    budget = spin_budget
    spins = 0
    while (state == WAIT_PENDING) & (budget > 0):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
        pending = tl.max((words == EMPTY).to(tl.int32), axis=0) > 0
        state = wait_state(pending, headers)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    words = reread_stale_copies(ptrs, mask, words, EMPTY)
    return words, end_wait(state, pending, budget, status_ptr, rank, peer, desc, own_headers, check, epoch, WORLD)


@triton.jit
def _pending_rows(words, words2, EMPTY: tl.constexpr):
    """Per row of a [ROWS, N] tile (and of ``words2``, a second tile of the same rows, unless None):
    whether a word still holds EMPTY."""
    pending = tl.max((words == EMPTY).to(tl.int32), axis=1)
    if words2 is not None:
        pending = tl.maximum(pending, tl.max((words2 == EMPTY).to(tl.int32), axis=1))
    return pending


@triton.jit
def wait_filled_rows(ptrs, mask, rows, EMPTY: tl.constexpr, spin_budget, status_ptr, rank, desc, own_headers,
                     epoch, check, WORLD: tl.constexpr, ptrs2=None, mask2=None, loaded=None, loaded2=None):
    """``wait_filled`` over a [PEERS, BLOCK] tile whose row i comes from peer ``rows[i]``: one poll
    (one block-wide reduction) covers every peer, and the loads of all rows are in flight together.
    On timeout the error record names the first row still pending. With ``ptrs2`` / ``mask2``, a
    second tile of the same rows (a row's scales beside its codes) is polled in the same spins:
    returns (words, words2, spins left), else (words, spins left). ``loaded`` / ``loaded2``: the
    first poll's words, read by the caller earlier (volatile loads of ``ptrs`` / ``ptrs2`` under
    their masks, ``other=0``), so that their round trip overlaps the caller's other work; a word
    that is not EMPTY is final whenever it was read (``wait_filled``)."""
    if loaded is None:
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    else:
        words = loaded
    words2 = ptrs2
    if ptrs2 is not None:
        if loaded2 is None:
            words2 = tl.load(ptrs2, mask=mask2, other=0, volatile=True)
        else:
            words2 = loaded2
    headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
    pending = _pending_rows(words, words2, EMPTY)
    state = wait_state(tl.max(pending, axis=0) > 0, headers)
    budget = spin_budget
    spins = 0
    while (state == WAIT_PENDING) & (budget > 0):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        if ptrs2 is not None:
            words2 = tl.load(ptrs2, mask=mask2, other=0, volatile=True)
        headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
        pending = _pending_rows(words, words2, EMPTY)
        state = wait_state(tl.max(pending, axis=0) > 0, headers)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    if ptrs2 is not None:
        words2 = reread_stale(ptrs2, mask2 & (words2 == EMPTY), words2, 0)  # (the barrier: in the next line's)
    words = reread_stale_copies(ptrs, mask, words, EMPTY)
    first = tl.min(tl.where(pending > 0, rows, MAX_WORLD), axis=0)
    budget = end_wait(state, tl.max(pending, axis=0) > 0, budget, status_ptr, rank, first, desc, own_headers, check,
                      epoch, WORLD)
    if ptrs2 is not None:
        return words, words2, budget
    else:
        return words, budget


# ---- Launch epochs: a per-rank device counter that every launch of a family advances once ----------

# Entries of a launch-epoch table (``EPOCH_SLOTS`` int32 per rank): one per possible program id.
EPOCH_SLOTS: tl.constexpr = tl.constexpr(MAX_PROGRAMS)


@triton.jit
def launch_epoch(state_ptr):
    """This launch's epoch, the same for every program: 1 + entry ``pid`` of the table at
    ``state_ptr`` (``EPOCH_SLOTS`` int32 per rank, device memory). ``end_launch`` advances *every*
    entry once per launch, whatever the grid, so all entries always agree: a launch config that
    changes between calls hands a slot to a different program, and that program still sees the same
    epoch (per-program counters advanced only by their own program would disagree)."""
    return tl.load(state_ptr + tl.program_id(0)) + 1


@triton.jit
def end_launch(state_ptr, epoch):
    """Called by every program last: program ``pid`` of P stores ``epoch`` into entries pid, pid + P,
    pid + 2P, ..., so each entry is written once per launch. No program reads an entry another program
    of the same launch writes (program q reads entry q, written only by program q), and the next launch
    sees every store (kernel boundary): plain stores, no atomic and no fence, which would wait for this
    program's outstanding NVLink stores."""
    entries = tl.program_id(0) + tl.num_programs(0) * tl.arange(0, EPOCH_SLOTS)
    tl.store(state_ptr + entries, tl.zeros([EPOCH_SLOTS], tl.int32) + epoch, mask=entries < EPOCH_SLOTS)
