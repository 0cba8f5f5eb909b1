"""What the data-movement kernels with device-side counts share: epoch-tagged counts and escaped words
(the barrier-free kernels' additions to the sentinel protocol), and clamping of device-side splits.

Counts. A receiver must know how many words a sender will push before it can poll for them (the row
counts of a device-side split are known only on the sender). Every program of a sender stores
``(epoch << 32) | rows`` into its count slot of every peer's region (the same value from every
program: idempotent, and a receiving program never depends on a sibling program of the sender having
run). Slots are epoch-tagged like the call headers, so nobody ever resets them; the receiver polls them
together with the call headers (``wait_counts``). Every program of every rank waits for every peer's
count of the current launch, so a rank can never get more than one launch ahead of a peer, whatever the
counts (even zero rows): the argument that makes rotating slot sets safe.

Escaped words. The sentinel protocol reserves one 32-bit word, EMPTY: reductions ``sanitize`` data
words (a bf16 -0 becomes +0), but data movement must deliver every bit. So each group of 16 data words
travels with one mask word whose bit i says "word i was EMPTY" (the word itself is sent as 0). A mask
word has bit 31 clear, so it is never EMPTY either: the receiver polls data and mask words alike until
none is EMPTY, then puts the EMPTY words back. Cost: one word in 16 (6.25%) more traffic.
"""

import triton
import triton.language as tl

from .polls import WAIT_PENDING, end_wait, header_state, reread_stale, wait_state
from .signals import ARG_SPLITS, failed_elsewhere, record_argument

# Data words per mask word (a power of two: blocks of data words hold whole groups).
ESCAPE_GROUP: tl.constexpr = tl.constexpr(16)


@triton.jit
def post_counts(ptrs_dev, offset, epoch, counts, rows, is_dest, rank):
    """Store ``(epoch << 32) | counts[i]`` into int64 slot ``offset + rank`` of rank ``rows[i]``'s
    region, for every row where ``is_dest`` (``counts``, ``rows``, ``is_dest``: [PEERS] vectors)."""
    table = ptrs_dev.to(tl.pointer_type(tl.uint64))
    bases = tl.load(table + tl.where(is_dest, rows, 0)).to(tl.pointer_type(tl.int64))
    tagged = (tl.zeros_like(counts).to(tl.int64) + epoch) << 32 | (counts.to(tl.int64) & 0xFFFFFFFF)
    tl.store(bases + offset + rank, tagged, mask=is_dest)


@triton.jit
def wait_counts(count_ptr, rows, is_src, own_headers, epoch, desc, spin_budget, status_ptr, rank,
                WORLD: tl.constexpr):
    """Poll my int64 count slots ``count_ptr[rows[i]]`` until every source row (``is_src``) carries this
    epoch, and the call headers as ``wait_filled`` does with ``check``. Returns (counts: [PEERS] int64,
    0 where not a source; spins left, 0 if the wait gave up: recorded, naming the first late source)."""
    tagged = tl.load(count_ptr + rows, mask=is_src, other=0, volatile=True)
    headers = header_state(own_headers, 1, epoch, desc, rank, WORLD)
    late = is_src & ((tagged >> 32).to(tl.int32) != epoch)
    state = wait_state(tl.max(late.to(tl.int32), axis=0) > 0, headers)
    budget = spin_budget
    spins = 0
    while (state == WAIT_PENDING) & (budget > 0):
        tagged = tl.load(count_ptr + rows, mask=is_src, other=0, volatile=True)
        headers = header_state(own_headers, 1, epoch, desc, rank, WORLD)
        late = is_src & ((tagged >> 32).to(tl.int32) != epoch)
        state = wait_state(tl.max(late.to(tl.int32), axis=0) > 0, headers)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    first = tl.min(tl.where(late, rows, WORLD), axis=0)
    budget = end_wait(state, tl.max(late.to(tl.int32), axis=0) > 0, budget, status_ptr, rank, first, desc, own_headers,
                      1, epoch, WORLD)
    return tl.where(is_src, tagged & 0xFFFFFFFF, 0), budget


