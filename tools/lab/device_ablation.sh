# One device call of the crop ablation (issue 39): the ARMS of each of SEEDS at once, one process per arm and seed
# and one per seed for its baselines (until scored),
# sharing the GPU (a step of the ablation model alone leaves an H100 75 % idle), resuming the ablation folder carried
# in .device/ablation (the arm.json and log of every finished arm). The first call times every kind of step alone
# first (--calibrate: step_costs.json, the equal-time clock), so any arms may share any call; a call must finish
# the arms it starts (checkpoints do not come back). Each process's log goes into .device/ablation/logs. Returns
# the folder, checkpoints left out, as $OUT/ablation_arms.tgz: unpack it into .device/ablation for the next call.
# Once every arm of every seed has finished, `python -m mini_of3.ablate crops` with the same arguments and no --only
# (any machine) writes the result.
#   run: source tools/lab/device_env.sh && SEEDS=0 ARMS="crop256 crop768" STEPS=2000 LIMIT=570 \
#        bash tools/lab/device_ablation.sh
# Triton's compile and autotune cache travels: .device/triton_cache/triton_cache.part-* (carried) is unpacked into
# the call's TRITON_CACHE_DIR, and a call that did not carry one returns its cache as $OUT/triton_cache.part-*
# (15 MiB each; copy them into .device/triton_cache/): on a fresh machine the first process otherwise spends
# minutes compiling.
# RUNS="0:finetune384to768 1:crop256" names seed:arm pairs instead of SEEDS x ARMS (RUNS="1:baselines": only
# those). LIMIT: seconds from the start of this script to the end of every python process (the calibration's
# included; 570 by default, 540 where the Triton cache is returned, so that the 600-s call holds the tars).
# MPS=1: through NVIDIA's multi-process service; where it cannot start, RUNS_WITHOUT_MPS or SEEDS x
# ARMS_WITHOUT_MPS train instead.
FOLDER=.device/ablation/${NAME:-crops}
LOGS=.device/ablation/logs
ARMS=${ARMS:-crop256 crop384 crop512 crop768 finetune384to768}
SEEDS=${SEEDS:-0}
runs() { for seed in $SEEDS; do for arm in $1; do echo -n "$seed:$arm "; done; done; }
RUNS=${RUNS:-$(runs "$ARMS")}
mkdir -p $FOLDER $LOGS
export TRITON_CACHE_DIR=/tmp/triton_cache
# arms finish training together and each reserves up to ~19 GiB scoring the largest entry (3WIP, 2,290 tokens) beside
# trainers of up to 14 GiB (crop 768): SCORING_SLOTS score at once (3 ran out of memory beside crop-768 trainers;
# one at a time costs ~0.2 min per arm of waiting)
export MINI_OF3_SCORING_SLOTS=${SCORING_SLOTS:-1}
mkdir -p $TRITON_CACHE_DIR
carried_cache=0
if ls .device/triton_cache/triton_cache.part-* >/dev/null 2>&1; then
  cat .device/triton_cache/triton_cache.part-* | tar xzf - -C $TRITON_CACHE_DIR && carried_cache=1
  echo "Triton cache carried: $(du -sh $TRITON_CACHE_DIR | cut -f1)"
fi
if [ "${MPS:-0}" = 1 ]; then                # kernels of the processes run concurrently instead of in time slices
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d; then echo "MPS on"; else
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    [ -n "${ARMS_WITHOUT_MPS:-}" ] && RUNS=$(runs "$ARMS_WITHOUT_MPS")
    RUNS=${RUNS_WITHOUT_MPS:-$RUNS}
    echo "MPS could not start: time slices, runs $RUNS"
  fi
fi
SEEDS=$(for run in $RUNS; do echo ${run%%:*}; done | sort -un | tr '\n' ' ')
ALL=$( (for seed in $SEEDS; do echo $seed:baselines; done; for run in $RUNS; do echo $run; done) | awk '!seen[$0]++')
n=$(echo $ALL | wc -w)
export OMP_NUM_THREADS=$(( 15 / n > 0 ? 15 / n : 1 ))   # a process per run on 16 cores: no oversubscribed CPU ops
left() { echo $(( ${LIMIT:-570} - SECONDS > 1 ? ${LIMIT:-570} - SECONDS : 1 )); }   # seconds to the call's end
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 > $OUT/gpu_util.csv \
  2>/dev/null &
