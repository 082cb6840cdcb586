"""The head's bound on the memory peers can make it hold: messages that never finish arriving.

libzmq bounds each frame (MAXMSGSIZE) but not how many frames a message has, and hands a multipart message to
the application only once its last frame arrived. A peer past the ZMTP handshake that sends frames with MORE set
and never the last one grows the head's memory without limit: before registration on the control port, after it
on its data endpoint. No socket option bounds that; closing the connection drops the unfinished message.

`MemoryGuard` is that one rule: the process's resident memory, read at most every `every_s`; above `limit` the
consolidation thread closes every TCP connection of the head's endpoints (collectors reconnect and register again,
as after a network fault) and hands the freed memory back to the OS. The loop turns at least every POLL_MS while
the guard is on, so memory passes the limit by at most what loopback delivers in that time (~100 MB). A shed that frees less than a quarter of the
excess was not ingress (the head itself grew): the limit moves up to the new level plus the margin, once, with a
warning, so a slow growth of the head's own never turns into a loop of sheds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

POLL_MS = 20  # the longest the consolidation loop waits for a socket while a guard watches: ~50 reads a second
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident memory (Linux /proc/self/statm); 0 where it cannot be read (the guard is then off)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: freed memory goes back by the allocator's own rules
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc's malloc_trim); a no-op elsewhere."""
    if _TRIM is not None:
        _TRIM(0)


class MemoryGuard:
    """Says when resident memory passed `limit`; owned by the consolidation thread, asked every loop turn."""

    def __init__(self, limit: int, margin: int, *, every_s: float = 0.02, quiet_s: float = 2.0,
                 read: Callable[[], int] = resident_bytes, trim: Callable[[], None] = release_free_memory) -> None:
        self.limit, self.margin = int(limit), int(margin)
        self._trim = trim
        self.every_s, self.quiet_s = float(every_s), float(quiet_s)
        self._read = read
        self._next = 0.0
        self._shed_at: int | None = None  # resident bytes when the last shed happened, until it is judged
        self._judge_at = 0.0
        self.sheds = 0
        self.raises = 0

    @classmethod
    def for_head(cls, margin: int, expected: int, read: Callable[[], int] = resident_bytes, **kw: float
                 ) -> MemoryGuard | None:
        """The head's guard: what it holds now, plus `expected` bytes still to come (the replay filling up), plus
        `margin`; None when `margin` is 0 (off) or resident memory cannot be read."""
        now = read()
        if margin <= 0 or now <= 0:
            return None
        return cls(now + max(0, int(expected)) + int(margin), int(margin), read=read, **kw)

    def due(self, now: float) -> int | None:
        """Resident bytes when they are above the limit and a shed is due, else None. While the last shed's connections
        are being freed (quiet_s) only a growth past where it happened is due: a new peer, not the old one's memory."""
        if now < self._next:
            return None
        self._next = now + self.every_s
        if self._shed_at is not None and now >= self._judge_at:  # the last shed's outcome: libzmq's I/O thread freed
            self._trim()  # the closed connections' messages by now
            rss = self._read()
            freed, excess = self._shed_at - rss, self._shed_at - self.limit
            self._shed_at = None
            if rss > self.limit and freed < excess / 4:
                old, self.limit = self.limit, rss + self.margin
                self.raises += 1
                log.warning("resident memory %d MiB stayed above the ingress limit %d MiB after closing every "
                            "connection: the head itself grew; the limit is now %d MiB", rss >> 20, old >> 20,
                            self.limit >> 20)
                return None
        else:
            rss = self._read()
        if rss <= self.limit or (self._shed_at is not None and rss <= self._shed_at):
            return None
        self.sheds += 1
        self._shed_at, self._judge_at = rss, now + self.quiet_s
        return rss
