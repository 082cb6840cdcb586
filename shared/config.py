"""Typed, frozen configuration for every part of the system.

Both sides import this module: the head validates a `Config` before it allocates anything,
and sends the relevant sections to collectors as JSON when they register (never pickle).
Hardware profiles that fill these dataclasses live in the top-level `config_optimized.py`.

Every field carries a one-line comment saying what it trades. `Config.check_valid()` raises
`ConfigError` naming the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_type_hints

from shared.mario_actions import ACTION_LISTS  # a plain table: no emulator, no torch
from shared.sizes import available_memory_bytes, next_pow2

MARIO_DEFAULT_ENV = "SuperMarioBros-1-1-v0"
MARIO_PREFIX = "SuperMarioBros"
ATARI_PREFIX = "ALE/"  # ale-py's Gymnasium namespace: ALE/Pong-v5, ALE/Breakout-v5, ...
ACTION_SETS = tuple(ACTION_LISTS)  # right_only, simple, complex (shared/mario_actions.py)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
DEVICES = ("auto", "cpu", "cuda")
STORAGE_DEVICES = ("auto", "cpu", "learner")


def is_mario(env_id: str) -> bool:
    """Mario ids get the Mario wrapper, the Mario preset and config-only specs."""
    return env_id.startswith(MARIO_PREFIX)


def is_atari(env_id: str) -> bool:
    """ALE ids get the Atari preprocessing (shared/atari_env.py) and the Atari preset."""
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
    # (reward_out_of_range). Keeps n-step returns, TD errors and priorities finite (|R_n| <= 64x this):
    # higher admits envs with huge rewards, lower catches a broken collector sooner.
    max_abs_reward: float = 1e6
    max_abs_obs: float = 1e6  # largest |value| of a float observation the head accepts (integer frames unchecked)
    # Life loss is terminal for learning: denser signal, shorter bootstrap chains. Mario ends the episode there;
    # Atari flags the transition terminal and plays on, so reported episodes are whole games
    life_loss_terminal: bool = True
    # Atari: a reset plays 1..noop_max random NOOP frames (0 = none): varied starts against a deterministic
    # emulator (less memorizing of one trajectory) for at most noop_max wasted frames per game
    noop_max: int = 30
    max_episode_steps: int = 4500  # time-limit truncation (agent steps): bounds stuck episodes
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
    max_grad_norm: float = 10.0  # gradient clipping by global norm
    target_update_every: int = 2000  # hard target sync period in updates (ignored with polyak)
    polyak_tau: float = 0.0  # >0 switches to soft target updates with this rate
    double_q: bool = True  # Double DQN action selection
    dueling: bool = True  # dueling value/advantage head
    hidden: int = 512  # width of the head's hidden layer
    precision: str = "auto"  # auto: bf16 on CPU, fp16 (or bf16) on CUDA
    compile_mode: str = "off"  # torch.compile mode; off avoids compile time on small machines
    warmup_transitions: int = 5_000  # replay size before learning starts
    samples_per_insert: float = 4.0  # replay ratio target: sampled transitions per inserted one (0 = unlimited)
    max_insert_lead: int = 0  # collectors may run this many transitions ahead of the ratio, then wait (0 = never wait, Ape-X)
    weight_broadcast_every: int = 100  # publish weights to collectors every M updates
    checkpoint_every_s: float = 600.0  # periodic checkpoint interval in seconds
    save_replay: bool = False  # include the replay buffer in checkpoints (large)
    prefetch: bool = True  # sample the next batch in a background thread while training
    torch_threads: int = 1  # torch intra-op threads for the learner on CPU


@dataclass(frozen=True)
class TransportConfig:
    bind: str = "127.0.0.1"  # address the head binds; anything but loopback requires CURVE keys
    port: int = 5555  # control (registration) port; weights use port+1, data sockets free ports; 0 = all free
    local_transport: str = "ipc"  # ipc (fastest locally) or tcp for local collectors
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
    head_timeout_s: float = 10.0  # collectors exit when the head is silent this long
    stall_timeout_s: float = 30.0  # head restarts a collector silent this long


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
        _check_all(self, available_bytes)
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
def _fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{name}={value!r} is invalid: allowed {allowed}")


def _int_range(name: str, value: int, lo: int, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        _fail(name, value, f"an integer in [{lo}, {hi if hi is not None else 'inf'}]")


def _float_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)  # NaN, inf fail
    ok = ok and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        _fail(name, value, f"a number in {'(' if lo_open else '['}{lo}, {hi}]")


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(name, value, "one of " + ", ".join(choices))


def estimate_replay_bytes(cfg: Config, obs_bytes: int | None = None) -> int:
    """Bytes the replay buffer will allocate: one frame per slot plus per-slot metadata."""
    if obs_bytes is None:
        obs_bytes = cfg.env.frame_size * cfg.env.frame_size  # uint8 grayscale frame
    per_slot_metadata = 8 * 6  # indices, return, discount, action, priority leaf (see replay.storage)
    tree_bytes = 2 * 8 * next_pow2(cfg.replay.capacity)
    return cfg.replay.capacity * (obs_bytes + per_slot_metadata) + tree_bytes


# Parameter-sized buffers, in fp32 copies of the Q-network. The learner: online, target, gradients,
# Adam's two moments, autocast's low-precision weight casts and the publisher's CPU snapshot (a CPU
# bf16 update of a Mario net with hidden=8192 measured 7.7 copies of peak RSS). Each collector: its
# network, the received weights message and the decoded tensors.
LEARNER_NETWORK_COPIES = 8
COLLECTOR_NETWORK_COPIES = 3
NATURE_CNN_MIN_SIDE = 36  # smallest frame side the Nature CNN's three convolutions leave features for


def _nature_cnn_side(side: int) -> int:
    """Output side of shared/network.py NatureCNN (kernels 8/4/3, strides 4/2/1) for one input side."""
    side = (side - 8) // 4 + 1
    side = (side - 4) // 2 + 1
    return side - 2


def estimate_network_params(
    cfg: Config,
    obs_shape: tuple[int, ...] | None = None,
    stack: int | None = None,
    num_actions: int | None = None,
) -> int:
    """Parameter count of shared/network.py `build_q_network` for this config, by arithmetic (no torch).

    `obs_shape` is one observation's shape ((H, W) frames, (D,) vectors). None: Mario ids use
    (frame_size, frame_size) x frame_stack; other envs an unknown vector whose input layer is not
    counted (a lower bound: the hidden x hidden layers dominate wide networks).
    """
    e, hidden = cfg.env, cfg.learner.hidden
    from_config = obs_shape is None and isinstance(e.env_id, str) and is_mario(e.env_id)
    if from_config:
        obs_shape = (e.frame_size, e.frame_size)
    if num_actions is None and from_config:
        num_actions = len(ACTION_LISTS.get(e.action_set, ACTION_LISTS["complex"]))
    elif num_actions is None:
        num_actions = 1  # unknown: the fewest there can be (a lower bound)
    if obs_shape is None:
        torso, features = hidden, hidden  # bias only: the input width is unknown here
    elif len(obs_shape) == 2:
        stack = e.frame_stack if stack is None else stack
        side_h, side_w = _nature_cnn_side(int(obs_shape[0])), _nature_cnn_side(int(obs_shape[1]))
        if side_h < 1 or side_w < 1:
            if from_config:
                _fail("env.frame_size", e.frame_size, f"an integer in [{NATURE_CNN_MIN_SIDE}, 256] "
                      "(smaller frames leave the Nature CNN no features)")
            raise ConfigError(f"env {e.env_id!r}: {obs_shape[0]}x{obs_shape[1]} observations are too small for "
                              f"the Nature CNN (needs at least {NATURE_CNN_MIN_SIDE}x{NATURE_CNN_MIN_SIDE})")
        torso = (stack * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64)
        features = 64 * side_h * side_w
    else:
        flat = 1 if stack is None else stack
        for dim in obs_shape:
            flat *= int(dim)
        torso, features = flat * hidden + hidden, hidden
    advantage = features * hidden + hidden + hidden * num_actions + num_actions
    value = features * hidden + hidden + hidden + 1 if cfg.learner.dueling else 0
    return torso + advantage + value


def estimate_network_bytes(
    cfg: Config,
    obs_shape: tuple[int, ...] | None = None,
    stack: int | None = None,
    num_actions: int | None = None,
) -> int:
    """Bytes of all parameter-sized buffers: LEARNER_NETWORK_COPIES plus COLLECTOR_NETWORK_COPIES per local collector."""
    params = estimate_network_params(cfg, obs_shape, stack, num_actions)
    return 4 * params * _network_copies(cfg)


def _network_copies(cfg: Config) -> int:
    return LEARNER_NETWORK_COPIES + COLLECTOR_NETWORK_COPIES * cfg.collectors.count


def _check_all(cfg: Config, available_bytes: int | None) -> None:
    e, c, r, lrn, t, lg = cfg.env, cfg.collectors, cfg.replay, cfg.learner, cfg.transport, cfg.logging
    if not isinstance(e.env_id, str) or not e.env_id.strip():
        _fail("env.env_id", e.env_id, "a registered Gymnasium id such as SuperMarioBros-1-1-v0 or CartPole-v1")
    _choice("env.action_set", e.action_set, ACTION_SETS)
    _int_range("env.frame_skip", e.frame_skip, 1, 16)
    _float_range("env.reward_scale", e.reward_scale, 0.0, 1e6, lo_open=True)
    _float_range("env.max_abs_reward", e.max_abs_reward, 0.0, 1e30, lo_open=True)  # 64 x 1e30 << float32 max
    _float_range("env.max_abs_obs", e.max_abs_obs, 0.0, 1e30, lo_open=True)
    _int_range("env.frame_size", e.frame_size, 16, 256)
    _int_range("env.frame_stack", e.frame_stack, 1, 16)
    _int_range("env.max_episode_steps", e.max_episode_steps, 1)
    _int_range("env.noop_max", e.noop_max, 0, 1000)
    _int_range("env.seed", e.seed, 0, 2**31 - 1)

    _int_range("collectors.count", c.count, 0, 1024)
    _int_range("collectors.envs_per_collector", c.envs_per_collector, 1, 1024)
    _int_range("collectors.chunk_steps", c.chunk_steps, 1, 4096)
    _float_range("collectors.eps_base", c.eps_base, 0.0, 1.0)
    _float_range("collectors.eps_alpha", c.eps_alpha, 0.0, 100.0)
    _choice("collectors.eps_per", c.eps_per, ("stream", "collector"))
    _int_range("collectors.eps_decay_updates", c.eps_decay_updates, 0)
    _float_range("collectors.heartbeat_s", c.heartbeat_s, 0.0, 60.0, lo_open=True)
    _int_range("collectors.send_hwm", c.send_hwm, 1, 100_000)
    _int_range("collectors.torch_threads", c.torch_threads, 1, 256)

    _int_range("replay.n_step", r.n_step, 1, 64)
    min_capacity = 4 * (c.chunk_steps + e.frame_stack + r.n_step + 8)
    _int_range("replay.capacity", r.capacity, min_capacity, 2**31 - 1)
    _float_range("replay.gamma", r.gamma, 0.0, 1.0)
    _float_range("replay.alpha", r.alpha, 0.0, 1.0)
    _float_range("replay.beta_start", r.beta_start, 0.0, 1.0)
    _int_range("replay.beta_steps", r.beta_steps, 1)
    _float_range("replay.priority_eps", r.priority_eps, 0.0, 1.0, lo_open=True)
    _choice("replay.storage_device", r.storage_device, STORAGE_DEVICES)
    _float_range("replay.gpu_memory_fraction", r.gpu_memory_fraction, 0.0, 0.95, lo_open=True)

    _choice("learner.device", lrn.device, DEVICES)
    _int_range("learner.batch_size", lrn.batch_size, 1, 65536)
    _int_range("learner.grad_accum_steps", lrn.grad_accum_steps, 1, 1024)
    _float_range("learner.lr", lrn.lr, 0.0, 1.0, lo_open=True)
    _float_range("learner.adam_eps", lrn.adam_eps, 0.0, 1.0, lo_open=True)
    _float_range("learner.max_grad_norm", lrn.max_grad_norm, 0.0, 1e6, lo_open=True)
    _int_range("learner.target_update_every", lrn.target_update_every, 1)
    _float_range("learner.polyak_tau", lrn.polyak_tau, 0.0, 1.0)
    _int_range("learner.hidden", lrn.hidden, 1, 65536)
    _choice("learner.precision", lrn.precision, PRECISIONS)
    _choice("learner.compile_mode", lrn.compile_mode, COMPILE_MODES)
    _int_range("learner.warmup_transitions", lrn.warmup_transitions, 0)
    if lrn.warmup_transitions > r.capacity:
        _fail("learner.warmup_transitions", lrn.warmup_transitions, f"at most replay.capacity ({r.capacity})")
    _float_range("learner.samples_per_insert", lrn.samples_per_insert, 0.0, 1e6)
    _int_range("learner.max_insert_lead", lrn.max_insert_lead, 0)
    _int_range("learner.weight_broadcast_every", lrn.weight_broadcast_every, 1)
    _float_range("learner.checkpoint_every_s", lrn.checkpoint_every_s, 0.0, 1e9, lo_open=True)
    _int_range("learner.torch_threads", lrn.torch_threads, 1, 256)

    if not isinstance(t.bind, str) or not t.bind:
        _fail("transport.bind", t.bind, "an IPv4 address such as 127.0.0.1 or 0.0.0.0")
    if ":" in t.bind:  # the head's sockets do not set zmq.IPV6, so an IPv6 bind fails with "No such device"
        _fail("transport.bind", t.bind, "an IPv4 address or localhost (IPv6 is not enabled on the head's "
              "ZeroMQ sockets; for loopback use 127.0.0.1)")
    if t.bind != "localhost" and not _is_ipv4(t.bind):  # names make zmq resolve them: it can hang for minutes
        _fail("transport.bind", t.bind, "an IPv4 address such as 127.0.0.1 or 0.0.0.0, or localhost "
              "(not a host or interface name)")
    if t.bind not in ("127.0.0.1", "localhost") and not t.curve_keys_dir:
        _fail("transport.bind", t.bind, "127.0.0.1 unless transport.curve_keys_dir names CURVE keys (make keys)")
    if t.port != 0:  # 0 = pick free ports (tests, benchmarks, several heads on one machine)
        _int_range("transport.port", t.port, 1024, 65000)
    _choice("transport.local_transport", t.local_transport, ("ipc", "tcp"))
    _int_range("transport.socket_buffer_bytes", t.socket_buffer_bytes, 0, 1 << 30)
    _int_range("transport.recv_hwm", t.recv_hwm, 1, 100_000)
    _int_range("transport.max_chunks_in_flight", t.max_chunks_in_flight, 0, 100_000)
    _float_range("transport.head_timeout_s", t.head_timeout_s, 0.0, 3600.0, lo_open=True)
    if c.heartbeat_s > t.head_timeout_s / 2:  # both sides take a silence of head_timeout_s for death
        _fail("collectors.heartbeat_s", c.heartbeat_s,
              f"at most half of transport.head_timeout_s ({t.head_timeout_s}): heartbeats say a peer is alive")
    _float_range("transport.stall_timeout_s", t.stall_timeout_s, 0.0, 3600.0, lo_open=True)

    _float_range("logging.interval_s", lg.interval_s, 0.0, 86400.0, lo_open=True)
    _int_range("logging.episode_window", lg.episode_window, 1, 100_000)
    _float_range("logging.eval_every_s", lg.eval_every_s, 0.0, 1e9)
    _int_range("logging.eval_episodes", lg.eval_episodes, 1, 10_000)
    _float_range("logging.eval_epsilon", lg.eval_epsilon, 0.0, 1.0)

    check_memory(cfg, available_bytes)


def check_memory(
    cfg: Config,
    available_bytes: int | None = None,
    obs_shape: tuple[int, ...] | None = None,
    obs_bytes: int | None = None,
    stack: int | None = None,
    num_actions: int | None = None,
) -> None:
    """Refuse a config whose replay plus networks would not fit in 80% of available memory.

    Without the env geometry (obs_shape etc., known once the env is inspected) Mario ids use
    their frame geometry and other envs lower bounds; the CLI calls this again with the real one.
    """
    r = cfg.replay
    needed = estimate_replay_bytes(cfg, obs_bytes)
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if needed > 0.8 * available:
        raise ConfigError(
            f"replay.capacity={r.capacity} needs about {needed} bytes ({needed / 2**30:.2f} GiB) "
            f"but only {available} bytes ({available / 2**30:.2f} GiB) are available; "
            f"allowed: a capacity whose estimate stays under 80% of available memory"
        )
    params = estimate_network_params(cfg, obs_shape, stack, num_actions)
    net = estimate_network_bytes(cfg, obs_shape, stack, num_actions)
    if needed + net > 0.8 * available:
        raise ConfigError(
            f"learner.hidden={cfg.learner.hidden} makes a Q-network of {params:,} parameters "
            f"({4 * params / 2**30:.2f} GiB in fp32); {_network_copies(cfg)} copies of it ({LEARNER_NETWORK_COPIES} "
            f"in the learner, {COLLECTOR_NETWORK_COPIES} per local collector with collectors.count="
            f"{cfg.collectors.count}) need about {net} bytes ({net / 2**30:.2f} GiB), plus {needed / 2**30:.2f} GiB "
            f"of replay, but only {available} bytes ({available / 2**30:.2f} GiB) are available; allowed: a "
            f"learner.hidden (or collectors.count) whose estimate stays under 80% of available memory"
        )
