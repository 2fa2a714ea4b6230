#!/usr/bin/env bash
# One device call that does what the machine that came is good for (sessions ask for an H200 and
# mostly get an H100):
#
#   run(command="source .device/env.sh && COMMIT=<sha> bash scripts/device_round.sh [auto|bars|checks]",
#       carry=[".device"], kind="nvidia-h200")
#
# bars (default on an H200: the issues' bars are H200 numbers): the quick perf grid with its eager
# column (written as perf JSON to $OUT), scripts/host_timing.py eager (issue 11's host path), and the
# experimental narrow kernel against 2wg on four h16 rows.
# checks (default elsewhere): correctness of what has not run on a GPU yet: the host-path GPU tests,
# racecheck on a short split request and a multi-chunk request per pipeline (scripts/diag_3wg.py:
# the hazards are counted in the case logs), then the 3wg kernel tests until the call's time is spent.
# Logs go to $OUT (or /tmp/device-round). Exit status: non-zero if a correctness step failed.
set -u
out=${OUT:-/tmp/device-round}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
source "$(dirname "$0")/device_step.sh"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "$gpu"
mode=${1:-auto}
if [ "$mode" = auto ]; then case "$gpu" in *H200*) mode=bars ;; *) mode=checks ;; esac; fi
echo "mode $mode"
commit=${COMMIT:-unknown}
fail=0
pt="python -m pytest -m gpu -q -p no:cacheprovider"
if [ "$mode" = bars ]; then
  step perf 330 python -m perf_table run --quick --out "$out" --commit "$commit" || fail=1
  step eager 200 python scripts/host_timing.py eager --rounds 3 || fail=1
  grep -E "us per call|GPU time" "$out/eager.log" || true
  # The experimental narrow kernel against 2wg on the h16 rows (H100 numbers in docs/perf-notes.md).
  step narrow 120 python scripts/entry_ab.py --mode 2wg --mode 2wg-narrow --config 64,1,1,16,1024 \
    --config 64,1,1,16,16384 --config 64,8,1,16,4096 --config 64,32,1,16,1024 --replays 300 || fail=1
  grep -E "pass" "$out/narrow.log" | grep -v -i warn || true
else
  step host 150 $pt tests/test_host_gpu.py || fail=1
  for v in 2wg 3wg seesaw; do
    step "race-$v" 100 python scripts/diag_3wg.py --variant "$v" --sanitizer racecheck --budget 90 \
      --case split-b1-16384-h64 --case b3-64,200,130 || fail=1
    # racecheck's summary lines, per case log (diag_3wg writes them under $OUT/diag_3wg/)
    grep -h -E "RACECHECK SUMMARY|hazard" "$out"/diag_3wg/*.log 2>/dev/null | sort | uniq -c | head -8
    mkdir -p "$out/race-$v-cases"; mv "$out"/diag_3wg/* "$out/race-$v-cases/" 2>/dev/null
  done
  step k3wg 90 $pt tests/test_kernel_gpu.py -k "3wg" -x || fail=1
fi
exit $fail
