#!/usr/bin/env bash
# The GPU proof of the device-resident learner step, in at most 25 minutes on one CUDA machine:
#   1. the test files that exercise CUDA, with -v (the device step's CUDA-graph test among them);
#   2. the learner step bench on CUDA, bench.learner_step: eager / device / captured at batch 32, 64, 512
#      (updates/s, host CPU ms per update, GPU busy fraction, data wait, compile seconds);
#   3. short trainings of Mario 1-1 with the profile `auto` picks (what `make run` runs), one per
#      learner.step_mode in RUN_MODES (eager and captured), nvidia-smi sampled beside them.
# Everything goes to results/gpu/<date>-<commit>/: raw logs and JSON, the commit, torch/CUDA versions.
#
# Usage, from the repository root (docs/GPU.md says how to install on a machine without a registry):
#   bash bench/gpu_proof.sh                      # .venv/bin/python if there is one, else python3
#   PY=python3 bash bench/gpu_proof.sh           # a machine's own Python (PYTHONPATH=/tmp/site, docs/GPU.md)
#   RUN_SECONDS=180 RUN_MODES="eager captured" bash bench/gpu_proof.sh
#   RUN_SETS="logging.eval_every_s=120" bash bench/gpu_proof.sh   # more overrides for the runs
#   RUN_ARGS="--seed 1" RUN_TAG=_s1 bash bench/gpu_proof.sh   # more launcher arguments; runs named run_<mode>_s1
# Where device time is short, the steps can be chosen and ordered, and their limits shortened:
#   STEPS="bench tests runs" BENCH_LIMIT=300 BENCH_ARGS="--repeats 1 --batches 512,64,32 --precisions auto"
#   TESTS_LIMIT=150 TESTS="tests/test_device_step.py -k cuda" RUN_SECONDS=90 RUN_MODES=captured
#   (-k cuda: the CUDA tests only: the captured graph against the op-by-op step, beside a writer thread,
#   and inside a head that checkpoints and resumes)
#   ARCHIVE=out/proof.tgz: the output folder is packed there after every step (a copy that survives a kill)
#   EXPORT=1: each run keeps an evaluation-only copy of its best weights (python -m evaluate.export), e.g. to
#   train another level on the GPU and evaluate it here: RUN_SETS="env.env_id=SuperMarioBros-1-2-v0" EXPORT=1
#   COMMIT=<hash>: where the copy of the repository has no .git
#   RUN_KEEP=runs/gpu_segments: a run longer than one call, in segments: each run's folder (its checkpoint with
#   the replay) lives under RUN_KEEP, a git-ignored path the machine keeps between calls while it stays
#   warm, and a later call with the same RUN_KEEP and RUN_TAG goes on from it (--resume); the output folder
#   gets each segment's log, metrics and evaluations, e.g. two calls of
#   STEPS=runs RUN_MODES=captured RUN_KEEP=runs/gpu_segments RUN_SECONDS=420 RUN_SETS="logging.eval_every_s=120"
# 4. (step `levels`, only when asked) other levels trained side by side, one head per level in LEVELS, each
#    with its share of the collectors (the box's cores less 2, split evenly), the captured step, and an
#    evaluation-only copy of its best weights to ship and evaluate here:
#   STEPS=levels LEVELS="1-2 1-3" RUN_SECONDS=420 RUN_SETS="logging.eval_every_s=60" bash bench/gpu_proof.sh
# Each step has its own time limit (the defaults' sum, 1,340 s, keeps the whole under 25 minutes); a
# failed or timed-out step is recorded in summary.txt and the next one runs.
#
# One lent GPU window (~15 device minutes with the start-up, at most 10 minutes a command): the steps below, most
# important first, one command each; each writes its raw files and its summary (bench.run_summary) as it ends:
#   STEPS=flag   bash bench/gpu_proof.sh   # a. Mario 1-1, `make run`'s auto profile as it is, FLAG_SECONDS=450 (the
#                #    command at most 9 minutes), evaluations every 60 s (10 episodes, epsilon 0.05): env steps/s,
#                #    updates/s, updates per env step, the first evaluation flag's seconds (from the command's start)
#                #    and env steps, the curve (flag.json); the best network exported to flag/export/
#   STEPS=ratio  bash bench/gpu_proof.sh   # b. two heads side by side, half the collectors each, RATIO_SECONDS=360:
#                #    0.25 and 1.0 updates per env step (learner.samples_per_insert 8 and 32), compared at equal
#                #    env steps (ratio.json)
#   STEPS=cpu16  bash bench/gpu_proof.sh   # c. the box as a CPU-only machine (CUDA_VISIBLE_DEVICES=): the learner's
#                #    updates/s at CPU_THREADS="1,2,4,8" (bench.learner --by-threads, with the split those figures
#                #    give) and a CPU_RUN_SECONDS=120 `make run` with auto's CPU split (cpu16_run.json)
#   Budget: flag ~8 minutes with its summary and export; in the same window's remaining minutes (the machine's
#   start-up counts) ratio fits with RATIO_SECONDS=180 (its limit: 90 s more); cpu16 takes ~5 minutes.
#   DRY_RUN=1 OUT_DIR=/tmp/x STEPS="flag ratio cpu16" bash bench/gpu_proof.sh: the same steps on a CPU with tiny
#   settings (CartPole, seconds-long runs, collectors in-process), so the script cannot rot (tests/test_gpu_proof.py)
set -u -o pipefail

