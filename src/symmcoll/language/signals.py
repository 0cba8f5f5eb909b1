"""Signals, barriers and bounded waits: the synchronisation every symmcoll kernel is built from.

Calling convention (mirrors torch's ``_SymmetricMemory``): a kernel receives ``*_ptrs_dev``, the int64
address of a table holding one 64-bit address per rank; ``peer_ptr`` turns an entry into a typed pointer.

Signal pad layout (int32 per rank, ``memory.SIGNAL_PAD_INTS``)::

    [0, MAX_PROGRAMS * MAX_WORLD)      barrier slots: slot(pid, src) = pid * WORLD + src, in the *receiver's* pad
    ANNOUNCE_SLOT + src                 the call descriptor ``src`` last announced (diagnostics only)

Every signal carries the sender's *call descriptor* (``desc``: a nonzero int32 naming the op, algorithm,
dtype, reduce op, root and a fingerprint of the size, built by ``symmcoll.plan``). A send is a CAS
0 -> desc with release semantics at system scope (retried while the receiver has not yet consumed the
previous signal in that slot); a wait is a CAS desc -> 0 with acquire semantics at system scope. A slot
that holds another nonzero value is a peer that made a *different call*: the wait stops and records a
mismatch naming the peer and both descriptors. Slots are 0 again after every completed barrier, and
nothing on the host changes between calls, so captured CUDA graphs replay correctly.

Barrier-free kernels (no signals) check descriptors through epoch-tagged headers instead, polled
together with their first data (``post_header_at``, the waits' ``check``), and every kernel's program 0 *announces* its descriptor into
every peer's pad, so that a rank that timed out waiting for a peer busy with another kind of call can
name what that peer called (``symmcoll.memory`` reads it when it raises).

Rules: program ``pid`` of a rank waits only on program ``pid`` of its peers (never on a sibling program
of its own rank), which keeps the interpreter (programs run one after another) from deadlocking and the
GPU from depending on co-residency. Every wait is bounded by ``max_spins``; on expiry the program records
(kind, rank, peer, descriptors) in the error record at ``status_ptr`` (first writer wins) and stops.
Waits also give up early once another program of the same rank has recorded an error (they look at the
record every ``ABORT_CHECK_SPINS`` spins), so one failure ends a launch quickly. Spins are on atomics
or volatile loads only, never on a plain load.
"""

import triton
import triton.language as tl

from .. import debug_switches as _debug
from ..memory.layout import ANNOUNCE_SLOT as _ANNOUNCE_SLOT
from ..memory.layout import MAX_PROGRAMS, STATUS_DEADLINE_WORD, STATUS_SPINS_WORD
from .blocks import INTERPRETED

# Lanes of the per-peer vectors. World sizes up to MAX_WORLD are supported by every kernel.
MAX_WORLD: tl.constexpr = tl.constexpr(8)
ANNOUNCE_SLOT: tl.constexpr = tl.constexpr(_ANNOUNCE_SLOT)

