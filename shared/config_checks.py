"""The rules a `Config` must satisfy, and the memory estimates behind the capacity checks.

`Config.check_valid()` calls `check_all` (through envs/checks.py `check_config`); a collector calls
`check_welcome` (through envs/checks.py's) on the part of a config a head's WELCOME carries. Every failure
is a `ConfigError` naming the field, the value and what is allowed. `check_memory` is called again by the
CLI with the env's EnvSpec (envs/spec.py) once the env has been inspected.

This module imports no env module: the rules that need to know the envs (the env section with its action
sets and backends, the spec a config alone implies) live beside EnvSpec in envs/checks.py, which hands
them in as `EnvRules`. A spec here is anything with EnvSpec's fields (`EnvShape`).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shared.config import (
    COMPILE_MODES,
    DEVICES,
    ENCODERS,
    PRECISIONS,
    SPACE_TO_DEPTH,
    STEP_MODES,
    STORAGE_DEVICES,
    CollectorConfig,
    Config,
    ConfigError,
    EnvConfig,
    LearnerConfig,
    TransportConfig,
    is_mario,
)
from shared.sizes import available_memory_bytes, next_pow2
from shared.values import is_finite_number, is_int


class EnvShape(Protocol):
    """What the rules read of an env's spec (envs/spec.py EnvSpec)."""

    obs_shape: tuple[int, ...]
    num_actions: int
    stack: int

    @property
    def image(self) -> bool: ...

    @property
    def frame_bytes(self) -> int: ...


@dataclass(frozen=True)
class EnvRules:
    """What the rules need to know of the envs, handed in by envs/checks.py (`ENV_RULES`, its one instance)."""

    check_env: Callable[[EnvConfig], None]  # the env section's rules (its action sets and backends are the envs')
    # the env's spec as far as the config alone tells it (Mario's needs no emulator), None where the env must be built
    spec_from_config: Callable[[Config], EnvShape | None]


def fail(name: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"{name}={value!r} is invalid: allowed {allowed}")


def int_range(name: str, value: int, lo: int, hi: int | None = None) -> None:
    if not is_int(value) or value < lo or (hi is not None and value > hi):
        fail(name, value, f"an integer in [{lo}, {hi if hi is not None else 'inf'}]")


def float_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = is_finite_number(value) and (value > lo if lo_open else value >= lo) and value <= hi
    if not ok:
        fail(name, value, f"a number in {'(' if lo_open else '['}{lo}, {hi}]")


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        fail(name, value, "one of " + ", ".join(choices))


def estimate_replay_bytes(cfg: Config, spec: EnvShape | None = None) -> int:
    """Bytes the replay buffer will allocate: one observation per slot plus per-slot metadata.

    Without the env's spec (known once the env is inspected) a slot holds one frame_size^2 uint8 frame."""
    frame_bytes = cfg.env.frame_size * cfg.env.frame_size if spec is None else spec.frame_bytes
    per_slot_metadata = 8 * 6  # indices, return, discount, action, priority leaf (see replay.storage)
    tree_bytes = 2 * 8 * next_pow2(cfg.replay.capacity)
    return cfg.replay.capacity * (frame_bytes + per_slot_metadata) + tree_bytes


MEMORY_SHARE = 0.8  # of available memory, the most a config's estimated replay and networks may take


def _memory_room(available_bytes: int | None) -> tuple[int, float]:
    """(available bytes: `available_bytes`, or this machine's now; the share of them a config may take)."""
    available = available_memory_bytes() if available_bytes is None else available_bytes
    return available, MEMORY_SHARE * available


# Parameter-sized buffers, in fp32 copies of the Q-network. The learner: online, target, gradients,
# Adam's two moments, autocast's low-precision weight casts and the publisher's CPU snapshot (a CPU
# bf16 update of a Mario net with hidden=8192 measured 7.7 copies of peak RSS). Each collector: its
# network, the received weights message and the decoded tensors.
LEARNER_NETWORK_COPIES = 8
COLLECTOR_NETWORK_COPIES = 3
NATURE_CNN_MIN_SIDE = 36  # smallest frame side the Nature CNN's three convolutions leave features for


def _impala_side(side: int) -> int:
    """Output side of shared/network.py ImpalaCNN: three 3x3 stride-2 max pools, padding 1 (each halves, rounding up)."""
    for _ in range(3):
        side = (side + 1) // 2
    return side


