"""CartPole with the algorithm alone: our Collectors, ReplayBuffer and Learner in ONE process, no sockets.

Why: separates "do these settings learn" from "does the distributed system add lag". The
collectors step in turn, the learner trains to the exact replay ratio after each round, and the
weights reach the collectors every weight_broadcast_every updates with no transport delay.
Prints one JSON line: env steps to a 20-episode mean return of 475 (null if not within --steps).

Usage: python scripts/cartpole_sync.py --seed 1 [--set section.field=value ...]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.collector import Collector  # noqa: E402
from config_optimized import load_config  # noqa: E402
from learner.trainer import Learner  # noqa: E402
from replay.buffer import ReplayBuffer  # noqa: E402
from shared.env_factory import env_spec_of  # noqa: E402
from shared.exploration import collector_epsilon  # noqa: E402

SOLVED = 475.0


class InProcessLink:
    """The collector's Link, delivering straight into the replay (no sockets, no lag)."""

    def __init__(self, replay: ReplayBuffer, returns: collections.deque, delay_chunks: int = 0) -> None:
        self.weight_version = 0
        self.replay, self.returns = replay, returns
        self.delayed: collections.deque = collections.deque()
        self.delay_chunks = delay_chunks

    def poll_head(self) -> None:
        pass

    def take_weights(self) -> None:
        return None

    def must_exit(self) -> bool:
        return False

    def head_silent(self) -> bool:
        return False

    def send_chunk(self, chunk) -> bool:
        """Delivers the chunk sent delay_chunks sends ago: models data queued in sockets."""
        self.delayed.append(chunk)
        while len(self.delayed) > self.delay_chunks:
            self.replay.add_chunk(self.delayed.popleft())
        return True

    def send_episode(self, summary) -> bool:
        self.returns.append(summary.episode_return)
        return True

    def maybe_heartbeat(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--delay-chunks", type=int, default=0,
                    help="chunks each collector keeps in flight before they reach the replay (models transport lag)")
    ns = ap.parse_args()
    # the run's config (`--env CartPole-v1 --profile cpu`): CartPole's preset from config_optimized.py
    cfg = load_config("cpu", ["env.env_id=CartPole-v1", f"env.seed={ns.seed}", "learner.prefetch=false",
                              *ns.overrides]).check_valid()
    torch.manual_seed(ns.seed)
    obs_shape, obs_dtype, num_actions, stack = env_spec_of(cfg.env)
    replay = ReplayBuffer.from_config(cfg, obs_shape, obs_dtype, stack, "cpu")
    learner = Learner(cfg, obs_shape, obs_dtype, stack, num_actions, replay, "cpu")
    returns: collections.deque = collections.deque(maxlen=cfg.logging.episode_window)
    c = cfg.collectors
    collectors = [Collector(cfg, i, collector_epsilon(i, c.count, c.eps_base, c.eps_alpha),
                            InProcessLink(replay, returns, ns.delay_chunks)) for i in range(c.count)]

    def push_weights() -> None:
        state = learner.online.state_dict()
        for col in collectors:
            col.net.load_state_dict(state)
            col.weight_version = learner.updates

    push_weights()
    t0, steps, last_push, solved, best = time.time(), 0, 0, None, float("-inf")
    while steps < ns.steps and solved is None:
        for col in collectors:
            col.step()
            steps += len(col.envs)
        while learner.maybe_train(time_budget_s=10.0, idle_sleep_s=0) > 0:
            pass
        if learner.updates - last_push >= cfg.learner.weight_broadcast_every:
            push_weights()
            last_push = learner.updates
        if len(returns) == returns.maxlen:
            mean = float(np.mean(returns))
            best = max(best, mean)
            solved = steps if mean >= SOLVED else None
    learner.close()
    print(json.dumps({"seed": ns.seed, "overrides": ns.overrides, "delay_chunks": ns.delay_chunks, "steps_to_475": solved, "best_mean_return_20": best,
                      "updates": learner.updates, "wall_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
