"""Device-side building blocks shared by every symmcoll kernel.

Calling convention (mirrors torch's ``_SymmetricMemory``): a kernel receives ``buffer_ptrs_dev`` and
``signal_pad_ptrs_dev``, the int64 addresses of two tables holding one 64-bit address per rank.
``peer_ptr`` turns an entry into a typed pointer.

Signals live in int32 signal pads, one slot per (program id, sending rank)::

    slot(pid, src) = pid * WORLD + src        # in the *receiver's* pad

and are self-resetting: a send is a CAS 0 -> 1 with release semantics at system scope (retried while
the receiver has not yet consumed the previous signal in that slot), a wait is a CAS 1 -> 0 with acquire
semantics at system scope. Nothing on the host changes between calls, so a captured CUDA graph replays
correctly, and every slot is 0 again after each completed barrier (tests check this).

``block_barrier`` -- usage patterns:
  * after writing my own buffer, before peers read it (producer -> consumer hand-off: release/acquire);
  * after reading peers' buffers, before anybody overwrites them (the exit barrier of one call, which
    makes the next call's writes safe).
Program ``pid`` of a rank only ever waits on program ``pid`` of its peers, never on a sibling program of
its own rank: this keeps the interpreter (which runs programs one after another) from deadlocking and
the GPU from depending on all programs being co-resident.

The signals to all peers go out in parallel (one lane per peer), and so do the waits. Every wait is
bounded by ``max_spins`` iterations; on expiry the program records (op, rank, peer) into the error
record at ``status_ptr`` and stops waiting; the host turns that into ``SymmcollTimeoutError``.

Only ``tl.*`` operations are used, so the same source runs compiled for sm_90 and under
``TRITON_INTERPRET=1``. Spins are on atomics only (never on a plain load).
"""

import triton
import triton.language as tl

from ..memory import MAX_PROGRAMS

# Lanes of the per-peer vectors. World sizes up to MAX_WORLD are supported by every kernel.
MAX_WORLD: tl.constexpr = tl.constexpr(8)

# Layout of the error record (int32[4]) a kernel fills in when a wait times out.
STATUS_FLAG: tl.constexpr = tl.constexpr(0)
STATUS_OP: tl.constexpr = tl.constexpr(1)
STATUS_RANK: tl.constexpr = tl.constexpr(2)
STATUS_PEER: tl.constexpr = tl.constexpr(3)


@triton.jit
def peer_ptr(ptrs_dev, peer, ELEM_TY: tl.constexpr):
    """Typed pointer to ``peer``'s buffer, read from the per-rank address table at ``ptrs_dev``.

    Symmetric regions start page-aligned: the hint lets the compiler use 16-byte accesses."""
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    return tl.multiple_of(tl.load(table + peer).to(tl.pointer_type(ELEM_TY)), 16)


@triton.jit
def record_timeout(status_ptr, rank, peer, op_code):
    """Write (op, rank, peer) into the error record unless a wait already gave up: the first timeout
    names the cause (later ones, in the same or other programs, are its consequences). The host reads
    the record only after the kernel has finished."""
    status = status_ptr.to(tl.pointer_type(tl.int32))
    if tl.atomic_cas(status + STATUS_FLAG, 0, 1, sem="acq_rel", scope="sys") == 0:
        tl.store(status + STATUS_OP, op_code)
        tl.store(status + STATUS_RANK, rank)
        tl.store(status + STATUS_PEER, peer)


@triton.jit
def _record_timeout(status_ptr, pending, lanes, rank, op_code):
    """Record the first peer still pending."""
    peer = tl.min(tl.where(pending, lanes, MAX_WORLD), axis=0)
    record_timeout(status_ptr, rank, peer, op_code)


@triton.jit
def wait_flagged(ptrs, mask, epoch, spin_budget, status_ptr, rank, peer, op_code):
    """Low-latency protocol wait: poll 8-byte slots ``(epoch << 32) | data`` until every slot under
    ``mask`` carries ``epoch`` in its high half; data and flag arrive in one single-copy-atomic store,
    so no fence or signal is needed. Volatile loads (never cached), bounded by ``spin_budget``.

    Returns (slots, spins left): 0 spins left means the wait gave up (the error record names
    ``peer``); callers pass it on so that later waits of the same program give up at once.
    """
    ready = epoch.to(tl.int64) << 32
    slots = tl.load(ptrs, mask=mask, other=ready, volatile=True)
    budget = spin_budget
    while (tl.max(((slots >> 32).to(tl.int32) != epoch).to(tl.int32), axis=0) > 0) & (budget > 0):
        slots = tl.load(ptrs, mask=mask, other=ready, volatile=True)
        budget -= 1
    if tl.max(((slots >> 32).to(tl.int32) != epoch).to(tl.int32), axis=0) > 0:
        record_timeout(status_ptr, rank, peer, op_code)
        budget = budget * 0
    return slots, budget


