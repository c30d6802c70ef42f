#!/usr/bin/env bash
# One device call for issue 41 (sigmoid attention): the GPU tests, the benchmark against TritonSigmoid and softmax
# SDPA, or the tile sweep; each fits one call (600 s) when split as below.
#   MINI_OF3_COMMIT=<hash> bash tools/lab/device_sigmoid.sh STEP [SHAPES] [TAG]
# STEP: tests (tests/kernels/test_sigmoid_attention_gpu.py, then the CPU file's cases on CUDA), bench or sweep
# (python -m mini_of3.bench sigmoid [--sweep] --shapes SHAPES). TritonSigmoid's first call per shape autotunes ~48
# configurations (~1-2 min), so the bench takes two dense shapes, or the varlen batch, per call:
#   bench b4t4096d64,b1t16384d64 d64;  bench b4t4096d128,b1t16384d128 d128;  bench varlen16d128 varlen
#   sweep b4t4096d64 d64;  sweep b4t4096d128 d128
# Carry .whl (../shared/tools/anchor_wheels.sh) for the triton_sigmoid rows; without it they say why they are missing.
# Writes $OUT/sigmoid[_sweep]_<TAG>.json (.png) and $OUT/<STEP>.log; prints the table (or the best tiles) last.
set -u
step=${1:-tests}; shapes=${2:-}; tag=${3:-dev}
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source tools/lab/device_env.sh
limit=$(( ${MINI_OF3_TOTAL_LIMIT:-570} - SECONDS ))
case $step in
  tests)
    timeout $limit python3 -m pytest -q --tb=short -p no:cacheprovider -rs tests/kernels/test_sigmoid_attention_gpu.py \
      tests/kernels/test_sigmoid_attention.py > "$OUT/tests.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -30 ;;
  bench)
    timeout $limit python3 -m mini_of3.bench sigmoid ${shapes:+--shapes "$shapes"} --out "$OUT" --tag "$tag" \
      > "$OUT/bench.log" 2>&1
    grep -v -i 'warn' "$OUT/bench.log" | tail -30 ;;
  sweep)
    timeout $limit python3 -m mini_of3.bench sigmoid --sweep ${shapes:+--shapes "$shapes"} --reps 10 --out "$OUT" \
      --tag "$tag" > "$OUT/sweep.log" 2>&1
    grep -v -i 'warn' "$OUT/sweep.log" | tail -45 ;;
  *) echo "STEP must be tests, bench or sweep, got $step"; exit 2 ;;
esac
echo "($SECONDS s in all)"
