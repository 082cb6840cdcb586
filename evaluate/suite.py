"""`python -m evaluate.suite CHECKPOINT [...] --levels 1-1,1-2 --out DIR`: which levels checkpoints clear.

Every checkpoint (one training seed each: a run dir or its checkpoint/ dir) plays every level
(evaluate/levels.py: `1-2`, `SuperMarioBros-1-2-v0`, `SuperMarioBrosRandomStages-v0`) on its own env
config with only the env id changed: --episodes episodes under each evaluation seed of --seeds, at
--epsilon. Episode k under seed s resets the env with, and draws its epsilon actions from, seeds
derived from (s, k), so the same inputs give the same numbers.

Writes DIR/suite.json (evaluate/suite_report.py: per level and checkpoint the flag rate, mean and
max x_pos, mean return and length; across checkpoints the IQM and 95% stratified bootstrap
interval, evaluate/stats.py; the random policy's row from docs/random_policy_*.json) and
DIR/suite.png (evaluate/suite_plot.py). Exit status 2: bad arguments, an unknown level, or a
missing, corrupt or non-Mario checkpoint (one line naming it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from envs.factory import make_env
from envs.mario.backend import backend_label, check_backend
from evaluate.evaluate import EvalError, Policy, epsilon_greedy, find_baseline, load_greedy, load_run, play_episode
from evaluate.levels import Level, LevelError, check_env_config, level_env_config, parse_levels
from evaluate.suite_report import Played, SuiteSettings, build_report, display_path
from shared.config import ConfigError, is_mario

DOCS = Path(__file__).resolve().parent.parent / "docs"


class SuiteError(Exception):
    """Bad input (exit 2); the message is one line that names it."""


def episode_seeds(eval_seed: int, episode: int) -> tuple[int, int]:
    """(env reset seed, epsilon-draw seed) of episode `episode` under evaluation seed `eval_seed`."""
    env_seed, policy_seed = np.random.SeedSequence([eval_seed, episode]).generate_state(2)
    return int(env_seed), int(policy_seed)


def play_level(env: Any, greedy: Policy, stack: int, num_actions: int, settings: SuiteSettings) -> list[Played]:
    """settings.episodes episodes under each evaluation seed, in seed order."""
    played = []
    for eval_seed in settings.eval_seeds:
        for k in range(settings.episodes):
            env_seed, policy_seed = episode_seeds(eval_seed, k)
            policy = epsilon_greedy(greedy, num_actions, settings.epsilon, np.random.default_rng(policy_seed))
            result = play_episode(env, policy, stack, k, seed=env_seed, max_steps=settings.max_steps)
            played.append(Played(eval_seed, result))
    return played


# ---------------------------------------------------------------------- input
def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise SuiteError(f"{flag}={text!r}: allowed comma-separated integers >= 0, e.g. 0,1,2") from None
    if any(v < 0 for v in values) or len(set(values)) != len(values):
        raise SuiteError(f"{flag}={text!r}: allowed distinct integers >= 0")
    return values


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m evaluate.suite", description=__doc__.split("\n")[0])
    p.add_argument("checkpoints", type=Path, nargs="+", help="run dirs or checkpoint/ dirs, one per training seed")
    p.add_argument("--levels", required=True, help="comma-separated: 1-2, SuperMarioBros-1-2-v0, "
                                                   "SuperMarioBrosRandomStages-v0 (World 1's stages at random)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per evaluation seed (default 10)")
    p.add_argument("--epsilon", type=float, default=0.05, help="random-action probability (default 0.05)")
    p.add_argument("--seeds", default="0,1,2", help="evaluation seeds, comma-separated (default 0,1,2)")
    p.add_argument("--max-steps", type=int, default=None, help="cap on agent steps per episode (default: env limit)")
    p.add_argument("--baselines", type=Path, default=DOCS,
                   help="folder of random_policy_*.json (default docs/): each level's random row")
    p.add_argument("--backend", default=None, help="Mario emulator backend (auto, nes-py, retro; default: the "
                   "checkpoint's config's)")
    p.add_argument("--out", type=Path, required=True, help="output folder: suite.json and suite.png")
    return p.parse_args(argv)


def _settings(args: argparse.Namespace) -> SuiteSettings:
    if args.episodes < 1:
        raise SuiteError(f"--episodes={args.episodes}: allowed an integer >= 1")
    if math.isnan(args.epsilon) or not 0.0 <= args.epsilon <= 1.0:
        raise SuiteError(f"--epsilon={args.epsilon}: allowed a number in [0, 1]")
    if args.max_steps is not None and args.max_steps < 1:
        raise SuiteError(f"--max-steps={args.max_steps}: allowed an integer >= 1")
    return SuiteSettings(parse_levels(args.levels), args.episodes, _int_list("--seeds", args.seeds),
                         args.epsilon, args.max_steps)


def _load_all(paths: Sequence[Path], levels: Sequence[Level], backend: str | None = None) -> list[tuple[Any, Any]]:
    """(checkpoint data, Config) per path: every one a Mario checkpoint, all on one action set and frame skip;
    `backend` replaces the checkpoint's env.backend."""
    if backend is not None:
        try:
            check_backend(backend)
        except ConfigError as exc:
            raise SuiteError(f"--backend: {exc}") from exc
    loaded = []
    for path in paths:
        data, cfg, _ = load_run(path)
        if backend is not None:
            cfg = replace(cfg, env=replace(cfg.env, backend=backend))
        where = data.path or path
        if not is_mario(cfg.env.env_id):
            raise SuiteError(f"{where}: trained on {cfg.env.env_id}, not Super Mario Bros: it has no levels")
        for level in levels:
            try:
                check_env_config(level_env_config(cfg.env, level))
            except ConfigError as exc:
                raise SuiteError(f"{where} on {level.env_id}: {exc}") from exc
        loaded.append((data, cfg))
    setups = {(cfg.env.action_set, cfg.env.frame_skip) for _, cfg in loaded}
    if len(setups) > 1:
        raise SuiteError(f"the checkpoints disagree on (action set, frame skip): {sorted(setups)}; "
                         "aggregate training seeds of one configuration")
    return loaded


