"""One Super Mario Bros emulator behind one interface, on both package generations.

Generations:
  * "gym"       - nes-py 8.2 / gym-super-mario-bros 7.4 (Python < 3.13, old gym API);
  * "gymnasium" - nes-py 9.x / gym-super-mario-bros 9.x (Python >= 3.13, Gymnasium API).

Both run the same emulator core: for the same button presses the RAM and the screen are
bit-identical (checked by tests/test_env_mario.py against a fixture recorded on the other one).

Why drive frames ourselves instead of calling the package's `step` once per frame: `step`
recomputes the package's reward and a large info dict on every frame (~50 us on nes-py 8,
~40 us on 9.x, i.e. ~200 us per agent step at frame skip 4) and the two generations differ in
reward and info. `frame()` keeps exactly the game logic of the package's `step` + `_did_step`
(identical in 7.4 and 9.x): end-of-episode test first, then skip the death animation, the
end-of-world cutscene, area changes and "busy" states. tests/test_env_mario.py checks that
the RAM matches the package's own `step` after every agent step, through deaths and respawns.

Why a raw BGRx view of the screen: `env.screen` is a negative-stride RGB view (copying it costs
~190 us, 430-530 us on a loaded box); the contiguous 240x256x4 BGRx buffer behind it converts to
gray with one `cv2.cvtColor(..., COLOR_BGRA2GRAY)` (~15 us, 27-43 us loaded). nes-py 9's native grayscale copy uses other
weights ((77R+150G+29B)>>8, off by one on some pixels), so both generations use cv2 to keep
pixels identical.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import sys
from importlib import metadata

import cv2
import numpy as np

from envs.mario.ram import (
    AREA,
    CHANGE_AREA_TIMER,
    PLAYER_STATE,
    PRELEVEL_TIMER,
    STAGE,
    STATE_DEAD,
    WORLD,
    MarioRam,
)

SCREEN_HEIGHT = 240
SCREEN_WIDTH = 256

# event bits returned by MarioEmulator.frame()
ENDED = 1  # the episode is over (package rule, or a life lost when stop_on_life_loss)
DIED = 2  # Mario was dying or dead on this frame
FLAG = 4  # flag_get: stage or world over on this frame
START = 0b00001000  # the joypad byte's start button (nes-py's bit order: right left down up start select B A)


def import_mario_package():
    """`gym_super_mario_bros`, imported without the banner old gym prints to stderr on import
    ("Gym has been unmaintained ..."): it says nothing a user of this project can act on."""
    with contextlib.redirect_stderr(io.StringIO()):
        import gym_super_mario_bros
    return gym_super_mario_bros


def package_generation() -> str:
    """'gymnasium' for nes-py >= 9 (Gymnasium-native), 'gym' for nes-py 8 (old gym)."""
    major = int(metadata.version("nes-py").split(".")[0])
    return "gymnasium" if major >= 9 else "gym"


def _bgrx_view(screen: np.ndarray) -> np.ndarray:
    """Contiguous (240, 256, 4) BGRx view of the emulator's frame buffer behind `screen`."""
    expected_strides = (SCREEN_WIDTH * 4, 4, -1)
    if (
        sys.byteorder != "little"
        or screen.shape != (SCREEN_HEIGHT, SCREEN_WIDTH, 3)
        or screen.strides != expected_strides
    ):
        raise RuntimeError(
            f"unexpected nes-py screen layout shape={screen.shape} strides={screen.strides} "
            f"byteorder={sys.byteorder}: expected a little-endian RGB view of a BGRx buffer"
        )
    # the RGB view starts at the R byte (offset 2) of the first BGRx pixel, walking backwards
    address = screen.__array_interface__["data"][0] - 2
    buffer = (ctypes.c_uint8 * (SCREEN_HEIGHT * SCREEN_WIDTH * 4)).from_address(address)
    raw = np.frombuffer(buffer, dtype=np.uint8).reshape(SCREEN_HEIGHT, SCREEN_WIDTH, 4)
    if not np.array_equal(raw[:, :, 2::-1], screen):
        raise RuntimeError("nes-py screen buffer is not BGRx: cannot build the fast grayscale view")
    return raw


