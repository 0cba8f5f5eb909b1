"""The cross-node exchange: the one kernel that moves bytes between nodes, for every hierarchical algorithm.

Rank (n, l) -- local rank l of node n -- exchanges only with its *counterparts* (m, l), the ranks of the
same local rank on the other nodes, and only through the transport (language/transport.py: put with
signal, bounded signal wait). What it sends node m is ``stage + m * send_stride`` (a symmetric region,
``piece_len`` elements); what node m sends it lands in its receive slots. One launch, one or two rounds::

    round 0   put piece m of my stage -> slot [set][0][n] of (m, l), signal [set][0][pid][n]   for m != n
              wait signal [set][0][pid][m]                                                    for m != n
      GATHER        out[m] := slot [set][0][m] (my own piece from the stage)   all_gather, all_to_all
      REDUCE        out := op over m of piece n of node m (node order, fp32)   reduce_scatter
      ALL_REDUCE    the same into out[n] and back into my stage's piece n, then
    round 1   put piece n of my stage -> slot [set][1][n] of (m, l), signal [set][1][pid][n]   for m != n
              wait, out[m] := slot [set][1][m]                                                 all_reduce
    GET_GATHER (pulls instead of puts; all_gather.hierarchical_get):
    round 0   signal [set][0][pid][n] of (m, l) ("my stage is ready"), wait for theirs, get piece n of
              (m, l)'s stage into my slot [set][0][m], out[m] := it
    round 1   signal [set][1][pid][n] of (m, l) ("done reading yours"), wait for theirs: nobody refills
              a stage a counterpart still reads

Every byte crosses the node boundary once (per destination node); ALL_REDUCE is a reduce-scatter and an
all-gather among the N counterparts: 2 (N-1)/N of the node shard on the network per rank.

Work split: program ``pid`` owns elements [pid * span, (pid + 1) * span) of every piece, sends them with
one put and signals slot ``pid``: program pid waits only on program pid of its counterparts. Signals are
``(epoch << 32) | desc`` (the launch epoch from this family's per-rank table, the call descriptor), in
two slot sets (``epoch % 2``), never reset: a counterpart can be one launch ahead at most (finishing a
launch needs every counterpart's data of that launch), so it writes the other set. A signal of this
epoch with another descriptor is a counterpart that made a different call: recorded, nothing reduced.
Every wait is bounded (the workspace's budget); a failed round skips the next.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..language import EPOCH_SLOTS, combine, end_launch, launch_epoch, narrow
from ..language.transport import get, put_signal, send_signal, signal_value, wait_signal
from ..launcher import launch
from ..memory.regions import RegionSpec, declare
from ..plan import CPU_CONFIG, Plan
from .common import cdiv

GATHER, REDUCE, ALL_REDUCE, GET_GATHER = 0, 1, 2, 3
MODES = {"gather": GATHER, "reduce": REDUCE, "all_reduce": ALL_REDUCE, "get_gather": GET_GATHER}
# Programs of one exchange launch (signal slots are per program).
MAX_PROGRAMS: tl.constexpr = tl.constexpr(32)
# Receive slots of all sets, rounds and nodes together: a piece per launch is this / (4 * nodes).
SLOT_BYTES = {"cuda": 64 << 20, "cpu": 32 << 10}
_PAGE = 4096


def piece_bytes(g) -> int:
    """Bytes of one piece (what a rank sends one node per launch) in a workspace of geometry ``g``."""
    if g.nodes < 2:
        return 0
    return max(_PAGE, SLOT_BYTES[g.device_type] // (4 * g.nodes) // _PAGE * _PAGE)


SIGNALS = declare(RegionSpec(
    "exchange.signals", "exchange", lambda g: 0 if g.nodes < 2 else 2 * 2 * MAX_PROGRAMS.value * g.nodes * 8,
    "int64 (epoch << 32 | desc) per (set, round, program, source node), written only by the source's puts "
    "(set epoch % 2); never reset"))
SLOTS = declare(RegionSpec(
    "exchange.slots", "exchange", lambda g: 4 * g.nodes * piece_bytes(g),
    "[set][round][source node] pieces, written by the source's put of launch epoch e into set e % 2 and read by "
    "this rank in the same launch; the source writes that set again only two launches later"))
STAGE = declare(RegionSpec(
    "exchange.stage", "exchange", lambda g: g.nodes * piece_bytes(g),
    "[node] what this rank sends each node; written by this rank (host copies, node-local kernels) before an "
    "exchange launch and read by its own puts (which return once the source is copied out)"))
EPOCHS = declare(RegionSpec("exchange.epochs", "exchange", lambda g: EPOCH_SLOTS.value,
                            "this rank's launch-epoch table (kernels only)", symmetric=False))


@triton.jit
def _slot(slots_ptr, slot_set, round_, node, nodes, slot_stride):
    return slots_ptr + tl.cast((slot_set * 2 + round_) * nodes + node, tl.int64) * slot_stride


@triton.jit
def _signal(signals_ptr, slot_set, round_, node, nodes):
    return signals_ptr + ((slot_set * 2 + round_) * MAX_PROGRAMS + tl.program_id(0)) * nodes + node


@triton.jit
def _send_round(transport_ptrs_dev, signals_ptr, slots_ptr, stage_ptr, start, n, send_stride, slot_stride, slot_set,
                round_, value, rank, node, nodes, local, ranks_per_node, TRANSPORT: tl.constexpr,
                BLOCK: tl.constexpr, SEND_OWN: tl.constexpr):
    """Put my span of the piece for each other node (piece m, or my own piece n if SEND_OWN) into my slot
    there, with its signal; nodes taken from n + 1 on, so the counterparts are not all hit at once."""
    for k in range(1, nodes):
        m = (node + k) % nodes
        piece = node if SEND_OWN else m
        put_signal(_slot(slots_ptr, slot_set, round_, node, nodes, slot_stride) + start,
                   stage_ptr + tl.cast(piece, tl.int64) * send_stride + start, n,
                   _signal(signals_ptr, slot_set, round_, node, nodes), value, m * ranks_per_node + local,
                   transport_ptrs_dev, rank, TRANSPORT, BLOCK)


@triton.jit
def _signal_round(transport_ptrs_dev, signals_ptr, slot_set, round_, value, rank, node, nodes, local, ranks_per_node,
                  TRANSPORT: tl.constexpr):
    for k in range(1, nodes):
        m = (node + k) % nodes
        send_signal(_signal(signals_ptr, slot_set, round_, node, nodes), value, m * ranks_per_node + local,
                    transport_ptrs_dev, rank, TRANSPORT)


@triton.jit
def _get_round(transport_ptrs_dev, slots_ptr, stage_ptr, start, n, send_stride, slot_stride, slot_set, rank, node, nodes,
               local, ranks_per_node, TRANSPORT: tl.constexpr, BLOCK: tl.constexpr):
    """Get my span of the piece each other node's counterpart staged for me into my round-0 slots."""
    for k in range(1, nodes):
        m = (node + k) % nodes
        get(_slot(slots_ptr, slot_set, 0, m, nodes, slot_stride) + start,
            stage_ptr + tl.cast(node, tl.int64) * send_stride + start, n, m * ranks_per_node + local,
            transport_ptrs_dev, rank, TRANSPORT, BLOCK)


