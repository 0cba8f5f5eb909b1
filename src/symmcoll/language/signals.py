"""Signals, barriers and the error record: the synchronisation every symmcoll kernel is built from.

What the barrier-free kernels wait with instead of a barrier (polls on the data itself, epoch-tagged
call headers, launch epochs) is language/polls.py: one protocol of its own, built on the helpers here.

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
together with their first data (polls.py), and every kernel's program 0 *announces* its descriptor into
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
from ..memory.layout import STATUS_DEADLINE_WORD, STATUS_SPINS_WORD
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
def first_lane(flags, lanes):
    """The lowest lane where ``flags`` holds (MAX_WORLD if none): the peer a failure names."""
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
        record_timeout(status_ptr, rank, first_lane(pending, lanes), desc)
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
        peer = first_lane(wrong, lanes)
        record_error(status_ptr, KIND_MISMATCH, rank, peer, desc, tl.sum(tl.where(lanes == peer, other, 0), axis=0))
    if tl.max(pending.to(tl.int32), axis=0) > 0:
        record_timeout(status_ptr, rank, first_lane(pending, lanes), desc)
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
