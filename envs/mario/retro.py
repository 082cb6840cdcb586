"""Super Mario Bros on stable-retro's FCEUmm core (env.backend=retro): the nes-py emulator's interface, ~5x cheaper.

Only stable-retro's low-level `RetroEmulator(rom_path)` applies: its own game integration expects another ROM
hash, so the ROM is the one gym-super-mario-bros ships, and the package's start-screen skip and frame
semantics run here (envs/mario/emulator.py MarioFrames, the one implementation for both backends).

What differs from nes-py and how it is undone, so the 84x84 observation agrees (tests/test_mario_retro.py
measures by how much):
  * the screen is 224x240: FCEUmm crops 8 px of overscan on each side. The frame is padded back to nes-py's
    240x256 by repeating the edge rows and columns (SMB's border is the sky or the HUD's background);
  * another palette: the gray of each of the core's colours is mapped to the gray nes-py gives the same NES
    colour (PALETTE_GRAY, read off frames both backends rendered of the same game states);
  * power-on RAM is not zeroed: the start-screen skip runs POWER_ON_FRAMES no-op frames first;
  * the core's frame starts at another point of the NES's frame than nes-py's: a joypad byte given for a frame
    reaches the game one core frame later (`_pending`), which puts its input on the frame nes-py's reads it;
  * one emulator instance per process: every RetroMarioEmulator of a process shares the one core
    (`_Core`), each keeping its own saved state while another runs: a swap (save one 13 KB state, load
    another) cost 10.8-11.0 us on the loaded 2-core VM on 2026-12-02 (`python -m experiments.backend_steps --blocks 3
    --steps 20`, its retro_core_swap), under 1% of a retro env step. A collector's K envs thus time-share the core at one swap per env step, in
    its own process: no worker processes, shared memory or IPC per step, nothing left behind when it dies
    (the collector steps its K envs one after another on one core anyway).
"""

from __future__ import annotations

import gc
import os

import cv2
import numpy as np

from envs.mario.emulator import SCREEN_HEIGHT, SCREEN_WIDTH, MarioFrames, import_mario_package
from envs.mario.ram import MarioRam

# no-op frames before the start screen is pressed: FCEUmm's power-on RAM is not zeroed. With 2 (and the input
# delay below) the golden action sequences replay with nes-py's rewards, infos and episode ends exactly
# (tests/test_mario_retro.py); 0 leaves the game in another state, odd counts put the clock a tick apart
POWER_ON_FRAMES = 2
RETRO_HEIGHT, RETRO_WIDTH = 224, 240
OVERSCAN = 8  # px cropped on each side: (240 - 224) / 2 rows, (256 - 240) / 2 columns
RAM_SIZE = 0x800

# joypad byte (nes-py's order: bit 7 right, 6 left, 5 down, 4 up, 3 start, 2 select, 1 B, 0 A) -> the core's
# button mask (stable-retro's NES order: B, -, SELECT, START, UP, DOWN, LEFT, RIGHT, A)
_RETRO_BUTTON_OF_BIT = {0: 8, 1: 0, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7}


def _button_masks() -> tuple[np.ndarray, ...]:
    masks = []
    for byte in range(256):
        mask = np.zeros(9, np.uint8)
        for bit, index in _RETRO_BUTTON_OF_BIT.items():
            if byte >> bit & 1:
                mask[index] = 1
        masks.append(mask)
    return tuple(masks)


BUTTON_MASKS = _button_masks()


def _palette_lut() -> np.ndarray:
    """uint8[256]: gray of a core colour (OpenCV RGB2GRAY) -> nes-py's gray of that colour; identity elsewhere."""
    lut = np.arange(256, dtype=np.uint8)
    for core_gray, nes_gray in PALETTE_GRAY.items():
        lut[core_gray] = nes_gray
    return lut


# core gray -> nes-py gray, read off aligned frames of the same game states: the start of all 32 stages and up
# to 120 steps into each (2026-12-02); each core gray came with one nes-py gray on every pixel but 162, where
# two core colours share a gray (203 on 95% of its pixels, 143 on 5%): 0.04% of all pixels disagree.
# tests/test_mario_retro.py measures the agreement of the 84x84 frames
PALETTE_GRAY: dict[int, int] = {
    0: 0, 41: 52, 52: 48, 69: 80, 77: 78, 88: 107, 91: 95, 99: 99, 105: 124, 106: 124, 114: 124, 141: 140,
    155: 157, 162: 203, 170: 177, 186: 188, 205: 214, 212: 222, 221: 177, 250: 252,
}
_LUT = _palette_lut()


def retro_available() -> bool:
    """Whether stable-retro (the optional `retro` install) can be imported."""
    try:
        import stable_retro  # noqa: F401
    except ImportError:
        return False
    return True


