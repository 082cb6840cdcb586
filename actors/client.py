"""The collector's side of the transport: registration, its own data socket, the weights SUB.

Registration is a DEALER exchange (HELLO with a nonce, retried until WELCOME; the head answers
a retried nonce with the same WELCOME, so a retry never allocates a second collector). Data goes
through the collector's own DEALER to the DEALER the head bound for it, with SNDHWM = send_hwm:
when the learner falls behind, `send` blocks (bounded memory, nothing dropped) while still
watching the head's heartbeat and the stop flag. With transport.max_chunks_in_flight > 0 a
chunk is also held back until the head has acknowledged (CREDIT) all but that many earlier
chunks: the collector then waits *before* stepping on, so what it sends is never staler than a
few chunks, however large the socket buffers are.
"""

from __future__ import annotations

import logging
import os
import socket as pysocket
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import torch
import zmq

from envs.checks import check_welcome
from shared.chunk import TransitionChunk
from shared.config import Config
from shared.keys import CurveClient
from shared.protocol import (
    CREDIT,
    HEAD_HEARTBEAT,
    HEARTBEAT,
    HELLO,
    MAX_JSON_BYTES,
    STOP,
    WEIGHTS,
    WELCOME,
    EpisodeSummary,
    ProtocolError,
    decode,
    decode_header,
    encode_chunk,
    encode_episode,
    encode_json,
    encode_simple,
    send_parts,
)
from shared.weights import decode_weights, weights_frame_limit

log = logging.getLogger(__name__)


ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
MAX_ENDPOINT_CHARS = 1024


class RegistrationError(RuntimeError):
    """The head did not answer HELLO in time or answered something unusable."""


class HeadUnavailable(RegistrationError):
    """No WELCOME in time, or a refusal ("retry later"): trying again later with a new HELLO may succeed, unlike
    after an unusable WELCOME."""


@dataclass(frozen=True)
class Welcome:
    collector_id: int
    data_endpoint: str
    weights_endpoint: str
    epsilon: float
    num_collectors: int
    slot: int
    config: Config
    data_token: bytes = b""  # the routing id this collector's data socket must use (its proof of ownership)
    epsilons: tuple[float, ...] = ()  # one Ape-X epsilon per env stream; empty from a head that sends only `epsilon`
    credit_every_s: float = 0.0  # the head sends a CREDIT at least this often (0: a head that does not promise it)


def client_socket(ctx: zmq.Context, kind: int, curve: CurveClient | None) -> zmq.Socket:
    """A socket as a collector opens it: no linger, CURVE-authenticated when keys are given."""
    sock = ctx.socket(kind)
    sock.linger = 0
    if curve is not None:
        curve.apply(sock)
    return sock


def reachable_endpoint(endpoint: str, connect: str) -> str:
    """A tcp endpoint bound on a wildcard address is reached at the host we registered with."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host = urlsplit(endpoint).hostname
    if host in ("0.0.0.0", "*", "::"):
        port = endpoint.rsplit(":", 1)[1]
        return f"tcp://{urlsplit(connect).hostname}:{port}"
    return endpoint


def register(ctx: zmq.Context, connect: str, slot: int = -1, curve: CurveClient | None = None,
             timeout_s: float = 30.0, retry_s: float = 1.0, envs: int = 0,
             should_stop: Callable[[], bool] = lambda: False) -> Welcome:
    """HELLO -> WELCOME over a DEALER socket. HeadUnavailable after `timeout_s` without an answer or on a refusal;
    RegistrationError on stop or an unusable WELCOME."""
    hello = {"host": pysocket.gethostname(), "pid": os.getpid(), "slot": slot, "nonce": uuid.uuid4().hex,
             "envs": envs}
    sock = client_socket(ctx, zmq.DEALER, curve)
    sock.sndhwm = 4
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_JSON_BYTES + 4096)  # a WELCOME is a header and a JSON object
    try:
        sock.connect(connect)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if should_stop():
                raise RegistrationError("stopped while registering")
            try:  # NOBLOCK: a DEALER without a usable peer (e.g. a refused CURVE handshake) would block
                sock.send_multipart(encode_json(HELLO, hello), zmq.NOBLOCK)
            except zmq.Again:
                pass
            if sock.poll(min(retry_s, 0.25) * 1000):
                try:
                    msg = decode(sock.recv_multipart())
                except ProtocolError as exc:
                    raise RegistrationError(f"bad WELCOME: {exc}") from None
                if msg.header.msg_type != WELCOME:
                    raise RegistrationError(f"expected WELCOME, got type {msg.header.msg_type}")
                return _parse_welcome(msg.payload, connect)
        raise HeadUnavailable(f"no WELCOME from {connect} within {timeout_s:.0f} s")
    finally:
        sock.close(linger=0)


def _parse_welcome(data: dict[str, Any], connect: str) -> Welcome:
    if "refused" in data:
        raise HeadUnavailable(f"the head refused the registration: {str(data['refused'])[:300]}")
    try:
        config = Config.from_dict(data["config"])
        check_welcome(config)  # what this collector builds and schedules from: the head's ranges, checked here too
        return Welcome(
            int(data["collector_id"]), reachable_endpoint(_endpoint(data, "data_endpoint"), connect),
            reachable_endpoint(_endpoint(data, "weights_endpoint"), connect), float(data["epsilon"]),
            int(data["num_collectors"]), int(data.get("slot", -1)), config,
            _token(data["data_token"]), tuple(_epsilons(data.get("epsilons", []))),
            _interval(data.get("credit_every_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistrationError(f"unusable WELCOME: {exc}") from None


def _endpoint(data: dict[str, Any], key: str) -> str:
    """A WELCOME endpoint, checked before any socket sees it (ZeroMQ rejects a malformed one only at connect)."""
    value = data[key]
    if not (isinstance(value, str) and len(value) <= MAX_ENDPOINT_CHARS and value.startswith(ENDPOINT_SCHEMES)):
        raise ValueError(f"{key}: expected a tcp://, ipc:// or inproc:// endpoint of at most {MAX_ENDPOINT_CHARS} "
                         f"characters, got {str(value)[:80]!r}")
    return value


def _token(value: Any) -> bytes:
    """The data socket's routing id: ZeroMQ takes 1-255 bytes that do not start with a zero byte."""
    try:
        token = bytes.fromhex(str(value)[:1024])
    except ValueError:
        raise ValueError(f"data_token: expected hex, got {str(value)[:40]!r}") from None
    if not 1 <= len(token) <= 255 or token[0] == 0:
        raise ValueError(f"data_token: expected hex of 1-255 bytes not starting with 00, got {len(token)} bytes")
    return token