@triton.jit
def wait_filled(ptrs, mask, EMPTY: tl.constexpr, spin_budget, status_ptr, rank, peer, op_code):
    """Sentinel protocol wait: poll int32 words until none under ``mask`` still holds ``EMPTY``, a
    value senders never write. Each aligned 4-byte word lands whole (single-copy atomic), so a word that
    is not ``EMPTY`` is the sender's final value: no flag, no fence. Volatile loads, bounded by
    ``spin_budget``; returns (words, spins left) like ``wait_flagged``.
    """
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    budget = spin_budget
    while (tl.max((words == EMPTY).to(tl.int32), axis=0) > 0) & (budget > 0):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        budget -= 1
    if tl.max((words == EMPTY).to(tl.int32), axis=0) > 0:
        record_timeout(status_ptr, rank, peer, op_code)
        budget = budget * 0
    return words, budget


@triton.jit
def wait_filled_rows(ptrs, mask, rows, EMPTY: tl.constexpr, spin_budget, status_ptr, rank, op_code):
    """``wait_filled`` over a [PEERS, BLOCK] tile whose row i comes from peer ``rows[i]``: one poll
    (one block-wide reduction) covers every peer, and the loads of all rows are in flight together.
    On timeout the error record names the first row still pending."""
    words = tl.load(ptrs, mask=mask, other=0, volatile=True)
    pending = tl.max((words == EMPTY).to(tl.int32), axis=1)
    budget = spin_budget
    while (tl.max(pending, axis=0) > 0) & (budget > 0):
        words = tl.load(ptrs, mask=mask, other=0, volatile=True)
        pending = tl.max((words == EMPTY).to(tl.int32), axis=1)
        budget -= 1
    if tl.max(pending, axis=0) > 0:
        record_timeout(status_ptr, rank, tl.min(tl.where(pending > 0, rows, MAX_WORLD), axis=0), op_code)
        budget = budget * 0
    return words, budget


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
def send_signals(signal_pad_ptrs_dev, is_peer, rank, status_ptr, max_spins, op_code,
                 WORLD: tl.constexpr):
    """Set slot (pid, rank) to 1 in every peer's pad where ``is_peer``; release, system scope.

    Returns the lanes whose send did not go through before ``max_spins`` (all False on success).
    """
    pid = tl.program_id(0)
    lanes = tl.arange(0, MAX_WORLD)
    ptrs = _peer_slots(signal_pad_ptrs_dev, pid * WORLD + rank, is_peer, rank)
    pending = is_peer
    spins = 0
    while (tl.max(pending.to(tl.int32), axis=0) > 0) & (spins < max_spins):
        # A lane already delivered compares against -1, which no slot ever holds: a no-op.
        expected = tl.where(pending, 0, -1)
        old = tl.atomic_cas(ptrs, expected, tl.full([MAX_WORLD], 1, tl.int32),
                            sem="release", scope="sys")
        pending = pending & (old != 0)
        spins += 1
    if tl.max(pending.to(tl.int32), axis=0) > 0:
        _record_timeout(status_ptr, pending, lanes, rank, op_code)
    return pending


@triton.jit
def wait_signals(signal_pad_ptrs_dev, is_peer, rank, status_ptr, max_spins, op_code,
                 WORLD: tl.constexpr):
    """Consume slot (pid, src) of my own pad for every ``src`` lane where ``is_peer``; acquire,
    system scope. Returns the lanes that never arrived (all False on success)."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, MAX_WORLD)
    table = signal_pad_ptrs_dev.to(tl.pointer_type(tl.uint64))
    own = tl.load(table + rank).to(tl.pointer_type(tl.int32))
    # Non-peer lanes look at slot 0 of my pad with an impossible comparand (-1): never written.
    ptrs = own + tl.where(is_peer, pid * WORLD + lanes, 0)
    pending = is_peer
    spins = 0
    while (tl.max(pending.to(tl.int32), axis=0) > 0) & (spins < max_spins):
        expected = tl.where(pending, 1, -1)
        old = tl.atomic_cas(ptrs, expected, tl.zeros([MAX_WORLD], tl.int32),
                            sem="acquire", scope="sys")
        pending = pending & (old != 1)
        spins += 1
    if tl.max(pending.to(tl.int32), axis=0) > 0:
        _record_timeout(status_ptr, pending, lanes, rank, op_code)
    return pending


@triton.jit
def block_barrier(signal_pad_ptrs_dev, rank, status_ptr, max_spins, op_code,
                  WORLD: tl.constexpr):
    """All-to-all barrier between program ``pid`` of every rank.

    Graph-safe (self-resetting slots, no host state). Writes this block made before the call are
    visible to every peer's program ``pid`` after its barrier returns, and vice versa. Returns 1 if
    this program gave up waiting (the error record is then filled in), else 0.
    """
    lanes = tl.arange(0, MAX_WORLD)
    is_peer = (lanes < WORLD) & (lanes != rank)
    # Every thread's prior writes must be done before any lane releases them.
    tl.debug_barrier()
    sent_late = send_signals(signal_pad_ptrs_dev, is_peer, rank, status_ptr, max_spins, op_code,
                             WORLD)
    missing = wait_signals(signal_pad_ptrs_dev, is_peer, rank, status_ptr, max_spins, op_code,
                           WORLD)
    # The acquiring lanes' view must reach every thread that reads peers' data next.
    tl.debug_barrier()
    failed = tl.max((sent_late | missing).to(tl.int32), axis=0)
    return failed
