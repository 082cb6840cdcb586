"""Discrete action sets for Super Mario Bros as NES controller bitmasks.

Why not nes_py's JoypadSpace: it is an old-gym wrapper on nes-py 8 and one more Python layer per
emulator frame; a tuple lookup is all the mapping needs. The button lists are those of
gym_super_mario_bros.actions (identical in 7.4 and 9.x; a test checks they still are).
"""

from __future__ import annotations

# Bit order of the NES controller byte, as nes-py writes it to the joypad register.
BUTTONS: dict[str, int] = {
    "right": 0b10000000,
    "left": 0b01000000,
    "down": 0b00100000,
    "up": 0b00010000,
    "start": 0b00001000,
    "select": 0b00000100,
    "B": 0b00000010,
    "A": 0b00000001,
    "NOOP": 0b00000000,
}

RIGHT_ONLY: tuple[tuple[str, ...], ...] = (
    ("NOOP",),
    ("right",),
    ("right", "A"),
    ("right", "B"),
    ("right", "A", "B"),
)
SIMPLE_MOVEMENT: tuple[tuple[str, ...], ...] = RIGHT_ONLY + (("A",), ("left",))
COMPLEX_MOVEMENT: tuple[tuple[str, ...], ...] = SIMPLE_MOVEMENT + (
    ("left", "A"),
    ("left", "B"),
    ("left", "A", "B"),
    ("down",),
    ("up",),
)

ACTION_LISTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "right_only": RIGHT_ONLY,
    "simple": SIMPLE_MOVEMENT,
    "complex": COMPLEX_MOVEMENT,
}


def check_action_set(action_set: str) -> None:
    """Raise ValueError naming the allowed action sets."""
    if action_set not in ACTION_LISTS:
        raise ValueError(f"action_set={action_set!r} is invalid: allowed one of {', '.join(ACTION_LISTS)}")


def action_buttons(action_set: str) -> tuple[int, ...]:
    """Controller byte for each discrete action of `action_set`."""
    check_action_set(action_set)
    out = []
    for combo in ACTION_LISTS[action_set]:
        byte = 0
        for name in combo:
            byte |= BUTTONS[name]
        out.append(byte)
    return tuple(out)


def num_actions(action_set: str) -> int:
    check_action_set(action_set)
    return len(ACTION_LISTS[action_set])