cd "$(dirname "$0")/.."
PY=${PY:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}
RUN_SECONDS=${RUN_SECONDS:-180}          # per Mario run (its start-up and shutdown get 110 s more)
RUN_MODES=${RUN_MODES:-"eager captured"}  # learner.step_mode of each Mario run
# the profiles' 50,000-transition warmup takes ~60 s of start-up and collection on a 16-core box: a short
# run would end before its first update, so the proof's runs start learning at 20,000
RUN_WARMUP=${RUN_WARMUP:-20000}
RUN_SETS=${RUN_SETS:-}  # more --set overrides for the runs, e.g. "logging.eval_every_s=120 learner.batch_size=64"
RUN_ARGS=${RUN_ARGS:-}  # more launcher arguments for the runs, e.g. "--seed 1" or "--env SuperMarioBros-1-2-v0"
RUN_TAG=${RUN_TAG:-}  # appended to each run's name (run_<mode><tag>): a second call's runs beside the first's
RUN_KEEP=${RUN_KEEP:-}  # non-empty: runs live under this folder and a later call resumes them (see above)
EXPORT=${EXPORT:-}  # non-empty: keep an evaluation-only copy of each run's best weights in run_<mode>/export/
LEVELS=${LEVELS:-"1-2 1-3 1-4"}  # the levels step's World-Stage pairs, trained side by side
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
DRY_RUN=${DRY_RUN:-}  # non-empty: no CUDA needed, tiny settings (the test of this script)
FLAG_SECONDS=${FLAG_SECONDS:-450}    # step flag: --max-seconds of the 1-1 run (start-up and export: 70 s more)
RATIO_SECONDS=${RATIO_SECONDS:-360}  # step ratio: --max-seconds of each of the two heads
RATIO_SPI=${RATIO_SPI:-"8 32"}       # step ratio: learner.samples_per_insert per head (x 1/32: updates per env step)
CPU_THREADS=${CPU_THREADS:-"1,2,4,8"}  # step cpu16: torch thread counts the CPU learner is measured at
CPU_BENCH_ARGS=${CPU_BENCH_ARGS:-"--repeats 2 --seconds 6"}
CPU_RUN_SECONDS=${CPU_RUN_SECONDS:-120}
EVAL_SETS="logging.eval_every_s=60 logging.eval_episodes=10 logging.eval_epsilon=0.05 logging.interval_s=10"
RUN_ENV_ARGS=()  # the env of the flag, ratio and cpu16 runs: Mario 1-1 (the profile's) unless DRY_RUN
INPROCESS=()
if [ -n "$DRY_RUN" ]; then
    FLAG_SECONDS=${DRY_SECONDS:-10} RATIO_SECONDS=${DRY_SECONDS:-10} CPU_RUN_SECONDS=${DRY_SECONDS:-10}
    CPU_THREADS="1,2" CPU_BENCH_ARGS="--repeats 1 --seconds 0.2 --precisions fp32"
    EVAL_SETS="logging.eval_every_s=2 logging.eval_episodes=2 logging.eval_epsilon=0.05 logging.interval_s=1
               learner.warmup_transitions=200"
    RUN_ENV_ARGS=(--env CartPole-v1)
    INPROCESS=(--inprocess)  # collectors as threads: no process start-up on a small CPU
