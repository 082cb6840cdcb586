"""The weights XPUB under subscription spam: manual subscriptions (topic b"" only), a bounded reading budget,
the TCP reset that frees foreign topics, and a peer that sends messages which are no subscription."""

from __future__ import annotations

import time

import pytest
import torch
import zmq

from learner.broadcast import SubscriptionGate, SubscriptionLimits, WeightPublisher
from shared.protocol import WEIGHTS, decode_header
from tests.support.waits import wait_until

STATE = {"w": torch.zeros(3)}



def weights_versions(sock: zmq.Socket, until: int, timeout_s: float = 60.0) -> list[int]:
    """WEIGHTS versions received on `sock` up to and including the first of version `until`."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(100):
            header = decode_header(sock.recv_multipart(copy=False)[0])
            if header.msg_type == WEIGHTS:
                got.append(header.weight_version)
                if header.weight_version == until:
                    return got
    raise TimeoutError(f"no WEIGHTS {until}; got {got}")


def subscriber(ctx: zmq.Context, endpoint: str, kind: int = zmq.SUB) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.linger = 0
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    else:
        sock.sndhwm = 0
    sock.connect(endpoint)
    return sock


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.mark.timeout(120)
def test_foreign_topics_are_dropped_and_counted_and_collectors_still_get_weights(ctx, tmp_path) -> None:
    """20,000 distinct topics subscribed and unsubscribed: each is read, dropped and counted, the socket's
    matching topics stay the one b"" (XPUB_MANUAL: none of them was applied), and collectors that subscribed
    before and after the spam get the newest weights."""
    pub = WeightPublisher([f"ipc://{tmp_path}/w.ipc", "tcp://127.0.0.1:0"], context=ctx, heartbeat_s=0.05)
    socks = []
    try:
        pub.publish(1, STATE)
        early = subscriber(ctx, pub.endpoints[1])
        socks.append(early)
        assert weights_versions(early, 1) == [1]
        spam = subscriber(ctx, pub.endpoints[1], zmq.XSUB)
        socks.append(spam)
        topics = 10_000
        for i in range(topics):
            topic = b"topic-%d" % i
            spam.send(b"\x01" + topic)
            spam.send(b"\x00" + topic)
        wait_until(lambda: pub.subscriptions.dropped >= 2 * topics, 60, "every foreign (un)subscription read")
        assert pub.subscriptions.dropped == 2 * topics
        assert pub.subscriptions.subscribed == 1 and pub.subscriptions.unsubscribed == 0
        assert pub._sock.getsockopt(zmq.TOPICS_COUNT) == 1  # b"" alone (libzmq counts under its own lock)
        late = subscriber(ctx, pub.endpoints[0])
        socks.append(late)
        assert weights_versions(late, 1) == [1]  # the re-send on a real subscription
        pub.publish(2, STATE)
        assert weights_versions(early, 2)[-1] == 2 and weights_versions(late, 2)[-1] == 2
        assert pub.subscriptions.subscribed == 2
    finally:
        for s in socks:
            s.close(0)
        pub.close()


@pytest.mark.timeout(120)
def test_unsubscribing_b_empty_is_honoured_so_a_resubscriber_gets_each_version_once(ctx) -> None:
    """A peer unsubscribes b"" (applied: counted), weights v2 go out without it, it subscribes again and is
    re-sent v2 once, then v3: it sees [2, 3]. Were the unsubscription ignored it would see v2 twice."""
    pub = WeightPublisher("tcp://127.0.0.1:0", context=ctx, heartbeat_s=0.05)
    socks = []
    try:
        pub.publish(1, STATE)
        ref = subscriber(ctx, pub.endpoints[0])
        peer = subscriber(ctx, pub.endpoints[0], zmq.XSUB)
        socks += [ref, peer]
        peer.send(b"\x01")
        assert weights_versions(peer, 1)[-1] == 1 and weights_versions(ref, 1)[-1] == 1
        peer.send(b"\x00")
        wait_until(lambda: pub.subscriptions.unsubscribed == 1, 60, "the unsubscription applied")
        pub.publish(2, STATE)
        assert weights_versions(ref, 2)[-1] == 2
        peer.send(b"\x01")
        after = weights_versions(peer, 2)  # the re-send to the new subscription
        pub.publish(3, STATE)
        after += weights_versions(peer, 3)
        assert [v for v in after if v > 1] == [2, 3], after
        assert pub.subscriptions.subscribed == 3 and pub.subscriptions.dropped == 0
    finally:
        for s in socks:
            s.close(0)
        pub.close()


def test_a_message_that_is_no_subscription_cannot_take_a_collectors_subscription(ctx) -> None:
    """libzmq queues the connection of each (un)subscription beside it but none for other messages, so one
    such message makes the next (un)subscription apply to the connection after it. Order forced over inproc:
    the attacker's b"" subscription and message, a collector's b"" subscription, then the attacker's b""
    unsubscription. Applied one to one, the collector's subscription would go to the attacker's connection
    and the attacker's unsubscription would remove it: the collector would receive nothing."""
    xpub = ctx.socket(zmq.XPUB)
    xpub.linger = 0
    xpub.setsockopt(zmq.XPUB_MANUAL, 1)
    xpub.bind("inproc://weights")
    attacker = subscriber(ctx, "inproc://weights", zmq.XSUB)
    attacker.send(b"\x01")  # an XSUB forwards an unsubscription only of a topic it subscribed
    attacker.send(b"\x02not a subscription")
    xpub.poll(0)  # the XPUB takes the attacker's connection and queues its two messages
    collector = subscriber(ctx, "inproc://weights")
    attacker.send(b"\x00")
    xpub.poll(0)  # ... and queues the rest before anything is read: the four messages, three connections
    gate = SubscriptionGate(xpub)
    while gate.read_one() is not None:
        pass
    assert gate.read == 4 and gate.foreign_messages == 1
    xpub.send(b"weights")
    assert collector.poll(10_000), "the collector's subscription was lost"
    assert collector.recv() == b"weights"
    attacker.send(b"\x01")  # the queues line up again once read empty: applied one to one
    attacker.send(b"\x00")
    while gate.read_one() is not None:
        pass
    assert gate.read == 6 and gate.unsubscribed == 1
    for s in (attacker, collector, xpub):
        s.close(0)


