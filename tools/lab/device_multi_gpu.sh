#!/usr/bin/env bash
# Issue 6 on a machine with two GPUs (device kind nvidia-h200-x2): DDP and FSDP through accelerate, each run beside
# its single-GPU reference with the same global batch, then one summary (python -m mini_of3.bench runs).
#   bash tools/lab/device_multi_gpu.sh ddp384|ddp768|fsdp768 [STEPS]
# Carry .device (prepared entries in .device/data/cache, gemmi and biopython wheels in .device/whl), as
# tools/lab/device_train.sh. Results go to $OUT/<part>/{gpu1,gpu2}/ and $OUT/multi_gpu_<part>.json + .png.
#   ddp384, ddp768: configs/crop384.yaml / crop768.yaml; 1 GPU x grad_accum 2 against 2 GPUs x grad_accum 1 (global
#                   batch 2 in both), STEPS steps (default 50): samples per second and the loss curves.
#   fsdp768:        configs/of3_trunk.yaml at crop 768 for STEPS steps (default 4): FSDP2 on 2 GPUs against DDP on 2
#                   GPUs (per-GPU peak memory; DDP may run out of memory, which is then the finding).
set -u
part=${1:?usage: device_multi_gpu.sh ddp384|ddp768|fsdp768 [STEPS]}
source tools/lab/device_env.sh
out=$OUT/$part
mkdir -p "$out"
common=(wandb=false data.root=.device/data/cache data.cache_dir=.device/data/cache 'data.val_ids=[1AKI]'
        trainer.val_samples=1 model.sampling_steps=10 trainer.val_every=100000 trainer.checkpoint_every=100000
        optim.warmup_steps=10 data.num_workers=4)

run() {   # run NAME TIMEOUT ACCELERATE_ARGS... -- TRAIN_ARGS...
  local name=$1 limit=$2; shift 2
  local accel=()
  while [ "$1" != "--" ]; do accel+=("$1"); shift; done; shift
  # shellcheck disable=SC2086  # EXTRA_ARGS: more key=value overrides, word-split (a CPU smoke test uses it)
  timeout -k 15 "$limit" accelerate launch "${accel[@]}" train.py "$@" "${common[@]}" ${EXTRA_ARGS:-} \
    trainer.out_dir="/tmp/$part/$name" > "$out/$name.log" 2>&1
  echo "$name: exit $?"
  mkdir -p "$out/$name"; cp "/tmp/$part/$name/log.jsonl" "/tmp/$part/$name/config.yaml" "$out/$name/" 2>/dev/null
}

single=(--num_processes 1 --num_machines 1 --mixed_precision bf16 --dynamo_backend no)
ddp=(--multi_gpu --num_processes 2 --num_machines 1 --mixed_precision bf16 --dynamo_backend no)
fsdp=(--config_file configs/accelerate/fsdp.yaml --num_processes 2)
case $part in
  ddp384|ddp768)
    steps=${2:-50}; config=configs/crop${part#ddp}.yaml
    run gpu1 280 "${single[@]}" -- "$config" trainer.max_steps="$steps" trainer.grad_accum=2
    run gpu2 280 "${ddp[@]}" -- "$config" trainer.max_steps="$steps" trainer.grad_accum=1
    python3 -m mini_of3.bench runs "$out/gpu1" "$out/gpu2" --names "1 GPU x accum 2,2 GPUs DDP" \
      --command "bash tools/lab/device_multi_gpu.sh $*" --out "$OUT/multi_gpu_$part.json" --plot "$OUT/multi_gpu_$part.png" ;;
  fsdp768)
    steps=${2:-4}
    run fsdp2 280 "${fsdp[@]}" -- configs/of3_trunk.yaml data.crop_size=768 trainer.max_steps="$steps" model.n_recycles=1
    run ddp2 280 "${ddp[@]}" -- configs/of3_trunk.yaml data.crop_size=768 trainer.max_steps="$steps" model.n_recycles=1
    python3 -m mini_of3.bench runs "$out/ddp2" "$out/fsdp2" --names "2 GPUs DDP,2 GPUs FSDP2" \
      --command "bash tools/lab/device_multi_gpu.sh $*" --out "$OUT/multi_gpu_$part.json" --plot "$OUT/multi_gpu_$part.png" ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