@triton.jit
def _wait_round(signals_ptr, slot_set, round_, epoch, desc, budget, status_ptr, rank, node, nodes, local,
                ranks_per_node):
    for k in range(1, nodes):
        src = (node + nodes - k) % nodes
        budget = wait_signal(_signal(signals_ptr, slot_set, round_, src, nodes), epoch, desc, budget, status_ptr,
                             rank, src * ranks_per_node + local)
    return budget


@triton.jit
def _collect(slots_ptr, stage_ptr, out_ptr, start, n, send_stride, out_stride, slot_stride, slot_set, round_, node,
             nodes, WITH_OWN: tl.constexpr, BLOCK: tl.constexpr):
    """out[m] := what node m sent in this round (and my own stage piece if WITH_OWN), my span of it."""
    lane = tl.arange(0, BLOCK)
    for m in range(nodes):
        if m != node:
            src = _slot(slots_ptr, slot_set, round_, m, nodes, slot_stride)
        else:
            src = stage_ptr + tl.cast(node, tl.int64) * send_stride
        if (m != node) | WITH_OWN:
            dst = out_ptr + tl.cast(m, tl.int64) * out_stride
            for b in range(start, start + n, BLOCK):
                offs = b + lane
                mask = offs < start + n
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _reduce(slots_ptr, stage_ptr, out_ptr, start, n, send_stride, out_stride, slot_stride, slot_set, node,
            NODES: tl.constexpr, REDUCE_OP: tl.constexpr, WRITE_BACK: tl.constexpr, BLOCK: tl.constexpr):
    """out[n] := op over nodes (in node order: the same result on every rank) of piece n of each node's
    partial -- mine in the stage, the others' in round-0 slots; with WRITE_BACK also into my stage.
    The node loop is unrolled: a loop of loads alone reads like a spin to the compile checks."""
    elem = out_ptr.dtype.element_ty
    lane = tl.arange(0, BLOCK)
    own = stage_ptr + tl.cast(node, tl.int64) * send_stride
    for b in range(start, start + n, BLOCK):
        offs = b + lane
        mask = offs < start + n
        acc = tl.zeros([BLOCK], tl.float32)
        for m in tl.static_range(NODES):
            if m != node:
                src = _slot(slots_ptr, slot_set, 0, m, NODES, slot_stride)
            else:
                src = own
            value = tl.load(src + offs, mask=mask).to(tl.float32)
            if m == 0:
                acc = value
            else:
                acc = combine(acc, value, REDUCE_OP)
        if REDUCE_OP == 1:  # avg (OP_AVG)
            acc = acc / NODES
        result = narrow(acc, elem)
        tl.store(out_ptr + tl.cast(node, tl.int64) * out_stride + offs, result, mask=mask)
        if WRITE_BACK:
            tl.store(own + offs, result, mask=mask)