def _impala_params(stack: int, width: int) -> int:
    """Parameters of shared/network.py ImpalaCNN: per stage a 3x3 conv in -> c and two residual blocks of two c -> c."""
    total, in_channels = 0, stack
    for channels in (16 * width, 32 * width, 32 * width):  # shared/network.py IMPALA_CHANNELS x encoder_width
        total += in_channels * channels * 9 + channels + 4 * (channels * channels * 9 + channels)
        in_channels = channels
    return total


def _nature_cnn_side(side: int) -> int:
    """Output side of shared/network.py NatureCNN (kernels 8/4/3, strides 4/2/1) for one input side."""
    side = (side - 8) // 4 + 1
    side = (side - 4) // 2 + 1
    return side - 2


def estimate_network_params(cfg: Config, spec: EnvShape | None = None, *, from_config: bool = False) -> int:
    """Parameter count of shared/network.py `build_q_network` for this config and env, without torch.

    The layer sizes of the network `build_q_network(spec.obs_shape, spec.stack, spec.num_actions,
    learner.hidden, learner.dueling, learner.encoder, learner.encoder_width, learner.quantiles,
    learner.noisy_sigma)` builds
    (tests/test_cli_errors.py counts the built one against it); torch-free because `Config.check_valid`
    runs where torch is not installed (tests/test_config.py runs it under Python 3.13, which gets no torch:
    building the network on the meta device would need it). `spec` None: an env not inspected yet whose config
    does not tell its spec, an unknown vector whose input layer and action count are not counted (a lower bound:
    the hidden x hidden layers dominate wide networks). `from_config`: `spec` is the one the config alone implies
    (envs/checks.py `spec_from_config`), so a frame too small is named as env.frame_size's fault.
    """
    e, hidden = cfg.env, cfg.learner.hidden
    if spec is None:
        torso, features, num_actions = hidden, hidden, 1  # bias only: the input width is unknown here
    elif not spec.image and cfg.learner.encoder != "nature":
        raise ConfigError(f"learner.encoder={cfg.learner.encoder!r} is invalid: allowed 'nature' for env "
                          f"{e.env_id!r}, whose {tuple(spec.obs_shape)} vector observations take the MLP torso "
                          f"(the encoders are for 2-D frames)")
    elif spec.image and cfg.learner.encoder == "impala":
        width = cfg.learner.encoder_width
        torso, num_actions = _impala_params(spec.stack, width), spec.num_actions
        features = 32 * width * _impala_side(spec.obs_shape[0]) * _impala_side(spec.obs_shape[1])
    elif spec.image:
        side_h, side_w = _nature_cnn_side(spec.obs_shape[0]), _nature_cnn_side(spec.obs_shape[1])
        if side_h < 1 or side_w < 1:
            if from_config:
                fail("env.frame_size", e.frame_size, f"an integer in [{NATURE_CNN_MIN_SIDE}, 256] "
                      "(smaller frames leave the Nature CNN no features)")
            raise ConfigError(f"env {e.env_id!r}: {spec.obs_shape[0]}x{spec.obs_shape[1]} observations are too small "
                              f"for the Nature CNN (needs at least {NATURE_CNN_MIN_SIDE}x{NATURE_CNN_MIN_SIDE})")
        torso = (spec.stack * 32 * 64 + 32) + (32 * 64 * 16 + 64) + (64 * 64 * 9 + 64)
        features, num_actions = 64 * side_h * side_w, spec.num_actions
    else:
        flat = spec.stack * math.prod(spec.obs_shape)
        torso, features, num_actions = flat * hidden + hidden, hidden, spec.num_actions
    per_action = max(1, cfg.learner.quantiles)  # QR-DQN: N quantiles per action (and N values)
    advantage = features * hidden + hidden + (hidden + 1) * num_actions * per_action
    value = features * hidden + hidden + (hidden + 1) * per_action if cfg.learner.dueling else 0
    noisy = 2 if cfg.learner.noisy_sigma > 0 else 1  # NoisyNet head layers: a sigma beside every mu
    return torso + noisy * (advantage + value)


def estimate_network_bytes(cfg: Config, spec: EnvShape | None = None, *, from_config: bool = False) -> int:
    """Bytes of all parameter-sized buffers: LEARNER_NETWORK_COPIES plus COLLECTOR_NETWORK_COPIES per local collector."""
    return 4 * estimate_network_params(cfg, spec, from_config=from_config) * _network_copies(cfg)


