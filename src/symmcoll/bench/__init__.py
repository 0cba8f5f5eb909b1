"""The benchmark behind ``symmcoll bench``: every implementation of a collective beside NCCL and torch's
symmetric-memory ops, in one run, with nccl-tests columns (see DESIGN.md, "Benchmarks").

Two sides, because collectives need one process per rank:

* rank side (runs inside every rank, under ``symmcoll.launch.RankPool`` or torchrun):
  ``worker`` (entry points: describe, run_case, measure_link), ``impls`` / ``baselines`` (what is
  measured), ``checks`` (rank-coded inputs, ``#wrong``), ``timing`` (graph replay, eager, CPU),
  ``link`` (peer-copy bandwidth; torch's ops get their symmetric allocations from
  ``memory.torch_buffers``);
* parent side (one process, or rank 0 under torchrun): ``driver`` (the sweep and its progress bar),
  ``report`` (rich tables), ``results`` (the JSON file), ``plot`` (PNGs from result files only).

``sizes`` and ``metrics`` are plain arithmetic shared by both.

One home for benchmark code: this package holds everything ``symmcoll bench`` / ``symmcoll tune`` run
(and what they share: ``timing``'s one CUDA-event loop and host-time loop). The repository's
``benchmarks/`` holds only scripts run by hand or by a GPU stage (probes, sweeps, the one-GPU checks,
the README's tables from result files) and their results; they time through ``timing`` too. Nothing
outside the benchmark (models, the library) imports from here.
"""
