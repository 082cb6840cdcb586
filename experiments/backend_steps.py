"""Per env step CPU cost of the Mario env on each emulator backend (env.backend nes-py / retro), side by side.

Interleaved blocks in one process (nes-py, retro, retro with K envs time-sharing the one core, ...), so load
drift on a shared machine hits every side alike; reports min / median / max of the per-block cost per env
step (process CPU time, so the figures hold on a loaded box as long as this process gets a core).

    .venv/bin/python -m experiments.backend_steps --blocks 9 --steps 200
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import replace

import numpy as np

from envs.factory import make_env, parse_mario_id
from envs.mario.backend import retro_installed
from shared.config import ConfigError, EnvConfig


def _block(envs: list, rng: np.random.Generator, steps: int) -> float:
    """CPU seconds per env step over `steps` steps of each env in turn (biased-right random actions)."""
    n = envs[0].action_space.n
    actions = rng.choice(n, size=(steps, len(envs)))
    t0 = time.process_time()
    for row in actions:
        for env, action in zip(envs, row, strict=True):
            _, _, terminated, truncated, _ = env.step(int(action))
            if terminated or truncated:
                env.reset()
    return (time.process_time() - t0) / (steps * len(envs))


def swap_cost_us(env_config: EnvConfig, blocks: int, swaps: int = 2000) -> dict[str, float]:
    """Microseconds per swap of the retro core between two emulators (save one state, load the other)."""
    from envs.mario.retro import RetroMarioEmulator

    target, rom_mode = parse_mario_id(env_config.env_id)
    a, b = RetroMarioEmulator(target, rom_mode), RetroMarioEmulator(target, rom_mode)
    try:
        a.reset()
        b.reset()
        costs = []
        for _ in range(blocks):
            t0 = time.process_time()
            for _ in range(swaps):
                a.own()
                b.own()
            costs.append((time.process_time() - t0) / (2 * swaps) * 1e6)
    finally:
        a.close()
        b.close()
    return {"min_us": min(costs), "median_us": statistics.median(costs), "max_us": max(costs)}


def measure(env_config: EnvConfig, blocks: int, steps: int, shared_k: int) -> dict[str, dict[str, float]]:
    sides: dict[str, list] = {"nes-py": [make_env(replace(env_config, backend="nes-py"))]}
    if retro_installed():
        sides["retro"] = [make_env(replace(env_config, backend="retro"))]
        if shared_k > 1:
            sides[f"retro x{shared_k} sharing the core"] = [make_env(replace(env_config, backend="retro"))
                                                            for _ in range(shared_k)]
    for envs in sides.values():
        for i, env in enumerate(envs):
            env.reset(seed=i)
    rng = np.random.default_rng(0)
    costs: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for _ in range(blocks):
            for name, envs in sides.items():
                costs[name].append(_block(envs, rng, steps))
    finally:
        for envs in sides.values():
            for env in envs:
                env.close()
    out = {name: {"min_ms": 1e3 * min(c), "median_ms": 1e3 * statistics.median(c), "max_ms": 1e3 * max(c)}
           for name, c in costs.items()}
    if "retro" in costs:
        ratios = [r / n for r, n in zip(costs["retro"], costs["nes-py"], strict=True)]
        out["retro / nes-py"] = {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.backend_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="SuperMarioBros-1-1-v0")
    parser.add_argument("--blocks", type=int, default=9)
    parser.add_argument("--steps", type=int, default=200, help="env steps per env per block")
    parser.add_argument("--shared-k", type=int, default=4, help="retro envs time-sharing the core in one more side")
    args = parser.parse_args(argv)
    try:
        if parse_mario_id(args.env)[0] is None:
            raise ConfigError(f"--env={args.env}: allowed a stage id such as SuperMarioBros-1-1-v0")
        for name in ("blocks", "steps", "shared_k"):
            if getattr(args, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)}: allowed an integer >= 1")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = measure(EnvConfig(env_id=args.env), args.blocks, args.steps, args.shared_k)
    rounded = {k: {m: round(v, 3) for m, v in r.items()} for k, r in result.items()}
    report = {"python": platform.python_version(), "env": args.env, "blocks": args.blocks,
              "steps_per_block": args.steps, "cpu_per_env_step": rounded}
    if retro_installed():
        report["retro_core_swap"] = {m: round(v, 2) for m, v in swap_cost_us(EnvConfig(env_id=args.env),
                                                                             args.blocks).items()}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
