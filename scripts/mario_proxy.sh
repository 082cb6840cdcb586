#!/usr/bin/env bash
# One proxy run of a Mario lever (BENCHMARKS.md, "Levers"): train with the defaults plus the given
# overrides for SECONDS, then evaluate the final checkpoint the way the bar does
# (10 episodes at epsilon 0.05) into RUN_DIR/final_eval/. The head's periodic evaluations (every
# logging.eval_every_s) are in RUN_DIR/evals.jsonl.
#
#   bash scripts/mario_proxy.sh RUN_DIR SEED SECONDS [--set key=value ...]
#   bash scripts/mario_proxy.sh runs/lever-stream-s0 0 1800 --set collectors.eps_per=stream
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: bash scripts/mario_proxy.sh RUN_DIR SEED SECONDS [--set key=value ...]" >&2
    exit 2
fi
run_dir=$1 seed=$2 seconds=$3
shift 3
py=${PY:-.venv/bin/python}
port=${PORT:-$((7600 + RANDOM % 300))}
"$py" -m launcher --max-seconds "$seconds" --log-interval 60 --seed "$seed" --port "$port" --run-dir "$run_dir" "$@"
"$py" -m evaluate "$run_dir" --episodes 10 --epsilon 0.05 --no-video --out "$run_dir/final_eval"
