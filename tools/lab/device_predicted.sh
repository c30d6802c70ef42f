#!/usr/bin/env bash
# One device call for what committed code predicts and no GPU has measured yet (issues 41, 42), most decisive first,
# each step under its own time limit so that the call ends within 10 minutes:
#   padded  bench kernels --padded 300:768 (mask_queries on / off against an unpadded 320; the 1.3x bar)
#   step    bench step at crop 768, mini_of3+mini_of3 against cueq+cueq (the single attention on our kernel)
#   tanh    bench sigmoid at the shapes in MINI_OF3_SIGMOID_SHAPES (rcp, tanh and TritonSigmoid side by side)
#   padstep bench step on 6W13 (317 tokens) padded to crop 768 beside its crop of 320 (where padding still costs)
#   gluon   tools/lab/gluon_tri_attn_fwd.py (the Hopper prototypes: error against float64, time against SDPA)
#   sweep   bench sigmoid --sweep --sigmoid $MINI_OF3_SWEEP_SIGMOID (tanh) at T = 16384, D = 128 (the 0.85x bar's
#           shape; the tiles were tuned at T = 4096 for rcp)
#   scores  the GPU tests of the stored-scores backward, then bench sigmoid at the D = 128 shapes and b1t16384d64:
#           ours (rcp, tanh) recomputing dq against dq from stored scores (scores_budget 2 and 8 GiB), TritonSigmoid
#           and cuDNN side by side
#   defaults  bench sigmoid at the five shapes with the default tiles: ours (rcp, tanh), tanh recomputing dq,
#           TritonSigmoid, cuDNN
#   confirm  the bar's two D = 128 shapes at the defaults, TritonSigmoid between two identical arms of ours (tanh;
#           "+dqs_warps=8" is the default), then the default rcp
#   sweepscores  bench sigmoid --sweep --sigmoid tanh --tiles scores_budget=2147483648 --sweep-kernels dkdv,dq at
#           T = 16384, D = 128 (the backward's tiles with stored scores)
#   varlendiag  where the packed forward loses to the dense one: bench sigmoid (tanh, rcp, TritonSigmoid, no float64
#           check) on one packed sequence of 16384 beside b1t16384, eight packed of 8000 beside b8t8000, and the
#           16-sequence batch
#   registers  the GPU tests of the packed layout, then bench sigmoid with the forward's register cap (the default
#           168 at D = 128) against none, on one packed sequence of 16384 beside b1t16384 and on the 16-sequence batch
#   hopper  the GPU tests of the Gluon kernels of sigmoid_attention_hopper.py, then bench sigmoid at T = 16384,
#           D = 128 and the packed batch: ours with tanh on the Gluon kernels (+hopper_fwd_min_keys=0: the forward
#           too) and on the Triton ones (+hopper=0), ours with rcp on the Gluon kernels, TritonSigmoid
#           (MINI_OF3_SIGMOID_SHAPES, MINI_OF3_SIGMOID_IMPLS)
#   hoppertable  bench sigmoid at the five shapes of issue 41 and the packed batch: ours at the defaults (tanh, rcp),
#           ours with tanh on the Gluon forward too and on the Triton kernels only, TritonSigmoid, cuDNN (the
#           README's table)
#   hoppersweep  the Gluon kernels' tiles on the packed batch and T = 16384 (tanh): the defaults, 3 backward stages,
#           128-key forward tiles on the packed batch, 2 forward stages (no float64 check)
#   fused  the GPU tests of the Gluon kernels (the two-kernel backward first, then the one-kernel backward under its
#           own limit: a wrong turn-taking hangs), where each kernel's time goes (tools/lab/sigmoid_kernels_gpu.py),
#           then bench sigmoid on the packed batch and T = 16384, D = 128 (MINI_OF3_SIGMOID_SHAPES): Gluon two-kernel and
#           (if its tests passed)
#           one-kernel backward, TritonSigmoid
#   fusedquick  the Gluon kernels' GPU tests (the default path first), the one-kernel backward's, then (if they pass) bench sigmoid: the Gluon kernels with the
#           two-kernel and the one-kernel backwards (hopper_bwd_fused=1 and 2) on the packed batch and T = 16384
#           (no float64 check, no anchors),
#           then tools/lab/sigmoid_kernels_gpu.py at B = 4, T = 4096 and on the packed batch
#   gluonlast  the gluon step, run after every other step, then tools/lab/gluon_tri_attn_bwd.py (the triangle dK/dV
#           in Gluon beside the Triton _bwd_dkdv) and gluon_tri_attn_layouts.py (the forward on the model's views)
#   MINI_OF3_COMMIT=<hash> bash tools/lab/device_predicted.sh [STEPS]      (default padded,step,tanh,padstep,gluon)
# Carry .whl (anchors: cueq, TritonSigmoid) and .device (prepared entries). Writes $OUT/<step>.log and the benches'
# JSON/PNG; prints each step's table last.
set -u
steps=${1:-padded,step,tanh,padstep,gluon}
: "${MINI_OF3_COMMIT:?set MINI_OF3_COMMIT to the commit measured}"
source tools/lab/device_env.sh
left() { echo $(( ${MINI_OF3_TOTAL_LIMIT:-575} - SECONDS )); }
run_step() {   # NAME LIMIT COMMAND...: run under min(LIMIT, time left), log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t=$(left); (( t < limit )) && limit=$t
  if (( limit < 20 )); then echo "== $name: skipped, ${limit} s left"; return; fi
  echo "== $name (limit ${limit} s)"
  timeout $limit "$@" > $OUT/$name.log 2>&1 || echo "== $name: exit $?"
}
[[ ,$steps, == *,padded,* ]] && run_step padded 90 python3 -m mini_of3.bench kernels --padded 300:768 --ds 32 \
  --out $OUT --tag padded_$MINI_OF3_COMMIT
