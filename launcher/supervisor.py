"""Keeps the head's collectors alive: the `Collectors` seam and its local implementations.

Three implementations share the seam (start / poll / stop / pids / restart counters), so the
head's loop is the same for each: `CollectorSupervisor` (local processes, the default),
`ThreadCollectors` (the in-process mode) and `RayCollectors` (launcher/ray_collectors.py:
actors placed and restarted by a Ray cluster).

Local collectors are started exactly like remote ones (`python -m actors --connect ...`), as
child processes, so there is one code path for both. The supervisor restarts a collector that
exits or stalls, with exponential backoff so a collector that crashes at start-up cannot spin
the CPU, and counts every restart. "Stalled" means *not stepping*: the head was ready to read
from it and heard nothing for `stall_timeout_s`. A collector *waiting for the head* (its chunks
held behind the insert gate, or blocked on credit or a full socket) is never stalled, however
long the wait. A replaced or exited process is reported through `on_exit(pid)` so the head
frees its registration at once. Shutdown asks politely first
(the head broadcasts STOP; children also get SIGTERM, which they handle by closing cleanly),
and only kills what is still alive after the grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("mario_apex.supervisor")

MIN_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
# A collector process that has not registered yet is starting (interpreter, torch, emulators), not stepping: it
# is judged by this allowance (or the stall timeout, if longer), which a loaded machine's start-up stays within;
# the collector itself gives up registering after its --register-timeout (60 s by default).
STARTUP_ALLOWANCE_S = 90.0


class Collectors(Protocol):
    """What the head's loop needs from whatever runs its collectors."""

    restarts_total: int  # collectors replaced so far (crashed, exited or stalled)
    stall_kills: int  # of those, collectors killed for not stepping

    def start(self) -> None: ...

    def poll(self) -> None:
        """Called from the head's loop every SUPERVISE_EVERY_S: notice and replace lost collectors."""

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask every collector to stop, wait up to `grace_s`, then kill what is left; no restarts after this."""

    def pids(self) -> list[int]:
        """Local process ids to SIGKILL on a forced exit (empty when there is nothing local to signal)."""


def stalled(started_at: float, clock: tuple[float, bool] | None, now: float, timeout_s: float) -> bool:
    """Whether a collector started at `started_at` is not stepping: the head was ready to read from it and
    heard nothing for `timeout_s`. `clock` is the consolidation's (last heard, held by the head now or not
    heard from yet) for it, None before it registered: then it is starting, and stalled only past
    STARTUP_ALLOWANCE_S. A collector waiting for the head (flow control) or still starting is never stalled."""
    if now - started_at < timeout_s:
        return False
    if clock is None:
        return now - started_at > max(timeout_s, STARTUP_ALLOWANCE_S)
    held, seen = clock[1], clock[0]
    if held:
        return False  # its chunks are held by the head (flow control): not a stall
    return now - max(seen, started_at) > timeout_s


@dataclass
class _Slot:
    index: int
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = MIN_BACKOFF_S
    restart_at: float | None = None
    exit_codes: list[int] = field(default_factory=list)

    def schedule_restart(self, now: float, what: str) -> None:
        """Restart after the current backoff: a slot that ran for a while gets a fresh one; a crash loop doubles it."""
        log.warning("%s; restart #%d in %.1f s", what, self.restarts + 1, self.backoff_s)
        self.restart_at = now + self.backoff_s
        ran_for = now - self.started_at
        self.backoff_s = MIN_BACKOFF_S if ran_for > 60.0 else min(MAX_BACKOFF_S, self.backoff_s * 2)


class CollectorSupervisor:
    """Starts, watches and restarts N local collector processes.

    `command(slot)` builds the argv for a slot; `stall_clock(pid)` returns (the monotonic time the
    collector running as process `pid` was last heard from or held back by the head, whether it
    is waiting for the head now), or None before it registered. Matching by pid, not slot, keeps
    remote collectors (which number their own slots) apart.
    """

    def __init__(
        self,
        count: int,
        command: Callable[[int], list[str]],
        stall_clock: Callable[[int], tuple[float, bool] | None],
        stall_timeout_s: float,
        env: dict[str, str] | None = None,
        log_dir: str | None = None,
        on_exit: Callable[[int], None] = lambda pid: None,
    ) -> None:
        self._command = command
        self._stall_clock = stall_clock
        self._on_exit = on_exit
        self._stall_timeout_s = stall_timeout_s
        self._env = env
        self._log_dir = log_dir
        self._slots = [_Slot(i) for i in range(count)]
        self._stopping = False
        self.restarts_total = 0
        self.stall_kills = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for slot in self._slots:
            self._spawn(slot)

    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process is not None and s.process.poll() is None]

    def poll(self) -> None:
        """Call from the head's loop: restart exited or stalled collectors when their backoff expires."""
        if self._stopping:
            return
        now = time.monotonic()
        for slot in self._slots:
            proc = slot.process
            if proc is not None:
                code = proc.poll()
                if code is not None:
                    slot.exit_codes.append(code)
                    slot.process = None
                    self._on_exit(proc.pid)
                    slot.schedule_restart(now, f"collector slot {slot.index} exited with code {code}")
                elif self._stalled(slot, now):
                    log.warning("collector slot %d (pid %d) sent nothing for %.0f s while the head was ready to read "
                                "(not stepping); killing it", slot.index, proc.pid, self._stall_timeout_s)
                    _kill(proc)
                    slot.process = None
                    self.stall_kills += 1
                    self._on_exit(proc.pid)
                    slot.schedule_restart(now, f"collector slot {slot.index} stalled")
            if slot.process is None and slot.restart_at is not None and now >= slot.restart_at:
                slot.restart_at = None
                slot.restarts += 1
                self.restarts_total += 1
                self._spawn(slot)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM (collectors close cleanly on it), wait, then SIGKILL whatever is left."""
        self._stopping = True
        procs = [s.process for s in self._slots if s.process is not None]
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for proc in procs:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                log.warning("collector pid %d did not exit within %.1f s; killing it", proc.pid, grace_s)
                _kill(proc)
        for slot in self._slots:
            slot.process = None

    # ------------------------------------------------------------------ internals
    def _stalled(self, slot: _Slot, now: float) -> bool:
        clock = self._stall_clock(slot.process.pid) if slot.process is not None else None
        return stalled(slot.started_at, clock, now, self._stall_timeout_s)

    def _spawn(self, slot: _Slot) -> None:
        argv = self._command(slot.index)
        stdout = stderr = None
        if self._log_dir:
            os.makedirs(self._log_dir, exist_ok=True)
            stdout = open(os.path.join(self._log_dir, f"collector-{slot.index}.log"), "ab")  # noqa: SIM115
            stderr = subprocess.STDOUT
        try:
            slot.process = subprocess.Popen(argv, env=self._env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)
        finally:
            if stdout is not None:
                stdout.close()  # the child holds its own descriptor
        slot.started_at = time.monotonic()
        log.info("collector slot %d started (pid %d)", slot.index, slot.process.pid)


def _kill(proc: subprocess.Popen) -> None:
    try:
        proc.kill()
        proc.wait(timeout=5.0)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass


class ThreadCollectors:
    """The in-process mode's collectors: threads of the head sharing its ZeroMQ context.

    Same interface as `CollectorSupervisor` (start / poll / stop / pids / restarts_total), so the
    head's loop is the same. A thread that ends early (an exception, a lost registration) is
    restarted with the same backoff; a stalled thread cannot be killed, so it is only logged.
    Every message still goes through the real protocol, over `inproc://` sockets.
    """

    def __init__(self, count: int, ctx, connect: str, register_timeout_s: float = 60.0) -> None:
        import threading

        self._threading = threading
        self._ctx = ctx
        self._connect = connect
        self._timeout = register_timeout_s
        self._stop = threading.Event()
        self._slots = [_Slot(i) for i in range(count)]
        self._threads: dict[int, threading.Thread] = {}
        self.restarts_total = 0
        self.stall_kills = 0  # never: threads are not killed

    def _body(self, slot: int) -> None:
        from actors.session import collect

        try:
            collect(self._ctx, self._connect, slot, self._stop, register_timeout_s=self._timeout)
        except Exception:  # noqa: BLE001 - logged with its traceback; poll() restarts the slot
            log.exception("in-process collector %d failed", slot)

    def _spawn(self, slot: _Slot) -> None:
        thread = self._threading.Thread(target=self._body, args=(slot.index,), name=f"collector-{slot.index}",
                                        daemon=True)
        self._threads[slot.index] = thread
        slot.started_at = time.monotonic()
        thread.start()

    def start(self) -> None:
        for slot in self._slots:
            self._spawn(slot)

    def pids(self) -> list[int]:
        return []  # threads of this process: nothing to signal separately

    def poll(self) -> None:
        if self._stop.is_set():
            return
        now = time.monotonic()
        for slot in self._slots:
            thread = self._threads.get(slot.index)
            if thread is not None and not thread.is_alive():
                del self._threads[slot.index]
                slot.schedule_restart(now, f"in-process collector {slot.index} ended")
            if slot.index not in self._threads and slot.restart_at is not None and now >= slot.restart_at:
                slot.restart_at = None
                slot.restarts += 1
                self.restarts_total += 1
                self._spawn(slot)

    def stop(self, grace_s: float = 5.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + grace_s
        for thread in list(self._threads.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("in-process collector %s did not stop within %.1f s", thread.name, grace_s)
        self._threads.clear()
