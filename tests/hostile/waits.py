"""Waiting on events, never on durations: poll a condition until it holds or a generous deadline passes.

Standard library only; the soak harness and the tests (tests/support/waits.py) share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.2) -> bool:
    """Whether `predicate()` held within `timeout` seconds (checked once more at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
