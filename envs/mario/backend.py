"""Which NES emulator runs Mario: env.backend = auto | nes-py | retro.

  * "nes-py": gym-super-mario-bros' own emulator (always installed);
  * "retro":  stable-retro's FCEUmm core (envs/mario/retro.py), ~5x cheaper per frame; needs the optional
              install (`make install EXTRAS=retro`);
  * "auto":   retro where stable-retro is installed, else nes-py (said once per process in the log).
Both give the same Gymnasium env (envs/mario/env.py); tests/test_mario_retro.py measures how alike.
"""

from __future__ import annotations

import logging
from functools import cache

from shared.config import ConfigError

BACKENDS = ("auto", "nes-py", "retro")
RETRO_MISSING = "stable-retro is not installed (make install EXTRAS=retro)"

log = logging.getLogger(__name__)


@cache
def retro_installed() -> bool:
    """Whether stable-retro can be imported (checked once per process: the import is ~0.1 s)."""
    from envs.mario.retro import retro_available

    return retro_available()


def check_backend(backend: object) -> None:
    """ConfigError (one line) unless `backend` is a known backend this install can run."""
    if backend not in BACKENDS:
        raise ConfigError(f"env.backend={backend!r} is invalid: allowed {', '.join(BACKENDS)}")
    if backend == "retro" and not retro_installed():
        raise ConfigError(f"env.backend='retro' cannot run: {RETRO_MISSING}; use env.backend=nes-py or auto")


@cache
def _auto() -> str:
    if retro_installed():
        return "retro"
    log.info("env.backend=auto: %s, Mario runs on nes-py", RETRO_MISSING)
    return "nes-py"


def resolve_backend(backend: str) -> str:
    """The backend that runs: `backend` itself, or for "auto" retro where installed, else nes-py."""
    check_backend(backend)
    return _auto() if backend == "auto" else backend


def backend_label(backend: str) -> str:
    """The backend that runs, for logs ("retro", "nes-py"); the configured value itself when it cannot run."""
    try:
        return resolve_backend(backend)
    except ConfigError:
        return str(backend)


def open_emulator(backend: str, target: tuple[int, int] | None, rom_mode: str):  # noqa: ANN201 - either emulator
    """A bare SMB1 emulator (MarioEmulator or RetroMarioEmulator) on the backend `backend` resolves to."""
    if resolve_backend(backend) == "retro":
        from envs.mario.retro import RetroMarioEmulator

        return RetroMarioEmulator(target, rom_mode)
    from envs.mario.emulator import MarioEmulator

    return MarioEmulator(target, rom_mode)
