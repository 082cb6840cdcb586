"""Play a uniformly random policy and write its mean x_pos / return as JSON: the "chance" line.

Why: a learning curve means little without the level a policy that knows nothing reaches on
the same env (same id, action set, frame skip, episode rules). `evaluate.evaluate` picks up a
docs/random_policy_*.json recorded on the run's env and draws it on the learning curve, and
`evaluate.suite` puts it beside each level's row.

    python -m evaluate.random_policy --episodes 20 --out docs/random_policy_1-1.json
    python -m evaluate.random_policy --config runs/<run>/config.json --episodes 20
    python -m evaluate.random_policy --config runs/<run>/config.json --levels 1-1,1-2,1-3,1-4 --out-dir docs

--levels (names as `evaluate.suite` takes them, evaluate/levels.py) writes one JSON per level into
--out-dir, named random_policy_<level>[_<action set>].json (the action set is left out for the
default, simple): e.g. docs/random_policy_1-2_right_only.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from envs.factory import make_env
from evaluate.evaluate import play_episode, summarize
from evaluate.levels import Level, LevelError, check_env_config, level_env_config, parse_levels
from shared.config import MARIO_DEFAULT_ENV, Config, ConfigError, EnvConfig


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


def baseline_filename(level: Level, env_cfg: EnvConfig) -> str:
    """random_policy_<level>[_<action set>].json, the docs/ convention (no suffix for the default action set)."""
    suffix = "" if env_cfg.action_set == EnvConfig().action_set else f"_{env_cfg.action_set}"
    return f"random_policy_{level.name.replace(' ', '-')}{suffix}.json"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluate.random_policy", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=None, help="a run's config.json: use its env section")
    p.add_argument("--env-id", default=None, help=f"default {MARIO_DEFAULT_ENV} (or the config's)")
    p.add_argument("--levels", default=None,
                   help="comma-separated levels (1-2, SuperMarioBros-1-2-v0, SuperMarioBrosRandomStages-v0): "
                        "one JSON each into --out-dir")
    p.add_argument("--action-set", default=None, help="right_only / simple / complex (default simple)")
    p.add_argument("--frame-skip", type=int, default=None, help="default 4")
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None, help="cap on agent steps per episode")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: print only)")
    p.add_argument("--out-dir", type=Path, default=None, help="with --levels: the folder of the per-level JSONs")
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error(f"--episodes={args.episodes}: allowed an integer >= 1")
    if args.levels is not None and (args.env_id is not None or args.out is not None or args.out_dir is None):
        p.error("--levels writes one JSON per level: give --out-dir, not --env-id or --out")
    if args.levels is None and args.out_dir is not None:
        p.error("--out-dir goes with --levels")
    try:
        env_cfg = EnvConfig()
        if args.config is not None:
            env_cfg = Config.from_dict(json.loads(args.config.read_text())).env
        overrides = {k: v for k, v in (("env_id", args.env_id), ("action_set", args.action_set),
                                       ("frame_skip", args.frame_skip)) if v is not None}
        env_cfg = replace(env_cfg, **overrides)
        levels = parse_levels(args.levels) if args.levels is not None else None
        targets = [(env_cfg, args.out)] if levels is None else [
            (level_env_config(env_cfg, lv), args.out_dir / baseline_filename(lv, env_cfg)) for lv in levels]
        for cfg, _ in targets:
            check_env_config(cfg)
    except (OSError, ValueError, ConfigError, LevelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for cfg, out in targets:
        try:
            result = run_baseline(cfg, args.episodes, args.seed, args.max_steps)
        except ValueError as exc:  # unknown env id, non-discrete actions, ...
            print(f"error: {exc}", file=sys.stderr)
            return 2
        text = json.dumps(result, indent=2, sort_keys=True)
        print(f"random policy on {cfg.env_id} ({cfg.action_set}, skip {cfg.frame_skip}), "
              f"{args.episodes} episodes: x_pos {result['mean_x_pos']:.1f} +- {result['std']:.1f} "
              f"(max {result['max_x_pos']}), return {result['mean_return']:.1f} +- {result['std_return']:.1f}, "
              f"flag rate {result['flag_rate']:.0%}")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text + "\n")
            print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