# Layout of the error record (int32[8], host-visible) a kernel fills in when a wait fails.
STATUS_FLAG: tl.constexpr = tl.constexpr(0)
STATUS_KIND: tl.constexpr = tl.constexpr(1)
STATUS_RANK: tl.constexpr = tl.constexpr(2)
STATUS_PEER: tl.constexpr = tl.constexpr(3)
STATUS_DESC: tl.constexpr = tl.constexpr(4)
STATUS_PEER_DESC: tl.constexpr = tl.constexpr(5)
KIND_TIMEOUT: tl.constexpr = tl.constexpr(1)
KIND_MISMATCH: tl.constexpr = tl.constexpr(2)
# Argument reports (words 8..13 of the record): a call whose input the kernel found wrong (device-side
# splits or routing that cannot be right, an output bound too small). The protocol still completed, so
# they do not break the workspace: the host raises each new report once (SymmcollArgumentError naming
# the argument). Word 8 counts reports (the host remembers how many it raised), 9..13 describe the last.
STATUS_REPORTS: tl.constexpr = tl.constexpr(8)
ARG_MAX_ROWS: tl.constexpr = tl.constexpr(1)
ARG_SPLITS: tl.constexpr = tl.constexpr(2)
ARG_TOPK_IDS: tl.constexpr = tl.constexpr(3)
# A spinning wait looks at this rank's error record once per this many spins. On a GPU the record is
# pinned host memory: each look is a read across PCIe, and looks from many programs of a launch were
# served one after another (~3.5 us each). Every 64 spins (~30 us), a rank whose peer was late once paid
# programs x 3.5 us per launch, which made it late for the next launch in turn: on 4 H100s the
# barrier-free all-reduces ran 25-400x slow at 64 KB-1 MB (benchmarks/multi_gpu_regression.md). Every
# 65536 spins (~30 ms) a failure still ends the other waits of its rank promptly, and a wait only looks
# when its peer is far later than any launch skew (NCCL looks at its host abort flag as rarely). The
# interpreter keeps 64: a spin costs milliseconds there.
ABORT_CHECK_SPINS: tl.constexpr = tl.constexpr(_debug.ABORT_CHECK_SPINS or (64 if INTERPRETED else 1 << 16))
# Diagnostic switches (symmcoll.debug_switches; all off by default, and off they generate no code).
DEBUG_NO_ABORT_CHECK: tl.constexpr = tl.constexpr(_debug.NO_ABORT_CHECK)
DEBUG_NO_HEADERS: tl.constexpr = tl.constexpr(_debug.NO_HEADERS)
DEBUG_NO_ANNOUNCE: tl.constexpr = tl.constexpr(_debug.NO_ANNOUNCE)
# Under the interpreter a spin's cost varies too much (1-10 ms) for a spin count to stand for seconds:
# waits count their spins in the record and the launcher's watchdog sets the deadline word once this
# launch's waits have spun for SYMMCOLL_TIMEOUT_S (of CPU time); every wait gives up when it is set.
STATUS_SPINS: tl.constexpr = tl.constexpr(STATUS_SPINS_WORD)
STATUS_DEADLINE: tl.constexpr = tl.constexpr(STATUS_DEADLINE_WORD)


@triton.jit
def peer_ptr(ptrs_dev, peer, ELEM_TY: tl.constexpr):
    """Typed pointer to ``peer``'s region, read from the per-rank address table at ``ptrs_dev``.

    Symmetric regions start page-aligned: the hint lets the compiler use 16-byte accesses."""
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    return tl.multiple_of(tl.load(table + peer).to(tl.pointer_type(ELEM_TY)), 16)


@triton.jit
def peer_rows(ptrs_dev, rows, is_peer, ELEM_TY: tl.constexpr):
    """[PEERS, 1] typed pointers for a [PEERS, BLOCK] tile whose row i is rank ``rows[i]``'s region
    (rows that are not peers point at entry 0 of the table; callers mask them off)."""
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    bases = tl.load(table + tl.where(is_peer, rows, 0))
    return tl.multiple_of(bases.to(tl.pointer_type(ELEM_TY)), 16)[:, None]


@triton.jit
def record_error(status_ptr, kind, rank, peer, desc, peer_desc):
    """Write (kind, rank, peer, descriptors) into the error record unless something was recorded
    already: the first failure names the cause (later ones are its consequences). The host reads the
    record only after the kernel has finished."""
    status = status_ptr.to(tl.pointer_type(tl.int32))
    if tl.atomic_cas(status + STATUS_FLAG, 0, 1, sem="acq_rel", scope="sys") == 0:
        tl.store(status + STATUS_KIND, kind)
        tl.store(status + STATUS_RANK, rank)
        tl.store(status + STATUS_PEER, peer)
        tl.store(status + STATUS_DESC, desc)
        tl.store(status + STATUS_PEER_DESC, peer_desc)


@triton.jit
def record_timeout(status_ptr, rank, peer, desc):
    record_error(status_ptr, KIND_TIMEOUT, rank, peer, desc, 0)


