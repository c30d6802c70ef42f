#!/usr/bin/env bash
# One device call for issue 16: the tests of the triangle multiplication and the transition on CUDA, the triangle
# multiplication alone beside the compiled and cuEquivariance versions, and the Pairformer block at N = 768 as the
# trainer runs it (compiled) and eager.
#   MINI_OF3_COMMIT=<hash> bash tools/lab/device_tri_mul.sh [TAG] [NS] [STEPS]
# STEPS: any of tests, bench, block, ncu (default the first three; ncu: Nsight Compute on the four Triton kernels of
# the second outgoing fwd+bwd at the largest N, with the warp stall reasons, into $OUT/ncu_tri_mul.txt). Carry .whl (the anchors, ../shared/tools/anchor_wheels.sh)
# for the cueq rows; without it they are reported as skipped. Limits (seconds, the call has 600): tests 150
# (MINI_OF3_TESTS_LIMIT), bench 300 (MINI_OF3_BENCH_LIMIT), block what is left up to 540 in all (MINI_OF3_TOTAL_LIMIT).
# Writes $OUT/trimul_<TAG>.json/.png (python -m mini_of3.bench trimul), $OUT/block_trimul_<TAG>.json/.png and the
# logs $OUT/tests.log, $OUT/bench.log, $OUT/block.log; prints the tables last.
# MINI_OF3_COMMIT must be given: the device checkout reports a stale HEAD.
set -u
tag=${1:-dev}; ns=${2:-256,384,512,640,768}; steps=${3:-tests,bench,block}
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source tools/lab/device_env.sh
if [[ $steps == *tests* ]]; then   # the kernel tests at the GPU sizes (N = 97, 256) and the model-level ones
  MINI_OF3_AUTOTUNE=0 timeout ${MINI_OF3_TESTS_LIMIT:-150} python3 -m pytest -q --tb=short -p no:cacheprovider \
    tests/kernels/test_triangle_multiplication.py tests/kernels/test_transition.py tests/model/test_backends.py \
    -k "tri_mul or multiplication or transition" > "$OUT/tests.log" 2>&1
fi
if [[ $steps == *bench* ]]; then
  timeout ${MINI_OF3_BENCH_LIMIT:-300} python3 -m mini_of3.bench trimul --ns "$ns" \
    --impls "${MINI_OF3_IMPLS:-torch_compile,cueq,mini_of3}" --check-ns 768 --out "$OUT" --tag "$tag" \
    > "$OUT/bench.log" 2>&1
fi
if [[ $steps == *block* ]]; then
  left=$(( ${MINI_OF3_TOTAL_LIMIT:-540} - SECONDS )); if (( left > 20 )); then
    timeout $left python3 -m mini_of3.bench block configs/crop384.yaml --ns 768 \
      --impls "${MINI_OF3_BLOCK_IMPLS:-mini_of3_compile,cueq_compile,mini_of3}" \
      --reps 5 --rounds 2 --out "$OUT" --tag "trimul_$tag" > "$OUT/block.log" 2>&1
  else echo "block: no time left ($SECONDS s used)" > "$OUT/block.log"; fi
fi
if [[ $steps == *ncu* ]]; then   # clocks left alone (METHOD.md); the first call's launches compile
  left=$(( 590 - SECONDS < 240 ? 590 - SECONDS : 240 ))
  timeout $left ncu --clock-control none -k 'regex:_tri_mul_' --launch-skip 4 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    python3 tools/lab/profile_tri_mul.py --ncu --ns "${ns##*,}" > "$OUT/ncu_tri_mul.txt" 2>&1
  grep -E '^  _|Duration|Registers Per|Achieved Occ|Theoretical Occ|Memory Throughput|DRAM Throughput|Stall|Issue Slots|Executed Ipc|Instructions' \
    "$OUT/ncu_tri_mul.txt" | head -60
fi
echo "== tests";  tail -6 "$OUT/tests.log" 2>/dev/null
echo "== block (N = 768)"; grep -v 'Warning\|warn' "$OUT/block.log" 2>/dev/null | grep -E "impl|block|Error|error" | tail -8
echo "== trimul ($SECONDS s in all)"; grep -v 'Warning\|warn' "$OUT/bench.log" 2>/dev/null | tail -48