def _interval(value: Any) -> float:
    seconds = float(value)
    if not 0.0 <= seconds <= 3600.0:  # NaN fails too
        raise ValueError(f"credit_every_s: expected seconds in [0, 3600], got {str(value)[:40]!r}")
    return seconds


def _epsilons(values: Any) -> list[float]:
    if not isinstance(values, list) or len(values) > 65536:
        raise ValueError("epsilons: expected a list of at most 65536 numbers")
    eps = [float(v) for v in values]
    if not all(0.0 <= e <= 1.0 for e in eps):  # NaN fails too
        raise ValueError("epsilons: every value must be in [0, 1]")
    return eps


class HeadLink:
    """The collector's data DEALER and weights SUB sockets, chunk credits and head liveness."""

    def __init__(self, ctx: zmq.Context, welcome: Welcome, template: Mapping[str, torch.Tensor],
                 curve: CurveClient | None = None, should_stop: Callable[[], bool] = lambda: False) -> None:
        cfg = welcome.config
        self.collector_id = welcome.collector_id
        self.head_timeout_s = cfg.transport.head_timeout_s
        self.heartbeat_s = cfg.collectors.heartbeat_s
        self.should_stop = should_stop
        self.template = template  # the network WEIGHTS must describe (names, shapes, dtypes)
        opened: list[zmq.Socket] = []
        try:  # a failure here must not leave a socket open: the context's term() would wait on it forever
            self.data = client_socket(ctx, zmq.DEALER, curve)
            opened.append(self.data)
            if welcome.data_token:  # the head reads only this peer's messages (a bench sink may have no token)
                self.data.setsockopt(zmq.ROUTING_ID, welcome.data_token)
            self.data.setsockopt(zmq.MAXMSGSIZE, 4096)  # only CREDITs come back (64-byte headers)
            self.data.sndhwm = cfg.collectors.send_hwm
            if cfg.transport.socket_buffer_bytes:  # before connect: ZeroMQ applies it to new TCP connections
                self.data.sndbuf = cfg.transport.socket_buffer_bytes
            self.data.connect(welcome.data_endpoint)
            self.sub = client_socket(ctx, zmq.SUB, curve)
            opened.append(self.sub)
            self.sub.setsockopt(zmq.MAXMSGSIZE, weights_frame_limit(template))  # no frame beyond our largest tensor
            self.sub.rcvhwm = 64
            self.sub.setsockopt(zmq.SUBSCRIBE, b"")
            self.sub.connect(welcome.weights_endpoint)
        except BaseException as exc:
            for sock in opened:
                sock.close(linger=0)
            if isinstance(exc, zmq.ZMQError):  # e.g. an endpoint that passed the checks but names no usable path
                raise RegistrationError(f"unusable WELCOME: cannot use its endpoints or token: {exc}") from None
            raise
        self.max_chunks_in_flight = cfg.transport.max_chunks_in_flight  # 0 = no credit limit
        # the head sends a CREDIT at least every credit_every_s: none for this long while it is alive means it
        # reclaimed this registration (it closed our data socket's peer)
        self.reclaim_after_s = max(self.head_timeout_s, 3 * welcome.credit_every_s) if welcome.credit_every_s else 0.0
        self.last_credit = time.monotonic()
        self.unacked_chunks: deque[int] = deque()  # sequence numbers of chunks the head has not credited
        self.credit_wait_s = 0.0  # time spent waiting for credit (monitoring)
        self.waiting = False  # blocked on credit or a full socket: heartbeats say so (count = 1)
        self.seq = 0
        self.last_head = time.monotonic()
        self.next_heartbeat = time.monotonic()
        self.stop_requested = False
        self.weight_version = 0  # version the collector acts with (set by the collector)
        self._weights: list[Any] | None = None
        self._weights_version = -1  # the newest version kept or taken: -1 before any, so version 0 is taken too
        self.sent_messages = 0

    # ------------------------------------------------------------------ incoming
    def poll_head(self) -> None:
        """Drain CREDITs and the SUB socket without blocking; keep only the newest WEIGHTS message."""
        self._drain_credits()
        while self.sub.poll(0):
            parts = self.sub.recv_multipart(copy=False)
            try:
                header = decode_header(parts[0])
            except ProtocolError as exc:
                log.warning("ignoring bad message from head: %s", exc.reason)
                continue
            self.last_head = time.monotonic()
            if header.msg_type == WEIGHTS and header.weight_version > self._weights_version:
                self._weights, self._weights_version = parts, header.weight_version
            elif header.msg_type == STOP:
                self.stop_requested = True
            elif header.msg_type not in (WEIGHTS, HEAD_HEARTBEAT):
                log.warning("ignoring unexpected message type %d from head", header.msg_type)

    def _drain_credits(self) -> None:
        while self.data.poll(0):
            parts = self.data.recv_multipart()
            try:
                header = decode_header(parts[0])
            except ProtocolError as exc:
                log.warning("ignoring bad message on the data socket: %s", exc.reason)
                continue
            if header.msg_type != CREDIT:
                log.warning("ignoring unexpected message type %d on the data socket", header.msg_type)
                continue
            self.last_head = self.last_credit = time.monotonic()
            while self.unacked_chunks and self.unacked_chunks[0] <= header.seq:
                self.unacked_chunks.popleft()

    def _wait_for_credit(self) -> bool:
        """Block until fewer than max_chunks_in_flight chunks are unacknowledged; False = must exit."""
        if not self.max_chunks_in_flight or len(self.unacked_chunks) < self.max_chunks_in_flight:
            return True
        t0 = time.monotonic()
        poller = zmq.Poller()
        poller.register(self.data, zmq.POLLIN)
        poller.register(self.sub, zmq.POLLIN)
        self.waiting = True
        try:
            while len(self.unacked_chunks) >= self.max_chunks_in_flight:
                poller.poll(100)
                self.poll_head()
                if self.must_exit():
                    return False
                self.maybe_heartbeat()  # "waiting for the head", not stalled
            return True
        finally:
            self.waiting = False
            self.credit_wait_s += time.monotonic() - t0

    def take_weights(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The newest WEIGHTS received since the last call, decoded and checked against the template
        (names, shapes, dtypes, finite values); None when there is none or it was refused (logged)."""
        parts, self._weights = self._weights, None
        if parts is None:
            return None
        try:
            return decode_weights(parts, self.template)
        except ProtocolError as exc:
            log.warning("refused weights: %s", exc)
            return None

    def head_silent(self) -> bool:
        return time.monotonic() - self.last_head > self.head_timeout_s

    def reclaimed(self) -> bool:
        """True when the head kept talking on the weights socket for reclaim_after_s after its last CREDIT on our
        data socket: it reclaimed this registration (BYE aside, after transport.head_timeout_s of silence from us).
        A head that stops altogether stops both, which is head silence instead."""
        return bool(self.reclaim_after_s) and self.last_head - self.last_credit > self.reclaim_after_s

    def must_exit(self) -> bool:
        return self.stop_requested or self.head_silent() or self.reclaimed() or self.should_stop()

    # ------------------------------------------------------------------ outgoing
    def _send(self, build: Callable[[int], list[Any]], block: bool) -> bool:
        """Send one message with the next sequence number; block while the HWM is full."""
        while True:
            if self.data.poll(0 if not block else 100, zmq.POLLOUT):
                if block:
                    self.waiting = False
                self.seq += 1
                send_parts(self.data, build(self.seq))
                self.sent_messages += 1
                return True
            if not block:
                return False
            self.waiting = True  # the socket is full: the head is not reading us
            self.poll_head()
            if self.must_exit():
                self.waiting = False
                return False

    def send_chunk(self, chunk: TransitionChunk) -> bool:
        if not self._wait_for_credit():
            return False
        if not self._send(lambda seq: encode_chunk(chunk, self.collector_id, seq, self.weight_version), True):
            return False
        if self.max_chunks_in_flight:
            self.unacked_chunks.append(self.seq)
        return True

    def send_episode(self, summary: EpisodeSummary) -> bool:
        return self._send(lambda seq: encode_episode(summary, self.collector_id, seq, self.weight_version), True)

    def maybe_heartbeat(self) -> None:
        """HEARTBEAT every heartbeat_s (count 1 = waiting for the head); skipped, never queued, when full."""
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.heartbeat_s
            flag = int(self.waiting)
            self._send(lambda seq: encode_simple(HEARTBEAT, self.collector_id, seq, self.weight_version, flag), False)

    def close(self) -> None:
        self.data.close(linger=0)
        self.sub.close(linger=0)
