"""Play a uniformly random policy and write its mean x_pos / return as JSON: the "chance" line.

Why: a learning curve means little without the level a policy that knows nothing reaches on
the same env (same id, action set, frame skip, episode rules). `evaluate.evaluate` picks up a
docs/random_policy_*.json recorded on the run's env and draws it on the learning curve.

    python -m evaluate.random_policy --episodes 20 --out docs/random_policy_1-1.json
    python -m evaluate.random_policy --config runs/<run>/config.json --episodes 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from evaluate.evaluate import play_episode, summarize
from shared.config import MARIO_DEFAULT_ENV, Config, ConfigError, EnvConfig
from shared.env_factory import make_env


def run_baseline(env_cfg: EnvConfig, episodes: int, seed: int = 0, max_steps: int | None = None,
                 verbose: bool = True) -> dict:
    """Random episodes on `env_cfg`; the JSON dict (summary plus per-episode numbers)."""
    rng = np.random.default_rng(seed)
    env = make_env(env_cfg)
    n = int(env.action_space.n)
    results = []
    t0 = time.perf_counter()
    try:
        for i in range(episodes):
            r = play_episode(env, lambda _stack: int(rng.integers(n)), 1, i, seed=seed + i, max_steps=max_steps)
            results.append(r)
            if verbose:
                print(f"episode {i + 1:>3}/{episodes}: return {r.ret:8.1f}  x_pos {r.x_pos:5d}  steps {r.steps:5d}",
                      flush=True)
    finally:
        env.close()
    s = summarize(results)
    return {
        "mean_x_pos": s["mean_x_pos"], "std": s["std_x_pos"], "max_x_pos": s["max_x_pos"],
        "mean_return": s["mean_return"], "std_return": s["std_return"], "flag_rate": s["flag_rate"],
        "mean_length": s["mean_length"], "episodes": episodes,
        "env_id": env_cfg.env_id, "action_set": env_cfg.action_set, "frame_skip": env_cfg.frame_skip,
        "env": asdict(env_cfg), "seed": seed, "max_steps": max_steps,
        "x_pos": [r.x_pos for r in results], "returns": [r.ret for r in results],
        "lengths": [r.steps for r in results], "elapsed_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluate.random_policy", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=None, help="a run's config.json: use its env section")
    p.add_argument("--env-id", default=None, help=f"default {MARIO_DEFAULT_ENV} (or the config's)")
    p.add_argument("--action-set", default=None, help="right_only / simple / complex (default simple)")
    p.add_argument("--frame-skip", type=int, default=None, help="default 4")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None, help="cap on agent steps per episode")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: print only)")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error(f"--episodes={args.episodes}: allowed an integer >= 1")
    try:
        env_cfg = EnvConfig()
        if args.config is not None:
            env_cfg = Config.from_dict(json.loads(args.config.read_text())).env
        overrides = {k: v for k, v in (("env_id", args.env_id), ("action_set", args.action_set),
                                       ("frame_skip", args.frame_skip)) if v is not None}
        env_cfg = replace(env_cfg, **overrides)
        Config(env=env_cfg).check_valid()
    except (OSError, ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        result = run_baseline(env_cfg, args.episodes, args.seed, args.max_steps)
    except ValueError as exc:  # unknown env id, non-discrete actions, ...
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2, sort_keys=True)
    print(f"random policy on {env_cfg.env_id} ({env_cfg.action_set}, skip {env_cfg.frame_skip}), "
          f"{args.episodes} episodes: x_pos {result['mean_x_pos']:.1f} +- {result['std']:.1f} "
          f"(max {result['max_x_pos']}), return {result['mean_return']:.1f} +- {result['std_return']:.1f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
