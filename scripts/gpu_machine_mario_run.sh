#!/usr/bin/env bash
# The 7-minute Mario run on the lent H100 machine (BENCHMARKS.md, "GPU figures"): install the wheels from
# scripts/gpu_machine_wheels.sh, train, copy the checkpoint every 40 s, evaluate every copy greedily in
# parallel, then measure the emulator ceiling of the same 14 processes. Run there as: bash scripts/gpu_machine_mario_run.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --ignore-requires-python --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
R=runs/gpu
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 2 > $OUT/smi.csv 2>&1 &
SMI=$!
python3 -m launcher --profile gpu-server --set collectors.count=14 --set learner.compile_mode=default \
  --set learner.batch_size=256 --set learner.grad_accum_steps=1 --set learner.samples_per_insert=12 \
  --set learner.warmup_transitions=50000 --set learner.checkpoint_every_s=40 \
  --max-seconds 420 --log-interval 20 --run-dir $R > $OUT/train.log 2>&1 &
TP=$!
T0=$SECONDS
while kill -0 $TP 2>/dev/null; do
  sleep 5
  e=$((SECONDS-T0))
  if [ -f $R/checkpoint/meta.json ] && [ $((e % 40)) -lt 5 ]; then cp -r $R/checkpoint $R/ck_$e 2>/dev/null; fi
done
kill $SMI
grep "PROGRESS\|DONE\|WARN\|ERROR" $OUT/train.log | tail -8 | cut -c1-300
cp $R/metrics.jsonl $OUT/metrics.jsonl
for d in $R/ck_* $R/checkpoint; do n=$(basename $d)
  timeout 70 python3 -m evaluate $d --episodes 1 --epsilon 0 --max-steps 1200 --no-video --out $R/ev_${n}_g > /dev/null 2>&1 &
  timeout 70 python3 -m evaluate $d --episodes 3 --epsilon 0.05 --max-steps 1200 --no-video --out $R/ev_${n}_e > /dev/null 2>&1 &
done
wait
python3 - > $OUT/evals.json <<'PY'
import json, glob
out = {}
for p in sorted(glob.glob("runs/gpu/ev_*/eval.json")):
    d = json.load(open(p)); out[p.split("/")[2]] = {"summary": d.get("summary"), "counters": d.get("counters")}
print(json.dumps(out, indent=1))
PY
python3 -c "
import json; d=json.load(open('$OUT/evals.json'))
for k,v in d.items(): s=v['summary'] or {}; c=v['counters'] or {}; print(k, s.get('mean_x_pos'), s.get('flag_rate'), c.get('env_steps'), c.get('updates'))"
timeout 80 python3 -m bench --profile gpu-server --collectors 14 --envs-per-collector 32 --seconds 20 --skip naive --skip pipeline --skip components --skip sweep --out $OUT/bench_ceiling.json > $OUT/bench_ceiling.log 2>&1; echo "ceiling rc=$?"; tail -4 $OUT/bench_ceiling.log
