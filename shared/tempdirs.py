"""Temp folders owned by a process: named after their owner, removed once the owner is gone.

The head keeps its unix sockets (ipc://) in temp folders. A head that exits cleanly removes them;
one killed with SIGKILL cannot, so every such folder carries its owner in its name,
`mapx-<pid>-<start>-<random>` (<start>: the owner's start time in clock ticks since boot, from
/proc/<pid>/stat, 0 where there is no /proc), and `sweep_stale` (called by a starting head)
removes the folders whose owner is gone:

- the pid is not running (or is a zombie), or it runs but started at another time (the pid was
  reused), and
- no unix socket in the folder accepts a connection (a live head in another pid namespace that
  shares this temp dir still listens on its sockets, so its folder is kept).

Only this user's folders are considered, and only names of exactly that form: a folder left by
an older version (`mapx-<random>`, `mario-apex-<random>`) has no recorded owner and stays. Where
there is no /proc (<start> is 0) a reused pid keeps a dead owner's folder until that pid exits.

Folders go under `tempfile.gettempdir()` (TMPDIR) unless that path is too long for a unix socket
path (~107 bytes with the socket's file name), in which case /tmp is used, as the only short
temp dir every POSIX system has.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "mapx-"
_NAME = re.compile(r"^mapx-(\d+)-(\d+)-[A-Za-z0-9_]+$")
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes on Linux (104 on macOS and BSD), the last one a NUL
SOCKET_NAME_ROOM = 16  # the longest socket file name the head puts in its folders: c<id>.ipc, weights.ipc
NAME_ROOM = len(PREFIX) + 7 + 1 + 12 + 1 + 8  # pid (<= 4194304), start ticks, mkdtemp's 8 random characters
FALLBACK_ROOT = "/tmp"


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot, /proc/<pid>/stat field 22); 0 where there is no
    /proc; None when no such process runs (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None
        return 0 if _pid_exists(pid) else None
    except OSError:
        return 0 if _pid_exists(pid) else None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": field 3 (state) onwards
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def root() -> str:
    """Where owned folders go: the temp dir (TMPDIR), or /tmp when TMPDIR is too long for socket paths."""
    base = tempfile.gettempdir()
    if len(os.fsencode(base)) + 1 + NAME_ROOM + 1 + SOCKET_NAME_ROOM <= SOCKET_PATH_MAX:
        return base
    if os.path.isdir(FALLBACK_ROOT) and os.access(FALLBACK_ROOT, os.W_OK | os.X_OK):
        log.warning("temp dir %s is too long for unix socket paths; the head's sockets go under %s",
                    base, FALLBACK_ROOT)
        return FALLBACK_ROOT
    return base


def owned_tempdir() -> str:
    """A new private folder (0700) named after this process: mapx-<pid>-<start ticks>-<random>."""
    pid = os.getpid()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-{start_ticks(pid) or 0}-", dir=root())


def owner(name: str) -> tuple[int, int] | None:
    """(pid, start ticks) recorded in an owned folder's name; None for any other name."""
    m = _NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def is_stale(path: Path) -> bool:
    """Whether owned folder `path` belongs to a process that is gone (module docstring)."""
    recorded = owner(path.name)
    if recorded is None:
        return False
    pid, ticks = recorded
    now = start_ticks(pid)
    if now is not None and (now == ticks or now == 0 or ticks == 0):
        return False
    return not _listening(path)


def _listening(folder: Path) -> bool:
    """Whether any unix socket in `folder` accepts a connection (someone still serves it)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    for entry in entries:
        try:
            if not entry.is_socket():
                continue
        except OSError:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(1.0)
            try:
                probe.connect(str(entry))
            except OSError:
                continue
            return True
    return False


def sweep_stale(base: str | None = None) -> list[str]:
    """Remove this user's owned folders under `base` (default: both places `root` may choose) whose owner is
    gone; returns the removed paths. Never raises: a folder that cannot be judged or removed is left."""
    removed = []
    bases = [base] if base is not None else sorted({tempfile.gettempdir(), root()})
    uid = os.getuid()
    for b in bases:
        with contextlib.suppress(OSError):
            for entry in Path(b).iterdir():
                try:
                    if owner(entry.name) is None or not entry.is_dir() or entry.is_symlink() \
                            or entry.lstat().st_uid != uid or not is_stale(entry):
                        continue
                except OSError:
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                if not entry.exists():
                    removed.append(str(entry))
    if removed:
        log.info("removed %d temp folder(s) of processes that are gone: %s", len(removed), ", ".join(removed))
    return removed