fi

if [ -z "$DRY_RUN" ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "error: $PY sees no CUDA device (torch.cuda.is_available() is False)" >&2
    exit 2
fi
STEPS=${STEPS:-"tests bench runs"}
TESTS=${TESTS:-"tests/test_device_step.py tests/test_device_batch.py tests/test_device_sampler.py \
    tests/test_learner_precision.py tests/test_learner_trainer.py tests/test_replay_concurrency.py \
    tests/test_learner_compile.py tests/test_learner_replay.py"}
TESTS_LIMIT=${TESTS_LIMIT:-400}
BENCH_ARGS=${BENCH_ARGS:-"--repeats 2 --seconds 3 --precisions auto"}  # AMP at batch 32, 64 and 512
BENCH_LIMIT=${BENCH_LIMIT:-360}
ARCHIVE=${ARCHIVE:-}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
OUT=${OUT_DIR:-results/gpu/$(date +%Y-%m-%d)-${COMMIT:0:7}}
mkdir -p "$OUT"
SUMMARY=$OUT/summary$RUN_TAG.txt
: > "$SUMMARY"

{
    echo "commit: $COMMIT"
    echo "dirty: $(git status --porcelain 2>/dev/null | grep -c . || true) changed paths"
    echo "date: $(date -Iseconds)"
    echo "dry run: ${DRY_RUN:-no}"
    "$PY" - <<'EOF'
import platform, torch
print("python:", platform.python_version())
print("torch:", torch.__version__, "cuda:", torch.version.cuda, "cudnn:", torch.backends.cudnn.version())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, capability {p.major}.{p.minor}")
EOF
    nproc --all | sed 's/^/cores: /'  # --all: OMP_NUM_THREADS=1 above would make plain nproc say 1
    if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1; fi
} > "$OUT/versions$RUN_TAG.txt" 2>&1
cat "$OUT/versions$RUN_TAG.txt"

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT/NAME.log, note the outcome
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s)"
    local t0=$SECONDS
    timeout --kill-after=20 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a "$SUMMARY"
    pack
}

export_best() {  # export_best NAME [RUN]: an evaluation-only copy (~13 MB) of RUN's best/, else of its final
    # checkpoint (RUN: OUT/NAME unless given), written to OUT/NAME/export
    local run=${2:-$OUT/$1}
    local src=$run/best
    [ -d "$src" ] || src=$run
    "$PY" -m evaluate.export "$src" "$OUT/$1/export" >> "$OUT/$1.log" 2>&1 || echo "$1: export failed" >> "$SUMMARY"
}

pack() {  # the output folder into ARCHIVE, when asked
    if [ -n "$ARCHIVE" ]; then tar czf "$ARCHIVE" "$OUT"; fi
}

# 1. the CUDA test files (compiles included)
tests() {
    # shellcheck disable=SC2086  # TESTS is a list of paths
    step tests_cuda "$TESTS_LIMIT" "$PY" -m pytest -v -p no:cacheprovider $TESTS
}

# 2. the step bench (the first repeat compiles cold)
bench() {
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
    step bench_learner_step "$BENCH_LIMIT" "$PY" -m bench.learner_step --device cuda $BENCH_ARGS \
        --out "$OUT/bench_learner_step.json"
}

