"""Collectives as Triton kernels over symmetric memory, one module per protocol family:

pull.py         barrier-based pulls: all_reduce one_shot / two_shot, reduce_scatter pull
low_latency.py  LL flags in the data: all_reduce low_latency
sentinel.py     Lamport sentinels: all_reduce sentinel_one_shot / sentinel_two_shot, reduce_scatter sentinel
push.py         remote stores: reduce_scatter push, all_reduce push_copy_engine
tree.py         double binary tree: all_reduce tree
gather.py       data movement by pulls: all_gather pull / copy_engine, broadcast pull
all_to_all.py   data movement: all_to_all pull (device-side splits published in the kernel)
all_to_all_sentinel.py  Lamport sentinels for data movement: all_to_all sentinel (barrier-free)
all_to_all_copy_engine.py  staggered copy-engine steps: all_to_all copy_engine (bandwidth)
splits.py       the all-to-all family's shared host side: shape rule, split exchange, rounds, "auto" default
exchange.py     the cross-node exchange through the transport (groups that span nodes)
hierarchical.py node phases + exchange: all_reduce / reduce_scatter / all_gather / all_to_all hierarchical
quantized.py    quantized two-shot (int8 / fp8 / int4 on the wire): op all_reduce_quantized
backend.py      the process group's own collectives ("nccl")
collectives.py  the collectives' op declarations (ops.OpSpec: schema, implementation, fake, shape rule)

Importing this package registers every algorithm (symmcoll.registry) and declares every region
(symmcoll.memory.regions). No module imports a sibling; shared device code lives in symmcoll.language.
"""

from . import (all_to_all, all_to_all_copy_engine, all_to_all_sentinel, backend, gather, low_latency,  # noqa: F401
               pull, push, quantized, sentinel, collectives, splits, tree)
from . import exchange, hierarchical  # noqa: F401  (groups that span nodes)
