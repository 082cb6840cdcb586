"""`make run ARGS="--env ALE/Pong-v5 --max-env-steps 3000"`: a short Pong run through the real CLI, real collector
processes and the Nature CNN on 84x84 uint8 frames (~30-40 s on 2 cores, most of it start-up)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_pong_runs_through_the_cli_on_the_image_path(tmp_path: Path) -> None:
    import torch

    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "launcher", "--profile", "cpu", "--env", "ALE/Pong-v5", "--max-env-steps", "3000",
            "--run-dir", str(run_dir), "--port", "0", "--log-interval", "2",
            # learn from 1,000 transitions on (the preset's warmup is the profile's 5,000): the CNN trains too
            "--set", "learner.warmup_transitions=1000", "--set", "logging.tensorboard=false"]
    # the step budget ends the run; the timeout only bounds a broken one (its fp32 updates on a loaded 2-core
    # machine set the pace: ~100 s there)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    done = [line for line in proc.stdout.splitlines() if line.startswith("[DONE] ")]
    assert done, proc.stdout[-2000:]
    summary = ast.literal_eval(done[-1].removeprefix("[DONE] "))
    assert summary["reason"] == "max_env_steps" and summary["env_steps"] >= 3000
    assert summary["updates"] > 0 and summary["rejected"] == 0 and summary["restarts"] == 0

    # the head's first env line says what the env became
    env_line = next(line for line in (run_dir / "head.log").read_text().splitlines() if " env ALE/Pong-v5: " in line)
    for words in ("Atari preprocessing", "skip 4 + max-pool", "life loss terminal on", "FIRE reset on",
                  "reward clipping on", "image path: Nature CNN on 4 x 84x84 uint8", "6 actions",
                  "obs (84, 84) uint8, stack 4"):
        assert words in env_line, (words, env_line)
    # and the learner's network is the CNN over 4 stacked frames
    online = torch.load(run_dir / "checkpoint" / "model.pt", weights_only=True)["online"]
    assert tuple(online["torso.convs.0.weight"].shape) == (32, 4, 8, 8)