def _network_copies(cfg: Config) -> int:
    return LEARNER_NETWORK_COPIES + COLLECTOR_NETWORK_COPIES * cfg.collectors.count


def check_all(cfg: Config, available_bytes: int | None, env: EnvRules) -> None:
    """Every rule, in order; `env`: the envs' part (envs/checks.py `check_config` passes ENV_RULES)."""
    e, c, r, lrn, t, lg = cfg.env, cfg.collectors, cfg.replay, cfg.learner, cfg.transport, cfg.logging
    env.check_env(e)
    _check_collectors(c)
    _check_replay_shape(cfg)
    float_range("replay.alpha", r.alpha, 0.0, 1.0)
    float_range("replay.beta_start", r.beta_start, 0.0, 1.0)
    int_range("replay.beta_steps", r.beta_steps, 1)
    float_range("replay.priority_eps", r.priority_eps, 0.0, 1.0, lo_open=True)
    choice("replay.storage_device", r.storage_device, STORAGE_DEVICES)
    float_range("replay.gpu_memory_fraction", r.gpu_memory_fraction, 0.0, 0.95, lo_open=True)

    choice("learner.device", lrn.device, DEVICES)
    int_range("learner.batch_size", lrn.batch_size, 1, 65536)
    int_range("learner.grad_accum_steps", lrn.grad_accum_steps, 1, 1024)
    float_range("learner.lr", lrn.lr, 0.0, 1.0, lo_open=True)
    float_range("learner.adam_eps", lrn.adam_eps, 0.0, 1.0, lo_open=True)
    float_range("learner.weight_decay", lrn.weight_decay, 0.0, 1.0)
    float_range("learner.max_grad_norm", lrn.max_grad_norm, 0.0, 1e6, lo_open=True)
    int_range("learner.target_update_every", lrn.target_update_every, 1)
    float_range("learner.polyak_tau", lrn.polyak_tau, 0.0, 1.0)
    _check_network(lrn)
    choice("learner.precision", lrn.precision, PRECISIONS)
    choice("learner.compile_mode", lrn.compile_mode, COMPILE_MODES)
    choice("learner.step_mode", lrn.step_mode, STEP_MODES)
    choice("learner.space_to_depth", lrn.space_to_depth, SPACE_TO_DEPTH)
    if lrn.step_mode != "eager" and lrn.compile_mode != "off":
        fail("learner.step_mode", lrn.step_mode, f"eager with learner.compile_mode={lrn.compile_mode!r} (device and "
              "captured compile the whole update themselves: set learner.compile_mode=off)")
    if not isinstance(lrn.step_autotune, bool):
        fail("learner.step_autotune", lrn.step_autotune, "true or false")
    if lrn.step_autotune and lrn.step_mode != "captured":
        fail("learner.step_autotune", lrn.step_autotune, f"false with learner.step_mode={lrn.step_mode!r} (only "
              "the captured step is compiled: set learner.step_mode=captured or learner.step_autotune=false)")
    if lrn.step_mode != "eager" and lrn.device == "cuda" and r.storage_device == "cpu":
        fail("learner.step_mode", lrn.step_mode, "eager with replay.storage_device='cpu' on a cuda learner (the "
              "device step samples frames on the learner's GPU: storage_device auto or learner)")
    check_levers(cfg, env)
    int_range("learner.warmup_transitions", lrn.warmup_transitions, 0)
    if lrn.warmup_transitions > r.capacity:
        fail("learner.warmup_transitions", lrn.warmup_transitions, f"at most replay.capacity ({r.capacity})")
    float_range("learner.samples_per_insert", lrn.samples_per_insert, 0.0, 1e6)
    int_range("learner.max_insert_lead", lrn.max_insert_lead, 0)
    int_range("learner.weight_broadcast_every", lrn.weight_broadcast_every, 1)
    float_range("learner.checkpoint_every_s", lrn.checkpoint_every_s, 0.0, 1e9, lo_open=True)
    int_range("learner.torch_threads", lrn.torch_threads, 0, 256)

    if not isinstance(t.bind, str) or not t.bind:
        fail("transport.bind", t.bind, "an IPv4 address such as 127.0.0.1 or 0.0.0.0")
    if ":" in t.bind:  # the head's sockets do not set zmq.IPV6, so an IPv6 bind fails with "No such device"
        fail("transport.bind", t.bind, "an IPv4 address or localhost (IPv6 is not enabled on the head's "
              "ZeroMQ sockets; for loopback use 127.0.0.1)")
    if t.bind != "localhost" and not _is_ipv4(t.bind):  # names make zmq resolve them: it can hang for minutes
        fail("transport.bind", t.bind, "an IPv4 address such as 127.0.0.1 or 0.0.0.0, or localhost "
              "(not a host or interface name)")
    if t.bind not in ("127.0.0.1", "localhost") and not t.curve_keys_dir:
        fail("transport.bind", t.bind, "127.0.0.1 unless transport.curve_keys_dir names CURVE keys (make keys)")
    if t.port != 0:  # 0 = pick free ports (tests, benchmarks, several heads on one machine)
        int_range("transport.port", t.port, 1024, 65000)
    choice("transport.local_transport", t.local_transport, ("ipc", "tcp"))
    int_range("transport.recv_hwm", t.recv_hwm, 1, 100_000)
    _check_link(c, t)
    float_range("transport.stall_timeout_s", t.stall_timeout_s, 0.0, 3600.0, lo_open=True)
    int_range("transport.memory_margin_mb", t.memory_margin_mb, 0, 1 << 24)

    float_range("logging.interval_s", lg.interval_s, 0.0, 86400.0, lo_open=True)
    int_range("logging.episode_window", lg.episode_window, 1, 100_000)
    float_range("logging.eval_every_s", lg.eval_every_s, 0.0, 1e9)
    int_range("logging.eval_episodes", lg.eval_episodes, 1, 10_000)
    float_range("logging.eval_epsilon", lg.eval_epsilon, 0.0, 1.0)
    int_range("logging.eval_keep", lg.eval_keep, 1, 1_000)
    _check_stop_rule(cfg)

    check_memory(cfg, available_bytes, env.spec_from_config(cfg), from_config=True)


