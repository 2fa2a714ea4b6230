#!/usr/bin/env bash
# Where warps stall, per kernel form (issue 8's softmax-slowdown question), in one device call: ncu's warp
# state and per-instruction source counters (SASS) for the third replay of scripts/profile_decode.py --mode M,
# for each mode given, and for scripts/wgmma_rate.py cases after "--rate". The details page and the
# per-instruction CSV go to $OUT ('+' in a name becomes '_'; the .ncu-rep too with KEEP_REP=1);
# scripts/ncu_stall_table.py reads the CSVs on any machine.
#
#   run(command="source .device/env.sh && bash scripts/ncu_stalls.sh 64,128,1,128,4096 2wg 2wg-qk-ahead \
#       --rate alu-ss+qk-ss falu-ss+qk-ss", carry=[".device"])
set -u
cfg=$1; shift
out=${OUT:-/tmp/ncu-stalls}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
sections="--section WarpStateStats --section SourceCounters --section SpeedOfLight"
rate=0
for m in "$@"; do
  if [ "$m" = "--rate" ]; then rate=1; continue; fi
  t0=$SECONDS
  f=${m//+/_}  # file names without '+' (the device transfer refuses them)
  if [ $rate = 0 ]; then
    timeout 300 ncu -k regex:MLADecode --launch-skip 2 --launch-count 1 $sections -f -o "$out/$f" \
      python scripts/profile_decode.py --config "$cfg" --mode "$m" --calls 4 > "$out/$f.err" 2>&1
  else
    timeout 300 ncu -k regex:[Ww]gmma --launch-skip 1 --launch-count 1 $sections -f -o "$out/$f" \
      python scripts/wgmma_rate.py --case "$m" --iters 400 > "$out/$f.err" 2>&1
  fi
  echo "$m rc=$? $((SECONDS - t0))s"
  ncu --import "$out/$f.ncu-rep" --page details > "$out/$f.details.txt" 2>&1
  ncu --import "$out/$f.ncu-rep" --page source --csv --print-source sass > "$out/$f.sass.csv" 2>&1
  [ "${KEEP_REP:-0}" = 1 ] || rm -f "$out/$f.ncu-rep" "$out/$f.err"  # the CSVs hold what the tables need
  grep -E "Duration|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps" "$out/$f.details.txt" | head -8
done
