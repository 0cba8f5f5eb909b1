"""``symmcoll.backend(...)``: the torch.compile backend object.

inner="inductor": Inductor as usual (``mode=`` and ``options=`` of torch.compile apply), with the
rewrite as its ``post_grad_custom_pre_pass``: it sees the forward, backward and inference graphs after
Inductor's decompositions, before Inductor's own pattern passes and lowering. Any pre-pass configured
already runs after ours.

Any other inner: AOTAutograd (min-cut partitioner, as torch's "aot_eager") with forward, backward and
inference compilers that rewrite the ATen graph, then hand it to the inner compiler: "aot_eager" runs
it as it is; another name is looked up among Dynamo's backends, and a callable is called, as
``inner(graph_module, example_inputs)``, both with the rewritten ATen graph.
"""

from __future__ import annotations

import logging
import os
from typing import Callable

from .passes import COPY_WEIGHTS, Options, graph_kind, rewrite
from .report import GraphReport

log = logging.getLogger("symmcoll.compiler")
_SOURCES = tuple(os.path.join(os.path.dirname(__file__), name) for name in sorted(os.listdir(os.path.dirname(__file__)))
                 if name.endswith(".py"))


class SymmcollBackend:
    """A torch.compile backend: ``torch.compile(model, backend=symmcoll.backend())``.

    ``reports``: a ``GraphReport`` per graph compiled on this rank (forward, backward, inference), in
    order: each functional collective, what it became, or why it was left. Inductor serves graphs it
    compiled before (in this or an earlier process) from its cache, without the rewrite: they are in
    ``reports`` only when a report was asked for (``report=True`` or a logger turns that cache off).
    """

    def __init__(self, inner: str | Callable = "inductor", *, report: bool | logging.Logger = False,
                 copy_weights: str = "auto"):
        if not (isinstance(inner, str) or callable(inner)):
            raise ValueError(f"inner must be a backend name ('inductor', 'aot_eager', ...) or a compiler "
                             f"callable(graph_module, example_inputs), got {type(inner).__name__}")
        if not isinstance(report, (bool, logging.Logger)):
            raise ValueError(f"report must be True, False or a logging.Logger, got {type(report).__name__}")
        if copy_weights not in COPY_WEIGHTS:
            raise ValueError(f"copy_weights must be one of {COPY_WEIGHTS}, got {copy_weights!r}")
        self.inner = inner
        self.report = report
        self.options = Options(copy_weights)
        self.reports: list[GraphReport] = []

    def __repr__(self) -> str:
        return f"symmcoll.backend(inner={self.inner!r}, copy_weights={self.options.copy_weights!r})"

    def rewrite(self, graph, kind: str | None = None) -> GraphReport:
        """Rewrite one ATen graph in place (what the compilers below call); records and emits the report."""
        report = rewrite(graph, kind or graph_kind(graph), self.options)
        self.reports.append(report)
        if self.report is True:
            print(report, flush=True)
        elif self.report:
            self.report.info("%s", report)
        else:
            log.debug("%s", report)
        return report

    def __call__(self, gm, example_inputs, *, mode: str | None = None, options: dict | None = None):
        if self.inner == "inductor":
            return self._inductor(gm, example_inputs, mode, options)
        if mode not in (None, "default") or options:
            raise ValueError(f"torch.compile's mode= and options= configure Inductor; this backend's inner is "
                             f"{self.inner!r} (use symmcoll.backend(inner='inductor'))")
        from functorch.compile import min_cut_rematerialization_partition
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=self._aot_compiler("forward"), bw_compiler=self._aot_compiler("backward"),
                            inference_compiler=self._aot_compiler("inference"),
                            partition_fn=min_cut_rematerialization_partition,
                            keep_inference_input_mutations=True)(gm, example_inputs)

    # ---- inner compilers ---------------------------------------------------------------------------

    def _inductor(self, gm, example_inputs, mode, options):
        from torch._inductor import config, list_mode_options
        from torch._inductor.compile_fx import compile_fx

        patches = {**(list_mode_options(mode) if mode not in (None, "default") else {}), **(options or {})}
        previous = patches.get("post_grad_custom_pre_pass", config.post_grad_custom_pre_pass)
        patches["post_grad_custom_pre_pass"] = _inductor_pass(self, previous)
        return compile_fx(gm, example_inputs, config_patches=patches)

    def _aot_compiler(self, kind: str):
        def compile_graph(gm, example_inputs):
            from functorch.compile import make_boxed_func

            self.rewrite(gm.graph, kind)
            gm.recompile()
            if self.inner == "aot_eager":
                return make_boxed_func(gm.forward)
            if isinstance(self.inner, str):
                from torch._dynamo.backends.registry import lookup_backend
                compiled = lookup_backend(self.inner)(gm, example_inputs)
            else:
                compiled = self.inner(gm, example_inputs)
            return compiled if getattr(compiled, "_boxed_call", False) else make_boxed_func(compiled)

        return compile_graph


def _inductor_pass(backend: SymmcollBackend, previous):
    """The rewrite as an Inductor post-grad pre-pass (a CustomGraphPass: its uuid keys Inductor's
    caches), then ``previous`` (what was configured before)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    chained = tuple(previous) if isinstance(previous, (list, tuple)) else (previous,) if previous else ()

    class SymmcollRewrite(CustomGraphPass):
        def __call__(self, graph) -> None:
            backend.rewrite(graph)
            for other in chained:
                other(graph)

        def uuid(self):
            # A cached graph skips the pass: with a report asked for, compile afresh so that it is complete.
            if backend.report or any(getattr(p, "uuid", lambda: None)() is None for p in chained):
                return None
            return (get_hash_for_files(_SOURCES, repr(backend.options)).hex(),
                    *(p.uuid() for p in chained))

    return SymmcollRewrite()
