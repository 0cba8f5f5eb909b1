#!/usr/bin/env bash
# The one script for the GPU machine: GPU tests and the benchmark for what changed.
#   git rev-parse HEAD > .symmcoll-sha; scripts/gpu_check.sh [tests] [sweep] [probe] [tune] [bench] [shared]
#                                                            [gemm-tune] [gemm-bench] [gemm-retune]
#                                                            [fused] [fused-floor] [fused-env] [tp_block] [pdl] [quantized-tests] [quantized-bench]
#                                                            [quantized-accuracy] [moe] [faults] [scaleout]
#                                                            [scaleout-multi] [backend] [backend-bench] [backend-profile] [roofline]
#                                                            [roofline-bench] [roofline-shared] [semantics]
#                                                            [restructure] [random-calls] [host] [desc-cost]
#                                                            [multi-diagnose] [rs-lag] [quant-variants] [ag-ce] [mrs-chunked]
#                                                            [gemm-probe]
#   (default: tests bench). "shared" is for a one-GPU machine: ranks share GPU 0 (correctness, compile,
#   graphs, host overhead; no bandwidth), benchmarks/shared_gpu_check.py.
# and call the device tool with carry=[".symmcoll-sha"]. The whole GPU test suite takes longer than one
# 10-minute call allows: split it with TEST_PATHS (e.g. "tests/test_all_reduce.py" in one call,
# "tests/test_data_movement.py tests/test_reduce_scatter.py tests/test_gpu.py ..." in the next).
# TEST_FILTER is pytest's -k expression. SWEEP_ALGORITHMS (names in benchmarks/sweep_configs.py) and BENCH_OPS (e.g. all_reduce) narrow a run.
# Writes logs and result files under $OUT (default ./out); $OUT/env.txt names the code that ran twice: the carried
# sha and the digest of src/symmcoll (`python3 -m symmcoll.bench.provenance <commit>` here gives a commit's). Installs nothing: uses the image's torch and
# triton with src/ on PYTHONPATH. Every step runs under `timeout`; NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMCOLL_TEST_DEVICE=cuda
stages=${*:-tests bench}
# gemm-retune: issue 22 in one call (<= 8 min) -- gemm-tune on the cells of GEMM_TUNE_FROM slower than
# GEMM_TUNE_ABOVE x cuBLAS, worst first, until GEMM_TUNE_BUDGET s (the table written to $OUT and copied
# into the package), then gemm-bench: the whole grid beside cuBLAS with that table. GEMM_TUNE_FROM=auto
# (the default) takes the last committed grid of the GPU that came (both of 2026-11-28).
case " $stages " in *" gemm-retune "*)
  export GEMM_TUNE_FROM=${GEMM_TUNE_FROM:-auto}
  export GEMM_TUNE_ABOVE=${GEMM_TUNE_ABOVE:-1.05} GEMM_TUNE_BUDGET=${GEMM_TUNE_BUDGET:-150}
  export GEMM_TUNE_TIMEOUT=${GEMM_TUNE_TIMEOUT:-180} GEMM_BENCH_TIMEOUT=${GEMM_BENCH_TIMEOUT:-310}
  stages=${stages//gemm-retune/gemm-tune gemm-bench} ;;
esac
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
status=0

# The device copy of the tree has no .git: the sha travels in .symmcoll-sha (carry it).
[ -f .symmcoll-sha ] && export SYMMCOLL_GIT_SHA=$(cat .symmcoll-sha)
python3 - <<'PY' | tee "$OUT/env.txt"
import os, torch, triton
print("git", os.environ.get("SYMMCOLL_GIT_SHA", "unknown"))
# The code that ran, whatever the sha file says: compare with `python3 -m symmcoll.bench.provenance <commit>` here.
from symmcoll.bench.provenance import tree_digest
print("src digest", tree_digest("."))
print("torch", torch.__version__, "triton", triton.__version__, "nccl", torch.cuda.nccl.version())
print("gpus", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
import importlib.util
print("pynvml", "importable" if importlib.util.find_spec("pynvml") else "missing")
PY

# Issue 24's random calls through two ranks sharing GPU 0: a warm-up that compiles in pools, then the
# timed pass (a time budget stops it early and the JSON says how many calls ran).
random_calls() {
  timeout ${SEMANTICS_CALLS_TIMEOUT:-200} python3 tests/random_calls.py --device cuda-shared --world-size 2 \
    --calls ${SEMANTICS_CALLS:-1000} --warm-pools ${SEMANTICS_WARM_POOLS:-6} --warm-timeout-s ${SEMANTICS_WARM_TIMEOUT:-120} \
    --budget-s ${SEMANTICS_CALLS_BUDGET:-170} --batch 100 --timeout-s ${SEMANTICS_CALL_TIMEOUT_S:-3} \
    ${SEMANTICS_ONLY:+--only $SEMANTICS_ONLY --repeat ${SEMANTICS_REPEAT:-1}} \
    --out "$OUT/random_calls_cuda_shared.json" 2>&1 | tee "$OUT/random_calls.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}

for stage in $stages; do
  case $stage in
    tests)
      sizes=2; [ "$ngpu" -ge 3 ] && sizes=2,3; [ "$ngpu" -ge 4 ] && sizes=2,3,4
      # One GPU: the ranks of a multi-rank test share it (launch device "cuda-shared").
      dev=cuda; [ "$ngpu" -ge 2 ] || dev=cuda-shared
      SYMMCOLL_TEST_DEVICE=${TEST_DEVICE:-$dev} SYMMCOLL_TEST_WORLD_SIZES=${TEST_WORLD_SIZES:-$sizes} timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -v -rA -p no:cacheprovider \
        ${TEST_FILTER:+-k "$TEST_FILTER"} ${TEST_PATHS:-tests/} --ignore=tests/test_compile.py --ignore=tests/test_bench.py 2>&1 \
        | tee "$OUT/gpu_tests.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    sweep)
      sizes=2; [ "$ngpu" -ge 4 ] && sizes="4 2"
      timeout ${SWEEP_TIMEOUT:-240} python3 benchmarks/sweep_configs.py --world-size $sizes \
        ${SWEEP_ALGORITHMS:+--algorithms $SWEEP_ALGORITHMS} --out "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    tune)
      sizes=2; [ "$ngpu" -ge 4 ] && sizes=4,2
      # Writes the dispatch table the bench stage after it uses (~/.cache/symmcoll/dispatch.json).
      timeout ${TUNE_TIMEOUT:-300} python3 -m symmcoll tune --op ${TUNE_OPS:-all_reduce all_gather reduce_scatter} \
        --world-size "$sizes" 2>&1 | tee "$OUT/tune.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      cp ~/.cache/symmcoll/dispatch.json "$OUT/dispatch_tuned.json" 2>/dev/null
      ;;
    bench)
      sizes=2; [ "$ngpu" -ge 4 ] && sizes=4,2
      # Result JSONs only: plots are drawn from them afterwards (symmcoll plot), off the GPU machine.
      # --time-limit: the sweep stops starting cases 40 s before the timeout, so a long sweep still prints
      # and writes what it measured (2026-11-27: a 4-op sweep at ws 4 and 2 cut by timeout left nothing).
      # BENCH_WORLD_SIZES (e.g. 4) and BENCH_ARGS (e.g. "-b 4K -e 1M -f 4 --algorithms nccl symmcoll:nccl auto")
      # narrow a run to what one call has time for.
      timeout ${BENCH_TIMEOUT:-500} python3 -m symmcoll bench --op ${BENCH_OPS:-all} --world-size "${BENCH_WORLD_SIZES:-$sizes}" \
        ${BENCH_ARGS:-} --time-limit $(( ${BENCH_TIMEOUT:-500} - 40 )) --out "$OUT" 2>&1 \
        | tee "$OUT/bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    rs-lag)
      # benchmarks/NOTES.md "reduce_scatter at 8-16 MB on 4 ranks": main's sentinel reduce-scatter (lag 0) and its
      # push-ahead (SYMMCOLL_RS_SENTINEL_LAG=1, 2: read at import, so one bench process per lag), each beside
      # torch's reduce_scatter_out, on the same machine; the bench checks every result before it times it.
      for lag in ${RS_LAGS:-0 1 2}; do
        mkdir -p "$OUT/rs-lag$lag"
        env $([ "$lag" = 0 ] || echo SYMMCOLL_RS_SENTINEL_LAG=$lag) timeout ${RS_LAG_TIMEOUT:-80} python3 -m symmcoll bench \
          --op reduce_scatter --world-size ${RS_LAG_WORLD_SIZE:-4} -b ${RS_LAG_MIN:-2M} -e ${RS_LAG_MAX:-32M} -f 2 \
          --algorithms torch:reduce_scatter_out sentinel --link-bytes 64M --time-limit $(( ${RS_LAG_TIMEOUT:-80} - 20 )) \
          --out "$OUT/rs-lag$lag" 2>&1 | tee "$OUT/rs-lag$lag/bench.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    ag-ce)
      # all_gather copy_engine at ws 2 (benchmarks/results/2026-11-28-quant-agce-h100x2): each setting of
      # SYMMCOLL_AG_CE_PARTS (read at import: one bench process each; "default" = unset, the size rule of
      # comm/gather.py; 0 = the one-stream path; N = N parts) beside torch's low_contention and NCCL on the same
      # machine; the bench checks every result before it times it. First the copy-engine tests at
      # AG_CE_TEST_WORLD_SIZES (default 2; parts 1-3, the switch's 0 and unset, several chunks, graph replays
      # with fresh data; AG_CE_TEST=0 skips them).
      if [ "${AG_CE_TEST:-1}" = 1 ]; then
        mkdir -p "$OUT/ag-ce-test"
        SYMMCOLL_TEST_WORLD_SIZES=${AG_CE_TEST_WORLD_SIZES:-2} timeout ${AG_CE_TEST_TIMEOUT:-40} python3 -m pytest -v -rA \
          -p no:cacheprovider tests/test_data_movement.py -k copy_engine 2>&1 | tee "$OUT/ag-ce-test/test.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      fi
      for parts in ${AG_CE_SETTINGS:-0 default 2 4}; do
        mkdir -p "$OUT/ag-ce-$parts"
        echo "ag-ce: SYMMCOLL_AG_CE_PARTS=$parts (default: unset, the size rule)" | tee "$OUT/ag-ce-$parts/bench.log"
        env $([ "$parts" = default ] || echo SYMMCOLL_AG_CE_PARTS=$parts) timeout ${AG_CE_TIMEOUT:-50} python3 -m symmcoll bench \
          --op all_gather --world-size 2 -b ${AG_CE_MIN:-16M} -e ${AG_CE_MAX:-256M} -f 2 \
          --algorithms symmcoll:copy_engine torch:low_contention torch:low_contention_copy_in nccl --link-bytes 64M \
          --time-limit $(( ${AG_CE_TIMEOUT:-50} - 15 )) --out "$OUT/ag-ce-$parts" 2>&1 | tee -a "$OUT/ag-ce-$parts/bench.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    mrs-chunked)
      # matmul_reduce_scatter's chunked algorithm (benchmarks/NOTES.md "matmul_reduce_scatter chunked"): first its
      # CUDA-graph replays with fresh data at ws 2 and 4 (tests/test_gpu_rowpar.py, in a 64 MB workspace: 32 MB slots,
      # so the 8192 x 12288 case runs 2-3 units a step; MRS_CHUNKED_TEST=0 skips them),
      # then the fused bench once per world size in MRS_CHUNKED_WORLDS (default "4 2"; one process each, so a
      # timeout loses one table only) at MRS_CHUNKED_SHAPES: chunked, unfused, fused, auto, nccl (torch.matmul +
      # NCCL) and torch's fused_matmul_reduce_scatter beside cuBLAS on one rank's GEMM, each checked against fp32
      # before and after it is timed.
      if [ "${MRS_CHUNKED_TEST:-1}" = 1 ]; then
        mkdir -p "$OUT/mrs-chunked"
        SYMMCOLL_WORKSPACE_BYTES=67108864 timeout ${MRS_CHUNKED_TEST_TIMEOUT:-150} python3 -m pytest -v -rA -p no:cacheprovider tests/test_gpu_rowpar.py \
          -k "cuda_graph and chunked" 2>&1 | tee "$OUT/mrs-chunked/gpu_tests.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      fi
      for w in ${MRS_CHUNKED_WORLDS:-4 2}; do
        if [ "$w" -gt "$ngpu" ]; then echo "mrs-chunked: ws $w needs $w GPUs, $ngpu here"; status=1; continue; fi
        mkdir -p "$OUT/mrs-chunked/ws$w"
        timeout ${MRS_CHUNKED_TIMEOUT:-150} python3 -m symmcoll bench --op matmul_reduce_scatter --world-size $w \
          --algorithms chunked unfused fused auto nccl torch:fused_matmul_reduce_scatter \
          --shapes ${MRS_CHUNKED_SHAPES:-512x8192x28672 2048x8192x28672 8192x8192x28672 16384x8192x28672} \
          --out "$OUT/mrs-chunked/ws$w" 2>&1 | tee "$OUT/mrs-chunked/ws$w/fused_bench.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    probe)
      sizes=2; [ "$ngpu" -ge 4 ] && sizes="4 2"
      timeout ${PROBE_TIMEOUT:-300} python3 benchmarks/probe_copy_engine.py --world-size $sizes --out "$OUT/probe.json" 2>&1 \
        | tee "$OUT/probe.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    fused)
      # Fused ops by shape at the world size of the GPUs here (FUSED_OPS, FUSED_SHAPES, FUSED_ALGORITHMS narrow it;
      # FUSED_ALGORITHMS="unfused unfused@2 auto" times unfused twice, two captures of one code: bench/fused.py repeats).
      timeout ${FUSED_TIMEOUT:-500} python3 -m symmcoll bench --op ${FUSED_OPS:-all_gather_matmul} --world-size "$ngpu" \
        ${FUSED_SHAPES:+--shapes $FUSED_SHAPES} ${FUSED_ALGORITHMS:+--algorithms $FUSED_ALGORITHMS} --out "$OUT" 2>&1 \
        | tee "$OUT/fused_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    fused-floor)
      # The fused bench's small-shape floor at world size > 1 (benchmarks/NOTES.md, "fused bench at world
      # size 4: small-shape floor"): all_reduce_rms_norm's implementations at FLOOR_SHAPES, each checked
      # against fp32, timed four ways (3 or 20 calls per graph x isolated or back-to-back replays; "old" is
      # the fused bench before the fix, "new" the collective bench's method), every rank's median.
      timeout ${FLOOR_TIMEOUT:-150} python3 benchmarks/fused_floor_probe.py --world-size "$ngpu" \
        --budget-s $(( ${FLOOR_TIMEOUT:-150} - 35 )) ${FLOOR_SHAPES:+--shapes $FLOOR_SHAPES} \
        --out "$OUT/fused_floor.json" 2>&1 | tee "$OUT/fused_floor.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    fused-env)
      # The fused bench again with FUSED_ENV set (VAR=value ...: an environment switch to compare; several
      # settings separated by ';' run one after another into $OUT/fused_env/<i>/, each with its env.txt),
      # FUSED_ENV_OPS (default all_gather_matmul) and FUSED_ENV_ALGORITHMS narrowing it, FUSED_ENV_TIMEOUT
      # per setting, into $OUT/fused_env/: side by side with the fused stage's run (and, for several settings,
      # with each other: $OUT/fused_env/compare.log).
      IFS=';' read -ra settings <<< "${FUSED_ENV:?fused-env needs FUSED_ENV=VAR=value}"
      i=0
      for setting in "${settings[@]}"; do
        dir="$OUT/fused_env"; [ "${#settings[@]}" -gt 1 ] && dir="$OUT/fused_env/$i"
        mkdir -p "$dir"; echo "$setting" > "$dir/env.txt"
        env $setting timeout ${FUSED_ENV_TIMEOUT:-300} python3 -m symmcoll bench \
          --op ${FUSED_ENV_OPS:-all_gather_matmul} --world-size "$ngpu" ${FUSED_ENV_ALGORITHMS:+--algorithms $FUSED_ENV_ALGORITHMS} \
          ${FUSED_SHAPES:+--shapes $FUSED_SHAPES} --out "$dir" 2>&1 | tee "$dir/fused_bench.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        i=$((i + 1))
      done
      # several settings: side by side (benchmarks/fused_env_compare.py: each setting's us and x cuBLAS, over the first's)
      [ "${#settings[@]}" -gt 1 ] && python3 benchmarks/fused_env_compare.py "$OUT/fused_env" 2>&1 | tee "$OUT/fused_env/compare.log"
      ;;
    tp_block)
      # The decoder block of symmcoll.models in every mode at one world size (TP_BLOCK_WORLD, default
      # the GPUs here); TP_BLOCK_CASES narrows the cases (e.g. "decode prefill:1x2048") to fit a call.
      timeout ${TP_BLOCK_TIMEOUT:-560} python3 -m symmcoll bench --op tp_block --world-size "${TP_BLOCK_WORLD:-$ngpu}" \
        ${TP_BLOCK_CASES:+--shapes $TP_BLOCK_CASES} --out "$OUT" 2>&1 | tee "$OUT/tp_block_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    pdl)
      # Issue 22 point 4 on one GPU: programmatic dependent launch (SYMMCOLL_PDL) off against on, one call
      # (~5 min typical, 8 at most under its timeouts). 1: tests/test_pdl.py -- the decode chain (rms ->
      # GEMM -> stream-K GEMM -> matmul_all_reduce -> rms) gives the same bits with PDL as without, eager,
      # fast path and CUDA-graph replays; launch_pdl in the compiled kernels' metadata. Nothing is timed if
      # it fails. 2: tp_block at world size 1, PDL_TP_CASES (default "decode:1 decode:8 decode:64"), modes
      # nccl and symmcoll (each checked against nccl's output), PDL_REPEATS (default 2) rounds of off then
      # on, into $OUT/pdl/tp_{off,on}_<round>/.
      # PDL_TP_CASES="" skips them. 3: the GEMM grid at PDL_GEMM_M (default "1 16 64") x PDL_GEMM_SHAPES
      # (default "70b-tp8 70b-tp2"), every cell checked against fp32 first, per PDL_VARIANTS (below), into
      # $OUT/pdl/gemm_<variant>/.
      # Then benchmarks/pdl_compare.py prints both side by side ($OUT/pdl/pdl_compare.json).
      mkdir -p "$OUT/pdl"
      timeout ${PDL_TESTS_TIMEOUT:-120} python3 -m pytest -v -rA -p no:cacheprovider tests/test_pdl.py 2>&1 \
        | tee "$OUT/pdl/tests.log"
      if [ "${PIPESTATUS[0]}" -ne 0 ]; then
        status=1; echo "pdl: tests/test_pdl.py failed: nothing timed" | tee -a "$OUT/pdl/tests.log"
      else
        for round in $(seq ${PDL_REPEATS:-2}); do
          [ -n "${PDL_TP_CASES-x}" ] || break  # PDL_TP_CASES="": no tp_block rounds
          for pdl in 0 1; do
            tag=$([ "$pdl" = 1 ] && echo on || echo off)_$round
            SYMMCOLL_PDL=$pdl timeout ${PDL_TP_TIMEOUT:-60} python3 -m symmcoll bench --op tp_block --world-size 1 \
              --shapes ${PDL_TP_CASES:-decode:1 decode:8 decode:64} --algorithms nccl symmcoll --out "$OUT/pdl/tp_$tag" 2>&1 \
              | tee "$OUT/pdl/tp_$tag.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
          done
        done
        # PDL_VARIANTS (default "off decode on"): off -- no PDL at all (SYMMCOLL_PDL=0 SYMMCOLL_PDL_DECODE=0);
        # decode -- the default: the whole-tile decode GEMMs with PDL and early release, the switch off;
        # on -- SYMMCOLL_PDL=1 (every PDL-aware kernel), the decode GEMMs as in decode. PDL_DECODE_LIMITS ("<max M>,<max
        # bytes of B>", SYMMCOLL_PDL_DECODE_LIMITS) stands for the table's "pdl_decode" (a GPU whose table has none).
        for variant in ${PDL_VARIANTS:-off decode on}; do
          case $variant in
            off) pdl=0; decode=0 ;;
            decode) pdl=0; decode=1 ;;
            on) pdl=1; decode=1 ;;
            *) echo "pdl: unknown variant $variant (off, decode, on)"; status=1; continue ;;
          esac
          SYMMCOLL_PDL=$pdl SYMMCOLL_PDL_DECODE=$decode SYMMCOLL_PDL_DECODE_LIMITS=${PDL_DECODE_LIMITS:-} \
            timeout ${PDL_GEMM_TIMEOUT:-60} python3 -m symmcoll bench \
            --op gemm --dtype bf16 --shapes ${PDL_GEMM_SHAPES:-70b-tp8 70b-tp2} --m ${PDL_GEMM_M:-1 16 64} \
            --no-cublas-kernels --out "$OUT/pdl/gemm_$variant" 2>&1 | tee "$OUT/pdl/gemm_$variant.log"
          [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        done
        python3 benchmarks/pdl_compare.py "$OUT/pdl" 2>&1 | tee "$OUT/pdl/compare.log"
      fi
      ;;
    gemm-tune)
      # The GEMM core's tile table for this GPU model (symmcoll tune --op gemm): $OUT/gemm_<gpu>.json and its
      # measurements; also copied into the package here so that later stages of this call use it.
      # GEMM_SHAPES (layer-name prefixes) and GEMM_M narrow it; GEMM_TUNE_FROM (a gemm bench result JSON)
      # tunes only its cells slower than GEMM_TUNE_ABOVE (default 1.05) x cuBLAS, worst first;
      # GEMM_TUNE_BUDGET (seconds) starts no cell past it (what was measured is written).
      key=$(python3 -c 'import torch; from symmcoll.fused.gemm_tables import gpu_key; print(gpu_key(torch.cuda.get_device_name()) or "gpu")')
      if [ "${GEMM_TUNE_FROM:-}" = auto ]; then
        case $key in
          h100) GEMM_TUNE_FROM=benchmarks/results/2026-11-28-grid-gpu-state-h100/grid/gemm-h100-bf16-2026-11-28T003009Z.json ;;
          *) GEMM_TUNE_FROM=benchmarks/results/2026-11-28-gemm-retune-h200/final/gemm-h200-bf16-2026-11-28T040917Z.json ;;
        esac
      fi
      # The table shipped in the package is the base: cells this run does not measure are kept, and what
      # it answers for a cell today is among that cell's candidates.
      # GEMM_TUNE_M (e.g. "128 256 512") narrows the tune alone (GEMM_M narrows the bench too).
      tune_m=${GEMM_TUNE_M:-${GEMM_M:-}}
      timeout ${GEMM_TUNE_TIMEOUT:-540} python3 -m symmcoll tune --op gemm ${GEMM_SHAPES:+--shapes $GEMM_SHAPES} \
        ${tune_m:+--m $tune_m} ${GEMM_TUNE_FROM:+--cells-from $GEMM_TUNE_FROM --above ${GEMM_TUNE_ABOVE:-1.05}} \
        ${GEMM_TUNE_BUDGET:+--budget-s $GEMM_TUNE_BUDGET} \
        --base "src/symmcoll/data/gemm_$key.json" --out "$OUT/gemm_$key.json" 2>&1 \
        | tee "$OUT/gemm_tune.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      [ -f "$OUT/gemm_$key.json" ] && cp "$OUT/gemm_$key.json" src/symmcoll/data/
      ;;
    gemm-probe)
      # Issue 22's GEMM experiments, each a script of benchmarks/ that checks every config against fp32 before
      # timing it beside the table's config and cuBLAS (~30 s each on an H200): GEMM_PROBES (default
      # "kernel-times") picks them -- kernel-times (gemm_kernel_times.py: a call's time kernel by kernel),
      # deep-stages (gemm_deep_stages.py: pipelines past the 200 KB budget), streamk-all (streamk_all_tiles.py:
      # stream-K over every tile of one-wave cells), pdl-placement (pdl_placement_probe.py: each program's SM and
      # timer in a chain of decode GEMMs, PDL off and with early release), gluon-ws (gluon_ws_probe.py: a
      # warp-specialised Gluon GEMM at the large-M cells, ~1 min), gluon-decode (gluon_decode_probe.py: decode
      # GEMMs whose weights' first k-steps load before the PDL wait, ~1 min; GEMM_PROBE_ARGS=--all-decode: the
      # grid's 75 decode cells, ~4 min). Each writes $OUT/<probe>.json and its log; GEMM_PROBE_ARGS go to each script.
      for probe in ${GEMM_PROBES:-kernel-times}; do
        case $probe in
          kernel-times) script=gemm_kernel_times.py ;;
          deep-stages) script=gemm_deep_stages.py ;;
          streamk-all) script=streamk_all_tiles.py ;;
          pdl-placement) script=pdl_placement_probe.py ;;
          gluon-ws) script=gluon_ws_probe.py ;;
          gluon-decode) script=gluon_decode_probe.py ;;
          *) echo "gemm-probe: unknown probe $probe" >&2; status=1; continue ;;
        esac
        timeout ${GEMM_PROBE_TIMEOUT:-200} python3 "benchmarks/$script" --out "$OUT/$probe.json" ${GEMM_PROBE_ARGS:-} 2>&1 \
          | tee "$OUT/$probe.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    gemm-bench)
      # The GEMM core beside cuBLAS over the serving grid (bf16; GEMM_DTYPE=fp16), with its plot. Each row
      # can name the kernels cuBLAS ran there (GEMM_CUBLAS_KERNELS=1: cublas_kernels, from a profiling process
      # while the grid compiles, <= 45 s; off by default until one GPU run has shown what it costs).
      # benchmarks/gemm_markdown.py tabulates them. The grid's cells are timed as bench/gemm_timing.py plans
      # (2026-11-28: ~30 s of GPU time for the 234 cells on an H100, ~1-1.5 min in all; the log prints each
      # shape's seconds and the total, the JSON is rewritten after every cell so a timeout keeps what ran).
      # Each row records the GPU's SM clock, temperature, power and throttle reasons before and after its
      # rounds where pynvml imports (bench/gpu_state.py; the log's first lines say whether it does);
      # besides, nvidia-smi samples the same every GEMM_SMI_MS ms (default 200, 0: off) into
      # $OUT/gemm_gpu_state.csv, for a run without pynvml (rows' started_s + provenance.created_utc align).
      # Each row also records each side's energy per call (NVML's total energy counter) and SM clock in every
      # round, read around its timed replays (bench/gemm_energy.py); GEMM_ENERGY_WINDOW_S (default 0: off)
      # adds, after the rounds of the cells of M in GEMM_ENERGY_M (default 16 256 1024 4096 16384), an energy
      # window a side: replayed that long (at least 5 counter steps) while the counter is polled
      # (0.5 s a side at a 100 ms step: ~90 s for the 90 default cells). benchmarks/NOTES.md, "energy per GEMM".
      no_names=--no-cublas-kernels; [ "${GEMM_CUBLAS_KERNELS:-0}" = 1 ] && no_names=
      smi_pid=
      if [ "${GEMM_SMI_MS:-200}" != 0 ] && command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=timestamp,index,clocks.sm,temperature.gpu,power.draw,power.limit,clocks_throttle_reasons.active \
          --format=csv -lms "${GEMM_SMI_MS:-200}" > "$OUT/gemm_gpu_state.csv" 2>&1 &
        smi_pid=$!
      fi
      timeout ${GEMM_BENCH_TIMEOUT:-400} python3 -m symmcoll bench --op gemm --dtype ${GEMM_DTYPE:-bf16} \
        ${GEMM_SHAPES:+--shapes $GEMM_SHAPES} ${GEMM_M:+--m $GEMM_M} $no_names --plot --out "$OUT" \
        --energy-window-s ${GEMM_ENERGY_WINDOW_S:-0} ${GEMM_ENERGY_M:+--energy-m $GEMM_ENERGY_M} 2>&1 \
        | tee "$OUT/gemm_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      [ -n "$smi_pid" ] && kill "$smi_pid" 2>/dev/null
      ;;
    moe)
      # MoE dispatch/combine against NCCL all_to_all_single (+ .tolist()) and torch's all_to_all_vdev_2d.
      # One world size per call fits 10 minutes: MOE_WORLD_SIZES="4" in one call, "2" in the next.
      # torch_vdev runs in rank processes of its own after symmcoll's and nccl's (torch fixes a process's
      # symmetric-memory backend at its first allocation); MOE_ARGS="--implementations torch_vdev" runs it alone.
      sizes=2; [ "$ngpu" -ge 4 ] && sizes="4 2"
      timeout ${MOE_TIMEOUT:-560} python3 benchmarks/moe_bench.py --world-size ${MOE_WORLD_SIZES:-$sizes} \
        ${MOE_ARGS:-} --out "$OUT/moe.json" 2>&1 | tee "$OUT/moe.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    shared)
      timeout ${SHARED_TIMEOUT:-560} python3 benchmarks/shared_gpu_check.py --world-size ${SHARED_WORLD_SIZE:-2} \
        --out "$OUT/shared_gpu.json" 2>&1 | tee "$OUT/shared_gpu.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    faults)
      # The fault suite (tests/test_faults.py) at world size 2: on two GPUs, or two ranks sharing GPU 0
      # (launch device "cuda-shared") on a one-GPU machine.
      dev=cuda; [ "$ngpu" -ge 2 ] || dev=cuda-shared
      SYMMCOLL_TEST_DEVICE=$dev timeout ${FAULTS_TIMEOUT:-500} python3 -m pytest -v -rA -p no:cacheprovider \
        tests/test_faults.py 2>&1 | tee "$OUT/faults_$dev.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    backend-bench)
      # Issue 28 point 3's second half: an existing DTensor model (symmcoll.models.dtensor_llama: torchtitan's
      # Llama block at Llama-3-70B sizes, parallelised by torch's parallelize_module plans) compiled plainly
      # (torch.compile: inductor, the baseline) and with symmcoll.backend(inner="inductor"), both
      # mode="reduce-overhead" (a case falls back to mode "default" + a CUDA graph of our own where that fails,
      # rows of both kept), decode 1/8/64 (KV cache 2048) and prefill 1x2048, 4x4096 (tp and tp_sp), world size
      # = the GPUs here (1 on a one-GPU machine, where DTensor leaves no collective: both modes compile the same
      # graph and "x ind." shows the backend's own cost). Every mode is checked against the fp32 block before it
      # is timed. No case starts after BACKEND_BENCH_LIMIT s; the JSON is rewritten after every case.
      # BACKEND_BENCH_CASES picks cases (full names, or prefixes: "decode prefill:4x4096:tp_sp"); on one GPU
      # the default leaves out tp_sp (at one rank it has no collective either).
      bb_cases=${BACKEND_BENCH_CASES:-}
      [ -z "$bb_cases" ] && [ "$ngpu" -lt 2 ] && bb_cases="decode prefill:1x2048:tp prefill:4x4096:tp"
      timeout ${BACKEND_BENCH_TIMEOUT:-470} python3 -m symmcoll bench --op backend_block --world-size "$ngpu" \
        -n ${BACKEND_BENCH_REPLAYS:-50} --time-limit ${BACKEND_BENCH_LIMIT:-300} ${bb_cases:+--shapes $bb_cases} \
        --out "$OUT" 2>&1 | tee "$OUT/backend_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    backend-profile)
      # Why the DTensor block's decode 64 is slower through symmcoll.backend than plain Inductor at ws 4
      # (benchmarks/NOTES.md, "backend_block decode 64"): backend_block --profile on BACKEND_PROFILE_CASES (default
      # decode:64:tp and decode:1:tp, where it wins), both modes, each profiled before it is timed: every rank's GPU
      # kernels by name (us and calls a step, top 20), GPU busy / idle and host time a step, in the log and the JSON
      # (traces of the GPU activities in traces/), into $OUT/backend_profile/. Then decode:64:tp again with
      # matmul_all_reduce's "auto" forced to each of BACKEND_PROFILE_FORCE (default "nccl one_shot": torch.matmul +
      # the process group's all-reduce inside our op, after a one-program barrier; the fused one-shot kernel; ""
      # skips them) through a dispatch table of its own (this GPU's shipped table + that rule), into
      # $OUT/backend_profile/force_<name>/. About 3 minutes on 4 GPUs (at most 150 + 90 s per forced algorithm).
      bp=$OUT/backend_profile; mkdir -p "$bp"
      SYMMCOLL_TRACE_DIR=$bp/traces timeout ${BACKEND_PROFILE_TIMEOUT:-150} python3 -m symmcoll bench --op backend_block \
        --world-size "$ngpu" -n ${BACKEND_BENCH_REPLAYS:-50} --time-limit $(( ${BACKEND_PROFILE_TIMEOUT:-150} - 50 )) \
        --profile --shapes ${BACKEND_PROFILE_CASES:-decode:64:tp decode:1:tp} --out "$bp" 2>&1 | tee "$bp/backend_profile.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      for algo in ${BACKEND_PROFILE_FORCE-nccl one_shot}; do
        dir=$bp/force_$algo; mkdir -p "$dir"
        python3 - "$algo" "$ngpu" > "$dir/dispatch.json" <<'PY'
