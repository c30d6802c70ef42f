#!/usr/bin/env bash
# A short training run on the GPU machine with our kernel in bf16 (issue 5): accelerate launch train.py with a crop
# config, on entries prepared here (python -m mini_of3.data.prepare ../shared/data/mmcif .device/data/cache) and
# carried in the git-ignored .device/ folder with the gemmi and biopython wheels (.device/whl). Results go to $OUT.
#   bash tools/lab/device_train.sh CONFIG STEPS [key=value ...]
set -u
config=${1:-configs/crop384.yaml}; steps=${2:-200}; shift 2 || true
source tools/lab/device_env.sh
# MINI_OF3_RUN: the run folder; runs/... (git-ignored) stays on a machine kept warm between calls, so the same
# command with trainer.resume=auto resumes a run stopped at TRAIN_TIMEOUT from its SIGTERM checkpoint
run=${MINI_OF3_RUN:-/tmp/run}
limit=${TRAIN_TIMEOUT:-400}; start=$SECONDS
train() {
  # ACCELERATE_ARGS replaces the launcher's options, e.g. "--config_file configs/accelerate/fsdp.yaml --num_processes 1"
  timeout -k 15 "$1" accelerate launch \
    ${ACCELERATE_ARGS:---num_processes 1 --num_machines 1 --mixed_precision bf16 --dynamo_backend no} train.py "$config" wandb=false data.root=.device/data/cache data.cache_dir=.device/data/cache \
    trainer.max_steps="$steps" trainer.out_dir=$run trainer.checkpoint_every=100000 "${@:2}" >> "$OUT/train.log" 2>&1
}
train "$limit" "$@"; rc=$?
echo "train rc=$rc"
# MINI_OF3_FALLBACK: overrides to run again with (resuming) if the run failed for another reason than its time limit
if [ -n "${MINI_OF3_FALLBACK:-}" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $((limit - SECONDS + start)) -gt 60 ]; then
  grep -E "Error|error:" "$OUT/train.log" | tail -3
  echo "== again with $MINI_OF3_FALLBACK" | tee -a "$OUT/train.log"
  train $((limit - SECONDS + start)) "$@" $MINI_OF3_FALLBACK; echo "train rc=$?"
fi
cp $run/log.jsonl $run/config.yaml "$OUT/" 2>/dev/null; cp $run/*.png "$OUT/" 2>/dev/null
python3 -m mini_of3.bench runs "$OUT" --names "$(basename "$config" .yaml)" \
  --command "bash tools/lab/device_train.sh $config $steps $*" --out "$OUT/train_summary.json" --plot "$OUT/run.png"
tail -5 "$OUT/train.log"
# MINI_OF3_SCORE_MAX_TOKENS=384: then score the run's checkpoint on every entry of .device/mmcif (cp
# ../shared/data/mmcif/*.cif.gz there) of at most that many tokens, less MINI_OF3_SCORE_EXCLUDE (the validation ids)
if [ -n "${MINI_OF3_SCORE_MAX_TOKENS:-}" ]; then
  timeout "${SCORE_TIMEOUT:-150}" python3 -m mini_of3.bench score $run --mmcif .device/mmcif \
    --max-tokens "$MINI_OF3_SCORE_MAX_TOKENS" --exclude "${MINI_OF3_SCORE_EXCLUDE:-}" --samples 3 --out "$OUT" \
    --tag "$(basename "$config" .yaml)" > "$OUT/score.log" 2>&1
  tail -4 "$OUT/score.log"
fi