def _check_stop_rule(cfg: Config) -> None:
    """The train-until-cleared rule needs evaluations that count flags: a rate in [0, 1], at least one evaluation."""
    lg = cfg.logging
    float_range("logging.stop_flag_rate", lg.stop_flag_rate, 0.0, 1.0)
    int_range("logging.stop_flag_evals", lg.stop_flag_evals, 1, 1_000)
    if lg.stop_flag_rate <= 0:
        return
    if not is_mario(cfg.env.env_id):
        fail("logging.stop_flag_rate", lg.stop_flag_rate, f"0 (off) for {cfg.env.env_id}: only Mario evaluations "
              "count flags")
    if lg.eval_every_s <= 0:
        fail("logging.stop_flag_rate", lg.stop_flag_rate, "0 (off) with logging.eval_every_s=0: the rule reads the "
              "periodic evaluations (set logging.eval_every_s > 0)")


def check_welcome(cfg: Config, available_bytes: int | None, env: EnvRules) -> None:
    """The rules of the fields a collector reads, for a collector to run on the config a head's WELCOME carries (a
    head is a peer too): the env section, the collectors section, the replay's n-step shape, the network's shape and
    the link's limits (ingest/registration.py WELCOME_CONFIG lists them). Fields a WELCOME leaves out keep their
    defaults, so the rules that tie them to carried ones stay with the head's `check_all`. Also refuses a network
    whose collector copies would not fit in 80% of this machine's available memory. `env`: as for `check_all`."""
    env.check_env(cfg.env)
    _check_collectors(cfg.collectors)
    _check_replay_shape(cfg)
    _check_network(cfg.learner)
    _check_link(cfg.collectors, cfg.transport)
    params = estimate_network_params(cfg, env.spec_from_config(cfg), from_config=True)
    net = 4 * params * COLLECTOR_NETWORK_COPIES
    available, room = _memory_room(available_bytes)
    if net > room:
        raise ConfigError(
            f"learner.hidden={cfg.learner.hidden} makes a Q-network of {params:,} parameters; a collector's "
            f"{COLLECTOR_NETWORK_COPIES} copies of it need about {net} bytes ({net / 2**30:.2f} GiB) but only "
            f"{available} bytes ({available / 2**30:.2f} GiB) are available; allowed: a network whose copies stay "
            f"under {MEMORY_SHARE:.0%} of available memory")


