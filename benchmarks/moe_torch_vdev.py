"""benchmarks/moe_bench.py's torch_vdev baseline: torch's all_to_all_vdev_2d (dispatch) and
all_to_all_vdev_2d_offset (combine) on NVSHMEM symmetric memory.

torch keeps one symmetric-memory backend per process (torch/csrc/distributed/c10d/symm_mem/
SymmetricMemory.cpp, AllocatorMap; the GPU image's torch 2.11 raised exactly its message):
``get_allocator`` -- called by every ``symm_mem.empty``, ``rendezvous``, ``is_symm_mem_tensor`` and
``has_multicast_support`` -- marks the backend in use, and ``set_backend`` to another backend then
raises "Backend can not be changed after use.". symmcoll's workspace (memory/cuda.py) and
memory/torch_buffers.py allocate with the default CUDA backend, so this baseline runs in rank processes
of its own in which ``TorchSymmMem.select_nvshmem`` is the first symmetric-memory action. torch's NVSHMEM
allocator keeps every rendezvoused allocation (and a signal pad per rendezvous) until exit, so the
buffers are allocated once, at the largest case, and viewed from offset 0 per case; NVSHMEM's heap
(NVSHMEM_SYMMETRIC_SIZE, 1 GiB by default) is sized for them before the first allocation initialises
NVSHMEM. Multicast stays off (NVSHMEM_DISABLE_NVLS=1).
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

VDEV = "torch_vdev"
# NVSHMEM's symmetric heap beyond the baseline's buffers (its signal pads, one per rendezvous).
HEAP_MARGIN_BYTES = 256 << 20
# Every local expert's bin in the dispatch output starts at a multiple of this many rows, and an empty
# expert still gets that many (torch pads it: grouped GEMMs refuse empty groups); 1: rows packed.
MAJOR_ALIGN = 1


class TorchSymmMem:
    """What the torch_vdev baseline calls in torch: its NVSHMEM symmetric memory and all_to_all_vdev_2d
    (dispatch) / all_to_all_vdev_2d_offset (combine). Only ranks that allocate no other symmetric memory
    may use it (module docstring)."""

    def unavailable(self, device: torch.device) -> str | None:
        """Why the baseline cannot run here, or None."""
        if device.type != "cuda":
            return f"torch's all_to_all_vdev_2d needs CUDA and NVSHMEM (device {device.type})"
        import torch.distributed._symmetric_memory as symm_mem
        if not hasattr(symm_mem, "set_backend") or not hasattr(torch.ops.symm_mem, "all_to_all_vdev_2d_offset"):
            return f"torch {torch.__version__} has no NVSHMEM symmetric-memory backend or all_to_all_vdev_2d ops"
        if not symm_mem.is_nvshmem_available():
            return f"torch {torch.__version__} cannot load NVSHMEM (is_nvshmem_available() is False)"
        return None

    def select_nvshmem(self, device: torch.device, heap_bytes: int) -> None:
        """The process's first symmetric-memory action: NVSHMEM as the backend, its heap large enough for
        the largest case (read when the first allocation initialises NVSHMEM), multicast off."""
        from symmcoll.memory.cuda import disable_multicast_env
        import torch.distributed._symmetric_memory as symm_mem

        disable_multicast_env()
        os.environ.setdefault("NVSHMEM_SYMMETRIC_SIZE", str(heap_bytes))
        symm_mem.set_backend("NVSHMEM")
        backend = getattr(symm_mem, "get_backend", lambda d: "NVSHMEM")(device)
        if backend != "NVSHMEM":
            raise RuntimeError(f"set_backend('NVSHMEM') left the backend at {backend}")
        if hasattr(symm_mem, "enable_symm_mem_for_group"):  # as memory/cuda.py: needed before torch 2.9
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                symm_mem.enable_symm_mem_for_group(dist.group.WORLD.group_name)  # NVSHMEM bootstraps on it

    def empty(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        import torch.distributed._symmetric_memory as symm_mem
        return symm_mem.empty(numel, dtype=dtype, device=device)

    def dispatch(self, inp, out, in_splits, out_splits_offsets, group_name) -> None:
        torch.ops.symm_mem.all_to_all_vdev_2d(inp, out, in_splits, out_splits_offsets, group_name,
                                              major_align=MAJOR_ALIGN)

    def combine(self, inp, out, in_splits_offsets, out_splits_offsets, group_name) -> None:
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(inp, out, in_splits_offsets, out_splits_offsets, group_name)


def output_rows(tokens_n, experts, k, world) -> int:
    """Rows torch_vdev's dispatch output must hold: every slot of every rank (its op does not check
    bounds), plus MAJOR_ALIGN for each local expert (the padding of its bin)."""
    return tokens_n * k * world + MAJOR_ALIGN * (experts // world)


class VdevBuffers:
    """torch_vdev's symmetric buffers, allocated once at the largest case and viewed from offset 0 per
    case: input, reply and returned rows ([slots or capacity, H] bf16) and three split tables."""

    def __init__(self, api, cases, world, device):
        slot_elements, capacity_elements, splits = self.largest(cases, world)
        self.inp, self.back = (api.empty(slot_elements, torch.bfloat16, device) for _ in range(2))
        self.out, self.reply = (api.empty(capacity_elements, torch.bfloat16, device) for _ in range(2))
        self.in_splits = api.empty(splits, torch.int64, device)
        self.out_splits, self.back_splits = (api.empty(2 * splits, torch.int64, device) for _ in range(2))

    @staticmethod
    def largest(cases, world) -> tuple[int, int, int]:
        """(elements of a [slots, H] buffer, of a [capacity, H] buffer, split entries) over ``cases``."""
        return (max(t * k * h for t, h, e, k in cases),
                max(output_rows(t, e, k, world) * h for t, h, e, k in cases),
                max(e for t, h, e, k in cases))

    @staticmethod
    def heap_bytes(cases, world) -> int:
        slot_elements, capacity_elements, splits = VdevBuffers.largest(cases, world)
        return 2 * 2 * (slot_elements + capacity_elements) + 5 * 8 * splits + HEAP_MARGIN_BYTES


class TorchVdev:
    """torch's all_to_all_vdev_2d (NVSHMEM): rows sorted by global expert, one per (token, slot); the
    receiver gets them by local expert, then source rank; the reply goes back with
    all_to_all_vdev_2d_offset and is weighted and summed per token. The same methods as moe_bench's
    Symmcoll and Nccl."""
    name, graph = VDEV, True

    def __init__(self, tokens, ids, weights, experts, buffers: VdevBuffers, api):
        self.tokens, self.ids, self.weights, self.experts = tokens, ids, weights, experts
        self.api, self.group = api, dist.group.WORLD.group_name
        self.world = dist.get_world_size()
        slots, hidden = ids.numel(), tokens.shape[1]
        rows = output_rows(tokens.shape[0], experts, ids.shape[1], self.world)
        self.inp = buffers.inp[: slots * hidden].view(slots, hidden)
        self.back = buffers.back[: slots * hidden].view(slots, hidden)
        self.out = buffers.out[: rows * hidden].view(rows, hidden)
        self.reply = buffers.reply[: rows * hidden].view(rows, hidden)
        self.in_splits = buffers.in_splits[:experts]
        self.out_splits = buffers.out_splits[: 2 * experts].view(2, experts)  # by (local expert, source)
        self.back_splits = buffers.back_splits[: 2 * experts].view(2, experts)

    def dispatch(self):
        flat = self.ids.reshape(-1)
        self.order = torch.sort(flat, stable=True).indices  # slots by global expert
        self.inp.copy_(self.tokens[self.order // self.ids.shape[1]])
        self.in_splits.zero_().scatter_add_(0, flat, torch.ones_like(flat))  # no host sync (bincount has one)
        self.api.dispatch(self.inp, self.out, self.in_splits, self.out_splits, self.group)
        return self.out, self.out_splits[0], None

    def set_expert_out(self, expert_out):
        self.reply.copy_(expert_out)  # where the expert GEMM would write: not part of the timed combine

    def combine(self):
        # in_splits_offsets of the reply = what dispatch received (per local expert and source)
        self.api.combine(self.reply, self.back, self.out_splits, self.back_splits, self.group)
        rows = torch.empty_like(self.back)
        rows[self.order] = self.back
        k = self.ids.shape[1]
        return (rows.float().reshape(-1, k, rows.shape[1]) * self.weights.float()[..., None]).sum(1).to(rows.dtype)

    def in_oracle_layout(self, recv, counts):
        splits, offsets = self.out_splits.tolist()
        index = torch.cat([torch.arange(o, o + n) for n, o in zip(splits, offsets)]).to(recv.device)
        local = torch.tensor(splits, device=recv.device).view(-1, self.world).sum(1)
        return recv[index], local

    def forget_outputs(self):
        for t in (self.out, self.back):
            t.view(torch.int16).fill_(-1)  # bf16 NaN
        self.out_splits.fill_(-1)
        self.back_splits.fill_(-1)
