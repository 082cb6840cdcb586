"""The collector loop: K envs, one batched forward per step, chunks per env stream.

Per step: one forward over the K rolling stacks (torch.inference_mode, 1 thread), the Q rows
kept for the initial priorities, epsilon-greedy actions, K env steps, then the chunk cut for
every stream that has `chunk_steps` complete transitions. Everything except `env.step` is
numpy on small arrays so the emulator stays the ceiling (see bench/transport.py for the figure).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from actors.action_repeat import ActionRepeat
from actors.stream import StreamRecorder
from envs.factory import env_spec, episode_continues, episode_info, make_env
from shared.chunk import TransitionChunk
from shared.config import Config
from shared.exploration import acting_epsilon
from shared.network import build_q_network_for
from shared.protocol import EpisodeSummary

log = logging.getLogger(__name__)


class Link(Protocol):
    weight_version: int

    def poll_head(self) -> None: ...
    def take_weights(self) -> tuple[int, dict[str, torch.Tensor]] | None: ...
    def must_exit(self) -> bool: ...
    def head_silent(self) -> bool: ...
    def send_chunk(self, chunk: TransitionChunk) -> bool: ...
    def send_episode(self, summary: EpisodeSummary) -> bool: ...
    def maybe_heartbeat(self) -> None: ...


@dataclass
class Timing:
    """Where a collector's time goes: env stepping (the ceiling) vs everything else."""

    steps: int = 0  # loop iterations (K env steps each)
    env_s: float = 0.0
    infer_s: float = 0.0  # the batched forwards (part of the overhead)
    total_s: float = 0.0

    @property
    def overhead_frac(self) -> float:
        return (self.total_s - self.env_s) / self.env_s if self.env_s > 0 else float("nan")