class MarioFrames:
    """The package's frame semantics over any SMB1 emulator: a subclass gives `ram` (MarioRam), `single_stage`
    and `_advance(buttons)` (write the joypad byte, run one frame). One implementation for every backend."""

    ram: MarioRam
    single_stage: bool

    def _advance(self, buttons: int) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ one frame
    def frame(self, buttons: int, stop_on_life_loss: bool) -> int:
        """Advance one frame like the package's `step`; return ENDED | DIED | FLAG bits."""
        self._advance(buttons)
        ram = self.ram
        dying = ram.is_dying()
        died = dying or ram.is_dead()
        flag = ram.flag_get()
        events = (DIED if died else 0) | (FLAG if flag else 0)
        if self.single_stage:
            ended = died or flag
        else:
            ended = ram.is_game_over() or (stop_on_life_loss and died)
        if ended:
            return events | ENDED  # like the package: no skipping once the episode is over
        if dying:
            self._kill_mario()
        if not self.single_stage:
            self._skip_end_of_world()
        self._skip_change_area()
        self._skip_occupied_states()
        return events

    # the package's RAM hacks (same code in 7.4 and 9.x): skip frames nobody can act in
    def _kill_mario(self) -> None:
        self.ram.mem[PLAYER_STATE] = STATE_DEAD
        self._advance(0)

    def _skip_end_of_world(self) -> None:
        ram = self.ram
        if ram.is_world_over():
            time = ram.time()
            while ram.time() == time:
                self._advance(0)

    def _skip_change_area(self) -> None:
        mem = self.ram.mem
        timer = mem[CHANGE_AREA_TIMER]
        if 1 < timer < 255:
            mem[CHANGE_AREA_TIMER] = 1

    def _skip_occupied_states(self) -> None:
        ram = self.ram
        mem = ram.mem
        while ram.is_busy() or ram.is_world_over():
            mem[PRELEVEL_TIMER] = 0
            self._advance(0)

    # the package's start-screen skip (gym-super-mario-bros' SuperMarioBrosEnv._skip_start_screen, the same
    # in 7.4 and 9.x), for backends that do not run the package: press start until the clock runs, writing the
    # target stage into RAM meanwhile, then idle until the clock ticks
    def _skip_start_screen(self, target: tuple[int, int, int] | None) -> None:
        mem = self.ram.mem
        self._advance(START)
        self._advance(0)
        while self.ram.time() == 0:
            self._advance(START)
            if target is not None:
                world, stage, area = target
                mem[WORLD], mem[STAGE], mem[AREA] = world - 1, stage - 1, area - 1
            self._advance(0)
            mem[PRELEVEL_TIMER] = 0
        time_last = self.ram.time()
        while self.ram.time() >= time_last:
            time_last = self.ram.time()
            self._advance(START)
            self._advance(0)


class MarioEmulator(MarioFrames):
    """nes-py: a gym-super-mario-bros SMB1 env used as a bare emulator with the package's frame semantics.

    `target=(world, stage)` gives a single-stage game (the package ends it on death or flag);
    `target=None` the full game (the package ends it at game over).
    """

    def __init__(self, target: tuple[int, int] | None, rom_mode: str = "vanilla") -> None:
        # imported here: the old generation imports gym (slow) and non-Mario envs must not pay for it
        SuperMarioBrosEnv = import_mario_package().SuperMarioBrosEnv

        self.generation = package_generation()
        kwargs: dict[str, object] = {"target": target}
        if rom_mode != "vanilla":
            if self.generation == "gymnasium":
                raise ValueError(
                    f"rom_mode={rom_mode!r} (SuperMarioBros-...-v1/v2/v3) is not available in "
                    f"gym-super-mario-bros 9.x: use the -v0 (vanilla) ids"
                )
            kwargs["rom_mode"] = rom_mode
        # the constructor skips the start screen and takes the backup that reset() restores
        self._env = SuperMarioBrosEnv(**kwargs)
        self.single_stage = target is not None
        self.ram_array: np.ndarray = self._env.ram
        self.ram = MarioRam(self.ram_array)
        self._bgrx = _bgrx_view(self._env.screen)
        self._advance = self._env._frame_advance  # writes the joypad byte, runs one frame

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Restore the state taken right after the start screen (deterministic, screen included)."""
        self._env.reset()

    def gray_into(self, out: np.ndarray) -> np.ndarray:
        """Current screen as 240x256 uint8 luma (OpenCV BGRA2GRAY weights), written into `out`."""
        return cv2.cvtColor(self._bgrx, cv2.COLOR_BGRA2GRAY, dst=out)

    def rgb(self) -> np.ndarray:
        """Contiguous RGB copy of the current screen (for render)."""
        return np.ascontiguousarray(self._bgrx[:, :, 2::-1])

    def close(self) -> None:
        if self._env is not None:
            self._bgrx = None  # views into emulator memory must not outlive it
            self.ram.mem.release()
            self._env.close()
            self._env = None

    def __del__(self) -> None:
        # nes-py 8 frees the C++ emulator only in close(): envs dropped without it would leak
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: modules may already be gone
            pass

    @property
    def closed(self) -> bool:
        return self._env is None
