"""Emulator ceiling and our env's speed on this interpreter's emulator generation (no torch).

`make bench` needs torch, which Python 3.13 does not get here; this measures both generations
the same way: raw package env steps/s with action repeat vs the project's fused env, N processes
in parallel. Usage:

    .venv/bin/python -m experiments.env_ceiling --collectors 1 2 --seconds 8
    .venv-py313/bin/python -m experiments.env_ceiling --collectors 1 2 --seconds 8
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

from bench.baselines import run_emulator_ceiling  # noqa: E402  (after OMP_NUM_THREADS: the workers inherit it)
from shared.config import EnvConfig  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.env_ceiling", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="SuperMarioBros-1-1-v0")
    parser.add_argument("--collectors", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--envs-per-collector", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    from importlib.metadata import version

    result = run_emulator_ceiling(EnvConfig(env_id=args.env), args.collectors, args.envs_per_collector, args.seconds,
                                  project_counts=args.collectors)
    rows = {kind: {n: round(r["sps"], 1) for n, r in per.items()} for kind, per in result.items()}
    print(json.dumps({"python": platform.python_version(), "nes_py": version("nes-py"),
                      "gym_super_mario_bros": version("gym-super-mario-bros"), "env": args.env,
                      "envs_per_collector": args.envs_per_collector, "seconds": args.seconds,
                      "agent_steps_per_s": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
