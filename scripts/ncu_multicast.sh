#!/usr/bin/env bash
# ncu of the 2wg decode kernel with multicast on and off (issue 9's L2-to-SM traffic figure), one config,
# in one device call: ncu's memory workload sections (L2 and crossbar traffic tables) for the third
# launch of scripts/profile_decode.py, once per MLA_MULTICAST value. Logs and CSVs go to $OUT.
#
#   run(command="source .device/env.sh && bash scripts/ncu_multicast.sh [page,b,s_q,h_q,seqlen]",
#       carry=[".device"])
set -u
cfg=${1:-64,128,1,128,4096}
out=${OUT:-/tmp/ncu-multicast}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for mc in 1 0; do
  t0=$SECONDS
  MLA_MULTICAST=$mc timeout 240 ncu -k regex:MLADecode --launch-skip 2 --launch-count 1 \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SpeedOfLight --csv \
    python scripts/profile_decode.py --config "$cfg" > "$out/ncu_mc$mc.csv" 2> "$out/ncu_mc$mc.err"
  echo "multicast=$mc rc=$? $((SECONDS - t0))s"
  grep -E "L2|L1|Duration|DRAM|lts__|Bytes" "$out/ncu_mc$mc.csv" | awk -F'","' '{print $(NF-2) " | " $(NF-1) " | " $NF}' \
    | sed 's/"$//' | head -60
done
