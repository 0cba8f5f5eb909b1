"""The quantized all-reduce's steps (comm/quantized.py): a block's codes and scales sent to a peer's row,
received from mine, stage 1's end; and the kernel's stages with every load a loop step ahead
(``stages_prefetched``, SYMMCOLL_QUANT_PREFETCH), which the kernel runs instead of its own loops when asked.
The protocol and wire format are comm/quantized.py's."""

import triton
import triton.language as tl

from ..language import (OP_AVG, dequantize_groups, narrow, own_shard, pack_words, peer_ptr, post_call,
                        quantize_groups, take_rows_pair, unpack_words)

_AVG: tl.constexpr = tl.constexpr(OP_AVG)


@triton.jit
def send_block(row_ptr, b, words, scales, n_words, n_groups, SCALES_AT: tl.constexpr, WORDS: tl.constexpr,
               GROUPS: tl.constexpr):
    """Store block ``b``'s packed codes ([1, WORDS]) and scales ([1, GROUPS]) into the row at ``row_ptr``."""
    word = b * WORDS + tl.arange(0, WORDS)[None, :]
    group = b * GROUPS + tl.arange(0, GROUPS)[None, :]
    tl.store(row_ptr + word, words, mask=word < n_words)
    tl.store(row_ptr + SCALES_AT + group, scales.to(tl.int32, bitcast=True), mask=group < n_groups)


@triton.jit
def receive_block(row_ptr, src, b, n_words, n_groups, budget, status_ptr, rank, desc, headers, epoch, check,
                  WORLD: tl.constexpr, SCALES_AT: tl.constexpr, WORDS: tl.constexpr, GROUPS: tl.constexpr,
                  BITS: tl.constexpr, G: tl.constexpr, FMT: tl.constexpr, BLOCK: tl.constexpr, loaded=None,
                  loaded_scales=None):
    """Block ``b`` of the row at ``row_ptr`` (from rank ``src``) once filled, emptied for reuse and
    decoded: (fp32 values [1, BLOCK], spins left). Codes and scales in one wait (one round trip, one
    decision a spin: two waits were two round trips in a row). [1, N] tiles throughout, as the codecs take them:
    a tile made 2-D by ``[None, :]`` got layouts that reduce a group across warps. ``loaded`` /
    ``loaded_scales``: the first poll, read ahead by ``_peek``."""
    word = b * WORDS + tl.arange(0, WORDS)[None, :]
    group = b * GROUPS + tl.arange(0, GROUPS)[None, :]
    source = tl.full([1], src, tl.int32)
    words, scale_bits, budget = take_rows_pair(row_ptr + word, word < n_words, row_ptr + SCALES_AT + group,
                                               group < n_groups, source, rank, budget, status_ptr, desc, headers,
                                               epoch, check, WORLD, loaded, loaded_scales)
    codes = unpack_words(words, 1, BLOCK, BITS)
    return dequantize_groups(codes, scale_bits.to(tl.float32, bitcast=True), 1, BLOCK, G, FMT), budget


@triton.jit
def _peek(row_ptr, b, n_words, n_groups, valid, SCALES_AT: tl.constexpr, WORDS: tl.constexpr,
          GROUPS: tl.constexpr):
    """The first poll of ``receive_block`` for block ``b`` of the row at ``row_ptr`` (its codes and scales as
    they are now; nothing where not ``valid``), issued a step early (PREFETCH)."""
    word = b * WORDS + tl.arange(0, WORDS)[None, :]
    group = b * GROUPS + tl.arange(0, GROUPS)[None, :]
    words = tl.load(row_ptr + word, mask=(word < n_words) & valid, other=0, volatile=True)
    scale_bits = tl.load(row_ptr + SCALES_AT + group, mask=(group < n_groups) & valid, other=0, volatile=True)
    return words, scale_bits


