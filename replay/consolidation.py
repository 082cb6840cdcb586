"""The head's consolidation thread: registration, per-collector data sockets, replay writes.

It is the replay's only writer. Every message is decoded and validated before anything touches
the buffer; a bad one is counted under its reason (logged once per reason) and dropped; nothing
raises out of the thread. Each collector gets its own data socket (a DEALER bound at
registration), so one fast or hostile collector cannot crowd out another's queue, sequence
numbers are checked per socket, and its high-water mark backpressures exactly that collector.
With transport.max_chunks_in_flight the same socket carries CREDIT back after each read, so a
collector never has more than that many unread chunks queued: data is at most that stale.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import socket as pysocket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq

from shared.chunk import TransitionChunk
from shared.config import Config
from shared.exploration import annealed_epsilon
from shared.keys import CurveServer, load_server, start_authenticator
from shared.protocol import (
    BYE,
    CREDIT,
    EPISODE_SUMMARY,
    HEARTBEAT,
    HELLO,
    TRANSITION_CHUNK,
    WELCOME,
    EpisodeSummary,
    ObsSpec,
    ProtocolError,
    decode,
    decode_header,
    encode_json,
    encode_simple,
    send_parts,
)

log = logging.getLogger(__name__)
DRAIN_PER_SOCKET = 64  # messages read from one collector per poll round (fairness)
MAX_OPEN_COLLECTORS = 1024  # registrations beyond this are refused: each one costs a socket


class ReplaySink(Protocol):
    def add_chunk(self, chunk: TransitionChunk) -> int: ...
    def __len__(self) -> int: ...


def _peer_address(frame: zmq.Frame) -> str:
    """The TCP peer of a received message ("" when the transport has none, e.g. inproc)."""
    try:
        return frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        return ""


def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "localhost")


def collector_epsilon(index: int, total: int, base: float, alpha: float) -> float:
    """Ape-X: eps_i = base ** (1 + alpha * i / (N - 1)); a single collector gets `base`."""
    if total <= 1:
        return float(base)
    return float(base ** (1.0 + alpha * (index % total) / (total - 1)))


@dataclass
class CollectorState:
    collector_id: int
    endpoint: str
    sock: zmq.Socket
    host: str = ""
    pid: int = 0
    slot: int = -1
    epsilon: float = 0.0
    last_seq: int = 0  # newest accepted sequence number
    received_seq: int = 0  # newest sequence number read from this socket, accepted or rejected
    credited_seq: int = 0  # newest sequence number acknowledged with CREDIT
    last_seen: float = field(default_factory=time.monotonic)
    weight_version: int = 0
    chunks: int = 0
    transitions: int = 0
    closed: bool = False


@dataclass(frozen=True)
class ConsolidationStats:
    transitions: int
    chunks: int
    rejected: int
    rejected_by_reason: dict[str, int]
    gaps: int
    heartbeats: int
    episodes: int
    registrations: int
    buffer_size: int
    queue: int
    collectors: dict[int, dict[str, Any]]
    recent_episodes: list[EpisodeSummary]


class ConsolidationThread(threading.Thread):
    """Owns the control ROUTER and every collector's data socket; writes chunks to the replay."""

    def __init__(
        self,
        config: Config,
        replay: ReplaySink,
        spec: ObsSpec,
        weights_endpoints: dict[str, str],
        latest_weight_version: Callable[[], int] = lambda: 0,
        context: zmq.Context | None = None,
        control_endpoint: str | None = None,
        num_collectors: int | None = None,
        episode_window: int | None = None,
        buffer_size: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(name="consolidation", daemon=True)
        self.config = config
        self.replay = replay
        self.spec = spec
        self.weights_endpoints = weights_endpoints  # {"local": ipc://..., "remote": tcp://...}
        self.latest_weight_version = latest_weight_version
        self.num_collectors = max(1, num_collectors if num_collectors is not None else config.collectors.count)
        t = config.transport
        self.ctx = context or zmq.Context.instance()
        self.curve: CurveServer | None = None
        self.auth = None
        if t.curve_keys_dir:
            self.auth = start_authenticator(self.ctx, t.curve_keys_dir)
            self.curve = load_server(t.curve_keys_dir)
        self.ipc_dir = tempfile.mkdtemp(prefix="mario-apex-")
        self.hostname = pysocket.gethostname()
        self.control = self._socket(zmq.ROUTER)
        self.control_endpoint = self._bind(self.control, control_endpoint or f"tcp://{t.bind}:{t.port}")
        self._control_poller = zmq.Poller()
        self._control_poller.register(self.control, zmq.POLLIN)
        self.credits = t.max_chunks_in_flight > 0  # send CREDIT back on each data socket
        self.admit: Callable[[], bool] | None = None  # insert-side rate limit, set by the head
        self.gated_rounds = 0
        self.collectors: dict[int, CollectorState] = {}
        self._welcomes: dict[str, list[bytes]] = {}  # HELLO nonce -> WELCOME, for retried HELLOs
        self._next_id = 1
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self._forget: collections.deque[int] = collections.deque()
        self.transitions = self.chunks = self.rejected = self.gaps = 0
        self.heartbeats = self.episodes = self.registrations = self.queue = 0
        self.rejected_by_reason: collections.Counter[str] = collections.Counter()
        window = episode_window if episode_window is not None else config.logging.episode_window
        self.recent_episodes: collections.deque[EpisodeSummary] = collections.deque(maxlen=window)
        self.errors = 0
        # len(ReplayBuffer) belongs to the replay's reader thread; pass a thread-safe size otherwise
        self.buffer_size = buffer_size if buffer_size is not None else (lambda: len(self.replay))

    # ------------------------------------------------------------------ sockets
    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        if self.curve is not None:
            self.curve.apply(sock)
        return sock

    @staticmethod
    def _bind(sock: zmq.Socket, endpoint: str) -> str:
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            base = endpoint.rsplit(":", 1)[0]
            return f"{base}:{sock.bind_to_random_port(base)}"
        sock.bind(endpoint)
        return endpoint

    # ------------------------------------------------------------------ thread
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        try:
            while not self._stop_event.is_set():
                try:
                    self._round(poller)
                except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                    self.errors += 1
                    self._log_once(f"internal:{type(exc).__name__}", "consolidation error: %r", exc)
        finally:
            self._close_sockets()

    def forget(self, collector_id: int) -> None:
        """Close a (dead or restarted) collector's socket; the thread does it on its next round."""
        self._forget.append(collector_id)

    def _round(self, poller: zmq.Poller) -> None:
        while self._forget:
            state = self.collectors.get(self._forget.popleft())
            if state is not None and not state.closed:
                state.closed = True
                poller.unregister(state.sock)
                state.sock.close(linger=0)
        admit = self.admit
        if admit is not None and not admit():
            # the learner is behind the replay ratio (learner.max_insert_lead): leave data queued so
            # each collector's high-water mark blocks it; keep answering registrations meanwhile
            self.gated_rounds += 1
            if self.control in dict(self._control_poller.poll(10)):
                self._drain_control(poller)
            return
        events = dict(poller.poll(100))
        read = 0
        if self.control in events:
            self._drain_control(poller)
        for state in list(self.collectors.values()):
            if state.closed or state.sock not in events:
                continue
            for _ in range(DRAIN_PER_SOCKET):
                try:
                    parts = state.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                read += 1
                self._on_data(state, parts)
                if state.closed:
                    poller.unregister(state.sock)
                    state.sock.close(linger=0)
                    break
            if self.credits and not state.closed and state.received_seq > state.credited_seq:
                self._credit(state)
        self.queue = read

    def _credit(self, state: CollectorState) -> None:
        """CREDIT (transport.max_chunks_in_flight): everything up to received_seq has been read.

        Never blocks: a collector that does not read credits only fills its own queue, and a dropped
        credit is superseded by the next (acknowledgements are cumulative)."""
        try:
            send_parts(state.sock, encode_simple(CREDIT, state.collector_id, state.received_seq), zmq.NOBLOCK)
            state.credited_seq = state.received_seq
        except zmq.Again:
            pass

    def _drain_control(self, poller: zmq.Poller) -> None:
        for _ in range(DRAIN_PER_SOCKET):
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._on_control([f.bytes for f in frames], poller, _peer_address(frames[-1]))

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to finish its round, close its sockets (linger 0) and join it."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)
        elif not self._started.is_set():  # type: ignore[attr-defined]
            self._close_sockets()

    def _close_sockets(self) -> None:
        self.control.close(linger=0)
        for state in self.collectors.values():
            state.sock.close(linger=0)  # closing twice is a no-op
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None

    # ------------------------------------------------------------------ control
    def _on_control(self, parts: list[bytes], poller: zmq.Poller, peer: str = "") -> None:
        if len(parts) < 2:
            self._reject("bad_frame_count")
            return
        identity, body = parts[0], parts[1:]
        try:
            msg = decode(body)
            if msg.header.msg_type != HELLO:
                raise ProtocolError("unexpected_type", "control expects HELLO")
        except ProtocolError as exc:
            self._reject(exc.reason, exc.detail)
            return
        hello = msg.payload
        nonce = str(hello.get("nonce", ""))
        if nonce and nonce in self._welcomes:
            self.control.send_multipart([identity, *self._welcomes[nonce]])
            return
        if sum(not c.closed for c in self.collectors.values()) >= MAX_OPEN_COLLECTORS:
            self._reject("too_many_collectors")
            return
        reply = self._register(hello, poller, peer)
        if nonce:
            self._welcomes[nonce] = reply
        self.control.send_multipart([identity, *reply])

    def _register(self, hello: dict[str, Any], poller: zmq.Poller, peer: str = "") -> list[bytes]:
        cid = self._next_id
        self._next_id += 1
        host = str(hello.get("host", ""))
        # Local means "connected over loopback", not "same hostname": a collector in another network
        # namespace or container shares the hostname but cannot be assumed to share /tmp.
        local = _is_loopback(peer) and host == self.hostname and self.config.transport.local_transport == "ipc"
        sock = self._socket(zmq.DEALER)  # data up, CREDIT down; one peer, so DEALER routes like PUSH/PULL
        sock.rcvhwm = self.config.transport.recv_hwm
        if self.config.transport.socket_buffer_bytes:  # bounds stale data in flight (TCP only; see config)
            sock.rcvbuf = self.config.transport.socket_buffer_bytes
        if local:
            endpoint = self._bind(sock, f"ipc://{os.path.join(self.ipc_dir, f'c{cid}.ipc')}")
        else:
            endpoint = self._bind(sock, f"tcp://{self.config.transport.bind}:0")
        slot = hello.get("slot", -1)
        slot = slot if isinstance(slot, int) and 0 <= slot < self.num_collectors else cid - 1
        c = self.config.collectors
        eps = collector_epsilon(slot, self.num_collectors, c.eps_base, c.eps_alpha)
        pid = hello.get("pid", 0)
        state = CollectorState(cid, endpoint, sock, host, pid if isinstance(pid, int) else 0, slot, eps)
        poller.register(sock, zmq.POLLIN)
        with self._lock:
            self.collectors[cid] = state
            self.registrations += 1
        weights = self.weights_endpoints.get("local" if local else "remote") or self.weights_endpoints.get("remote", "")
        log.info("collector %d registered (host=%s pid=%s slot=%d eps=%.4f) -> %s", cid, host, pid, slot, eps, endpoint)
        welcome = {
            "collector_id": cid, "data_endpoint": endpoint, "weights_endpoint": weights, "epsilon": eps,
            "num_collectors": self.num_collectors, "slot": slot, "config": self.config.to_dict(),
        }
        return encode_json(WELCOME, welcome, collector=cid)

    # ------------------------------------------------------------------ data
    def _on_data(self, state: CollectorState, parts: list[Any]) -> None:
        try:
            header = decode_header(parts[0]) if parts else None
            if header is None:
                raise ProtocolError("bad_frame_count", "empty")
            if header.collector != state.collector_id:
                raise ProtocolError("collector_mismatch", f"{header.collector} on {state.collector_id}'s socket")
            state.received_seq = max(state.received_seq, header.seq)  # read, even if rejected below: credit it
            if header.seq <= state.last_seq:
                raise ProtocolError("stale_seq", f"{header.seq} <= {state.last_seq}")
            if header.weight_version > self.latest_weight_version():
                raise ProtocolError("future_weights", str(header.weight_version))
            msg = decode(parts, self.spec)
        except ProtocolError as exc:
            self._reject(exc.reason, exc.detail)
            return
        t = msg.header.msg_type
        added = 0
        if t == TRANSITION_CHUNK:
            try:
                added = int(self.replay.add_chunk(msg.payload))
            except ValueError as exc:
                self._reject("replay_rejected", str(exc))
                return
        elif t not in (HEARTBEAT, EPISODE_SUMMARY, BYE):
            self._reject("unexpected_type", str(t))
            return
        with self._lock:
            if header.seq > state.last_seq + 1:
                self.gaps += header.seq - state.last_seq - 1
            state.last_seq = header.seq
            state.last_seen = time.monotonic()
            state.weight_version = header.weight_version
            if t == TRANSITION_CHUNK:
                self.chunks += 1
                self.transitions += added
                state.chunks += 1
                state.transitions += added
            elif t == HEARTBEAT:
                self.heartbeats += 1
            elif t == EPISODE_SUMMARY:
                self.episodes += 1
                self.recent_episodes.append(msg.payload)
            else:
                state.closed = True

    def _reject(self, reason: str, detail: str = "") -> None:
        with self._lock:
            self.rejected += 1
            self.rejected_by_reason[reason] += 1
        self._log_once(reason, "rejected message: %s %s", reason, detail)

    def _log_once(self, key: str, fmt: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(fmt + " (logged once per reason)", *args)

    # ------------------------------------------------------------------ views
    def stats(self) -> ConsolidationStats:
        """Counters snapshot (any thread; buffer_size() decides where the Buffer figure comes from)."""
        now = time.monotonic()
        decay = self.config.collectors.eps_decay_updates  # report what collectors act with now
        with self._lock:
            collectors = {
                cid: {"host": s.host, "pid": s.pid, "slot": s.slot,
                      "epsilon": annealed_epsilon(s.epsilon, s.weight_version, decay),
                      "last_seen_s": now - s.last_seen, "weight_version": s.weight_version,
                      "chunks": s.chunks, "transitions": s.transitions, "closed": s.closed}
                for cid, s in self.collectors.items()
            }
            return ConsolidationStats(
                self.transitions, self.chunks, self.rejected, dict(self.rejected_by_reason), self.gaps,
                self.heartbeats, self.episodes, self.registrations, self.buffer_size(), self.queue, collectors,
                list(self.recent_episodes),
            )

    def silent_collectors(self, timeout_s: float | None = None) -> list[int]:
        """Ids of open collectors unheard for `timeout_s` (default transport.stall_timeout_s)."""
        limit = self.config.transport.stall_timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        with self._lock:
            return [c for c, s in self.collectors.items() if not s.closed and now - s.last_seen > limit]

    def last_seen_by_slot(self, slot: int) -> float | None:
        """time.monotonic() of the newest message from `slot`'s collector (the supervisor's stall check)."""
        with self._lock:
            seen = [s.last_seen for s in self.collectors.values() if s.slot == slot and not s.closed]
        return max(seen) if seen else None

    def processor_line(self) -> str:
        s = self.stats()
        return (f"[PROCESSOR] Processed: {s.transitions:,}, Batches: {s.chunks:,}, Drops: {s.rejected:,}, "
                f"Buffer: {s.buffer_size:,}, Consolidated Queue: {s.queue:,}")
