"""Head-side weight broadcast: one XPUB socket, owned by one thread.

The learner calls `publish(version, state_dict)` every M updates; the tensors are copied to
CPU once in the caller, and the send happens in the publisher thread (ZeroMQ sockets are not
thread-safe). The thread also sends a small HEAD_HEARTBEAT every `heartbeat_s` (collectors
exit when the head goes silent) and re-sends the newest weights whenever a collector
subscribes (XPUB reports subscriptions), so a late joiner never acts with stale weights and
the PUB "slow joiner" gap cannot lose the first broadcast.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import zmq

from shared.keys import CurveServer
from shared.protocol import HEAD_HEARTBEAT, STOP, encode_simple, send_parts
from shared.weights import cpu_state, encode_weights

log = logging.getLogger(__name__)
# Incoming (un)subscriptions: each time the socket processes commands, libzmq moves everything queued in a
# peer's pipe into a list that only recv() empties and that has no limit. A small receive HWM and a drain
# that empties the list each turn (bounded in time, so spam cannot starve the sends) keep it near one pipe's
# worth per peer: a spamming peer is held back by TCP instead of growing the head's memory.
SUBSCRIPTION_RCVHWM = 64
SUBSCRIPTION_DRAIN_S = 0.005  # longest time spent reading (un)subscriptions per loop turn
RESEND_MIN_S = 0.05  # newest weights are re-sent to new subscribers at most this often
# Largest frame the XPUB accepts. It only receives (un)subscriptions (1 byte + a short topic), but ZeroMQ
# applies the same limit to handshake commands: a SUB's CURVE INITIATE is ~280 bytes, so a smaller limit
# silently drops every CURVE subscriber (no weights, no HEAD_HEARTBEAT) while plain TCP/ipc still work.
SUBSCRIPTION_MAX_MSG = 1024


class WeightPublisher:
    """Publishes weights and head heartbeats on every endpoint given (e.g. ipc and tcp)."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        context: zmq.Context | None = None,
        heartbeat_s: float = 1.0,
        curve: CurveServer | None = None,
        sndhwm: int = 64,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.XPUB)
        self._sock.linger = 0
        self._sock.sndhwm = sndhwm
        self._sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        self._sock.setsockopt(zmq.MAXMSGSIZE, SUBSCRIPTION_MAX_MSG)
        self._sock.rcvhwm = SUBSCRIPTION_RCVHWM
        if curve is not None:
            curve.apply(self._sock)
        self.endpoints: list[str] = []
        try:  # a failed bind must not leave the socket open: the context's term() would wait on it forever
            for ep in [endpoints] if isinstance(endpoints, str) else endpoints:
                if ep.startswith("tcp://") and ep.endswith(":0"):
                    port = self._sock.bind_to_random_port(ep.rsplit(":", 1)[0])
                    ep = f"{ep.rsplit(':', 1)[0]}:{port}"
                else:
                    self._sock.bind(ep)
                self.endpoints.append(ep)
        except BaseException:
            self._sock.close(linger=0)
            raise
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
        self.subscriptions_read = 0
        self._last_resend = 0.0
        self._resend_due = False
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

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_beat = time.monotonic()
        try:
            while not self._stop.is_set():
                timeout = max(0.0, next_beat - time.monotonic())
                if self._resend_due:
                    timeout = min(timeout, RESEND_MIN_S)
                events = dict(poller.poll(timeout * 1000))
                resend = False
                if self._sock in events:
                    drain_until = time.monotonic() + SUBSCRIPTION_DRAIN_S
                    while True:  # until empty, or out of time: spam cannot starve the sends below
                        try:
                            sub = self._sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        resend |= bool(sub) and sub[0] == 1  # a (re)subscription
                        self.subscriptions_read += 1
                        if self.subscriptions_read % 256 == 0 and time.monotonic() >= drain_until:
                            break
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