[[ ,$steps, == *,step,* ]] && run_step step 220 python3 -m mini_of3.bench step configs/crop768.yaml \
  --data .device/data/cache --crops 768 --arms mini_of3+mini_of3,cueq+cueq --rounds 4 --warmup 2 --out $OUT \
  --tag crop768_$MINI_OF3_COMMIT
[[ ,$steps, == *,tanh,* ]] && run_step tanh 240 python3 -m mini_of3.bench sigmoid \
  --shapes ${MINI_OF3_SIGMOID_SHAPES:-b4t4096d128,b1t16384d64,varlen16d128} --out $OUT --tag tanh_$MINI_OF3_COMMIT
[[ ,$steps, == *,padstep,* ]] && run_step padstep 200 python3 -m mini_of3.bench step configs/crop768.yaml \
  --data .device/data/cache --crops 320,768 --entry 6W13 --pad --arms mini_of3+mini_of3 --rounds 2 --warmup 1 \
  --profile-crops 320,768 --out $OUT --tag padded6w13_$MINI_OF3_COMMIT
[[ ,$steps, == *,gluon,* ]] && run_step gluon 150 python3 tools/lab/gluon_tri_attn_fwd.py
[[ ,$steps, == *,sweep,* ]] && run_step sweep 300 python3 -m mini_of3.bench sigmoid --sweep \
  --sigmoid ${MINI_OF3_SWEEP_SIGMOID:-tanh} --shapes b1t16384d128 --reps 10 --err-heads 1 --out $OUT \
  --tag ${MINI_OF3_SWEEP_SIGMOID:-tanh}_b1t16384d128_$MINI_OF3_COMMIT
GIB2=scores_budget=2147483648
GIB8=scores_budget=8589934592
[[ ,$steps, == *,scores,* ]] && run_step scorestest 150 python3 -m pytest -q -x \
  tests/kernels/test_sigmoid_attention_gpu.py -k "stored_scores or bitwise or dense"
[[ ,$steps, == *,scores,* ]] && run_step scores 420 python3 -m mini_of3.bench sigmoid \
  --shapes ${MINI_OF3_SIGMOID_SHAPES:-b1t16384d128,b4t4096d128,b1t16384d64,varlen16d128} --err-heads 1 --reps 10 \
  --impls mini_of3+scores_budget=0,mini_of3+$GIB2,mini_of3_tanh+scores_budget=0,mini_of3_tanh+$GIB2,mini_of3_tanh+$GIB8,mini_of3_tanh+$GIB2+dqs_block_m=128+dqs_warps=8,mini_of3_tanh+$GIB2+dkdv_warps=8,triton_sigmoid,cudnn \
  --out $OUT --tag scores_$MINI_OF3_COMMIT
