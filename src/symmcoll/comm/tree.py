"""The tree family: double-binary-tree all-reduce (all_reduce.tree).

Two balanced binary trees over the ranks, built so that every rank is an inner node in at most one
of them (tree 0 in rank order, tree 1 in reversed rank order, both heap-shaped). The tensor is cut in two halves; half t is reduced up
tree t and broadcast back down it, so each rank does the inner-node work (receiving from two
children) for at most one half.

Per tree and per program, with point-to-point signals only (no all-peer barrier):

    0. send my descriptor to my parent and children, wait for theirs (a neighbour's other call is found
       at once)
    1. wait "partial ready" from my children            (their signal, acquire)
    2. partial = x + partial(child 0) + partial(child 1) read from the children's buffers; partials
       are fp32 end to end -> my partial region (root: the result, rounded once, into my result
       region and my output)
    3. not root: signal parent "partial ready"; wait parent "result ready";
       result = parent's result region -> my output (and my result region if I have children)
    4. inner node: signal children "result ready"; wait children "done"
    5. not root: signal parent "done"

Failure: a program whose wait gave up sends no further signal, so its tree neighbours time out too
and every rank raises; a rank may then name the neighbour it waited for (itself waiting on the missing
rank) rather than the missing rank. A neighbour that made another call is named by step 0 on both ranks.

Step 4's "done" keeps a parent from overwriting its result region (next call) while a child still
reads it; a child can overwrite its partial region in the next call only after step 3, i.e. after the
parent read it. Child -> parent step 0, "partial ready" and "done" reuse one self-resetting slot (parent ->
child: step 0 and "result ready"): a send waits until the one before was consumed, and each is consumed in
order by the receiver's waits.

Programs [0, P) work on half 0 / tree 0, programs [P, 2P) on half 1 / tree 1; program q only waits
on program q of its tree neighbours. Buffer: fp32 partials at [0, n), results (input dtype) at
elements [res_off, res_off + n).

Traffic per rank: at most 2 * S/2 read from children plus S/2 from the parent: less than one-shot,
but the depth (log2 W steps up and down) costs latency. On NVSwitch systems with few ranks the flat
algorithms should win; the tree is here to measure that, and for larger world sizes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import MAX_WORLD, announce, combine, finalize, narrow, peer_ptr, send_signals, wait_signals
from ..launcher import launch
from ..plan import Algorithm, LaunchConfig, Plan, SizedConfigs, reduction_dtype_reason, register
from .common import cdiv, chunks, config, meta

GPU_TREE = SizedConfigs(((1 << 40, LaunchConfig(block=4096, max_programs=64, num_warps=16)),))


def _heap_tree(order: list[int]) -> tuple[list[int], list[list[int]]]:
    """A balanced binary tree with ``order[i]``'s children at ``order[2i+1]``, ``order[2i+2]``;
    (parent, children) per rank. Its inner nodes are the first floor(W/2) ranks of ``order``."""
    world = len(order)
    parent, children = [-1] * world, [[] for _ in range(world)]
    for i, rank in enumerate(order):
        for j in (2 * i + 1, 2 * i + 2):
            if j < world:
                parent[order[j]] = rank
                children[rank].append(order[j])
    return parent, children


def double_binary_tree(world: int) -> list[tuple[list[int], list[list[int]]]]:
    """Two balanced trees in which every rank is an inner node of at most one: tree 0's inner nodes
    are the lowest floor(W/2) ranks, tree 1's (the reversed order) the highest floor(W/2)."""
    return [_heap_tree(list(range(world))), _heap_tree(list(range(world - 1, -1, -1)))]


