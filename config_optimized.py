"""Hardware profiles: the one file that tunes Mario Ape-X to a machine.

Pick one with `make run ARGS="--profile NAME"` and override single fields with
`--set section.field=value` (e.g. `--set replay.capacity=200000`). `auto` (the default)
looks at cores, memory and CUDA and fills in the rest. Field meanings and trade-offs are
commented in `shared/config.py`; here each profile says why its values suit its machine.

Rules of thumb that the profiles follow:
- The emulator is the ceiling on the collector side (~1 ms per NES frame per core), so one
  collector process per spare core; K envs per collector only batch inference, they do not
  add emulator throughput.
- Without a GPU the learner competes with collectors for cores; with one, it should never
  wait on the CPU side (replay frames on the GPU, big batches, AMP, torch.compile).
- Replay memory is one 84x84 uint8 frame (7 KiB) per transition: 1M transitions ~ 7 GiB.

On top of the hardware profile each environment has a preset (ENV_PRESETS, `env_preset`): the
values tuned for that env, applied by `load_config` for every field the user did not `--set`, so
`--env CartPole-v1` and `--set env.env_id=CartPole-v1` give the same config.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

from shared.config import (
    MARIO_DEFAULT_ENV,
    CollectorConfig,
    Config,
    ConfigError,
    LearnerConfig,
    ReplayConfig,
    TransportConfig,
    is_atari,
    is_mario,
)
from shared.config_checks import estimate_replay_bytes
from shared.cpu_split import ENV_STEP_CPU_MS, CpuSplit, measured_costs, split_cpu
from shared.sizes import available_memory_bytes

# The per-env-step rule: learning per env step follows gradient updates per env step, not the batch or the
# number of streams, so every profile trains at batch 32 and 8 samples per insert (0.25 updates per env step) and
# holds its collectors to that ratio (docs/experiments/per_env_step.md).
RULE_BATCH = 32
RULE_SAMPLES_PER_INSERT = 8.0  # 0.25 updates per env step at RULE_BATCH
GPU_INSERT_LEAD = 50_000  # ~12 chunks of 32 envs x 128 steps: collectors stream freely, the ratio holds over a run


def cpu_profile() -> Config:
    """This 2-core, 24 GiB, no-GPU machine: collectors on both cores, a light bf16 learner."""
    return Config(
        collectors=CollectorConfig(count=2, envs_per_collector=8, chunk_steps=128),
        replay=ReplayConfig(capacity=100_000, storage_device="cpu"),
        # credits: at most 2 unacknowledged chunks per collector, so gated collectors send fresh data (weight lag
        # 60-400 updates, was 1,300-2,500: BENCHMARKS.md#insert-gate)
        transport=TransportConfig(max_chunks_in_flight=2),
        learner=LearnerConfig(
            device="cpu",
            batch_size=RULE_BATCH,  # CPU updates cost ~24 ms at 32 (bf16); bigger batches starve collectors
            precision="auto",  # bf16 where the CPU has native bf16 kernels (AVX512-BF16/AMX), else fp32
            # compiled networks made 0.95x the eager updates/s after a 42 s cold compile (BENCHMARKS.md#cpu)
            compile_mode="off",
            # auto: one thread with bf16; in fp32 both cores, as the collectors wait on the slower learner: 8.84-8.90
            # against 7.50-7.74 updates/s (BENCHMARKS.md#design-measurements)
            torch_threads=0,
            # the captured step took 38% more CPU per update than eager bf16 at batch 32 (64.6 against 46.7 ms) and a
            # 2-3.5 minute cold compile (results/bench/learner_step_cpu_2026-11-25.json): eager stays
            step_mode="eager",
            warmup_transitions=5_000,  # ~40 s of collection at 130 env steps/s before the first update; not varied alone
            # the per-env-step rule; collectors wait once they lead it by 2,000 transitions, so the learner sets the
            # pace on 2 cores (BENCHMARKS.md#insert-gate)
            samples_per_insert=RULE_SAMPLES_PER_INSERT,
            max_insert_lead=2000,
            weight_broadcast_every=100,  # ~4 s at the CPU learner's ~25 updates/s; not varied alone
            # 100k frames: ~0.7 GB and a few seconds per checkpoint, so a run in segments (--resume) goes on
            # with the replay it had instead of refilling it (tests/test_resume.py)
            save_replay=True,
        ),
    )


def gpu_workstation_profile() -> Config:
    """8-16 cores and one consumer GPU (e.g. 24 GB): most cores collect, frames live on the GPU; the per-env-step rule."""
    return Config(
        collectors=CollectorConfig(count=10, envs_per_collector=16, chunk_steps=128),
        replay=ReplayConfig(capacity=1_000_000, storage_device="auto", gpu_memory_fraction=0.4),
        transport=TransportConfig(max_chunks_in_flight=2),  # gated collectors send fresh data (see cpu_profile)
        learner=LearnerConfig(
            device="cuda",
            batch_size=RULE_BATCH,
            grad_accum_steps=1,
            precision="auto",  # fp16 + GradScaler (bf16 where supported and asked for)
            # CUDA graphs: a DQN update is ~190 small kernels, so launches set the pace (H100: 181 against 111
            # updates/s at batch 512: docs/experiments/gpu.md, "GPU figures (one H100)")
            compile_mode="reduce-overhead",
            lr=2.5e-4,
            warmup_transitions=50_000,
            samples_per_insert=RULE_SAMPLES_PER_INSERT,
            max_insert_lead=GPU_INSERT_LEAD,
            weight_broadcast_every=200,
        ),
    )


# Collectors the gpu-server profile runs at most, by Mario backend. nes-py: 30, more than the H100 box's 14 that
# made ~1,430 env steps/s (~102 each), which the captured learner's 1,750 updates/s of batch 32 (one H200) hold at
# 0.25 updates per env step up to 7,000 env steps/s. retro: PROJECTION, not measured on a GPU box: a collector
# costs RETRO_COST_RATIO of nes-py's CPU per env step (shared/cpu_split.py, both on the 2-core VM), so ~102 /
# that ratio env steps/s each; the learner's 7,000 env steps/s then take ceil(7,000 / that) collectors, and
# more would only wait at the insert gate
GPU_LEARNER_ENV_STEPS_PER_S = 1_750 / (RULE_SAMPLES_PER_INSERT / RULE_BATCH)
GPU_NESPY_COLLECTOR_ENV_STEPS_PER_S = 102.0
RETRO_COST_RATIO = ENV_STEP_CPU_MS["retro"] / ENV_STEP_CPU_MS["nes-py"]
GPU_SERVER_MAX_COLLECTORS = {
    "nes-py": 30,
    "retro": math.ceil(GPU_LEARNER_ENV_STEPS_PER_S / (GPU_NESPY_COLLECTOR_ENV_STEPS_PER_S / RETRO_COST_RATIO)),
}


def gpu_server_profile(backend: str = "nes-py") -> Config:
    """16+ cores and an H100-class GPU: every core but two collects; the learner keeps the per-env-step rule.

    Measured (docs/experiments/gpu.md): 14 collectors make ~1,430 env steps/s on the H100 box, and holding 0.25 updates
    per env step there takes ~360 updates/s of batch 32. The eager learner is bound by kernel launches on the
    host (~110 updates/s at any batch), so the whole update runs as one CUDA graph (step_mode="captured":
    1,750 updates/s at batch 32 on one H200), which keeps 0.25 updates per env step at the full collection
    rate. Three runs of 3.7-6 minutes on one H200 trained with these values (docs/experiments/gpu.md, "Mario 1-1 on one
    H200"): 1,485-1,572 env steps/s, 0.28-0.29 updates per env step after the first update, evaluations
    (epsilon 0.05) at mean x_pos 1,239-1,321 by 172k-229k env steps, learning per env step as the CPU
    recipe does; no 20-minute run, so no time to the first greedy flag yet.
    """
    cores = os.cpu_count() or 1
    return Config(
        # two cores stay free: the learner's launch-bound main thread and the head's consolidation thread
        collectors=CollectorConfig(count=max(1, min(GPU_SERVER_MAX_COLLECTORS[backend], cores - 2)),
                                   envs_per_collector=32, chunk_steps=128),
        replay=ReplayConfig(capacity=2_000_000, storage_device="auto", gpu_memory_fraction=0.5),
        transport=TransportConfig(max_chunks_in_flight=2),  # gated collectors send fresh data (see cpu_profile)
        learner=LearnerConfig(
            device="cuda",
            batch_size=RULE_BATCH,
            grad_accum_steps=1,
            # bf16: no GradScaler; slower than fp16 where kernels bound the step (one H200: 648 against 965 updates/s
            # at batch 512), ahead of the rule's ~400 updates/s at batch 32 either way (docs/experiments/gpu.md)
            precision="bf16",
            # the whole update as one CUDA graph: 8-12x eager at batch 512 on one H200 (BENCHMARKS.md#gpu-h200); it needs the
            # frames on the GPU (2M frames, ~14 GiB) and compiles itself, so the networks are not compiled apart
            step_mode="captured",
            compile_mode="off",
            # the first convolution as 64 channels, which tensor cores tile: 1.15x the captured step at batch 512 on
            # one H200 (docs/experiments/gpu.md, "The first convolution as space-to-depth")
            space_to_depth="on",
            lr=2.5e-4,  # the CPU recipe's (Mario's preset sets it too)
            warmup_transitions=50_000,  # ~35 s of 14 collectors
            samples_per_insert=RULE_SAMPLES_PER_INSERT,
            max_insert_lead=GPU_INSERT_LEAD,
            weight_broadcast_every=200,  # ~0.5 s at the ~400 updates/s the rule takes at full collection
        ),
    )


def auto_profile(backend: str = "nes-py") -> Config:
    """Detect cores, memory and CUDA; start from the nearest profile and fit it to the machine and to the Mario
    emulator `backend` the run uses (a resolved one: nes-py or retro)."""
    cores = os.cpu_count() or 1
    gpu_bytes = _cuda_memory_bytes()
    if not gpu_bytes:
        # collectors and learner threads so neither side waits at the rule's ratio
        split = cpu_auto_split(cores, backend)
        base = cpu_profile()
        base = replace(base, learner=replace(base.learner, torch_threads=split.learner_threads))
        collectors = split.collectors
    elif cores >= 16 and gpu_bytes >= 40 * 2**30:  # a datacenter GPU (A100/H100 class) with the cores to feed it
        base = gpu_server_profile(backend)
        collectors = base.collectors.count
    else:
        base = gpu_workstation_profile()
        collectors = max(1, cores - 2)
    cfg = replace(base, collectors=replace(base.collectors, count=collectors))
    # Fit replay capacity into 40% of available memory (the check_valid limit is 80%).
    budget = 0.4 * available_memory_bytes()
    capacity = cfg.replay.capacity
    while capacity > 10_000 and estimate_replay_bytes(replace(cfg, replay=replace(cfg.replay, capacity=capacity))) > budget:
        capacity //= 2
    return replace(cfg, replay=replace(cfg.replay, capacity=capacity))


def cpu_auto_split(cores: int | None = None, backend: str = "nes-py") -> CpuSplit:
    """`auto`'s split of a CPU-only machine (shared/cpu_split.py) for the cpu profile's learner at the rule's ratio,
    collectors on the Mario emulator `backend` (nes-py or retro)."""
    try:
        import torch  # absent where only the config is checked (Python 3.13 CI)

        from learner.precision import resolve_precision

        precision = resolve_precision(cpu_profile().learner.precision, torch.device("cpu")).name
    except ImportError:
        precision = "fp32"
    ratio = RULE_SAMPLES_PER_INSERT / RULE_BATCH
    return split_cpu(measured_costs(cores or os.cpu_count() or 1, precision, ratio, backend))


def _cuda_memory_bytes() -> int:
    """Memory of CUDA device 0 in bytes; 0 without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(0).total_memory)