@triton.jit
def exchange_kernel(
    # workspace (Workspace.kernel_args): signal pads, error record, wait budget, my rank in the group
    signal_pad_ptrs_dev, status_ptr, max_spins, rank,
    # this call: descriptor; the transport's table; my launch-epoch table; my signal words and receive
    # slots (symmetric; the same offsets are written at the counterparts)
    desc, transport_ptrs_dev, epochs_ptr, signals_ptr, slots_ptr,
    # what I send node m: stage_ptr + m * send_stride (symmetric), piece_len elements; results go to
    # out_ptr + m * out_stride; each program moves `span` elements of each piece
    stage_ptr, out_ptr, piece_len, span, send_stride, out_stride, slot_stride,
    # the group: NODES x ranks_per_node
    ranks_per_node,
    NODES: tl.constexpr, MODE: tl.constexpr, REDUCE_OP: tl.constexpr, BLOCK: tl.constexpr, TRANSPORT: tl.constexpr,
):
    nodes = tl.cast(NODES, tl.int32)  # the loops that send and wait stay loops
    epoch = launch_epoch(epochs_ptr)
    slot_set = epoch % 2
    value = signal_value(epoch, desc, status_ptr)
    node = rank // ranks_per_node
    local = rank % ranks_per_node
    start = tl.program_id(0) * span
    n = tl.minimum(tl.maximum(piece_len - start, 0), span)

    if MODE == 3:  # GET_GATHER: announce my stage, pull theirs
        _signal_round(transport_ptrs_dev, signals_ptr, slot_set, 0, value, rank, node, nodes, local, ranks_per_node,
                      TRANSPORT)
    else:
        _send_round(transport_ptrs_dev, signals_ptr, slots_ptr, stage_ptr, start, n, send_stride, slot_stride,
                    slot_set, 0, value, rank, node, nodes, local, ranks_per_node, TRANSPORT, BLOCK, False)
    budget = _wait_round(signals_ptr, slot_set, 0, epoch, desc, max_spins, status_ptr, rank, node, nodes, local,
                         ranks_per_node)
    if budget > 0:
        if MODE == 3:
            _get_round(transport_ptrs_dev, slots_ptr, stage_ptr, start, n, send_stride, slot_stride, slot_set, rank,
                       node, nodes, local, ranks_per_node, TRANSPORT, BLOCK)
            _collect(slots_ptr, stage_ptr, out_ptr, start, n, send_stride, out_stride, slot_stride, slot_set, 0, node,
                     nodes, True, BLOCK)
            _signal_round(transport_ptrs_dev, signals_ptr, slot_set, 1, value, rank, node, nodes, local,
                          ranks_per_node, TRANSPORT)
            budget = _wait_round(signals_ptr, slot_set, 1, epoch, desc, budget, status_ptr, rank, node, nodes, local,
                                 ranks_per_node)
        elif MODE == 0:  # GATHER
            _collect(slots_ptr, stage_ptr, out_ptr, start, n, send_stride, out_stride, slot_stride, slot_set, 0, node,
                     nodes, True, BLOCK)
        else:
            _reduce(slots_ptr, stage_ptr, out_ptr, start, n, send_stride, out_stride, slot_stride, slot_set, node,
                    NODES, REDUCE_OP, MODE == 2, BLOCK)
        if MODE == 2:  # ALL_REDUCE: my reduced piece to every counterpart, theirs to me
            _send_round(transport_ptrs_dev, signals_ptr, slots_ptr, stage_ptr, start, n, send_stride, slot_stride,
                        slot_set, 1, value, rank, node, nodes, local, ranks_per_node, TRANSPORT, BLOCK, True)
            budget = _wait_round(signals_ptr, slot_set, 1, epoch, desc, budget, status_ptr, rank, node, nodes, local,
                                 ranks_per_node)
            if budget > 0:
                _collect(slots_ptr, stage_ptr, out_ptr, start, n, send_stride, out_stride, slot_stride, slot_set, 1,
                         node, nodes, False, BLOCK)
    end_launch(epochs_ptr, epoch)


