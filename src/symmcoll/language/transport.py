"""The cross-node transport, device side: the only way a kernel reaches a peer on another node.

One interface, two implementations chosen by the ``TRANSPORT`` constexpr (memory/transport.py):

    put_signal(dst, src, numel, signal, value, peer, ...)   numel elements src -> dst at ``peer``, then
                                                             ``peer``'s int64 ``signal`` := value (the data
                                                             is visible there before the signal)
    get(dst, src, numel, peer, ...)                          numel elements at ``peer``'s src -> my dst
    send_signal(signal, value, peer, ...)                    ``peer``'s signal := value (no data)
    wait_signal(signal, epoch, desc, ...)                    bounded wait on my own signal (below)

Addresses are symmetric, as in NVSHMEM: ``dst`` of a put, ``src`` of a get and ``signal`` are *this
rank's* addresses of the object; the transport finds the same offset in the peer's allocation.
``peer`` is a group rank. The source of a put (and the destination of a get) should be symmetric
memory too: NVSHMEM over InfiniBand reads and writes only registered memory.

* ``EMULATED`` (CPU): the transport table holds every rank's allocation base (the only place that
  holds cross-node ones); a put is loads from ``src`` and stores to ``table[peer] + (dst - table[me])``,
  then a block-wide barrier and an atomic exchange of the signal with release semantics.
* ``NVSHMEM`` (GPU): ``nvshmemx_putmem_signal_block`` / ``nvshmemx_getmem_block`` /
  ``nvshmemx_signal_op`` from NVSHMEM's device library (linked as ``extern_libs``); the table holds
  each group rank's PE. These are block-scoped calls: every thread of the program makes them, as
  Triton runs scalar code. Signals are set, never added, so repeated calls by the threads agree.

Signals are 64-bit words ``(epoch << 32) | desc``: the sender's launch epoch and call descriptor (or
``FAILED_DESC`` from a rank that already failed, so that failures spread instead of garbage). Nothing
resets them (a remote put cannot compare-and-swap), so a wait compares epochs: ``wait_signal`` spins on
its own word with acquire loads (atomics, system scope) until the epoch is this launch's, bounded by the
spin budget like every wait; a word of this epoch carrying another descriptor is a peer that made a
different call (recorded as a mismatch). Callers keep two slot sets (``epoch % 2``): a peer can be one
launch ahead at most, because finishing a launch needs every peer's data of that launch.
"""

import triton
import triton.language as tl
from triton.language import core

from .signals import KIND_MISMATCH, failed_elsewhere, record_error, record_timeout

EMULATED: tl.constexpr = tl.constexpr(0)
NVSHMEM: tl.constexpr = tl.constexpr(1)
_SIGNAL_SET: tl.constexpr = tl.constexpr(0)  # NVSHMEM_SIGNAL_SET


# ---- NVSHMEM's device functions (resolved from libnvshmem_device.bc at link time) ----------------

def _nvshmem_call(name, args, arg_types, _semantic):
    """A call of NVSHMEM's device function ``name`` on ``args`` of ``arg_types`` (dtype names); every
    one returns int32 and is not pure (it moves data or raises a signal)."""
    return core.extern_elementwise("", "", list(args),
                                   {tuple(core.dtype(t) for t in arg_types): (name, core.dtype("int32"))},
                                   is_pure=False, _semantic=_semantic)


@core.extern
def _nvshmem_putmem_signal_block(dst, src, nbytes, signal, value, sig_op, pe, _semantic=None):
    return _nvshmem_call("nvshmemx_putmem_signal_block", (dst, src, nbytes, signal, value, sig_op, pe),
                         ("int64", "int64", "int64", "int64", "uint64", "int32", "int32"), _semantic)


@core.extern
def _nvshmem_getmem_block(dst, src, nbytes, pe, _semantic=None):
    return _nvshmem_call("nvshmemx_getmem_block", (dst, src, nbytes, pe), ("int64", "int64", "int64", "int32"),
                         _semantic)


@core.extern
def _nvshmem_signal_op(signal, value, sig_op, pe, _semantic=None):
    return _nvshmem_call("nvshmemx_signal_op", (signal, value, sig_op, pe), ("int64", "uint64", "int32", "int32"),
                         _semantic)


# ---- the interface -----------------------------------------------------------------------------------

@triton.jit
def _remote(local, peer, transport_ptrs_dev, rank):
    """EMULATED: ``peer``'s address of the object at my address ``local`` (same offset, other base)."""
    table = transport_ptrs_dev.to(tl.pointer_type(tl.int64))
    offset = local.to(tl.int64) - tl.load(table + rank)
    return (tl.load(table + peer) + offset).to(local.dtype)


@triton.jit
def _pe(peer, transport_ptrs_dev):
    return tl.load(transport_ptrs_dev.to(tl.pointer_type(tl.int64)) + peer).to(tl.int32)


