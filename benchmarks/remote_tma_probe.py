"""Does a device-side TMA descriptor (tl.make_tensor_descriptor) work over a peer's mapped memory?

Every rank fills its workspace buffer with a rank-coded pattern, a barrier, then a kernel builds a
descriptor over the *next* rank's buffer (the address from the workspace's address table) and copies a
[64, 64] tile out of it with a TMA load. The answer is whether the tile equals the peer's pattern.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import symmcoll
from symmcoll.fused.gemm import ensure_tma_allocator
from symmcoll.language import peer_ptr


@triton.jit
def tma_peer_load_kernel(buffer_ptrs_dev, peer, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    base = peer_ptr(buffer_ptrs_dev, peer, tl.bfloat16)
    desc = tl.make_tensor_descriptor(base, shape=[ROWS * 4, COLS], strides=[COLS, 1], block_shape=[ROWS, COLS])
    tile = desc.load([ROWS, 0])  # the second block of rows
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    tl.store(out_ptr + r[:, None] * COLS + c[None, :], tile)


def probe(rank: int, world: int) -> dict:
    ws = symmcoll.get_workspace()
    rows, cols = 64, 64
    pattern = lambda r: (torch.arange(4 * rows * cols, device="cuda") % 251 + r).to(torch.bfloat16)
    ws.buffer[: 4 * rows * cols * 2].view(torch.bfloat16).copy_(pattern(rank))
    torch.cuda.synchronize()
    dist.barrier()
    peer = (rank + 1) % world
    out = torch.zeros(rows, cols, dtype=torch.bfloat16, device="cuda")
    ensure_tma_allocator()
    try:
        tma_peer_load_kernel[(1,)](ws.buffer_ptrs_dev, peer, out, ROWS=rows, COLS=cols)
        torch.cuda.synchronize()
        want = pattern(peer).view(4 * rows, cols)[rows:2 * rows]
        result = {"peer": peer, "equal": bool(torch.equal(out, want)), "error": None}
    except Exception as exc:  # noqa: BLE001
        result = {"peer": peer, "equal": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    dist.barrier()
    return result