# GPU launch shape: each program puts at least this many bytes per piece (fewer, larger network
# messages), at most MAX_PROGRAMS programs. Not tuned: no multi-node machine has run it yet.
GPU_BYTES_PER_PROGRAM = 256 << 10
GPU_BLOCK_BYTES = 16 << 10


def capacity(ws, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one piece (a multiple of 16)."""
    return piece_bytes(ws.geometry) // dtype.itemsize // 16 * 16


def stage(ws, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The first ``numel`` elements of this rank's stage region, as ``dtype``."""
    return ws.region(STAGE.name).local.view(dtype)[:numel]


def exchange(plan: Plan, dtype: torch.dtype, out: torch.Tensor, mode: str, piece_len: int, send_stride: int,
             out_stride: int) -> None:
    """One exchange launch over ``plan.ws`` (a group that spans nodes): the stage holds what is sent,
    ``out`` (a contiguous tensor of ``dtype``) receives; strides in elements."""
    ws = plan.ws
    topo, transport = ws.topology, ws.transport
    if ws.device.type == "cpu":
        programs, block, warps = 2, CPU_CONFIG.block, CPU_CONFIG.num_warps
    else:
        programs = max(1, min(MAX_PROGRAMS.value, cdiv(piece_len * dtype.itemsize, GPU_BYTES_PER_PROGRAM)))
        block, warps = GPU_BLOCK_BYTES // dtype.itemsize, 16
        if transport.kind == 1:
            from ..memory.transport import prepare_nvshmem_kernel
            prepare_nvshmem_kernel(exchange_kernel)
    span = cdiv(cdiv(max(piece_len, 1), programs), 16) * 16
    slots = ws.region(SLOTS.name).local.view(dtype)
    launch(exchange_kernel, (programs,),
           (*ws.kernel_args, plan.desc, transport.ptrs_dev, ws.local_state(EPOCHS.name),
            ws.region(SIGNALS.name).local.view(torch.int64), slots, ws.region(STAGE.name).local.view(dtype), out,
            piece_len, span, send_stride, out_stride, piece_bytes(ws.geometry) // dtype.itemsize, topo.ranks_per_node),
           dict(NODES=topo.nodes, MODE=MODES[mode], REDUCE_OP=plan.reduce_code if mode != "gather" else 0, BLOCK=block,
                TRANSPORT=transport.kind, num_warps=warps, **transport.launch_options()))


def compile_cases(make_workspace):
    """Exchange launches for the sm_90 compile checks (tests/kernel_specs.py), on meta tensors, over the
    NVSHMEM transport when its device library is installed (nvidia-nvshmem-cu13), else the emulated one:
    the all_reduce mode (puts with signal, the reduction, both rounds) and the get mode (gets, signals;
    2 nodes of 1 with rank 1, which Triton specialises to constants, as for 2 GPUs as 2 nodes). The
    gather and reduce modes are branches of the same kernel over the same device functions. The
    emulated transport once too: scripts/gpu_check.sh scaleout runs it on a GPU (ranks sharing it)."""
    from types import SimpleNamespace

    from ..memory.regions import Geometry
    from ..memory.transport import EMULATED, NVSHMEM, nvshmem_library
    from ..plan import Request
    from ..topology import Topology

    shmem = NVSHMEM if nvshmem_library() else EMULATED
    cases = []
    for mode, dtype, nodes, per_node, rank, kind in (("all_reduce", torch.bfloat16, 2, 4, 5, shmem),
                                                     ("get_gather", torch.int16, 2, 1, 1, shmem),
                                                     ("reduce", torch.float32, 3, 2, 0, EMULATED)):
        def thunk(mode=mode, dtype=dtype, nodes=nodes, per_node=per_node, rank=rank, kind=kind):
            ws = make_workspace(nodes * per_node, rank)
            ws.topology = Topology(nodes * per_node, per_node, nodes)
            ws.geometry = Geometry(per_node, 256 << 20, "cuda", nodes)
            ws.transport = SimpleNamespace(kind=kind, ptrs_dev=1 << 40 | 7 << 20, launch_options=lambda: (
                {"extern_libs": (("libnvshmem_device", nvshmem_library()),)} if kind == NVSHMEM else {}))
            request = Request("all_reduce", (1 << 20,), dtype, torch.device("cuda"), "sum")
            plan = Plan(request, "kernel", None, None, nodes * per_node, rank, ws, None, 3, None)
            out = torch.empty(1 << 20, dtype=dtype, device="meta")
            exchange(plan, dtype, out, mode, 4 << 20 >> 4, 4 << 20 >> 4, 0)
        cases.append((f"exchange.{mode},{'nvshmem' if kind == NVSHMEM else 'emulated'},{nodes}x{per_node},", thunk))
    return cases
