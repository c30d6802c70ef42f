# One device call of the crop ablation (issue 39): resumes the ablation folder carried in .device/ablation (the
# arm.json and log of every finished arm), trains and scores the arms that fit in the call, and returns the folder
# (checkpoints left out) as $OUT/ablation_arms.tgz; unpack it into .device/ablation for the next call. The last
# call (all arms finished) also writes $OUT/ablation_crops.json and .png.
#   run: source tools/lab/device_env.sh && LIMIT=540 HOURS=0.145 bash tools/lab/device_ablation.sh
FOLDER=.device/ablation/runs
mkdir -p $FOLDER
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 > $OUT/gpu_util.csv 2>/dev/null &
timeout -s TERM -k 30 ${LIMIT:-540} python3 -m mini_of3.ablate crops configs/ablation.yaml --seeds ${SEEDS:-0,1,2} \
  --steps ${STEPS:-1000} --hours ${HOURS:-0.145} data.root=.device/data/cache data.cache_dir=.device/data/cache \
  trainer.out_dir=$FOLDER --out $OUT > $OUT/ablate.log 2>&1
echo "ablate exit $?"
kill %1 2>/dev/null
tar czf $OUT/ablation_arms.tgz --exclude=checkpoints -C .device/ablation runs
grep -v "it/s\]\|s/it\]" $OUT/ablate.log | tail -25
python3 - <<'PY'
import json, pathlib
for p in sorted(pathlib.Path(".device/ablation/runs").glob("seed*/*/arm.json")):
    s = json.loads(p.read_text())["summary"]
    print(f"{p.parent.parent.name:6s} {s['arm']:18s} steps {s['step']:5d} step {s['step_s']:.3f} s  "
          f"gpu {s['gpu_minutes']:.1f} min  wall {s.get('wall_minutes', 0):.1f} min  peak {s['peak_mib'] or 0:.0f} MiB")
PY
