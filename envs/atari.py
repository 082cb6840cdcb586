"""Atari (ale-py `ALE/<Game>-v5` ids) as a Gymnasium env with the standard DQN preprocessing, fused.

Observation: ONE uint8 (frame_size, frame_size) grayscale frame, the pixel-wise max of the last
two emulator frames of the agent step (ALE's own grayscale palette), resized with INTER_AREA -
the same image path as Mario (frame stacking belongs to the collector and the replay).

Preprocessing (Mnih et al. 2015, as OpenAI Baselines' wrap_deepmind and Gymnasium's
AtariPreprocessing do it), applied per agent step / reset:
  * frame skip: the action is repeated `frame_skip` emulator frames, rewards summed;
  * max-pool of the last two frames (Atari sprites flicker between frames);
  * no-op starts: a full reset plays 1..noop_max NOOP frames (random per reset, from np_random);
  * FIRE on reset in games whose action 1 is FIRE (Breakout does not serve otherwise): after a
    reset or a lost life, one agent step of FIRE then one of action 2, rewards dropped (Baselines);
  * life loss as terminal for learning (life_loss_terminal): a step that loses a life (lives still
    > 0) returns terminated=True with info["episode_continues"]=True. The game is NOT over: the
    next `reset()` (without a seed) goes on playing it (one NOOP step, then FIRE where needed)
    instead of restarting. The collector flags the transition terminal (no bootstrap) but keeps
    one episode, for reporting, until the game is over (envs/factory.episode_continues);
  * reward clipping to [-1, 1] (clip_rewards); info["raw_reward"] keeps the unclipped score so
    reported episode returns are game scores;
  * truncated=True after max_episode_steps agent steps of one game, or at ALE's own frame cap
    (v5: 108,000 frames).
Sticky actions stay as the id registers them (v5: repeat_action_probability 0.25, inside ALE).

Why fused (one class driving ALEInterface, not a chain of wrappers over `env.step`): the package
env's `step` copies the RGB screen and builds an info dict on every frame; this class reads the
gray screen on the last two frames of a step only. Even so it is no faster than stepping the raw
env four times (3.6k vs 3.7k agent steps/s per process, BENCHMARKS.md "Atari"): the 210x160 ->
84x84 INTER_AREA resize (~40 us, the standard's interpolation) costs what the saved copies gain.

`AtariEnv` drives any `AtariEmulator` (the real one is `AleEmulator`), so the preprocessing is
tested on scripted screens, lives and rewards without a ROM (tests/test_atari_env.py).
"""

from __future__ import annotations

from typing import Any, Protocol, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.emulator_env import EmulatorEnv

EPISODE_CONTINUES = "episode_continues"  # info key: terminal for learning, the game (episode) goes on
NOOP = 0  # index 0 of every ALE minimal action set
FIRE = 1  # index of FIRE in the games that need it (action_meanings[1] == "FIRE")


def register_ale() -> None:
    """Register ale-py's `ALE/*` ids with Gymnasium (1.x registers them only on request).

    ImportError (naming the pinned package) when ale-py is not installed; the ROMs ship inside
    the ale-py wheel, so nothing is downloaded.
    """
    try:
        import ale_py
    except ImportError as exc:
        raise ImportError(f"ALE ids need ale-py (pip install -e . installs the pinned version): {exc}") from exc
    gym.register_envs(ale_py)  # importing ale_py registers them; this says so (and keeps the import used)
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no version banner on stderr per emulator


class AtariEmulator(Protocol):
    """One Atari game, driven a frame at a time; actions are indices into `action_meanings`."""

    action_meanings: tuple[str, ...]
    screen_shape: tuple[int, int]  # (height, width) of the grayscale screen

    def reset(self, seed: int | None) -> None: ...  # start a new game; a seed also seeds the emulator
    def act(self, action: int) -> float: ...  # one frame; its reward
    def gray_into(self, out: np.ndarray) -> None: ...  # the current screen, grayscale, into `out`
    def lives(self) -> int: ...
    def game_over(self) -> bool: ...  # no more frames: the game ended or the frame cap was hit
    def truncated(self) -> bool: ...  # the game was cut by the emulator's frame cap
    def rgb(self) -> np.ndarray: ...  # the current screen as (H, W, 3) uint8, for rendering
    def close(self) -> None: ...


