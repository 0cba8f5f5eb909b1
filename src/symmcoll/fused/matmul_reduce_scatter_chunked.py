"""matmul_reduce_scatter's "chunked" algorithm: cuBLAS on row chunks, each chunk's product pulled by its
owner with the copy engine while the next chunk's GEMM runs, then one fp32 sum per owner.

Rank r's output is rows [r R, (r+1) R) of sum over ranks of A_k @ B_k (R = M / W): the chunk of rank t is
A[t R : (t+1) R] @ B on every rank, and rank t adds the W partials. In step s = 0 .. W-2 every rank r
computes the chunk of target t = r+s+1 (peers first, its own last) and is read by t; in the same step it
reads the chunk that source q = r-s-1 computed for it (a permutation: each rank sends to one peer and
receives from one per step, as all_to_all.copy_engine does)::

    rank r, unit u = (step s, piece j), slot = u % 2 of r's shared buffer:
      main:  torch.matmul(A[t's rows of piece j], B, out=slot)               (cuBLAS, local writes)
             [wait for my side stream: my copy of unit u-1 is done]
             barrier kernel u                                               (every rank: GEMM u, copy u-1 done)
      side:  [wait for main]  stack[q][piece j] <-- q's slot   (copy engine, NVLink read, under GEMM u+1)
    main:    torch.matmul(A[my rows], B, out=stack[r])                      (own chunk, last)
    side:    exit barrier kernel                                            (every copy of every rank done)
    main:    [wait for my last copy]  out = narrow(sum over k in rank order of stack[k])   (fp32, one kernel)
             [wait for side: the exit barrier]

Products larger than a slot go in pieces of rows (units; every rank cuts alike), a barrier each.

Why it is correct under concurrency. Barrier kernels are the one-program all-to-all barrier of
language/barrier.py (bounded waits, the call descriptor checked: a peer in another call is reported,
never summed); every rank launches the same sequence of them (P step barriers on main, then the exit
barrier on side after the last step's copy, and the next call's barriers on main after main has joined
side), so the k-th barrier of every rank meets the k-th of its peers.
* Ready: rank t copies q's slot of unit u only after barrier u, which q enters after its GEMM of unit u
  (stream order on q's main stream); the barrier's release/acquire at system scope orders the data, as
  for every barrier-based kernel, and the copy follows the barrier on t's side stream.
* Reuse within a call: rank r's GEMM of unit u+1 overwrites slot (u+1) % 2, last read by rank t's copy
  of unit u-1. r launches that GEMM after its barrier u, which passes only once every rank entered
  barrier u, and each rank's main stream waited for its side stream's copy of unit u-1 before entering.
* Reuse across calls (the exit barrier): every rank's side stream runs all its copies, then the exit
  barrier; the next call's first write into a slot (its GEMM of unit 0) comes after main has joined side,
  i.e. after the exit barrier passed, i.e. after every rank's last copy. The shared buffer is used as
  its rule says (memory/regions.py BUFFER: peers read it only between this call's barriers and the exit
  barrier ends every use), so any algorithm may follow.
* Graphs: no host state, fixed addresses (the buffer, the stack allocated in the call's stream), no
  host synchronisation, the side stream forked from and joined to the capturing stream; the symmetric
  workspace never grows (products larger than a slot go in more units).
The exit barrier runs on the side stream so that its latency hides under the own chunk's GEMM and the
sum; the sum waits on an event after the last copy, not on the barrier.

Numbers: each partial is cuBLAS's output (rounded once to the output dtype, as torch.matmul's is);
the owner sums the W partials in fp32 in rank order and rounds once (narrow): deterministic, and what
the fused and unfused paths compute. Traffic: (W-1)/W of the product per rank over NVLink, by copy
engines (no SM); locally, the sum reads W chunks and writes one.

Where it should win: large M, where a chunk's GEMM (M/W rows) runs at cuBLAS's speed and lasts longer
than one chunk's copy (4x H100, 8192 x 8192 x 7168 a rank: ~336 us of GEMM against ~100 us of copy a
step). It reads B once per chunk (W times a call): small M, where reading B bounds the GEMM, is not its
regime (torch.ops.symm_mem.fused_matmul_reduce_scatter, the same idea on two streams with two barriers
a step, loses 2.6-5x to the unfused path there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..comm.common import cdiv, on_side, side_stream
from ..language import narrow
from ..launcher import launch
from ..plan import Plan

# Two slots in the shared buffer: the GEMM of unit u+1 writes one while the peer copies the other.
SLOTS = 2
# CPU slots are small, so that the CPU tests run products of several pieces.
CPU_SLOT_BYTES = 8 << 10
PAGE = 4096
# The sum's launch, (values a program, warps): on GPU a program per 4096 values (W loads of 8 KB in bf16 at
# once; untuned); on CPU few programs (each costs the interpreter ~0.7 ms).
SUM_LAUNCH = {"cuda": (4096, 8), "cpu": (16384, 4)}


@dataclass(frozen=True)
class Cut:
    """How a call's chunks travel: ``rows`` per chunk (M / W), ``piece_rows`` a unit (what a slot holds),
    slots ``slot_bytes`` apart in the shared buffer."""

    rows: int
    piece_rows: int
    slot_bytes: int

    def units(self, world: int) -> list[tuple[int, int, int]]:
        """(step, first row, rows) of every unit, in order (the same on every rank): steps 0 .. W-2
        (the peers' chunks), each in pieces of ``piece_rows``."""
        return [(step, first, min(self.piece_rows, self.rows - first))
                for step in range(world - 1) for first in range(0, self.rows, self.piece_rows)]


def cut(rows: int, row_bytes: int, device_type: str, buffer_bytes: int) -> Cut | None:
    """The units of a product with ``rows`` rows a chunk of ``row_bytes`` each; None where one row does
    not fit a slot (half the shared buffer; the caller runs the unfused path then)."""
    budget = CPU_SLOT_BYTES if device_type != "cuda" else buffer_bytes // SLOTS
    piece_rows = min(rows, max(1, budget // max(1, row_bytes)))
    slot_bytes = cdiv(piece_rows * row_bytes, PAGE) * PAGE
    if SLOTS * slot_bytes > buffer_bytes:
        return None
    return Cut(rows, piece_rows, slot_bytes)


@triton.jit
def _sum_block(parts_ptr, out_ptr, offs, mask, numel, WORLD: tl.constexpr):
    acc = tl.load(parts_ptr + offs, mask=mask).to(tl.float32)
    for r in tl.static_range(1, WORLD):
        acc += tl.load(parts_ptr + tl.cast(numel, tl.int64) * r + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + offs, narrow(acc, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_partials_kernel(
    # parts: WORLD rows of numel elements, one per rank, in rank order; out: numel elements
    parts_ptr, out_ptr, numel,
    WORLD: tl.constexpr, BLOCK: tl.constexpr,
):
    """out = sum over the WORLD partials in rank order, in fp32, rounded once; program pid takes block
    pid (a whole block unmasked: 16-byte accesses; the last one masked)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= numel:
        _sum_block(parts_ptr, out_ptr, offs, tl.full([BLOCK], 1, tl.int1), numel, WORLD)
    else:
        _sum_block(parts_ptr, out_ptr, offs, offs < numel, numel, WORLD)


def _sum(parts: torch.Tensor, out: torch.Tensor, world: int) -> None:
    block, warps = SUM_LAUNCH["cpu" if parts.device.type == "cpu" else "cuda"]
    launch(sum_partials_kernel, (max(1, cdiv(out.numel(), block)),), (parts, out, out.numel()),
           dict(WORLD=world, BLOCK=block, num_warps=warps))


def run(p: Plan, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, units: Cut) -> torch.Tensor:
    """``out`` [M / W, N] = this rank's rows of the sum over ranks of ``a`` [M, K] @ ``b`` [K, N] (b
    row-major or nn.Linear's W.t(); torch.matmul reads either), in the units of ``units``."""
    ws, world, rank = p.ws, p.world, p.rank
    rows, n = units.rows, b.shape[1]
    if world == 1:
        return torch.matmul(a, b, out=out)
    row_bytes = n * a.element_size()
    parts = torch.empty((world, rows, n), dtype=a.dtype, device=a.device)
    side = side_stream(p, a.device)
    main = torch.cuda.current_stream(a.device) if side is not None else None

    for u, (step, first, count) in enumerate(units.units(world)):
        target, source = (rank + step + 1) % world, (rank - step - 1) % world
        at, nbytes = (u % SLOTS) * units.slot_bytes, count * row_bytes
        slot = ws.buffer[at:at + nbytes].view(a.dtype).view(count, n)
        torch.matmul(a[target * rows + first:][:count], b, out=slot)
        if side is not None and u > 0:
            main.wait_stream(side)  # my copy of unit u-1 is done before I enter barrier u (slot reuse)
        p.barrier()
        theirs = ws.peer_buffer(source)[at:at + nbytes].view(a.dtype).view(count, n)
        with on_side(side, main):
            parts[source, first:first + count].copy_(theirs)
    torch.matmul(a[rank * rows:(rank + 1) * rows], b, out=parts[rank])
    if side is None:
        p.barrier()  # exit: nobody rewrites a slot (next call) while a peer still copies from it
    else:
        copied = torch.cuda.Event()
        copied.record(side)
        with torch.cuda.stream(side):
            p.barrier()  # exit, beside the own chunk's GEMM and the sum
        main.wait_event(copied)
    _sum(parts, out, world)
    if side is not None:
        main.wait_stream(side)
    return out
