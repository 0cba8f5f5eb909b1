"""Scale-out on a one-GPU machine: what can be checked of the hierarchical algorithms without a second node.

    PYTHONPATH=src python3 benchmarks/scaleout_check.py --out $OUT/scaleout.json

1. NVSHMEM kernels: every exchange mode compiled for sm_90 against the image's NVSHMEM device library
   (what CI does on CPU with the nvidia-nvshmem-cu13 wheel), then *loaded* on this GPU (a CUDA module per
   kernel: registers and shared memory fit, the NVSHMEM symbols resolve). Not run: torch's NVSHMEM
   backend refuses a one-rank rendezvous, and two ranks cannot share one GPU under it.
2. The hierarchical algorithms with emulated nodes on the GPU (``_nodes``): ranks share GPU 0 (CUDA IPC, launch
   device "cuda-shared"), SYMMCOLL_RANKS_PER_NODE splits them into nodes, and the transport is the
   emulated one (stores through its own table, release/acquire signals at system scope) compiled for
   sm_90: real GPU memory ordering across processes for every collective, exact on rank-coded data,
   fresh data on repeated calls, and MoE dispatch + combine round trips (identity experts, unit weights:
   each token must come back times its number of valid slots); 2 nodes x 2 and 2 nodes x 1.
   Correctness only: the ranks are time-sliced.

``--multi-gpu`` (issue 28 point 7; scripts/gpu_check.sh scaleout-multi on >= 2 GPUs): one rank per GPU
and the NVSHMEM transport between emulated nodes of this host (SYMMCOLL_RANKS_PER_NODE=1, and half the
GPUs), the same exact checks; then `symmcoll bench` under SYMMCOLL_RANKS_PER_NODE times hierarchical
against NCCL (the stage does both).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
import torch.distributed as dist

import symmcoll
from symmcoll import launch, plan
from symmcoll.bench.checks import rank_coded

from shared_gpu_check import _expected  # the exact answer computed locally (benchmarks/ is on sys.path)

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def compile_and_load() -> list[dict]:
    """Compile each exchange mode over NVSHMEM for sm_90 and load it into a CUDA module here."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from symmcoll.comm import exchange
    from symmcoll.memory.transport import nvshmem_library

    library = nvshmem_library()
    rows = [{"check": "nvshmem_library", "path": library}]
    if library is None:
        rows[0]["error"] = "no libnvshmem_device.bc (NVSHMEM_LIB_DIR, or the nvidia-nvshmem wheel)"
        return rows
    for mode, dtype, ranks_per_node in (("all_reduce", "bf16", 8), ("reduce", "fp32", 8), ("gather", "i16", 1),
                                        ("get_gather", "i64", 2)):
        t0 = time.monotonic()
        row = {"check": "nvshmem_compile_load", "mode": mode, "dtype": dtype}
        try:
            signature = {p.name: "i32" for p in exchange.exchange_kernel.params if not p.is_constexpr}
            signature.update({"signal_pad_ptrs_dev": "i64", "status_ptr": "i64", "transport_ptrs_dev": "i64",
                              "epochs_ptr": "*i32", "signals_ptr": "*i64", "slots_ptr": f"*{dtype}",
                              "stage_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "ranks_per_node": "i32"})
            constexprs = {"NODES": 2, "MODE": exchange.MODES[mode], "REDUCE_OP": 0, "BLOCK": 4096, "TRANSPORT": 1}
            signature.update({k: "constexpr" for k in constexprs})
            compiled = triton.compile(ASTSource(exchange.exchange_kernel, signature, constexprs),
                                      target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 16, "extern_libs": (("libnvshmem_device", library),)})
            row["compile_s"] = round(time.monotonic() - t0, 1)
            row["shared_bytes"] = compiled.metadata.shared
            if torch.cuda.is_available():
                compiled._init_handles()  # cuModuleLoadData + cuModuleGetFunction on this GPU
                row.update(loaded=compiled.function is not None, registers=getattr(compiled, "n_regs", None),
                           spills=getattr(compiled, "n_spills", None))
        except Exception:  # noqa: BLE001 - report and go on with the next mode
            row["error"] = traceback.format_exc()[-1500:]
        rows.append(row)
    return rows


def _nodes(per_node: int) -> list[dict]:
    """On every rank: every hierarchical op, exact, three calls of fresh data, nodes of ``per_node``."""
    os.environ["SYMMCOLL_RANKS_PER_NODE"] = str(per_node)
    symmcoll.reset()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in OPS:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for numel in (world * 3, world * 4097, world * (1 << 18)) if cuda else (world * 3, world * 4097):
                row = {"check": "nodes", "nodes": world // per_node, "per_node": per_node, "op": op,
                       "dtype": str(dtype), "numel": numel, "wrong": 0}
                try:
                    for call in range(3):
                        x_of = lambda r: rank_coded(numel, dtype, r, call, dev)
                        row["algorithm"] = plan.resolve(op, x_of(rank)).name
                        got = getattr(symmcoll, op)(x_of(rank))
                        if cuda:
                            torch.cuda.synchronize()
                        row["wrong"] += int((got.float() != _expected(op, x_of, world, rank).float()).sum())
                    symmcoll.check()
                except Exception:  # noqa: BLE001
                    row["error"] = traceback.format_exc()[-1500:]
                    symmcoll.reset()
                rows.append(row)
    for tokens_n, hidden, k in ((5, 16, 2), (128, 7168, 8)) if cuda else ((5, 16, 2),):
        row = {"check": "nodes", "nodes": world // per_node, "per_node": per_node, "op": "moe_round_trip",
               "tokens": tokens_n, "hidden": hidden, "k": k, "wrong": 0}
        try:
            for call in range(3):
                experts = 8 * world
                g = torch.Generator().manual_seed(100 * call + rank)
                ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens_n)]).to(dev)
                ids[0, -1] = -1  # a dropped slot
                tokens = rank_coded(tokens_n * hidden, torch.bfloat16, rank, call, dev).view(tokens_n, hidden)
                recv, counts, handle = symmcoll.moe_dispatch(tokens, ids, experts)
                # Identity experts and unit weights: every token comes back times its number of valid slots.
                got = symmcoll.moe_combine(recv, torch.ones(tokens_n, k, device=dev), handle)
                want = (tokens.float() * (ids >= 0).sum(1, keepdim=True)).to(torch.bfloat16)
                if cuda:
                    torch.cuda.synchronize()
                row["wrong"] += int((got != want).sum())
                row["algorithm"] = plan.resolve("moe_dispatch", tokens, others=(ids,), options=(
                    ("num_experts", experts), ("max_rows", recv.shape[0]))).name
            symmcoll.check()
        except Exception:  # noqa: BLE001
            row["error"] = traceback.format_exc()[-1500:]
            symmcoll.reset()
        rows.append(row)
    os.environ.pop("SYMMCOLL_RANKS_PER_NODE")
    symmcoll.reset()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--multi-gpu", action="store_true",
                        help="one rank per GPU, the NVSHMEM transport between emulated nodes of this host")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="a check of this script: interpreted ranks, 2 nodes x 1")
    args = parser.parse_args()
    os.environ.setdefault("SYMMCOLL_TIMEOUT_S", "20")
    rows = compile_and_load()
    for r in rows:
        print(json.dumps(r), flush=True)
    if args.multi_gpu:
        gpus = torch.cuda.device_count()
        runs = [(gpus, per_node, "cuda") for per_node in sorted({1, gpus // 2}) if gpus >= 2]
    elif args.cpu:
        runs = [(2, 1, "cpu")]
    else:  # ranks sharing GPU 0: the emulated transport, compiled for sm_90
        runs = [(4, 2, "cuda-shared"), (2, 1, "cuda-shared")]
    for world, per_node, device in [] if args.compile_only else runs:
        t0 = time.monotonic()
        try:
            found = launch.run(_nodes, world, per_node, device=device, timeout=110)[0]
        except Exception:  # noqa: BLE001
            found = [{"check": "nodes", "nodes": world // per_node, "per_node": per_node,
                      "error": traceback.format_exc()[-2000:]}]
        for r in found:
            r["device"] = device
        rows += found
        print(f"{device}: {world // per_node} nodes x {per_node}: {len(found)} cases, "
              f"{sum(1 for r in found if not r.get('wrong') and not r.get('error'))} exact, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
    info = {"git": os.environ.get("SYMMCOLL_GIT_SHA", "unknown"), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "mode": "NVSHMEM compile + load; hierarchical ops with emulated nodes (correctness only)"}
    with open(args.out, "w") as f:
        json.dump({"info": info, "rows": rows}, f, indent=1)
    bad = [r for r in rows if r.get("wrong") or r.get("error")]
    print(f"PROBLEMS ({len(bad)}):")
    for r in bad:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
