"""Shared helpers for the learner tests: a small fake replay with the ReplayBuffer interface.

(Module name starts with test_ so it lives with the learner tests; it defines no tests.)
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from envs.spec import EnvSpec
from shared.batch import SampleBatch
from shared.config import Config, EnvConfig, LearnerConfig, ReplayConfig

SMALL_OBS = (36, 36)  # smallest frame the Nature CNN accepts: fast tests, same code path as 84x84


class FakeReplay:
    """Random uint8 transitions from a fixed pool; deterministic for a given seed.

    Implements what the learner uses: sample, update_priorities, __len__, transitions_added,
    save/restore. Records the threads that call the reader-side methods.
    """

    def __init__(self, obs_shape=SMALL_OBS, stack: int = 4, num_actions: int = 5, pool: int = 256,
                 seed: int = 0, transitions_added: int = 10_000, terminal_frac: float = 0.1) -> None:
        rng = np.random.default_rng(seed)
        self.obs_shape, self.stack, self.num_actions = tuple(obs_shape), stack, num_actions
        self.frames = rng.integers(0, 256, size=(pool, stack, *obs_shape), dtype=np.uint8)
        self.next_frames = rng.integers(0, 256, size=(pool, stack, *obs_shape), dtype=np.uint8)
        self.actions = rng.integers(0, num_actions, size=pool).astype(np.int64)
        self.returns = rng.normal(size=pool).astype(np.float32)
        self.discounts = np.where(rng.random(pool) < terminal_frac, 0.0, 0.99**3).astype(np.float32)
        self.priorities = np.ones(pool, dtype=np.float64)
        self.rng = np.random.default_rng(seed + 1)
        self.transitions_added = transitions_added
        self.sample_threads: set[int] = set()
        self.update_threads: set[int] = set()
        self.samples_drawn = 0
        self.updates_applied = 0

    def __len__(self) -> int:
        return min(self.transitions_added, len(self.priorities))

    def sample(self, batch_size: int, beta: float = 0.4) -> SampleBatch:
        self.sample_threads.add(threading.get_ident())
        p = self.priorities / self.priorities.sum()
        idx = self.rng.choice(len(p), size=batch_size, p=p)
        w = (len(p) * p[idx]) ** (-beta)
        w = (w / w.max()).astype(np.float32)
        self.samples_drawn += batch_size
        return SampleBatch(
            torch.from_numpy(self.frames[idx]), torch.from_numpy(self.actions[idx]),
            torch.from_numpy(self.returns[idx]), torch.from_numpy(self.discounts[idx]),
            torch.from_numpy(self.next_frames[idx]), torch.from_numpy(w), idx.astype(np.int64),
        )

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        self.update_threads.add(threading.get_ident())
        if td_abs.dtype != np.float32 or td_abs.shape != indices.shape:
            raise TypeError(f"bad td_abs {td_abs.dtype} {td_abs.shape}")
        self.priorities[indices] = np.abs(td_abs) + 1e-6
        self.updates_applied += 1

    def save(self, directory) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "priorities.npy", self.priorities)
        (d / "state.json").write_text(json.dumps({"transitions_added": self.transitions_added}))

    def restore(self, directory) -> None:
        d = Path(directory)
        self.priorities = np.load(d / "priorities.npy")
        self.transitions_added = json.loads((d / "state.json").read_text())["transitions_added"]


def state_copy(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of `module`'s state dict: what its weights were at this moment."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def small_config(**learner_overrides) -> Config:
    """A config for fast CPU tests: small head, fp32, no warmup unless overridden."""
    base = LearnerConfig(device="cpu", batch_size=8, hidden=32, precision="fp32", warmup_transitions=0,
                         samples_per_insert=0.0, prefetch=False, weight_broadcast_every=3, target_update_every=2)
    return Config(learner=replace(base, **learner_overrides), replay=ReplayConfig(beta_steps=100))


def learner_of(cfg: Config, spec: EnvSpec, replay, device: torch.device | str = "cpu", **kw):
    """A Learner on `spec` given the sections of `cfg` it takes, as the head passes them."""
    from learner.trainer import Learner

    return Learner(cfg.learner, cfg.replay, spec, replay, device, config_json=cfg.to_json(),
                   meter_window_s=cfg.logging.interval_s, **kw)


def make_learner(cfg: Config | None = None, replay=None, seed: int = 0, num_actions: int | None = None, **kw):
    cfg = small_config() if cfg is None else cfg
    replay = FakeReplay() if replay is None else replay
    torch.manual_seed(seed)
    spec = EnvSpec(replay.obs_shape, np.uint8, num_actions if num_actions is not None else replay.num_actions,
                   replay.stack)
    return learner_of(cfg, spec, replay, torch.device("cpu"), **kw)


def make_run_dir(run_dir: Path, env: EnvConfig, num_actions: int, metrics_rows: int = 12,
                 favor_action: int | None = None) -> Path:
    """A run dir as the head leaves it: checkpoint/ (written by the Learner) and metrics.jsonl.

    `favor_action` biases the advantage head so the greedy policy always picks that action.
    """
    cfg: Config = replace(small_config(), env=env)
    replay = FakeReplay(obs_shape=(env.frame_size, env.frame_size), stack=env.frame_stack,
                        num_actions=num_actions, pool=16)  # both envs give frame_size^2 uint8 frames
    learner = make_learner(cfg, replay=replay)
    try:
        learner.run_updates(1)
        if favor_action is not None:
            with torch.no_grad():
                learner.online.head.advantage[-1].bias[favor_action] += 1e4
        learner.save_checkpoint(run_dir, counters={"env_steps": 4096, "episodes": 12})
    finally:
        learner.close()
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for i in range(1, metrics_rows + 1):
            fh.write(json.dumps({"env_steps": 1024 * i, "mean_x_pos_20": 300.0 + 10 * i,
                                 "mean_return_20": 250.0 + 5 * i if i > 1 else None}) + "\n")
        fh.write('{"env_steps": 99')  # a live run's half-written last line
    return run_dir