@pytest.mark.timeout(120)
def test_foreign_topic_bytes_close_the_tcp_connections_and_collectors_reconnect(ctx, tmp_path) -> None:
    """libzmq keeps each subscribed topic until its connection closes: past the byte limit the publisher closes
    every TCP connection; a TCP collector reconnects and gets newer weights, an ipc one is untouched."""
    limits = SubscriptionLimits(foreign_topic_bytes=50_000)
    pub = WeightPublisher([f"ipc://{tmp_path}/w.ipc", "tcp://127.0.0.1:0"], context=ctx, heartbeat_s=0.05,
                          limits=limits)
    socks = []
    try:
        pub.publish(1, STATE)
        tcp, ipc = subscriber(ctx, pub.endpoints[1]), subscriber(ctx, pub.endpoints[0])
        spam = subscriber(ctx, pub.endpoints[1], zmq.XSUB)
        socks += [tcp, ipc, spam]
        assert weights_versions(tcp, 1)[-1] == 1 and weights_versions(ipc, 1)[-1] == 1
        for i in range(1000):  # 1000 x 100 bytes of distinct topics: twice the limit
            spam.send(b"\x01" + b"%08d" % i + b"x" * 92)
        wait_until(lambda: pub.tcp_resets >= 1, 60, "a reset")
        assert pub.subscriptions.foreign_topic_bytes < limits.foreign_topic_bytes
        # the TCP collector's connection closed: libzmq reports its b"" unsubscribed
        wait_until(lambda: pub.subscriptions.unsubscribed >= 1, 60, "the TCP connections closed")
        pub.publish(2, STATE)
        assert weights_versions(ipc, 2)[-1] == 2
        assert weights_versions(tcp, 2)[-1] == 2  # reconnected (while it reads), subscribed again
        assert pub.subscriptions.subscribed >= 3  # ipc, tcp, tcp again
    finally:
        for s in socks:
            s.close(0)
        pub.close()


def test_limits_reject_a_budget_beyond_the_window() -> None:
    with pytest.raises(ValueError, match="read_budget_s"):
        SubscriptionLimits(window_s=0.1, read_budget_s=0.2)
    with pytest.raises(ValueError, match="foreign_topic_bytes"):
        SubscriptionLimits(foreign_topic_bytes=0)
