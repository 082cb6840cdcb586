"""What /proc says of a head's processes: its collectors (by --parent-pid) and resident memory.

Standard library only, so the tests that run under an interpreter without torch can use it too.
"""

from __future__ import annotations

import os
from pathlib import Path


def children_of(pid: int) -> list[int]:
    """Live processes whose command line says they belong to head `pid` (--parent-pid PID); zombies (already
    dead, waiting to be reaped) do not count."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and b"--parent-pid" in cmdline:
            i = cmdline.index(b"--parent-pid")
            if i + 1 < len(cmdline) and cmdline[i + 1] == str(pid).encode():
                found.append(int(entry.name))
    return found


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MiB (0.0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, IndexError):
        return 0.0
