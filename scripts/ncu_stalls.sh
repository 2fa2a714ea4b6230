#!/usr/bin/env bash
# Where warps stall, per kernel form (issue 8's softmax-slowdown question), in one device call: ncu's warp
# state and per-instruction source counters (SASS) for the third replay of scripts/profile_decode.py --mode M,
# for each mode given, and for scripts/wgmma_rate.py cases after "--rate". Reports (.ncu-rep), the details
# page and the per-instruction CSV go to $OUT; scripts/ncu_stall_table.py reads the CSVs on any machine.
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
  if [ $rate = 0 ]; then
    timeout 300 ncu -k regex:MLADecode --launch-skip 2 --launch-count 1 $sections -f -o "$out/$m" \
      python scripts/profile_decode.py --config "$cfg" --mode "$m" --calls 4 > "$out/$m.err" 2>&1
  else
    timeout 300 ncu -k regex:[Ww]gmma --launch-skip 1 --launch-count 1 $sections -f -o "$out/$m" \
      python scripts/wgmma_rate.py --case "$m" --iters 400 > "$out/$m.err" 2>&1
  fi
  echo "$m rc=$? $((SECONDS - t0))s"
  ncu --import "$out/$m.ncu-rep" --page details > "$out/$m.details.txt" 2>&1
  ncu --import "$out/$m.ncu-rep" --page source --csv --print-source sass > "$out/$m.sass.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps" "$out/$m.details.txt" | head -8
done