@triton.jit
def _item(k, pid, nprog, rank, WORLD: tl.constexpr):
    """Work item ``k`` of a program's (block, peer) items in stages 0 and 2 (PREFETCH): its blocks in
    order, each block's peers in ring order from mine."""
    return pid + (k // (WORLD - 1)) * nprog, (rank + 1 + k % (WORLD - 1)) % WORLD


@triton.jit
def _shard_input(x_ptr, s, b, lane, shard_len, numel, valid, BLOCK: tl.constexpr):
    """Block ``b`` of shard ``s`` of my input, as stored (nothing where not ``valid``)."""
    in_shard = b * BLOCK + lane
    offs = s * shard_len + in_shard
    return tl.load(x_ptr + offs, mask=(in_shard < shard_len) & (offs < numel) & valid, other=0)


@triton.jit
def scatter_block(x, s, b, slot_ptrs_dev, scatter_base, rank, n_words, n_groups, FMT: tl.constexpr,
                  BITS: tl.constexpr, G: tl.constexpr, ROW: tl.constexpr, SCALES_AT: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Stage 0's step: block ``b`` of shard ``s`` of my input (fp32 ``x``), quantized, into my row of rank
    ``s``'s scatter slots."""
    codes, scales = quantize_groups(x, 1, BLOCK, G, FMT)
    send_block(peer_ptr(slot_ptrs_dev, s, tl.int32) + scatter_base + rank * ROW, b,
               pack_words(codes, 1, BLOCK, BITS), scales, n_words, n_groups, SCALES_AT, BLOCK * BITS // 32,
               BLOCK // G)


@triton.jit
def sum_shard(own, b, budget, check, region, scatter_base, status_ptr, rank, desc, headers, epoch, n_words,
              n_groups, WORLD: tl.constexpr, ROW: tl.constexpr, SCALES_AT: tl.constexpr, BITS: tl.constexpr,
              G: tl.constexpr, FMT: tl.constexpr, BLOCK: tl.constexpr, ahead=None, loaded=None,
              loaded_scales=None):
    """Stage 1's sum for block ``b`` of my shard: my own values (``own``, exact) and every peer's decoded
    codes, in rank order. With ``loaded`` / ``loaded_scales``, the first poll of peer ``ahead``'s row,
    read a step early. Returns (sum, spins left, check)."""
    # -0.0 + v == v for every v: the sum is ((r0 + r1) + r2) + ..., the reference's order.
    acc = tl.full([1, BLOCK], -0.0, tl.float32)
    for src in tl.static_range(WORLD):
        if src == rank:
            acc += own
        else:
            row = region + scatter_base + src * ROW
            if loaded is None:
                values, budget = receive_block(row, src, b, n_words, n_groups, budget, status_ptr, rank, desc,
                                               headers, epoch, check, WORLD, SCALES_AT, BLOCK * BITS // 32,
                                               BLOCK // G, BITS, G, FMT, BLOCK)
            elif WORLD == 2:  # the one peer is ``ahead``
                values, budget = receive_block(row, src, b, n_words, n_groups, budget, status_ptr, rank, desc,
                                               headers, epoch, check, WORLD, SCALES_AT, BLOCK * BITS // 32,
                                               BLOCK // G, BITS, G, FMT, BLOCK, loaded, loaded_scales)
            elif src == ahead:
                values, budget = receive_block(row, src, b, n_words, n_groups, budget, status_ptr, rank, desc,
                                               headers, epoch, check, WORLD, SCALES_AT, BLOCK * BITS // 32,
                                               BLOCK // G, BITS, G, FMT, BLOCK, loaded, loaded_scales)
            else:
                values, budget = receive_block(row, src, b, n_words, n_groups, budget, status_ptr, rank, desc,
                                               headers, epoch, check, WORLD, SCALES_AT, BLOCK * BITS // 32,
                                               BLOCK // G, BITS, G, FMT, BLOCK)
            check = 0
            acc += values
    return acc, budget, check


@triton.jit
def finish_shard(acc, b, offs, mask, budget, out_ptr, slot_ptrs_dev, gather_base, rank, n_words, n_groups,
                  WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FMT: tl.constexpr, BITS: tl.constexpr,
                  G: tl.constexpr, ROW: tl.constexpr, SCALES_AT: tl.constexpr, BLOCK: tl.constexpr):
    """Stage 1's end for block ``b`` of my shard (``acc``: the rank-order sum): re-quantized, my output
    decoded from the codes, the codes into my row of every peer's gather slots (unless a wait gave up)."""
    if REDUCE_OP == _AVG:
        acc = tl.math.div_rn(acc, tl.zeros_like(acc) + WORLD)
    codes, scales = quantize_groups(acc, 1, BLOCK, G, FMT)
    if budget > 0:
        result = dequantize_groups(codes, scales, 1, BLOCK, G, FMT)
        tl.store(out_ptr + offs, narrow(result, out_ptr.dtype.element_ty), mask=mask)
        words = pack_words(codes, 1, BLOCK, BITS)
        for step in tl.static_range(1, WORLD):
            send_block(peer_ptr(slot_ptrs_dev, (rank + step) % WORLD, tl.int32) + gather_base + rank * ROW, b,
                       words, scales, n_words, n_groups, SCALES_AT, BLOCK * BITS // 32, BLOCK // G)


@triton.jit
def stages_prefetched(slot_ptrs_dev, status_ptr, max_spins, rank, desc, x_ptr, out_ptr, numel, shard_len, epoch,
                       scatter_base, gather_base, region, headers, pads, peer_headers, blocks, n_words, n_groups,
                       WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, FMT: tl.constexpr, BITS: tl.constexpr,
                       G: tl.constexpr, ROW: tl.constexpr, SCALES_AT: tl.constexpr, BLOCK: tl.constexpr):
    """The three stages with every load a step ahead (SYMMCOLL_QUANT_PREFETCH): each loop reads what its
    next step needs -- stage 0 the next input block, stage 1 my next own block and the first peer's next
    codes and scales, stage 2 the next row's codes and scales -- before it works on the current one, so
    that the round trip to memory overlaps the quantizing, the waits' reductions and the stores instead
    of starting each step (the default loops issue a step's loads at its start and wait for them there).
    Stages 0 and 2 walk a program's (block, peer) items in one loop so that one tile is carried at
    every world size. Same protocol, same words, same output bits: a polled word that is not EMPTY is
    final whenever it was read, and an EMPTY one is polled again by the wait."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    lane = tl.arange(0, BLOCK)[None, :]
    WORDS: tl.constexpr = BLOCK * BITS // 32
    GROUPS: tl.constexpr = BLOCK // G
    mine = tl.cdiv(blocks - pid, nprog)  # blocks of this program (pid < blocks: the grid is at most blocks)
    items = mine * (WORLD - 1)

    # Stage 0 (see the kernel), one (block, peer) item a step.
    s = (rank + 1) % WORLD
    x_next = _shard_input(x_ptr, s, pid, lane, shard_len, numel, items > 0, BLOCK)
    for k in range(0, items):
        b, s = _item(k, pid, nprog, rank, WORLD)
        x = x_next.to(tl.float32)
        b_next, s_next = _item(k + 1, pid, nprog, rank, WORLD)
        x_next = _shard_input(x_ptr, s_next, b_next, lane, shard_len, numel, k + 1 < items, BLOCK)
        scatter_block(x, s, b, slot_ptrs_dev, scatter_base, rank, n_words, n_groups, FMT, BITS, G, ROW, SCALES_AT,
                      BLOCK)
    post_call(pads, peer_headers, epoch, desc, rank, WORLD)

    # Stage 1 (see the kernel): the first peer in rank order is polled a block ahead (at world size 2,
    # the only one); the others as in the kernel.
    budget = max_spins
    check = 1
    ahead = tl.where(rank == 0, 1, 0)
    ahead_row = region + scatter_base + ahead * ROW  # the row polled a step ahead
    _, offs, mask = own_shard(pid, BLOCK, lane, rank, shard_len, numel)
    own_next = tl.load(x_ptr + offs, mask=mask & (mine > 0), other=0)
    words_next, scales_next = _peek(ahead_row, pid, n_words, n_groups, mine > 0, SCALES_AT, WORDS, GROUPS)
    for k in range(0, mine):
        b = pid + k * nprog
        _, offs, mask = own_shard(b, BLOCK, lane, rank, shard_len, numel)
        own = own_next.to(tl.float32)
        words_now, scales_now = words_next, scales_next
        _, offs_next, mask_next = own_shard(b + nprog, BLOCK, lane, rank, shard_len, numel)
        own_next = tl.load(x_ptr + offs_next, mask=mask_next & (k + 1 < mine), other=0)
        words_next, scales_next = _peek(ahead_row, b + nprog, n_words, n_groups, k + 1 < mine, SCALES_AT, WORDS,
                                        GROUPS)
        acc, budget, check = sum_shard(own, b, budget, check, region, scatter_base, status_ptr, rank, desc, headers,
                                       epoch, n_words, n_groups, WORLD, ROW, SCALES_AT, BITS, G, FMT, BLOCK, ahead,
                                       words_now, scales_now)
        finish_shard(acc, b, offs, mask, budget, out_ptr, slot_ptrs_dev, gather_base, rank, n_words, n_groups,
                      WORLD, REDUCE_OP, FMT, BITS, G, ROW, SCALES_AT, BLOCK)

    # Stage 2 (see the kernel), one (block, peer) item a step.
    s = (rank + 1) % WORLD
    words_next, scales_next = _peek(region + gather_base + s * ROW, pid, n_words, n_groups, items > 0, SCALES_AT,
                                    WORDS, GROUPS)
    for k in range(0, items):
        b, s = _item(k, pid, nprog, rank, WORLD)
        words_now, scales_now = words_next, scales_next
        b_next, s_next = _item(k + 1, pid, nprog, rank, WORLD)
        words_next, scales_next = _peek(region + gather_base + s_next * ROW, b_next, n_words, n_groups, k + 1 < items,
                                        SCALES_AT, WORDS, GROUPS)
        values, budget = receive_block(region + gather_base + s * ROW, s, b, n_words, n_groups, budget, status_ptr, rank,
                                       desc, headers, epoch, 0, WORLD, SCALES_AT, WORDS, GROUPS, BITS, G, FMT, BLOCK,
                                       words_now, scales_now)
        in_shard = b * BLOCK + lane
        offs = s * shard_len + in_shard
        if budget > 0:
            tl.store(out_ptr + offs, narrow(values, out_ptr.dtype.element_ty),
                     mask=(in_shard < shard_len) & (offs < numel))
