#!/usr/bin/env bash
# One device call for the triangle-attention kernel: the GPU tests, where the time goes, and the bench.
#   MINI_OF3_COMMIT=<short hash> bash tools/lab/device_kernels.sh [TAG] [NS] [DS] [STEPS]
# STEPS: any of tests, explore, host, memory, accuracy, bench, ncu, run in that order (default tests,explore,bench). A
# call has 10 minutes; the bench of both head dims with the anchors' autotuning takes ~6 of them (its limit:
# MINI_OF3_BENCH_LIMIT seconds, default 400); ncu gets what is left. MINI_OF3_IMPLS: the bench's implementations
# (default: ours, its bf16-bias variant, and the three anchors); MINI_OF3_TESTS_K: a pytest -k
# subset of the tests; MINI_OF3_EXPLORE_DS: the head dims of the explore step (default 32), MINI_OF3_EXPLORE_ONLY
# its variants (comma-separated names; default all). Carry .whl (the anchors from ../shared/tools/anchor_wheels.sh).
# Writes $OUT/kernels_<TAG>.json/.png, $OUT/explore.log, $OUT/host.log
# (host_time_gpu.py), $OUT/memory.log (peak_memory_gpu.py), $OUT/accuracy.log (accuracy_gpu.py) and $OUT/ncu.txt
# (Nsight Compute on the four kernels of one fwd+bwd call at N = 768, D = 32); prints the tables last.
# MINI_OF3_COMMIT must be given: the device checkout reports a stale HEAD.
set -u
tag=${1:-dev}; ns=${2:-256,384,512,640,768}; ds=${3:-32}; steps=${4:-tests,explore,bench}
impls=${MINI_OF3_IMPLS:-mini_of3,mini_of3_bf16bias,trifast,cueq,of3_triton}
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source tools/lab/device_env.sh
if [[ $steps == *tests* ]]; then
  MINI_OF3_AUTOTUNE=0 timeout 160 python3 -m pytest tests/kernels -q --tb=short -p no:cacheprovider \
    ${MINI_OF3_TESTS_K:+-k "$MINI_OF3_TESTS_K"} 2>&1 | tail -30
fi
if [[ $steps == *explore* ]]; then
  for d in ${MINI_OF3_EXPLORE_DS:-32}; do   # head dims, space-separated, for the explore step
    timeout 200 python3 tools/lab/explore_tri_attn.py --d "$d" --only "${MINI_OF3_EXPLORE_ONLY:-}" \
      >> "$OUT/explore.log" 2>&1
  done
fi
if [[ $steps == *host* ]]; then
  timeout 120 python3 tools/lab/host_time_gpu.py > "$OUT/host.log" 2>&1
fi
if [[ $steps == *memory* ]]; then
  for shape in "768 32" "256 16"; do
    set -- $shape
    timeout 100 python3 tools/lab/peak_memory_gpu.py --n $1 --d $2 >> "$OUT/memory.log" 2>&1
  done
fi
if [[ $steps == *accuracy* ]]; then
  timeout 150 python3 tools/lab/accuracy_gpu.py > "$OUT/accuracy.log" 2>&1
fi
if [[ $steps == *bench* ]]; then
  timeout ${MINI_OF3_BENCH_LIMIT:-400} python3 -m mini_of3.bench kernels --ns "$ns" --ds "$ds" --impls "$impls" \
    --check-ns 256,768 \
    --out "$OUT" --tag "$tag" 2>&1 | grep -v '^{' | grep -v 'Warning\|return super\|warn' | tail -80
fi
if [[ $steps == *ncu* ]]; then   # the second call's launches (the first compiles); clocks left alone (METHOD.md)
  limit=$(( 590 - SECONDS < 240 ? 590 - SECONDS : 240 ))   # what is left of the call's 10 minutes
  timeout $limit ncu --clock-control none -k 'regex:_fwd|_bwd_dq|_bwd_dkdv|_bwd_dbias' --launch-skip 4 \
    --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 tools/lab/explore_tri_attn.py --ncu --d 32 > "$OUT/ncu.txt" 2>&1
  grep -E '^  _|Duration|Registers Per|Achieved Occ|Theoretical Occ|Compute \(SM\) Th|L2 Cache Th|L1/TEX Cache Th' \
    "$OUT/ncu.txt" | head -40
fi
if [[ $steps == *host* ]]; then tail -6 "$OUT/host.log"; fi
if [[ $steps == *accuracy* ]]; then tail -12 "$OUT/accuracy.log"; fi
if [[ $steps == *memory* ]]; then grep -E "peak|^skipped" "$OUT/memory.log"; fi
if [[ $steps == *explore* ]]; then grep -A20 "^N=" "$OUT/explore.log"; fi
