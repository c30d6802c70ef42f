#!/usr/bin/env bash
# Issue 39: does NVIDIA's multi-process service (MPS) raise what ablation arms sharing one GPU train per second?
# Five training processes of configs/ablation.yaml (crops 256, 384, 512, 768, 768; seeds 0-4), EACH seconds, first
# in time slices (the default), then under MPS; prints per process and summed steps per second (each process: the
# mean step time after its first 5 steps). One phase alone as well when ALONE=1 (crop 256).
#   run: source tools/lab/device_env.sh && EACH=75 bash tools/lab/ablation_mps_probe.sh
set -u
each=${EACH:-75}
root=/tmp/mps_probe
export OMP_NUM_THREADS=3
phase() {
  local name=$1; shift
  local i=0 pids=""
  for crop in "$@"; do
    timeout -s TERM -k 20 $each python3 train.py configs/ablation.yaml seed=$i data.crop_size=$crop \
      data.root=.device/data/cache data.cache_dir=.device/data/cache trainer.out_dir=$root/$name/p$i \
      trainer.max_steps=100000 trainer.val_every=1000000000 trainer.checkpoint_every=1000000000 wandb=false \
      > $root/$name.p$i.log 2>&1 &
    pids="$pids $!"; i=$((i + 1))
  done
  wait $pids
  python3 tools/lab/ablation_rates.py $name $root/$name/p*
}
mkdir -p $root
[ "${ALONE:-0}" = 1 ] && phase alone 256
phase slices 256 384 512 768 768
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
if nvidia-cuda-mps-control -d; then
  phase mps 256 384 512 768 768
  echo quit | nvidia-cuda-mps-control
else
  echo "MPS could not start"
fi
