"""CPU seconds (user + sys) of a design's processes, read from /proc: what a step costs.

Wall-clock rates on a shared VM move with other tenants' load (steal); the CPU time a design
spends per env step moves far less, so the bench reports both. A design's processes are the
bench process and every process below it (collectors, workers, the scale simulation's head):
`tree_cpu()` snapshots them all, `cpu_between()` subtracts two snapshots per process. A process
that started between the snapshots counts in full; one that exited is lost (the timed windows
are steady state: nobody starts or exits inside them). Threads' time is in their process's
utime/stime; `thread_cpu_s` reads one thread (the head's consolidation thread), `named_threads_cpu_s` the
threads of one name (ZeroMQ's I/O threads).
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


def available() -> bool:
    """True where /proc has per-process stat files (Linux); elsewhere CPU figures are null."""
    return (_PROC / "self" / "stat").exists()


def _stat_fields(path: Path) -> list[str] | None:
    """The fields after the command name (which may hold spaces and parentheses)."""
    try:
        text = path.read_text()
    except OSError:  # the process or thread exited meanwhile
        return None
    return text[text.rindex(")") + 2:].split()


def _cpu_s(fields: list[str]) -> float:
    # fields[0] is field 3 (state): utime is field 14, stime field 15 (proc(5)), in clock ticks
    return (int(fields[11]) + int(fields[12])) / _TICKS


def process_cpu_s(pid: int) -> float | None:
    """user + sys seconds of one process, all its threads (None once it has exited)."""
    fields = _stat_fields(_PROC / str(pid) / "stat")
    return None if fields is None else _cpu_s(fields)


def thread_cpu_s(tid: int, pid: int | None = None) -> float | None:
    """user + sys seconds of one thread (threading.get_native_id()) of `pid` (default: this process)."""
    fields = _stat_fields(_PROC / str(pid or os.getpid()) / "task" / str(tid) / "stat")
    return None if fields is None else _cpu_s(fields)


def named_threads_cpu_s(prefix: str, pid: int | None = None) -> float | None:
    """user + sys seconds of the threads of `pid` (default: this process) whose name (comm) starts with `prefix`,
    those that exited uncounted; None where /proc has no such process."""
    task = _PROC / str(pid or os.getpid()) / "task"
    try:
        tids = [t.name for t in task.iterdir()]
    except OSError:
        return None
    total = 0.0
    for tid in tids:
        try:
            name = (task / tid / "comm").read_text().rstrip("\n")
        except OSError:
            continue
        fields = _stat_fields(task / tid / "stat") if name.startswith(prefix) else None
        total += _cpu_s(fields) if fields is not None else 0.0
    return total


def descendants(root: int) -> list[int]:
    """`root` and every live process below it (by parent pid, one scan of /proc)."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry / "stat")
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu(root: int | None = None) -> dict[int, float]:
    """{pid: cpu seconds} for `root` (default: this process) and all its descendants."""
    snap: dict[int, float] = {}
    for pid in descendants(root or os.getpid()):
        cpu = process_cpu_s(pid)
        if cpu is not None:
            snap[pid] = cpu
    return snap


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two snapshots, summed over the processes alive at the second."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def per_1k(cpu_s: float | None, steps: float | None) -> float | None:
    """CPU seconds per 1,000 env steps (None when either side is missing or no step happened)."""
    if cpu_s is None or not steps:
        return None
    return 1000.0 * cpu_s / steps
