"""ListenerGuard: a burst of idle TCP connections past a process's open-file limit is shed, and the endpoint
keeps answering (a subprocess with a soft limit of 64, so the burst stays small)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
import zmq

from shared.open_files import FDS_SPARE, fds_left
from tests.support.cluster import ROOT, head_env

ECHO = """
import logging, resource, sys, time, zmq
from shared.open_files import ListenerGuard
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
router.linger = 0
port = router.bind_to_random_port("tcp://127.0.0.1")
guard = ListenerGuard(router, router.last_endpoint.decode())
print("port", port, flush=True)
while True:
    guard.check(time.monotonic())
    if router.poll(10):
        who, msg = router.recv_multipart()
        router.send_multipart([who, msg])
"""


def test_fds_left_counts_down_as_descriptors_open() -> None:
    probe = os.open(os.devnull, os.O_RDONLY)
    try:
        before = fds_left(probe)
        extra = [os.dup(probe) for _ in range(5)]
        assert fds_left(probe) <= before - 5
        for fd in extra:
            os.close(fd)
    finally:
        os.close(probe)


@pytest.mark.timeout(120)
def test_a_burst_past_the_limit_is_shed_and_the_endpoint_answers_again() -> None:
    child = subprocess.Popen([sys.executable, "-c", ECHO], cwd=ROOT, env=head_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    socks: list[socket.socket] = []
    ctx = zmq.Context()
    try:
        first = child.stdout.readline()
        assert first.startswith("port "), first + child.stdout.read()
        port = int(first.split()[1])
        for _ in range(100):  # past 64: libzmq accepts until the limit, the rest wait in the backlog
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            socks.append(s)
        lines = []
        while not any("closing every connection" in line for line in lines):
            line = child.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert int(lines[-1].split()[0]) < FDS_SPARE, lines[-1]
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(f"tcp://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        answered = False
        while not answered and time.monotonic() < deadline:  # sent again until the rebound endpoint answers
            dealer.send(b"ping")
            answered = bool(dealer.poll(1000)) and dealer.recv() == b"ping"
        assert answered, "the endpoint did not answer after the reset"
        dropped = 0
        for s in socks:
            try:
                dropped += s.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                pass
            except OSError:
                dropped += 1
        assert dropped > 0  # the idle connections were closed by the reset
    finally:
        for s in socks:
            s.close()
        ctx.destroy(linger=0)
        child.kill()
        child.wait()
        child.stdout.close()


# A bind that finds no descriptor left: the guard saw room, then another listener's burst took it (the check
# is patched to see room; every descriptor is taken by hand).
REBIND_AT_THE_LIMIT = """
import errno, os, resource, time, zmq
import shared.open_files as open_files
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
router.linger = 0
guard = open_files.ListenerGuard(router, open_files.bind_tcp(router, "tcp://127.0.0.1:0"))
guard.reset(0.0, "test")
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError as exc:
    assert exc.errno == errno.EMFILE, exc
seen = open_files.fds_left
open_files.fds_left = lambda probe: 1 << 20
guard.check(10.0)
print("bound at the limit:", guard.bound, flush=True)
open_files.fds_left = seen
for fd in held:
    os.close(fd)
deadline = time.monotonic() + 30
while not guard.bound and time.monotonic() < deadline:
    guard.check(20.0)
    time.sleep(0.05)
print("bound with room:", guard.bound, flush=True)
"""


@pytest.mark.timeout(120)
def test_binding_again_at_the_limit_fails_and_leaves_the_process_alive() -> None:
    """libzmq's own TCP bind aborts the process at the open-file limit (its address resolution asserts);
    the guard's bind (bind_tcp) fails there, stays unbound, and binds once descriptors are back."""
    done = subprocess.run([sys.executable, "-c", REBIND_AT_THE_LIMIT], cwd=ROOT, env=head_env(),
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bound at the limit: False" in done.stdout and "bound with room: True" in done.stdout, done.stdout


def test_bind_tcp_makes_a_listener_zeromq_serves_and_unbinds() -> None:
    """bind_tcp (with the socket's RCVBUF set): any free port, the endpoint as libzmq names it (unbind takes
    it), a taken port is an OSError, and the socket's later binds make their own listeners."""
    from shared.open_files import bind_tcp, split_tcp

    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.linger = 0
        router.rcvbuf = 16384
        endpoint = bind_tcp(router, "tcp://127.0.0.1:0")
        host, port = split_tcp(endpoint)
        assert host == "127.0.0.1" and port > 0 and router.last_endpoint.decode() == endpoint
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(endpoint)
        dealer.send(b"ping")
        assert router.poll(10_000) and router.recv_multipart()[1] == b"ping"
        with pytest.raises(OSError):  # the port is taken
            bind_tcp(ctx.socket(zmq.ROUTER), endpoint)
        router.unbind(endpoint)
        router.bind("tcp://127.0.0.1:0")  # USE_FD was reset: libzmq makes this listener itself
        assert split_tcp(router.last_endpoint.decode())[1] != 0
    finally:
        ctx.destroy(linger=0)
