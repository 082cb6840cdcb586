"""Research tools: one-off measurements, each feeding one experiment record (`python -m experiments.<tool>`).

`make bench` (bench/) measures the system as it is; these measured a question once, and their figures live in the
record beside the command that made them. They may import the product packages and bench/ (e.g. bench.learner's
`_measure`, bench.replay_bench's chunks); nothing but the tests imports them (tests/test_boundaries.py).

- `proxy`: one proxy run of a learning lever (train, then evaluate the final checkpoint):
  docs/experiments/levers.md and docs/experiments/per_env_step.md (runs kept under results/levers_per_env_step/
  and results/scale_per_env_step/); docs/tuning.md says how to run one.
- `proxy_table`: proxy runs compared per env step, the tables of docs/experiments/levers.md and
  docs/experiments/per_env_step.md (results/bench/mario_scale_per_env_step_2026-11-25.json).
- `adam_kernels`: Adam's foreach against fused kernels: docs/experiments/learner_cpu.md ("Adam alone"), BENCHMARKS.md
  "Learner on CPU and GPU" (results/bench/adam_kernels_cpu_2026-11-27.json).
- `learner_encoder`: what the image encoder costs: docs/experiments/learner_cpu.md ("image encoder"), BENCHMARKS.md
  "Learner on CPU and GPU" (results/bench/encoder_cost_cpu_2026-11-25.json).
- `learner_options`: what a learner option costs per update and per collector step: docs/experiments/learner_cpu.md
  (NoisyNet, the other levers' cost), BENCHMARKS.md "Learner on CPU and GPU"
  (results/bench/learner_options_*_cpu_2026-11-29.json).
- `cartpole_race`, with `cleanrl_dqn` (the single-process reference it races, in its own process): BENCHMARKS.md
  "Learning: CartPole-v1 through the whole system" (results/bench/cartpole_race_2026-11-21.json,
  results/bench/cartpole_seeds_2026-11-25.json).
- `backend_steps`: CPU per env step on each emulator backend: BENCHMARKS.md "Emulator backends"
  (results/bench/emulator_backends_2026-12-02.json), docs/training.md's emulator backends.
- `env_ceiling`: the emulator ceiling on this interpreter's emulator generation, no torch: BENCHMARKS.md
  "Both emulator generations" (results/bench/emulator_generations.json).
- `profile_insert`: where a batched replay insert spends its time: BENCHMARKS.md "Replay against the copy floor"
  (where the time goes), docs/history.md.

- `learner_checkouts`: the eager CPU learner of one checkout, run in two commits' worktrees in turn:
  docs/experiments/learner_cpu.md ("the one update function", results/bench/one_update_fp32_ab_2026-12-04.json).

Their tests carry the `experiments` mark: `make test-experiments` runs them, `make test` does not.
"""
