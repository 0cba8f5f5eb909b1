#!/usr/bin/env bash
# The one script for the GPU machine: GPU tests and the benchmark for what changed.
#   git rev-parse HEAD > .symmcoll-sha; scripts/gpu_check.sh [tests] [bench]   (default: both)
# and call the device tool with carry=[".symmcoll-sha"].
# Writes logs and result files under $OUT (default ./out). Installs nothing: uses the image's torch and
# triton with src/ on PYTHONPATH. Every step runs under `timeout`; NVLink multicast stays off.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SYMMCOLL_TEST_DEVICE=cuda
stages=${*:-tests bench}
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
status=0

# The device copy of the tree has no .git: the sha travels in .symmcoll-sha (carry it).
[ -f .symmcoll-sha ] && export SYMMCOLL_GIT_SHA=$(cat .symmcoll-sha)
python3 - <<'PY' | tee "$OUT/env.txt"
import os, torch, triton
print("git", os.environ.get("SYMMCOLL_GIT_SHA", "unknown"))
print("torch", torch.__version__, "triton", triton.__version__, "nccl", torch.cuda.nccl.version())
print("gpus", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PY

for stage in $stages; do
  case $stage in
    tests)
      sizes=2; [ "$ngpu" -ge 3 ] && sizes=2,3; [ "$ngpu" -ge 4 ] && sizes=2,3,4
      SYMMCOLL_TEST_WORLD_SIZES=$sizes timeout 540 python3 -m pytest -q -rA -p no:cacheprovider \
        tests/ --ignore=tests/test_compile.py --ignore=tests/test_bench.py -x 2>&1 | tee "$OUT/gpu_tests.log"
      [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      ;;
    bench)
      for ws in 4 2; do
        [ "$ws" -le "$ngpu" ] || continue
        timeout 400 python3 -m symmcoll bench --op all --world-size "$ws" --out "$OUT" 2>&1 \
          | tee "$OUT/bench_ws$ws.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
      done
      ;;
    *) echo "unknown stage $stage" >&2; status=2 ;;
  esac
done
exit $status
