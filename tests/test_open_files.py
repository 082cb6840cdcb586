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
from tests.cluster_helpers import ROOT, head_env

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
