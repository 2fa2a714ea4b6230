#!/usr/bin/env bash
# One device call that checks the experimental overlap kernel (pipelines/variant_2wg_overlap.py) and
# times it beside 2wg: its GPU tests against the fp32 reference (both forms), compute-sanitizer memcheck
# and synccheck on a few of them, then scripts/entry_ab.py on the compute-bound and latency rows.
# Each step has its own time limit so that a hang in one (a protocol bug) leaves the others' logs.
#
#   run(command="source .device/env.sh && bash scripts/overlap_check.sh", carry=[".device"])
#
# Logs go to $OUT (or /tmp/overlap-check). Exit status: non-zero if a correctness step failed.
set -u
out=${OUT:-/tmp/overlap-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
fail=0
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1; local rc=$?
  printf '%-10s rc=%d %4ds  %s\n' "$name" "$rc" $((SECONDS - t0)) "$(grep -E "passed|failed|ERROR SUMMARY|pass 2" "$out/$name.log" | tail -n 1 | cut -c1-140)"
  return $rc; }
nvidia-smi --query-gpu=name --format=csv,noheader
step tests 300 python -m pytest -m gpu -q -p no:cacheprovider tests/test_overlap_gpu.py || fail=1
sel="b6-sq1-h128 or b3-sq4-h128 or p16 or p1-"
export MLA_OVERLAP_TEST_LIMIT_S=100  # the test's hang guard, longer under the sanitizers
for tool in memcheck synccheck; do
  step "$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 1 \
    python -m pytest -m gpu -q -p no:cacheprovider tests/test_overlap_gpu.py -k "$sel" || fail=1
done
step ab 240 python scripts/entry_ab.py --mode 2wg --mode 2wg-overlap --mode 2wg-overlap-defer --passes 2 \
  --config 64,128,1,128,4096 --config 64,128,2,64,4096 --config 64,64,1,128,1024 --config 64,128,1,16,4096 \
  --config 64,1,1,128,16384 --config 64,8,1,64,4096 --config 64,1,1,16,1024 --json "$out/ab.json"
grep -v -i warn "$out/ab.log" | grep "pass" || true
exit $fail
