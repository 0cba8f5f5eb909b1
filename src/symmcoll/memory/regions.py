"""The typed region registry: every symmetric region an algorithm uses, declared once, up front.

A region has a name, a size (a function of the workspace's world size, shared-buffer size and device
type), an owner (the protocol module that reads and writes it), a fill value every int32 word starts
with, and a *reuse rule*: who may write it when, so that no call overwrites what a peer still reads.
Algorithm modules declare their regions when they are imported; a workspace lays out every declared
region in one symmetric allocation when it is created, so no region is ever created later (no
rendezvous during CUDA-graph capture, and ranks that call different algorithms on a cold workspace
cannot block each other in a host collective). Per-rank state that is not symmetric (launch-epoch
tables) is declared the same way with ``symmetric=False``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Geometry:
    """What region sizes may depend on."""

    world_size: int  # ranks a kernel sees: the group's, or one node's when the group spans nodes
    buffer_bytes: int
    device_type: str  # "cuda" | "cpu"
    nodes: int = 1  # nodes of a group that spans nodes (symmcoll.topology)


@dataclass(frozen=True)
class RegionSpec:
    name: str
    owner: str
    size: Callable[[Geometry], int]  # bytes (symmetric) or int32 words (symmetric=False)
    rule: str
    fill_int32: int = 0
    symmetric: bool = True
    # Sentinel slot regions: the int32 words at the start that hold headers or counts, not slots (every
    # word after them is back to fill_int32 between calls; the tests check that).
    header_words: int = 0


_DECLARED: dict[str, RegionSpec] = {}


def declare(spec: RegionSpec) -> RegionSpec:
    """Register ``spec`` (at import of its owner module); the same name twice must be the same spec."""
    known = _DECLARED.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"region {spec.name!r} declared twice with different specs")
    _DECLARED[spec.name] = spec
    return spec


def declared() -> list[RegionSpec]:
    """Every declared region, in a fixed order (by name): every rank lays them out alike."""
    return [_DECLARED[name] for name in sorted(_DECLARED)]


# The shared buffer and the signal pad are the workspace's own.
BUFFER = declare(RegionSpec(
    "buffer", "workspace", lambda g: g.buffer_bytes,
    "barrier-based kernels (pull family, tree, data movement, copy engine, matmul_reduce_scatter chunked) "
    "write their own rank's copy before their entry barrier and read peers' copies only between entry and "
    "exit barrier; the exit barrier ends every use, so the next call (of any algorithm) cannot overwrite "
    "what a peer reads"))