import sys, torch
from symmcoll import dispatch
algorithm, world = sys.argv[1], int(sys.argv[2])
table = dispatch.active_table(torch.device("cuda", 0))
rules = [r for r in table.rules if r.op != "matmul_all_reduce"]
rules.append(dispatch.Rule("matmul_all_reduce", world, "bf16", 1 << 62, algorithm))
print(dispatch.Table(tuple(rules), f"{table.source}; every matmul_all_reduce: {algorithm}").to_json())
PY
        SYMMCOLL_DISPATCH_FILE=$dir/dispatch.json timeout ${BACKEND_FORCE_TIMEOUT:-90} \
          python3 -m symmcoll bench --op backend_block --world-size "$ngpu" -n ${BACKEND_BENCH_REPLAYS:-50} --profile \
          --shapes decode:64:tp --out "$dir" 2>&1 | tee "$dir/backend_profile.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    backend)
      # symmcoll.backend (issue 26): the Llama block of tests/llama_client.py compiled with inner="inductor"
      # under mode="reduce-overhead" (CUDA graphs: warm-up, capture, replay) and "max-autotune-no-cudagraphs",
      # two ranks (sharing GPU 0 on a one-GPU machine) and world size 1, against the unsharded block.
      # One JSON line per case in backend_gpu.jsonl (errors, rewrites, kernel launches, seconds; under
      # reduce-overhead cuda_graphs: graphs recorded per rank, which must be > 0). A failed cudagraph-trees pool
      # check is raised again listing each live block's size and allocating frames; per_call: each call's
      # error (0 warm-up, 1 recorded + replayed, 2 replayed). Then the inference tail's two ops alone
      # (tests/norm_tail_check.py): "case": "norm tail" lines, one per (rms algorithm, all-reduce, run,
      # rank), runs reduce-overhead / cuda_graph / eager, each call's wrong rows named (own lost, peer lost,
      # stale, zero, other). BACKEND_FILTER (pytest -k) splits it, e.g. "reduce" and "autotune" in two calls.
      rm -f "$OUT/backend_gpu.jsonl"
      SYMMCOLL_BACKEND_RESULTS="$OUT/backend_gpu.jsonl" timeout ${BACKEND_TIMEOUT:-470} python3 -m pytest -v -rA -s \
        -p no:cacheprovider -m gpu ${BACKEND_FILTER:+-k "$BACKEND_FILTER"} tests/test_compile_backend.py 2>&1 \
        | tee "$OUT/backend_gpu.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    roofline)
      # Issue 23, one GPU, world size 1: every candidate config of all_reduce_rms_norm, moe_dispatch /
      # moe_combine and the codec kernels beside torch (eager, torch.compile) and the SM copy rate, each
      # checked against the fp32 reference first; the code before the change too if old_main/src exists
      # (git archive --prefix=old_main/ <commit> src | tar x; carry old_main: ba3dbd4 = run 1's code,
      # 0851bfe = before the rewrite). ~2.5-3.5 minutes.
      # ROOFLINE_PARTS narrows (rms moe codecs; also dispatch: moe_dispatch's one-launch variants 2 and 3
      # at every case beside the default and torch, then a table of the best time per variant; about
      # 3-4 minutes with ROOFLINE_DEADLINE=200 ROOFLINE_TIMEOUT=280); parts run in the order named. The
      # launch table written beside the JSON is the shipped one with the measured cases replaced.
      # rms and dispatch in one call (about 5-6 minutes with the old tree):
      #   ROOFLINE_PARTS="rms dispatch" ROOFLINE_DEADLINE=390 ROOFLINE_TIMEOUT=470
      # Part "combine": moe_dispatch / moe_combine with their default configs beside torch at >= 1024
      # tokens (no sweep, ~40 s). Issue 23 round on one H100 (rms, dispatch variants 3 / 4, the codecs
      # and combine where no H100 number exists; ~6.5 minutes with the old tree = 5e40c8a):
      #   ROOFLINE_PARTS="rms dispatch codecs combine" ROOFLINE_DEADLINE=350 ROOFLINE_TIMEOUT=410
      # ROOFLINE_ARGS narrows the cases (benchmarks/roofline.py --rms-tokens / --quants / --moe-tokens;
      # the old tree's cases too), e.g. the issue-23 H100 cells and their neighbours (branch mem4):
      #   ROOFLINE_PARTS="dispatch rms" ROOFLINE_ARGS="--rms-tokens 2048 8192 --quants bf16 --moe-tokens 1024"
      # Dispatch variant 6 at 1024 tokens (branch mem5, ~4-5 minutes, no old tree):
      #   ROOFLINE_PARTS=dispatch ROOFLINE_DEADLINE=300 ROOFLINE_TIMEOUT=380 ROOFLINE_ARGS="--moe-tokens 1024"
      old=""; [ -d old_main/src ] && old="--old-src old_main/src"
      timeout ${ROOFLINE_TIMEOUT:-475} python3 benchmarks/roofline.py --out "$OUT/roofline.json" \
        --deadline ${ROOFLINE_DEADLINE:-400} $old ${ROOFLINE_PARTS:+--parts $ROOFLINE_PARTS} ${ROOFLINE_ARGS:-} 2>&1 \
        | tee "$OUT/roofline.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    roofline-bench)
      # The memory-bound ops through `symmcoll bench` with the roofline columns (bytes, GB/s, % of the SM
      # copy rate measured at the start of each op's run), world size 1 (ROOFLINE_WORLD), a few shapes per
      # op (ROOFLINE_SHAPES replaces them for every op named in ROOFLINE_BENCH_OPS): about 3-4 minutes, most
      # of it torch.compile of the baseline (once per hidden size and quant) and a rank pool per op. The
      # full grids with every candidate config are the roofline stage's (benchmarks/roofline.py).
      : > "$OUT/roofline_bench.log"
      for op in ${ROOFLINE_BENCH_OPS:-all_reduce_rms_norm all_reduce_quantized moe_dispatch moe_combine}; do
        case $op in
          all_reduce_rms_norm) shapes="32x4096 2048x4096 512x16384 512x16384x2"; limit=200 ;;
          all_reduce_quantized) shapes="16x0x64 256x2x64"; limit=90 ;;
          *) shapes="128x7168x64x8 1024x4096x8x2 4096x7168x256x8"; limit=80 ;;
        esac
        timeout ${ROOFLINE_BENCH_TIMEOUT:-$limit} python3 -m symmcoll bench --op $op --world-size ${ROOFLINE_WORLD:-1} \
          --shapes ${ROOFLINE_SHAPES:-$shapes} -n ${ROOFLINE_ITERS:-10} --out "$OUT" 2>&1 | tee -a "$OUT/roofline_bench.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    roofline-shared)
      # The changed protocols (all_reduce_rms_norm one/two-shot, MoE dispatch/combine) with two ranks
      # sharing GPU 0: exact or within tolerance, the same bits on every rank, graph replays.
      timeout ${SHARED_TIMEOUT:-475} python3 benchmarks/shared_gpu_check.py --world-size ${SHARED_WORLD_SIZE:-2} \
        --stages roofline_protocols --out "$OUT/roofline_shared.json" 2>&1 | tee "$OUT/roofline_shared.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    semantics)
      # Issue 24 on one GPU, two ranks sharing it (launch device "cuda-shared"), about 5 minutes (at most
      # 7.5): NaN/Inf through every reduction algorithm, the fused ops' reductions and the quantized path
      # (kernel and exact fallback) against torch.sum/amax/amin of the stacked inputs; the device cost of the
      # call-descriptor checks in CUDA graphs (JSON: verdicts[].cost_us of the library's variant at world 2 and
      # 8, target <= 0.1 us; the candidate variants and the tree before: stage desc-cost); run 1's two wrong answers
      # made over and over (semantics_races.json: failures classified "own lost" / "peer lost" / "zero");
      # 1000 random calls, a fifth of them differing between ranks, against symmcoll.reference, after a
      # warm-up that compiles in 6 pools at once (JSON: failures, calls, warm_up; a time budget stops it
      # early and says so).
      SYMMCOLL_TEST_DEVICE=cuda-shared timeout ${SEMANTICS_TESTS_TIMEOUT:-120} python3 -m pytest -v -rA \
        -p no:cacheprovider tests/test_special_values.py::test_gpu_every_reduction 2>&1 | tee "$OUT/semantics_special_values.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout ${SEMANTICS_COST_TIMEOUT:-90} python3 benchmarks/desc_check_cost.py --variants none,library \
        --out "$OUT/desc_check_cost.json" 2>&1 \
        | tee "$OUT/desc_check_cost.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      timeout ${SEMANTICS_RACES_TIMEOUT:-75} python3 benchmarks/semantics_races.py --deadline ${SEMANTICS_RACES_S:-40} \
        --out "$OUT/semantics_races.json" 2>&1 | tee "$OUT/semantics_races.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      random_calls
      ;;
    desc-cost)
      # Issue 24 point 7 alone, one GPU, about 2 minutes (at most 4.5): the call-descriptor checks' device
      # cost per launch in CUDA graphs (benchmarks/desc_check_cost.py). With old_main/src (carried: git
      # archive --prefix=old_main/ <sha before> src | tar x) that tree's checks first (none and library:
      # desc_check_cost_before.json; its provenance names this tree's sha), then this tree's, every
      # variant, printing the tree before beside.
      before=""
      if [ -d old_main/src ]; then
        PYTHONPATH=$PWD/old_main/src timeout ${DESC_COST_BEFORE_TIMEOUT:-90} python3 benchmarks/desc_check_cost.py \
          --variants none,library --out "$OUT/desc_check_cost_before.json" 2>&1 | tee "$OUT/desc_check_cost_before.log"
        [ -f "$OUT/desc_check_cost_before.json" ] && before="--before $OUT/desc_check_cost_before.json"
      fi
      # DESC_COST_TREES: other trees' checks too (carried directories holding a src/, e.g. a candidate
      # header_state), none and library each: desc_check_cost_<dir>.json. DESC_COST_VARIANTS narrows this
      # tree's variants (e.g. none,library).
      for tree in ${DESC_COST_TREES:-}; do
        PYTHONPATH=$PWD/$tree/src timeout ${DESC_COST_BEFORE_TIMEOUT:-90} python3 benchmarks/desc_check_cost.py \
          --variants none,library $before --out "$OUT/desc_check_cost_$tree.json" 2>&1 | tee "$OUT/desc_check_cost_$tree.log"
      done
      timeout ${DESC_COST_TIMEOUT:-180} python3 benchmarks/desc_check_cost.py $before \
        ${DESC_COST_VARIANTS:+--variants $DESC_COST_VARIANTS} --out "$OUT/desc_check_cost.json" \
        2>&1 | tee "$OUT/desc_check_cost.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    random-calls)
      # The semantics stage's 1000 random calls alone, with a whole call's time (e.g.
      # SEMANTICS_CALLS_TIMEOUT=540 SEMANTICS_CALLS_BUDGET=500 SEMANTICS_WARM_TIMEOUT=200); SEMANTICS_ONLY=i,j
      # (and SEMANTICS_REPEAT) replays calls, SEMANTICS_CALL_TIMEOUT_S sets each call's wait budget.
      random_calls
      ;;
    restructure)
      # Issue 25 point 6, one GPU, <= 8 minutes: the same ops before and after, side by side
      # (benchmarks/restructure_check.py): collectives (and two fused ops at decode size) at world size 2
      # with both ranks on GPU 0 -- host us per eager call, eager and graph us per call -- and the fused
      # ops at world size 1 (graph us, host us; B contiguous and given as W.t()), every case checked first.
      # The tree before: git archive --prefix=old_main/ <main sha> src | tar x, carried as old_main.
      # new_main (carried, optional): the tree after, when it is not this one. RESTRUCTURE_SIZES (bytes,
      # comma-separated) narrows the collectives' sizes so that several rounds fit.
      old=""; [ -d old_main/src ] && old="--old-src old_main/src"
      new=""; [ -d new_main/src ] && new="--new-src new_main/src"
      timeout ${RESTRUCTURE_TIMEOUT:-470} python3 benchmarks/restructure_check.py --out "$OUT/${RESTRUCTURE_NAME:-restructure}.json" \
        --deadline ${RESTRUCTURE_DEADLINE:-420} ${RESTRUCTURE_PARTS:+--parts $RESTRUCTURE_PARTS} $old $new 2>&1 \
        | tee "$OUT/${RESTRUCTURE_NAME:-restructure}.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    host)
      # Issue 25 point 6, one GPU: host us per eager call, this tree and old_main/src (carried, as for
      # restructure) in alternating processes: the spread between processes of one tree is the noise to
      # judge x by. HOST_PARTS (default "fused"):
      #   fused        the fused ops at world size 1 (benchmarks/host_overhead.py --device cuda: rounds of 20
      #                calls queued on an idle GPU, as bench.timing.host_time_us), 3 processes per tree, ~3 min.
      #   collectives  the collectives of restructure_check at 4 KB and 4 MB, two ranks sharing GPU 0, each
      #                result checked exactly first; host us of both ranks (9 rounds of 10 calls) and the
      #                Python calls of one repeated call on the real GPU path; processes alternate until
      #                HOST_DEADLINE (270 s; at most HOST_REPEATS=4 per tree), <= 5 min.
      old=""; [ -d old_main/src ] && old="--old-src old_main/src"
      for part in ${HOST_PARTS:-fused}; do
        case "$part" in
          fused)
            timeout ${HOST_TIMEOUT:-420} python3 benchmarks/host_overhead.py --device cuda --repeats ${HOST_REPEATS:-3} \
              $old --out "$OUT/host_overhead.json" 2>&1 | tee "$OUT/host_overhead.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
            ;;
          collectives)
            timeout ${HOST_TIMEOUT:-300} python3 benchmarks/host_overhead.py --device cuda --path collectives \
              --repeats ${HOST_REPEATS:-4} --deadline ${HOST_DEADLINE:-270} $old \
              --out "$OUT/host_collectives.json" 2>&1 | tee "$OUT/host_collectives.log"
            [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
            ;;
          *) echo "host: unknown part $part (fused, collectives)"; status=1 ;;
        esac
      done
      ;;
    quantized-tests)
      sizes=2; [ "$ngpu" -ge 4 ] && sizes=2,4
      SYMMCOLL_TEST_WORLD_SIZES=${TEST_WORLD_SIZES:-$sizes} timeout ${TESTS_TIMEOUT:-540} python3 -m pytest -v -rA \
        -p no:cacheprovider tests/test_quantized.py 2>&1 | tee "$OUT/quantized_tests.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    quantized-bench)
      # Every format and group size beside the exact auto path and NCCL, 1-256 MB (QUANT_BENCH_MIN /
      # QUANT_BENCH_MAX / QUANT_ALGORITHMS (comma-separated: it is one word) narrow it; SYMMCOLL_QUANTIZE_MIN_BYTES=0 times the kernel
      # below its 1 MB fallback too). One world size per call keeps a call under 10 minutes.
      sizes=2; [ "$ngpu" -ge 4 ] && sizes=4
      timeout ${BENCH_TIMEOUT:-540} python3 -m symmcoll bench --op all_reduce \
        --algorithms "${QUANT_ALGORITHMS:-symmcoll:quantized_*}" auto nccl -b ${QUANT_BENCH_MIN:-1M} \
        -e ${QUANT_BENCH_MAX:-256M} --world-size ${BENCH_WORLD_SIZE:-$sizes} --time-limit $(( ${BENCH_TIMEOUT:-540} - 25 )) \
        --out "$OUT" 2>&1 | tee "$OUT/quantized_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    quant-variants)
      # Issue 18: the quantized all-reduce's kernels side by side, one bench process each (the switches are read
      # at import): "rows" = comm/quantized.py's kernel with its size table, "rows:B,P,W" = it with
      # LaunchConfig(B, P, W) at every size (SYMMCOLL_QUANT_CONFIG). (The first kernel, "tiles", is gone: 3.4-5x
      # slower, benchmarks/results/2026-11-27-quant-rows-h100x2.) The exact auto path times once, in the first process. Every result is checked
      # against the fp32 sum (the documented error bound, #wrong) before it is timed. "prefetch" / "prefetch:B,P,W" =
      # the kernel with every load a loop step ahead (SYMMCOLL_QUANT_PREFETCH=1); "...@R" caps registers at R a thread
      # (SYMMCOLL_QUANT_MAXNREG: @64 fits 4 programs of 8 warps an SM, for B,P,W = 2048,528,8); a prefetch variant first
      # runs the bit-exact GPU test (test_gpu_quantized_fresh_data_and_graphs, int8 and int4, ws 2) with its switches
      # (QUANT_VARIANT_TEST=0 skips it), and is not timed if that fails. Since 2026-11-28 "rows" is the shipped
      # size rule (prefetching from 16 MB a rank, comm/quantized.py); "noprefetch" / "noprefetch:B,P,W" = never.
      first=1
      for variant in ${QUANT_VARIANTS:-rows rows:2048,264,8 rows:4096,396,8}; do
        name=${variant//[:,@]/-}; mkdir -p "$OUT/$name"
        kernel=${variant%@*}; regs=""
        [ "$kernel" != "$variant" ] && regs="SYMMCOLL_QUANT_MAXNREG=${variant##*@}"
        case $kernel in
          rows) vars="" ;;
          noprefetch) vars="SYMMCOLL_QUANT_PREFETCH=0" ;;
          noprefetch:*) vars="SYMMCOLL_QUANT_PREFETCH=0 SYMMCOLL_QUANT_CONFIG=${kernel#noprefetch:}" ;;
          rows:*) vars="SYMMCOLL_QUANT_CONFIG=${kernel#rows:}" ;;
          prefetch) vars="SYMMCOLL_QUANT_PREFETCH=1" ;;
          prefetch:*) vars="SYMMCOLL_QUANT_PREFETCH=1 SYMMCOLL_QUANT_CONFIG=${kernel#prefetch:}" ;;
          *) echo "quant-variants: unknown variant $variant"; status=1; continue ;;
        esac
        vars="$vars${regs:+ $regs}"; vars=${vars# }
        if [[ "$vars" == *PREFETCH=1* ]] && [ "${QUANT_VARIANT_TEST:-1}" = 1 ]; then
          env $vars SYMMCOLL_TEST_WORLD_SIZES=2 timeout ${QUANT_VARIANT_TEST_TIMEOUT:-150} python3 -m pytest -v -rA \
            -p no:cacheprovider "tests/test_quantized.py::test_gpu_quantized_fresh_data_and_graphs[int8-2]" \
            "tests/test_quantized.py::test_gpu_quantized_fresh_data_and_graphs[int4-2]" \
            2>&1 | tee "$OUT/$name/test.log"
          if [ "${PIPESTATUS[0]}" -ne 0 ]; then echo "quant-variants: $variant failed its test, not timed"; status=1; continue; fi
        fi
        extra=""; [ "$first" = 1 ] && extra="auto"; first=0
        echo "quant-variants: $variant (${vars:-no switch})" | tee "$OUT/$name/bench.log"
        env $vars timeout ${QUANT_VARIANT_TIMEOUT:-100} python3 -m symmcoll bench --op all_reduce --world-size 2 \
          --algorithms ${QUANT_ALGORITHMS:-symmcoll:quantized_int8 symmcoll:quantized_int4} $extra \
          -b ${QUANT_BENCH_MIN:-4M} -e ${QUANT_BENCH_MAX:-64M} -f ${QUANT_BENCH_STEP:-2} --link-bytes 64M \
          --time-limit $(( ${QUANT_VARIANT_TIMEOUT:-100} - 20 )) --out "$OUT/$name" 2>&1 | tee -a "$OUT/$name/bench.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    quantized-accuracy)
      sizes=2; [ "$ngpu" -ge 4 ] && sizes="4 2"
      timeout ${ACCURACY_TIMEOUT:-300} python3 -m symmcoll accuracy --world-size $sizes --numel ${ACCURACY_NUMEL:-1048576} \
        --out "$OUT" 2>&1 | tee "$OUT/quantized_accuracy.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    scaleout)
      # One GPU (<= 5 min): the NVSHMEM exchange kernels compiled for sm_90 against the image's device
      # library and loaded here; the hierarchical ops with emulated nodes (2x2, 2x1), ranks sharing GPU 0
      # over the emulated transport, exact. benchmarks/scaleout_check.py says what it cannot show.
      timeout -k 20 ${SCALEOUT_TIMEOUT:-300} python3 benchmarks/scaleout_check.py --out "$OUT/scaleout.json" \
        --budget-s $(( ${SCALEOUT_TIMEOUT:-300} - 30 )) 2>&1 | tee "$OUT/scaleout.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    scaleout-multi)
      # >= 2 GPUs (issue 28 point 7), one 10-minute call with the defaults (320 + 210 s, + 20 s each to die
      # after a TERM): one rank per GPU, NVSHMEM between emulated nodes of this host, exact, cheapest first:
      # 2 GPUs as 2 nodes of 1 (its
      # first case one tiny bf16 all_reduce), then all GPUs as 2 nodes, then as nodes of 1
      # (SCALEOUT_CONFIGS="2x1,2x2" overrides); the check's budget (SCALEOUT_TIMEOUT - 30 s) shared out
      # among them. Every rank prints each phase (NVSHMEM init, workspace, each case) as it happens and
      # journals it under $OUT/scaleout_multi.journal/; a phase past its limit dumps the rank's stacks and
      # ends it (the result names the phase), the next configuration still runs, and the JSON is written
      # after each. Then, only if a multi-GPU all_reduce came out exact, hierarchical (auto) beside NCCL
      # with SCALEOUT_RANKS_PER_NODE GPUs per node. benchmarks/NOTES.md "scaleout-multi on 4x H100".
      if [ "$ngpu" -lt 2 ]; then echo "scaleout-multi needs >= 2 GPUs (found $ngpu)" >&2; status=1; continue; fi
      rm -rf "$OUT/scaleout_multi.journal"
      timeout -k 20 ${SCALEOUT_TIMEOUT:-320} python3 benchmarks/scaleout_check.py --multi-gpu --out "$OUT/scaleout_multi.json" \
        --budget-s $(( ${SCALEOUT_TIMEOUT:-320} - 30 )) ${SCALEOUT_CONFIGS:+--configs $SCALEOUT_CONFIGS} 2>&1 \
        | tee "$OUT/scaleout_multi.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      # Rank processes of a killed check still alive (one stuck in a GPU wait would skew the bench): end them.
      for pid in $(cat "$OUT/scaleout_multi.journal/pids" 2>/dev/null); do
        grep -q multiprocessing "/proc/$pid/cmdline" 2>/dev/null && kill -9 "$pid" 2>/dev/null \
          && echo "ended leftover rank process $pid of scaleout-multi"
      done
      if ! python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["summary"]
sys.exit(0 if any("all_reduce" in c["exact_ops"] for c in s.values()) else 1)' "$OUT/scaleout_multi.json" 2>/dev/null; then
        echo "scaleout-multi: no exact multi-GPU all_reduce, the bench is not run" | tee "$OUT/scaleout_bench.log"
        status=1; continue
      fi
      SYMMCOLL_RANKS_PER_NODE=${SCALEOUT_RANKS_PER_NODE:-1} timeout -k 20 ${SCALEOUT_BENCH_TIMEOUT:-210} python3 -m symmcoll bench \
        --op ${BENCH_OPS:-all_reduce all_gather reduce_scatter all_to_all} --algorithms auto nccl \
        -b ${SCALEOUT_MIN:-32K} -e ${SCALEOUT_MAX:-64M} -f 4 --world-size "$ngpu" \
        --time-limit $(( ${SCALEOUT_BENCH_TIMEOUT:-210} - 60 )) --out "$OUT" 2>&1 | tee "$OUT/scaleout_bench.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    multi-diagnose)
      # MULTI_DIAG_STEPS="head abort-check-every-64-spins" runs only the fix and the old value (~5 min).
      # >= 2 GPUs, <= 8 min (MULTI_DIAG_BUDGET s of probes): why the barrier-free all-reduces run 25-400x slow
      # at mid sizes on real multi-GPU since 401756e (benchmarks/multi_gpu_regression.md). Every step is
      # benchmarks/multi_gpu_probe.py (no symmcoll.bench) in fresh rank processes (the debug switches of
      # symmcoll.debug_switches are read at import), run from /tmp, under timeout; most decisive first, and
      # a step is skipped once less than 45 s of the budget is left. Old trees come from bis/<sha>/src
      # (scripts/make_bisect_trees.sh; carry "bis"). One line per step: $OUT/multi-diagnose/summary.txt.
      if [ "$ngpu" -lt 2 ]; then echo "multi-diagnose needs >= 2 GPUs (found $ngpu)" >&2; status=1; continue; fi
      mkdir -p "$OUT/multi-diagnose"
      diag_dir="$(cd "$OUT/multi-diagnose" && pwd)" repo=$PWD diag_t0=$SECONDS diag_budget=${MULTI_DIAG_BUDGET:-440}
      nvidia-smi topo -m > "$diag_dir/topo.txt" 2>&1
      diag_probe() {  # diag_probe LABEL LIMIT_S [VAR=VALUE ...] -- [probe arguments]
        local label=$1 limit=$2 envs=() left; shift 2
        # MULTI_DIAG_STEPS (labels, e.g. "head abort-check-every-64-spins"): run only these steps.
        case " ${MULTI_DIAG_STEPS:-$label} " in *" $label "*) ;; *) return ;; esac
        while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
        left=$(( diag_budget - (SECONDS - diag_t0) ))
        if [ "$left" -lt 45 ]; then echo "skipped $label: ${left}s of the budget left" | tee -a "$diag_dir/skipped.txt"; return; fi
        [ "$limit" -gt "$left" ] && limit=$left
        echo "=== $label (limit ${limit}s) ${envs[*]-}"
        (cd /tmp && env ${envs[@]+"${envs[@]}"} SYMMCOLL_TIMEOUT_S=10 timeout -k 15 "$limit" python3 \
          "$repo/benchmarks/multi_gpu_probe.py" --world-size "$ngpu" --label "$label" --out "$diag_dir/$label.json" \
          --budget-s $(( limit > 100 ? limit - 60 : limit / 3 )) "$@") 2>&1 | tee "$diag_dir/$label.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        # Rank processes of this step still alive (a cut run): end them, by the pids they wrote.
        local pid
        for pid in $(cat "$diag_dir/$label.json.pids" 2>/dev/null); do
          grep -q multi_gpu_probe "/proc/$pid/cmdline" 2>/dev/null || grep -q multiprocessing "/proc/$pid/cmdline" 2>/dev/null \
            && kill -9 "$pid" 2>/dev/null && echo "ended leftover rank process $pid of $label"
        done
      }
      # The other suspects are tested with the record looked at every 64 spins, as before the fix.
      old_look=SYMMCOLL_DEBUG_ABORT_CHECK_SPINS=64
      variant="--algorithms low_latency sentinel_one_shot sentinel_two_shot --sizes 64K 256K 1M --replays 20 --eager-calls 30"
      # 1. this tree as it is (the fix: waits look at the host record every 65536 spins): every algorithm
      # and size, the host-read micro-benchmark, devices and contexts. 1b. the same with the look every 64
      # spins, as before the fix: the before/after of the fix in one call.
      diag_probe head 170 -- --host-reads
      diag_probe abort-check-every-64-spins 120 $old_look -- $variant
      # 2-3. the error-record look inside every spin loop: gone, then kept but on device memory.
      diag_probe no-abort-check 120 SYMMCOLL_DEBUG_NO_ABORT_CHECK=1 -- $variant
      diag_probe status-on-device 120 $old_look SYMMCOLL_DEBUG_STATUS_ON_DEVICE=1 -- $variant
      # 4-5. the last tree before the restructure and the restructure itself (same probe, their own kernels).
      for sha in 6fd2d11 401756e; do
        if [ -d "bis/$sha/src" ]; then diag_probe "tree-$sha" 120 PYTHONPATH="$repo/bis/$sha/src" -- $variant
        else echo "missing bis/$sha/src (scripts/make_bisect_trees.sh, carry bis)" | tee -a "$diag_dir/skipped.txt"; fi
      done
      # 6-9. the other suspects, one per run.
      diag_probe no-headers-no-announce 120 $old_look SYMMCOLL_DEBUG_NO_HEADERS=1 SYMMCOLL_DEBUG_NO_ANNOUNCE=1 -- $variant
      diag_probe separate-regions 120 $old_look SYMMCOLL_DEBUG_SEPARATE_REGIONS=1 -- $variant
      diag_probe jit-launch 120 $old_look SYMMCOLL_FAST_LAUNCH=0 -- $variant
      # 10. the rest of the bisect, while the budget lasts.
      for sha in 70f4eb8 0a9ef75 9089786 0168b5c 1935f76 e451dd6 02a9127 d925aa8 99473e3 71f08ae 7af12e8; do
        [ -d "bis/$sha/src" ] && diag_probe "tree-$sha" 120 PYTHONPATH="$repo/bis/$sha/src" -- $variant
      done
      python3 benchmarks/multi_gpu_probe.py --summarize "$diag_dir" 2>&1 | tee "$diag_dir/summary.txt"
      ;;
    *) echo "unknown stage $stage" >&2; status=2 ;;
  esac
done
# The device tool brings back only a few files per call: past 7, everything under $OUT (logs and result
# JSONs) travels in one archive beside env.txt; unpack it into benchmarks/results/<dir>/.
nfiles=$(find "$OUT" -type f | wc -l)
if [ "$nfiles" -gt 7 ]; then
  # Files go first, then the folders left empty: a stage's folder that keeps its own env.txt is not empty,
  # and a failed delete must never keep the archive out of $OUT (2026-11-27: fused-env's results were lost so).
  if tar czf "$OUT.bundle.tgz" -C "$OUT" .; then
    find "$OUT" -mindepth 1 -type f ! -path "$OUT/env.txt" -delete
    find "$OUT" -mindepth 1 -type d -empty -delete
    mv "$OUT.bundle.tgz" "$OUT/bundle.tgz" && echo "$nfiles files bundled into $OUT/bundle.tgz"
  fi
fi
exit $status
