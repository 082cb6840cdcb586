"""WeightPublisher: heartbeats, newest-weights re-send to late subscribers, STOP, monotonic versions."""

from __future__ import annotations

import time

import pytest
import torch
import zmq

from learner.broadcast import WeightPublisher
from shared import keys as K
from shared.protocol import HEAD_HEARTBEAT, STOP, WEIGHTS, decode_header
from shared.weights import decode_weights


def recv_until(sub: zmq.Socket, msg_type: int, timeout: float = 10.0, seen: list | None = None) -> list[zmq.Frame]:
    """Next message of `msg_type`; the types skipped on the way are appended to `seen`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sub.poll(100):
            parts = sub.recv_multipart(copy=False)
            got = decode_header(parts[0])
            if got.msg_type == msg_type:
                return parts
            if seen is not None:
                seen.append(got)
    raise TimeoutError(f"no message of type {msg_type}")


def subscriber(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def test_heartbeats_late_joiners_and_stop(tmp_path) -> None:
    ctx = zmq.Context()
    pub = WeightPublisher([f"ipc://{tmp_path}/w.ipc", "tcp://127.0.0.1:0"], context=ctx, heartbeat_s=0.05)
    subs: list[zmq.Socket] = []
    try:
        state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3)}
        pub.publish(4, state)
        with pytest.raises(ValueError):
            pub.publish(3, state)
        assert pub.version == 4
        late = subscriber(ctx, pub.endpoints[1])  # subscribes after the publish
        subs.append(late)
        skipped: list = []
        version, got = decode_weights(recv_until(late, WEIGHTS), state)
        assert version == 4 and torch.equal(got["w"], state["w"])
        assert decode_header(recv_until(late, HEAD_HEARTBEAT, seen=skipped)[0]).weight_version == 4
        state["w"] += 1  # the learner keeps training: what was published must not change
        ipc = subscriber(ctx, pub.endpoints[0])
        subs.append(ipc)
        _, again = decode_weights(recv_until(ipc, WEIGHTS), state)
        assert torch.equal(again["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
        pub.stop_collectors()
        recv_until(ipc, STOP)
        assert pub.sent_heartbeats > 0
    finally:
        for s in subs:
            s.close(0)
        pub.close()
        ctx.term()


def test_keys_cli_writes_a_usable_layout(tmp_path) -> None:
    assert K.main(["--dir", str(tmp_path / "k")]) == 0
    assert K.main(["--dir", str(tmp_path / "k")]) == 1  # never overwrites silently
    root = tmp_path / "k"
    for name in ("server.key", "server.key_secret", "client.key", "client.key_secret", "authorized_clients/client.key"):
        assert (root / name).is_file(), name
    assert (root / "client.key_secret").stat().st_mode & 0o077 == 0
    server, client = K.load_server(root), K.load_client(root)
    assert client.server_public == server.public


@pytest.mark.timeout(60)
def test_a_failed_bind_leaves_no_socket_open() -> None:
    """The second endpoint is taken: the publisher raises (OSError: TCP listeners are made in Python,
    shared/open_files.py), and its context still terminates (term() waits on every open socket, so a leaked
    one would hang the head's cleanup)."""
    ctx = zmq.Context()
    blocker = ctx.socket(zmq.ROUTER)
    port = blocker.bind_to_random_port("tcp://127.0.0.1")
    with pytest.raises(OSError) as failed:
        WeightPublisher([f"inproc://free-{id(ctx)}", f"tcp://127.0.0.1:{port}"], context=ctx)
    blocker.close(0)
    # the traceback (kept alive here, as in an except block that cleans up) still holds the half-built publisher
    assert failed.traceback is not None
    ctx.term()  # returns at once: nothing of the publisher is left open
