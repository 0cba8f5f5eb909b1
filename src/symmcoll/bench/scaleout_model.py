"""A cost model of collectives across nodes: bytes each rank moves on NVLink and on the network, and the
time that predicts, for the hierarchical algorithms (comm/hierarchical.py) beside NCCL's ring and tree.

PREDICTIONS, not measurements: no multi-node machine has run symmcoll. The model is the usual
alpha-beta one: a phase moving B bytes per rank over a link of bandwidth L takes alpha + B / L; the
hierarchical algorithms run their phases one after another (node phase, exchange, node phase: no
pipelining between them yet), NCCL's ring and tree pipeline theirs (time: the slowest link's bytes
plus one alpha per step). Links: NVLink 450 GB/s per direction per GPU (H100/H200, NVSwitch), one
400 Gb/s NIC per GPU (50 GB/s). Alphas: 3 us per NVLink phase (a barrier-based kernel), 5 us per
network round (a put with signal, or a ring step over InfiniBand), 1 us per extra message in a round.

Bytes per rank, group of N nodes x R ranks (W = N R), S = all_reduce / reduce_scatter input bytes,
all_gather / all_to_all input bytes per rank:

    op              algorithm        NVLink              network                 steps (alphas)
    all_reduce      hierarchical     2 (R-1)/R S         2 (N-1)/(N R) S         2 NVLink + 2 network
                    NCCL ring        2 (W-1)/W S         2 (W-1)/(W R) S         2 (W-1) network
                    NCCL tree        2 S (node chain)    2 S / R                 2 log2(N) network + 2 (R-1) NVLink
    reduce_scatter  hierarchical     (R-1)/R S           (N-1)/W S               1 + 1
                    NCCL ring        (W-1)/W S           (W-1)/(W R) S           W-1
    all_gather      hierarchical     (R-1) N S           (N-1) S                 1 + 1
                    NCCL ring        (W-1) S             (W-1) S / R             W-1
    all_to_all      hierarchical     (R-1)/R S           (N-1)/N S               1 + 1, N-1 messages
                    NCCL (p2p)       (R-1)/W S           (N-1)/N S               1, (N-1) R messages

NCCL runs R rings side by side, one per NIC: every byte passes every GPU over NVLink, and each ring
leaves a node once, so a node's ring traffic is spread over its R NICs. The tree (NCCL's double binary
tree between nodes, a chain inside each node) sends S up and S down per node, over its R NICs. The
hierarchical algorithms send each byte across the boundary once per destination node: on the network
they save a factor (N-1)/N against both (half at 2 nodes, little at 32); their gain is on NVLink (the
ring pushes 2 (W-1)/W S through each GPU, the tree 2 S) and in latency (2 network rounds instead of
2 (W-1) ring steps). all_to_all moves the same network bytes as NCCL's point-to-point exchange; it
gains by sending N-1 messages of R chunks (a token crosses the network once, then NVLink) instead of
(N-1) R small ones. The phases run one after another today: ``pipelined`` is the time the same bytes
would take with the exchange of one piece overlapping the node phases of the next (not built).

``python -m symmcoll.bench.scaleout_model`` prints the tables of docs/results.md (2-32 nodes of 8 GPUs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NVLINK_BYTES_PER_S = 450e9  # per direction per GPU
NIC_BYTES_PER_S = 400e9 / 8  # one 400 Gb/s NIC per GPU
ALPHA_NVLINK_S = 3e-6
ALPHA_NETWORK_S = 5e-6
ALPHA_MESSAGE_S = 1e-6  # issuing one more network message in a round (all_to_all's many small messages)


@dataclass(frozen=True)
class Cost:
    """One algorithm's predicted cost for one call, per rank."""

    nvlink_bytes: float
    network_bytes: float
    seconds: float


def _sequential(nvlink_bytes, network_bytes, nvlink_phases, network_rounds) -> float:
    return (nvlink_bytes / NVLINK_BYTES_PER_S + network_bytes / NIC_BYTES_PER_S
            + nvlink_phases * ALPHA_NVLINK_S + network_rounds * ALPHA_NETWORK_S)


def _pipelined(nvlink_bytes, network_bytes, nvlink_steps, network_steps) -> float:
    return (max(nvlink_bytes / NVLINK_BYTES_PER_S, network_bytes / NIC_BYTES_PER_S)
            + nvlink_steps * ALPHA_NVLINK_S + network_steps * ALPHA_NETWORK_S)


