#!/usr/bin/env bash
# Issue 17's GPU runs as consecutive calls of this one command on a machine kept warm (its state lives in the
# git-ignored runs/, which a warm machine keeps between calls); each phase is skipped once done:
#   1. CUDA graphs or not: trainer.compile_mode=reduce-overhead where the CUDA-graph test (bitwise against the
#      default mode) passes, written to runs/compile_mode, once.
#   2. the 49-entry run (tools/lab/device_train49.sh, MINUTES of training steps), resumed until they are spent.
#   3. with the time left, the crop ablation (256, 384, 512, 768) and then the activation one at 384 (softmax,
#      sigmoid), ABLATE_MINUTES of training steps per arm; an arm cut by the call's end resumes in the next call.
#      Crops are padded to the arm's crop (data.pad_to_crop): one input shape per arm, so each arm compiles and
#      autotunes once (unpadded, the first arm met every entry's length first and spent 22 steps' budget on it).
# PHASES names the phases to run (default graphs,train49,ablate). Everything under $OUT is packed into one
# learn_<TAG>.tgz (a call returns at most 8 files). Carry .device.
#   MINI_OF3_COMMIT=<hash> [PHASES=...] [MINUTES=9] [VAL_EVERY=500] [ABLATE_MINUTES=1] \
#     bash tools/lab/device_learn.sh TAG END_S
# END_S: the second of the call by which the script must be done (leave ~20 s of the call's limit for the files).
set -u
tag=$1; end_s=$2
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
phases=",${PHASES:-graphs,train49,ablate},"
left() { echo $((end_s - SECONDS)); }
mkdir -p runs

if [[ $phases == *,graphs,* ]] && [ ! -f runs/compile_mode ]; then
  echo "== phase 1: CUDA graphs or not ($(left) s left)"
  source tools/lab/device_env.sh > /dev/null
  timeout 240 python3 -m pytest -q -x tests/model/test_compiled.py -k cuda_graph -p no:cacheprovider 2>&1 | tail -4
  if [ "${PIPESTATUS[0]}" -eq 0 ]; then echo reduce-overhead > runs/compile_mode; else echo default > runs/compile_mode; fi
  echo "compile mode: $(cat runs/compile_mode)"
fi

if [[ $phases == *,train49,* ]] && [ ! -f runs/train49.done ] && [ "$(left)" -gt 120 ]; then
  echo "== phase 2: the 49-entry run, mode $(cat runs/compile_mode 2>/dev/null || echo default) ($(left) s left)"
  VAL_EVERY=${VAL_EVERY:-500} bash tools/lab/device_train49.sh $(($(left) - 45)) > "$OUT/train49_stdout.txt" 2>&1
  tail -8 "$OUT/train49_stdout.txt"
  grep -q "^train rc=0" "$OUT/train49_stdout.txt" && touch runs/train49.done
fi

source tools/lab/device_env.sh > /dev/null
if [[ $phases == *,ablate,* ]] && { [ -f runs/train49.done ] || [[ $phases != *,train49,* ]]; } \
  && [ "$(left)" -gt 100 ]; then
  common="data.root=.device/data/cache data.cache_dir=.device/data/cache wandb=false data.val_ids=[1AKI,3O5R]
    data.sample_weighting=uniform data.min_resolved_fraction=0.5 data.pad_to_crop=true data.num_workers=6
    trainer.val_samples=3"
  echo "== phase 3: crop ablation ($(left) s left)"
  timeout -k 20 $(($(left) - 30)) python3 -m mini_of3.ablate crops configs/crop768.yaml --crops 256,384,512,768 \
    --minutes "${ABLATE_MINUTES:-1}" --out "$OUT" --tag gpu $common > "$OUT/ablate_crops.txt" 2>&1
  grep -E "^ablate:|lDDT|^\| |^(untrained|crop) " "$OUT/ablate_crops.txt" | tail -12
  if [ -f "$OUT/ablation_crops_gpu.json" ] && [ "$(left)" -gt 100 ]; then
    echo "== phase 3b: activation ablation at 384 ($(left) s left)"
    timeout -k 20 $(($(left) - 30)) python3 -m mini_of3.ablate crops configs/crop384.yaml --crops 384 \
      --activation softmax,sigmoid --minutes "${ABLATE_MINUTES:-1}" --out "$OUT" --tag gpu $common \
      > "$OUT/ablate_activation.txt" 2>&1
    grep -E "^ablate:|lDDT|^\| |^(untrained|activation) " "$OUT/ablate_activation.txt" | tail -8
  fi
fi

echo "== the 49-entry run's validations (mean lDDT-Calpha per split)"
python3 - runs/train49/log.jsonl <<'PY'
import json, sys
try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError:
    sys.exit("no log")
train = [r for r in rows if r.get("split") == "train"]
print(f"training steps {train[-1]['step'] if train else 0}, median step "
      f"{sorted(r['step_s'] for r in train)[len(train) // 2] if train else 0:.3f} s")
for r in rows:
    if r.get("split") in ("val", "train_eval"):
        print(f"step {r['step']:5d} {r['split']:10s} lDDT-Ca {r['lddt_ca']:.3f} TM {r.get('tm_score', 0):.3f} "
              f"pLDDT {r.get('mean_plddt', 0):.1f}")
PY
cp runs/train49/log.jsonl "$OUT/train49_log.jsonl" 2>/dev/null
# each ablation arm's log: runs/ablate_crops_gpu/crop256/log.jsonl -> ablate_crops_gpu_crop256_log.jsonl
for log in runs/ablate_*_gpu/*/log.jsonl; do
  [ -f "$log" ] && cp "$log" "$OUT/$(echo "${log#runs/}" | tr / _)"
done
(cd "$OUT" && tar czf "learn_$tag.tgz" --exclude "learn_$tag.tgz" . && find . -type f ! -name "learn_$tag.tgz" -delete \
  && find . -mindepth 1 -type d -empty -delete)
ls -la "$OUT"