BACKEND_SIZED = (gpu_server_profile, auto_profile)  # the profiles whose collector counts follow the env step's cost
PROFILES = {
    "cpu": cpu_profile,
    "gpu-workstation": gpu_workstation_profile,
    "gpu-server": gpu_server_profile,
    "auto": auto_profile,
}


def load_profile(name: str = "auto", overrides: list[str] | tuple[str, ...] = (), backend: str = "nes-py") -> Config:
    """The hardware profile with `--set` overrides and NO env preset (unit tests, benches that pin values); `auto` and
    `gpu-server` are sized for Mario's emulator `backend` (nes-py or retro).

    A run's config comes from `load_config`; validation is the caller's next step.
    """
    if name not in PROFILES:
        raise ConfigError(f"--profile {name!r} is unknown: allowed one of {', '.join(PROFILES)}")
    profile = PROFILES[name]
    base = profile(backend) if profile in BACKEND_SIZED else profile()
    return base.with_overrides(list(overrides))


# ---------------------------------------------------------------- per-environment presets
# `section.field -> value` strings, exactly as `--set` takes them. `load_config` applies an env's
# preset over the hardware profile for every field the user did not set; a `--set` always wins.

# Mario: what 1-1 learns from on the 2-core CPU. Levers tried and left off (quantiles, noisy_sigma, resets,
# target_epsilon, eps_per=stream, explore_repeat_mu, the impala encoder): one row each with its verdict in
# docs/tuning.md; every trial in docs/experiments/levers.md.
MARIO_PRESET: dict[str, str] = {
    "env.action_set": "right_only",  # 5 actions, all moving right: exploration finds the pipes' jumps sooner
    # rewards are dx (~+5 a step running), -25 a death, +50 the flag: scaled to ~[-1.7, 3.3] so Q stays small
    "env.reward_scale": "0.0667",
    "replay.gamma": "0.9",  # ~10-step horizon: dense dx rewards need no more; 0.97 lost on 1-1 (docs/tuning.md)
    "learner.lr": "2.5e-4",  # the recipe 1-1 learned with; 1e-4 on 1-3 moved it within the noise (docs/tuning.md)
    "learner.target_update_every": "1000",  # ~40 s at CPU update rates
    # Munchausen targets (tau 0.03, clip -1): ahead of Double DQN on both of 2 seeds of the 200k proxy, no costlier
    # per update (docs/experiments/levers.md, "Per env step: the levers")
    "learner.munchausen_alpha": "0.9",
    # every stream at the evaluations' epsilon 0.05 from update 36,000 (~150k env steps): it lifted the median seed's
    # best evaluation and final network, for a later first flag (docs/experiments/seeds_1-1.md, "Robust 1-1 with an
    # epsilon-0.05 stage")
    "collectors.eps_stage_from": "36000",
    # checkpoints oscillate (flags 5/10 at 80 min, 1/10 at 90: docs/experiments/seeds_1-1.md): evaluate every 10
    # minutes and keep run/best/; on 2 cores an evaluation takes a few minutes of spare CPU
    "logging.eval_every_s": "600",
    # 10 episodes rank snapshots coarsely (a 1-3 best at 7/10 played 16/30, then 9/30: docs/experiments/world1.md):
    # keep the three next-best too (12.6 MB each) to choose what to ship by more episodes
    "logging.eval_keep": "4",
}

