"""Keeps a burst of idle TCP connections from taking the head's last file descriptors.

Each connection to a bound ZeroMQ endpoint takes a descriptor until its handshake completes or the
handshake interval (30 s) drops it, and at the open-file limit libzmq's I/O thread retries the failing
accept() at once, in a loop, for as long as connections wait in the backlog: a core spins, and the head's
own files (TensorBoard, checkpoints, a new registration's socket) fail meanwhile. `ListenerGuard` watches
how many descriptors are left and, when fewer than `FDS_SPARE` are, closes every connection of one TCP
endpoint (unbind, then bind it again once descriptors are back): the head guards its control endpoint
(registered collectors no longer use it), its weights endpoint and every collector's TCP data endpoint
(collectors reconnect by themselves, to the same port).

Two libzmq calls abort the whole process at the open-file limit instead of failing: a TCP bind (its
address resolution asserts that getifaddrs() succeeded) and an ipc accept() (EMFILE is missing from the
errors it tolerates). Another listener's burst can take the last descriptors between any check and such a
call, so the head binds TCP through `bind_tcp`, which opens the listening socket itself (EMFILE is then an
OSError) and hands it to libzmq, and it uses no ipc unless asked to (`transport.local_transport`).
"""

from __future__ import annotations

import errno
import logging
import os
import socket

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


def bind_tcp(sock: zmq.Socket, endpoint: str) -> str:
    """Bind `sock` to `tcp://host:port` (IPv4 or a name for one; port 0 = any free port) and return the endpoint
    as libzmq names it (LAST_ENDPOINT, what unbind() takes). The listening socket is made here, as libzmq would
    make it (close-on-exec, SO_REUSEADDR, the socket's SNDBUF/RCVBUF and BACKLOG), and handed over with
    ZMQ_USE_FD: with no descriptor left this raises OSError (EMFILE) where `sock.bind()` would abort."""
    host, port = split_tcp(endpoint)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # close-on-exec: Python's default
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for option, name in ((zmq.SNDBUF, socket.SO_SNDBUF), (zmq.RCVBUF, socket.SO_RCVBUF)):
            size = sock.getsockopt(option)
            if size >= 0:  # -1: the OS default; accepted connections inherit the listener's buffers
                listener.setsockopt(socket.SOL_SOCKET, name, size)
        listener.bind((host, port))
        listener.listen(sock.getsockopt(zmq.BACKLOG))
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    fd = listener.detach()  # libzmq owns it from here, and closes it at unbind() or close()
    try:
        sock.setsockopt(zmq.USE_FD, fd)
        sock.bind(endpoint)  # with USE_FD libzmq takes the address from the descriptor
    except BaseException:
        os.close(fd)
        raise
    finally:
        sock.setsockopt(zmq.USE_FD, -1)  # the socket's next bind makes its own listener again
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def split_tcp(endpoint: str) -> tuple[str, int]:
    """`tcp://host:port` -> (host, port)."""
    host, _, port = endpoint[len("tcp://"):].rpartition(":")
    return host, int(port)


class ListenerGuard:
    """Resets the TCP endpoint `endpoint` of `sock` when the process is short of descriptors; owned by the
    thread that owns `sock` (check() uses it), which calls check() every turn of its loop (a few syscalls)."""

    def __init__(self, sock: zmq.Socket, endpoint: str, probe: int | None = None) -> None:
        """`probe`: a descriptor to count with (the caller's, kept open by it); None: one of its own."""
        self._sock = sock
        self._endpoint = endpoint  # as libzmq names it (LAST_ENDPOINT): unbind() finds it without resolving
        self._own_probe = probe is None
        self._probe = os.open(os.devnull, os.O_RDONLY) if probe is None else probe
        self._bound = True
        self._quiet_until = 0.0
        self.resets = 0

    def short(self) -> bool:
        """Fewer than FDS_SPARE descriptors left: a new registration's socket and listener would likely fail."""
        return fds_left(self._probe) < FDS_SPARE

    def check(self, now: float) -> None:
        if not self._bound:  # bind again once the closed connections gave their descriptors back
            if fds_left(self._probe) >= FDS_SPARE // 2:
                try:  # the descriptors can be gone again by now (another listener's burst): bind_tcp fails
                    bind_tcp(self._sock, self._endpoint)
                    self._bound = True
                except (OSError, zmq.ZMQError) as exc:  # no descriptor, or the old listener is still closing in
                    log.debug("cannot bind %s again yet: %s", self._endpoint, exc)  # libzmq's thread: next turn
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
        if self._probe >= 0 and self._own_probe:
            os.close(self._probe)
        self._probe = -1