@triton.jit
def tree_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # this piece; the buffer holds partials at [0, numel), results at [res_off, res_off + numel)
    x_ptr, out_ptr, numel, half_len, res_off,
    # topology: my parent and children in tree 0 and tree 1 (-1: none)
    parent0, left0, right0, parent1, left1, right1,
    WORLD: tl.constexpr, REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr,
):
    q = tl.program_id(0)
    per_tree = tl.num_programs(0) // 2
    tree = q // per_tree
    p = q % per_tree
    parent = tl.where(tree == 0, parent0, parent1)
    left = tl.where(tree == 0, left0, left1)
    right = tl.where(tree == 0, right0, right1)
    lanes = tl.arange(0, MAX_WORLD)
    child_lanes = ((lanes == left) | (lanes == right)) & (lanes >= 0)
    parent_lane = (lanes == parent) & (lanes >= 0)
    elem = x_ptr.dtype.element_ty
    my_results = peer_ptr(buffer_ptrs_dev, rank, elem) + res_off
    my_partials = peer_ptr(buffer_ptrs_dev, rank, tl.float32)
    lo = tree * half_len
    hi = tl.minimum(numel, lo + half_len)
    n_blocks = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK)
    lane = tl.arange(0, BLOCK)
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    # 0. my tree neighbours and I exchange descriptors: a neighbour that made another call is found here, by
    # every program of both ranks, not when a wait gives up (a child otherwise meets its parent's descriptor
    # only in the result it waits for, which a parent that saw the difference never sends; under the
    # interpreter the program that would meet it in its own tree runs after the one waiting)
    neighbours = child_lanes | parent_lane
    failed = tl.max(send_signals(signal_pad_ptrs_dev, neighbours, rank, desc, status_ptr, max_spins,
                                 WORLD).to(tl.int32), axis=0)
    failed |= tl.max(wait_signals(signal_pad_ptrs_dev, neighbours, rank, desc, status_ptr, max_spins,
                                  WORLD).to(tl.int32), axis=0)

    failed |= tl.max(wait_signals(signal_pad_ptrs_dev, child_lanes, rank, desc, status_ptr, max_spins,
                                  WORLD).to(tl.int32), axis=0)
    tl.debug_barrier()
    for b in range(p, n_blocks, per_tree):
        offs = lo + b * BLOCK + lane
        mask = offs < hi
        acc = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
        if left >= 0:
            acc = combine(acc, tl.load(peer_ptr(buffer_ptrs_dev, left, tl.float32) + offs, mask=mask),
                          REDUCE_OP)
        if right >= 0:
            acc = combine(acc, tl.load(peer_ptr(buffer_ptrs_dev, right, tl.float32) + offs, mask=mask),
                          REDUCE_OP)
        if parent < 0:
            result = narrow(finalize(acc, REDUCE_OP, WORLD), elem)
            tl.store(my_results + offs, result, mask=mask)
            tl.store(out_ptr + offs, result, mask=mask)
        else:
            tl.store(my_partials + offs, acc, mask=mask)

    if parent >= 0:
        tl.debug_barrier()
        # A program that gave up sends nothing more (here and below): whoever waits on it times out
        # in turn, so every rank that depends on a missing peer raises instead of returning garbage.
        if failed == 0:
            failed |= tl.max(send_signals(signal_pad_ptrs_dev, parent_lane, rank, desc, status_ptr,
                                          max_spins, WORLD).to(tl.int32), axis=0)
        failed |= tl.max(wait_signals(signal_pad_ptrs_dev, parent_lane, rank, desc, status_ptr, max_spins,
                                      WORLD).to(tl.int32), axis=0)
        tl.debug_barrier()
        for b in range(p, n_blocks, per_tree):
            offs = lo + b * BLOCK + lane
            mask = offs < hi
            result = tl.load(peer_ptr(buffer_ptrs_dev, parent, elem) + res_off + offs, mask=mask)
            tl.store(out_ptr + offs, result, mask=mask)
            if left >= 0:
                tl.store(my_results + offs, result, mask=mask)
    tl.debug_barrier()
    if failed == 0:
        failed |= tl.max(send_signals(signal_pad_ptrs_dev, child_lanes, rank, desc, status_ptr, max_spins,
                                      WORLD).to(tl.int32), axis=0)
    failed |= tl.max(wait_signals(signal_pad_ptrs_dev, child_lanes, rank, desc, status_ptr, max_spins,
                                  WORLD).to(tl.int32), axis=0)
    if (parent >= 0) & (failed == 0):
        send_signals(signal_pad_ptrs_dev, parent_lane, rank, desc, status_ptr, max_spins, WORLD)


def _tree(plan: Plan, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    ws, cfg, rank = plan.ws, config(plan), plan.rank
    (parent0, children0), (parent1, children1) = double_binary_tree(plan.world)
    kids = [c + [-1] * (2 - len(c)) for c in (children0[rank], children1[rank])]
    flat, out_flat = x.reshape(-1), out.reshape(-1)
    # fp32 partials then results in the input dtype: capacity elements of each.
    capacity = ws.buffer_bytes // (4 + x.element_size())
    capacity -= capacity % 16
    results_at = capacity * 4 // x.element_size()
    for start, n in chunks(flat.numel(), capacity):
        half_len = cdiv(cdiv(n, 2), 16) * 16
        per_tree = cfg.grid(cdiv(half_len, cfg.block))[0]
        launch(tree_kernel, (2 * per_tree,),
               (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, flat[start:], out_flat[start:], n, half_len,
                results_at, parent0[rank], kids[0][0], kids[0][1], parent1[rank], kids[1][0], kids[1][1]),
               meta(plan, REDUCE_OP=plan.reduce_code, BLOCK=cfg.block))
    return out


register(Algorithm("all_reduce", "tree", 8, "tree", _tree,
                   "double binary tree: reduce up, broadcast down, point-to-point signals", GPU_TREE,
                   accepts=reduction_dtype_reason))