# Cheap envs want a small, fresh replay and a fast-reacting learner. Tuned on CartPole-v1 on the
# 2-core CPU box (`python -m experiments.cartpole_race`, BENCHMARKS.md#learning-cartpole-v1-through-the-whole-system).
CARTPOLE_PRESET: dict[str, str] = {
    "replay.capacity": "100000",  # holds the whole 100k-step budget: forgetting early failures destabilizes CartPole
    "learner.warmup_transitions": "1000",  # a few dozen random episodes are enough to start learning
    "collectors.chunk_steps": "32",  # short chunks: transitions reach the replay while still on-policy-ish
    "env.max_episode_steps": "500",
    "learner.hidden": "256",  # wide enough to learn centring the cart (the ~160-return drift plateau); still cheap
    "collectors.count": "2",  # two collectors give the Ape-X epsilon spread (0.1 and ~0) on two cores
    "collectors.envs_per_collector": "4",  # env steps are ~free; more envs only widen the data lag
    "collectors.eps_base": "0.1",  # CartPole needs little exploration; 0.4 keeps the measured return low
    "learner.lr": "1e-3",  # a tiny MLP tolerates a 10x larger step than the Atari-sized 1e-4
    # one update per 8 env steps, as with batch 128 / ratio 16, at ~60% of the cost per update: CartPole's
    # wall time is the learner's. Sync harness, 12 seeds: 24k-58k env steps to 475 (batch 128: 33k-81k)
    "learner.batch_size": "64",
    "learner.samples_per_insert": "8",  # sample efficiency: each transition is replayed ~8 times
    "learner.max_insert_lead": "1000",  # collectors outrun the learner on CartPole: make them wait (keeps the ratio)
    "learner.target_update_every": "50",  # short sync period: Q values propagate one n-step per sync
    "env.reward_scale": "0.1",  # Q ~10 instead of ~100: Adam climbs there in far fewer updates
    "learner.prefetch": "false",  # a 5 ms MLP update loses more to the GIL than it gains (195 vs 142 upd/s)
    "learner.weight_broadcast_every": "25",  # a 0.5 MB MLP is cheap to publish: fresher collector policies
    # credits: data lag 25 updates median against 100-300 with 4 KB TCP buffers; 16/17 runs solved against 1/3
    # (docs/history.md, 2026-11-21)
    "transport.max_chunks_in_flight": "2",
    # the learner's own thread rule: `auto`'s CPU split is sized by the Nature CNN's costs, a tiny MLP gains no threads
    "learner.torch_threads": "0",
}

