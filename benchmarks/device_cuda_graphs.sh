#!/usr/bin/env bash
# One device call: CUDA graphs of the compiled blocks and sampler step (trainer.compile_mode=reduce-overhead).
# First the CUDA test (bitwise against the default mode over three training steps and a sampling run), then the
# training step of both modes side by side in one bench step process (arms interleaved). Carry .whl and .device.
#   MINI_OF3_COMMIT=<hash> bash benchmarks/device_cuda_graphs.sh TAG [CROPS] [ARMS] [key=value ...]
# Writes $OUT/step_<TAG>.json/.png and runs/compile_mode: "reduce-overhead" when the test passed and the graphs'
# arm took under 0.85x the default arm's step at the first crop with the same first loss, else "default"
# (benchmarks/device_train49.sh reads it on a machine kept warm).
set -u
tag=$1; crops=${2:-384}; arms=${3:-mini_of3+mini_of3,mini_of3+mini_of3:reduce-overhead}; shift 3 || shift $#
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source benchmarks/device_env.sh
mkdir -p runs; echo default > runs/compile_mode
timeout 240 python3 -m pytest -q -x tests/model/test_compiled.py -k cuda_graph -p no:cacheprovider 2>&1 | tail -15
test_rc=${PIPESTATUS[0]}
echo "cuda_graph test rc=$test_rc"
timeout ${MINI_OF3_STEP_LIMIT:-270} python3 -m mini_of3.bench step configs/crop768.yaml --data .device/data/cache \
  --crops "$crops" --arms "$arms" --rounds 3 --warmup 3 --profile-crops "${crops%%,*}" --out "$OUT" --tag "$tag" \
  "$@" 2>&1 | grep -v 'Warning\|warn' | tail -30
python3 - "$OUT/step_$tag.json" "$test_rc" <<'PY'
import json, sys
rows, test_rc = json.load(open(sys.argv[1]))["rows"], int(sys.argv[2])
first = rows[0]["N"]
at = {r["impl"]: r for r in rows if r["N"] == first and "step_s" in r}
base = next((r for name, r in at.items() if not name.endswith(":reduce-overhead")), None)
graphs = next((r for name, r in at.items() if name.endswith(":reduce-overhead")), None)
choice = "default"
if test_rc == 0 and base and graphs:
    ratio = graphs["step_s"] / base["step_s"]
    same = abs(graphs["loss0"] - base["loss0"]) <= 1e-3 * abs(base["loss0"])
    print(f"reduce-overhead / default at {first}: {ratio:.3f}, loss0 {graphs['loss0']:.5f} / {base['loss0']:.5f}")
    choice = "reduce-overhead" if ratio < 0.85 and same else "default"
open("runs/compile_mode", "w").write(choice + "\n")
print("runs/compile_mode:", choice)
PY