@triton.jit
def record_argument(status_ptr, argument, value, limit, rank, desc):
    """Report that ``argument`` (ARG_*) held ``value`` where ``limit`` bounds it (e.g. rows received
    against max_rows). Fields first, then the count (release): a host that sees the count sees them."""
    status = status_ptr.to(tl.pointer_type(tl.int32))
    tl.store(status + STATUS_REPORTS + 1, argument)
    tl.store(status + STATUS_REPORTS + 2, value)  # stores narrow to the record's int32
    tl.store(status + STATUS_REPORTS + 3, limit)
    tl.store(status + STATUS_REPORTS + 4, rank)
    tl.store(status + STATUS_REPORTS + 5, desc)
    tl.atomic_add(status + STATUS_REPORTS, 1, sem="release", scope="sys")


@triton.jit
def failed_elsewhere(status_ptr, spins):
    """Every ABORT_CHECK_SPINS spins: has a program of this rank recorded an error? (volatile read
    of the host-visible record; between checks, and at spin 0, answers no without reading). Under the
    interpreter every spin also counts itself and asks whether this launch's waits have used up
    SYMMCOLL_TIMEOUT_S (a spin costs milliseconds there: the check is free)."""
    status = status_ptr.to(tl.pointer_type(tl.int32))
    flag = 0
    if not DEBUG_NO_ABORT_CHECK:
        if spins % ABORT_CHECK_SPINS == ABORT_CHECK_SPINS - 1:
            # Each thread reads the record itself: one answer for all (block_max), or the budgets of one
            # wait would differ between warps.
            flag = block_max(tl.load(status + STATUS_FLAG, volatile=True))
    if INTERPRETED:
        tl.atomic_add(status + STATUS_SPINS, 1)
        flag = flag | tl.load(status + STATUS_DEADLINE, volatile=True)
    return flag != 0


@triton.jit
def program0_peer_bases(ptrs_dev, rank, WORLD: tl.constexpr, ELEM_TY: tl.constexpr):
    """[MAX_WORLD] typed pointers to every peer's region from the address table at ``ptrs_dev``, loaded
    by program 0 only (the lanes of other programs and of non-peers are masked off, 0): what
    ``announce_at`` / ``post_header_at`` store through. A load, no branch: a kernel can issue it with
    its other address loads and store through the result later, so that the stores never hold up a
    load behind them (a store waits for its address; every instruction after it waits for the store)."""
    lanes = tl.arange(0, MAX_WORLD)
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    mine = (lanes < WORLD) & (lanes != rank) & (tl.program_id(0) == 0)
    return tl.load(table + lanes, mask=mine, other=0).to(tl.pointer_type(ELEM_TY))


@triton.jit
def announce_at(pad_bases, desc, rank, WORLD: tl.constexpr):
    """Program 0 stores this call's descriptor into ANNOUNCE_SLOT + rank of every peer's pad (``pad_bases``
    from ``program0_peer_bases``; fire and forget: read only by the host of a rank that timed out, to say
    what we called)."""
    if not DEBUG_NO_ANNOUNCE:
        lanes = tl.arange(0, MAX_WORLD)
        mine = (lanes < WORLD) & (lanes != rank) & (tl.program_id(0) == 0)
        tl.store(pad_bases + ANNOUNCE_SLOT + rank, tl.zeros([MAX_WORLD], tl.int32) + desc, mask=mine)


@triton.jit
def announce(signal_pad_ptrs_dev, desc, rank, WORLD: tl.constexpr):
    """``announce_at`` with the peers' pads loaded here (barrier kernels)."""
    announce_at(program0_peer_bases(signal_pad_ptrs_dev, rank, WORLD, tl.int32), desc, rank, WORLD)


@triton.jit
def _first_lane(flags, lanes):
    return tl.min(tl.where(flags, lanes, MAX_WORLD), axis=0)


# A tensor this long covers every thread of a program (up to 32 warps): a reduction over it goes
# through every warp, and every thread reads the one result back.
BLOCK_LANES: tl.constexpr = tl.constexpr(1024)