def _check_collectors(c: CollectorConfig) -> None:
    int_range("collectors.count", c.count, 0, 1024)
    int_range("collectors.envs_per_collector", c.envs_per_collector, 1, 1024)
    int_range("collectors.chunk_steps", c.chunk_steps, 1, 4096)
    float_range("collectors.eps_base", c.eps_base, 0.0, 1.0)
    float_range("collectors.eps_alpha", c.eps_alpha, 0.0, 100.0)
    choice("collectors.eps_per", c.eps_per, ("stream", "collector"))
    int_range("collectors.eps_decay_updates", c.eps_decay_updates, 0)
    int_range("collectors.eps_stage_from", c.eps_stage_from, 0)
    float_range("collectors.eps_stage", c.eps_stage, 0.0, 1.0)
    if c.explore_repeat_mu != 0:  # 0 = off; on, the zeta distribution needs mu > 1
        float_range("collectors.explore_repeat_mu", c.explore_repeat_mu, 1.0, 100.0, lo_open=True)
    int_range("collectors.explore_repeat_max", c.explore_repeat_max, 1, 100_000)
    float_range("collectors.heartbeat_s", c.heartbeat_s, 0.0, 60.0, lo_open=True)
    int_range("collectors.send_hwm", c.send_hwm, 1, 100_000)
    int_range("collectors.torch_threads", c.torch_threads, 1, 256)


def _check_replay_shape(cfg: Config) -> None:
    """What a collector's n-step chunks depend on; capacity must hold a few chunks with their stacks and tails."""
    e, c, r = cfg.env, cfg.collectors, cfg.replay
    int_range("replay.n_step", r.n_step, 1, 64)
    min_capacity = 4 * (c.chunk_steps + e.frame_stack + r.n_step + 8)
    int_range("replay.capacity", r.capacity, min_capacity, 2**31 - 1)
    float_range("replay.gamma", r.gamma, 0.0, 1.0)


def _check_network(lrn: LearnerConfig) -> None:
    """The Q-network's shape, which the learner and every collector build alike."""
    int_range("learner.hidden", lrn.hidden, 1, 65536)
    choice("learner.encoder", lrn.encoder, ENCODERS)
    int_range("learner.encoder_width", lrn.encoder_width, 1, 64)
    if lrn.encoder != "impala" and lrn.encoder_width != 1:
        fail("learner.encoder_width", lrn.encoder_width, f"1 with learner.encoder={lrn.encoder!r} (the width "
              "multiplies the impala encoder's channels)")
    int_range("learner.quantiles", lrn.quantiles, 0, 1024)
    float_range("learner.noisy_sigma", lrn.noisy_sigma, 0.0, 10.0)


def _check_link(c: CollectorConfig, t: TransportConfig) -> None:
    """The limits both ends of a collector's link use."""
    int_range("transport.socket_buffer_bytes", t.socket_buffer_bytes, 0, 1 << 30)
    int_range("transport.max_chunks_in_flight", t.max_chunks_in_flight, 0, 100_000)
    float_range("transport.head_timeout_s", t.head_timeout_s, 0.0, 3600.0, lo_open=True)
    if c.heartbeat_s > t.head_timeout_s / 2:  # both sides take a silence of head_timeout_s for death
        fail("collectors.heartbeat_s", c.heartbeat_s,
              f"at most half of transport.head_timeout_s ({t.head_timeout_s}): heartbeats say a peer is alive")


