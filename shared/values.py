"""Type predicates for values read from outside the process (config files, checkpoints, JSON, peers).

Python counts `True` as the integer 1; none of these readers takes a bool for a count or a number.
"""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any) -> bool:
    """A Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """An int or float, not a bool, neither NaN nor infinite, within a float's range (JSON can hold 10**400)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large to convert to a float
        return False
