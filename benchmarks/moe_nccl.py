"""benchmarks/moe_bench.py's ``nccl`` baseline: MoE dispatch and combine as a competent eager PyTorch
layer writes them around NCCL's ``all_to_all_single`` -- exactly what the ``nccl`` row times.

``dispatch(tokens [T, H], topk_ids [T, k], E)`` (experts split evenly over the W ranks, ids outside
[0, E) ignored, as ``reference.moe_dispatch`` defines it):

1. on the device: every slot's global expert and owner rank; the (token, rank) pairs -- a token goes
   once to each rank owning one of its experts; the per-destination counts (rows, and slots per local
   expert of that rank); two stable argsorts of narrow (int16) keys: the pairs by destination, and this
   rank's (token, slot)s by global expert (the order in which the combine brings expert outputs back);
2. one ``all_to_all_single`` of the counts, a [W, 1 + E/W] int64 tensor;
3. ONE host read of the sent and received counts (``.tolist()``): ``all_to_all_single`` takes variable
   splits as host lists, so every user of it whose routing is computed on the GPU pays this
   synchronisation. It also makes the op impossible to capture in a CUDA graph: the row is eager;
4. one ``index_select`` lays the rows out by destination, each followed by its token's k expert ids
   (int16, padded to 16 bytes so rows stay aligned), and one ``all_to_all_single`` moves rows and ids;
5. on the receiver, one stable argsort (key: the local expert, or "not mine") picks the (row, slot)s of
   its experts, grouped by expert and, within one, by (source rank, token, slot), and one
   ``index_select`` expands the received rows into that layout. The expert GEMM needs it, and
   ``symmcoll.moe_dispatch`` returns it. It is also ``reference.moe_dispatch``'s layout, so the check maps
   nothing. The per-expert counts are sums of the exchanged counts (on the device). The combine's send order
   (by source rank) is a stable argsort of each output row's source rank (bucketised from the counts).

``combine(expert_out [S, H], topk_weights [T, k], handle)``: one ``index_select`` lays the expert outputs
out by source rank; one ``all_to_all_single`` with the dispatch's slot counts, swapped, returns them (no
host read); then ``index_add_`` of weight * row per token, in fp32, rounded once to the output dtype
(``reference.moe_combine``'s definition).
"""

from __future__ import annotations

import dataclasses
import warnings

import torch
import torch.distributed as dist

# Expert ids ride after each dispatched row in a field of this many bytes (a multiple of it): rows of
# the send and receive buffers stay 16-byte aligned.
META_ALIGN_BYTES = 16
# Expert ids travel and sort as int16.
MAX_EXPERTS = 2 ** 15 - 1


