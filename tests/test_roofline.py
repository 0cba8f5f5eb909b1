"""The roofline pieces (symmcoll.bench.roofline, benchmarks/roofline.py) on CPU: the codec kernels agree with
the emulation (symmcoll.reference) value for value and never send the sentinel, the byte models count what the kernels must move, and the one-GPU sweep runs end to end on a CPU rank
(tiny cases, interpreted: a check of the harness, not a measurement)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from symmcoll.bench import roofline


def _codecs():
    from symmcoll import reference
    from symmcoll.language import EMPTY
    g = torch.Generator().manual_seed(5)
    for fmt in ("int8", "fp8", "int4"):
        for dtype, group_size in ((torch.bfloat16, 64), (torch.float32, 32), (torch.bfloat16, 128)):
            x = (torch.randn(4096, generator=g) * 3).to(dtype)
            x[:64] = 0.0
            x[64:96] = -0.0
            x[200] = float("inf")  # its group decodes to NaN
            x[300] = float("nan")
            words, scales = roofline.codec_buffers(x.numel(), fmt, group_size, x.device)
            out = torch.empty_like(x)
            roofline.quantize(x, words, scales, fmt, group_size)
            roofline.dequantize(words, scales, out, fmt, group_size)
            want = reference.dequantize_groups(*reference.quantize_groups(x.float(), fmt, group_size)).to(dtype)
            same = (out == want) | (out.isnan() & want.isnan())
            assert bool(same.all()), f"{fmt} G{group_size} {dtype}: differs at {(~same).nonzero()[:4].tolist()}"
            for bad in (200, 300):  # the whole group of a non-finite value decodes to NaN
                first = bad // group_size * group_size
                assert bool(out[first:first + group_size].isnan().all()), f"{fmt} G{group_size}: group of {bad}"
            assert not bool((words == EMPTY.value).any()), f"{fmt}: a data word equals the sentinel"
    return True


def test_codec_kernels_match_the_emulation(pools):
    assert pools(1).run(_codecs) == [True]


def test_bytes_each_kernel_must_move():
    s = 8192 * 6144 * 2
    assert roofline.rms_norm_bytes(8192, 6144, 2, None) == 4 * s + 6144 * 2
    assert roofline.rms_norm_bytes(8192, 6144, 2, "fp8_per_token") == 3 * s + s // 2 + 6144 * 2 + 4 * 8192
    assert roofline.rms_norm_bytes(8192, 6144, 2, None, 4, "one_shot") == 4 * s + 6144 * 2 + 9 * s
    assert roofline.rms_norm_bytes(8192, 6144, 2, None, 4, "two_shot") == 4 * s + 6144 * 2 + 6 * 3 * s // 4
    # int8, G = 64, bf16: 0.5 + 2 / 64 code bytes per input byte
    assert roofline.code_ratio("int8", 64, 2) == 0.5 + 2 / 64
    assert roofline.codec_bytes(1 << 20, 2, "int4", 32) == (1 << 20) * (1 + 0.25 + 4 / 64)
    assert roofline.quantized_all_reduce_bytes(1 << 20, 2, "int8", 64, 1) == 2 << 20
    assert roofline.quantized_all_reduce_bytes(1 << 20, 2, "int8", 64, 2) == int((2 + 3 * (0.5 + 2 / 64)) * (1 << 20))
    # Two tokens of 10-byte rows, top-2 of 4 experts on 2 ranks (2 per rank), seen from rank 0: token 0
    # goes to experts 0 and 3 (rank 0 and rank 1), token 1 to expert 2 and a dropped slot.
    ids = torch.tensor([[0, 3], [2, -1]])
    dispatch, combine = roofline.moe_bytes(ids, 4, 2, 0, 10, 8, 4)
    slots, remote_rows, remote_slots = 3, 2, 2
    assert dispatch == 2 * 10 + slots * 10 + 4 * 8 + 2 * slots * 8 + 4 * 8 + 2 * 10 + remote_rows * 10
    assert combine == slots * 10 + 2 * 10 + 4 * 8 + 4 * (4 + 8) + 2 * remote_slots * 10
    one_rank = roofline.moe_bytes(ids, 4, 1, 0, 10, 8, 4)
    assert one_rank == (2 * 10 + slots * 10 + 4 * 8 + 2 * slots * 8 + 4 * 8, slots * 10 + 2 * 10 + 4 * 8 + 4 * 12)


def test_roofline_sweep_on_a_cpu_rank(tmp_path):
    """benchmarks/roofline.py --smoke: every section runs, every candidate is checked (none wrong), the
    JSON has provenance and the table comes last."""
    out = tmp_path / "roofline.json"
    cmd = [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "roofline.py"), "--smoke", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["provenance"]["device_type"] == "cpu" and not result["skipped"]
    rows = result["rows"]
    assert {r["section"] for r in rows} == {"rms", "moe_dispatch", "moe_combine", "moe_route", "moe_move", "codec"}
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    assert {r["name"] for r in rows if r["section"] == "rms"} >= {"torch eager", "symmcoll:one_shot", "symmcoll:two_shot"}
    assert all(r["us"] > 0 and (r["section"] == "moe_route" or r["bytes"] > 0) for r in rows)
    assert proc.stdout.strip().splitlines()[-1].startswith("codec")


def _specs_on_cpu():
    """What `symmcoll bench` does before it times a memory-bound op (GPU only), on a CPU rank: inputs,
    every symmcoll algorithm and baseline (torch.compile aside) checked against its reference, bytes
    counted for the rows that have a model."""
    from symmcoll import plan
    from symmcoll.bench import fused
    device = torch.device("cpu")
    for op, shapes in (("all_reduce_rms_norm", [(5, 40), (3, 48, 2)]), ("moe_dispatch", [(20, 16, 8, 2)]),
                       ("moe_combine", [(20, 16, 8, 2)])):
        spec = fused.SPECS[op]
        for shape in shapes:
            tolerance = (spec.tolerance and spec.tolerance(shape, "bf16")) or fused.TOLERANCE["bf16"]
            impls = [(n, lambda i, n=n: spec.call(spec.run, n, i, None, shape=shape))
                     for n in [*plan.algorithms(op, kernels_only=False), "auto"]]
            impls += [(n, lambda i, make=make: spec.call(make, i, None, shape=shape)())
                      for n, make in spec.baselines.items() if "compile" not in n]
            for name, run in impls:
                inputs = spec.inputs(shape, torch.bfloat16, 0, 1, 0, device)
                reference = spec.baseline_references.get(name, spec.reference)
                want = spec.call(reference, inputs, None, shape=shape)
                err = spec.checked_error(run(inputs), want, inputs, None, shape)
                assert err <= tolerance, f"{op} {shape} {name}: relative error {err:.2e}"
                nbytes = spec.bytes(shape, torch.bfloat16, 1, name, inputs, 0)
                assert nbytes is None or nbytes > 0, (op, name, nbytes)
            if spec.local is not None:
                assert spec.local(shape, torch.bfloat16, device)() is not None
    return True


def test_memory_bound_bench_specs_check_on_a_cpu_rank(pools):
    assert pools(1).run(_specs_on_cpu) == [True]
