# One device call of the crop ablation (issue 39): the arms named in ARMS (default crop256, which must finish first:
# the others' equal-time scores need its time), one process per seed sharing the GPU (a step of the ablation model
# leaves the H100 75 % idle), resuming the ablation folder carried in .device/ablation (the arm.json and log of every
# finished arm). Returns the folder, checkpoints left out, as $OUT/ablation_arms.tgz: unpack it into .device/ablation
# for the next call. Once every arm has finished, `python -m mini_of3.ablate crops` with the same arguments and no
# --only (on any machine) writes the result.
#   run: source tools/lab/device_env.sh && ARMS=crop256 STEPS=2000 LIMIT=560 bash tools/lab/device_ablation.sh
FOLDER=.device/ablation/${NAME:-crops}
mkdir -p $FOLDER
export OMP_NUM_THREADS=4                 # three processes on 16 cores: no oversubscribed CPU ops
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 5 > $OUT/gpu_util.csv 2>/dev/null &
monitor=$!
for seed in ${SEEDS:-0 1 2}; do
  timeout -s TERM -k 30 ${LIMIT:-560} python3 -m mini_of3.ablate crops configs/ablation.yaml --seeds $seed \
    --only ${ARMS:-crop256} --steps ${STEPS:-2000} data.root=.device/data/cache data.cache_dir=.device/data/cache \
    trainer.out_dir=$FOLDER > $OUT/ablate_seed$seed.log 2>&1 &
  sleep 5
done
wait $(jobs -p | grep -v "^$monitor$")
kill $monitor 2>/dev/null
tar czf $OUT/ablation_arms.tgz --exclude=checkpoints -C .device/ablation .
for seed in ${SEEDS:-0 1 2}; do grep "^ablate:\|Error\|error" $OUT/ablate_seed$seed.log | tail -4; done
python3 - <<'PY'
import json, pathlib
for p in sorted(pathlib.Path(".device/ablation").glob("*/seed*/*/arm.json")):
    s = json.loads(p.read_text())["summary"]
    print(f"{p.parent.parent.name:6s} {s['arm']:18s} steps {s['step']:5d} step {s['step_s']:.3f} s  "
          f"gpu {s['gpu_minutes']:.1f} min  wall {s.get('wall_minutes', 0):.1f} min  peak {s['peak_mib'] or 0:.0f} MiB")
util = [float(l.split(",")[1].strip(" %")) for l in open(pathlib.Path(__import__("os").environ["OUT"]) / "gpu_util.csv") if l.count(",") >= 2]
print(f"GPU utilisation: mean {sum(util) / max(len(util), 1):.0f} % over {len(util)} samples")
PY