@dataclasses.dataclass(frozen=True)
class NcclHandle:
    """What a combine needs from its dispatch."""
    to_source: tuple[int, ...]      # expert-output rows this rank sends back to each source rank
    from_owner: tuple[int, ...]     # expert-output rows each owner rank sends back to this rank
    by_source: torch.Tensor         # dispatch output rows in send order: by source rank, then as laid out
    returned_slot: torch.Tensor     # per returned row: its (token, slot) here, as token * k + slot
    returned_token: torch.Tensor    # per returned row: its token here
    group: object = None


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Flat uint8 view of a contiguous tensor (gloo moves no bf16; NCCL moves bytes either way)."""
    return t.view(torch.uint8).reshape(-1)


def dispatch(tokens: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, group=None):
    """(rows [S, H] by local expert, then source rank, token, slot; per-local-expert counts [E/W] int64;
    handle for ``combine``). Steps in the module docstring; one host read (step 3)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    tokens_n, k = topk_ids.shape
    hidden, device = tokens.shape[1], tokens.device
    local_experts = num_experts // world
    if num_experts > MAX_EXPERTS:
        raise ValueError(f"{num_experts} experts: expert ids travel as int16 (at most {MAX_EXPERTS})")
    # Global expert per slot, E for an invalid id (clamp to [-1, E], then -1 -> E): owned by "rank" W.
    expert = torch.remainder(topk_ids.long().clamp(-1, num_experts), num_experts + 1)
    owner = expert // local_experts
    expert16 = expert.to(torch.int16)
    # pair_rank[t, d] = d where token t goes to rank d, else W (column W gathers the invalid slots).
    pair_rank = torch.full((tokens_n, world + 1), world, dtype=torch.int16, device=device)
    pair_rank.scatter_(1, owner, owner.to(torch.int16))
    rows_to = (pair_rank[:, :world] < world).sum(0)
    slots_of_expert = torch.zeros(num_experts + 1, dtype=torch.int64, device=device).scatter_add_(
        0, expert.reshape(-1), torch.ones(1, dtype=torch.int64, device=device).expand(tokens_n * k))
    counts = torch.empty((2, world, 1 + local_experts), dtype=torch.int64, device=device)  # sent, received
    send_counts, recv_counts = counts
    torch.cat([rows_to[:, None], slots_of_expert[:num_experts].view(world, local_experts)], dim=1, out=send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    pair_order = torch.argsort(pair_rank.reshape(-1), stable=True)  # queued before the host read
    slot_order = torch.argsort(expert16.reshape(-1), stable=True)

    sent, received = counts.tolist()  # the one host read
    rows_out, rows_in = [c[0] for c in sent], [c[0] for c in received]
    slots_out, slots_in = [sum(c[1:]) for c in sent], [sum(c[1:]) for c in received]

    send_token = pair_order[:sum(rows_out)] // (world + 1)
    meta_cols = -(-2 * k // META_ALIGN_BYTES) * META_ALIGN_BYTES // tokens.element_size()
    packed = tokens.new_empty((len(send_token), hidden + meta_cols))
    torch.index_select(tokens, 0, send_token, out=packed[:, :hidden])
    torch.index_select(expert16, 0, send_token, out=packed[:, hidden:].view(torch.int16)[:, :k])
    arrived = tokens.new_empty((sum(rows_in), hidden + meta_cols))
    row_bytes = arrived.shape[1] * arrived.element_size()
    dist.all_to_all_single(_bytes(arrived), _bytes(packed), [n * row_bytes for n in rows_in],
                           [n * row_bytes for n in rows_out], group=group)

    arrived_expert = arrived[:, hidden:].view(torch.int16)[:, :k]
    # Sort key: the local expert (0 .. E/W - 1) for this rank's experts; E/W or more for other ranks'
    # and for E (invalid), which the shift sends negative or past E/W - 1 and the remainder wraps into
    # [E/W, E].
    mine = torch.remainder(arrived_expert - rank * local_experts, num_experts + 1)
    grouped = torch.argsort(mine.reshape(-1), stable=True)[:sum(slots_in)]
    row = grouped // k
    out = arrived[:, :hidden].index_select(0, row)
    expert_counts = recv_counts[:, 1:].sum(0)
    source = torch.bucketize(row, recv_counts[:, 0].cumsum(0), right=True, out_int32=True)
    returned_slot = slot_order[:sum(slots_out)]
    handle = NcclHandle(tuple(slots_in), tuple(slots_out), torch.argsort(source, stable=True), returned_slot,
                        returned_slot // k, group)
    return out, expert_counts, handle


def combine(expert_out: torch.Tensor, topk_weights: torch.Tensor, handle: NcclHandle) -> torch.Tensor:
    """[T, H]: every token's sum over its valid slots of weight * its expert's output row, accumulated in
    fp32 and rounded once to ``expert_out``'s dtype. No host read: the splits come from the dispatch."""
    tokens_n, hidden = topk_weights.shape[0], expert_out.shape[1]
    back = expert_out.index_select(0, handle.by_source)
    got = expert_out.new_empty((sum(handle.from_owner), hidden))
    row_bytes = hidden * expert_out.element_size()
    dist.all_to_all_single(_bytes(got), _bytes(back), [n * row_bytes for n in handle.from_owner],
                           [n * row_bytes for n in handle.to_source], group=handle.group)
    weight = topk_weights.float().reshape(-1).index_select(0, handle.returned_slot)
    out = torch.zeros((tokens_n, hidden), dtype=torch.float32, device=expert_out.device)
    out.index_add_(0, handle.returned_token, got * weight[:, None])
    return out.to(expert_out.dtype)


class HostSyncCount:
    """Synchronising CUDA calls in a ``with`` block, as torch's sync debug mode reports them
    (``torch.cuda.set_sync_debug_mode("warn")``: a D2H copy such as ``.tolist()``, ``.item()``, nonzero,
    a synchronous H2D copy, a stream or device synchronise). ``count`` is set on exit."""

    count: int | None = None

    def __enter__(self):
        self._caught = warnings.catch_warnings(record=True)
        self._records = self._caught.__enter__()
        warnings.simplefilter("always")
        self._previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(self._previous)
        self._caught.__exit__(*exc)
        self.count = sum("synchronizing CUDA operation" in str(w.message) for w in self._records)
        return False
