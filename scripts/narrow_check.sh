#!/usr/bin/env bash
# Device check of the experimental narrow 2wg kernels (pipelines/variant_2wg_narrow.py, S^T transposed;
# pipelines/variant_2wg_narrow_t.py, S^T and O^T transposed), in two calls of under 10 minutes:
#   run(command="source .device/env.sh && bash scripts/narrow_check.sh tests", carry=[".device"])
#   run(command="source .device/env.sh && bash scripts/narrow_check.sh checks", carry=[".device"])
# tests: the GPU tests against the fp32 reference (tests/test_narrow_gpu.py, sharded), then, if they pass,
# entry_ab of 2wg, 2wg-narrow and 2wg-narrow-t on the h16 rows.
# checks: memcheck and synccheck on narrow_t tests, and a plan sweep of two h16 rows with all three.
# Logs go to $OUT (or /tmp/narrow-check).
set -u
out=${OUT:-/tmp/narrow-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
source "$(dirname "$0")/device_step.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
modes="--mode 2wg --mode 2wg-narrow --mode 2wg-narrow-t"
if [ "${1:-tests}" = tests ]; then
  OUT=$out/tests python scripts/gpu_tests_sharded.py tests/test_narrow_gpu.py --shards 14 --timeout 240 || exit 1
  rows="--config 64,1,1,16,1024 --config 64,1,1,16,16384 --config 64,8,1,16,4096 --config 64,32,1,16,1024"
  rows="$rows --config 64,128,1,16,4096 --config 64,1,1,16,4096 --config 64,8,2,8,4096"
  step ab 200 python scripts/entry_ab.py $modes $rows --replays 300 --json "$out/ab.json"
  grep -E "pass|max" "$out/ab.log" | grep -v -i warn
else
  for tool in memcheck synccheck; do
    MLA_NARROW_TEST_LIMIT_S=200 step "$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      python -m pytest -m gpu -q -p no:cacheprovider tests/test_narrow_gpu.py \
      -k "narrow_t and (b1-sq1-h16-hkv1-full-p64 or b4-sq4 or p1- or fp32)"
  done
  step sweep 120 python scripts/plan_sweep.py --config 64,1,1,16,1024 --config 64,1,1,16,16384 --num-sms 132 \
    --num-sms 16 --num-sms 64 $modes --passes 1
  grep -E "chunks|us" "$out/sweep.log" | grep -v -i warn
fi
