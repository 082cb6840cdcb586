"""Small facts about sizes and this machine's memory, each computed in one place."""

from __future__ import annotations

import os


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): the sum-tree's leaf count."""
    return 1 << max(0, (int(n) - 1).bit_length())


def meminfo(field: str) -> int | None:
    """A /proc/meminfo field in bytes (Linux), e.g. "MemTotal"; None where there is no such file or field."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_memory_bytes() -> int:
    """MemAvailable (Linux); falls back to total physical memory."""
    available = meminfo("MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class LogBudget:
    """At most `per_window` log lines of one kind per `window_s`; the rest are counted and summarized.

    Why: a peer can cause a line per message (a HELLO flood registers and reclaims a thousand
    collectors a second); the log must stay readable and its size bounded by time, not by the peer."""

    def __init__(self, per_window: int = 20, window_s: float = 60.0, clock=None) -> None:
        import time

        self.per_window, self.window_s = int(per_window), float(window_s)
        self._clock = clock or time.monotonic
        self._start = self._clock()
        self._used = 0
        self.suppressed = 0

    def allow(self) -> tuple[bool, int]:
        """(may this line be logged, how many were suppressed since the last allowed one)."""
        now = self._clock()
        if now - self._start >= self.window_s:
            self._start, self._used = now, 0
        if self._used < self.per_window:
            self._used += 1
            dropped, self.suppressed = self.suppressed, 0
            return True, dropped
        self.suppressed += 1
        return False, 0
