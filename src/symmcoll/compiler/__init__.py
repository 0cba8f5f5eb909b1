"""symmcoll for models as they are: a torch.compile backend that rewrites functional collectives.

    compiled = torch.compile(model, backend=symmcoll.backend())     # inner="inductor"

A tensor-parallel model (DTensor's ``parallelize_module``, or functional collectives called by hand)
compiles to ATen graphs holding ``_c10d_functional`` collectives and their ``wait_tensor``. Before the
inner compiler sees a graph (forward, backward or inference), the backend rewrites it:

* a collective next to a matmul or a norm becomes a fused symmcoll op (matmul.py, rms_norm.py):
  all_gather -> matmul(s) (one call for every matmul of the gathered rows), matmul -> reduce_scatter,
  matmul -> all_reduce, all_reduce -> residual add -> RMSNorm;
* every other collective symmcoll serves becomes its symmcoll op (collectives.py);
* the rest stays as it was.

``backend.reports`` (and ``report=True``, or a logger) says what was rewritten and why the rest was
not. passes.py runs the patterns; graph.py has what they share; docs/internals.md says how to add one.
"""

from __future__ import annotations

from . import collectives, matmul, rms_norm  # noqa: F401  (register the patterns)
from .compile_backend import SymmcollBackend
from .passes import PATTERNS, Fusion, Options, Pattern, register
from .report import Entry, GraphReport


def backend(inner="inductor", *, report=False, copy_weights: str = "auto") -> SymmcollBackend:
    """A torch.compile backend that rewrites the ATen graphs' functional collectives into symmcoll ops
    (fused with the matmuls and norms around them where it can), then compiles them with ``inner``.

    inner: "inductor" (torch.compile's ``mode=``/``options=`` apply), "aot_eager", another Dynamo
      backend name or a callable(graph_module, example_inputs): each gets the rewritten ATen graphs.
    report: True prints what each graph's rewrite did (and why a collective was left); a
      ``logging.Logger`` gets it at INFO instead. ``backend(...).reports`` keeps it either way. (Inductor
      caches compiled graphs: with a report asked for, the rewrite is not cached, so it always reports.)
    copy_weights: ``nn.Linear`` multiplies by a transposed weight: "auto" fuses such a matmul and the
      fused op reads the weight as it is (no copy); "always" copies it row-major first; "never" leaves
      such a matmul unfused.
    """
    return SymmcollBackend(inner, report=report, copy_weights=copy_weights)


__all__ = ["backend", "SymmcollBackend", "GraphReport", "Entry", "Pattern", "Fusion", "Options", "PATTERNS",
           "register"]
