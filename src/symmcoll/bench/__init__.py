"""The benchmark behind ``symmcoll bench``: every implementation of a collective beside NCCL and torch's
symmetric-memory ops, in one run, with nccl-tests columns (see DESIGN.md, "Benchmarks").

Two sides, because collectives need one process per rank:

* rank side (runs inside every rank, under ``symmcoll.launch.RankPool`` or torchrun):
  ``worker`` (entry points: describe, run_case, measure_link), ``impls`` / ``baselines`` (what is
  measured), ``checks`` (rank-coded inputs, ``#wrong``), ``timing`` (graph replay, eager, CPU),
  ``symm_buffers`` (symmetric allocations for torch's ops), ``link`` (peer-copy bandwidth);
* parent side (one process, or rank 0 under torchrun): ``driver`` (the sweep and its progress bar),
  ``report`` (rich tables), ``results`` (the JSON file), ``plot`` (PNGs from result files only).

``sizes`` and ``metrics`` are plain arithmetic shared by both.
"""
