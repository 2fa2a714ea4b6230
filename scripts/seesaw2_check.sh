#!/usr/bin/env bash
# One device call that checks the experimental seesaw2 kernel (pipelines/variant_seesaw2.py) and times
# it beside 2wg: its GPU tests against the fp32 reference, compute-sanitizer memcheck and synccheck on a
# few of them, then (only if those passed) scripts/entry_ab.py on the compute-bound and latency rows.
# Each step has its own time limit so that a hang in one (a protocol bug) leaves the others' logs.
#
#   run(command="source .device/env.sh && bash scripts/seesaw2_check.sh", carry=[".device"])
#
# Logs go to $OUT (or /tmp/seesaw2-check). Exit status: non-zero if a correctness step failed.
set -u
out=${OUT:-/tmp/seesaw2-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
fail=0
source "$(dirname "$0")/device_step.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
step tests 240 python -m pytest -m gpu -q -p no:cacheprovider tests/test_seesaw2_gpu.py || fail=1
sel="b3-sq2-h64 or b2-sq1-h64 or b8-sq1-h16 or b1-sq1-h64 or max16384"
export MLA_SEESAW2_TEST_LIMIT_S=100  # the test's hang guard, longer under the sanitizers
for tool in memcheck synccheck; do
  step "$tool" 150 compute-sanitizer --tool "$tool" --error-exitcode 1 \
    python -m pytest -m gpu -q -p no:cacheprovider tests/test_seesaw2_gpu.py -k "$sel" || fail=1
done
if [ $fail -eq 0 ]; then
  step ab 240 python scripts/entry_ab.py --mode 2wg --mode seesaw2 --passes 2 \
    --config 64,128,1,128,4096 --config 64,128,2,128,4096 --config 64,128,2,64,4096 --config 64,64,1,128,1024 \
    --config 64,128,1,16,4096 --config 64,1,1,128,16384 --config 64,8,1,64,4096 --json "$out/ab.json"
  grep -v -i warn "$out/ab.log" | grep "pass" || true
fi
exit $fail
