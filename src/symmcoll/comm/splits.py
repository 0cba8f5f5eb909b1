"""The all-to-all family's shared host side (no algorithm lives here): the shape rule for every kind of
splits, what "auto" runs where the tuned table has no rule, the split exchange that host-side splits
need to size the output, and the planning of rounds when chunks do not fit a region at once.

Three kinds of splits (``Request.splits``):

* ``None``: equal chunks, x.shape[0] divisible by W; the output has x's shape.
* a tuple of W ints (rows this rank sends to each rank, summing to x.shape[0]): the output's row count
  depends on the peers' splits, so the ranks first exchange them (``exchange_splits``: a W-word gather
  kernel over the workspace whose barriers carry the call descriptor) and the host reads the matrix back:
  one device-to-host synchronisation.
* ``DEVICE_SPLITS``: an int tensor of W counts on x's device (``others[0]``) and the caller's bound
  ``max_rows`` (``options``): the output has max_rows rows and the kernels return the rows received from
  each rank as a device tensor; nothing is read back (CUDA-graph capturable). The kernels publish the
  counts themselves. max_rows is part of the call descriptor: every rank passes the same.
"""

from __future__ import annotations

import math
import operator

import torch
import triton.language as tl
import triton

from ..language import MAX_WORLD, announce, block_barrier, copy_blocks, peer_ptr, tee_blocks
from ..launcher import launch
from ..memory.persistent_state import persistent
from ..ops import OpSpec, declare, resolve_group, world_size
from ..plan import DEVICE_SPLITS, Plan, Request, algorithms, resolve

# "auto" where the tuned table has no rule: the barrier-free kernel for small exchanges, the copy
# engines for the largest, the pull kernel between (bytes per rank; to be replaced by a GPU tune).
SENTINEL_MAX_BYTES = 256 << 10
COPY_ENGINE_MIN_BYTES = 64 << 20


def option(request: Request, name: str, default=None):
    return dict(request.options).get(name, default)


def row_bytes(request: Request) -> int:
    return math.prod(request.shape[1:]) * request.dtype.itemsize


def all_to_all_shape(request: Request, world: int) -> tuple[tuple | None, dict]:
    """(output shape or None when only the peers know it, the fields every rank's call agrees on: with
    splits, the row counts differ between ranks and are not among them)."""
    shape = request.shape
    if len(shape) == 0:
        raise ValueError("x must have at least one dimension (rows are exchanged along dim 0), got a 0-dim tensor")
    if request.splits is None:
        if option(request, "max_rows") is not None:
            raise ValueError("max_rows is for splits given as a device tensor; equal splits need no bound")
        if shape[0] % world:
            raise ValueError(f"x.shape[0] must be divisible by the world size for equal splits: x has shape {shape}, "
                             f"world size {world} (or pass splits=)")
        return shape, {"x.shape": shape}
    if request.splits == DEVICE_SPLITS:
        max_rows = _check_device_splits(request, world)
        return (max_rows, *shape[1:]), {"x.shape[1:]": shape[1:], "splits": "a tensor", "max_rows": max_rows}
    if option(request, "max_rows") is not None:
        raise ValueError("max_rows is for splits given as a device tensor; with a list of splits the output is "
                         "sized exactly")
    check_splits(request.splits, shape[0], world)
    return None, {"x.shape[1:]": shape[1:], "splits": "a list"}


def _check_device_splits(request: Request, world: int) -> int:
    (shape, dtype, device), = request.others[:1] or ((None, None, None),)
    if shape != (world,) or dtype not in (torch.int32, torch.int64):
        raise ValueError(f"splits must be an int32/int64 tensor of shape ({world},) (rows sent to each rank), got "
                         f"{dtype} of shape {shape}")
    if device != request.device:
        raise ValueError(f"splits must be on x's device ({request.device}), got {device}")
    max_rows = option(request, "max_rows")
    try:
        max_rows = operator.index(max_rows)
    except TypeError:
        raise ValueError(f"max_rows must be an int (the most rows this rank can receive) when splits is a tensor, "
                         f"got {max_rows!r}") from None
    if max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    return max_rows


