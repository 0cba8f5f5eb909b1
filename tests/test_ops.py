"""symmcoll inside models: torch.ops.symmcoll custom ops with fake implementations, torch.compile
(fullgraph, zero graph breaks, dynamic sizes), autograd against a single-process simulation, and
process subgroups (two groups in use at once, each with its own workspace)."""

import pytest
import torch
import torch.distributed as dist

import symmcoll
from symmcoll import reference

from rank_checks import assert_close, device, rank_coded


def _fake_shapes():
    """Every op's fake implementation gives the shape and dtype the real op returns."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    world, name = dist.get_world_size(), dist.group.WORLD.group_name
    ops = torch.ops.symmcoll
    cases = [
        (lambda t: ops.all_reduce(t, name, "sum", "auto"), (5, 3), torch.bfloat16),
        (lambda t: ops.reduce_scatter(t, name, "max", "auto"), (2 * world, 3), torch.float32),
        (lambda t: ops.all_gather(t, name, "auto"), (4, 2), torch.int8),
        (lambda t: ops.all_gather(t, name, "auto"), (), torch.float16),
        (lambda t: ops.all_to_all(t, name, None, "auto"), (world, 6), torch.bfloat16),
        (lambda t: ops.broadcast(t, world - 1, name, "auto"), (7,), torch.int64),
    ]
    for fn, shape, dtype in cases:
        real = fn(rank_coded(max(1, torch.Size(shape).numel()), dtype, dist.get_rank()).reshape(shape))
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            fake = fn(mode.from_tensor(torch.zeros(shape, dtype=dtype)))
        assert fake.shape == real.shape and fake.dtype == real.dtype, (fake.shape, real.shape)
    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        rows = ops.all_to_all(mode.from_tensor(torch.zeros(world, 6)), name, [1] * world, "auto")
        assert rows.shape[1:] == (6,) and not isinstance(rows.shape[0], int)  # known only at run time
        with pytest.raises(Exception, match="divisible"):
            ops.reduce_scatter(mode.from_tensor(torch.zeros(world + 1)), name, "sum", "auto")
    return True


def test_fake_implementations_match_real_shapes(pools):
    assert pools(2).run(_fake_shapes) == [True] * 2


def _model(x, w):
    """A tensor-parallel-ish step touching every op."""
    h = symmcoll.all_gather(x @ w)                       # [W*T, H]
    h = torch.relu(h) * 2
    s = symmcoll.reduce_scatter(h)                       # [T, H]
    s = symmcoll.all_reduce(s, op="avg") + 1
    b = symmcoll.broadcast(s, 0)
    return symmcoll.all_to_all(b.repeat(dist.get_world_size(), 1)) - 1


def _compile_fullgraph(backend):
    torch._dynamo.reset()
    rank = dist.get_rank()
    w = rank_coded(12, torch.float32, 0).reshape(4, 3)
    x = rank_coded(8, torch.float32, rank, 1).reshape(2, 4)
    explanation = torch._dynamo.explain(_model)(x, w)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(_model, fullgraph=True, backend=backend)
    assert_close(compiled(x, w), _model(x, w), f"compiled ({backend}) against eager", exact=True)
    simple = torch.compile(lambda t: symmcoll.all_reduce(t * 2) + 1, fullgraph=True, backend=backend)
    assert_close(simple(x), reference.all_reduce(x * 2) + 1, "compiled all_reduce", exact=True)
    return True


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_no_graph_breaks(pools, backend):
    assert pools(2).run(_compile_fullgraph, backend, timeout=600) == [True] * 2


def _dynamic_tokens():
    """A token count that changes between calls: at most one recompile (to a dynamic shape), exact
    results at every size."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    counter = CompileCounter()
    fn = torch.compile(lambda t: symmcoll.all_reduce(t) * 3, backend=counter, fullgraph=True)
    rank = dist.get_rank()
    for tokens in (4, 7, 13, 29, 4):
        x = rank_coded(tokens * 8, torch.bfloat16, rank, tokens).reshape(tokens, 8)
        assert_close(fn(x), reference.all_reduce(x) * 3, f"{tokens} tokens", exact=True)
    assert counter.frame_count <= 2, f"{counter.frame_count} compiles for 4 sizes"
    return counter.frame_count


def test_dynamic_shapes_do_not_recompile_per_size(pools):
    assert max(pools(2).run(_dynamic_tokens)) <= 2