# 3. Mario 1-1 with the auto profile, one run per step mode, GPU load sampled beside each
runs() {
    for mode in $RUN_MODES; do
        local name=run_$mode$RUN_TAG
        local run=$OUT/$name sets=() resume=() segment=
        if [ -n "$RUN_KEEP" ]; then
            run=$RUN_KEEP/$name
            mkdir -p "$run"
            # the segment's number: how many segments this run's folder has seen, this one included
            segment=_seg$(( $(find "$run" -maxdepth 1 -name 'segment_*' | wc -l) + 1 ))
            if [ -f "$run/checkpoint/meta.json" ]; then resume=(--resume "$run"); fi
            touch "$run/segment_${segment#_seg}"
            sets+=(--set learner.save_replay=true)  # the next segment goes on with the replay it had
        fi
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 2 \
            > "$OUT/$name$segment.smi.csv" 2>&1 &
        local smi=$!
        sets+=(--set logging.interval_s=10 --set "learner.warmup_transitions=$RUN_WARMUP")
        # the captured and device steps compile themselves; eager compiles the networks (CUDA graphs over them)
        sets+=(--set "learner.step_mode=$mode")
        if [ "$mode" = eager ]; then sets+=(--set learner.compile_mode=reduce-overhead); else sets+=(--set learner.compile_mode=off); fi
        for kv in $RUN_SETS; do sets+=(--set "$kv"); done
        # shellcheck disable=SC2086  # RUN_ARGS is a list of arguments
        step "$name$segment" $((RUN_SECONDS + 110)) "$PY" -m launcher --profile auto --max-seconds "$RUN_SECONDS" \
            --run-dir "$run" "${sets[@]}" "${resume[@]}" $RUN_ARGS
        kill "$smi" 2>/dev/null
        wait "$smi" 2>/dev/null
        if [ -n "$RUN_KEEP" ]; then
            # what the run has written so far, without its weights and replay (kept for the next segment)
            mkdir -p "$OUT/$name"
            tar cf - -C "$run" --exclude=./checkpoint --exclude=./best . | tar xf - -C "$OUT/$name"
        fi
        if [ -n "$EXPORT" ]; then export_best "$name" "$run"; fi
        if [ -z "$RUN_KEEP" ]; then rm -rf "$run/checkpoint" "$run/best"; fi  # weights and replay are large
        pack
    done
}

# 4. other levels side by side: one head per level, the collectors split between them
levels() {
    local count share
    count=$(wc -w <<< "$LEVELS")
    share=$(( ($(nproc --all) - 2) / count ))  # --all: OMP_NUM_THREADS=1 makes plain nproc say 1
    [ "$share" -ge 1 ] || share=1
    local pids=()
    for level in $LEVELS; do
        local name=level_$level$RUN_TAG
        local sets=(--set logging.interval_s=10 --set "learner.warmup_transitions=$RUN_WARMUP"
                    --set learner.step_mode=captured --set learner.compile_mode=off)
        for kv in $RUN_SETS; do sets+=(--set "$kv"); done
        # shellcheck disable=SC2086  # RUN_ARGS is a list of arguments
        ( ARCHIVE=  # packed once, after all of them: side by side they would write one archive at once
          step "$name" $((RUN_SECONDS + 110)) "$PY" -m launcher --profile auto --env "SuperMarioBros-$level-v0" \
            --collectors "$share" --port 0 --max-seconds "$RUN_SECONDS" --run-dir "$OUT/$name" "${sets[@]}" $RUN_ARGS ) &
        pids+=($!)
    done
    wait "${pids[@]}"
    for level in $LEVELS; do
        local name=level_$level$RUN_TAG
        export_best "$name"
        rm -rf "$OUT/$name/checkpoint" "$OUT/$name/best"  # weights and replay are large; metrics, logs and config stay
    done
    pack
}

smi_start() {  # smi_start NAME: GPU load sampled every 2 s beside a step (nothing without nvidia-smi)
    SMI_PID=
    if command -v nvidia-smi > /dev/null && [ -z "$DRY_RUN" ]; then
        nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -l 2 > "$OUT/$1.smi.csv" 2>&1 &
        SMI_PID=$!
    fi
}

smi_stop() {
    if [ -n "$SMI_PID" ]; then kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; fi
}

summarize() {  # summarize NAME STARTED_UNIX RUN...: bench.run_summary of the runs into OUT/NAME.json
    local name=$1 started=$2
    shift 2
    "$PY" -m bench.run_summary "$@" --started-unix "$started" --out "$OUT/$name.json" > /dev/null 2>> "$OUT/$name.log" \
        || echo "$name: summary failed" >> "$SUMMARY"
}

eval_sets() {  # the --set pairs of EVAL_SETS and RUN_SETS
    local kv
    for kv in $EVAL_SETS $RUN_SETS; do printf -- '--set\n%s\n' "$kv"; done
}

