"""``symmcoll bench --op backend_block`` without GPUs: the block's decode path (symmcoll.models.dtensor_llama),
the cases, the checks that decide whether a mode is timed, the table, and the whole run on two CPU ranks
at tiny sizes with inner="aot_eager" (untimed): both modes checked against the fp32 block, the symmcoll
mode's rewrites and kernels, the JSON. The timing itself runs on the GPU machine only (scripts/gpu_check.sh
stage backend-bench); that the command says it is skipped without GPUs is test_tp_block.py's
test_bench_says_it_is_skipped_without_gpus."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from symmcoll.bench import backend_block, backend_block_rank
from symmcoll.models import dtensor_llama
from symmcoll.models.dtensor_llama import KVCache, ModelArgs, TransformerBlock


def test_the_model_imports_nothing_of_symmcoll():
    tree = ast.parse(Path(dtensor_llama.__file__).read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert modules and not [m for m in modules if m.startswith(("symmcoll", "."))], modules


def test_decoding_through_the_cache_gives_the_whole_sequence_s_outputs():
    """Prefill of 7 tokens into the cache, then 3 decode steps, equal the causal forward over all 10
    (the cache's folded grouped-query attention against repeat_kv, rotary at the given positions)."""
    torch.manual_seed(0)
    args = ModelArgs()
    block = TransformerBlock(args)
    x = torch.randn(3, 10, args.dim)
    with torch.no_grad():
        whole = block(x)
        block.attention.cache = KVCache(3, 16, args.n_kv_heads, args.dim // args.n_heads)
        parts = [block(x[:, :7], input_pos=torch.arange(7))]
        parts += [block(x[:, i:i + 1], input_pos=torch.tensor([i])) for i in range(7, 10)]
    torch.testing.assert_close(torch.cat(parts, 1), whole, rtol=1e-5, atol=1e-5)


def test_cases():
    assert backend_block.case_names() == ["decode:1:tp", "decode:8:tp", "decode:64:tp", "prefill:1x2048:tp",
                                          "prefill:1x2048:tp_sp", "prefill:4x4096:tp", "prefill:4x4096:tp_sp"]
    case = backend_block.parse_case("prefill:4x4096:tp_sp")
    assert (case.phase, case.batch, case.seq, case.sequence_parallel) == ("prefill", 4, 4096, True)
    assert backend_block.parse_case("decode:64:tp").seq == 1
    for bad in ("decode:8", "decode:8:tp_sp", "prefill:4x4096", "prefill:4x:tp", "encode:1:tp"):
        with pytest.raises(ValueError, match="backend_block case"):
            backend_block.parse_case(bad)
    select = backend_block.select_cases
    assert select([]) == backend_block.case_names()
    assert select(["decode", "prefill:1x2048:tp"]) == ["decode:1:tp", "decode:8:tp", "decode:64:tp", "prefill:1x2048:tp"]
    assert select(["prefill:4x4096", "decode:16:tp"]) == ["prefill:4x4096:tp", "prefill:4x4096:tp_sp", "decode:16:tp"]
    with pytest.raises(ValueError, match="backend_block case"):
        select(["decod:1:tp"])
    setup = backend_block.Setup()
    assert all(backend_block.unfit(backend_block.parse_case(c), w, setup) is None
               for c in backend_block.case_names() for w in (1, 2, 4, 8))
    assert "KV heads" in backend_block.unfit(backend_block.parse_case("decode:1:tp"), 16, setup)
    odd = backend_block.Setup(args=ModelArgs(n_heads=6, n_kv_heads=3, ffn_dim=96, max_seq_len=4096))
    assert "tokens per sequence" in backend_block.unfit(backend_block.parse_case("prefill:1x2048:tp_sp"), 3, odd)
    assert "rotary" in backend_block.unfit(backend_block.parse_case("decode:1:tp"), 1,
                                           backend_block.Setup(cache_tokens=4096))


def test_a_wrong_token_stops_the_timing_where_the_whole_error_would_not():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(1, 1024, 256, generator=g)
    close = want + 1e-3 * torch.randn(want.shape, generator=g)
    wrong = close.clone()
    wrong[0, 77] = 0                      # one token lost
    whole, token = backend_block_rank.compare_updates((close, wrong), want)
    assert whole < backend_block.TOLERANCE and token == pytest.approx(1.0, abs=1e-2)
    measured = {"err": whole, "token": token, "diff": None, "diff_token": None, "skips": 0}
    assert "worst token against fp32" in backend_block_rank.verdict([None, None], [measured] * 2, "default")
    fine = dict(measured, token=backend_block_rank.compare_updates((close,), want)[1])
    assert backend_block_rank.verdict([None, None], [fine, fine], "reduce-overhead") is None
    assert "against inductor" in backend_block_rank.verdict([None, None], [fine, dict(fine, diff=0.2)], "default")
    skipped = dict(fine, skips=1)
    assert "outside CUDA graphs" in backend_block_rank.verdict([None, None], [fine, skipped], "reduce-overhead")
    assert backend_block_rank.verdict([None, None], [fine, skipped], "default") is None
    assert backend_block_rank.verdict([None, "rank 1: boom"], [fine, fine], "default") == "rank 1: boom"


def _row(case, mode, compile_mode, ms, error=None, rewrites=None):
    return {"case": case, "mode": mode, "compile_mode": compile_mode, "ms_per_step": ms,
            "tokens_per_s": None if ms is None else 9_999_999, "rel_err_fp32": 2.2e-2, "rel_diff_vs_inductor": 3.1e-2,
            "compile_s": 123.4, "rewrites": rewrites, "error": error}


def test_table_fits_120_columns_and_compares_within_a_compile_mode():
    sp = {"graphs": ["inference"], "collectives": 4, "rewritten": 4, "left": [],
          "into": {"all_gather_matmul": 2, "matmul_reduce_scatter": 2}}
    rows = [_row("decode:64:tp", "inductor", "reduce-overhead", 2.0),
            _row("decode:64:tp", "symmcoll", "reduce-overhead", 1.6, rewrites={**sp, "into": {"matmul_all_reduce": 2},
                                                                                  "collectives": 2, "rewritten": 2}),
            _row("prefill:4x4096:tp_sp", "inductor", "reduce-overhead", None, error="rank 0: RuntimeError: " + "x" * 90),
            _row("prefill:4x4096:tp_sp", "symmcoll", "reduce-overhead", None,
                 error="mismatch 1.0e-01 worst token against fp32: relative error > 8e-02, not timed"),
            _row("prefill:4x4096:tp_sp", "inductor", "default", 1234.567),
            _row("prefill:4x4096:tp_sp", "symmcoll", "default", 1100.0, rewrites=sp)]
    backend_block.add_speedups(rows)
    assert rows[0]["speedup_vs_inductor"] == 1.0 and rows[1]["speedup_vs_inductor"] == pytest.approx(1.25)
    assert rows[5]["speedup_vs_inductor"] == pytest.approx(1234.567 / 1100)   # the default rows' inductor
    assert backend_block.failed(rows) == 0   # (inductor failed too under reduce-overhead)
    assert backend_block.failed(rows[:1] + [dict(rows[1], error="mismatch")]) == 1
    tables = backend_block.tables(rows, 8, backend_block.Setup().args)
    assert len(tables) == 2
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    for table in tables:
        console.print(table)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 120 and "…" not in text, text
    lines = [line for line in text.splitlines() if line.startswith(("decode:", "prefill:"))]
    assert len(lines) == len(rows), text   # one line a row: nothing wrapped
    assert "2/2: 2 mm_ar" in lines[1] and "1.250" in lines[1] and "4/4: 2 ag_mm, 2 mm_rs" in lines[5]
    assert "RuntimeError" in lines[2] and "rank 0" not in lines[2] and "mismatch 1.0e-01 worst" in lines[3]
    assert backend_block.rewrite_text({"collectives": 0, "rewritten": 0, "into": {}}) == "0/0 (no collective)"


def test_profile_text_lists_every_rank_and_rank_0s_longest_kernels():
    """--profile's log lines: every rank's busy / idle GPU time and host time a step, then rank 0's
    longest GPU activities, each with its us and calls a step, at most ``top`` of them."""
    def rank(busy, host):
        return {"busy_us": busy, "idle_us": 4.0, "host_ms": host,
                "top_kernels": [["nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT", 57.8], ["two_shot_tiles_kernel", 21.5],
                                ["triton_red_fused_add_mean_mul_pow_rsqrt_0", 3.2]],
                "top_calls": [["nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT", 2], ["two_shot_tiles_kernel", 2],
                              ["triton_red_fused_add_mean_mul_pow_rsqrt_0", 1]]}
    row = {"case": "decode:64:tp", "mode": "symmcoll", "compile_mode": "reduce-overhead", "ms_per_step": 0.513,
           "profile": [rank(470.25, 0.21), rank(468.0, 0.2)]}
    lines = backend_block.profile_text(row, top=2).splitlines()
    assert len(lines) == 3, lines
    assert "decode:64:tp symmcoll (reduce-overhead)" in lines[0] and "ranks 0..1" in lines[0]
    assert "GPU busy 470.2 / 468.0 us" in lines[0] and "host 0.210 / 0.200 ms" in lines[0], lines[0]
    assert "ms/step 0.513" in lines[0]
    assert lines[1].split() == ["57.80", "us", "2.00x", "nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT"], lines[1]
    assert lines[2].split() == ["21.50", "us", "2.00x", "two_shot_tiles_kernel"], lines[2]


def test_the_whole_run_on_cpu_untimed(tmp_path):
    """``backend_block.run`` on two CPU ranks (gloo, the interpreter), Inductor replaced by aot_eager,
    untimed: decode through the cache (tensor parallel), prefill (tensor + sequence parallel), and a case
    that cannot run at 2 ranks. Both modes pass the checks against the fp32 block; the symmcoll mode
    rewrote every collective into the fused ops and launched symmcoll's kernels, the plain one none; the
    JSON and the tables hold it all."""
    import json
    setup = backend_block.Setup(args=ModelArgs(), inner="aot_eager", cache_tokens=6, timed=False,
                                compile_modes=("default",))   # (reduce-overhead configures Inductor)
    expected = {"decode:2:tp": {"matmul_all_reduce": 2},
                "prefill:2x8:tp_sp": {"all_gather_matmul": 2, "matmul_reduce_scatter": 2}}
    console = Console(width=120, record=True, file=open(os.devnull, "w"))
    status = backend_block.run([2], [*expected, "prefill:1x7:tp_sp"], backend_block.MODES, 3, tmp_path, console,
                               setup=setup, device="cpu")
    assert status == 0
    (path,) = tmp_path.glob("backend_block-ws2-*.json")
    result = json.loads(path.read_text())
    assert result["provenance"]["device_type"] == "cpu" and result["setup"]["inner"] == "aot_eager"
    assert result["left_out"] == ["prefill:1x7:tp_sp (7 tokens per sequence are not divisible by 2 ranks)"]
    rows = result["rows"]
    assert [(r["case"], r["mode"], r["compile_mode"]) for r in rows] == [
        (case, mode, "default") for case in expected for mode in backend_block.MODES]
    for plain, ours in zip(rows[::2], rows[1::2]):
        for row in (plain, ours):
            assert row["error"] is None, row
            assert row["rel_err_fp32"] <= backend_block.TOLERANCE and row["token_err_fp32"] <= backend_block.TOKEN_TOLERANCE
            assert row["ms_per_step"] is None and row["compile_s"] > 0 and row["profile"] is None
        assert ours["rel_diff_vs_inductor"] <= backend_block.TOLERANCE
        assert plain["rewrites"] is None and not plain["symmcoll_kernels"], plain
        into = expected[ours["case"]]
        assert ours["rewrites"]["into"] == into and ours["rewrites"]["rewritten"] == ours["rewrites"]["collectives"]
        assert ours["symmcoll_kernels"] and "symmcoll.backend: inference graph" in ours["report"], ours
    text = console.export_text()
    assert "2/2: 2 mm_ar" in text and "4/4: 2 ag_mm, 2 mm_rs" in text and "left out: prefill:1x7:tp_sp" in text
