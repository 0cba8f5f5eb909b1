"""What each way of going wrong does to the compiled inference block's errors, per rank, on CPU: the
table to hold a GPU failure of tests/test_compile_backend.py's "tp inference" case against.

The block (tests/llama_client.py, tensor parallel, two ranks, copy_weights="never": the backend puts
symmcoll.all_reduce_rms_norm after the attention and symmcoll.all_reduce after the feed-forward) runs
three calls, as block_run does on the GPU, with one fault injected from call 1 on (a CPU kernel of the
op registered over the real one, which it calls first): the op's result replaced on the ranks named.
Printed: each rank's relative error per call, against the unsharded block.

Run 2026-11-24 (GPU failure: rank 0 0.159, rank 1 1.30): a fault of all_reduce_rms_norm on rank 1 only
is the one kind that makes the ranks' errors differ about tenfold with rank 1's the larger (own
contribution lost in every row: 0.066 / 0.67; zeros: 0.30 / 4.7); faults on both ranks, or of
all_reduce, give equal errors or a small one on rank 1's side. A memory fault of the compiled graph
(the same graph on both ranks) is of the "both" kind.

    PYTHONPATH=src:tests python3 benchmarks/block_fault_signatures.py [FAULT:RANKS ...]

FAULT one of FAULTS, RANKS e.g. 1 or 0,1; by default a list covering every kind (about 2 minutes).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

# rms: all_reduce_rms_norm's (normed, new residual); ar: all_reduce's result
FAULTS = ("rms_own_lost", "rms_peer_lost", "rms_zero", "rms_stale", "rms_stale_normed", "ar_own_lost", "ar_stale",
          "ar_zero")
DEFAULT = ("rms_own_lost:1", "rms_peer_lost:1", "rms_zero:1", "rms_stale:1", "rms_own_lost:0,1", "rms_stale:0,1",
           "rms_stale_normed:0,1", "ar_own_lost:1", "ar_own_lost:0,1", "ar_stale:0,1", "ar_zero:0,1")


def _rms_norm(h, weight, eps):
    return (h.float() * torch.rsqrt(h.float().square().mean(-1, keepdim=True) + eps) * weight.float()).to(h.dtype)


def _install(fault: str, faulty: bool):
    """Register CPU kernels of the two ops that call the real ones and, on a faulty rank from the second
    call on, return ``fault``'s result instead. Returns the library (keep it alive)."""
    from symmcoll import ops
    from symmcoll.fused import all_reduce_rms_norm as rms
    calls, previous = {"ar": 0, "rms": 0}, {}

    def all_reduce(x, group_name, reduce_op, algorithm):
        out = ops.all_reduce_impl(x, group_name, reduce_op, algorithm)
        stale, previous["ar"] = previous.get("ar"), out.clone()
        calls["ar"] += 1
        if not (faulty and calls["ar"] > 1 and fault.startswith("ar_")):
            return out
        return {"ar_own_lost": lambda: out - x, "ar_stale": lambda: stale, "ar_zero": lambda: torch.zeros_like(out)}[fault]()

    def all_reduce_rms_norm(x, residual, weight, eps, group_name, algorithm, quant, scale=None):
        normed, h, scales = rms.all_reduce_rms_norm_impl(x, residual, weight, eps, group_name, algorithm, quant, scale)
        stale, previous["rms"] = previous.get("rms"), (normed.clone(), h.clone())
        calls["rms"] += 1
        if not (faulty and calls["rms"] > 1 and fault.startswith("rms_")):
            return normed, h, scales
        if fault == "rms_stale":
            return (*stale, scales)
        if fault == "rms_stale_normed":
            return stale[0], h, scales
        if fault == "rms_zero":
            return torch.zeros_like(normed), torch.zeros_like(h), scales
        total = h.float() - residual.float()  # the sum over ranks
        part = total - x.float() if fault == "rms_own_lost" else x.float()
        wrong = (residual.float() + part).to(h.dtype)
        return _rms_norm(wrong, weight, eps), wrong, scales

    lib = torch.library.Library("symmcoll", "IMPL")
    lib.impl("all_reduce", all_reduce, "CPU")
    lib.impl("all_reduce_rms_norm", all_reduce_rms_norm, "CPU")
    return lib


def signature(fault: str, ranks: tuple[int, ...]) -> list[float]:
    """On each rank: the block's relative error per call with ``fault`` injected on ``ranks``."""
    import test_compile_backend as t
    lib = _install(fault, dist.get_rank() in ranks)
    try:
        per_call = t.block_run(False, {"inner": "aot_eager", "copy_weights": "never"}, False, False, None, 3)[3]
    finally:
        lib._destroy()
    return [round(c["unsharded"], 4) for c in per_call]


def main(argv: list[str]) -> None:
    from symmcoll import launch
    cases = argv or list(DEFAULT)
    with launch.RankPool(2, device="cpu") as pool:
        for case in cases:
            fault, ranks = case.split(":")
            if fault not in FAULTS:
                raise ValueError(f"FAULT must be one of {FAULTS}, got {fault!r}")
            errors = pool.run(signature, fault, tuple(int(r) for r in ranks.split(",")), timeout=600)
            print(f"{fault:18s} on rank(s) {ranks:4s}  " + "  ".join(f"rank {r}: {e}" for r, e in enumerate(errors)),
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