class AleEmulator:
    """`AtariEmulator` over ale-py's ALEInterface for one `ALE/<Game>-v5` id (frameskip 1 underneath)."""

    def __init__(self, env_id: str) -> None:
        register_ale()
        # frameskip=1: the skip and max-pool are ours; the id's other settings (sticky actions,
        # minimal action set, frame cap) stay as registered
        self._env = gym.make(env_id, frameskip=1, disable_env_checker=True).unwrapped
        self._ale = self._env.ale
        self._action_set = list(self._env._action_set)  # minimal set: agent index -> ALE action
        self.action_meanings = tuple(self._env.get_action_meanings())
        self.repeat_action_probability = float(self._ale.getFloat("repeat_action_probability"))
        height, width = self._ale.getScreenDims()
        self.screen_shape = (int(height), int(width))

    def reset(self, seed: int | None) -> None:
        if seed is None:
            self._ale.reset_game()
        else:
            self._env.reset(seed=seed)  # seeds ALE (sticky actions) and reloads the ROM, then resets

    def act(self, action: int) -> float:
        return float(self._ale.act(self._action_set[action]))

    def gray_into(self, out: np.ndarray) -> None:
        self._ale.getScreenGrayscale(out)

    def lives(self) -> int:
        return int(self._ale.lives())

    def game_over(self) -> bool:
        return bool(self._ale.game_over())  # with_truncation=True: the frame cap ends play too

    def truncated(self) -> bool:
        return bool(self._ale.game_truncated())

    def rgb(self) -> np.ndarray:
        return self._ale.getScreenRGB()

    def close(self) -> None:
        self._env.close()


def _count(name: str, value: int, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}={value!r} is invalid: allowed an integer >= {lo}")
    return int(value)


