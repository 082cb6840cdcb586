"""Record tests/data/mario_golden.json: fixed action sequences -> rewards, infos, frame hashes.

Why: the Mario reward, info and frames must be identical on both emulator generations
(nes-py 8 / gsmb 7.4 on Python 3.11 and nes-py 9 / gsmb 9.x on Python 3.13). The fixture is
recorded on one and tests/test_env_mario.py replays it on whichever is installed.

    make record-golden                            # rewrite the fixture
    python -m tests.record_mario_golden --check   # compare only, exit 1 on mismatch

The actions are stored in the fixture, so regenerating them is never needed to replay.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from envs.factory import make_env
from shared.config import EnvConfig

FIXTURE = Path(__file__).resolve().parent / "data" / "mario_golden.json"


def frame_hash(obs: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(obs).tobytes()).hexdigest()[:16]


def rollout(env_config: EnvConfig, actions: list[int]) -> dict[str, list[Any]]:
    """Play `actions`, resetting (seed = env_config.seed) whenever an episode ends."""
    env = make_env(env_config)
    out: dict[str, list[Any]] = {
        "reset_at": [],
        "reset_hash": [],
        "reward": [],
        "terminated": [],
        "truncated": [],
        "x_pos": [],
        "info": [],
        "hash": [],
    }
    try:
        needs_reset = True
        for t, action in enumerate(actions):
            if needs_reset:
                obs, info = env.reset(seed=env_config.seed)
                out["reset_at"].append(t)
                out["reset_hash"].append(frame_hash(obs))
            obs, reward, terminated, truncated, info = env.step(action)
            out["reward"].append(float(reward))
            out["terminated"].append(bool(terminated))
            out["truncated"].append(bool(truncated))
            out["x_pos"].append(int(info["x_pos"]))
            out["info"].append({k: info[k] for k in sorted(info)})
            out["hash"].append(frame_hash(obs))
            needs_reset = terminated or truncated
    finally:
        env.close()
    return out


def scenarios() -> list[tuple[str, EnvConfig, list[int]]]:
    rng = np.random.RandomState(20240601)
    # `simple`: walk right into the first goomba (death, reset), then random moves biased right
    simple = [1] * 60 + rng.choice(7, size=240, p=[0.05, 0.2, 0.25, 0.15, 0.25, 0.05, 0.05]).tolist()
    # full game, all lives: walking right dies on the first goomba three times -> game over
    walk = [1] * 130 + rng.choice(5, size=40).tolist()
    # complex actions, frame skip 3, clipped rewards, 25-step time limit
    complex_ = rng.randint(0, 12, size=70).tolist()
    return [
        ("stage_simple", EnvConfig(env_id="SuperMarioBros-1-1-v0", action_set="simple", seed=3), simple),
        (
            "full_game_lives",
            EnvConfig(env_id="SuperMarioBros-v0", action_set="right_only", life_loss_terminal=False),
            walk,
        ),
        (
            "truncate_clip",
            EnvConfig(
                env_id="SuperMarioBros-1-1-v0",
                action_set="complex",
                frame_skip=3,
                clip_rewards=True,
                max_episode_steps=25,
            ),
            complex_,
        ),
    ]


def replays_alike(recorded: list[dict[str, Any]], replayed: list[dict[str, Any]]) -> bool:
    """Same actions, rewards, infos and frames, and every recorded env config field unchanged. EnvConfig fields
    added since the recording are not in it: the outcomes show whether their defaults changed anything."""
    if len(recorded) != len(replayed):
        return False
    for old, new in zip(recorded, replayed, strict=True):
        outcomes = {k: v for k, v in old.items() if k != "env_config"}
        if outcomes != {k: v for k, v in new.items() if k != "env_config"}:
            return False
        if not old["env_config"].items() <= new["env_config"].items():
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.record_mario_golden", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare against the fixture instead of writing it")
    args = parser.parse_args()
    data: dict[str, Any] = {
        "recorded_with": {
            "python": platform.python_version(),
            "nes-py": metadata.version("nes-py"),
            "gym-super-mario-bros": metadata.version("gym-super-mario-bros"),
        },
        "scenarios": [],
    }
    for name, cfg, actions in scenarios():
        result = rollout(cfg, actions)
        data["scenarios"].append({"name": name, "env_config": dataclasses.asdict(cfg), "actions": actions, **result})
        deaths = sum(1 for r in result["reward"] if r <= -13)
        print(
            f"{name}: {len(actions)} steps, {len(result['reset_at'])} episodes, {deaths} death steps, "
            f"max x {max(result['x_pos'])}, truncations {sum(result['truncated'])}"
        )
    if args.check:
        old = json.loads(FIXTURE.read_text())
        same = replays_alike(old["scenarios"], json.loads(json.dumps(data["scenarios"])))
        print("fixture matches" if same else "fixture DIFFERS")
        return 0 if same else 1
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
