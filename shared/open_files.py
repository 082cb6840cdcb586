"""Keeps a burst of idle TCP connections from taking the head's last file descriptors.

Each connection to a bound ZeroMQ endpoint takes a descriptor until its handshake completes or the
handshake interval (30 s) drops it, and at the open-file limit libzmq's I/O thread retries the failing
accept() at once, in a loop, for as long as connections wait in the backlog: a core spins, and the head's
own files (TensorBoard, checkpoints, a new registration's socket) fail meanwhile. `ListenerGuard` watches
how many descriptors are left and, when fewer than `FDS_SPARE` are, closes every connection of one TCP
endpoint (unbind, then bind it again once descriptors are back): the head guards its control endpoint
(registered collectors no longer use it) and its weights endpoint (collectors reconnect by themselves).
"""

from __future__ import annotations

import errno
import logging
import os

import zmq

try:
    import resource
except ImportError:  # not POSIX: no limit to watch
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
FDS_SPARE = 32  # below the head's FDS_RESERVED: registrations never get this close to the limit
RESET_EVERY_S = 1.0  # at most one reset a second: a peer that keeps reconnecting costs one bind a second


def fds_left(probe: int) -> int:
    """Descriptors left below the soft limit, at most (0 at the limit). The lowest free descriptor number is
    the count of open ones when they are dense, and a lower bound otherwise, so this never overestimates."""
    if resource is None:
        return 1 << 30
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        fd = os.dup(probe)
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return 0
        raise
    os.close(fd)
    return (1 << 30) if soft == resource.RLIM_INFINITY else max(0, soft - fd)


class ListenerGuard:
    """Resets the TCP endpoint `endpoint` of `sock` when the process is short of descriptors; owned by the
    thread that owns `sock` (check() uses it), which calls check() every turn of its loop (a few syscalls)."""

    def __init__(self, sock: zmq.Socket, endpoint: str) -> None:
        self._sock = sock
        self._endpoint = endpoint  # as libzmq names it (LAST_ENDPOINT): unbind() finds it without resolving
        self._probe = os.open(os.devnull, os.O_RDONLY)
        self._bound = True
        self._quiet_until = 0.0
        self.resets = 0

    def short(self) -> bool:
        """Fewer than FDS_SPARE descriptors left: binding anything now could meet EMFILE, which libzmq's address
        resolution (getifaddrs) does not survive: it aborts the process."""
        return fds_left(self._probe) < FDS_SPARE

    def check(self, now: float) -> None:
        if not self._bound:  # bind again once the closed connections gave their descriptors back
            if fds_left(self._probe) >= FDS_SPARE // 2:
                try:
                    self._sock.bind(self._endpoint)
                    self._bound = True
                except zmq.ZMQError as exc:  # the old listener is still closing in libzmq's thread: next turn
                    log.debug("cannot bind %s again yet: %s", self._endpoint, exc)
            return
        if now < self._quiet_until:
            return
        left = fds_left(self._probe)
        if left < FDS_SPARE:
            self.reset(now, f"{left} file descriptors left")

    def reset(self, now: float, why: str) -> None:
        """Close every connection of the endpoint now (unbind); check() binds it again."""
        if not self._bound:
            return
        self._sock.unbind(self._endpoint)
        self._bound = False
        self.resets += 1
        self._quiet_until = now + RESET_EVERY_S
        log.warning("%s: closing every connection of %s (reset %d)", why, self._endpoint, self.resets)

    @property
    def bound(self) -> bool:
        return self._bound

    def close(self) -> None:
        if self._probe >= 0:
            os.close(self._probe)
            self._probe = -1
