#!/usr/bin/env bash
# Device check of the narrow 2wg kernel (pipelines/variant_2wg_narrow.py: both products transposed; the
# "2wg" pipeline's kernel at <= 32 query rows per kv head), in calls of under 10 minutes:
#   run(command="source .device/env.sh && bash scripts/narrow_check.sh MODE", carry=[".device"])
# tests:  every GPU test (scripts/gpu_tests_sharded.py), then 2wg (narrow) against 2wg-wide and 3wg at page 1.
# ab:     2wg (narrow) against 2wg-wide and 3wg on the h16 rows at page 64.
# checks: memcheck and synccheck on narrow tests, and a plan sweep of two h16 rows.
# Logs go to $OUT (or /tmp/narrow-check).
set -u
out=${OUT:-/tmp/narrow-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
source "$(dirname "$0")/device_step.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
modes="--mode 2wg --mode 2wg-wide --mode 3wg"
fail=0
case "${1:-tests}" in
tests)
  OUT=$out/tests python scripts/gpu_tests_sharded.py tests/ --shards 14 --timeout 420 || fail=1
  rows="--config 1,1,1,16,1024 --config 1,8,1,16,4096 --config 1,32,1,16,4096 --config 1,128,1,16,4096"
  step ab_p1 150 python scripts/entry_ab.py $modes $rows --replays 200 --json "$out/ab_p1.json" || fail=1
  grep -E "pass 2" "$out/ab_p1.log" ;;
ab)
  rows="--config 64,1,1,16,1024 --config 64,1,1,16,16384 --config 64,8,1,16,16384 --config 64,32,1,16,4096"
  rows="$rows --config 64,64,1,16,4096 --config 64,128,1,16,1024 --config 64,128,1,16,4096 --config 64,8,2,8,4096"
  rows="$rows --config 16,32,1,16,4096 --config 16,128,1,16,4096"
  step ab 280 python scripts/entry_ab.py $modes $rows --replays 300 --json "$out/ab.json" || fail=1
  grep -E "pass 2" "$out/ab.log" ;;
widths)
  # The 32-wide form (17-32 rows per kv head) and the refactor of the refills: the narrow tests, 2wg's kernel
  # tests, sanitizers on three 32-wide tests, then 2wg (narrow) against 2wg-wide and 3wg on 32-row shapes.
  OUT=$out/narrow python scripts/gpu_tests_sharded.py tests/test_narrow_gpu.py --shards 14 --timeout 200 || fail=1
  OUT=$out/kernel python scripts/gpu_tests_sharded.py tests/test_kernel_gpu.py --shards 14 --timeout 240 -k 2wg || fail=1
  for tool in memcheck synccheck; do
    MLA_NARROW_TEST_LIMIT_S=200 step "$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      python -m pytest -m gpu -q -p no:cacheprovider tests/test_narrow_gpu.py \
      -k "b1-sq1-h32-hkv1-full-p64 or b5-sq2-h16 or b4-sq4-h8" || fail=1
  done
  rows="--config 64,1,1,32,16384 --config 64,8,1,32,4096 --config 64,32,1,32,4096 --config 64,128,1,32,4096"
  rows="$rows --config 64,1,2,16,16384 --config 64,8,2,16,4096 --config 64,128,2,16,4096 --config 1,8,1,32,4096"
  step ab32 200 python scripts/entry_ab.py $modes $rows --replays 200 --passes 2 --json "$out/ab32.json" || fail=1
  grep -E "pass 2" "$out/ab32.log" ;;
checks)
  for tool in memcheck synccheck; do
    MLA_NARROW_TEST_LIMIT_S=200 step "$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 1 \
      python -m pytest -m gpu -q -p no:cacheprovider tests/test_narrow_gpu.py \
      -k "b1-sq1-h16-hkv1-full-p64 or b4-sq4 or p1- or fp32" || fail=1
  done
  step sweep 120 python scripts/plan_sweep.py --config 64,1,1,16,1024 --config 64,1,1,16,16384 --num-sms 132 \
    --num-sms 16 --num-sms 64 --mode 2wg --mode 2wg-wide --passes 1 || fail=1
  grep -E "chunks|us" "$out/sweep.log" | grep -v -i warn ;;
esac
exit $fail