def _inplace_and_errors():
    rank, world = dist.get_rank(), dist.get_world_size()
    x = rank_coded(1001, torch.float32, rank)
    want = reference.all_reduce(x)
    for algorithm in ["auto", "nccl", *sorted(symmcoll.ALGORITHMS["all_reduce"])]:
        y = x.clone()
        assert symmcoll.all_reduce_(y, algorithm=algorithm) is y
        assert_close(y, want, f"all_reduce_ {algorithm}", exact=True)
    odd = rank_coded(7, torch.bfloat16, rank)
    symmcoll.all_reduce_(odd, algorithm="sentinel_one_shot")
    assert_close(odd, reference.all_reduce(rank_coded(7, torch.bfloat16, rank)), "all_reduce_ odd bf16", exact=True)
    # Bad input: ValueError naming the argument, whichever function and algorithm.
    for name, call in _every_call(world).items():
        with pytest.raises(ValueError, match="x must be a torch.Tensor, got list"):
            call([1.0, 2.0] * world)
        with pytest.raises(ValueError, match="x is on meta"):
            call(torch.ones(2 * world, device="meta"))
    with pytest.raises(ValueError, match="x is on meta"):
        symmcoll.all_reduce(torch.ones(4, device="meta", requires_grad=True))
    return True


def _every_call(world: int) -> dict:
    """Every public function, with "auto" and with an explicit algorithm."""
    calls = {}
    for algorithm in ("auto", "nccl", "one_shot"):
        calls[f"all_reduce {algorithm}"] = lambda x, a=algorithm: symmcoll.all_reduce(x, algorithm=a)
        calls[f"all_reduce_ {algorithm}"] = lambda x, a=algorithm: symmcoll.all_reduce_(x, algorithm=a)
    for algorithm in ("auto", "pull"):
        calls[f"reduce_scatter {algorithm}"] = lambda x, a=algorithm: symmcoll.reduce_scatter(x, algorithm=a)
        calls[f"all_gather {algorithm}"] = lambda x, a=algorithm: symmcoll.all_gather(x, algorithm=a)
        calls[f"all_to_all {algorithm}"] = lambda x, a=algorithm: symmcoll.all_to_all(x, algorithm=a)
        calls[f"all_to_all splits {algorithm}"] = lambda x, a=algorithm: symmcoll.all_to_all(
            x, splits=[2] * world, algorithm=a)
        calls[f"broadcast {algorithm}"] = lambda x, a=algorithm: symmcoll.broadcast(x, 0, algorithm=a)
    return calls


def test_in_place_variant_and_input_errors(pools):
    assert pools(3).run(_inplace_and_errors) == [True] * 3


def test_calls_before_init_process_group_raise_one_error():
    # In the pytest process, where torch.distributed is not initialised.
    assert not dist.is_initialized()
    messages = set()
    for name, call in _every_call(2).items():
        for x in (torch.ones(4), [1.0, 2.0]):
            with pytest.raises(symmcoll.SymmcollError) as info:
                call(x)
            assert type(info.value) is symmcoll.SymmcollError, (name, info.value)
            messages.add(str(info.value))
    with pytest.raises(symmcoll.SymmcollError) as info:
        symmcoll.get_workspace()
    messages.add(str(info.value))
    assert len(messages) == 1, messages
    assert "torch.distributed is not initialized" in messages.pop()


# ---- autograd: gradients against a single-process simulation of every rank ------------------------

def _simulate(op, inputs, weights, world):
    """Every rank's gradient of sum_r <op(inputs)_r, weights_r>, computed in this process."""
    xs = [t.detach().clone().requires_grad_(True) for t in inputs]
    stacked = torch.stack(xs)
    if op == "all_reduce_sum":
        outs = [stacked.sum(0)] * world
    elif op == "all_reduce_avg":
        outs = [stacked.mean(0)] * world
    elif op == "all_gather":
        outs = [torch.cat(xs)] * world
    elif op == "reduce_scatter":
        total = stacked.sum(0)
        outs = list(total.chunk(world))
    else:  # broadcast from rank 1
        outs = [xs[1]] * world
    loss = sum((o * w).sum() for o, w in zip(outs, weights))
    loss.backward()
    return [t.grad if t.grad is not None else torch.zeros_like(t) for t in xs]


def _autograd(op):
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(42)
    inputs = [torch.randn(2 * world, 3, generator=g) for _ in range(world)]
    out_rows = {"all_gather": 2 * world * world, "reduce_scatter": 2}.get(op, 2 * world)
    weights = [torch.randn(out_rows, 3, generator=g) for _ in range(world)]
    x = inputs[rank].clone().requires_grad_(True)
    y = {"all_reduce_sum": lambda: symmcoll.all_reduce(x),
         "all_reduce_avg": lambda: symmcoll.all_reduce(x, op="avg"),
         "all_gather": lambda: symmcoll.all_gather(x),
         "reduce_scatter": lambda: symmcoll.reduce_scatter(x),
         "broadcast": lambda: symmcoll.broadcast(x, 1)}[op]()
    (y * weights[rank]).sum().backward()
    want = _simulate(op, inputs, weights, world)[rank]
    torch.testing.assert_close(x.grad, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"rank {rank} {op}: {m}")
    return True


