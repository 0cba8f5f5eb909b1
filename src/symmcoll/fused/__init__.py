"""Communication fused with compute, one module per op, built on comm-style primitives, language/ and
the persistent GEMM core (gemm.py and gemm_kernel.py).

gemm.py                    the GEMM core's host side: the plain matmul, core_launch, the launch helpers
  gemm_kernel.py           its kernels: the Triton K-loop (k_loop), the tile order, matmul_kernel
  gemm_gluon.py            the plain matmul's decode kernel in Gluon (sm_90: B loaded before the PDL wait)
  gemm_split.py            tiles shared along K (wave split, stream-K) and how their parts are summed
  gemm_configs.py          the tile config type, the untuned rule, the split plan
  gemm_tables.py           the config picker (gemm_config) over the measured per-GPU tables
  gemm_candidates.py       the configs ``symmcoll tune --op gemm`` measures
all_gather_matmul.py       all_gather(A shards) @ B (column-parallel linear, SP)
  all_gather_matmul_kernel.py  its kernel (producers pull A's shards, consumers run the GEMM core's tiles)
  all_gather_matmul_rules.py   its shape rule, auto's choice and the producer-count rule
matmul_reduce_scatter.py   A @ B summed over ranks, row shards scattered (row-parallel linear, SP): tiling,
                           launches, op
  matmul_reduce_scatter_kernel.py  its kernel (tiles sent to their owner, peers' tiles added)
  matmul_reduce_scatter_chunked.py its "chunked" algorithm (cuBLAS on row chunks, copy-engine pulls, a sum)
matmul_all_reduce.py       A @ B summed over ranks (row-parallel linear)
all_reduce_rms_norm.py     all-reduce + residual add + RMSNorm (+ fp8) in one kernel: launch rules, op
  rms_one_shot.py          its one-shot kernel
  rms_two_shot.py          its two-shot kernel
  rms_rows.py              the row math both kernels share
moe.py                     MoE dispatch (pull) and combine (push), DeepEP's low-latency shape: regions, each
                           round's launches, ops
  moe_dispatch_kernels.py  the dispatch's kernels (route, pull, one-launch local)
  moe_combine_kernels.py   the combine's kernels (push, weighted sum)
  moe_dispatch_ranges.py   one-rank dispatch in one launch routed by ranges of tokens (variants 2-4)
  moe_pull_folded.py       one-rank dispatch with folded prefixes, the pull two items ahead (variant 6)
  moe_rules.py             its shape rules and launch rules (configs, dispatch variant, row parts)
  moe_nccl.py              the "nccl" algorithms: torch's all_to_all_single, one host read per dispatch
  moe_hierarchical.py      dispatch and combine across nodes (DeepEP's normal mode)
memory_bound_configs.py    launch configs of the memory-bound kernels (rms, MoE, codecs) from the measured
                           per-GPU tables

Each op's module declares the op once (``ops.declare(ops.OpSpec(...))``: its torch op, schema, fake,
input names, shape rule, "auto" default and algorithms; docs/internals.md, "A fused op") and its
regions (symmcoll.memory.regions); ``symmcoll/__init__.py`` imports the modules before any workspace is
laid out and forwards each public function to its op's spec.
"""
