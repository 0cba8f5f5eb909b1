"""The graph pass of ``symmcoll.backend``: every functional collective of an ATen graph, in graph order,
becomes a fused symmcoll op (the first registered pattern that matches it) or the plain symmcoll op,
or stays as it was, with the reason recorded.

A pattern (``Pattern``) is anchored on functional collective ops; ``match(collective, ctx)`` returns a
``Fusion`` (what to edit, and a one-line description) or a string saying why it does not apply. The
patterns are tried by ``priority`` (lowest first); the plain rewrite (collectives.py) comes last.
Before any of them, ``Context.collective_reason`` checks what every rewrite needs: a process group of
at most ``MAX_WORLD`` ranks, tensors on a device symmcoll runs on, fake values to read shapes from.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch.fx import Graph, Node

from .. import ops
from ..memory.layout import MAX_WORLD
from .graph import Editor, group_name_of, tensor_val
from .report import Entry, GraphReport

functional = torch.ops._c10d_functional
WAIT = functional.wait_tensor.default


COPY_WEIGHTS = ("auto", "always", "never")


@dataclass(frozen=True)
class Options:
    """copy_weights: what a fused matmul does with a B that is a transposed weight (``x @ W.T``, as
    ``nn.Linear`` computes): "auto" passes it as it is (the fused ops read W [N, K] in place),
    "always" copies it row-major [K, N] first, "never" leaves such a matmul unfused."""

    copy_weights: str = "auto"


DYNAMIC = "dynamic shapes: the fused patterns need fixed shapes"


@dataclass(frozen=True)
class Fusion:
    apply: Callable[[], "str | None"]  # (may return words for the report)
    detail: str


@dataclass(frozen=True)
class Pattern:
    """name: the symmcoll op it produces; anchors: the functional collectives it starts from;
    match(collective, ctx) -> Fusion, or the reason it does not apply (a string)."""

    name: str
    anchors: tuple
    match: Callable
    priority: int


PATTERNS: list[Pattern] = []


def register(pattern: Pattern) -> Pattern:
    if any(p.name == pattern.name for p in PATTERNS):
        raise ValueError(f"a pattern named {pattern.name!r} is registered already")
    PATTERNS.append(pattern)
    PATTERNS.sort(key=lambda p: p.priority)
    return pattern


def argument(node: Node, name: str):
    """Argument ``name`` of an op node, positional or keyword, by the op's schema."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name, arg.default_value)
    raise KeyError(name)


def op_name(node: Node) -> str | None:
    """"namespace.op" of an op node (None for other nodes)."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return str(node.target.overloadpacket)
    return None


def is_collective(node: Node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace == "_c10d_functional" and node.target is not WAIT)


class Context:
    """What patterns read while matching and call while editing one graph."""

    def __init__(self, editor: Editor, options: Options):
        self.editor = editor
        self.options = options

    @staticmethod
    def group(node: Node) -> str:
        return group_name_of(argument(node, "group_name"))

    @staticmethod
    def world(group_name: str) -> int:
        return dist.get_world_size(ops.resolve_group(group_name))

    def collective_reason(self, node: Node) -> str | None:
        """Why no symmcoll op can take this collective's group or device (None: they can)."""
        name = group_name_of(argument(node, "group_name"))
        if name is None:
            return f"the group argument {argument(node, 'group_name')!r} names no process group"
        try:
            world = self.world(name)
        except Exception as e:  # noqa: BLE001  (an unknown name raises whatever c10d raises)
            return f"group {name!r} is not a process group of this process ({type(e).__name__})"
        if world > MAX_WORLD:
            return f"group {name!r} has {world} ranks; symmcoll's kernels take up to {MAX_WORLD}"
        if any(a.name == "group_size" for a in node.target._schema.arguments) and argument(node, "group_size") != world:
            return f"group_size {argument(node, 'group_size')} is not the group's {world} ranks"
        inputs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        for x in inputs:
            v = tensor_val(x)
            if v is None:
                return "its input has no fake value to read the shape from"
            if v.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
                return "CPU tensors run symmcoll's kernels only under TRITON_INTERPRET=1"
            if v.device.type not in ("cpu", "cuda"):
                return f"tensors on {v.device.type}: symmcoll runs on cuda (and cpu under the interpreter)"
        return None

    def wait_of(self, node: Node) -> Node | None:
        """The collective's wait_tensor, if that is its only user."""
        users = list(node.users)
        return users[0] if len(users) == 1 and users[0].target is WAIT else None

    def retire(self, collective: Node, result: Node) -> None:
        """Route every use of ``collective`` (through its wait_tensor) to ``result``; erase both."""
        for user in list(collective.users):
            if user.target is WAIT:
                user.replace_all_uses_with(result)
                self.editor.graph.erase_node(user)
                self.editor.erased.add(user)
        collective.replace_all_uses_with(result)
        self.editor.erase_dead([collective])


def graph_kind(graph: Graph) -> str:
    """"backward" (tangents among the inputs), "forward" (primals) or "inference", as AOTAutograd
    names the inputs of the graphs it makes."""
    names = [n.name for n in graph.nodes if n.op == "placeholder"]
    if any(n.startswith("tangents") for n in names):
        return "backward"
    return "forward" if any(n.startswith("primals") for n in names) else "inference"


def rewrite(graph: Graph, kind: str, options: Options) -> GraphReport:
    """Rewrite ``graph`` in place; what was done, and why not elsewhere, goes in the report."""
    report = GraphReport(kind)
    editor = Editor(graph)
    if editor.fake_mode is None:
        report.note = "the graph has no fake values: left as it was"
    else:
        ctx = Context(editor, options)
        for node in list(graph.nodes):
            if node in editor.erased or not is_collective(node):
                continue
            report.entries.append(_rewrite_one(node, ctx))
    report.ops_after = Counter(name for name in map(op_name, graph.nodes) if name)
    return report


def _rewrite_one(node: Node, ctx: Context) -> Entry:
    from . import collectives

    what = f"{node.name} ({op_name(node).split('.')[-1]})"
    reason = ctx.collective_reason(node)
    if reason:
        return Entry(what, None, reason)
    skipped = []
    for pattern in PATTERNS:
        if node.target not in pattern.anchors:
            continue
        found = pattern.match(node, ctx)
        if isinstance(found, str):
            skipped.append((pattern.name, found))
            continue
        extra = found.apply()  # (what only the rewrite itself learns, for the report)
        return Entry(what, f"symmcoll.{pattern.name}", found.detail + (extra or ""), tuple(skipped))
    result, reason = collectives.rewrite_plain(node, ctx)
    return Entry(what, result, reason, tuple(skipped))
