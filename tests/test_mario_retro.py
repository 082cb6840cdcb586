"""env.backend=retro against nes-py: the same game on stable-retro's FCEUmm core (envs/mario/retro.py).

Checked: the golden action sequences (tests/data/mario_golden.json, recorded on nes-py) replay on retro with the
same rewards, infos, episode ends and truncations; the 84x84 observations agree with nes-py's on the same
action sequences within FRAME_BOUND; every level id and random stages build, reset and step; several envs in
one process time-share the one core without disturbing each other. Skipped, with one line, where stable-retro
is not installed (`make install EXTRAS=retro`).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs.factory import make_env
from envs.mario.backend import retro_installed
from shared.config import EnvConfig
from tests.record_mario_golden import rollout

pytestmark = [
    pytest.mark.envonly,
    pytest.mark.skipif(not retro_installed(), reason="stable-retro not installed (make install EXTRAS=retro)"),
]

FIXTURE = Path(__file__).parent / "data" / "mario_golden.json"
# 84x84 frames, retro against nes-py on the same actions: the share of pixels that differ at all, and the mean
# absolute difference in gray levels. Measured 2026-12-02 on the golden sequences (`pytest -s` prints them): 0.56-0.68%
# of pixels differ, mean |diff| 0.19-0.27, all in the three outermost columns on each side (the 8 px the core crops,
# filled from 16 px inward); the interior matches exactly. The bounds
# leave room for that, not for a frame shifted by one pixel (test_the_bound_sees_a_shifted_frame)
FRAME_DIFFERING_SHARE = 0.01
FRAME_MEAN_ABS = 0.5


def _scenarios() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text())["scenarios"]


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s["name"])
def test_golden_sequences_replay_alike_on_retro(scenario: dict[str, Any]) -> None:
    cfg = EnvConfig(**{**scenario["env_config"], "backend": "retro"})
    out = rollout(cfg, scenario["actions"])
    for key in ("reset_at", "terminated", "truncated", "x_pos", "info", "reward"):
        first = next((t for t, (a, b) in enumerate(zip(out[key], scenario[key], strict=True)) if a != b), None)
        assert first is None, f"{key} differs from nes-py's first at {first}: {out[key][first]!r} != {scenario[key][first]!r}"


def _frames(cfg: EnvConfig, actions: list[int]) -> np.ndarray:
    env = make_env(cfg)
    frames = []
    try:
        obs, _ = env.reset(seed=cfg.seed)
        frames.append(obs)
        for action in actions:
            obs, _, terminated, truncated, _ = env.step(action)
            frames.append(obs)
            if terminated or truncated:
                obs, _ = env.reset(seed=cfg.seed)
                frames.append(obs)
    finally:
        env.close()
    return np.stack(frames)


def frame_agreement(cfg: EnvConfig, actions: list[int]) -> tuple[float, float, int]:
    """(share of differing pixels, mean |difference|, max |difference|) of retro's frames against nes-py's."""
    nes = _frames(replace(cfg, backend="nes-py"), actions).astype(np.int16)
    retro = _frames(replace(cfg, backend="retro"), actions).astype(np.int16)
    assert nes.shape == retro.shape
    diff = np.abs(nes - retro)
    return float(np.mean(diff > 0)), float(diff.mean()), int(diff.max())


@pytest.mark.parametrize("scenario", _scenarios(), ids=lambda s: s["name"])
def test_frames_agree_with_nes_py(scenario: dict[str, Any]) -> None:
    cfg = EnvConfig(**scenario["env_config"])
    share, mean_abs, max_abs = frame_agreement(cfg, scenario["actions"])
    print(f"{scenario['name']}: differing pixels {share:.4%}, mean |diff| {mean_abs:.3f}, max |diff| {max_abs}")
    assert share <= FRAME_DIFFERING_SHARE and mean_abs <= FRAME_MEAN_ABS, (share, mean_abs, max_abs)


def test_the_bound_sees_a_shifted_frame() -> None:
    """The bound fails a frame one pixel off: the agreement is not vacuous."""
    cfg = EnvConfig(env_id="SuperMarioBros-1-1-v0")
    frames = _frames(replace(cfg, backend="nes-py"), [1] * 30).astype(np.int16)
    shifted = np.roll(frames, 1, axis=2)
    diff = np.abs(frames - shifted)
    assert np.mean(diff > 0) > FRAME_DIFFERING_SHARE or diff.mean() > FRAME_MEAN_ABS


@pytest.mark.slow
def test_every_level_id_and_random_stages_run_on_retro() -> None:
    ids = [f"SuperMarioBros-{w}-{s}-v0" for w in range(1, 9) for s in range(1, 5)]
    ids += ["SuperMarioBros-v0", "SuperMarioBrosRandomStages-v0"]
    for env_id in ids:
        env = make_env(EnvConfig(env_id=env_id, backend="retro"))
        try:
            _, info = env.reset(seed=1)
            if env_id.count("-") == 3:
                world, stage = (int(x) for x in env_id.split("-")[1:3])
                assert (info["world"], info["stage"]) == (world, stage), env_id
            assert info["time"] > 0 and info["life"] == 2, (env_id, info)
            for _ in range(8):
                obs, _, terminated, truncated, info = env.step(1)
                assert obs.shape == (84, 84) and obs.dtype == np.uint8
                if terminated or truncated:
                    break
        finally:
            env.close()


def test_random_stages_draw_the_same_stages_on_both_backends() -> None:
    stages = {}
    for backend in ("nes-py", "retro"):
        env = make_env(EnvConfig(env_id="SuperMarioBrosRandomStages-v0", backend=backend))
        try:
            drawn = []
            _, info = env.reset(seed=7)
            drawn.append((info["world"], info["stage"]))
            for _ in range(5):
                _, info = env.reset()
                drawn.append((info["world"], info["stage"]))
            stages[backend] = drawn
        finally:
            env.close()
    assert stages["retro"] == stages["nes-py"]
    assert len(set(stages["retro"])) > 1


def test_envs_time_sharing_the_core_play_as_if_alone() -> None:
    """Two retro envs stepped in turn (one core per process) give the frames and rewards each gives alone."""
    cfg = EnvConfig(env_id="SuperMarioBros-1-1-v0", backend="retro")
    actions_a, actions_b = [1] * 40, [4, 1, 5, 1] * 10
    def step(env: Any, action: int) -> tuple[bytes, float]:
        obs, reward, *_ = env.step(action)
        return obs.tobytes(), float(reward)

    alone = []
    for actions in (actions_a, actions_b):
        env = make_env(cfg)
        env.reset(seed=0)
        alone.append([step(env, a) for a in actions])
        env.close()
    a, b = make_env(cfg), make_env(cfg)
    a.reset(seed=0)
    b.reset(seed=0)
    together: list[list[tuple[bytes, float]]] = [[], []]
    for x, y in zip(actions_a, actions_b, strict=True):
        together[0].append(step(a, x))
        together[1].append(step(b, y))
    a.close()
    b.close()
    assert together == alone


_ROM_MODE_CHECK = """
import json, sys
from dataclasses import replace
from shared.config import EnvConfig
from tests.record_mario_golden import rollout
from tests.test_mario_retro import frame_agreement
cfg = EnvConfig(env_id=sys.argv[1])
actions = [1] * 60 + [4, 1, 5] * 20
retro, nes = rollout(replace(cfg, backend="retro"), actions), rollout(cfg, actions)
print(json.dumps({"same": all(retro[k] == nes[k] for k in ("reward", "info", "terminated", "reset_at")),
                  "agreement": frame_agreement(cfg, actions)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("version", [1, 2, 3])
def test_other_rom_modes_replay_alike(version: int) -> None:
    """The -v1/-v2/-v3 ROMs (gym-super-mario-bros 7.4 only) on retro: one ROM per process, so each in its own."""
    import subprocess
    import sys

    from envs.mario.emulator import package_generation

    if package_generation() == "gymnasium":
        pytest.skip("gym-super-mario-bros 9.x ships only the vanilla ROM")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _ROM_MODE_CHECK, f"SuperMarioBros-1-1-v{version}"], cwd=root,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    share, mean_abs, _ = result["agreement"]
    assert result["same"] and share <= FRAME_DIFFERING_SHARE and mean_abs <= FRAME_MEAN_ABS, result
