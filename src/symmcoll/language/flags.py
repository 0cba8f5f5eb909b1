"""Flags that guard data: the one pair of primitives every kernel hands data over with.

``release_flag(flag_ptr, value, SCOPE)``
    The writer has stored the data (any threads of its block, to any memory). Every thread's stores are
    issued first (``tl.debug_barrier``), then the flag is exchanged with *release* semantics at ``SCOPE``:
    a reader that sees the flag with acquire semantics sees the data.

``acquire_flag(flag_ptr, ready, budget, status_ptr, rank, peer, desc, SCOPE)``
    The reader polls the flag with *acquire* semantics (a CAS that writes back what it finds: triton
    3.6 has no atomic load) until it holds ``ready``, bounded by ``budget`` spins, and then synchronises
    its block, so every thread that reads the data next sees it. An int64 flag holding
    ``(epoch << 32) | desc`` of this epoch but another descriptor is a peer that made a different call
    (recorded as a mismatch); an int32 flag holds an epoch alone.

``SCOPE``: "sys" (the default) for a flag in or from a peer's memory, "gpu" for one only programs of
this GPU write and read (e.g. producer and consumer programs of one kernel). Both wait the same way on
CPU, where the interpreter ignores scopes and runs programs in order.

Every other loop in symmcoll's kernels that spins on memory is in ``SPIN_LOOPS`` with the reason it
needs no acquire; tests/test_memory_order.py walks the source of every kernel and fails on a spin loop
that is neither this pair's nor listed, or that does not do what its entry says.
"""

import triton
import triton.language as tl

from .signals import KIND_MISMATCH, failed_elsewhere, record_error, record_timeout

# Every function of symmcoll that spins on memory: "acquire" (polls with acquire semantics: what it
# guards is visible afterwards), "release" (retries a release CAS until a slot is free), "data" (polls
# the data itself: each word or 8-byte slot lands whole and carries its own readiness, so nothing else
# is guarded; volatile loads suffice).
SPIN_LOOPS = {
    "symmcoll.language.flags.acquire_flag": "acquire",
    "symmcoll.language.signals.wait_signals": "acquire",      # barrier slots: CAS desc -> 0
    "symmcoll.language.transport.wait_signal": "acquire",     # a transport put-with-signal's signal
    "symmcoll.language.signals.send_signals": "release",      # barrier slots: CAS 0 -> desc
    "symmcoll.language.polls.wait_flagged": "data",           # LL: the epoch and the data in one store
    "symmcoll.language.polls.wait_filled": "data",            # sentinel words: not EMPTY means the data
    "symmcoll.language.polls.wait_filled_rows": "data",
    "symmcoll.language.tagged.wait_counts": "data",           # (epoch << 32) | count in one store
    "symmcoll.language.tagged.wait_escaped": "data",          # sentinel words and their escape masks
    # a GEMM tile in two parts (one kernel, one GPU; pair_reduce, exchange_halves): the tile's counter, bumped with
    # release after the partner's partial (or half) is stored, polled with acquire (atomic_add(0)) before it is loaded
    "symmcoll.fused.gemm_split.wait_counter": "acquire",
}


@triton.jit
def release_flag(flag_ptr, value, SCOPE: tl.constexpr = "sys"):
    """Publish the data this block stored: every thread's stores first, then ``value`` into the flag
    (release, ``SCOPE``)."""
    tl.debug_barrier()
    tl.atomic_xchg(flag_ptr, value, sem="release", scope=SCOPE)


@triton.jit
def _other_call(seen, ready, TAGGED: tl.constexpr):
    """Whether a tagged flag holds this epoch with another descriptor (a peer made a different call);
    never for an untagged one."""
    if TAGGED:
        return ((seen >> 32) == (ready >> 32)) & (seen != ready)
    else:
        return seen != seen


@triton.jit
def _their_descriptor(seen, TAGGED: tl.constexpr):
    if TAGGED:
        return (seen & 0xFFFFFFFF).to(tl.int32)
    else:
        return 0


@triton.jit
def acquire_flag(flag_ptr, ready, budget, status_ptr, rank, peer, desc, SCOPE: tl.constexpr = "sys"):
    """Wait until the flag at ``flag_ptr`` holds ``ready`` (acquire, ``SCOPE``), at most ``budget``
    spins. Returns the spins left: 0 means this wait (or an earlier one of this program, or another
    program of this rank) failed and was recorded, naming ``peer``; the caller must not use the data."""
    TAGGED: tl.constexpr = flag_ptr.dtype.element_ty == tl.int64
    seen = tl.atomic_cas(flag_ptr, ready, ready, sem="acquire", scope=SCOPE)
    spins = 0
    while (seen != ready) & (budget > 0) & (_other_call(seen, ready, TAGGED) == 0):
        seen = tl.atomic_cas(flag_ptr, ready, ready, sem="acquire", scope=SCOPE)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    if seen != ready:
        if _other_call(seen, ready, TAGGED):
            record_error(status_ptr, KIND_MISMATCH, rank, peer, desc, _their_descriptor(seen, TAGGED))
        else:
            record_timeout(status_ptr, rank, peer, desc)
        budget = budget * 0
    # The acquiring thread's view must reach every thread that reads the data next.
    tl.debug_barrier()
    return budget
