"""Head-side weight broadcast: one XPUB socket, owned by one thread.

The learner calls `publish(version, state_dict)` every M updates; the tensors are copied to
CPU once in the caller, and the send happens in the publisher thread (ZeroMQ sockets are not
thread-safe). The thread also sends a small HEAD_HEARTBEAT every `heartbeat_s` (collectors
exit when the head goes silent) and re-sends the newest weights whenever a collector
subscribes, so a late joiner never acts with stale weights and the PUB "slow joiner" gap cannot
lose the first broadcast.

Subscriptions are manual (ZMQ_XPUB_MANUAL): libzmq hands every (un)subscription to this thread
instead of applying it, and the thread applies only the topic the protocol uses, b"" (what
collectors subscribe to), to the connection it came from; any other topic is dropped and counted
(`SubscriptionGate`). The thread reads subscriptions for at most `read_budget_s` of every
`window_s`, so a peer sending them faster is held back by its own connection (RCVHWM, then TCP)
instead of taking the head's CPU.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import zmq

from shared.keys import CurveServer
from shared.open_files import ListenerGuard, bind_tcp, split_tcp
from shared.protocol import HEAD_HEARTBEAT, STOP, encode_simple, send_parts
from shared.weights import cpu_state, encode_weights

log = logging.getLogger(__name__)
# Incoming (un)subscriptions: each time the socket processes commands, libzmq moves everything queued in a
# peer's pipe into a list that only recv() empties and that has no limit. A small receive HWM keeps that
# near one pipe's worth per peer and per command pass: while the thread does not read, only its sends
# process commands, so a spamming peer is held back by TCP instead of growing the head's memory.
SUBSCRIPTION_RCVHWM = 64
SUBSCRIPTION_DRAIN_S = 0.005  # longest time spent reading (un)subscriptions per loop turn
RESEND_MIN_S = 0.05  # newest weights are re-sent to new subscribers at most this often
GUARD_EVERY_S = 0.1  # the TCP endpoints' descriptor guard runs at least this often
# Largest frame the XPUB accepts. It only receives (un)subscriptions (1 byte + a short topic), but ZeroMQ
# applies the same limit to handshake commands: a SUB's CURVE INITIATE is ~280 bytes, so a smaller limit
# silently drops every CURVE subscriber (no weights, no HEAD_HEARTBEAT) while plain TCP/ipc still work.
SUBSCRIPTION_MAX_MSG = 1024
SUBSCRIBE_ALL, UNSUBSCRIBE_ALL = b"\x01", b"\x00"  # the (un)subscription of topic b"", as XPUB reports it


@dataclass(frozen=True)
class SubscriptionLimits:
    """How much of the publisher thread subscriptions may take, and how much memory foreign topics may.

    libzmq 4.3 still records every topic a connection subscribes in a trie of its own, even in manual
    mode (it sends the unsubscriptions when the connection closes), at one node per byte of a topic that
    shares no prefix: ~24 bytes of memory per topic byte. Those nodes are freed only with the connection,
    so once `foreign_topic_bytes` of topics other than b"" were subscribed, the thread closes every TCP
    connection of the weights socket (it unbinds the TCP endpoints and binds them again,
    shared/open_files.py); collectors reconnect by themselves, subscribe again and are sent the newest
    weights. ipc and inproc peers are local ones.
    """

    window_s: float = 0.1
    read_budget_s: float = 0.01  # reading time per window: at most 10% of one core
    foreign_topic_bytes: int = 2 << 20  # ~50 MB of libzmq's trie at worst

    def __post_init__(self) -> None:
        if not 0 < self.read_budget_s <= self.window_s:
            raise ValueError(f"read_budget_s must be in (0, window_s]; got {self.read_budget_s}, {self.window_s}")
        if self.foreign_topic_bytes <= 0:
            raise ValueError(f"foreign_topic_bytes must be positive; got {self.foreign_topic_bytes}")


class SubscriptionGate:
    """Applies the (un)subscriptions read from a manual XPUB: topic b"" only, to the right connection.

    In manual mode setsockopt(SUBSCRIBE) applies to the connection of the last message read. libzmq keeps
    that connection in a queue beside the messages, but pushes none for a message that is not an
    (un)subscription (a peer's XSUB can send any message upstream), so after such a message the
    connection read with each later one may belong to a later one. The queues line up again when
    everything was read. Until then the gate subscribes every connection it is given to b"" and
    unsubscribes none: a collector's connection is given with one of the messages read before the queue
    empties, and an extra subscriber only receives what it could have subscribed to itself.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self._sock = sock
        self._misaligned = False
        self.read = 0
        self.subscribed = 0  # b"" subscriptions applied (a collector's, or any while misaligned)
        self.unsubscribed = 0  # b"" unsubscriptions applied
        self.dropped = 0  # (un)subscriptions of other topics
        self.foreign_messages = 0  # messages that are no (un)subscription
        self.foreign_topic_bytes = 0  # bytes of other topics subscribed, since the last reset_foreign()

    def read_one(self) -> bool | None:
        """Reads and applies one message: None when none is queued, True when it subscribed to b""."""
        try:
            msg = self._sock.recv(zmq.NOBLOCK)
        except zmq.Again:
            self._misaligned = False  # both of libzmq's queues are empty now
            return None
        self.read += 1
        notice = len(msg) > 0 and msg[0] <= 1  # libzmq's (un)subscription notice: 1 or 0, then the topic
        if not notice:
            self.foreign_messages += 1
            self._misaligned = True
        elif len(msg) > 1:
            self.dropped += 1
            if msg[0] == 1:
                self.foreign_topic_bytes += len(msg) - 1
        if self._misaligned:
            self._sock.setsockopt(zmq.SUBSCRIBE, b"")
            return msg == SUBSCRIBE_ALL
        if msg == SUBSCRIBE_ALL:
            self._sock.setsockopt(zmq.SUBSCRIBE, b"")
            self.subscribed += 1
            return True
        if msg == UNSUBSCRIBE_ALL:
            self._sock.setsockopt(zmq.UNSUBSCRIBE, b"")
            self.unsubscribed += 1
        return False

    def reset_foreign(self) -> None:
        self.foreign_topic_bytes = 0


class WeightPublisher:
    """Publishes weights and head heartbeats on every endpoint given (e.g. ipc and tcp)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        context: zmq.Context | None = None,
        heartbeat_s: float = 1.0,
        curve: CurveServer | None = None,
        sndhwm: int = 64,
        limits: SubscriptionLimits | None = None,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self._limits = limits or SubscriptionLimits()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.linger = 0
        self._sock.sndhwm = sndhwm
        self._sock.setsockopt(zmq.XPUB_MANUAL, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, SUBSCRIPTION_MAX_MSG)
        self._sock.rcvhwm = SUBSCRIPTION_RCVHWM
        if curve is not None:
            curve.apply(self._sock)
        self.endpoints: list[str] = []
        tcp_bound: list[str] = []  # as libzmq names them (what unbind() takes)
        try:  # a failed bind must not leave the socket open: the context's term() would wait on it forever
            for ep in [endpoints] if isinstance(endpoints, str) else endpoints:
                if ep.startswith("tcp://"):  # OSError at the open-file limit, where libzmq's own bind aborts
                    bound = bind_tcp(self._sock, ep)
                    tcp_bound.append(bound)
                    host, port = split_tcp(ep)
                    if port == 0:  # the address as given, with the port the kernel chose
                        ep = f"tcp://{host}:{split_tcp(bound)[1]}"
                else:
                    self._sock.bind(ep)
                self.endpoints.append(ep)
        except BaseException:
            self._sock.close(linger=0)
            raise
        # each TCP endpoint's connections are closed when the process runs short of descriptors (a burst of idle
        # connections) or, below, when foreign topics pile up
        self._guards = [ListenerGuard(self._sock, ep) for ep in tcp_bound]
        self._gate = SubscriptionGate(self._sock)
        self._heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._pending: list[Any] | None = None
        self._latest: list[Any] | None = None
        self._version = 0
        self._wake_r, self._wake_w = self._pipe()
        self._stop = threading.Event()
        self._broadcast_stop = False
        self.sent_weights = 0
        self.sent_heartbeats = 0
        self.subscription_read_s = 0.0  # time the thread spent reading subscriptions
        self.tcp_resets = 0  # times every TCP connection was closed for foreign topics
        self._last_resend = 0.0
        self._resend_due = False
        self._window_end = 0.0
        self._budget_left = 0.0
        self._thread = threading.Thread(target=self._run, name="weight-publisher", daemon=True)
        self._thread.start()

    def _pipe(self) -> tuple[zmq.Socket, zmq.Socket]:
        addr = f"inproc://weight-publisher-{id(self)}"
        r = self._ctx.socket(zmq.PAIR)
        r.bind(addr)
        w = self._ctx.socket(zmq.PAIR)
        w.connect(addr)
        return r, w

    @property
    def version(self) -> int:
        """Newest version handed to publish() (the head's 'not from the future' bound)."""
        return self._version

    @property
    def subscriptions(self) -> SubscriptionGate:
        """The counters of what was read from subscribers (written by the publisher thread only)."""
        return self._gate

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Queue `state_dict` as `version` (newest wins); returns after one CPU copy."""
        if version < self._version:
            raise ValueError(f"weight version {version} < published {self._version}: versions are monotonic")
        parts = encode_weights(version, cpu_state(state_dict))
        with self._lock:
            self._pending = parts
            self._version = version
            self._wake_w.send(b"w")

    def stop_collectors(self) -> None:
        """Broadcast STOP: every subscribed collector exits cleanly (shutdown's polite first step)."""
        with self._lock:
            self._broadcast_stop = True
            self._wake_w.send(b"x")

    def _read_subscriptions(self) -> bool:
        """Reads until none is queued, this turn's time is up or the window's budget is spent; True when a
        collector subscribed."""
        t0 = time.monotonic()
        until = t0 + min(SUBSCRIPTION_DRAIN_S, self._budget_left)
        resend = False
        n = 0
        while True:
            got = self._gate.read_one()
            if got is None:
                break
            resend |= got
            n += 1
            if n % 64 == 0 and time.monotonic() >= until:
                break
        spent = time.monotonic() - t0
        self._budget_left -= spent
        self.subscription_read_s += spent
        if self._gate.foreign_topic_bytes >= self._limits.foreign_topic_bytes:
            self._reset_tcp()
        return resend

    def _reset_tcp(self) -> None:
        """Close every TCP connection (libzmq frees a connection's topics only with it); the guards bind the
        endpoints again on the next turns."""
        self._gate.reset_foreign()
        self.tcp_resets += 1
        for guard in self._guards:
            guard.reset(time.monotonic(), f"weights socket: {self._limits.foreign_topic_bytes} bytes of topics "
                                          f"other than b\"\" subscribed")

    def _run(self) -> None:
        reading = zmq.Poller()
        reading.register(self._sock, zmq.POLLIN)
        reading.register(self._wake_r, zmq.POLLIN)
        resting = zmq.Poller()  # the window's reading budget is spent: the XPUB waits for the next window
        resting.register(self._wake_r, zmq.POLLIN)
        window_s, budget_s = self._limits.window_s, self._limits.read_budget_s
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= self._window_end:
                    self._window_end, self._budget_left = now + window_s, budget_s
                for guard in self._guards:
                    guard.check(now)
                timeout = min(max(0.0, next_beat - now), GUARD_EVERY_S if self._guards else 3600.0)
                if self._resend_due:
                    timeout = min(timeout, RESEND_MIN_S)
                poller = reading if self._budget_left > 0 else resting
                if poller is resting:
                    timeout = min(timeout, self._window_end - now)
                events = dict(poller.poll(max(0.0, timeout) * 1000))
                resend = self._read_subscriptions() if self._sock in events else False
                if self._wake_r in events:
                    while self._wake_r.poll(0):
                        self._wake_r.recv()
                with self._lock:
                    pending, self._pending = self._pending, None
                    if pending is not None:
                        self._latest = pending
                    latest = self._latest
                    stop, self._broadcast_stop = self._broadcast_stop, False
                if stop:
                    send_parts(self._sock, encode_simple(STOP, weight_version=self._version))
                now = time.monotonic()
                if resend and latest is not None and pending is None and now - self._last_resend < RESEND_MIN_S:
                    self._resend_due = True  # a subscription storm: one resend per RESEND_MIN_S
                    resend = False
                if self._resend_due and now - self._last_resend >= RESEND_MIN_S:
                    resend, self._resend_due = True, False
                if pending is not None or (resend and latest is not None):
                    send_parts(self._sock, latest, zmq.NOBLOCK)
                    self.sent_weights += 1
                    self._last_resend = now
                if time.monotonic() >= next_beat:
                    send_parts(self._sock, encode_simple(HEAD_HEARTBEAT, weight_version=self._version))
                    self.sent_heartbeats += 1
                    next_beat = time.monotonic() + self._heartbeat_s
        except zmq.ZMQError as exc:  # context terminated underneath us: nothing left to publish to
            if not self._stop.is_set():
                log.warning("weight publisher stopped: %s", exc)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the thread, then close every socket with linger 0."""
        self._stop.set()
        with self._lock:
            self._wake_w.send(b"s")
        self._thread.join(timeout=5.0)
        if self._thread.is_alive():  # cannot happen with the bounded loop; never close under a live thread
            log.warning("weight publisher thread did not stop within 5 s; leaving its sockets open")
            return
        for sock in (self._sock, self._wake_r, self._wake_w):
            sock.close(linger=0)
        for guard in self._guards:
            guard.close()
