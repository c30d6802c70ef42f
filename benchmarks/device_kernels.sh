#!/usr/bin/env bash
# One device call for the triangle-attention kernel (issue 3): the GPU tests, where the time goes, and the bench.
#   MINI_OF3_COMMIT=<short hash> bash benchmarks/device_kernels.sh [TAG] [NS] [DS]
# Carry .whl (the anchors from ../shared/tools/anchor_wheels.sh). Writes $OUT/kernels_<TAG>.json/.png and
# $OUT/explore.log; prints the tables last. MINI_OF3_COMMIT must be given: the device checkout reports a stale HEAD.
set -u
tag=${1:-dev}; ns=${2:-256,384,512,640,768}; ds=${3:-32}
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source benchmarks/device_env.sh
MINI_OF3_AUTOTUNE=0 timeout 120 python3 -m pytest tests/kernels -q -x \
  -p no:cacheprovider 2>&1 | tail -3
timeout 180 python3 benchmarks/explore_tri_attn.py > "$OUT/explore.log" 2>&1
timeout 300 python3 -m mini_of3.bench kernels --ns "$ns" --ds "$ds" \
  --impls mini_of3,mini_of3_bf16bias,mini_of3_fused,trifast,cueq,of3_triton --check-ns 256,768 \
  --out "$OUT" --tag "$tag" 2>&1 | grep -v '^{' | tail -80
tail -12 "$OUT/explore.log"
