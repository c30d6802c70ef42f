#!/usr/bin/env bash
# Issue 17's second bar: MINUTES (9) of training steps (trainer.max_minutes, validation not counted) at crop 384 on
# the 49 training entries of ../shared/data (prepared in .device/data/cache), validating 1AKI and 3O5R and scoring
# 11 training entries of at most 384 tokens (every third by id, less 3JQH, which min_resolved_fraction drops) at
# steps 0, VAL_EVERY (800), ... and the end. Crops are padded to 384 tokens (data.pad_to_crop): one shape for
# the CUDA graphs of trainer.compile_mode=reduce-overhead. The run folder is runs/train49: the same command on a machine kept warm
# resumes from the SIGTERM checkpoint the LIMIT_S timeout left. The compile mode is runs/compile_mode's (written by
# phase 1 of tools/lab/device_learn.sh), default without it; a run that fails in it goes on in the default mode.
#   MINI_OF3_COMMIT=<hash> [MINUTES=9] [VAL_EVERY=800] bash tools/lab/device_train49.sh LIMIT_S
set -u
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
mode=$(cat runs/compile_mode 2>/dev/null || echo default)
echo "compile mode: $mode"
MINI_OF3_RUN=runs/train49 TRAIN_TIMEOUT=${1:-560} MINI_OF3_FALLBACK="trainer.compile_mode=default" \
  bash tools/lab/device_train.sh configs/crop384.yaml 100000 trainer.max_minutes=${MINUTES:-9} trainer.resume=auto \
  trainer.compile_mode=$mode model.checkpointing=false data.sample_weighting=uniform data.min_resolved_fraction=0.5 data.pad_to_crop=true data.num_workers=6 \
  data.val_ids=[1AKI,3O5R] trainer.val_every=${VAL_EVERY:-800} trainer.val_samples=3 \
  data.train_eval_ids=[1A7G,1CRN,1L2Y,1PSM,1WYM,2OFG,3STR,4CUP,4OPJ,5I55,5ZNG]
