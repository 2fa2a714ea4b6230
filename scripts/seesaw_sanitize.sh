# Sourced on the GPU machine after scripts/device_step.sh (``out`` set): compute-sanitizer memcheck and
# synccheck on the seesaw pipeline's kernel (scripts/one_decode.py), over the shapes its schedule
# branches on: 256 rows causal with tail tiles and an odd tile count, a split request, 16 rows, the
# cp.async (page 1) and warp-per-box (page 16) loaders, and 128-token pages (a tile from either half of a page).
for tool in memcheck synccheck; do
  step "$tool-h128" 240 compute-sanitizer --tool $tool --error-exitcode 1 python scripts/one_decode.py --pipeline seesaw \
    --b 4 --s-q 2 --h-q 128 --causal --seqlen 700 --seqlen 65 --seqlen 1 --seqlen 300
  step "$tool-split" 240 compute-sanitizer --tool $tool --error-exitcode 1 python scripts/one_decode.py --pipeline seesaw \
    --b 1 --s-q 1 --h-q 128 --seqlen 9000
  step "$tool-h16-p16" 240 compute-sanitizer --tool $tool --error-exitcode 1 python scripts/one_decode.py --pipeline seesaw \
    --b 3 --s-q 1 --h-q 16 --page 16 --seqlen 1000 --seqlen 129 --seqlen 64
  step "$tool-p1" 240 compute-sanitizer --tool $tool --error-exitcode 1 python scripts/one_decode.py --pipeline seesaw \
    --b 2 --s-q 1 --h-q 64 --page 1 --seqlen 450 --seqlen 200
  step "$tool-p128" 240 compute-sanitizer --tool $tool --error-exitcode 1 python scripts/one_decode.py --pipeline seesaw \
    --b 3 --s-q 2 --h-q 64 --page 128 --causal --seqlen 500 --seqlen 190 --seqlen 64
done