# Any other non-Mario id (LunarLander-v3, MountainCar-v0, a registered custom env, ...): CartPole's
# measured values are the best guess we have, untested on those envs. Note env.max_episode_steps=500
# replaces the env's own time limit (MountainCar-v0 registers 200): `--set` it for such envs.
SMALL_ENV_PRESET: dict[str, str] = dict(CARTPOLE_PRESET)

# Acrobot-v1 (6 floats, 3 actions, -1 per step until the tip swings above the bar; its own 500-step
# limit is the preset's env.max_episode_steps). UNTESTED: no Acrobot run has been measured with these.
# Everything but eps_base is CartPole's by analogy (tiny MLP, cheap steps, the learner sets the pace;
# reward_scale 0.1 keeps Q ~ -10 instead of ~ -100).
ACROBOT_PRESET: dict[str, str] = {
    **SMALL_ENV_PRESET,
    # Untested: until the first swing-up every reward is -1, so a near-greedy untrained policy can go whole
    # episodes without reaching the goal; keep the Ape-X spread (0.4 ... ~0.0007 over 2 collectors)
    "collectors.eps_base": "0.4",
}

# Atari (every ALE/<Game>-v5 id): the DQN-standard values (Mnih et al. 2015; Ape-X, Horgan et al. 2018;
# Rainbow's Adam). UNTESTED for learning on this 2-core CPU: only a 3,000-step run is measured (the test
# suite); a Pong run that learns needs hours of CPU or a GPU. Hardware-sized fields (replay capacity, batch,
# warmup, collectors) stay the profile's.
ATARI_PRESET: dict[str, str] = {
    "env.frame_skip": "4",  # the standard skip: 15 decisions/s; Pong and Breakout need no finer control
    "env.frame_size": "84",  # 84x84 gray (Nature DQN): ~7 KiB a replay slot; smaller loses the ball in Pong
    "env.frame_stack": "4",  # 4 frames give the ball's velocity; more slows the CNN's first layer
    "env.noop_max": "30",  # up to 30 no-op frames at a reset: varied starts against a deterministic emulator
    "env.life_loss_terminal": "true",  # a lost life is terminal for learning: faster credit for deaths
    # clip to [-1, 1]: one learning rate across games whose scores differ by 1000x; loses reward magnitude
    # (Pong's +-1 unaffected). Episode returns are reported as the unclipped game score
    "env.clip_rewards": "true",
    "env.reward_scale": "1.0",  # clipped rewards are already O(1)
    "env.max_episode_steps": "27000",  # 108,000 frames = 30 min of play, ALE v5's own cap: bounds stuck games
    "replay.gamma": "0.99",  # ~100-step horizon: Atari rewards come seconds after the action that earned them
    "replay.n_step": "3",  # Ape-X/Rainbow: faster credit assignment for a little off-policy bias
    "learner.lr": "1e-4",  # Adam at batch 32 (CleanRL's Atari DQN); Rainbow's 6.25e-5 is stabler, slower
    "learner.adam_eps": "1.5e-4",  # Rainbow's: keeps small-gradient Adam steps from blowing up
    "learner.hidden": "512",  # the Nature head: 512 units over the CNN's 3,136 features
    "learner.target_update_every": "2500",  # Ape-X's period: stabler targets, slower propagation (~100 s on CPU)
    "collectors.eps_base": "0.4",  # Ape-X: epsilon_i = 0.4 ** (1 + 7 i / (N - 1)), a fixed spread per collector
    "collectors.eps_alpha": "7",
    "collectors.eps_decay_updates": "0",  # Ape-X's fixed epsilons: the spread explores, no anneal to wait for
}