@pytest.mark.parametrize("op", ["all_reduce_sum", "all_reduce_avg", "all_gather", "reduce_scatter", "broadcast"])
@pytest.mark.parametrize("world", [2, 3])
def test_autograd_matches_simulation(pools, world, op):
    assert pools(world).run(_autograd, op) == [True] * world


def _compiled_training_step():
    """Forward and backward through torch.compile (AOTAutograd traces the autograd.Functions)."""
    torch._dynamo.reset()
    rank = dist.get_rank()
    w = torch.nn.Parameter(rank_coded(12, torch.float32, 0).reshape(4, 3) / 8)
    x = rank_coded(8, torch.float32, rank, 1).reshape(2, 4)

    def step(x):
        return (symmcoll.reduce_scatter(symmcoll.all_gather(x @ w)) ** 2).sum()

    step(x).backward()
    eager = w.grad.clone()
    w.grad = None
    torch.compile(step, backend="aot_eager", fullgraph=True)(x).backward()
    assert_close(w.grad, eager, "compiled training step grad", exact=False)
    return True


def test_compiled_training_step(pools):
    assert pools(2).run(_compiled_training_step, timeout=600) == [True] * 2


# ---- subgroups -------------------------------------------------------------------------------------

def _subgroups():
    """Two TP groups of 2 inside 4 ranks (dist.new_subgroups), two cross groups (dist.new_group), and
    the world group, all in use at once: each has its own workspace and group ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tp, _ = dist.new_subgroups(2)
    cross_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    cross = cross_groups[rank % 2]
    for call in range(2):
        x = rank_coded(513, torch.bfloat16, rank, call)
        for group, members in ((tp, [rank // 2 * 2, rank // 2 * 2 + 1]), (cross, [rank % 2, rank % 2 + 2]),
                               (None, list(range(world)))):
            want = sum(rank_coded(513, torch.float32, r, call) for r in members).to(torch.bfloat16)
            for algorithm in ("auto", "one_shot", "sentinel_two_shot"):
                assert_close(symmcoll.all_reduce(x, group, algorithm=algorithm), want,
                             f"all_reduce {algorithm} over {members} call {call}", exact=True)
            gathered = symmcoll.all_gather(x, group)
            want_g = torch.cat([rank_coded(513, torch.bfloat16, r, call) for r in members])
            assert_close(gathered, want_g, f"all_gather over {members}", exact=True)
            # broadcast from group rank 1 (global rank members[1])
            assert_close(symmcoll.broadcast(x, 1, group), rank_coded(513, torch.bfloat16, members[1], call),
                         f"broadcast from group rank 1 over {members}", exact=True)
    names = {ws.group_name for ws in symmcoll.memory.workspaces()}
    assert len(names) == 3 and all(ws.world_size in (2, 4) for ws in symmcoll.memory.workspaces()), names
    return True


def test_subgroups_each_with_own_workspace(pools):
    assert pools(4).run(_subgroups) == [True] * 4


# ---- one declaration per op (no ranks) ------------------------------------------------------------------

def test_every_op_is_declared_once_in_its_module():
    """Every resolver op and every torch.ops.symmcoll op comes from one ops.OpSpec; no module but ops.py
    defines a torch op or calls plan.register_op itself."""
    import pathlib
    import re
    from symmcoll import ops, plan
    specs = ops.specs()
    assert set(plan.registered_ops()) <= set(specs), set(plan.registered_ops()) - set(specs)
    assert {"all_reduce_", "all_to_all_splits"} <= set(specs)
    for name, spec in specs.items():
        assert hasattr(torch.ops.symmcoll, name), name
        assert spec.tensor_args and spec.tensor_args[0] == 0, name
    src = pathlib.Path(symmcoll.__file__).parent
    for path in src.rglob("*.py"):
        text = path.read_text()
        if path.name not in ("ops.py", "registry.py"):
            assert not re.search(r"\bregister_op\(|_LIB\.|torch\.library\.Library\(", text), path


def test_internals_example_is_the_code():
    """docs/internals.md's worked example of a fused op is the code of fused/matmul_reduce_scatter.py and
    of symmcoll/__init__.py (docstrings aside)."""
    import ast
    import pathlib
    import re
    from symmcoll.fused import matmul_reduce_scatter
    root = pathlib.Path(__file__).resolve().parent.parent
    section = (root / "docs" / "internals.md").read_text().split("## A fused op")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)

    def statements(text):
        found = {}
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    node.body = node.body[1:]  # the docstring
                found[node.name] = ast.dump(node)
            elif isinstance(node, ast.Assign):
                found[ast.unparse(node.targets[0])] = ast.dump(node)
        return found
    code = {**statements(pathlib.Path(matmul_reduce_scatter.__file__).read_text()),
            **statements(pathlib.Path(symmcoll.__file__).read_text())}
    assert len(blocks) == 2
    for block in blocks:
        for name, dumped in statements(block).items():
            assert code.get(name) == dumped, f"docs/internals.md: {name} differs from the code"
