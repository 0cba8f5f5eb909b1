"""What the resolver chooses from: the ops and algorithms symmcoll knows, and the types they are
described by.

``ops.declare`` makes an op known (``register_op``: its shape rule, its public input names, what "auto"
runs by default); every algorithm module registers its algorithms once at import (``register``: an
``Algorithm`` with what it accepts, what runs instead, its launch configs). ``Request`` is what a call
asks for, ``LaunchConfig`` / ``SizedConfigs`` how a kernel is launched.

A file of its own because it holds no decision: symmcoll.plan (the resolver) reads these tables to
decide what a call runs, and re-exports every public name here, so ``from symmcoll.plan import
Algorithm, register`` and the like keep working (most algorithm modules import them from there). The
resolver imports the underscored tables and reads them directly: no accessor call on its paths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from . import calls, dispatch
from .memory.layout import MAX_PROGRAMS

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast")
REDUCTIONS = ("all_reduce", "reduce_scatter")
REDUCTION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
WORD_DTYPES = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
BACKEND = dispatch.FALLBACK  # "nccl": the process group's own collective
ACROSS_NODES = "hierarchical"  # the family of the algorithms for groups that span nodes
# Request.splits of an all-to-all whose splits are a device tensor (passed in ``others``): nothing about
# them is known on the host.
DEVICE_SPLITS = "device"


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel is launched: elements per block step, the most programs, warps per program."""

    block: int
    max_programs: int
    num_warps: int

    def __post_init__(self):
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two, got {self.block}")
        if not 1 <= self.max_programs <= MAX_PROGRAMS:
            raise ValueError(f"max_programs must be in [1, {MAX_PROGRAMS}], got {self.max_programs}")

    def grid(self, work_items: int) -> tuple[int]:
        """Programs for ``work_items`` blocks of work (at least one, at most ``max_programs``)."""
        return (max(1, min(self.max_programs, work_items)),)


@dataclass(frozen=True)
class SizedConfigs:
    """GPU launch configs by bytes: ``(max_bytes, config)`` ascending, the last one holding beyond;
    ``per_world`` overrides the table for particular world sizes. From measurements
    (benchmarks/sweep_configs.py on the GPU machine)."""

    table: tuple[tuple[int, LaunchConfig], ...]
    per_world: tuple[tuple[int, tuple[tuple[int, LaunchConfig], ...]], ...] = ()

    def pick(self, nbytes: int, world: int | None = None) -> LaunchConfig:
        table = dict(self.per_world).get(world, self.table)
        for max_bytes, config in table:
            if nbytes <= max_bytes:
                return config
        return table[-1][1]

    @property
    def largest(self) -> LaunchConfig:
        return self.table[-1][1]


# On CPU every program instance costs ~0.7 ms of interpreter overhead: few programs, big blocks.
CPU_CONFIG = LaunchConfig(block=16384, max_programs=4, num_warps=4)


@dataclass(frozen=True)
class Request:
    """What a call asks for: everything every rank must agree on."""

    op: str
    shape: tuple
    dtype: torch.dtype
    device: torch.device
    reduce_op: str | None = None
    src: int | None = None
    splits: tuple | None = None
    # Other inputs of fused ops: ((shape, dtype), ...) -- they take part in the cache key and descriptor.
    others: tuple = ()
    # Op-specific options (hashable), e.g. (("return_gathered", True),).
    options: tuple = ()
    # Public names of the main input and of ``others`` (error messages, mismatched fields).
    names: tuple = ()

    def name(self, i: int) -> str:
        """The public name of input ``i`` (0: the main input, then ``others``)."""
        return self.names[i] if i < len(self.names) else ("x" if i == 0 else f"input {i}")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Algorithm:
    """A registered implementation of one op.

    run(plan, x, out) -> out: the host launcher (out may be None where the output shape depends on
    the peers). accepts(request, world) -> None or the reason it cannot run this input; instead: what
    runs in its place then (another algorithm of the op, or "nccl"; None: the call raises ValueError).
    config_bytes(request, world): the bytes that pick the GPU launch config (default: input bytes).
    """

    op: str
    name: str
    code: int
    family: str
    run: Callable
    summary: str
    gpu_configs: SizedConfigs | Callable | None = None
    accepts: Callable | None = None
    instead: str | None = None
    config_bytes: Callable | None = None