@triton.jit
def block_max(x):
    """The max of int32 scalar ``x`` over every thread of the program, the same in all of them.

    Why: a tensor smaller than the program's threads is held several times (lane groups and warps
    each hold a copy, and each copy loads for itself), and a reduction over such a tensor stays inside
    each copy. A poll of it with volatile loads can therefore end in one warp and go on in another.
    The warps of a wait that disagree run the barriers of the reductions inside the loop out of step
    with each other, and shared memory (layout conversions, reductions) is then read while another
    warp writes it: on an H100 the [8] header poll of the two-shot's [2, 512] tile let rank 1's own
    words at shard positions 1-2 come back as 0 (issue 24). Every wait decides through this: its loop
    condition (``wait_state``), its outcome (``end_wait``) and its look at the error record
    (``failed_elsewhere``)."""
    return tl.max(tl.zeros([BLOCK_LANES], tl.int32) + x, axis=0)


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
def _peer_slots(signal_pad_ptrs_dev, slot, is_peer, rank):
    """Pointers to ``slot`` in every peer's pad. Non-peer lanes point at slot 0 of my own pad; the
    callers give those lanes a comparand no slot ever holds (-1), so their CAS never writes."""
    lanes = tl.arange(0, MAX_WORLD)
    table = signal_pad_ptrs_dev.to(tl.pointer_type(tl.uint64))
    own = tl.load(table + rank).to(tl.int64)
    bases = tl.load(table + lanes, mask=is_peer, other=0).to(tl.int64)
    bases = tl.where(is_peer, bases, own)
    offsets = tl.where(is_peer, slot, 0).to(tl.int64) * 4
    return (bases + offsets).to(tl.pointer_type(tl.int32))


@triton.jit
def send_signals(signal_pad_ptrs_dev, is_peer, rank, desc, status_ptr, max_spins, WORLD: tl.constexpr):
    """Set slot (pid, rank) to ``desc`` in every peer's pad where ``is_peer``; release, system scope.

    Returns the lanes whose send did not go through (all False on success)."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, MAX_WORLD)
    ptrs = _peer_slots(signal_pad_ptrs_dev, pid * WORLD + rank, is_peer, rank)
    pending = is_peer
    spins = 0
    while (tl.max(pending.to(tl.int32), axis=0) > 0) & (spins < max_spins):
        # A lane already delivered compares against -1, which no slot ever holds: a no-op.
        expected = tl.where(pending, 0, -1)
        old = tl.atomic_cas(ptrs, expected, tl.zeros([MAX_WORLD], tl.int32) + desc,
                            sem="release", scope="sys")
        pending = pending & (old != 0)
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            spins = max_spins
    if tl.max(pending.to(tl.int32), axis=0) > 0:
        record_timeout(status_ptr, rank, _first_lane(pending, lanes), desc)
    return pending


@triton.jit
def wait_signals(signal_pad_ptrs_dev, is_peer, rank, desc, status_ptr, max_spins, WORLD: tl.constexpr):
    """Consume slot (pid, src) of my own pad for every ``src`` lane where ``is_peer``; acquire, system
    scope. A slot holding another descriptor is a mismatched call (recorded, not consumed). Returns the
    lanes that failed (all False on success)."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, MAX_WORLD)
    table = signal_pad_ptrs_dev.to(tl.pointer_type(tl.uint64))
    own = tl.load(table + rank).to(tl.pointer_type(tl.int32))
    # Non-peer lanes look at slot 0 of my pad with an impossible comparand (-1): never written.
    ptrs = own + tl.where(is_peer, pid * WORLD + lanes, 0)
    pending = is_peer
    wrong = lanes < 0
    other = tl.zeros([MAX_WORLD], tl.int32)
    spins = 0
    while (tl.max(pending.to(tl.int32), axis=0) > 0) & (spins < max_spins):
        expected = tl.where(pending, desc, -1)
        old = tl.atomic_cas(ptrs, expected, tl.zeros([MAX_WORLD], tl.int32), sem="acquire", scope="sys")
        mismatch = pending & (old != desc) & (old != 0)
        wrong = wrong | mismatch
        other = tl.where(mismatch, old, other)
        pending = pending & (old == 0)
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            spins = max_spins
    if tl.max(wrong.to(tl.int32), axis=0) > 0:
        peer = _first_lane(wrong, lanes)
        record_error(status_ptr, KIND_MISMATCH, rank, peer, desc, tl.sum(tl.where(lanes == peer, other, 0), axis=0))
    if tl.max(pending.to(tl.int32), axis=0) > 0:
        record_timeout(status_ptr, rank, _first_lane(pending, lanes), desc)
    return pending | wrong


