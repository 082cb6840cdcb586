"""CPU time per agent step of the project's Mario env under a few simple policies (one process).

    python scripts/env_policy_cost.py [--steps 3000] [--repeats 2]

Does the policy change what an env step costs? Random actions die often (more resets); a mostly
constant action (what an untrained Q-network with Ape-X epsilons tends to pick) scrolls the level
or stands still. `make bench` divides the pipeline's CPU per step by the project env's under
random actions, so a large difference here would bias cpu_efficiency.
"""

from __future__ import annotations

import argparse
import random
import time

from shared.config import EnvConfig
from shared.env_factory import make_env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    env = make_env(EnvConfig())
    n = int(env.action_space.n)

    def eps_greedy(action: int, eps: float):
        return lambda rng: rng.randrange(n) if rng.random() < eps else action

    policies = {"random": lambda rng: rng.randrange(n), "right, eps 0.4": eps_greedy(1, 0.4),
                "right+A, eps 0.05": eps_greedy(2, 0.05), "noop, eps 0.05": eps_greedy(0, 0.05)}
    for rep in range(args.repeats):
        for name, policy in policies.items():
            rng = random.Random(rep)
            env.reset(seed=rep)
            episodes = 0
            t0 = time.process_time()
            for _ in range(args.steps):
                _, _, terminated, truncated, _ = env.step(policy(rng))
                if terminated or truncated:
                    env.reset()
                    episodes += 1
            ms = (time.process_time() - t0) / args.steps * 1e3
            print(f"repeat {rep}  {name:<18} {ms:.2f} ms CPU per step  ({episodes} episodes ended)")


if __name__ == "__main__":
    main()
