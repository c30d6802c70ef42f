#!/usr/bin/env bash
# One device call for issue 17: the fit check (python -m mini_of3.bench fit) on the crop384 model, several arms at
# once on the one GPU (at crop 256 a step is host-bound: one process leaves most of the GPU idle). Each arm ends by
# itself (--steps) or at LIMIT seconds (SIGTERM: the trainer saves and stops; its result is then written from the
# run's log by --report). Carry .whl and .device (prepared entries, gemmi/biopython wheels).
#   MINI_OF3_COMMIT=<hash> bash tools/lab/device_fit.sh TAG STEPS EVERY LIMIT_S NAME:KEY=VALUE,KEY=VALUE ...
# Writes $OUT/fit_<TAG>_<NAME>.json/.png, the run's log as fit_<TAG>_<NAME>_log.jsonl and its console output.
# MINI_OF3_RUNS (default /tmp/runs) holds the run folders: runs/... (git-ignored, not carried) stays on a machine kept
# warm between calls, so the same command with trainer.resume=auto in MINI_OF3_FIT_COMMON resumes a run stopped at
# LIMIT from its SIGTERM checkpoint.
set -u
runs=${MINI_OF3_RUNS:-/tmp/runs}
tag=$1; steps=$2; every=$3; limit=$4; shift 4
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source tools/lab/device_env.sh
for arm in "$@"; do
  name=${arm%%:*}; overrides=${arm#*:}
  timeout -s TERM -k 60 "$limit" python3 -m mini_of3.bench fit configs/crop384.yaml \
    --ids "${MINI_OF3_FIT_IDS:-1EMA,1GBT,4I39,3NZD}" --steps "$steps" --every "$every" --data .device/data/cache \
    --name "$name" --out "$OUT" --tag "${tag}_$name" wandb=false trainer.out_dir="$runs/$name" \
    ${MINI_OF3_FIT_COMMON:-} ${overrides//,/ } > "$OUT/fit_${tag}_${name}_console.txt" 2>&1 &
done
wait
for arm in "$@"; do
  name=${arm%%:*}
  echo "== $name: $(grep -c '"split": "val"' $runs/$name/log.jsonl) validations, last step $(tail -1 $runs/$name/log.jsonl | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step"])')"
  [ -f "$OUT/fit_${tag}_$name.json" ] || python3 -m mini_of3.bench fit --report "$runs/$name" --name "$name" \
    --out "$OUT" --tag "${tag}_$name" 2>&1 | tail -30
  cp "$runs/$name/log.jsonl" "$OUT/fit_${tag}_${name}_log.jsonl"
  grep -v '^\s*$' "$OUT/fit_${tag}_${name}_console.txt" | grep -iE "error|Traceback|compile" | tail -5
done
python3 - "$OUT" "$tag" "$@" <<'PY'
import json, sys, statistics
out, tag, arms = sys.argv[1], sys.argv[2], [a.split(":")[0] for a in sys.argv[3:]]
for name in arms:
    rows = json.load(open(f"{out}/fit_{tag}_{name}.json"))["rows"]
    log = [json.loads(l) for l in open(f"{out}/fit_{tag}_{name}_log.jsonl")]
    train = [r for r in log if r.get("split") != "val" and "step_s" in r]
    times = [r["step_s"] for r in train[5:]] or [float("nan")]      # the first steps compile
    print(f"{name}: median step {statistics.median(times):.3f} s over {len(train)} steps")
    for step in sorted({r["step"] for r in rows}):
        at = [r for r in rows if r["step"] == step]
        print(f"  step {step:5d}", " ".join(f"{r['entry']} {r['lddt_ca']:.2f}/{r['tm_score']:.2f}/{r['plddt']:.0f}"
                                           for r in at))
PY