class Collector:
    def __init__(self, config: Config, collector_id: int, epsilon: float | Sequence[float], link: Link,
                 seed: int | None = None) -> None:
        torch.set_num_threads(config.collectors.torch_threads)
        self.config = config
        self.collector_id = collector_id
        k = config.collectors.envs_per_collector
        # the Ape-X epsilon each env stream settles at (the head's WELCOME: one per stream, or one for all)
        eps = np.full(k, float(epsilon)) if isinstance(epsilon, (int, float)) else np.asarray(epsilon, np.float64)
        if eps.shape != (k,) or not np.all((eps >= 0) & (eps <= 1)):
            raise ValueError(f"epsilon: expected one value or {k} values in [0, 1], got {epsilon!r}")
        self.epsilons = eps
        self.eps_decay_updates = int(config.collectors.eps_decay_updates)
        self.eps_stage_from, self.eps_stage = int(config.collectors.eps_stage_from), float(config.collectors.eps_stage)
        if not 0.0 <= self.eps_stage <= 1.0:  # from the WELCOME, like the epsilons above
            raise ValueError(f"collectors.eps_stage: expected a value in [0, 1], got {self.eps_stage!r}")
        self.link = link
        self.envs = []
        for _ in range(k):  # emulators take a while to start: tell the head we are alive meanwhile
            self.link.maybe_heartbeat()
            self.envs.append(make_env(config.env))
        self.spec = spec = env_spec(config.env, self.envs[0])  # read from an env it runs: none built for it
        self.reward_scale = spec.reward_scale  # what is learned from; returns stay unscaled
        self.obs_shape, self.obs_dtype = spec.obs_shape, spec.obs_dtype
        self.stack, self.num_actions = spec.stack, spec.num_actions
        base = config.env.seed + 1000 * collector_id if seed is None else seed
        # until the first weights arrive the collector acts with its own initial network: seeded, so a run's
        # first episodes repeat with its seed (an untrained network's greedy policy can balance a CartPole for
        # hundreds of steps, or not at all, depending on its draw)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(base)
            self.net = build_q_network_for(spec, config.learner).eval()
        self.noisy = config.learner.noisy_sigma > 0
        self.weight_version = 0  # stamped on messages: 0 until weights are loaded, then their version
        self.loaded_version = -1  # -1: acting with the initial network, so any version (0 included) is newer
        self.rng = np.random.default_rng(base)
        c = config.collectors
        self.repeat = (ActionRepeat(k, c.explore_repeat_mu, c.explore_repeat_max, self.rng)
                       if c.explore_repeat_mu > 0 else None)  # ez-greedy; None: plain epsilon-greedy
        r = config.replay
        self.recorders = [StreamRecorder(i, self.stack, r.n_step, r.gamma, config.collectors.chunk_steps,
                                         self.num_actions) for i in range(k)]
        self.stacks = np.zeros((k, self.stack, *self.obs_shape), dtype=self.obs_dtype)
        self.returns = np.zeros(k, dtype=np.float64)
        self.lengths = np.zeros(k, dtype=np.int64)
        self.timing = Timing()
        self.episodes = 0
        t0 = time.perf_counter()
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=base + i)
            self._begin(i, obs)
            self.link.maybe_heartbeat()
        self.timing.env_s += time.perf_counter() - t0

    def _frame(self, obs: Any) -> np.ndarray:
        return np.array(obs, dtype=self.obs_dtype, copy=True)

    def _begin(self, i: int, obs: Any, new_episode: bool = True) -> None:
        """Start a stream segment at `obs`; `new_episode=False` after a lost life (the game and its totals go on)."""
        frame = self._frame(obs)
        self.recorders[i].begin_episode(frame)
        self.stacks[i] = frame  # pad with the first frame: the shared.chunk convention
        if new_episode:
            self.returns[i] = 0.0
            self.lengths[i] = 0

    def _q(self, stacks: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return self.net(torch.from_numpy(stacks)).float().numpy()

    def current_epsilon(self) -> np.ndarray:
        """Each stream's Ape-X epsilon, or during collectors.eps_decay_updates a linear anneal from 1 down to it, or
        from collectors.eps_stage_from on the stage's one epsilon (shared.exploration.acting_epsilon)."""
        return np.array([acting_epsilon(e, self.weight_version, self.eps_decay_updates, self.eps_stage_from,
                                        self.eps_stage) for e in self.epsilons])

    def load_weights(self, version: int, state: Mapping[str, torch.Tensor]) -> bool:
        """Load `state` if `version` is newer than the last loaded (the link has checked names, shapes and dtypes).
        Version 0 is the head's starting network, another run's with `learner.init_from`: never skipped."""
        if version <= self.loaded_version:
            return False
        self.net.load_state_dict(state)
        staged_before = 0 < self.eps_stage_from <= self.loaded_version
        self.loaded_version = self.weight_version = self.link.weight_version = version
        if 0 < self.eps_stage_from <= version and not staged_before:
            log.info("collector %d: weights v%d reach collectors.eps_stage_from=%d: every stream now explores at "
                     "eps %.4f", self.collector_id, version, self.eps_stage_from, self.eps_stage)
        return True

    def step(self) -> bool:
        """One loop iteration over all K envs; False when a send was abandoned (exit)."""
        t_start = time.perf_counter()
        self.link.poll_head()
        taken = self.link.take_weights()
        if taken is not None:
            self.load_weights(*taken)
        t0 = time.perf_counter()
        if self.noisy:  # NoisyNet: new weight noise every step, shared by this collector's K streams
            self.net.reset_noise()
        q = self._q(self.stacks)
        self.timing.infer_s += time.perf_counter() - t0
        for i, rec in enumerate(self.recorders):
            rec.set_q(q[i])
            if rec.ready():
                chunk = rec.build_chunk()
                if chunk is not None and not self.link.send_chunk(chunk):
                    return False
        greedy = q.argmax(axis=1)
        explore = self.rng.random(len(self.envs)) < self.current_epsilon()
        random_actions = self.rng.integers(0, self.num_actions, size=len(self.envs))
        if self.repeat is None:
            actions = np.where(explore, random_actions, greedy)
        else:
            actions = self.repeat.actions(explore, random_actions, greedy)
        truncated_finals: list[tuple[int, int, np.ndarray]] = []
        env_s = 0.0
        for i, env in enumerate(self.envs):
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(int(actions[i]))
            env_s += time.perf_counter() - t0
            frame = self._frame(obs)
            rec = self.recorders[i]
            index = rec.record_step(int(actions[i]), float(reward) * self.reward_scale, frame, bool(terminated),
                                    bool(truncated))
            self.returns[i] += float(info.get("raw_reward", reward))  # the game's score where the env clips (Atari)
            self.lengths[i] += 1
            self.stacks[i, :-1] = self.stacks[i, 1:]
            self.stacks[i, -1] = frame
            if terminated or truncated:
                if truncated and not terminated:
                    truncated_finals.append((i, index, self.stacks[i].copy()))
                # a lost life (Atari): terminal for learning above, but the episode reported is the whole game
                continues = episode_continues(info)
                if not continues:
                    x_pos, flag_get, world, stage = episode_info(info)
                    summary = EpisodeSummary(i, int(self.lengths[i]), float(self.returns[i]), x_pos, flag_get,
                                             world, stage)
                    self.episodes += 1
                    if not self.link.send_episode(summary):
                        return False
                t0 = time.perf_counter()
                obs, _ = env.reset()  # after a lost life: the same game goes on
                env_s += time.perf_counter() - t0
                self._begin(i, obs, new_episode=not continues)
                if self.repeat is not None:
                    self.repeat.end_episode(i)
        if truncated_finals:  # the bootstrap Q of a truncated episode's final observation
            q_final = self._q(np.stack([s for _, _, s in truncated_finals]))
            for (i, index, _), row in zip(truncated_finals, q_final, strict=True):
                self.recorders[i].set_q(row, index)
        self.link.maybe_heartbeat()
        self.timing.steps += 1
        self.timing.env_s += env_s
        self.timing.total_s += time.perf_counter() - t_start
        return True

    def run(self, max_steps: int | None = None) -> str:
        """Step until told to stop; returns why: 'head_silent', 'stop' (STOP, a stop request, a reclaimed
        registration), 'max_steps', or 'send' (a send the link abandoned without being told to stop)."""
        while max_steps is None or self.timing.steps < max_steps:
            self.link.poll_head()  # first: env start-up may have outlasted head_timeout_s
            if self.link.must_exit():
                return self._exit_reason()
            if not self.step():  # a send gives up when the link must exit: while waiting for credit, say
                return self._exit_reason() if self.link.must_exit() else "send"
        return "max_steps"

    def _exit_reason(self) -> str:
        """Why the link says to stop: 'head_silent' when nothing came from the head for head_timeout_s, else 'stop'."""
        return "head_silent" if self.link.head_silent() else "stop"

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - closing must not mask the exit reason
                log.debug("env close failed: %r", exc)
