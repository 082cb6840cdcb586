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