class AtariEnv(EmulatorEnv):
    """Fused DQN preprocessing over an `AtariEmulator` (see the module docstring)."""

    def __init__(
        self,
        emulator: AtariEmulator,
        *,
        frame_skip: int = 4,
        frame_size: int = 84,
        noop_max: int = 30,
        clip_rewards: bool = False,
        life_loss_terminal: bool = True,
        max_episode_steps: int = 27_000,
        render_mode: str | None = None,
    ) -> None:
        super().__init__(render_mode)
        self._frame_skip = _count("frame_skip", frame_skip, 1)
        self._frame_size = _count("frame_size", frame_size, 1)
        self._noop_max = _count("noop_max", noop_max, 0)
        self._max_steps = _count("max_episode_steps", max_episode_steps, 1)
        self._clip = bool(clip_rewards)
        self._life_loss_terminal = bool(life_loss_terminal)
        meanings = tuple(emulator.action_meanings)
        self.action_meanings = meanings
        self.needs_fire = len(meanings) >= 3 and meanings[FIRE] == "FIRE"
        # sticky actions happen inside the emulator (ALE v5 ids: 0.25); shown in the head's first log line
        self.repeat_action_probability = float(getattr(emulator, "repeat_action_probability", 0.0))
        self.action_space = spaces.Discrete(len(meanings))
        self._attach(emulator, emulator.screen_shape, self._frame_skip, self._frame_size)
        self._t = 0  # agent steps of the current game (all its lives)
        self._lives = 0
        self._needs_reset = True
        self._continue = False  # the last step lost a life and the game goes on at the next reset()

    # ------------------------------------------------------------------ API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        continued = self._continue and seed is None
        self._continue = False
        if not (continued and self._resume_after_life_loss()):
            continued = False
            self._new_game(seed)
        self._lives = self._open().lives()
        self._needs_reset = False
        return self._resize(), {"lives": self._lives, "continued": continued}

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self._needs_reset:
            raise RuntimeError("AtariEnv.step() called before reset() or after the episode ended: call reset()")
        try:
            if not 0 <= action < self.action_space.n:
                raise IndexError
            action = int(action)
        except (IndexError, TypeError):
            raise ValueError(
                f"action={action!r} is invalid: allowed an integer in [0, {self.action_space.n - 1}]"
            ) from None
        emu = self._open()
        raw, ended = self._skip(action)
        obs = self._resize()
        lives = emu.lives()
        life_lost = 0 < lives < self._lives  # the last life's loss is the game over itself
        self._lives = lives
        self._t += 1
        cut = emu.truncated()
        game_over = ended and not cut
        truncated = cut or self._t >= self._max_steps
        terminated = game_over or (self._life_loss_terminal and life_lost)
        continues = terminated and not game_over and not truncated
        if terminated or truncated:
            self._needs_reset = True
            self._continue = continues
        reward = min(1.0, max(-1.0, raw)) if self._clip else raw
        info = {"lives": lives, "raw_reward": raw, EPISODE_CONTINUES: continues}
        return obs, reward, terminated, truncated, info

    # ------------------------------------------------------------------ helpers
    def _skip(self, action: int) -> tuple[float, bool]:
        """Repeat `action` frame_skip frames; the max of the last two screens into _gray[0]. (reward, game over)"""
        emu = self._open()
        reward = 0.0

        def one_frame() -> bool:
            nonlocal reward
            reward += emu.act(action)
            return emu.game_over()

        ended = self._skip_pooled(self._frame_skip, one_frame)
        return reward, ended

    def _fire(self) -> bool:
        """FIRE, then action 2, one agent step each (where the game needs it); True if the game ended."""
        if not self.needs_fire:
            return False
        return self._skip(FIRE)[1] or self._skip(2)[1]

    def _resume_after_life_loss(self) -> bool:
        """Go on with the game after a lost life: one NOOP step, then FIRE where needed; False if it ended."""
        return not (self._skip(NOOP)[1] or self._fire())

    def _new_game(self, seed: int | None) -> None:
        """Reset the game, play 1..noop_max NOOP frames, then FIRE where needed; again if the game ended."""
        emu = self._open()
        self._t = 0
        for attempt in range(3):  # a game cannot end in 30 frames; the bound only guards a broken emulator
            emu.reset(seed if attempt == 0 else None)
            noops = int(self.np_random.integers(1, self._noop_max + 1)) if self._noop_max > 0 else 0
            ended = False
            for _ in range(noops):
                emu.act(NOOP)
                if emu.game_over():
                    ended = True
                    break
            if ended:
                continue
            emu.gray_into(self._gray[0])
            if not self._fire():
                return
        raise RuntimeError("the Atari game ended during every reset's no-op/FIRE start")


def make_atari_env(
    env_id: str,
    *,
    frame_skip: int = 4,
    frame_size: int = 84,
    noop_max: int = 30,
    clip_rewards: bool = False,
    life_loss_terminal: bool = True,
    max_episode_steps: int = 27_000,
    render_mode: str | None = None,
) -> AtariEnv:
    """The preprocessed env for an `ALE/<Game>-v5` id (gymnasium.error.Error for an unknown game)."""
    return AtariEnv(
        AleEmulator(env_id),
        frame_skip=frame_skip,
        frame_size=frame_size,
        noop_max=noop_max,
        clip_rewards=clip_rewards,
        life_loss_terminal=life_loss_terminal,
        max_episode_steps=max_episode_steps,
        render_mode=render_mode,
    )


def make_raw_ale(env_id: str) -> gym.Env:
    """ale-py's own env for `env_id`, unwrapped, one emulator frame per step (the emulator ceiling's env)."""
    register_ale()
    return gym.make(env_id, frameskip=1, disable_env_checker=True).unwrapped
