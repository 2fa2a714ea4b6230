#!/usr/bin/env bash
# Device check of the experimental narrow 2wg kernel (pipelines/variant_2wg_narrow.py), one call:
#   run(command="source .device/env.sh && bash scripts/narrow_check.sh", carry=[".device"])
# GPU tests against the fp32 reference (tests/test_narrow_gpu.py, sharded), then, if they pass,
# entry_ab 2wg vs 2wg-narrow on the h16 rows, memcheck and synccheck on two narrow tests, and a plan
# sweep of b1 h16 1024 with the narrow kernel. Logs go to $OUT (or /tmp/narrow-check).
set -u
out=${OUT:-/tmp/narrow-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
source "$(dirname "$0")/device_step.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$out/tests python scripts/gpu_tests_sharded.py tests/test_narrow_gpu.py --shards 10 --timeout 200 || exit 1
rows="--config 64,1,1,16,1024 --config 64,1,1,16,16384 --config 64,8,1,16,4096 --config 64,32,1,16,1024 --config 64,128,1,16,4096"
step ab 150 python scripts/entry_ab.py --mode 2wg --mode 2wg-narrow $rows --replays 300 --json "$out/ab.json"
grep -E "pass|max" "$out/ab.log" | grep -v -i warn
for tool in memcheck synccheck; do
  MLA_NARROW_TEST_LIMIT_S=200 step "$tool" 90 compute-sanitizer --tool "$tool" --error-exitcode 1 \
    python -m pytest -m gpu -q -p no:cacheprovider tests/test_narrow_gpu.py -k "b1-sq1-h16-hkv1-full-p64 or b4-sq4"
done
step sweep 90 python scripts/plan_sweep.py --config 64,1,1,16,1024 --config 64,1,1,16,16384 --num-sms 132 \
  --num-sms 16 --num-sms 64 --mode 2wg --mode 2wg-narrow --passes 1
grep -E "chunks|us" "$out/sweep.log" | grep -v -i warn