# 1-3 (tree-tops over pits, moving lifts): gamma 0.97 passed the first tall tree-top, one epsilon per env stream
# the moving lift (ez-greedy was on then), and the epsilon-0.05 stage stays off (the lift needs the middle
# epsilons). One seed: docs/experiments/world1.md, "1-3 from scratch".
MARIO_1_3_PRESET: dict[str, str] = {
    **MARIO_PRESET,
    "replay.gamma": "0.97",
    "collectors.eps_per": "stream",
    "collectors.explore_repeat_mu": "2",
    "collectors.eps_stage_from": "0",
}

ENV_PRESETS: dict[str, dict[str, str]] = {
    "CartPole-v1": CARTPOLE_PRESET,
    "Acrobot-v1": ACROBOT_PRESET,
    "SuperMarioBros-1-3-v0": MARIO_1_3_PRESET,
}


def env_preset(env_id: str) -> dict[str, str]:
    """The preset for `env_id` (a copy): ENV_PRESETS by exact id, else Mario's for SuperMarioBros ids, Atari's
    for ALE/ ids, else SMALL_ENV_PRESET (any other Gymnasium id is taken to be a cheap vector env)."""
    if env_id in ENV_PRESETS:
        return dict(ENV_PRESETS[env_id])
    if is_mario(env_id):
        return dict(MARIO_PRESET)
    if is_atari(env_id):
        return dict(ATARI_PRESET)
    return dict(SMALL_ENV_PRESET)