@triton.jit
def escape(words, EMPTY: tl.constexpr, GROUPS: tl.constexpr):
    """A [PEERS, BLOCK] tile of int32 words -> (the words with EMPTY sent as 0, [PEERS, GROUPS] mask
    words: bit i of mask word g set where word 16 g + i was EMPTY). BLOCK = 16 * GROUPS."""
    hit = words == EMPTY
    lane = tl.arange(0, GROUPS * ESCAPE_GROUP)
    bits = tl.where(hit, 1, 0) << (lane % ESCAPE_GROUP)[None, :]
    masks = tl.sum(tl.reshape(bits, [words.shape[0], GROUPS, ESCAPE_GROUP]), axis=2)
    return tl.where(hit, 0, words), masks


@triton.jit
def wait_escaped(data_ptrs, mask_ptrs, valid, rows, EMPTY: tl.constexpr, spin_budget, status_ptr, rank, desc):
    """Poll a [PEERS, BLOCK] tile of escaped words (row i from rank ``rows[i]``) and the mask word of
    each (``mask_ptrs``: the mask word covering each data word) until none under ``valid`` is EMPTY;
    returns (the original words, spins left). The caller resets both to EMPTY once it has them."""
    words = tl.load(data_ptrs, mask=valid, other=0, volatile=True)
    masks = tl.load(mask_ptrs, mask=valid, other=0, volatile=True)
    pending = tl.max(((words == EMPTY) | (masks == EMPTY)).to(tl.int32), axis=1)
    state = wait_state(tl.max(pending, axis=0) > 0, 0)  # no headers: they were checked with the counts
    budget = spin_budget
    spins = 0
    while (state == WAIT_PENDING) & (budget > 0):
        words = tl.load(data_ptrs, mask=valid, other=0, volatile=True)
        masks = tl.load(mask_ptrs, mask=valid, other=0, volatile=True)
        pending = tl.max(((words == EMPTY) | (masks == EMPTY)).to(tl.int32), axis=1)
        state = wait_state(tl.max(pending, axis=0) > 0, 0)
        budget -= 1
        spins += 1
        if failed_elsewhere(status_ptr, spins):
            budget = budget * 0
    # A copy of the tile still behind reads once more (polls.reread_stale), and nobody empties the
    # slots (the caller, next) before every copy has read.
    stale = valid & ((words == EMPTY) | (masks == EMPTY))
    words = reread_stale(data_ptrs, stale, words, 0)
    masks = reread_stale(mask_ptrs, stale, masks, 0)
    tl.debug_barrier()
    first = tl.min(tl.where(pending > 0, rows, 1 << 20), axis=0)
    no_headers = status_ptr.to(tl.pointer_type(tl.int64))  # never read: check 0
    budget = end_wait(state, tl.max(pending, axis=0) > 0, budget, status_ptr, rank, first, desc, no_headers, 0, 0, 1)
    lane = tl.arange(0, words.shape[1])
    escaped = ((masks >> (lane % ESCAPE_GROUP)[None, :]) & 1) != 0
    return tl.where(escaped, EMPTY, words), budget


@triton.jit
def clamped_splits(splits_ptr, lanes, valid, x_rows, report, status_ptr, rank, desc):
    """Rows sent to each rank (``lanes``: ranks) from a device-side split tensor, clamped to what x
    holds: a negative count sends nothing and the chunks stop at x's last row. With ``report`` (program
    0 of a call's first launch), splits that needed clamping are reported, naming the argument."""
    raw = tl.load(splits_ptr + lanes, mask=valid, other=0).to(tl.int64)
    wanted = tl.maximum(raw, 0)
    ends = tl.cumsum(wanted, axis=0)
    rows = tl.minimum(ends, x_rows) - tl.minimum(ends - wanted, x_rows)
    total = tl.sum(wanted, axis=0)
    if report != 0:
        if (tl.min(raw, axis=0) < 0) | (total > x_rows):
            record_argument(status_ptr, ARG_SPLITS, tl.sum(raw, axis=0), x_rows, rank, desc)
    return rows
