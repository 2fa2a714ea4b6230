#!/usr/bin/env bash
# Which ncu counters separate TMA multicast on from off (issue 9's "L2-to-SM traffic"), one device call:
# lists the GPU's metrics whose names mention multicast or the L2<->crossbar paths, then measures those
# (".sum") with the usual L2/crossbar ones on the 2wg decode kernel (third launch of
# scripts/profile_decode.py) with MLA_MULTICAST=1 and 0 (or the comma-separated $METRICS instead). Output in $OUT.
#
#   run(command="source .device/env.sh && bash scripts/ncu_multicast_metrics.sh [page,b,s_q,h_q,seqlen]",
#       carry=[".device"])
set -u
cfg=${1:-64,32,1,128,4096}
out=${OUT:-/tmp/ncu-multicast}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
ncu --query-metrics > "$out/all_metrics.txt" 2>&1
grep -oiE "^[a-z0-9_]*(multicast|lts2xbar|xbar2lts|ltcfabric|mcast)[a-z0-9_]*" "$out/all_metrics.txt" | sort -u > "$out/picked.txt"
echo "picked $(wc -l < "$out/picked.txt") metric names:"; cat "$out/picked.txt"
base="gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_bytes.sum,dram__bytes_read.sum"
extra=$(sed 's/$/.sum/' "$out/picked.txt" | head -40 | paste -sd, -)
metrics=${METRICS:-$base${extra:+,$extra}}  # METRICS: measure these instead
for mc in 1 0; do
  t0=$SECONDS
  MLA_MULTICAST=$mc timeout 200 ncu -k regex:MLADecode --launch-skip 2 --launch-count 1 --metrics "$metrics" --csv \
    python scripts/profile_decode.py --config "$cfg" > "$out/ncu_mc$mc.csv" 2> "$out/ncu_mc$mc.err"
  echo "multicast=$mc rc=$? $((SECONDS - t0))s"
  grep -E '"(gpu__|lts|l1tex|dram|xbar|ltc)' "$out/ncu_mc$mc.csv" | awk -F'","' '{print $(NF-2) " | " $(NF-1) " | " $NF}' \
    | sed 's/"$//' | head -60
done
