"""Super Mario Bros as a Gymnasium env: one fused wrapper over the bare emulator.

Observation: ONE uint8 (frame_size, frame_size) grayscale frame, the pixel-wise max of the
last two emulator frames of the agent step, converted with OpenCV's BGRA2GRAY weights and
resized with INTER_AREA (frame stacking belongs to the collector and the replay).

Why fused: a wrapper chain (action mapping -> max-and-skip over the package `step` ->
grayscale -> resize -> time limit) pays a Python layer per frame and per wrapper, copies the
negative-stride RGB screen twice per step and converts it to gray in float. This class fuses
them: ~1.6x the chain's speed on nes-py 8, as fast as the bare package env (BENCHMARKS.md,
"Design measurements").

Reward (the same on both package generations; 9.x changed the package's own), per agent step t:
    progress  = x_t - x_{t-1}, set to 0 when |dx| > 5 * frame_skip (respawn, pipe, new stage)
    time      = min(0, time_t - time_{t-1})          (the in-game clock, ~ -1 per 6 steps)
    death     = -25 on a step in which Mario is dying or dead, unless the previous step already
                was (the last life's death spans two steps: once per life lost)
    flag      = +50 on the step flag_get becomes true (once per flag)
    reward    = progress + time + death + flag, clipped to [-1, 1] when clip_rewards.

Episode ends:
  * stage ids (SuperMarioBros-W-S-vN): terminated on the first death or on the flag, whatever
    life_loss_terminal says (as in the package: a stage episode is one life of one stage);
  * full-game ids (SuperMarioBros-vN): life_loss_terminal=True -> terminated when a life is
    lost; False -> Mario respawns (the death animation and life screen are skipped) and the
    episode terminates at game over. Reaching a flag never ends a full-game episode.
  * truncated=True (terminated=False unless the game also ended) after max_episode_steps agent
    steps, as Gymnasium's TimeLimit does.
Every reset restores the state right after the start screen: the emulator has no randomness,
so episodes are fully determined by the actions; `seed` only seeds `np_random`.

Backends (`backend`, envs/mario/backend.py): "nes-py" (the package's emulator) or "retro" (stable-retro's FCEUmm
core, envs/mario/retro.py): everything above the emulator's frame is this class, the same for both.

info: x_pos, flag_get (reached on this step), world, stage, score, life, time - read from RAM.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import numpy as np
from gymnasium import spaces

from envs.emulator_env import EmulatorEnv
from envs.mario.actions import action_buttons
from envs.mario.backend import open_emulator
from envs.mario.emulator import DIED, ENDED, FLAG, SCREEN_HEIGHT, SCREEN_WIDTH
from envs.mario.reward import DEATH_PENALTY, FLAG_BONUS, max_dx


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} is invalid: allowed a positive integer")
    return int(value)


class MarioEnv(EmulatorEnv):
    """Fused Mario env (action set, frame skip + max, grayscale, resize, RAM reward, time limit)."""

    def __init__(
        self,
        target: tuple[int, int] | None = (1, 1),
        *,
        action_set: str = "simple",
        frame_skip: int = 4,
        frame_size: int = 84,
        clip_rewards: bool = False,
        life_loss_terminal: bool = True,
        max_episode_steps: int = 4500,
        rom_mode: str = "vanilla",
        render_mode: str | None = None,
        backend: str = "nes-py",
    ) -> None:
        super().__init__(render_mode)
        self._buttons = action_buttons(action_set)  # raises ValueError naming the allowed sets
        self._frame_skip = _positive_int("frame_skip", frame_skip)
        self._frame_size = _positive_int("frame_size", frame_size)
        self._max_steps = _positive_int("max_episode_steps", max_episode_steps)
        self._clip = bool(clip_rewards)
        self._stop_on_life_loss = bool(life_loss_terminal)
        self._max_dx = max_dx(self._frame_skip)
        self.action_space = spaces.Discrete(len(self._buttons))
        emulator = open_emulator(backend, target, rom_mode)
        self._attach(emulator, (SCREEN_HEIGHT, SCREEN_WIDTH), self._frame_skip, self._frame_size)
        self._needs_reset = True
        self._t = 0
        self._x_last = 0
        self._time_last = 0
        self._died_last = False
        self._flag_last = False

    # ------------------------------------------------------------------ API
    @property
    def ram(self) -> np.ndarray:
        """The live NES RAM (2048 uint8), like the package env's `ram`."""
        return self._open().ram_array

    @property
    def generation(self) -> str:
        return self._open().generation

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        emu = self._open()
        emu.reset()
        ram = emu.ram
        self._t = 0
        self._x_last = ram.x_pos()
        self._time_last = ram.time()
        self._died_last = False
        self._flag_last = False
        self._needs_reset = False
        emu.gray_into(self._gray[0])
        return self._resize(), self._info(False)

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("MarioEnv.step() called before reset() or after the episode ended: call reset()")
        emu = self._open()
        try:
            if not 0 <= action < len(self._buttons):
                raise IndexError
            buttons = self._buttons[action]
        except (IndexError, TypeError):
            raise ValueError(
                f"action={action!r} is invalid: allowed an integer in [0, {len(self._buttons) - 1}]"
            ) from None

        stop = self._stop_on_life_loss
        frame = emu.frame
        events = 0

        def one_frame() -> bool:
            nonlocal events
            ev = frame(buttons, stop)
            events |= ev
            return bool(ev & ENDED)

        self._skip_pooled(self._frame_skip, one_frame)
        obs = self._resize()

        ram = emu.ram
        x = ram.x_pos()
        clock = ram.time()
        died = bool(events & DIED)
        flag = bool(events & FLAG)
        dx = x - self._x_last
        reward = float(dx if -self._max_dx <= dx <= self._max_dx else 0)
        if clock < self._time_last:
            reward += clock - self._time_last
        if died and not self._died_last:
            reward += DEATH_PENALTY
        if flag and not self._flag_last:
            reward += FLAG_BONUS
        if self._clip:
            reward = min(1.0, max(-1.0, reward))
        self._x_last = x
        self._time_last = clock
        self._died_last = died
        self._flag_last = flag

        self._t += 1
        terminated = bool(events & ENDED)
        truncated = self._t >= self._max_steps
        if terminated or truncated:
            self._needs_reset = True
        return obs, reward, terminated, truncated, self._info(flag)

    # ------------------------------------------------------------------ helpers
    def _info(self, flag: bool) -> dict[str, Any]:
        ram = self._open().ram
        return {
            "x_pos": ram.x_pos(),
            "flag_get": flag,
            "world": ram.world(),
            "stage": ram.stage(),
            "score": ram.score(),
            "life": ram.life(),
            "time": ram.time(),
        }