def rom_file(rom_mode: str) -> str:
    """The ROM gym-super-mario-bros ships for `rom_mode` (vanilla on both generations; downsample, pixel and
    rectangle only in 7.4)."""
    package = import_mario_package()
    if rom_mode == "vanilla":
        return os.path.join(os.path.dirname(package.__file__), "_roms", "super-mario-bros.nes")
    from gym_super_mario_bros._roms.rom_path import rom_path  # 7.4's; 9.x ships the vanilla ROM only

    return rom_path(False, rom_mode)


def _pad_overscan(frame: np.ndarray) -> np.ndarray:
    """Fill the 8 px border the core crops, in place, from what the frame shows: the top repeats the first row
    shown (SMB's sky above the HUD), the bottom and the sides repeat the 8 px one metatile (16 px) inward (the
    ground's bricks and the sky are 16 px periodic). Measured on the golden sequences, the 84x84 frames then
    differ from nes-py's only in their three outermost columns on each side (tests/test_mario_retro.py)."""
    o, tile = OVERSCAN, 2 * OVERSCAN
    frame[:o] = frame[o]
    frame[-o:] = frame[-o - tile : -tile]
    frame[:, :o] = frame[:, tile : tile + o]
    frame[:, -o:] = frame[:, -o - tile : -tile]
    return frame


class _Core:
    """The process's one FCEUmm instance, time-shared by the RetroMarioEmulators alive in it."""

    def __init__(self, rom: str) -> None:
        import stable_retro
        from stable_retro import data as retro_data

        gc.collect()  # a dropped instance must be gone before the core accepts a new one
        self.rom = rom
        self.em = stable_retro.RetroEmulator(rom)
        self._data = retro_data.GameData()
        self.em.configure_data(self._data)
        self.memory = self._data.memory  # live: extract/assign read and write the core's RAM
        self.owner: RetroMarioEmulator | None = None
        self.users = 0


_core: _Core | None = None


def _open_core(rom: str) -> _Core:
    global _core
    if _core is not None and _core.rom != rom:
        if _core.users:
            raise ValueError(
                f"env.backend=retro runs one ROM per process: {os.path.basename(_core.rom)} is in use, "
                f"{os.path.basename(rom)} was asked for (use env.backend=nes-py for mixed ROM modes)"
            )
        _core = None
    if _core is None:
        _core = _Core(rom)
    _core.users += 1
    return _core


class _RetroRam:
    """`mem[i]`, `mem[i] = v`, `mem[a:b]` over the core's RAM as the emulator's last frame left it.

    The core's memory has no view: each byte read is a call into the core (~1 us, ~60 per env step). The whole
    2 KiB is copied once instead (its first two 1 KiB blocks, ~3 us) at the first read after the emulator ran,
    reset or was written to (`stale()`), and reads index that copy."""

    __slots__ = ("_emu", "_memory", "_copy")

    def __init__(self, emu: RetroMarioEmulator, memory: object) -> None:
        self._emu = emu
        self._memory = memory
        self._copy: bytes | None = None

    def stale(self) -> None:
        """The core's RAM moved on for this emulator: the next read copies it again."""
        self._copy = None

    def _bytes(self) -> bytes:
        if self._copy is None:
            self._emu.own()
            blocks = self._memory.blocks  # type: ignore[attr-defined]
            self._copy = blocks[0] + blocks[1024]
        return self._copy

    def __getitem__(self, index: int | slice) -> int | list[int]:
        ram = self._bytes()
        if isinstance(index, slice):
            return list(ram[index])
        return ram[index]

    def __setitem__(self, index: int, value: int) -> None:
        self._emu.own()
        self._memory.assign(index, "|u1", int(value))  # type: ignore[attr-defined]
        self._copy = None

    def release(self) -> None:
        """Like memoryview.release(): nothing is held."""