# a. Mario 1-1 with the profile `make run` takes (auto), evaluations every 60 s; the first flag, the rates, the
#    curve, and the best network exported (its weights and replay then deleted: large)
flag() {
    local started sets
    started=$(date +%s)
    mapfile -t sets < <(eval_sets)
    smi_start flag
    # shellcheck disable=SC2086  # RUN_ARGS is a list of arguments
    step flag $((FLAG_SECONDS + 60)) "$PY" -m launcher --profile auto --port 0 --max-seconds "$FLAG_SECONDS" \
        --run-dir "$OUT/flag" "${RUN_ENV_ARGS[@]}" "${INPROCESS[@]}" "${sets[@]}" $RUN_ARGS
    smi_stop
    summarize flag "$started" "$OUT/flag"
    export_best flag
    rm -rf "$OUT/flag/checkpoint" "$OUT/flag/best" "$OUT/flag/kept" "$OUT/flag/evals"
    pack
}

# b. two heads side by side, half the collectors each, at RATIO_SPI samples per insert (batch 32: 0.25 and 1.0
#    updates per env step), compared at equal env steps
ratio() {
    local count share started sets pids=() runs=() labels=()
    count=$(wc -w <<< "$RATIO_SPI")
    share=$(( ($(nproc --all) - 2) / count ))  # the gpu-server profile's collectors (cores less 2), split evenly
    [ "$share" -ge 1 ] || share=1
    started=$(date +%s)
    mapfile -t sets < <(eval_sets)
    smi_start ratio
    for spi in $RATIO_SPI; do
        local name=ratio_spi$spi
        # shellcheck disable=SC2086  # RUN_ARGS is a list of arguments
        ( ARCHIVE=  # packed once, after both: side by side they would write one archive at once
          step "$name" $((RATIO_SECONDS + 90)) "$PY" -m launcher --profile auto --port 0 --collectors "$share" \
            --max-seconds "$RATIO_SECONDS" --run-dir "$OUT/$name" --set "learner.samples_per_insert=$spi" \
            "${RUN_ENV_ARGS[@]}" "${INPROCESS[@]}" "${sets[@]}" $RUN_ARGS ) &
        pids+=($!)
        runs+=("$OUT/$name")
        labels+=("spi$spi")
    done
    wait "${pids[@]}"
    smi_stop
    summarize ratio "$started" "${runs[@]}" --labels "${labels[@]}"
    for run in "${runs[@]}"; do rm -rf "$run/checkpoint" "$run/best" "$run/kept" "$run/evals"; done
    pack
}

# c. the box as a CPU-only machine: the learner per thread count, then a short run with auto's CPU split
cpu16() {
    local started sets
    # shellcheck disable=SC2086  # CPU_BENCH_ARGS is a list of arguments
    CUDA_VISIBLE_DEVICES= step cpu16_threads 400 "$PY" -m bench.learner --by-threads "$CPU_THREADS" $CPU_BENCH_ARGS \
        --out "$OUT/cpu16_threads.json"
    started=$(date +%s)
    mapfile -t sets < <(eval_sets)
    # shellcheck disable=SC2086  # RUN_ARGS is a list of arguments
    CUDA_VISIBLE_DEVICES= step cpu16_run $((CPU_RUN_SECONDS + 80)) "$PY" -m launcher --profile auto --port 0 \
        --max-seconds "$CPU_RUN_SECONDS" --run-dir "$OUT/cpu16_run" "${RUN_ENV_ARGS[@]}" "${INPROCESS[@]}" \
        "${sets[@]}" $RUN_ARGS
    summarize cpu16_run "$started" "$OUT/cpu16_run"
    rm -rf "$OUT/cpu16_run/checkpoint" "$OUT/cpu16_run/best" "$OUT/cpu16_run/kept" "$OUT/cpu16_run/evals"
    pack
}

for name in $STEPS; do
    case $name in
        tests|bench|runs|levels|flag|ratio|cpu16) "$name" ;;
        *) echo "error: STEPS=$STEPS: unknown step $name (allowed: tests bench runs levels flag ratio cpu16)" >&2; exit 2 ;;
    esac
done

echo "== done: $OUT"
cat "$SUMMARY"
pack