def check_splits(splits, rows: int, world: int) -> None:
    try:
        values = [operator.index(s) for s in splits]
    except TypeError:
        raise ValueError(f"splits must be a list of {world} ints (rows sent to each rank), got {splits!r}") from None
    if len(values) != world:
        raise ValueError(f"splits must have one entry per rank ({world}), got {len(values)}: {values}")
    if min(values) < 0:
        raise ValueError(f"splits must be >= 0, got {values}")
    if sum(values) != rows:
        raise ValueError(f"splits must sum to x.shape[0] = {rows}, got {values} (sum {sum(values)})")


def default_all_to_all(request: Request, world: int) -> str:
    """What "auto" runs without a table rule, by the bytes each rank receives at most."""
    known = algorithms("all_to_all")
    rows = option(request, "max_rows") if request.splits == DEVICE_SPLITS else request.shape[0]
    nbytes = rows * row_bytes(request)
    if nbytes <= SENTINEL_MAX_BYTES and "sentinel" in known:
        return "sentinel"
    if nbytes >= COPY_ENGINE_MIN_BYTES and request.splits != DEVICE_SPLITS and "copy_engine" in known:
        return "copy_engine"
    return "pull"


def all_to_all_impl(x, group_name: str, splits, algorithm: str):
    return resolve("all_to_all", x, resolve_group(group_name), algorithm,
                   splits=None if splits is None else tuple(splits)).execute(x)


def all_to_all_splits_impl(x, splits, max_rows: int, group_name: str, algorithm: str):
    """Device-side splits: (out [max_rows, ...], rows received from each rank [W] int64)."""
    return resolve("all_to_all", x, resolve_group(group_name), algorithm, splits=DEVICE_SPLITS, others=(splits,),
                   options=(("max_rows", max_rows),)).execute(x, others=(splits,))


def _all_to_all_fake(x, group_name, splits, algorithm):
    if splits is None:
        return torch.empty_like(x, memory_format=torch.contiguous_format)
    rows = torch.library.get_ctx().new_dynamic_size()  # what the peers send: known only at run time
    return x.new_empty((rows, *x.shape[1:]))


def _all_to_all_splits_fake(x, splits, max_rows, group_name, algorithm):
    return x.new_empty((max_rows, *x.shape[1:])), splits.new_empty((world_size(group_name),), dtype=torch.int64)


# With splits, a rank may send or receive nothing while its peers do: the kernels run (and exchange
# counts) whatever this rank's input. Equal splits of an empty x are empty on every rank.
ALL_TO_ALL = declare(OpSpec(
    "all_to_all", "(Tensor x, str group_name, int[]? splits, str algorithm) -> Tensor", all_to_all_impl,
    _all_to_all_fake, inputs=("x", "splits"), shape_rule=all_to_all_shape, default=default_all_to_all,
    runs_when_empty=lambda request: request.splits is not None))
ALL_TO_ALL_SPLITS = declare(OpSpec(  # runs all_to_all's plans
    "all_to_all_splits", "(Tensor x, Tensor splits, int max_rows, str group_name, str algorithm) -> (Tensor, Tensor)",
    all_to_all_splits_impl, _all_to_all_splits_fake))


@triton.jit
def exchange_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the shared buffer's address table
    desc, buffer_ptrs_dev,
    # my splits (WORLD int64) -> row ``rank`` of the [WORLD, WORLD] matrix
    splits_ptr, matrix_ptr,
    WORLD: tl.constexpr,
):
    """Every rank's splits into every rank's matrix: copy in, barrier, read every peer, exit barrier."""
    announce(signal_pad_ptrs_dev, desc, rank, WORLD)
    tee_blocks(splits_ptr, peer_ptr(buffer_ptrs_dev, rank, tl.int64), matrix_ptr + rank * WORLD, WORLD, MAX_WORLD)
    if block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD) == 0:
        for k in tl.static_range(1, WORLD):
            peer = (rank + k) % WORLD
            copy_blocks(peer_ptr(buffer_ptrs_dev, peer, tl.int64), matrix_ptr + peer * WORLD, WORLD, MAX_WORLD)
        block_barrier(signal_pad_ptrs_dev, rank, desc, status_ptr, max_spins, WORLD)