class RetroMarioEmulator(MarioFrames):
    """SMB1 on the FCEUmm core with MarioEmulator's interface (reset, frame, gray_into, rgb, ram, close)."""

    generation = "retro"

    def __init__(self, target: tuple[int, int] | None, rom_mode: str = "vanilla") -> None:
        from gym_super_mario_bros._roms import decode_target

        self._core: _Core | None = _open_core(rom_file(rom_mode))
        self._state: bytes | None = None  # this emulator's saved state while another owns the core
        self._pending = 0  # the joypad byte the next core frame reads (the one given for the frame before)
        self.single_stage = target is not None
        self._ram = _RetroRam(self, self._core.memory)
        self.ram = MarioRam.over(self._ram)
        self._set_mask = self._core.em.set_button_mask
        self._step = self._core.em.step
        self._screen = np.zeros((RETRO_HEIGHT, RETRO_WIDTH, 3), np.uint8)  # the last frame fetched
        self._screen_stale = False  # frames ran since `_screen` was fetched
        core = self._core
        if core.owner is not None:
            core.owner._release()
        core.owner = self
        self._power_on(decode_target(target, False) if target is not None else None)

    def _power_on(self, target: tuple[int, int, int] | None) -> None:
        core = self._core
        assert core is not None
        # a fresh power-on: the core has no reset call, so the first instance's boot state is reused by all
        if not hasattr(core, "boot"):
            for _ in range(POWER_ON_FRAMES):
                self._advance(0)
            core.boot = core.em.get_state()  # type: ignore[attr-defined]
        else:
            core.em.set_state(core.boot)  # type: ignore[attr-defined]
        self._skip_start_screen(target)
        self._start = core.em.get_state()
        self._start_screen = core.em.get_screen()

    # ------------------------------------------------------------------ the shared core
    def own(self) -> None:
        """Make the core run this emulator: save the running one's state, load this one's (~7 us, see
        experiments/backend_steps.py); a no-op when it runs already."""
        core = self._core
        if core is None:
            raise RuntimeError("RetroMarioEmulator is closed")
        if core.owner is not self:
            if core.owner is not None:
                core.owner._release()
            assert self._state is not None
            core.em.set_state(self._state)
            self._state = None
            core.owner = self

    def _release(self) -> None:
        """Save this emulator's state (and its last screen if frames ran since): another takes the core."""
        core = self._core
        assert core is not None and core.owner is self
        if self._screen_stale:
            self._screen = core.em.get_screen()
            self._screen_stale = False
        self._state = core.em.get_state()
        core.owner = None

    def _advance(self, buttons: int) -> None:
        if self._core is None or self._core.owner is not self:
            self.own()
        self._set_mask(BUTTON_MASKS[self._pending], 0)
        self._pending = buttons
        self._step()
        self._screen_stale = True
        self._ram.stale()

    # ------------------------------------------------------------------ MarioEmulator's interface
    @property
    def ram_array(self) -> np.ndarray:
        """A copy of the 2 KiB work RAM (the core's memory cannot be viewed in place)."""
        return np.array(self.ram.mem[0:RAM_SIZE], dtype=np.uint8)

    def reset(self) -> None:
        self.own()
        core = self._core
        assert core is not None
        core.em.set_state(self._start)
        self._ram.stale()
        self._pending = 0  # the skip ends on a no-op frame: nothing is pending in the start state
        self._screen = self._start_screen
        self._screen_stale = False

    def _current(self) -> np.ndarray:
        if self._screen_stale:
            self.own()
            assert self._core is not None
            self._screen = self._core.em.get_screen()
            self._screen_stale = False
        return self._screen

    def gray_into(self, out: np.ndarray) -> np.ndarray:
        """Current screen as nes-py's 240x256 uint8 luma: the core's gray mapped to nes-py's palette, padded."""
        o = OVERSCAN
        inner = out[o:-o, o:-o]
        cv2.cvtColor(self._current(), cv2.COLOR_RGB2GRAY, dst=inner)
        cv2.LUT(inner, _LUT, dst=inner)
        _pad_overscan(out)
        return out

    def rgb(self) -> np.ndarray:
        """RGB copy of the current screen in nes-py's 240x256 geometry (the core's own colours)."""
        out = np.empty((SCREEN_HEIGHT, SCREEN_WIDTH, 3), np.uint8)
        out[OVERSCAN:-OVERSCAN, OVERSCAN:-OVERSCAN] = self._current()
        return _pad_overscan(out)

    def close(self) -> None:
        global _core
        core = self._core
        if core is None:
            return
        if core.owner is self:
            core.owner = None
        self._core = None
        core.users -= 1
        self._set_mask = self._step = None  # type: ignore[assignment]

    @property
    def closed(self) -> bool:
        return self._core is None


assert (RETRO_HEIGHT + 2 * OVERSCAN, RETRO_WIDTH + 2 * OVERSCAN) == (SCREEN_HEIGHT, SCREEN_WIDTH)


class RawRetroMario:
    """The core with none of the project's logic, for the bench's emulator ceiling: `step(joypad byte)` runs one
    frame and fetches the screen, as nes-py's package env does per step; `reset()` restores the stage's start."""

    def __init__(self, target: tuple[int, int] | None, rom_mode: str = "vanilla") -> None:
        self._emu = RetroMarioEmulator(target, rom_mode)

    def reset(self) -> None:
        self._emu.reset()

    def step(self, buttons: int) -> tuple[np.ndarray, float, bool, dict]:
        emu = self._emu
        emu._advance(buttons)
        return emu._current(), 0.0, False, {}

    def close(self) -> None:
        self._emu.close()
