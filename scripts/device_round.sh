#!/usr/bin/env bash
# One device call that does what the machine that came is good for (sessions ask for an H200 and
# mostly get an H100):
#
#   run(command="source .device/env.sh && COMMIT=<sha> bash scripts/device_round.sh MODE",
#       carry=[".device"], kind="nvidia-h200")      (MODE: auto, bars, checks, grids, paired, standing;
#                                                    paired and standing also carry ".flashmla")
#
# bars (default on an H200: the issues' bars are H200 numbers): the quick perf grid with its eager
# column (written as perf JSON to $OUT), scripts/host_timing.py eager (issue 11's host path), and 2wg
# (its narrow kernel at <= 32 rows) against the 64-row form on five narrow rows.
# checks (default elsewhere): every GPU test (scripts/gpu_tests_sharded.py), then memcheck and synccheck
# on a split decode per pipeline and of the narrow kernel (16 and 32 wide).
# grids (issue 8's H200 standing; stops at once on any other card): the grid's page-64 entries precompiled,
# then two full page-64 grids (perf JSON to $OUT, named <device>_<date>_<COMMIT>_p64[-rerun].json, for
# perf_table/results/). paired (H200 only too): FlashMLA built from .flashmla/src.tar.xz (carry ".flashmla";
# scripts/flashmla_build.py) and timed beside auto over the page-64 grid (scripts/flashmla_pair.py). standing: grids,
# then paired, in one call (a page-64 grid takes well under a minute once precompiled; each step keeps its limit).
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
# The caller passes COMMIT (the sha of the checkout sent): the device copy's .git can be stale (it said
# 253e8ca for a tree at a7b43ce in the sixteenth session), so git there is not asked.
commit=${COMMIT:-unknown}
fail=0
pt="python -m pytest -m gpu -q -p no:cacheprovider"
if [ "$mode" = grids ] || [ "$mode" = paired ] || [ "$mode" = standing ]; then
  case "$gpu" in *H200*) ;; *) echo "not an H200: $mode stops here"; exit 3 ;; esac
  export MLA_CACHE_DIR=${MLA_CACHE_DIR:-$PWD/.mla_cache}
  stem="$out/nvidia-h200_$(date -u +%F)_${commit}"
  step precomp 240 python -m mla.precompile --heads-q 128 64 32 16 --seqlen-q 1 2 --page-size 64 --causal both \
    --jobs 14 || fail=1
fi
if [ "$mode" = grids ] || [ "$mode" = standing ]; then
  step grid1 240 python -m perf_table run --page-size 64 --no-eager --out "${stem}_p64.json" --commit "$commit" || fail=1
  step grid2 240 python -m perf_table run --page-size 64 --no-eager --out "${stem}_p64-rerun.json" --commit "$commit" \
    || fail=1
fi
if [ "$mode" = paired ] || [ "$mode" = standing ]; then
  step fmbuild 240 python scripts/flashmla_build.py --src .flashmla/src.tar.xz --build-dir .flashmla_build || fail=1
  PYTHONPATH=.flashmla_build:${PYTHONPATH:-} step pair 300 python scripts/flashmla_pair.py --grid --variant auto \
    --replays 100 --json "${stem}_flashmla-9241ae3.json" --commit "$commit" || fail=1
  tail -3 "$out/pair.log"
elif [ "$mode" = grids ]; then
  :  # its grids ran above (not the checks below)
elif [ "$mode" = bars ]; then
  step perf 330 python -m perf_table run --quick --out "$out" --commit "$commit" || fail=1
  step eager 200 python scripts/host_timing.py eager --rounds 3 || fail=1
  grep -E "us per call|GPU time" "$out/eager.log" || true
  # 2wg's narrow kernel against its 64-row form on the narrow rows (H100 numbers in docs/perf-notes.md).
  step narrow 150 python scripts/entry_ab.py --mode 2wg --mode 2wg-wide --config 64,1,1,16,1024 \
    --config 64,1,1,16,16384 --config 64,8,1,16,4096 --config 64,1,1,32,16384 --config 64,1,2,16,16384 \
    --replays 300 || fail=1
  grep -E "pass" "$out/narrow.log" | grep -v -i warn || true
else
  # Every GPU test (about 450: 5 minutes in 14 pytest processes on an H100), then memcheck and synccheck
  # on a split decode of each registered pipeline and of the narrow kernel.
  OUT=$out/tests python scripts/gpu_tests_sharded.py tests/ --shards 14 --timeout 400 || fail=1
  for tool in memcheck synccheck; do
    step "$tool" 60 compute-sanitizer --tool "$tool" --error-exitcode 1 $pt tests/test_kernel_gpu.py \
      tests/test_narrow_gpu.py -k "b1-sq1-h128-full-bfloat16-max16384 or b1-sq1-h16-hkv1-full-p64-bfloat16-max16384 or b1-sq1-h32-hkv1-full-p64" \
      || fail=1
  done
fi
exit $fail
