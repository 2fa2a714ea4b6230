#!/usr/bin/env bash
# One device call for the 2wg forms prepared off by default (MLADecode2WG.early_head_pages,
# hand_p_after_pv): their A/B against the library's 2wg on the latency and compute-bound rows
# (scripts/entry_ab.py: each form's out must equal 2wg's bit for bit on every row, else the script
# stops), then compute-sanitizer memcheck and synccheck over a short A/B of two small rows.
#
#   run(command="source .device/env.sh && bash scripts/options_check.sh", carry=[".device"])
#
# Logs go to $OUT (or /tmp/options-check). Exit status: non-zero if a step failed.
set -u
out=${OUT:-/tmp/options-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
fail=0
source "$(dirname "$0")/device_step.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
modes="--mode 2wg --mode 2wg-early-pages --mode 2wg-late-hand-off"
step ab 330 python scripts/entry_ab.py $modes --passes 2 \
  --config 64,1,1,16,1024 --config 64,1,1,16,16384 --config 64,1,1,128,16384 --config 64,8,1,64,4096 \
  --config 64,128,1,128,4096 --config 64,128,2,128,4096 --config 64,64,1,128,1024 --config 64,128,1,16,4096 \
  --json "$out/ab.json" || fail=1
grep -v -i warn "$out/ab.log" | grep "pass" | sed 's/max|diff|.*//' || true
for tool in memcheck synccheck; do
  step "$tool" 120 compute-sanitizer --tool "$tool" --error-exitcode 1 python scripts/entry_ab.py $modes \
    --replays 2 --passes 1 --config 64,3,1,128,700 --config 128,5,2,64,300 || fail=1
done
exit $fail