@triton.jit
def _copy(src, dst, numel, BLOCK: tl.constexpr):
    lane = tl.arange(0, BLOCK)
    for start in range(0, numel, BLOCK):
        offs = start + lane
        tl.store(dst + offs, tl.load(src + offs, mask=offs < numel), mask=offs < numel)


# The descriptor a rank signals once it has failed (an earlier kernel of it recorded an error): no call
# has it (descriptors are positive), so its counterparts record a mismatch naming it and stop, instead
# of consuming data it never produced. The host reports it as a peer that had failed.
FAILED_DESC: tl.constexpr = tl.constexpr(-1)


@triton.jit
def signal_value(epoch, desc, status_ptr):
    """The 64-bit signal of this launch and call (FAILED_DESC once this rank's error record is set)."""
    failed = tl.load(status_ptr.to(tl.pointer_type(tl.int32)), volatile=True) != 0
    sent = tl.where(failed, FAILED_DESC, desc)
    return (epoch.to(tl.int64) << 32) | (sent.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def put_signal(dst, src, numel, signal, value, peer, transport_ptrs_dev, rank, TRANSPORT: tl.constexpr,
               BLOCK: tl.constexpr):
    """``numel`` elements from my ``src`` to ``peer``'s copy of ``dst``, then ``peer``'s ``signal``
    (int64, symmetric) := ``value``; the data lands before the signal. Whole program."""
    # Every thread's writes to src (and earlier puts' reads of it) are done before the transfer starts.
    tl.debug_barrier()
    if TRANSPORT == NVSHMEM:
        nbytes = numel.to(tl.int64) * src.dtype.element_ty.primitive_bitwidth // 8
        _nvshmem_putmem_signal_block(dst.to(tl.int64), src.to(tl.int64), nbytes, signal.to(tl.int64),
                                     value.to(tl.uint64), _SIGNAL_SET, _pe(peer, transport_ptrs_dev))
    else:
        _copy(src, _remote(dst, peer, transport_ptrs_dev, rank), numel, BLOCK)
        tl.debug_barrier()
        tl.atomic_xchg(_remote(signal, peer, transport_ptrs_dev, rank), value.to(tl.int64), sem="release",
                       scope="sys")


@triton.jit
def send_signal(signal, value, peer, transport_ptrs_dev, rank, TRANSPORT: tl.constexpr):
    """``peer``'s ``signal`` := ``value``, after this program's earlier writes (EMULATED: release). Under
    NVSHMEM a signal is not ordered after earlier puts to ``peer`` (that takes a fence): signal only
    about local data or after gets, which are complete on return -- as the exchange does."""
    tl.debug_barrier()
    if TRANSPORT == NVSHMEM:
        _nvshmem_signal_op(signal.to(tl.int64), value.to(tl.uint64), _SIGNAL_SET, _pe(peer, transport_ptrs_dev))
    else:
        tl.atomic_xchg(_remote(signal, peer, transport_ptrs_dev, rank), value.to(tl.int64), sem="release",
                       scope="sys")


@triton.jit
def get(dst, src, numel, peer, transport_ptrs_dev, rank, TRANSPORT: tl.constexpr, BLOCK: tl.constexpr):
    """``numel`` elements from ``peer``'s copy of ``src`` into my ``dst``; complete on return. The caller
    knows the peer's data is ready (a signal it waited for)."""
    if TRANSPORT == NVSHMEM:
        nbytes = numel.to(tl.int64) * dst.dtype.element_ty.primitive_bitwidth // 8
        _nvshmem_getmem_block(dst.to(tl.int64), src.to(tl.int64), nbytes, _pe(peer, transport_ptrs_dev))
    else:
        _copy(_remote(src, peer, transport_ptrs_dev, rank), dst, numel, BLOCK)
    tl.debug_barrier()


@triton.jit
def wait_signal(signal, epoch, desc, budget, status_ptr, rank, peer):
    """Wait until my int64 ``signal`` carries ``epoch`` (acquire, system scope), at most ``budget``
    spins. Returns the spins left: 0 means this program gave up (a timeout naming ``peer`` or a
    mismatch naming ``peer`` and its descriptor is recorded) -- callers pass it on, so that later
    waits give up at once."""
    value = tl.atomic_add(signal, 0, sem="acquire", scope="sys")
    spins = 0
    while ((value >> 32).to(tl.int32) != epoch) & (budget > 0):
        value = tl.atomic_add(signal, 0, sem="acquire", scope="sys")
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    if (value >> 32).to(tl.int32) == epoch:
        theirs = (value & 0xFFFFFFFF).to(tl.int32)
        if theirs != desc:
            record_error(status_ptr, KIND_MISMATCH, rank, peer, desc, theirs)
            budget = budget * 0
    else:
        record_timeout(status_ptr, rank, peer, desc)
        budget = budget * 0
    # The acquiring thread's view must reach every thread that reads the data next.
    tl.debug_barrier()
    return budget