monitor=$!
python3 -c "import time; t = time.time(); import torch, triton, mini_of3.trainer, mini_of3.ablate; \
print(f'imports {time.time() - t:.1f} s')"     # a fresh machine's first imports (no .pyc yet), timed alone
if [ ! -f $FOLDER/step_costs.json ]; then   # every kind of step timed alone first: the equal-time clock
  timeout -s TERM -k 20 $(left) python3 -m mini_of3.ablate crops configs/ablation.yaml --seeds ${SEEDS%% *} \
    --steps ${STEPS:-2000} --calibrate data.root=.device/data/cache data.cache_dir=.device/data/cache \
    trainer.out_dir=$FOLDER > $LOGS/calibration.log 2>&1
  grep "^ablate: calibration" $LOGS/calibration.log
  echo "calibrated at ${SECONDS} s"
fi
pids=""
for run in $ALL; do
    seed=${run%%:*} arm=${run#*:}
    [ $arm = baselines ] && [ -f $FOLDER/seed$seed/baselines.json ] && continue
    timeout -s TERM -k 20 $(left) python3 -m mini_of3.ablate crops configs/ablation.yaml --seeds $seed \
      --only $arm --steps ${STEPS:-2000} data.root=.device/data/cache data.cache_dir=.device/data/cache \
      trainer.out_dir=$FOLDER > $LOGS/seed${seed}_$arm.log 2>&1 &
    pids="$pids $!"
done
wait $pids
echo "runs ended at ${SECONDS} s"
kill $monitor 2>/dev/null
[ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && echo quit | nvidia-cuda-mps-control
tar czf $OUT/ablation_arms.tgz --exclude=checkpoints -C .device/ablation .
if [ $carried_cache = 0 ]; then
  # a cached kernel needs its metadata (.json) and binary (.cubin), at the absolute paths its group file names
  # (hence the one TRITON_CACHE_DIR); the intermediate IR is left behind (the group skips missing files)
  tar czf - -C $TRITON_CACHE_DIR --exclude='*.llir' --exclude='*.ttir' --exclude='*.ttgir' --exclude='*.ptx' \
    --exclude='*.source' --exclude='*.amdgcn' --exclude='*.hsaco' . | split -b 15m - $OUT/triton_cache.part-
  echo "Triton cache returned: $(du -sh $TRITON_CACHE_DIR | cut -f1) in $(ls $OUT/triton_cache.part-* | wc -l) parts"
fi
for run in $ALL; do
  seed=${run%%:*} arm=${run#*:}
  [ -f $LOGS/seed${seed}_$arm.log ] || continue
  echo "== seed $seed $arm"; tr '\r' '\n' < $LOGS/seed${seed}_$arm.log | grep "^ablate:\|Error\|step/s" | tail -3
done
python3 - <<'PY'
import json, os, pathlib
for p in sorted(pathlib.Path(".device/ablation").glob("*/seed*/*/arm.json")):
    s = json.loads(p.read_text())["summary"]
    print(f"{p.parent.parent.name:6s} {s['arm']:18s} steps {s['step']:5d} step {s['step_s']:.3f} s  "
          f"gpu {s['gpu_minutes']:.1f} min  wall {s.get('wall_minutes', 0):.1f} min  "
          f"score {s.get('score_minutes', 0):.1f} min ({s.get('score_peak_mib') or 0:.0f} MiB)  "
          f"peak {s['peak_mib'] or 0:.0f} MiB "
          f"{s.get('device', '')}")
util = [float(l.split(",")[1].strip(" %")) for l in open(pathlib.Path(os.environ["OUT"]) / "gpu_util.csv")
        if l.count(",") >= 2]
print(f"GPU utilisation: mean {sum(util) / max(len(util), 1):.0f} % over {len(util)} samples")
PY
