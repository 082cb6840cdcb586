"""Single-process reference DQN for CartPole: our own re-implementation of CleanRL's `dqn.py` defaults.

Why it exists: the CartPole evidence (`python -m experiments.cartpole_race`) compares the distributed system
against the plain DQN most people know. This module re-implements CleanRL's `dqn.py` behaviour (not its code) with its default
hyperparameters, on one torch thread, and reports when the mean return of the last 20 episodes first
reaches 475, as one JSON object on stdout.

CleanRL defaults (cleanrl/dqn.py, `Args`): total_timesteps 500000, learning_rate 2.5e-4, num_envs 1,
buffer_size 10000, gamma 0.99, tau 1.0, target_network_frequency 500, batch_size 128, start_e 1,
end_e 0.05, exploration_fraction 0.5, learning_starts 10000, train_frequency 10; Q-network MLP
obs-120-84-actions with ReLU; MSE loss on r + gamma * max_a Q_target(s', a) * (1 - terminated); Adam.

Usage: python -m experiments.cleanrl_dqn --seed 1 [--total-timesteps 500000] [--stop-on-solve]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import deque
from dataclasses import asdict, dataclass

os.environ.setdefault("OMP_NUM_THREADS", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

SOLVED_RETURN = 475.0
WINDOW = 20
BUDGET_STEPS = 100_000


@dataclass(frozen=True)
class DqnArgs:
    """CleanRL dqn.py defaults; only seed and total_timesteps are meant to change."""

    env_id: str = "CartPole-v1"
    seed: int = 1
    total_timesteps: int = 500_000
    learning_rate: float = 2.5e-4
    buffer_size: int = 10_000
    gamma: float = 0.99
    tau: float = 1.0
    target_network_frequency: int = 500
    batch_size: int = 128
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    learning_starts: int = 10_000
    train_frequency: int = 10


def q_network(obs_dim: int, n_actions: int) -> nn.Sequential:
    """CleanRL's classic-control Q-network: 120-84 ReLU MLP with PyTorch default init."""
    return nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions))


def linear_epsilon(args: DqnArgs, step: int) -> float:
    """Linear decay from start_e to end_e over exploration_fraction * total_timesteps, then flat."""
    duration = args.exploration_fraction * args.total_timesteps
    slope = (args.end_e - args.start_e) / duration
    return max(slope * step + args.start_e, args.end_e)


class Replay:
    """Uniform ring buffer (what SB3's ReplayBuffer does for CleanRL), stored as numpy arrays."""

    def __init__(self, capacity: int, obs_dim: int, rng: np.random.Generator) -> None:
        self.obs = np.zeros((capacity, obs_dim), np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), np.float32)
        self.actions = np.zeros(capacity, np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.dones = np.zeros(capacity, np.float32)
        self.capacity, self.pos, self.full, self.rng = capacity, 0, False, rng

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: int, reward: float, terminated: bool) -> None:
        i = self.pos
        self.obs[i], self.next_obs[i], self.actions[i] = obs, next_obs, action
        self.rewards[i], self.dones[i] = reward, float(terminated)
        self.pos = (i + 1) % self.capacity
        self.full = self.full or self.pos == 0

    def sample(self, n: int) -> tuple[torch.Tensor, ...]:
        idx = self.rng.integers(0, self.capacity if self.full else self.pos, size=n)
        return tuple(torch.from_numpy(a[idx]) for a in (self.obs, self.actions, self.rewards, self.next_obs, self.dones))


def run(args: DqnArgs, stop_on_solve: bool = False, started: float | None = None) -> dict:
    """Train; return steps and wall time (from `started`, default process-ish start) to mean-20 >= 475."""
    started = time.monotonic() if started is None else started
    torch.set_num_threads(1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(args.env_id))
    env.action_space.seed(args.seed)
    obs_dim, n_actions = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    q, target = q_network(obs_dim, n_actions), q_network(obs_dim, n_actions)
    target.load_state_dict(q.state_dict())
    optimizer = torch.optim.Adam(q.parameters(), lr=args.learning_rate)
    replay = Replay(args.buffer_size, obs_dim, np.random.default_rng(args.seed))
    returns: deque[float] = deque(maxlen=WINDOW)
    solved_step: int | None = None
    solved_wall: float | None = None
    episodes = 0
    obs, _ = env.reset(seed=args.seed)
    for step in range(args.total_timesteps):
        if random.random() < linear_epsilon(args, step):
            action = int(env.action_space.sample())
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs, dtype=torch.float32)).argmax())
        next_obs, reward, terminated, truncated, info = env.step(action)
        replay.add(obs, next_obs, action, float(reward), bool(terminated))  # next_obs is the real final obs
        obs = next_obs
        if terminated or truncated:
            episodes += 1
            returns.append(float(info["episode"]["r"]))
            obs, _ = env.reset()
            if solved_step is None and len(returns) == WINDOW and np.mean(returns) >= SOLVED_RETURN:
                solved_step, solved_wall = step + 1, time.monotonic() - started
                if stop_on_solve:
                    break
        if step > args.learning_starts:
            if step % args.train_frequency == 0:
                b_obs, b_act, b_rew, b_next, b_done = replay.sample(args.batch_size)
                with torch.no_grad():
                    td_target = b_rew + args.gamma * target(b_next).max(dim=1).values * (1.0 - b_done)
                q_taken = q(b_obs).gather(1, b_act.unsqueeze(1)).squeeze(1)
                loss = nn.functional.mse_loss(td_target, q_taken)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if step % args.target_network_frequency == 0:
                for t_param, q_param in zip(target.parameters(), q.parameters(), strict=True):
                    t_param.data.copy_(args.tau * q_param.data + (1.0 - args.tau) * t_param.data)
    env.close()
    return {
        "system": "cleanrl_reference_dqn",
        "seed": args.seed,
        "steps_to_475": solved_step,
        "wall_s_to_475": solved_wall,
        "solved_within_100k": solved_step is not None and solved_step <= BUDGET_STEPS,
        "episodes": episodes,
        "final_mean_return_20": float(np.mean(returns)) if returns else None,
        "wall_s_total": time.monotonic() - started,
        "args": asdict(args),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.cleanrl_dqn", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=DqnArgs.seed)
    parser.add_argument("--total-timesteps", type=int, default=DqnArgs.total_timesteps)
    parser.add_argument("--stop-on-solve", action="store_true", help="stop at the first mean-20 >= 475")
    parser.add_argument("--process-start", type=float, help="time.time() when the caller launched us (race timing)")
    ns = parser.parse_args(argv)
    started = time.monotonic()
    if ns.process_start is not None:  # count interpreter and torch import start-up, as the system's timing does
        started -= max(0.0, time.time() - ns.process_start)
    result = run(DqnArgs(seed=ns.seed, total_timesteps=ns.total_timesteps), ns.stop_on_solve, started)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