# ---------------------------------------------------------------------- run
def run_suite(args: argparse.Namespace) -> dict[str, Any]:
    settings = _settings(args)
    loaded = _load_all(args.checkpoints, settings.levels, args.backend)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SuiteError(f"--out={args.out}: cannot create it ({exc.strerror or exc})") from exc
    env_cfg0 = loaded[0][1].env
    baselines = {lv.name: find_baseline(level_env_config(env_cfg0, lv), args.baselines) for lv in settings.levels}
    checkpoints = [{"path": display_path(data.path), "counters": dict(data.counters), "env": asdict(cfg.env)}
                   for data, cfg in loaded]
    print(f"{len(loaded)} checkpoint(s) x {len(settings.levels)} level(s) x {settings.episodes_per_level} episodes "
          f"(seeds {','.join(map(str, settings.eval_seeds))}), epsilon {settings.epsilon}, "
          f"{env_cfg0.action_set}, skip {env_cfg0.frame_skip}, emulator {backend_label(env_cfg0.backend)}", flush=True)
    played: dict[tuple[int, str], list[Played]] = {}
    for i, (data, cfg) in enumerate(loaded):
        greedy = None
        for level in settings.levels:
            t0 = time.perf_counter()
            env = make_env(level_env_config(cfg.env, level))
            try:
                if greedy is None:  # every level env has the checkpoint's geometry: load the network once
                    greedy, stack, num_actions = load_greedy(data, env)
                played[(i, level.name)] = play_level(env, greedy, stack, num_actions, settings)
            finally:
                env.close()
            results = [p.result for p in played[(i, level.name)]]
            flags = sum(r.flag_get for r in results)
            print(f"checkpoint {i + 1}/{len(loaded)} {checkpoints[i]['path']}  {level.name:>9}: "
                  f"flag {flags}/{len(results)}  x_pos mean {np.mean([r.x_pos for r in results]):7.1f} "
                  f"max {max(r.x_pos for r in results):5d}  return mean {np.mean([r.ret for r in results]):7.1f}  "
                  f"[{time.perf_counter() - t0:.1f}s]", flush=True)
    return build_report(settings, checkpoints, played, baselines)


def _print_summary(report: dict[str, Any]) -> None:
    n = len(report["checkpoints"])
    print(f"across {n} checkpoint(s): IQM [95% CI]" + ("  (one checkpoint: the interval is the point)" if n == 1
                                                       else ""))
    for level in report["levels"]:
        agg, rnd = level["across_checkpoints"], level["random"]
        flag, xs = agg["flag_rate"], agg["mean_x_pos"]
        base = (f"  | random: flag {rnd['flag_rate']:.0%}, x_pos {rnd['mean_x_pos']:.1f}" if rnd else
                "  | random: no docs/random_policy_*.json for this level")
        print(f"  {level['name']:>9}: flag rate {flag['iqm']:.0%} [{flag['ci_low']:.0%}, {flag['ci_high']:.0%}]  "
              f"mean x_pos {xs['iqm']:.1f} [{xs['ci_low']:.1f}, {xs['ci_high']:.1f}]{base}")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    try:
        report = run_suite(args)
    except (SuiteError, LevelError, EvalError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _print_summary(report)
    from evaluate.suite_plot import plot_suite

    (args.out / "suite.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    png = plot_suite(report, args.out / "suite.png")
    print(f"wrote {args.out / 'suite.json'} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
