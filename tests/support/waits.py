"""Waiting on events, never on durations: poll a condition until it holds or a generous deadline passes."""

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


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.01) -> None:
    """Return once `predicate()` holds; TimeoutError naming `what` when it did not within `timeout` seconds."""
    if not wait_for(predicate, timeout, interval):
        raise TimeoutError(f"not within {timeout:g} s: {what}")