def check_levers(cfg: Config, env: EnvRules) -> None:
    """The optional learning levers (learner/dqn.py: Munchausen and quantile targets; learner/resets.py; learner/
    augment.py): ranges, Munchausen or quantiles but not both, a reset that changes something, random shifts of frames
    only (where the config alone tells the env's spec: Mario)."""
    lrn = cfg.learner
    float_range("learner.munchausen_alpha", lrn.munchausen_alpha, 0.0, 1.0)
    float_range("learner.munchausen_tau", lrn.munchausen_tau, 0.0, 100.0, lo_open=True)
    float_range("learner.munchausen_clip", lrn.munchausen_clip, -1e3, 0.0)
    float_range("learner.target_epsilon", lrn.target_epsilon, 0.0, 1.0)
    int_range("learner.target_epsilon_from", lrn.target_epsilon_from, 0)
    if lrn.target_epsilon_from > 0 and lrn.target_epsilon == 0:
        fail("learner.target_epsilon_from", lrn.target_epsilon_from, "0 with learner.target_epsilon=0 (it says from "
              "which update the epsilon-greedy bootstrap applies: set learner.target_epsilon too)")
    if lrn.quantiles > 0 and lrn.target_epsilon > 0:
        fail("learner.target_epsilon", lrn.target_epsilon, f"0 with learner.quantiles={lrn.quantiles} (the "
              "epsilon-greedy bootstrap is built for one value per action: set learner.target_epsilon=0)")
    if lrn.quantiles > 0 and lrn.munchausen_alpha > 0:
        fail("learner.quantiles", lrn.quantiles, f"0 with learner.munchausen_alpha={lrn.munchausen_alpha} (Munchausen "
              "targets are defined on one value per action; the Mario preset sets 0.9: add "
              "--set learner.munchausen_alpha=0 to train quantiles)")
    check_augment(lrn, env.spec_from_config(cfg))
    int_range("learner.reset_every_updates", lrn.reset_every_updates, 0)
    if not isinstance(lrn.reset_head, bool):
        fail("learner.reset_head", lrn.reset_head, "true or false")
    float_range("learner.shrink_perturb", lrn.shrink_perturb, 0.0, 1.0)
    if lrn.reset_every_updates > 0 and not lrn.reset_head and lrn.shrink_perturb == 1.0:
        fail("learner.reset_every_updates", lrn.reset_every_updates, "0 when learner.reset_head=false and "
              "learner.shrink_perturb=1.0 (such a reset changes nothing)")


def check_augment(lrn: LearnerConfig, spec: EnvShape | None = None) -> None:
    """learner.augment_shift: a pixel count, for image observations only, at most a quarter of the frame's side.
    `spec` None: only the range (the CLI calls this again with the env's spec, the learner with its own)."""
    int_range("learner.augment_shift", lrn.augment_shift, 0, 32)
    if spec is None or lrn.augment_shift == 0:
        return
    if not spec.image:
        fail("learner.augment_shift", lrn.augment_shift, f"0 for observations of shape {tuple(spec.obs_shape)} "
              "(random shifts move the pixels of 2-D frames)")
    side = min(spec.obs_shape[0], spec.obs_shape[1])
    if lrn.augment_shift > side // 4:
        fail("learner.augment_shift", lrn.augment_shift, f"an integer in [0, {side // 4}] for "
              f"{spec.obs_shape[0]}x{spec.obs_shape[1]} frames (a quarter of the shorter side)")


def check_memory(cfg: Config, available_bytes: int | None = None, spec: EnvShape | None = None, *,
                 from_config: bool = False) -> None:
    """Refuse a config whose replay plus networks would not fit in 80% of available memory.

    Before the env is inspected `check_all` passes the spec the config implies (Mario's, `from_config`) or, for
    other envs, None (lower bounds); the CLI calls this again with the real one.
    """
    r = cfg.replay
    needed = estimate_replay_bytes(cfg, spec)
    available, room = _memory_room(available_bytes)
    if needed > room:
        raise ConfigError(
            f"replay.capacity={r.capacity} needs about {needed} bytes ({needed / 2**30:.2f} GiB) "
            f"but only {available} bytes ({available / 2**30:.2f} GiB) are available; "
            f"allowed: a capacity whose estimate stays under {MEMORY_SHARE:.0%} of available memory"
        )
    params = estimate_network_params(cfg, spec, from_config=from_config)
    net = 4 * params * _network_copies(cfg)
    if needed + net > room:
        raise ConfigError(
            f"learner.hidden={cfg.learner.hidden} makes a Q-network of {params:,} parameters "
            f"({4 * params / 2**30:.2f} GiB in fp32); {_network_copies(cfg)} copies of it ({LEARNER_NETWORK_COPIES} "
            f"in the learner, {COLLECTOR_NETWORK_COPIES} per local collector with collectors.count="
            f"{cfg.collectors.count}) need about {net} bytes ({net / 2**30:.2f} GiB), plus {needed / 2**30:.2f} GiB "
            f"of replay, but only {available} bytes ({available / 2**30:.2f} GiB) are available; allowed: a "
            f"learner.hidden (or collectors.count) whose estimate stays under {MEMORY_SHARE:.0%} of available memory"
        )
