"""Reading and editing ATen FX graphs: what the patterns of ``symmcoll.compiler`` share.

The graphs are the ones AOTAutograd hands to a compiler (forward, backward, inference): functional,
every node carrying ``meta["val"]``, a FakeTensor (or a tuple/list of them) that gives its shape, dtype
and strides. Inductor's post-grad graphs are the same with its decompositions applied (``t`` becomes
``permute``, ``view`` becomes ``reshape``, ``_to_copy`` becomes ``convert_element_type``): every
helper here accepts both spellings.

``Editor`` creates nodes whose ``meta["val"]`` is computed by running the op on the inputs' fake values
(Inductor lays out buffers and picks strides from them), moves cheap view-like inputs ahead of the
node that needs them, and erases what a rewrite left dead.
"""

from __future__ import annotations

import math
import operator

import torch
from torch.fx import Graph, Node

aten = torch.ops.aten
prims = torch.ops.prims

# Nodes that only re-describe memory (or copy it without arithmetic): a rewrite may move them earlier.
MOVABLE = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.permute.default,
                      aten.t.default, aten.transpose.int, aten.expand.default, aten.unsqueeze.default,
                      aten.squeeze.dim, aten.alias.default, aten.detach.default, aten.clone.default,
                      prims.convert_element_type.default, aten._to_copy.default})
RESHAPES = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default})


def val(node):
    """The fake value of ``node`` (None for non-nodes or nodes without one)."""
    return node.meta.get("val") if isinstance(node, Node) else None


def tensor_val(node) -> torch.Tensor | None:
    v = val(node)
    return v if isinstance(v, torch.Tensor) else None


def is_call(node, *targets) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in targets


def static_shape(t: torch.Tensor) -> tuple[int, ...] | None:
    """The shape as ints, or None where a dimension is symbolic (dynamic shapes)."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int
    return tuple(int(s) for s in t.shape) if all(is_concrete_int(s) for s in t.shape) else None


def only_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def cast_to(node: Node) -> torch.dtype | None:
    """The dtype a cast node produces (None if ``node`` is not a cast)."""
    if is_call(node, prims.convert_element_type.default):
        return node.args[1]
    if is_call(node, aten._to_copy.default) and set(node.kwargs) <= {"dtype", "layout", "device"}:
        v = tensor_val(node)
        return v.dtype if v is not None else None
    return None


def transposed_contiguous(t: torch.Tensor) -> bool:
    """A 2-D tensor whose transpose is contiguous (``W.t()`` of a contiguous ``W``)."""
    return t.dim() == 2 and t.stride(0) == 1 and (t.shape[1] <= 1 or t.stride(1) == t.shape[0])


def group_name_of(arg) -> str | None:
    """A functional collective's group argument as the name symmcoll's ops take (torch 2.13 also
    allows a process group object there)."""
    if isinstance(arg, str):
        return arg
    name = getattr(arg, "group_name", None)
    return name if isinstance(name, str) else None


class Editor:
    """Node creation with fake values, ordering fixes and clean-up for one graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.erased: set[Node] = set()
        self._positions: dict[Node, int] | None = None
        self.fake_mode = None
        for node in graph.nodes:
            v = val(node)
            for t in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(t, torch.Tensor) and getattr(t, "fake_mode", None) is not None:
                    self.fake_mode = t.fake_mode
                    return

    # ---- order -------------------------------------------------------------------------------------

    def position(self, node: Node) -> int:
        if self._positions is None:
            self._positions = {n: i for i, n in enumerate(self.graph.nodes)}
        return self._positions[node]

    def hoist(self, node, before: Node, *, dry_run: bool = False) -> bool:
        """Make ``node`` (and its inputs, recursively) come before ``before`` by moving view-like
        nodes up; False if something that must not move (a collective, arithmetic) is in the way.
        ``dry_run``: only say whether it can."""
        if not isinstance(node, Node) or node.op in ("placeholder", "get_attr"):
            return True
        if self.position(node) < self.position(before):
            return True
        if not (is_call(node, *MOVABLE) or is_call(node, operator.getitem)):
            return False
        if not all(self.hoist(i, before, dry_run=dry_run) for i in node.all_input_nodes):
            return False
        if not dry_run:
            before.prepend(node)
            self._positions = None
        return True

    # ---- creation ----------------------------------------------------------------------------------

    def call(self, target, args: tuple, kwargs: dict | None = None, *, before: Node) -> Node:
        """A new ``target(*args, **kwargs)`` node just before ``before``, its fake value computed."""
        kwargs = kwargs or {}
        with self.graph.inserting_before(before):
            node = self.graph.call_function(target, tuple(args), kwargs)
        self._positions = None
        fake = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake[0], **fake[1])
        return node

    def reshape(self, node: Node, shape, *, before: Node) -> Node:
        if tuple(tensor_val(node).shape) == tuple(shape):
            return node
        return self.call(aten.reshape.default, (node, list(shape)), before=before)

    def contiguous(self, node: Node, *, before: Node) -> Node:
        """``node`` copied row-major if it is not. Inductor's own prim (a copy in eager mode) rather than
        ``clone``: Inductor does not impose a layout on the tensors of a ``Tensor[]`` argument, and may
        lay a clone out like its input."""
        v = tensor_val(node)
        if v.is_contiguous():
            return node
        import torch._inductor.inductor_prims  # noqa: F401  (defines prims.inductor_force_stride_order)
        strides = torch._prims_common.make_contiguous_strides_for(v.shape)
        return self.call(prims.inductor_force_stride_order.default, (node, list(strides)), before=before)

    def move_axis(self, node: Node, shape, source: int, dest: int, *, before: Node) -> Node:
        """``node`` viewed as ``shape``, axis ``source`` moved to ``dest``, materialised contiguous and
        flattened back to ``node``'s own shape: a row permutation (a copy unless it is the identity)."""
        crossed = shape[dest:source] if source > dest else shape[source + 1:dest + 1]
        if shape[source] == 1 or math.prod(crossed) == 1:
            return node  # the axis crosses only axes of extent 1: the elements keep their order
        dims = list(range(len(shape)))
        dims.insert(dest, dims.pop(source))
        viewed = self.reshape(node, shape, before=before)
        moved = self.call(aten.permute.default, (viewed, dims), before=before)
        return self.reshape(self.contiguous(moved, before=before), tuple(tensor_val(node).shape), before=before)

    # ---- replacement and clean-up ------------------------------------------------------------------

    def erase_dead(self, nodes) -> None:
        """Erase those of ``nodes`` left without users, latest first (so chains go whole)."""
        pending = [n for n in nodes if isinstance(n, Node) and n not in self.erased]
        for node in sorted(set(pending), key=self.position, reverse=True):
            if not node.users and node.op == "call_function":
                self.graph.erase_node(node)
                self.erased.add(node)
        self._positions = None
