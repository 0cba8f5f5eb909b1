"""Which ranks of a group share a node (one NVLink domain), and which are reached only over the network.

A group is cut into nodes of R ranks each. R comes from ``SYMMCOLL_RANKS_PER_NODE`` if set (on CPU it
*emulates* nodes: ranks of one machine act as if they sat on different hosts; on GPU it can split one
host's GPUs into emulated nodes, e.g. to run the network path of the hierarchical algorithms on one
machine), else from ``LOCAL_WORLD_SIZE`` (set by torchrun: the processes of one host), else the whole
group is one node. Global rank g sits on node g // R; a group's ranks are taken in group order.

Inside a node peers are mapped as always (address tables, NVLink loads and stores). Across nodes a peer
is reached only through a transport's put (with signal), get and signal wait (language/transport.py):
the workspace of a group that spans nodes leaves every cross-node entry of its address tables 0, so a
kernel that dereferences such a peer faults instead of reading memory it could not reach on real
hardware.

The hierarchical algorithms (comm/hierarchical.py) need a *regular* group: the same number of group
ranks on every node, each node's ranks consecutive in group order. Other groups that span nodes go to
the process group's own collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV_RANKS_PER_NODE = "SYMMCOLL_RANKS_PER_NODE"
# Nodes a hierarchical workspace supports (signal slots and region sizes grow with it).
MAX_NODES = 64


@dataclass(frozen=True)
class Topology:
    """A group of ``world`` ranks as ``nodes`` nodes of ``ranks_per_node`` consecutive group ranks
    (``regular``); an irregular group keeps ``nodes`` > 1 but no per-node layout."""

    world: int
    ranks_per_node: int
    nodes: int
    regular: bool = True
    # Whether the group holds every process of the job. NVSHMEM's allocations are collective over all of
    # them: only such a group can have an NVSHMEM workspace (memory/transport.py ``workspace_possible``).
    whole_job: bool = True

    @property
    def spans(self) -> bool:
        """True when the group has ranks on more than one node."""
        return self.nodes > 1

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def local_rank(self, rank: int) -> int:
        return rank % self.ranks_per_node

    def first_rank(self, node: int) -> int:
        return node * self.ranks_per_node

    def same_node(self, a: int, b: int) -> bool:
        return self.node_of(a) == self.node_of(b)

    def peer(self, node: int, local_rank: int) -> int:
        """The group rank of ``local_rank`` on ``node``."""
        return node * self.ranks_per_node + local_rank

    @property
    def signature(self) -> str:
        """What every rank must agree on (part of the workspace's creation rendezvous)."""
        return f"nodes={self.nodes}x{self.ranks_per_node}{'' if self.regular else ' irregular'}"


def ranks_per_node_setting() -> int | None:
    """Ranks per node from the environment (SYMMCOLL_RANKS_PER_NODE, else LOCAL_WORLD_SIZE), or None."""
    for name in (ENV_RANKS_PER_NODE, "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name)
        if value is None or value == "":
            continue
        try:
            count = int(value)
        except ValueError:
            raise ValueError(f"{name} must be a positive number of ranks per node, got {value!r}") from None
        if count < 1:
            raise ValueError(f"{name} must be a positive number of ranks per node, got {value!r}")
        return count
    return None


def layout(global_ranks: list[int], per_node: int | None, job_world: int | None = None) -> Topology:
    """The topology of a group whose rank r is global rank ``global_ranks[r]``, with ``per_node``
    global ranks per node (None: one node), in a job of ``job_world`` processes (None: this group's)."""
    world = len(global_ranks)
    whole = job_world is None or world == job_world
    if per_node is None:
        return Topology(world, world, 1, whole_job=whole)
    node_ids = [g // per_node for g in global_ranks]
    nodes = len(set(node_ids))
    if nodes == 1:
        return Topology(world, world, 1, whole_job=whole)
    size = world // nodes
    # Regular: blocks of `size` consecutive group ranks, each block on one node (then, with `nodes`
    # distinct ids, each node holds exactly one block).
    blocks = [node_ids[n * size:(n + 1) * size] for n in range(nodes)]
    if world % nodes or any(len(set(block)) != 1 for block in blocks):
        return Topology(world, 1, nodes, regular=False, whole_job=whole)
    return Topology(world, size, nodes, whole_job=whole)


_CACHE: dict[str, Topology] = {}


def of_group(group) -> Topology:
    """The topology of ``group`` (a torch.distributed process group), cached until ``symmcoll.reset``."""
    name = group.group_name
    topo = _CACHE.get(name)
    if topo is None:
        import torch.distributed as dist
        world = dist.get_world_size(group)
        try:
            ranks = [dist.get_global_rank(group, r) for r in range(world)]
        except (RuntimeError, ValueError):  # the default group: its ranks are the global ranks
            ranks = list(range(world))
        topo = layout(ranks, ranks_per_node_setting(), dist.get_world_size())
        _CACHE[name] = topo
    return topo


def forget() -> None:
    """Drop cached topologies (``symmcoll.reset`` calls it: the environment may have changed)."""
    _CACHE.clear()
