#!/usr/bin/env bash
# Device checks of the decode's programmatic dependent launch (MLADecodeBase.dependent_launch) and of
# flash_mla_with_kvcache's per-stream workspace, in two calls (each under the 600 s per-call limit):
#
#   run(command="source .device/env.sh && bash scripts/pdl_check.sh tests", carry=[".device"])
#   run(command="source .device/env.sh && bash scripts/pdl_check.sh timing", carry=[".device"])
#
# tests: the host-path GPU tests (back-to-back calls without sync, the workspace per stream, graphs,
# the custom op), the planner+decode graphs, and for every variant the graph-replay, split-cluster,
# multicast-off and lazy-rescale kernel tests; then memcheck and synccheck on back-to-back calls and
# on a split-cluster and a multicast case. timing: host_timing.py eager (b1 h16 1024: the PDL and
# workspace A/Bs beside the API calls) and entry_ab.py 2wg vs 2wg-no-pdl, 8 decodes per graph, then 1.
# Logs go to $OUT (or /tmp/pdl-check). Exit status: non-zero if a correctness step failed.
set -u
out=${OUT:-/tmp/pdl-check}; mkdir -p "$out"
export PATH=$PATH:/usr/local/cuda/bin PYTHONUNBUFFERED=1
fail=0
source "$(dirname "$0")/device_step.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
pt="python -m pytest -m gpu -q -p no:cacheprovider"
if [ "${1:-tests}" = tests ]; then
  step host 200 $pt tests/test_host_gpu.py tests/test_planner_gpu.py -k "not device_plan_equals" || fail=1
  step kernels 220 $pt tests/test_kernel_gpu.py \
    -k "decoder_graph_replay or split_cluster_graph_replay or multicast_off or lazy_rescale" || fail=1
  for tool in memcheck synccheck; do
    step "$tool" 75 compute-sanitizer --tool "$tool" --error-exitcode 1 $pt tests/test_host_gpu.py \
      tests/test_kernel_gpu.py -k "back_to_back or split_cluster_graph_replay_and_partials and 2wg or multicast_off and 128-2wg" \
      || fail=1
  done
else
  step eager 150 python scripts/host_timing.py eager --rounds 3 || fail=1
  grep -E "us per call|GPU time" "$out/eager.log" || true
  rows="--config 64,1,1,16,1024 --config 64,1,1,128,16384 --config 64,8,1,64,4096 --config 64,128,1,128,4096"
  step ab 330 python scripts/entry_ab.py --mode 2wg --mode 2wg-no-pdl --calls 8 --calls 1 --replays 200 $rows \
    --json "$out/ab.json" || fail=1
  grep -E "pass|per graph" "$out/ab.log" | grep -v -i warn || true
fi
exit $fail