def hierarchical(op: str, nbytes: float, nodes: int, per_node: int, pipelined: bool = False) -> Cost:
    n, r = nodes, per_node
    w = n * r
    if op == "all_reduce":
        nv, net, phases, rounds = 2 * (r - 1) / r * nbytes, 2 * (n - 1) / (n * r) * nbytes, 2, 2
    elif op == "reduce_scatter":
        nv, net, phases, rounds = (r - 1) / r * nbytes, (n - 1) / w * nbytes, 1, 1
    elif op == "all_gather":
        nv, net, phases, rounds = (r - 1) * n * nbytes, (n - 1) * nbytes, 1, 1
    elif op == "all_to_all":
        nv, net, phases, rounds = (r - 1) / r * nbytes, (n - 1) / n * nbytes, 1, 1 + (n - 2) * ALPHA_MESSAGE_S / ALPHA_NETWORK_S
    else:
        raise ValueError(f"op must be all_reduce, reduce_scatter, all_gather or all_to_all, got {op!r}")
    phases = phases if r > 1 else 0
    time = _pipelined(nv, net, phases, rounds) if pipelined else _sequential(nv, net, phases, rounds)
    return Cost(nv, net, time)


def nccl_ring(op: str, nbytes: float, nodes: int, per_node: int) -> Cost:
    """NCCL's ring: R rings side by side (one per NIC), each carrying 1/R of the data through every rank."""
    w = nodes * per_node
    factor = {"all_reduce": 2 * (w - 1) / w, "reduce_scatter": (w - 1) / w, "all_gather": w - 1}.get(op)
    if factor is None:
        raise ValueError(f"NCCL's ring: op must be all_reduce, reduce_scatter or all_gather, got {op!r}")
    steps = 2 * (w - 1) if op == "all_reduce" else w - 1
    nv, net = factor * nbytes, factor * nbytes / per_node
    return Cost(nv, net, _pipelined(nv, net, 0, steps))


def nccl_tree(nbytes: float, nodes: int, per_node: int) -> Cost:
    """NCCL's all_reduce tree: a chain through the node's GPUs, a double binary tree between nodes."""
    nv, net = 2 * nbytes if per_node > 1 else 0.0, 2 * nbytes / per_node
    depth = max(1, math.ceil(math.log2(nodes)))
    return Cost(nv, net, _pipelined(nv, net, 2 * (per_node - 1), 2 * depth))


def nccl_all_to_all(nbytes: float, nodes: int, per_node: int) -> Cost:
    w = nodes * per_node
    net = (nodes - 1) / nodes * nbytes
    nv = (per_node - 1) / w * nbytes
    return Cost(nv, net, _pipelined(nv, net, 0, 1 + (w - per_node - 1) * ALPHA_MESSAGE_S / ALPHA_NETWORK_S))


def baselines(op: str, nbytes: float, nodes: int, per_node: int) -> dict[str, Cost]:
    if op == "all_reduce":
        return {"NCCL ring": nccl_ring(op, nbytes, nodes, per_node), "NCCL tree": nccl_tree(nbytes, nodes, per_node)}
    if op == "all_to_all":
        return {"NCCL p2p": nccl_all_to_all(nbytes, nodes, per_node)}
    return {"NCCL ring": nccl_ring(op, nbytes, nodes, per_node)}


def _size(nbytes: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def table(op: str, nbytes: float, per_node: int = 8, node_counts=(2, 4, 8, 16, 32)) -> str:
    """A markdown table: per node count, each algorithm's network MB per rank and predicted us."""
    names = ["hierarchical", *baselines(op, nbytes, 2, per_node)]
    head = (f"| nodes x {per_node} | " + " | ".join(f"{n}: net MB / NVLink MB / us" for n in names)
            + " | best NCCL / hierarchical | ... if pipelined |")
    lines = [f"**{op}, {_size(nbytes)} per rank** (prediction)", "", head, "|" + "---|" * (len(names) + 3)]
    for nodes in node_counts:
        ours = hierarchical(op, nbytes, nodes, per_node)
        costs = {"hierarchical": ours, **baselines(op, nbytes, nodes, per_node)}
        cells = [f"{c.network_bytes / 1e6:.1f} / {c.nvlink_bytes / 1e6:.0f} / {c.seconds * 1e6:.0f}"
                 for c in costs.values()]
        best = min(c.seconds for name, c in costs.items() if name != "hierarchical")
        overlapped = hierarchical(op, nbytes, nodes, per_node, pipelined=True)
        lines.append(f"| {nodes} | " + " | ".join(cells)
                     + f" | {best / ours.seconds:.2f}x | {best / overlapped.seconds:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    print("PREDICTIONS of symmcoll.bench.scaleout_model (not measured): NVLink 450 GB/s, one 400 Gb/s NIC per GPU, "
          f"alpha {ALPHA_NVLINK_S * 1e6:g} us per NVLink phase, {ALPHA_NETWORK_S * 1e6:g} us per network round.\n")
    for op, sizes in (("all_reduce", (1 << 20, 256 << 20)), ("reduce_scatter", (256 << 20,)),
                      ("all_gather", (32 << 20,)), ("all_to_all", (1 << 20, 256 << 20))):
        for nbytes in sizes:
            print(table(op, nbytes))
            print()


if __name__ == "__main__":
    main()
