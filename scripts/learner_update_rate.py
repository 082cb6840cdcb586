"""Updates/s of the real Learner on the CartPole geometry (replay filled with random episodes).

Why: on CartPole the learner, not the env, sets the pace; this isolates one update's cost per
setting (prefetch thread or not, torch threads, width, batch) from the rest of the system.

Usage: python scripts/learner_update_rate.py [--profile] [section.field=value ...]
       e.g. python scripts/learner_update_rate.py learner.prefetch=false learner.torch_threads=2
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config_optimized import load_config  # noqa: E402
from learner.trainer import Learner  # noqa: E402
from replay.buffer import ReplayBuffer  # noqa: E402
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, NO_ACTION, TransitionChunk  # noqa: E402
from shared.env_factory import env_spec_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", help="section.field=value")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of 300 updates")
    ns = ap.parse_args()
    cfg = load_config("cpu", ["env.env_id=CartPole-v1", *ns.overrides]).check_valid()  # CartPole's preset
    torch.set_num_threads(cfg.learner.torch_threads)
    obs_shape, obs_dtype, num_actions, stack = env_spec_of(cfg.env)
    replay = ReplayBuffer.from_config(cfg, obs_shape, obs_dtype, stack, "cpu")
    rng = np.random.default_rng(0)
    for s in range(400):  # 400 random 50-step episodes
        actions = rng.integers(0, num_actions, size=50).astype(np.int32)
        actions[-1] = NO_ACTION
        flags = np.zeros(50, np.uint8)
        flags[0], flags[-2] = FLAG_FIRST, FLAG_TERMINATED
        replay.add_chunk(TransitionChunk(
            stream=s % 4, first_start=0, frames=rng.normal(size=(50, *obs_shape)).astype(obs_dtype),
            actions=actions, rewards=np.ones(50, np.float32), flags=flags, priorities=np.ones(50, np.float32)))
    learner = Learner(cfg, obs_shape, obs_dtype, stack, num_actions, replay, "cpu")
    learner.run_updates(50)  # warm-up
    t0 = time.perf_counter()
    learner.run_updates(500)
    dt = time.perf_counter() - t0
    print(f"{500 / dt:.0f} updates/s ({dt / 500 * 1e3:.2f} ms/update) with {' '.join(ns.overrides) or 'defaults'}")
    if ns.profile:
        prof = cProfile.Profile()
        prof.enable()
        learner.run_updates(300)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    learner.close()


if __name__ == "__main__":
    main()
