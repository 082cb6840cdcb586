"""Super Mario Bros game state read straight from the NES's 2 KiB work RAM.

Why our own reader: the two package generations (gym-super-mario-bros 7.4 / 9.x) compute
different rewards and infos, and both rebuild large info dicts on every emulator frame. Reading
the few bytes we need ourselves gives one definition on both generations and costs
well under a microsecond per read (a `memoryview` indexes to a Python int ~3x faster than a
NumPy scalar, and needs no `int()` conversion).

Addresses (SMB1, NTSC), as used by both package generations:

    x position   0x006D (page) * 256 + 0x0086
    time         0x07F8..0x07FA, one decimal digit per byte (000-400)
    lives        0x075A (2, 1, 0; 0xFF = game over)
    world/stage  0x075F + 1 / 0x075C + 1
    score        0x07DE..0x07E3, one decimal digit per byte (the shown score / 10)
    player state 0x000E (0x0B dying, 0x06 dead, 0x00-0x05 and 0x07: busy, see BUSY_STATES)
    y viewport   0x00B5 (> 1: below the screen, i.e. falling into a hole = dying)
    game mode    0x0770 (2 = end of world)
    enemy types  0x0016..0x001A (0x2D Bowser, 0x31 flagpole) with float state 0x001D (3 = on the pole)
"""

from __future__ import annotations

import numpy as np

X_PAGE = 0x006D
X_SCREEN = 0x0086
TIME_DIGITS = 0x07F8
LIFE = 0x075A
WORLD = 0x075F
STAGE = 0x075C
AREA = 0x0760
SCORE_DIGITS = 0x07DE
PLAYER_STATE = 0x000E
Y_VIEWPORT = 0x00B5
GAME_MODE = 0x0770
ENEMY_TYPES = (0x0016, 0x0017, 0x0018, 0x0019, 0x001A)
FLOAT_STATE = 0x001D
PRELEVEL_TIMER = 0x07A0
CHANGE_AREA_TIMER = 0x06DE

STATE_DYING = 0x0B
STATE_DEAD = 0x06
BUSY_STATES = frozenset((0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x07))
STAGE_OVER_ENEMIES = frozenset((0x2D, 0x31))
GAME_MODE_END_OF_WORLD = 2
LIFE_GAME_OVER = 0xFF


class MarioRam:
    """Typed accessors over a live RAM buffer (a view: values change as the emulator runs)."""

    __slots__ = ("mem",)

    def __init__(self, ram: np.ndarray) -> None:
        if ram.dtype != np.uint8 or ram.shape != (0x800,):
            raise ValueError(f"expected the NES RAM as a uint8 array of shape (2048,), got {ram.dtype} {ram.shape}")
        self.mem = memoryview(ram)  # writable view: RAM hacks write through it

    @classmethod
    def over(cls, mem: object) -> MarioRam:
        """Accessors over any live, writable byte-indexable RAM (`mem[i]`, `mem[i] = v`, `mem[a:b]`), e.g. an
        emulator's own memory interface where no buffer can be viewed."""
        ram = cls.__new__(cls)
        ram.mem = mem  # type: ignore[assignment]
        return ram

    def x_pos(self) -> int:
        m = self.mem
        return m[X_PAGE] * 256 + m[X_SCREEN]

    def time(self) -> int:
        m = self.mem
        return m[TIME_DIGITS] * 100 + m[TIME_DIGITS + 1] * 10 + m[TIME_DIGITS + 2]

    def score(self) -> int:
        value = 0
        for digit in self.mem[SCORE_DIGITS : SCORE_DIGITS + 6]:
            value = value * 10 + digit
        return value

    def life(self) -> int:
        return self.mem[LIFE]

    def world(self) -> int:
        return self.mem[WORLD] + 1

    def stage(self) -> int:
        return self.mem[STAGE] + 1

    def player_state(self) -> int:
        return self.mem[PLAYER_STATE]

    def is_dying(self) -> bool:
        m = self.mem
        return m[PLAYER_STATE] == STATE_DYING or m[Y_VIEWPORT] > 1

    def is_dead(self) -> bool:
        return self.mem[PLAYER_STATE] == STATE_DEAD

    def is_busy(self) -> bool:
        return self.mem[PLAYER_STATE] in BUSY_STATES

    def is_game_over(self) -> bool:
        return self.mem[LIFE] == LIFE_GAME_OVER

    def is_world_over(self) -> bool:
        return self.mem[GAME_MODE] == GAME_MODE_END_OF_WORLD

    def is_stage_over(self) -> bool:
        """The first Bowser/flagpole slot decides, as in the package (a vine also sets float state 3)."""
        m = self.mem
        for address in ENEMY_TYPES:
            if m[address] in STAGE_OVER_ENEMIES:
                return m[FLOAT_STATE] == 3
        return False

    def flag_get(self) -> bool:
        return self.is_world_over() or self.is_stage_over()