@triton.jit
def block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD: tl.constexpr):
    """All-to-all barrier between program ``pid`` of every rank, carrying the call descriptor.

    Graph-safe (self-resetting slots, no host state). Writes this block made before the call are
    visible to every peer's program ``pid`` after its barrier returns, and vice versa. Returns 1 if
    this program gave up (timeout, mismatched call, or an earlier failure of this rank), else 0.
    """
    lanes = tl.arange(0, MAX_WORLD)
    is_peer = (lanes < WORLD) & (lanes != rank)
    # Every thread's prior writes must be done before any lane releases them.
    tl.debug_barrier()
    sent_late = send_signals(signal_pad_ptrs_dev, is_peer, rank, desc, status_ptr, max_spins, WORLD)
    missing = wait_signals(signal_pad_ptrs_dev, is_peer, rank, desc, status_ptr, max_spins, WORLD)
    # The acquiring lanes' view must reach every thread that reads peers' data next.
    tl.debug_barrier()
    return tl.max((sent_late | missing).to(tl.int32), axis=0)


# ---- Barrier-free protocols: polls on the data itself, and epoch-tagged descriptor headers --------
#
# A barrier-free kernel's program 0 posts ``(epoch << 32) | desc`` into header [phase][rank] of every
# peer (``post_header_at``, through bases loaded with the kernel's first loads: ``program0_peer_bases``).
# The receiving program 0 polls the headers of its phase together with the data of its first block
# (``check`` = 1; the other programs pass 0: slots.checks_headers): both loads are in flight in the same
# spin, so the check adds no round trip, and a peer that made another call (whose data may never come)
# is caught at once.

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
        other = -block_max(-_first_lane(wrong, lanes))
        if other < MAX_WORLD:
            seen = wrong & (lanes == other)
            record_error(status_ptr, KIND_MISMATCH, rank, other, desc,
                         block_max(tl.max(tl.where(seen, theirs, -2147483647), axis=0)))
        else:
            first_late = -block_max(-_first_lane(late, lanes))
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
def wait_filled_rows(ptrs, mask, rows, EMPTY: tl.constexpr, spin_budget, status_ptr, rank, desc, own_headers,
                     epoch, check, WORLD: tl.constexpr):
    """``wait_filled`` over a [PEERS, BLOCK] tile whose row i comes from peer ``rows[i]``: one poll
    (one block-wide reduction) covers every peer, and the loads of all rows are in flight together.
    On timeout the error record names the first row still pending."""
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
    pending = tl.max((words == EMPTY).to(tl.int32), axis=1)
    state = wait_state(tl.max(pending, axis=0) > 0, headers)
    budget = spin_budget
    spins = 0
    while (state == WAIT_PENDING) & (budget > 0):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        headers = header_state(own_headers, check, epoch, desc, rank, WORLD)
        pending = tl.max((words == EMPTY).to(tl.int32), axis=1)
        state = wait_state(tl.max(pending, axis=0) > 0, headers)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    words = reread_stale_copies(ptrs, mask, words, EMPTY)
    first = tl.min(tl.where(pending > 0, rows, MAX_WORLD), axis=0)
    return words, end_wait(state, tl.max(pending, axis=0) > 0, budget, status_ptr, rank, first, desc, own_headers,
                           check, epoch, WORLD)


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
