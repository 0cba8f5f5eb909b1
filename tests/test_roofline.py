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
    # (a dispatch in one launch on one rank, as on CPU, has no moe_route row)
    assert {"rms", "moe_dispatch", "moe_combine", "moe_move", "codec"} <= {r["section"] for r in rows} <= \
        {"rms", "moe_dispatch", "moe_combine", "moe_route", "moe_move", "codec"}
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    assert {r["name"] for r in rows if r["section"] == "rms"} >= {"torch eager", "symmcoll:one_shot", "symmcoll:two_shot"}
    assert all(r["us"] > 0 and (r["section"] == "moe_route" or r["bytes"] > 0) for r in rows)
    assert proc.stdout.strip().splitlines()[-1].startswith("codec")
    table = tmp_path / "table.json"  # the launch table of a result (no candidates in the smoke: no entries)
    proc = subprocess.run([*cmd[:2], "--out", str(out), "--write-table", str(table)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"rms", "moe_dispatch", "moe_combine", "codec", "provenance"} <= set(json.loads(table.read_text()))


def test_dispatch_variant_sweep_on_a_cpu_rank(tmp_path):
    """benchmarks/roofline.py --smoke --parts dispatch: every dispatch variant's candidates checked (none
    wrong) and timed, the per-variant table last, and the launch table keeps the pick's variant."""
    out = tmp_path / "roofline.json"
    cmd = [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "roofline.py"), "--smoke", "--out", str(out)]
    proc = subprocess.run([*cmd, "--parts", "dispatch"], capture_output=True, text=True,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    assert {r["section"] for r in rows} <= {"moe_dispatch", "moe_route", "moe_move"}
    assert {r.get("variant") for r in rows if r["name"] == "symmcoll:pull"} == {0, 2, 3, 4, 5, 6}
    # the launches alone: the default's, then variant 5's and 6's first candidate's (on a CPU rank every
    # candidate launches the CPU's dispatch: its one launch)
    alone = [r["config"] for r in rows if r["section"] == "moe_move"]
    assert alone == ["default", "b8192/p528/w4/tt1/v5", "b8192/p528/w4/tt1/v6"], alone
    last = proc.stdout.strip().splitlines()[-1].split()
    # the default (its row names the GPU's untuned variant, 0), 2-6 and torch timed; no variant 1 candidate
    assert last[0] == "20x16x8x3" and len(last) == 9 and last[2] == "-" and "-" not in last[3:] + [last[1]], last
    table = tmp_path / "table.json"
    proc = subprocess.run([*cmd[:2], "--out", str(out), "--write-table", str(table)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [entry] = json.loads(table.read_text())["moe_dispatch"]
    assert entry["experts"] == 8 and entry["variant"] in (0, 2, 3, 4, 5, 6) and "local_slots" in entry


def test_combine_part_on_a_cpu_rank(tmp_path):
    """benchmarks/roofline.py --smoke --parts combine: moe_dispatch and moe_combine with their default
    configs only (no candidate), each checked (none wrong) and timed beside torch."""
    out = tmp_path / "roofline.json"
    cmd = [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "roofline.py"), "--smoke", "--out", str(out),
           "--parts", "combine"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r]
    assert {(r["section"], r["name"]) for r in rows} >= {("moe_combine", "symmcoll:push"),
                                                        ("moe_combine", "torch gather+sum")}
    assert {r.get("config") for r in rows if r["name"].startswith("symmcoll")} == {"default"}


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


def _rms_loads_ahead():
    """all_reduce_rms_norm's one-shot kernel on one rank with the next step's loads issued ahead
    (RmsConfig.ahead; whole rows then hold the weight): whole rows and rows in chunks (an odd H: a chunk
    past the row's end), 2 programs over 11 rows (several steps each) and 16 (a row a program, some with
    none), bf16 and fp16, plain, per-tensor and per-token fp8: the same bits as without loads ahead, and
    within tolerance of the reference."""
    from symmcoll import plan, reference
    from symmcoll.fused.memory_bound_configs import RmsConfig
    g = torch.Generator().manual_seed(3)
    for dtype, h, block, quant, programs in (
            (torch.bfloat16, 48, 64, None, 2), (torch.bfloat16, 33, 16, None, 2),
            (torch.float16, 48, 32, "fp8_per_token", 2), (torch.bfloat16, 40, 64, "fp8_per_token", 2),
            (torch.bfloat16, 48, 64, "fp8_per_token", 16), (torch.float16, 40, 64, "fp8_per_tensor", 16)):
        what = f"{dtype} H {h} block {block} {quant} {programs} programs"
        x, residual = (torch.randn(11, h, generator=g).to(dtype) for _ in range(2))
        weight = torch.randn(h, generator=g).to(dtype)
        others = (residual, weight) + ((torch.tensor([0.01]),) if quant == "fp8_per_tensor" else ())
        got = [plan.resolve("all_reduce_rms_norm", x, None, "one_shot", config=RmsConfig(block, programs, 4, ahead),
                            others=others, options=(("eps", 1e-6), ("quant", quant))).execute(
            x, others=others)[:2 + (quant == "fp8_per_token")] for ahead in (True, False)]
        for a, b, name in zip(*got, ("normed", "new residual", "scales")):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{what}: {name} differs with loads ahead"
        assert torch.equal(got[0][1], (x.float() + residual.float()).to(dtype)), f"{what}: new residual, rounded once"
        per_tensor = others[2] if quant == "fp8_per_tensor" else None
        want = reference.all_reduce_rms_norm(x, residual, weight, 1e-6, quant=quant, scale=per_tensor)
        if quant == "fp8_per_tensor":  # a scale that leaves values past +-448: saturated, as the reference clamps
            clamped = want[0].abs() == 448
            assert bool(clamped.any()) and torch.equal(got[0][0].float()[clamped], want[0][clamped]), what
        scale = {"fp8_per_token": lambda out: out[2], "fp8_per_tensor": lambda out: per_tensor}.get(quant,
                                                                                                     lambda out: 1)
        normed = got[0][0].float() * scale(got[0])
        err = float((normed - want[0].float() * scale(want)).norm() / want[0].float().norm())
        assert err < (0.07 if quant else 2e-2), f"{what}: normed, relative error {err:.2e}"
    return True


def test_rms_norm_loads_ahead_on_one_rank(pools):
    assert pools(1).run(_rms_loads_ahead) == [True]


def _rms_one_step_and_even_rows():
    """all_reduce_rms_norm's one-shot kernel on one rank where the grid takes every step (ONE_STEP: no
    loop, every row of a program exists) and rows fill their block (EVEN_H: no column masks, the mean a
    constant division), beside the looped, masked code: 2 programs over 11 rows (several steps each),
    16 (one step each) and a cap of 2 with ``every_step`` (a program per step past the cap); H 64
    (= BLOCK_H) and 48; whole rows, one or two per step, and chunks;
    bf16, fp16 and fp32, plain and per-token fp8: the same bits either way, the new residual rounded
    once, normed within tolerance of the reference."""
    from symmcoll import launcher, plan, reference
    from symmcoll.fused.memory_bound_configs import RmsConfig
    g = torch.Generator().manual_seed(11)
    for dtype, h, block, quant in ((torch.bfloat16, 64, 64, None), (torch.float16, 64, 128, "fp8_per_token"),
                                   (torch.float32, 64, 16, None), (torch.bfloat16, 64, 32, "fp8_per_token"),
                                   (torch.bfloat16, 48, 64, None), (torch.float32, 64, 64, "fp8_per_token")):
        x, residual = (torch.randn(11, h, generator=g).to(dtype) for _ in range(2))
        x[0, :3], residual[0, :3] = -0.0, -0.0  # a sum of -0 and -0: +0, as the reference's sum over ranks
        x[1, 0], residual[1, 0], residual[2, 1] = -0.0, 0.0, -0.0
        weight = torch.randn(h, generator=g).to(dtype)
        got = {}
        for programs, ahead, every_step in ((2, False, False), (2, True, False), (16, False, False),
                                            (16, True, False), (2, False, True)):
            config = RmsConfig(block, programs, 4, ahead, every_step)
            run = lambda: plan.resolve(  # noqa: E731
                "all_reduce_rms_norm", x, None, "one_shot", config=config, others=(residual, weight),
                options=(("eps", 1e-6), ("quant", quant))).execute(x, others=(residual, weight))
            got[programs, ahead, every_step] = run()[:2 + (quant == "fp8_per_token")]
            if every_step:  # a program per step past the cap of 2, no loop
                with launcher.recording() as launches:
                    run()
                steps = -(-11 // max(1, block // 64))
                assert [(r.grid, r.meta["ONE_STEP"]) for r in launches] == [((steps,), True)], launches
        what = f"{dtype} H {h} block {block} {quant}"
        first = got[2, False, False]
        for key, out in got.items():
            for a, b, name in zip(out, first, ("normed", "new residual", "scales")):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{what}: {name} of {key} differs"
        want = reference.all_reduce_rms_norm(x, residual, weight, 1e-6, quant=quant)
        assert torch.equal(first[1].view(torch.uint8), want[1].to(dtype).view(torch.uint8)), \
            f"{what}: new residual not the reference's bits (rounded once, -0 + -0 = +0)"
        scale = (lambda out: out[2]) if quant else (lambda out: 1)
        err = float((first[0].float() * scale(first) - want[0].float() * scale(want)).norm() / want[0].float().norm())
        assert err < (0.07 if quant else 2e-2), f"{what}: normed, relative error {err:.2e}"
    return True


def test_rms_norm_one_step_and_even_rows_on_one_rank(pools):
    assert pools(1).run(_rms_one_step_and_even_rows) == [True]


def test_shipped_defaults_are_the_tables_picks(monkeypatch):
    """On one GPU rank the defaults of all_reduce_rms_norm, moe_dispatch / moe_combine and the codec
    kernels are, case for case, the configs the shipped H200 table (data/roofline_h200.json) holds;
    between its cases the nearest measured hidden size and the largest measured token count below;
    the untuned rules on more ranks, for fp32 rows and where no measured hidden size is near."""
    from types import SimpleNamespace
    from symmcoll import plan
    from symmcoll.fused import all_reduce_rms_norm as arn
    from symmcoll.fused import memory_bound_configs as mbc
    from symmcoll.fused import moe_rules
    table = mbc.load_table("h200")
    assert table["rms"] and table["moe_dispatch"] and table["moe_combine"] and table["codec"]
    monkeypatch.setattr(mbc, "device_table", lambda device: table if device.type == "cuda" else {})
    cuda = torch.device("cuda")

    def rms(tokens, hidden, quant, world=1, dtype=torch.bfloat16):
        request = plan.Request(arn.OP, (tokens, hidden), dtype, cuda, options=(("eps", 1e-6), ("quant", quant)))
        return arn.gpu_config(request, world)
    for e in table["rms"]:
        cfg, block_h = rms(e["tokens"], e["hidden"], None if e["quant"] == "bf16" else e["quant"]), 1 << (e["hidden"] - 1).bit_length()
        shape = {"rows": cfg.block // block_h} if cfg.block >= block_h else {"chunk": cfg.block}
        assert {**shape, "per_thread": cfg.block // (32 * cfg.num_warps), "programs": cfg.max_programs,
                "ahead": cfg.ahead} == {f: e[f] for f in ("rows", "chunk", "per_thread", "programs", "ahead") if f in e}
    entry = lambda **key: next(e for e in table["rms"] if all(e[f] == v for f, v in key.items()))  # noqa: E731
    for (tokens, hidden), (at_tokens, at_hidden) in (((138, 6144), (32, 6144)), ((100000, 7168), (8192, 8192)),
                                                      ((1, 2048), (32, 4096)), ((3000, 16000), (2048, 16384))):
        assert rms(tokens, hidden, None) == mbc.rms_config(entry(tokens=at_tokens, hidden=at_hidden, quant="bf16"),
                                                           1 << (hidden - 1).bit_length())
    untuned = plan.LaunchConfig(8192, 1024, 16)
    # Several ranks: the untuned rule up to the one-shot launch sizes (512 KiB on 2), the bulk rule past them
    # (one program an SM, 4096-value chunks of a row at 16 bytes a thread: 16 warps).
    assert rms(32, 8192, None, world=2) == untuned and rms(512, 8192, None, dtype=torch.float32) == untuned
    assert rms(512, 8192, None, world=2) == plan.LaunchConfig(4096, arn.num_sms(cuda), 16)
    assert rms(512, 1024, None) == plan.LaunchConfig(1024, 1024, 4)  # no hidden size within a factor of 2

    for op in ("moe_dispatch", "moe_combine"):
        for e in table[op]:
            fake = SimpleNamespace(ws=SimpleNamespace(device=cuda), config=None, world=1)
            cfg, tt, local_slots, variant = moe_rules.pick_launch(fake, op, e["tokens"], e["hidden"], e["k"],
                                                                  e["experts"])
            assert (cfg.block, cfg.max_programs, cfg.num_warps, tt, local_slots, variant) == \
                (e["block"], e["programs"], e["warps"], e["tt"], e.get("local_slots", 0), e.get("variant", 0))
            fake.world = 2
            assert moe_rules.pick_launch(fake, op, e["tokens"], e["hidden"], e["k"], e["experts"]) == \
                (moe_rules.GPU_CONFIG, 1, 0, 0)
    for e in table["codec"]:
        assert roofline.codec_config(e["fmt"], e["direction"], e["group"], e["numel"], cuda) == \
            (e["block"], e["warps"], e["programs"])
        assert roofline.codec_config(e["fmt"], e["direction"], e["group"], e["numel"], "cpu") == \
            (roofline.CODEC_BLOCK, roofline.CODEC_WARPS, roofline.CODEC_PROGRAMS)


def test_table_replaces_a_default_only_beyond_the_noise():
    """build_table: per case the fastest candidate where it beats the run's default by more than NOISE,
    else the default; cases with no candidate beside the default are left out."""
    from symmcoll.fused.memory_bound_configs import NOISE, build_table

    def row(case, us, label, block):
        return dict(section="moe_combine", name="symmcoll:push", case=case, us=us, config=label, block=block,
                    programs=528, warps=4, tt=1)
    rows = [row([128, 4096, 64, 2], 10.0, "default", 8192), row([128, 4096, 64, 2], 10.0 * (1 - NOISE / 2), "b", 4096),
            row([1024, 4096, 64, 2], 10.0, "default", 8192), row([1024, 4096, 64, 2], 9.0, "c", 16384),
            row([4096, 4096, 64, 2], 10.0, "default", 8192)]
    table = build_table(dict(rows=rows), "NVIDIA H200", "test")
    assert [(e["tokens"], e["block"], e["label"]) for e in table["moe_combine"]] == [(128, 8192, "default"),
                                                                                     (1024, 16384, "c")]


def test_bench_rows_carry_the_roofline_columns():
    """`symmcoll bench`'s rows and table for a memory-bound op (GPU only; here its row and table code):
    GB/s over the bytes the kernel must move, % of the run's copy rate, columns of the roofline table."""
    import io
    from rich.console import Console
    from symmcoll.bench import fused
    spec = fused.SPECS["all_reduce_rms_norm"]
    nbytes = spec.bytes((2048, 4096), torch.bfloat16, 1, "one_shot")
    row = fused._row("all_reduce_rms_norm", "symmcoll:one_shot", "symmcoll", (2048, 4096), "bf16", 1, 20.0, 19.0, 0,
                     1e-3, "graph", None, nbytes, 3800.0)
    assert nbytes == roofline.rms_norm_bytes(2048, 4096, 2, None)
    assert abs(row["gbps"] - nbytes / 20e3) < 1e-9 and abs(row["pct_copy"] - 100 * row["gbps"] / 3800) < 1e-9
    out = io.StringIO()
    Console(file=out, width=200).print(fused._table("all_reduce_rms_norm", 1, "bf16", [row], spec))
    assert "% copy" in out.getvalue() and f"{row['pct_copy']:.0f}" in out.getvalue()


def test_moe_table_keys_by_expert_count():
    """moe_entry: nearest hidden size and top-k, then the nearest measured expert count (ties to the
    larger), then the largest measured token count below; entries without an expert count still answer."""
    from symmcoll.fused.memory_bound_configs import moe_entry
    entries = [dict(tokens=t, hidden=4096, k=2, experts=e, label=f"{t}/{e}") for t in (128, 1024) for e in (8, 256)]
    table = {"moe_dispatch": entries, "moe_combine": [dict(tokens=128, hidden=4096, k=2, label="old")]}
    def pick(tokens, experts, hidden=4096):
        return (moe_entry(table, "moe_dispatch", tokens, hidden, 2, experts) or {}).get("label")
    assert [pick(2000, 8), pick(2000, 16), pick(1024, 64), pick(500, 300), pick(64, 1)] == \
        ["1024/8", "1024/8", "1024/256", "128/256", "128/8"]
    assert pick(1024, 8, hidden=16384) is None
    assert moe_entry(table, "moe_combine", 4096, 4096, 2, 64)["label"] == "old"


def test_table_merge_keeps_the_cases_a_run_did_not_measure():
    """merge_tables: a run of some parts (or one a deadline cut) replaces the shipped entries of the cases
    it measured and keeps the others, marked with the run they came from; tables it did not run stay."""
    from symmcoll.fused.memory_bound_configs import merge_tables
    rms = lambda tokens, label: dict(tokens=tokens, hidden=4096, quant="bf16", label=label)  # noqa: E731
    dispatch = lambda experts, label: dict(tokens=1024, hidden=4096, experts=experts, k=2, label=label)  # noqa: E731
    base = {"source": "run3", "rms": [rms(32, "old 32"), rms(512, "old 512")], "moe_dispatch": [dispatch(64, "v0")],
            "moe_combine": [dict(tokens=128, hidden=4096, experts=64, k=2, label="combine")],
            "codec": [dict(fmt="int8", direction="q", group=64, numel=1 << 20, label="codec")]}
    new = {"source": "run4", "rms": [rms(32, "new 32")], "moe_dispatch": [dispatch(64, "v2"), dispatch(8, "v3")],
           "moe_combine": [], "codec": []}
    merged = merge_tables(new, base)
    assert merged["source"] == "run4"
    assert [(e["label"], e.get("source")) for e in merged["rms"]] == [("new 32", None), ("old 512", "run3")]
    assert [e["label"] for e in merged["moe_dispatch"]] == ["v2", "v3"]
    assert [e["label"] for e in merged["moe_combine"]] == ["combine"] and [e["label"] for e in merged["codec"]] == ["codec"]
    assert base["rms"][1] == rms(512, "old 512"), "the base table is not changed"


def test_rms_table_entry_carries_every_step():
    """An rms entry with ``every_step`` gives a launch whose one-shot grid covers every row past the cap
    (the H100 table's 8192 x 4096 bf16 case), entries without it the capped, looped grid."""
    from symmcoll import launcher, plan
    from symmcoll.fused import all_reduce_rms_norm as arn
    from symmcoll.fused import memory_bound_configs as mbc
    import kernel_specs
    entry = mbc.rms_entry(mbc.load_table("h100"), 8192, 4096, None)
    assert entry["every_step"] and mbc.rms_config(entry, 4096).every_step
    assert not mbc.rms_config(dict(entry, every_step=False), 4096).every_step
    assert not mbc.rms_config({k: v for k, v in entry.items() if k != "every_step"}, 4096).every_step
    x = torch.empty((8192, 4096), dtype=torch.bfloat16, device="meta")
    request = plan.Request(arn.OP, x.shape, x.dtype, torch.device("cuda"), options=(("eps", 1e-6), ("quant", None)))
    for every_step, grid in ((True, 8192), (False, 1024)):
        p = plan.Plan(request, "kernel", plan.algorithms(arn.OP)["one_shot"], None, 1, 0,
                      kernel_specs.FakeWorkspace(1, 0), mbc.rms_config(dict(entry, every_step=every_step), 4096), 3,
                      None)
        with launcher.recording() as launches:
            p.algorithm.run(p, x, None, torch.empty_like(x), torch.empty((4096,), dtype=x.dtype, device="meta"))
        assert [(r.grid, r.meta["ONE_STEP"]) for r in launches] == [((grid,), every_step)], launches
