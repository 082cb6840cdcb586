"""The first thing a user sees is the project's own output: making and stepping a Mario env prints
nothing (old gym's "Gym has been unmaintained ..." banner, printed by `import gym` on the
Python < 3.13 generation, stays off the terminal), in a fresh interpreter as a collector has."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.cluster import ROOT

pytestmark = pytest.mark.envonly

MAKE_AND_STEP = """
from shared.config import EnvConfig
from envs.factory import make_env

env = make_env(EnvConfig())
env.reset(seed=0)
env.step(1)
env.close()
"""

# what `make install` runs to check the install: Mario's package first, through the project's import
INSTALL_CHECK = """
from envs.mario.emulator import import_mario_package

import_mario_package()
import nes_py  # noqa: F401
"""


@pytest.mark.parametrize("code", [MAKE_AND_STEP, INSTALL_CHECK], ids=["make_env", "install_check"])
def test_mario_env_prints_nothing(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""