_REGISTRY: dict[str, dict[str, Algorithm]] = {op: {} for op in OPS}
# Shape rules (rule(request, world) -> (out shape or None, what the ranks must agree on); may raise
# ValueError naming the argument). What they agree on: a dict of named fields (e.g. all_to_all's, whose
# row counts differ between ranks), or anything else for "every input's shape and dtype, the splits and
# the options" (``agreed_fields``).
_OP_RULES: dict[str, Callable] = {}
_REDUCING_OPS: set[str] = set()
# Ops whose kernels run (and meet the peers) even when this rank's input is empty, where they do:
# op -> runs(request) -> bool.
_RUNS_WHEN_EMPTY: dict[str, Callable] = {}
_DEFAULTS: dict[str, str | Callable] = {}
_DISPATCH_SIZE: dict[str, Callable] = {}
# Public names of each op's tensor inputs (main input first), and those that may come as the
# transpose of a contiguous matrix (nn.Linear's ``W.t()``).
_INPUT_NAMES: dict[str, tuple[str, ...]] = {}
_TRANSPOSED: dict[str, frozenset] = {}


def register_op(op: str, shape_rule: Callable, *, reduces: bool = False, default: str | Callable | None = None,
                dispatch_size: Callable | None = None, runs_when_empty: Callable | None = None,
                inputs: tuple[str, ...] = ("x",), transposed: tuple[str, ...] = ()) -> None:
    """Make ``op`` known to the resolver (``ops.declare`` calls it with an op's ``OpSpec``):

    shape_rule(request, world) -> (output shape or None, agreed fields): validates the call (ValueError
    naming the argument by its public name); reduces: the op takes a reduce op; default: what "auto"
    runs where the tuned table has no rule (an algorithm name, or ``default(request, world) -> name``
    where the choice depends on the shape, e.g. decode-sized M); dispatch_size(request, world): the
    size the table is keyed by (default: input bytes per rank); runs_when_empty(request) -> bool: where
    its algorithms meet the peers whatever this rank's input (an empty one needs no handshake, and may
    be empty on this rank alone); inputs: the public names of its tensor inputs; transposed: those
    that may be given as the transpose of a contiguous matrix (the algorithms read them by strides)."""
    _REGISTRY.setdefault(op, {})
    _OP_RULES[op] = shape_rule
    if dispatch_size is not None:
        _DISPATCH_SIZE[op] = dispatch_size
    if reduces:
        _REDUCING_OPS.add(op)
    if default is not None:
        _DEFAULTS[op] = default
    if runs_when_empty is not None:
        _RUNS_WHEN_EMPTY[op] = runs_when_empty
    _INPUT_NAMES[op] = tuple(inputs)
    _TRANSPOSED[op] = frozenset(transposed)


def registered_ops() -> list[str]:
    """Every op the resolver knows: the collectives first, then the fused ops, in registration order."""
    return [*OPS, *(op for op in _REGISTRY if op not in OPS)]


def shape_rule(op: str) -> Callable:
    """The registered shape rule of ``op``: rule(request, world) -> (output shape or None, agreed fields)."""
    return _OP_RULES[op]


def register(algorithm: Algorithm) -> Algorithm:
    if algorithm.op not in _REGISTRY:
        _REGISTRY[algorithm.op] = {}
    if algorithm.code in calls.CODES and calls.CODES[algorithm.code] != f"{algorithm.op}.{algorithm.name}":
        raise ValueError(f"algorithm code {algorithm.code} of {algorithm.op}.{algorithm.name} is taken by "
                         f"{calls.CODES[algorithm.code]}")
    calls.CODES[algorithm.code] = f"{algorithm.op}.{algorithm.name}"
    _REGISTRY[algorithm.op][algorithm.name] = algorithm
    return algorithm


def algorithms(op: str, *, kernels_only: bool = True, across_nodes: bool = False) -> dict[str, Algorithm]:
    """The registered algorithms of ``op`` by name (without the process group's own, "nccl"): those for
    a group within one node, or with ``across_nodes`` those for a group that spans nodes (family
    "hierarchical", comm/hierarchical.py)."""
    table = _REGISTRY.get(op, {})
    return {n: a for n, a in table.items()
            if not (kernels_only and n == BACKEND) and (n == BACKEND or (a.family == ACROSS_NODES) == across_nodes)}


def reduction_dtype_reason(request: Request, world: int) -> str | None:
    if request.dtype not in REDUCTION_DTYPES:
        return (f"x.dtype {request.dtype} is not supported for reductions (supported: bf16, fp16, fp32; "
                f"algorithm='auto' or 'nccl' sends it to the process group)")
    return None


def word_dtype_reason(request: Request, world: int) -> str | None:
    if request.dtype.itemsize not in WORD_DTYPES:
        return f"x.dtype {request.dtype} (itemsize {request.dtype.itemsize}) has no word type"
    return None