def override_of(overrides: list[str] | tuple[str, ...], key: str, default: str) -> str:
    """The value `overrides` give `key` (section.field): the last assignment wins; `default` when there is none."""
    value = default
    for item in overrides:
        name, sep, given = item.partition("=")
        if sep and name.strip() == key:
            value = given.strip()
    return value


def env_id_of(overrides: list[str] | tuple[str, ...], default: str = MARIO_DEFAULT_ENV) -> str:
    """The env id `overrides` select: the last `env.env_id=` assignment wins; `default` when there is none."""
    return override_of(overrides, "env.env_id", default)


def backend_of(overrides: list[str] | tuple[str, ...], env_id: str) -> str:
    """The Mario emulator backend a run with `overrides` uses, resolved (auto: retro where installed); nes-py for
    any other env, whose collectors the profiles size by nes-py's measured costs. A backend that cannot run is
    left to the config's own check."""
    if not is_mario(env_id):
        return "nes-py"
    from envs.mario.backend import resolve_backend

    backend = override_of(overrides, "env.backend", Config().env.backend)
    try:
        return resolve_backend(backend)
    except ConfigError:
        return "nes-py"


def load_config(profile: str = "auto", overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A run's config: hardware profile, then the env's preset for every field not in `overrides`, then `overrides`.

    The env is the one `overrides` select (`env_id_of`), however the caller spelled it (the CLI's
    `--env X` is `env.env_id=X`). Validation is the caller's next step (`Config.check_valid`).
    """
    overrides = list(overrides)
    env_id = env_id_of(overrides, default=Config().env.env_id)
    base = load_profile(profile, backend=backend_of(overrides, env_id))
    given = {item.partition("=")[0].strip() for item in overrides}
    preset = env_preset(env_id)
    return base.with_overrides([f"{k}={v}" for k, v in preset.items() if k not in given] + overrides)


# The level campaign (`make levels`, evaluate/campaign.py): train each level until cleared, then ship it.
# Stop at 7 flags of 10 in two evaluations in a row: one 10-episode evaluation ranks coarsely (a 1-3 best at 7/10
# played 16/30, then 9/30: docs/experiments/world1.md); two in a row at 0.7 leave a margin over the 5/10 goal
CAMPAIGN_UNTIL_FLAGS = 0.7
CAMPAIGN_STOP_FLAG_EVALS = 2
# Choose the snapshot to ship and measure it on different episodes: 1-2's snapshot chosen by the suite's seeds
# played 20/30 there and 13/30, 10/30 on two other sets (docs/experiments/world1.md, "Every shipped World 1
# checkpoint over 90 episodes"). The head's evaluations play seeds 0, 1, 2, ...; these lie far above them
CAMPAIGN_SELECTION_SEEDS = (100, 101, 102)
CAMPAIGN_HELD_OUT_SEEDS = (1000, 1001, 1002)  # the Levels table's seeds, the same for every level
CAMPAIGN_EPISODES_PER_SEED = 10  # 3 seeds x 10: the suite's 30 episodes per level, as World 1's rows
CAMPAIGN_RANDOM_EPISODES = 20  # the random policy's row of a new level, as docs/random_policy_1-*.json were recorded
CAMPAIGN_GIF_EPISODES = 5  # the shipped GIF is the best of these at epsilon 0.05: a picture, not a figure
