"""The eager CPU learner of whichever checkout is first on sys.path: updates/s and process CPU ms per update.

For comparing two commits' learners where bench.learner_step's modes are the same on both sides: run it in each
checkout's worktree in turn, alternating, so the VM's drift hits both alike:

    for r in 1 2 3; do for d in ../old ../new; do (cd $d && PYTHONPATH=$d python -m experiments.learner_checkouts \\
        --precision fp32 --threads 2 --seconds 4); done; done

Geometry and replay as bench.learner_step's (Mario's 84x84 frames, stacks of 4, the real prioritized replay of 20k
random frames); prints one JSON line: precision, threads, prefetch and per block (updates/s, CPU ms per update).
Fed docs/experiments/learner_cpu.md ("the one update function", results/bench/one_update_fp32_ab_2026-12-04.json).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
import torch


def measure(precision: str, threads: int, prefetch: bool, seconds: float, blocks: int = 3) -> dict:
    from bench.learner import NUM_ACTIONS, OBS_SHAPE, STACK, real_replay
    from bench.learner_step import learner_config
    from learner.trainer import Learner
    from shared.config import Config

    try:
        from envs.spec import EnvSpec
    except ImportError:  # a checkout from before the envs/ package
        from shared.env_spec import EnvSpec  # type: ignore[no-redef]

    torch.set_num_threads(threads)
    dev = torch.device("cpu")
    replay = real_replay(dev, 20_000)
    lc = replace(learner_config("eager", 32, precision, dev), prefetch=prefetch, torch_threads=threads)
    cfg = Config(learner=lc)
    cfg = replace(cfg, replay=replace(cfg.replay, storage_device="auto"))
    learner = Learner(cfg.learner, cfg.replay, EnvSpec(OBS_SHAPE, np.uint8, NUM_ACTIONS, STACK), replay, dev,
                      config_json=cfg.to_json())
    try:
        learner.run_updates(10)
        out = []
        for _ in range(blocks):
            n, c0, t0 = 0, time.process_time(), time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                learner.run_updates(8)
                n += 8
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out.append((round(n / wall, 2), round(cpu / n * 1000, 1)))
    finally:
        learner.close()
    return {"precision": precision, "threads": threads, "prefetch": prefetch, "blocks": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.learner_checkouts", description=__doc__.splitlines()[0])
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-prefetch", action="store_true")
    p.add_argument("--seconds", type=float, default=4.0, help="per block (3 blocks)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.seconds <= 0:
        p.error("--threads must be >= 1 and --seconds > 0")
    print(json.dumps(measure(args.precision, args.threads, not args.no_prefetch, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