def exchange_splits(plan: Plan, splits, device: torch.device) -> list[list[int]]:
    """Every rank's splits as a host matrix (rows s -> j): one launch and one host synchronisation."""
    ws, world = plan.ws, plan.world
    mine = torch.tensor(list(splits), dtype=torch.int64, device=device)
    matrix = torch.empty((world, world), dtype=torch.int64, device=device)
    launch(exchange_kernel, (1,), (*ws.kernel_args, plan.desc, ws.buffer_ptrs_dev, mine, matrix),
           dict(WORLD=world, num_warps=1))
    if matrix.device.type == "meta":  # recording launches for the compile checks: nothing ran
        return [list(splits)] * world
    host = matrix.tolist()  # the host sync: the output's row count depends on the peers' splits
    ws.check()  # a peer with rows of another size or dtype made another call: raise before using it
    return host


def split_matrix(plan: Plan, x: torch.Tensor) -> list[list[int]] | None:
    """The host's split matrix (equal splits: without communication), or None for device splits."""
    splits, world = plan.request.splits, plan.world
    if splits is None:
        return [[x.shape[0] // world] * world for _ in range(world)]
    if splits == DEVICE_SPLITS:
        return None
    return exchange_splits(plan, splits, x.device)


def splits_tensor(plan: Plan, matrix: list[list[int]], device: torch.device) -> torch.Tensor:
    """This rank's splits as a device tensor, made once per plan (host-side splits are part of the plan)."""
    cached = plan.cache.get("splits_dev")
    if cached is None:
        cached = plan.cache["splits_dev"] = persistent(
            device, lambda: torch.tensor(matrix[plan.rank], dtype=torch.int64, device=device))
    return cached


def scratch_counts(plan: Plan, device: torch.device) -> torch.Tensor:
    """Where kernels write the received counts when the caller did not ask for them."""
    cached = plan.cache.get("recv_dev")
    if cached is None:
        cached = plan.cache["recv_dev"] = persistent(
            device, lambda: torch.empty(plan.world, dtype=torch.int64, device=device))
    return cached


def exchange_outputs(plan: Plan, x: torch.Tensor, out: torch.Tensor | None, matrix, splits_dev: torch.Tensor | None):
    """(out, received counts, max_rows, this rank's splits on the device) of an all-to-all call. Device
    splits (``matrix`` None): the caller's out of max_rows rows and splits, and a counts tensor of its
    own (returned to the caller); host splits: out sized exactly (allocated if None), the plan's splits
    tensor and scratch counts."""
    if matrix is None:
        return out, torch.empty(plan.world, dtype=torch.int64, device=x.device), out.shape[0], splits_dev
    max_rows = sum(matrix[s][plan.rank] for s in range(plan.world))
    if out is None:
        out = torch.empty((max_rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return out, scratch_counts(plan, x.device), max_rows, splits_tensor(plan, matrix, x.device)


def plan_rounds(words: list[list[int]], capacity: int, align: int = 1) -> tuple[int, int]:
    """(piece_len, rounds) for chunk sizes ``words[s][j]`` (words rank s sends to rank j).

    piece_len is the longest multiple of ``align`` such that every rank's staged pieces (its chunks
    for peers, each cut to piece_len) fit in ``capacity`` words; rounds covers the longest chunk.
    When every chunk is a multiple of ``align``, so is every piece and every offset."""
    world = len(words)
    peers = [[words[s][j] for j in range(world) if j != s] or [0] for s in range(world)]
    longest = max(max(p) for p in peers)

    def staged(length: int) -> int:
        return max(sum(min(n, length) for n in p) for p in peers)

    if staged(longest) <= capacity:
        piece = longest
    else:
        # In units of align: staged(lo * align) <= capacity < staged(hi * align).
        lo, hi = capacity // max(1, world - 1) // align, -(-longest // align)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if staged(mid * align) <= capacity else (lo, mid)
        piece = lo * align
    piece = max(piece, align)
    return piece, max(1, -(-longest // piece))


def bounded_rounds(max_words: int, capacity: int, world: int, align: int = 1) -> tuple[int, int]:
    """(piece_len, rounds) when only a bound on every chunk is known (device splits: a chunk holds at
    most max_rows rows, the bound every rank passes): pieces of every chunk for W-1 peers fit ``capacity``."""
    piece = max(align, capacity // max(1, world - 1) // align * align)
    piece = min(piece, max(align, -(-max_words // align) * align))
    return piece, max(1, -(-max_words // piece))
