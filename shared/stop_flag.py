"""A stop request that signal handlers may raise: one boolean, no lock.

Python runs a signal handler in the main thread between two bytecodes of whatever it was doing. A
handler that calls `threading.Event.set()` takes the event's lock, and deadlocks when the code it
interrupted holds that lock: `Event.wait()` in the main loop, or the same handler still inside `set()`
when a second signal arrives. Second signals are ordinary: the kernel sends the parent-death signal
once per thread of a dying multi-threaded parent. `StopFlag.set()` only assigns a boolean, which a
handler may do at any point and any number of times.
"""

from __future__ import annotations

import time
from typing import Protocol


class StopRequest(Protocol):
    """What a loop that may be asked to stop reads (a StopFlag, or a threading.Event set by another thread)."""

    def is_set(self) -> bool: ...


class StopFlag:
    """`set()` from a signal handler, `is_set()` anywhere, `wait(timeout)` as a sleep that ends early once set."""

    def __init__(self, poll_s: float = 0.01) -> None:
        self._set = False
        self._poll_s = poll_s

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking within poll_s of set(); True when set."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(self._poll_s, left))
        return self._set
