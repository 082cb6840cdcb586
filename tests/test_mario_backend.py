"""env.backend: auto | nes-py | retro (envs/mario/backend.py), with and without stable-retro installed.

Without the optional install is simulated here, so both sides are checked on every machine: retro is refused in
one line, auto falls back to nes-py and says so once.
"""

from __future__ import annotations

import logging

import pytest

from envs.checks import check_config
from envs.mario import backend as mario_backend
from shared.config import Config, ConfigError, EnvConfig

pytestmark = pytest.mark.envonly


@pytest.fixture
def without_retro(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(mario_backend, "retro_installed", lambda: False)
    mario_backend._auto.cache_clear()
    yield
    mario_backend._auto.cache_clear()


def test_unknown_backend_is_one_line(without_retro) -> None:
    with pytest.raises(ConfigError, match=r"^env.backend='snes' is invalid: allowed auto, nes-py, retro$"):
        check_config(Config(env=EnvConfig(backend="snes")), None)


def test_retro_without_the_install_is_refused_in_one_line(without_retro) -> None:
    with pytest.raises(ConfigError) as err:
        check_config(Config(env=EnvConfig(backend="retro")), None)
    assert "\n" not in str(err.value)
    assert "env.backend='retro' cannot run: stable-retro is not installed (make install EXTRAS=retro)" in str(err.value)


def test_auto_falls_back_to_nes_py_with_one_log_line(without_retro, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="envs.mario.backend"):
        assert mario_backend.resolve_backend("auto") == "nes-py"
        assert mario_backend.resolve_backend("auto") == "nes-py"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["env.backend=auto: stable-retro is not installed (make install EXTRAS=retro), Mario runs on nes-py"]
    check_config(Config(env=EnvConfig(backend="auto")), None)  # accepted


def test_auto_picks_retro_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mario_backend, "retro_installed", lambda: True)
    mario_backend._auto.cache_clear()
    try:
        assert mario_backend.resolve_backend("auto") == "retro"
        assert mario_backend.resolve_backend("nes-py") == "nes-py"
    finally:
        mario_backend._auto.cache_clear()