[[ ,$steps, == *,defaults,* ]] && run_step defaultstest 90 python3 -m pytest -q -x \
  tests/kernels/test_sigmoid_attention_gpu.py -k "stored_scores"
[[ ,$steps, == *,defaults,* ]] && run_step defaults 420 python3 -m mini_of3.bench sigmoid --err-heads 1 --reps 10 \
  --impls mini_of3,mini_of3_tanh,mini_of3_tanh+scores_budget=0,triton_sigmoid,cudnn --out $OUT \
  --tag defaults_$MINI_OF3_COMMIT
[[ ,$steps, == *,confirm,* ]] && run_step confirm 240 python3 -m mini_of3.bench sigmoid --err-heads 1 --reps 20 \
  --shapes ${MINI_OF3_SIGMOID_SHAPES:-b1t16384d128,b4t4096d128} \
  --impls ${MINI_OF3_SIGMOID_IMPLS:-mini_of3_tanh,triton_sigmoid,mini_of3_tanh+dqs_warps=8,mini_of3} \
  --out $OUT --tag confirm_$MINI_OF3_COMMIT
[[ ,$steps, == *,sweepscores,* ]] && run_step sweepscores 400 python3 -m mini_of3.bench sigmoid --sweep \
  --sigmoid tanh --tiles $GIB2 --sweep-kernels dkdv,dq --shapes b1t16384d128 --reps 10 --err-heads 1 --out $OUT \
  --tag scores_tanh_b1t16384d128_$MINI_OF3_COMMIT
VD="python3 -m mini_of3.bench sigmoid --err-heads 0 --reps 10 --impls mini_of3_tanh,mini_of3,triton_sigmoid --out $OUT"
[[ ,$steps, == *,varlendiag,* ]] && run_step varlendiag1 120 $VD --shapes b1t16384d128,varlen1d128 \
  --varlen-range 16384,16384 --tag varlen1_$MINI_OF3_COMMIT
[[ ,$steps, == *,varlendiag,* ]] && run_step varlendiag8 120 $VD --shapes b8t8000d128,varlen8d128 \
  --varlen-range 8000,8000 --tag varlen8_$MINI_OF3_COMMIT
[[ ,$steps, == *,varlendiag,* ]] && run_step varlendiag16 150 $VD --shapes varlen16d128 --tag varlen16_$MINI_OF3_COMMIT
RI=mini_of3_tanh,mini_of3_tanh+fwd_registers=0,mini_of3,mini_of3+fwd_registers=0,triton_sigmoid
[[ ,$steps, == *,registers,* ]] && run_step registerstest 150 python3 -m pytest -q -x \
  tests/kernels/test_sigmoid_attention_gpu.py -k "varlen or padded or bitwise or stored_scores"
[[ ,$steps, == *,registers,* ]] && run_step registers1 130 $VD --impls $RI --shapes b1t16384d128,varlen1d128 \
  --varlen-range 16384,16384 --tag registers1_$MINI_OF3_COMMIT
[[ ,$steps, == *,registers,* ]] && run_step registers16 150 $VD --impls $RI --shapes varlen16d128 \
  --tag registers16_$MINI_OF3_COMMIT
[[ ,$steps, == *,hopper,* ]] && run_step hoppertest 150 python3 -m pytest -q -rf \
  tests/kernels/test_sigmoid_attention_gpu.py -k "${MINI_OF3_HOPPER_TESTS:-hopper}"
[[ ,$steps, == *,hopper,* ]] && run_step hopper 400 python3 -m mini_of3.bench sigmoid --err-heads 1 --reps 10 \
  --shapes ${MINI_OF3_SIGMOID_SHAPES:-b1t16384d128,varlen16d128} \
  --impls ${MINI_OF3_SIGMOID_IMPLS:-mini_of3_tanh+hopper_fwd_min_keys=0,mini_of3_tanh+hopper=0,mini_of3+hopper_fwd_min_keys=0,triton_sigmoid} --out $OUT \
  --tag hopper_$MINI_OF3_COMMIT
