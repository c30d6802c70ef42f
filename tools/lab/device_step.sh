#!/usr/bin/env bash
# One device call for issue 14: the kernel in the model's layouts beside every anchor, then the training step with
# the backends swapped. Carry .whl (../shared/tools/anchor_wheels.sh) and .device (prepared entries:
# python -m mini_of3.data.prepare ../shared/data/mmcif .device/data/cache).
#   MINI_OF3_COMMIT=<hash> bash tools/lab/device_step.sh TAG [STEPS] [CROPS] [ARMS] [KERNEL_NS]
# STEPS: any of kernels, step, block (default kernels,step); MINI_OF3_STEP_ARGS: more options of bench step; MINI_OF3_BLOCK_IMPLS: block's impls. Writes $OUT/kernels_layouts_<TAG>.json/.png, $OUT/step_<TAG>.json/.png.
set -u
tag=${1:-dev}; steps=${2:-kernels,step}; crops=${3:-256,384,512,640,768}
arms=${4:-mini_of3+mini_of3,mini_of3+cueq,cueq+cueq,trifast+cueq,of3_triton+cueq,cueq+mini_of3}; kns=${5:-768}
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source tools/lab/device_env.sh
if [[ $steps == *kernels* ]]; then
  # each implementation not named in MINI_OF3_TRUSTED is probed in a process of its own first: one that faults
  # would end the bench
  impls=${MINI_OF3_TRUSTED:-}
  for impl in ${MINI_OF3_PROBE:-mini_of3 mini_of3_bf16bias trifast cueq of3_triton}; do
    out=$(timeout 90 python3 tools/lab/probe_layouts.py $impl --n "${kns##*,}" 2>&1) && impls="$impls,$impl"
    echo "$out" | grep -E "^probe|Error" | tail -3
  done
  timeout ${MINI_OF3_KERNELS_LIMIT:-240} python3 -m mini_of3.bench kernels --layouts "${MINI_OF3_LAYOUTS:-start,end,contiguous}" \
    --ns "$kns" --ds 32 --impls "${impls#,}" --check-ns "$kns" \
    --out "$OUT" --tag "layouts_$tag" 2>&1 | grep -v '^{' | grep -v 'Warning\|return super\|warn' | tail -40
fi
if [[ $steps == *step* ]]; then
  timeout ${MINI_OF3_STEP_LIMIT:-330} python3 -m mini_of3.bench step configs/crop768.yaml --data .device/data/cache \
    --crops "$crops" --arms "$arms" --out "$OUT" --tag "$tag" ${MINI_OF3_STEP_ARGS:-} 2>&1 | grep -v 'Warning\|warn' | tail -40
  python3 - "$OUT/step_$tag.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
for r in rows:
    if "breakdown_ms" in r and r["N"] == max(x["N"] for x in rows):
        print(r["impl"], {k: round(v) for k, v in r["breakdown_ms"].items()})
        print("   top:", [(n[:40], round(ms, 1), c) for n, ms, c in r["top_kernels"][:6]])
PY
fi
if [[ $steps == *block* ]]; then
  timeout ${MINI_OF3_BLOCK_LIMIT:-300} python3 -m mini_of3.bench block configs/crop384.yaml --ns "$crops" \
    --impls "${MINI_OF3_BLOCK_IMPLS:-torch,mini_of3,cueq,torch_compile}" --out "$OUT" --tag "$tag" 2>&1 \
    | grep -v 'Warning\|warn' | tail -45
fi
