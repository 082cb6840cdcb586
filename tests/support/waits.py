"""The tests' waits: `wait_for` (tests/hostile/waits.py) and `wait_until`, which raises naming what it waited for."""

from __future__ import annotations

from collections.abc import Callable

from tests.hostile.waits import wait_for

__all__ = ["wait_for", "wait_until"]


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.01) -> None:
    """Return once `predicate()` holds; TimeoutError naming `what` when it did not within `timeout` seconds."""
    if not wait_for(predicate, timeout, interval):
        raise TimeoutError(f"not within {timeout:g} s: {what}")