[[ ,$steps, == *,hoppertable,* ]] && run_step hoppertable 560 python3 -m mini_of3.bench sigmoid --err-heads 1 \
  --reps 10 --impls mini_of3_tanh,mini_of3,mini_of3_tanh+hopper_fwd_min_keys=0,mini_of3_tanh+hopper=0,triton_sigmoid,cudnn --out $OUT \
  --tag hoppertable_$MINI_OF3_COMMIT
HT=mini_of3_tanh+hopper_fwd_min_keys=0
[[ ,$steps, == *,hoppersweep,* ]] && run_step hoppersweep 400 python3 -m mini_of3.bench sigmoid --err-heads 0 \
  --reps 10 --shapes varlen16d128,b1t16384d128 --out $OUT --tag hoppersweep_$MINI_OF3_COMMIT \
  --impls $HT,$HT+hopper_bwd_stages=3,$HT+hopper_fwd_block_n=128,$HT+hopper_fwd_block_n=64,$HT+hopper_fwd_stages=2
if [[ ,$steps, == *,fused,* ]]; then
  run_step hoppertwo 80 python3 -m pytest -q -rf tests/kernels/test_sigmoid_attention_gpu.py -k "hopper and not fused"
  run_step fusedtest 80 python3 -m pytest -q -rf tests/kernels/test_sigmoid_attention_gpu.py -k fused
  FUSED=$(grep -q " passed" $OUT/fusedtest.log && ! grep -q "failed\|error" $OUT/fusedtest.log \
          && echo ",mini_of3_tanh+hopper_bwd_fused=1")
  IMPLS_OPT=(); [[ -n $FUSED ]] || IMPLS_OPT=(--impls mini_of3_tanh+hopper_fwd_min_keys=0,mini_of3_tanh+hopper=0)
  run_step kerneltimes 90 python3 tools/lab/sigmoid_kernels_gpu.py --shapes b1t16384d128,b4t4096d128,varlen16d128 \
    "${IMPLS_OPT[@]}"
  run_step fusedbench 260 python3 -m mini_of3.bench sigmoid --err-heads 1 --reps 10 \
    --shapes ${MINI_OF3_SIGMOID_SHAPES:-varlen16d128,b1t16384d128} \
    --impls mini_of3_tanh$FUSED,triton_sigmoid --out $OUT --tag fused_$MINI_OF3_COMMIT
fi
if [[ ,$steps, == *,fusedquick,* ]]; then
  run_step hoppertwo 80 python3 -m pytest -q -rf tests/kernels/test_sigmoid_attention_gpu.py -k "hopper and not fused"
  run_step fusedtest 150 python3 -m pytest -q -rf tests/kernels/test_sigmoid_attention_gpu.py -k fused
  grep -q " passed" $OUT/fusedtest.log && ! grep -q "failed\|error" $OUT/fusedtest.log && \
    run_step fusedbench 90 python3 -m mini_of3.bench sigmoid --err-heads 0 --reps 10 \
      --shapes varlen16d128,b1t16384d128 \
      --impls mini_of3_tanh,mini_of3_tanh+hopper_bwd_fused=1,mini_of3_tanh+hopper_bwd_fused=2 \
      --out $OUT --tag fusedquick_$MINI_OF3_COMMIT
  run_step kerneltimes 60 python3 tools/lab/sigmoid_kernels_gpu.py --shapes b4t4096d128,varlen16d128
fi
[[ ,$steps, == *,gluonlast,* ]] && run_step gluon 150 python3 tools/lab/gluon_tri_attn_fwd.py
[[ ,$steps, == *,gluonlast,* ]] && run_step gluonbwd 100 python3 tools/lab/gluon_tri_attn_bwd.py
[[ ,$steps, == *,gluonlast,* ]] && run_step gluonlayouts 90 python3 tools/lab/gluon_tri_attn_layouts.py
for name in padded step tanh padstep gluon sweep scorestest scores sweepscores defaultstest defaults confirm varlendiag1 varlendiag8 varlendiag16 registerstest registers1 registers16 hoppertest hopper hoppertable hoppersweep hoppertwo fusedtest kerneltimes fusedbench gluonbwd gluonlayouts; do
  [ -f $OUT/$name.log ] && { echo "== $name"; grep -v -i 'warn' $OUT/$name.log | tail -12; }
done
echo "($SECONDS s in all)"
