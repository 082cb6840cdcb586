"""Typed, frozen configuration for every part of the system.

Both sides import this module: the head validates a `Config` before it allocates anything,
and sends the relevant sections to collectors as JSON when they register (never pickle).
Hardware profiles that fill these dataclasses live in the top-level `config_optimized.py`.

Every field carries a one-line comment saying what it trades. `Config.check_valid()` raises
`ConfigError` naming the field, the value and what is allowed (the rules: shared/config_checks.py,
and those that need to know the envs: envs/checks.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_type_hints

MARIO_DEFAULT_ENV = "SuperMarioBros-1-1-v0"
MARIO_PREFIX = "SuperMarioBros"
ATARI_PREFIX = "ALE/"  # ale-py's Gymnasium namespace: ALE/Pong-v5, ALE/Breakout-v5, ...
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
STEP_MODES = ("eager", "device", "captured")
SPACE_TO_DEPTH = ("auto", "on", "off")
DEVICES = ("auto", "cpu", "cuda")
STORAGE_DEVICES = ("auto", "cpu", "learner")
ENCODERS = ("nature", "impala")  # the image torsos of shared/network.py


def is_mario(env_id: str) -> bool:
    """Mario ids get the Mario wrapper, the Mario preset and config-only specs."""
    return env_id.startswith(MARIO_PREFIX)


def is_atari(env_id: str) -> bool:
    """ALE ids get the Atari preprocessing (envs/atari.py) and the Atari preset."""
    return isinstance(env_id, str) and env_id.startswith(ATARI_PREFIX)


class ConfigError(ValueError):
    """A configuration value is outside what is allowed; the message names field and value."""


@dataclass(frozen=True)
class EnvConfig:
    # any registered Gymnasium id; Mario ids get the Mario wrapper, ALE/ ids the Atari preprocessing, other
    # envs with (H, W, C) uint8 image observations grayscale + resize (all three take the CNN image path)
    env_id: str = MARIO_DEFAULT_ENV
    action_set: str = "simple"  # right_only (5) learns fastest, complex (12) can do more
    frame_skip: int = 4  # emulator frames per agent step (Mario, Atari): higher = faster, coarser control
    frame_size: int = 84  # square side of the grayscale observation: smaller = faster nets, less detail
    frame_stack: int = 4  # frames per network input for image envs (vector envs use 1)
    clip_rewards: bool = False  # clip rewards to [-1, 1]: stabler across games, loses magnitude
    # Rewards are multiplied by this before they are learned from (episode returns are reported
    # unscaled). Adam moves Q by roughly a fixed amount per update, so Q values of ~100 (CartPole's
    # +1 per step at gamma 0.99) take far longer to reach than ~1: scale them down for such envs.
    reward_scale: float = 1.0
    # Largest |reward| (after reward_scale) the head accepts; a chunk with a bigger one is rejected
    # (reward_out_of_range). 0: the env's own bound (envs/bounds.py: Mario's reward terms, 1 for
    # CartPole or clipped rewards, 1e6 for an env nothing is known of); a positive value replaces it.
    max_abs_reward: float = 0.0
    # Largest |value| of a float observation the head accepts (integer frames unchecked). 0: the env's own
    # bound (CartPole's physics, twice a declared finite Box bound, else 1e6); a positive value replaces it.
    max_abs_obs: float = 0.0
    # Life loss is terminal for learning: denser signal, shorter bootstrap chains. Mario ends the episode there;
    # Atari flags the transition terminal and plays on, so reported episodes are whole games
    life_loss_terminal: bool = True
    # Atari: a reset plays 1..noop_max random NOOP frames (0 = none): varied starts against a deterministic
    # emulator (less memorizing of one trajectory) for at most noop_max wasted frames per game
    noop_max: int = 30
    max_episode_steps: int = 4500  # time-limit truncation (agent steps): bounds stuck episodes
    # Mario's NES emulator (envs/mario/backend.py): "nes-py" (the package's), "retro" (stable-retro's FCEUmm
    # core, ~5x cheaper per frame, the optional install), "auto" (retro where installed, else nes-py). Not the
    # default: on the 200k proxy retro learned slower per env step than nes-py at the same commit (2 + 2 seeds,
    # docs/experiments/levers.md rows rt and np)
    backend: str = "nes-py"
    seed: int = 0  # base seed; each collector/env derives its own from it


@dataclass(frozen=True)
class CollectorConfig:
    count: int = 2  # local collector processes: one per spare core saturates the emulator
    envs_per_collector: int = 8  # K envs per collector: bigger batches for inference, more memory
    chunk_steps: int = 128  # new transitions per env per message: bigger = less overhead, more latency
    eps_base: float = 0.4  # Ape-X epsilon_i = eps_base ** (1 + eps_alpha * i / (N - 1))
    eps_alpha: float = 7.0  # spread of exploration across collectors
    # "collector": one Ape-X epsilon per collector for all its K envs (N values; what every measured run in
    # BENCHMARKS.md used); "stream": each env its own (N x K values, a finer spread, less data at each value).
    # Either way slots are head-assigned, so collectors joining from other machines never repeat an epsilon
    eps_per: str = "collector"
    # >0: every collector starts fully random and anneals linearly to its Ape-X epsilon over this many
    # learner updates (read from the weight version, so restarts and remote collectors agree); 0 = fixed
    eps_decay_updates: int = 0
    # >0: a second exploration stage: from this learner update (read from the weight version) every env stream acts
    # at eps_stage instead of its Ape-X epsilon, so the replay fills with the episodes an evaluation at that epsilon
    # plays (pair it with learner.target_epsilon and target_epsilon_from). 0 = no stage
    eps_stage_from: int = 0
    eps_stage: float = 0.05  # the epsilon of every stream from eps_stage_from on
    # >0: temporally extended epsilon-greedy (ez-greedy, Dabney et al. 2021): an exploratory step holds its random
    # action for n steps, P(n) ~ n ** -mu (the paper's mu = 2), n <= explore_repeat_max; 0 = plain epsilon-greedy.
    # Tries behaviours one-step exploration almost never does (a jump held long enough to climb a high step)
    explore_repeat_mu: float = 0.0
    explore_repeat_max: int = 100  # the longest hold, in agent steps (the zeta tail is heavy: n can be huge)
    heartbeat_s: float = 1.0  # heartbeat period: lower = faster stall detection, more messages
    send_hwm: int = 16  # ZeroMQ high-water mark (messages) before a slow learner blocks the collector
    torch_threads: int = 1  # torch threads per collector; >1 fights the emulator for cores


@dataclass(frozen=True)
class ReplayConfig:
    capacity: int = 100_000  # frame slots (~transitions): more = more diverse data, more memory
    n_step: int = 3  # n-step return horizon: faster credit assignment, more off-policy bias
    gamma: float = 0.99  # discount: longer horizon vs. variance
    prioritized: bool = True  # PER (Ape-X) vs. uniform sampling
    alpha: float = 0.6  # priority exponent: 0 = uniform, 1 = fully greedy on |TD|
    beta_start: float = 0.4  # importance-weight exponent at start, annealed to 1
    beta_steps: int = 200_000  # learner updates to anneal beta to 1
    priority_eps: float = 1e-6  # added to |TD| so no transition starves
    storage_device: str = "auto"  # where frames live: learner (GPU gather), cpu, or auto (GPU if it fits)
    gpu_memory_fraction: float = 0.5  # max share of GPU memory frames may take when storage is on GPU


@dataclass(frozen=True)
class LearnerConfig:
    device: str = "auto"  # auto picks cuda when available
    batch_size: int = 32  # micro-batch size per forward/backward
    grad_accum_steps: int = 1  # micro-batches per optimizer step: effective batch = batch_size x this
    lr: float = 1e-4  # Adam learning rate
    adam_eps: float = 1.5e-4  # Adam epsilon (Rainbow/Ape-X value): stabilizes small-gradient steps
    # AdamW's decoupled weight decay (Loshchilov and Hutter 2019): every update shrinks each weight by lr x this
    # before Adam's step, in every learner.step_mode (learner/step.py); BBF uses 0.1. 0 = plain Adam
    weight_decay: float = 0.0
    max_grad_norm: float = 10.0  # gradient clipping by global norm
    target_update_every: int = 2000  # hard target sync period in updates (ignored with polyak)
    polyak_tau: float = 0.0  # >0 switches to soft target updates with this rate
    double_q: bool = True  # Double DQN action selection (ignored with Munchausen: its soft bootstrap has no argmax)
    # Munchausen DQN (Vieillard et al. 2020): targets add alpha * clip(tau * log pi(a|s), clip, 0) and bootstrap
    # the entropy-regularized value of pi = softmax(Q_target / tau). 0 = off (plain Double DQN); paper: 0.9
    munchausen_alpha: float = 0.0
    munchausen_tau: float = 0.03  # Munchausen entropy temperature: higher = softer policy, larger bonus magnitudes
    munchausen_clip: float = -1.0  # Munchausen l0: lower bound of tau * log pi in the bonus (bounds it as pi -> 0)
    # The bootstrap values the epsilon-greedy policy with this epsilon instead of the greedy one (Expected SARSA
    # toward what the evaluations play, epsilon 0.05): routes where one random action is fatal score lower.
    # 0 = off (the greedy bootstrap); not with quantiles
    target_epsilon: float = 0.0
    target_epsilon_from: int = 0  # the first learner update whose bootstrap uses target_epsilon (0: every update)
    # QR-DQN (Dabney et al. 2017): the head outputs this many quantiles of the return per action, trained with the
    # quantile Huber loss; acting and the bootstrap action use their mean. 0 = off (one value per action); paper 200
    quantiles: int = 0
    # NoisyNet exploration (Fortunato et al. 2018): the head's linear layers get learned, factorized Gaussian weight
    # noise of this initial sigma0 (paper 0.5), drawn anew for every update and every collector step; evaluation
    # acts with the mean weights. Collectors' epsilons still apply (set them low to explore by noise alone). 0 = off
    noisy_sigma: float = 0.0
    # Periodic resets (Nikishin et al. 2022; BBF): every this many updates re-initialize part of the online
    # network against primacy bias (0 = off); costs nothing between resets, relearning after each
    reset_every_updates: int = 0
    # Random-shift augmentation (DrQ; learner/augment.py): the learner trains on frames moved by up to this many
    # pixels (border repeated), an independent shift for each observation and next observation; collectors and
    # evaluations see the frames unshifted. Image observations only; DrQ uses 4 on 84x84. 0 = off
    augment_shift: int = 0
    reset_head: bool = True  # a reset re-initializes the dueling head's layers (else they shrink-perturb too)
    shrink_perturb: float = 1.0  # torso <- this x torso + (1 - this) x fresh init at a reset: 1 = untouched, BBF 0.5
    dueling: bool = True  # dueling value/advantage head
    hidden: int = 512  # width of the head's hidden layer
    encoder: str = "nature"  # image torso: nature (3 convs) or impala (3 residual stages): more capacity, costlier updates
    encoder_width: int = 1  # impala channel multiplier (16, 32, 32) x this: capacity vs update cost; 1 for nature
    precision: str = "auto"  # auto: bf16 on CPU, fp16 (or bf16) on CUDA
    compile_mode: str = "off"  # torch.compile mode; off avoids compile time on small machines
    # How an update runs. eager: replay sampled on the host (prefetch thread), networks per compile_mode.
    # device: the whole update (prioritized draw, stacks, loss, backward, clip, Adam, priorities, target)
    # as tensor ops on the learner's device, no host sync. captured: the same step compiled with
    # fullgraph=True and, on CUDA, replayed as one CUDA graph per update (learner/device_runner.py).
    # device/captured need compile_mode=off and the replay frames on the learner's device.
    step_mode: str = "eager"
    # captured only: let inductor time its kernel choices for the step's convolutions and matmuls
    # (max-autotune, without its own CUDA graphs: the runner records one): a longer compile for
    # perhaps faster kernels where the GPU, not the host, bounds the update
    step_autotune: bool = False
    # The Nature torso's first convolution (8x8, stride 4, over 4 frames) computed as a 2x2 one over 64 channels
    # (each 4x4 pixel block as channels): the same function and parameters, but GPU tensor cores take 64 input
    # channels where 4 left them to slow fallback kernels. auto: on with CUDA, off on the CPU (the learner only)
    space_to_depth: str = "auto"
    warmup_transitions: int = 5_000  # replay size before learning starts
    # A run dir or checkpoint dir whose online network this run starts from (online and target both; the
    # optimizer, counters and replay start fresh): fine-tuning, e.g. one level's network on another. "" =
    # freshly initialized weights. A resumed run keeps its own weights.
    init_from: str = ""
    samples_per_insert: float = 4.0  # replay ratio target: sampled transitions per inserted one (0 = unlimited)
    max_insert_lead: int = 0  # collectors may run this many transitions ahead of the ratio, then wait (0 = never wait, Ape-X)
    weight_broadcast_every: int = 100  # publish weights to collectors every M updates
    checkpoint_every_s: float = 600.0  # periodic checkpoint interval in seconds
    save_replay: bool = False  # include the replay buffer in checkpoints (large)
    prefetch: bool = True  # sample the next batch in a background thread while training
    # torch intra-op threads for a CPU learner; 0 = auto: 1 with bf16, 2 in fp32 (learner/precision.py)
    torch_threads: int = 1


@dataclass(frozen=True)
class TransportConfig:
    bind: str = "127.0.0.1"  # address the head binds; anything but loopback requires CURVE keys
    port: int = 5555  # control (registration) port; weights use port+1, data sockets free ports; 0 = all free
    # How collectors on the head's machine send: tcp (loopback) or ipc (unix sockets, a few % faster in the
    # transport bench, nothing end to end). libzmq aborts the whole process when an ipc accept() meets the
    # open-file limit (EMFILE), which any burst of TCP connections to the head can cause; TCP rides it out.
    local_transport: str = "tcp"
    curve_keys_dir: str = ""  # directory with server/client keys; empty = no encryption (loopback only)
    recv_hwm: int = 64  # receive high-water mark per collector socket (messages)
    # Kernel send/receive buffer of each TCP data socket in bytes (0 = OS default). ZeroMQ applies it to
    # TCP only (an ipc socket keeps ~130 KB). Small values bound the data in flight, i.e. how stale it is
    # when the insert gate holds collectors back: with CartPole-sized chunks (~1 KB) the OS default queues
    # ~3,400 chunks per TCP collector, 4096 queues ~20; Mario chunks (~270 KB) need no tuning.
    socket_buffer_bytes: int = 0
    # Credit-based flow control: a collector sends a chunk only while fewer than this many of its chunks
    # are unacknowledged (the head sends CREDIT on the data socket as it reads). 0 = off (Ape-X: the HWMs
    # and kernel buffers alone bound the queue). Unlike byte buffers it bounds staleness exactly: data in
    # flight <= (max_chunks_in_flight + envs_per_collector) * chunk_steps transitions per collector.
    max_chunks_in_flight: int = 0
    head_timeout_s: float = 10.0  # collectors take a head silent this long for gone: remote ones rejoin, the head's own exit
    stall_timeout_s: float = 30.0  # head restarts a collector silent this long
    # Memory the head may hold above what it held at start and its replay's full size, in MiB, before it closes
    # every TCP connection (ingest/memory_guard.py: a message whose frames never end grows memory under any
    # frame limit); 0 = off
    memory_margin_mb: int = 1024


@dataclass(frozen=True)
class LoggingConfig:
    run_dir: str = ""  # empty = runs/<timestamp>
    interval_s: float = 10.0  # progress/metrics line period
    tensorboard: bool = True  # write TensorBoard scalars (when tensorboard is installed)
    episode_window: int = 20  # episodes averaged in the progress line
    # Periodic evaluation: every eval_every_s the head snapshots the online weights and plays eval_episodes in
    # a separate low-priority process at eval_epsilon; run/evals.jsonl gets the result and run/best/ the best
    # snapshot (flag rate, then mean x_pos / return). Costs ~1-2 min of one core per evaluation on Mario;
    # 0 = off. Checkpoints of a DQN run oscillate: the last one is not the best one.
    eval_every_s: float = 0.0
    eval_episodes: int = 10
    eval_epsilon: float = 0.05  # the usual DQN evaluation epsilon: a greedy policy can loop forever
    # Snapshots kept: best/ and the eval_keep - 1 next-best in run/kept/<updates>/, to choose what to ship by
    # more episodes than eval_episodes afterwards (evaluate.suite over them); 1 = best/ only
    eval_keep: int = 1
    # Train until cleared: stop once stop_flag_evals evaluations in a row (resumed ones count) reach this flag rate,
    # with the final checkpoint written (`--until-flags RATE`); needs eval_every_s > 0 and a Mario env; 0 = off
    stop_flag_rate: float = 0.0
    stop_flag_evals: int = 1


@dataclass(frozen=True)
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    collectors: CollectorConfig = field(default_factory=CollectorConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    # ------------------------------------------------------------------ validation
    def check_valid(self, available_bytes: int | None = None) -> Config:
        """Raise ConfigError for the first bad field; return self so calls chain."""
        from envs.checks import check_config  # the env-aware entry to shared/config_checks.py (no cycle at import)

        check_config(self, available_bytes)
        return self

    # ------------------------------------------------------------------ overrides
    def with_overrides(self, assignments: list[str] | tuple[str, ...]) -> Config:
        """Apply `section.field=value` strings (the CLI's --set), typed from the dataclass."""
        cfg = self
        for item in assignments:
            key, sep, raw = item.partition("=")
            if not sep:
                raise ConfigError(f"--set {item!r}: expected section.field=value")
            section_name, dot, field_name = key.strip().partition(".")
            if not dot or section_name not in _section_names():
                raise ConfigError(
                    f"--set {item!r}: unknown section {section_name!r}; allowed: {', '.join(_section_names())}"
                )
            section = getattr(cfg, section_name)
            hints = get_type_hints(type(section))
            if field_name not in hints:
                allowed = ", ".join(f.name for f in fields(section))
                raise ConfigError(f"--set {item!r}: unknown field {key!r}; allowed in {section_name}: {allowed}")
            value = _parse_value(key, raw.strip(), hints[field_name])
            cfg = replace(cfg, **{section_name: replace(section, **{field_name: value})})
        return cfg

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Config:
        """Rebuild from `to_dict()` output; unknown keys are an error (they mean a version mismatch)."""
        kwargs = {}
        for f in fields(cls):
            section_cls = get_type_hints(cls)[f.name]
            section_data = dict(data.get(f.name, {}))
            known = {sf.name for sf in fields(section_cls)}
            unknown = set(section_data) - known
            if unknown:
                raise ConfigError(f"config section {f.name!r} has unknown fields: {sorted(unknown)}")
            kwargs[f.name] = section_cls(**section_data)
        return cls(**kwargs)


def _section_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Config))


def _parse_value(key: str, raw: str, typ: Any) -> Any:
    try:
        if typ is bool:
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ is int:
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                as_float = float(raw)  # accepts 1e5
                if not as_float.is_integer():
                    raise
                return int(as_float)
        if typ is float:
            return float(raw)
        return raw
    except ValueError:
        raise ConfigError(f"{key}={raw!r}: expected a value of type {getattr(typ, '__name__', typ)}") from None


# ---------------------------------------------------------------------- checks
