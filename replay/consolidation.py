"""The head's consolidation thread: registration, per-collector data sockets, replay writes.

It is the replay's only writer. Every message is decoded and validated before anything touches
the buffer; a bad one is counted under its reason (logged once per reason) and dropped; nothing
raises out of the thread, and nothing a peer sends can make it allocate without bound:

- every receiving socket has `MAXMSGSIZE` (derived from the run's geometry), so an oversized
  frame is refused by ZeroMQ before it is buffered, with or without CURVE;
- registrations are capped below the context's socket limit and the open-file limit (libzmq aborts
  the process on EMFILE), refused with a clear WELCOME
  past the cap, and reclaimed (socket, state, cached WELCOME) on BYE, when their process is
  replaced, or after `transport.head_timeout_s` of silence;
- each collector gets its own ROUTER data socket and a secret routing id (`token`) in its
  WELCOME; messages from any other peer on that socket are rejected as `foreign_peer` and never
  touch the owner's sequence numbers or credits.

Data plane: chunks read from a collector are parked in its bounded `pending` queue and written
to the replay in least-recently-served order while the insert gate (`gate`, the replay's rate limiter:
`max_insert_lead`) allows, so a gate that opens briefly serves every collector in turn. A
collector whose chunks are parked is waiting for the head, never "stalled". With
transport.max_chunks_in_flight the socket carries CREDIT back once chunks are written (or
rejected), so a collector never has more than that many chunks unacknowledged.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import shutil
import socket as pysocket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

from replay.peers import CollectorState, episode_bounds_ok, fair_next
from replay.rate_limiter import InsertGate
from shared.chunk import TransitionChunk
from shared.config import Config
from shared.exploration import annealed_epsilon
from shared.keys import CurveServer, load_server, start_authenticator
from shared.protocol import (
    BYE,
    CREDIT,
    EPISODE_SUMMARY,
    HEADER_SIZE,
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
    validate_hello,
)

log = logging.getLogger(__name__)
DRAIN_PER_SOCKET = 64  # messages read from one collector per poll round (fairness)
MAX_OPEN_COLLECTORS = 1024  # live registrations; each costs a socket (the context gets room for them)
SOCKETS_RESERVED = 64  # the head's other sockets (control, weights, authenticator, wake pipes)
MAX_SOCKETS = MAX_OPEN_COLLECTORS + SOCKETS_RESERVED  # set on the head's zmq.Context before any socket
CONTROL_MAX_MSG = 64 * 1024  # a HELLO is a header and a small JSON object
PARKED_WITHOUT_CREDITS = 4  # chunks read ahead per collector when credits are off (then its HWM applies)
WELCOME_CACHE = 2 * MAX_OPEN_COLLECTORS  # answered HELLO nonces kept for retries
RECLAIM_EVERY_S = 0.5
FDS_PER_COLLECTOR = 3  # a registration's data socket: its mailbox, its listener, its owner's connection
FDS_RESERVED = 256  # the rest of the head: libraries, logs, TensorBoard, checkpoints, other sockets' peers


class _AlwaysOpen:
    def may_insert(self) -> bool:
        return True


ALWAYS_OPEN: InsertGate = _AlwaysOpen()  # no insert-side limit (Ape-X: collectors never wait)


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


def open_files_room(registrations: int) -> int:
    """How many registrations the open-file limit leaves room for, after raising the soft limit (never past
    the hard one) to what `registrations` need. libzmq aborts the whole process when a bind cannot get a
    file descriptor (EMFILE), so the registration cap must stay below the limit: with the common soft
    limit of 1024, a flood of HELLOs would otherwise kill the head."""
    try:
        import resource
    except ImportError:  # not POSIX
        return registrations
    want = FDS_RESERVED + FDS_PER_COLLECTOR * registrations
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            raised = want if hard == resource.RLIM_INFINITY else min(hard, want)
            if raised > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
    except (ValueError, OSError) as exc:
        log.debug("cannot raise the open-file limit: %r", exc)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return registrations
    return max(1, min(registrations, (soft - FDS_RESERVED) // FDS_PER_COLLECTOR))


def collector_epsilon(index: int, total: int, base: float, alpha: float) -> float:
    """Ape-X: eps_i = base ** (1 + alpha * i / (N - 1)); a single collector gets `base`."""
    if total <= 1:
        return float(base)
    return float(base ** (1.0 + alpha * (index % total) / (total - 1)))


def data_max_msg_bytes(spec: ObsSpec, max_chunk_frames: int) -> int:
    """Largest frame a collector may send: a chunk's observations (other frames are smaller)."""
    per_frame = 1
    for d in spec.obs_shape:
        per_frame *= int(d)
    per_frame *= spec.obs_dtype.itemsize if hasattr(spec.obs_dtype, "itemsize") else 1
    return max(HEADER_SIZE, max_chunk_frames * max(per_frame, 8)) + 4096


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
    collectors: dict[int, dict[str, Any]]  # open registrations only
    recent_episodes: list[EpisodeSummary]
    transitions_by_slot: dict[int, int]  # accepted transitions per slot over the run (closed ones included)
    reclaimed: int
    parked: int  # chunks read and waiting for the insert gate


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
        gate: InsertGate = ALWAYS_OPEN,
        max_chunk_frames: int | None = None,
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
        sockets_room = self.ctx.get(zmq.MAX_SOCKETS) - SOCKETS_RESERVED
        self.max_open = max(1, min(MAX_OPEN_COLLECTORS, sockets_room, open_files_room(MAX_OPEN_COLLECTORS)))
        frames = max_chunk_frames if max_chunk_frames is not None else max(2, min(4096, config.replay.capacity // 2))
        self.data_max_msg = data_max_msg_bytes(spec, frames)
        # summaries carry unscaled returns; env.max_abs_reward bounds the scaled rewards chunks carry
        self.max_abs_reward = float(config.env.max_abs_reward) / float(config.env.reward_scale)
        self.credits = t.max_chunks_in_flight > 0  # send CREDIT back on each data socket
        # parked chunks per collector before its socket is left unread: with credits one more than it may have
        # in flight, so a collector that keeps the rule is always read (its heartbeats too)
        self.park_limit = t.max_chunks_in_flight + 1 if self.credits else PARKED_WITHOUT_CREDITS
        self.reclaim_after_s = t.head_timeout_s
        self.gate = gate  # the replay's rate limiter, insert side (learner.max_insert_lead)
        self.gated_rounds = 0
        self.collectors: dict[int, CollectorState] = {}
        self._welcomes: collections.OrderedDict[str, list[bytes]] = collections.OrderedDict()
        self._next_id = 1
        self._tick = 0  # insert-scheduler clock (fair service)
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self._forget: collections.deque[int] = collections.deque()
        self._forget_pids: collections.deque[int] = collections.deque()
        self._next_reclaim = time.monotonic() + RECLAIM_EVERY_S
        self.transitions = self.chunks = self.rejected = self.gaps = 0
        self.heartbeats = self.episodes = self.registrations = self.queue = self.reclaimed = 0
        self.rejected_by_reason: collections.Counter[str] = collections.Counter()
        self.transitions_by_slot: collections.Counter[int] = collections.Counter()
        window = episode_window if episode_window is not None else config.logging.episode_window
        self.recent_episodes: collections.deque[EpisodeSummary] = collections.deque(maxlen=window)
        self.errors = 0
        # len(ReplayBuffer) belongs to the replay's reader thread; pass a thread-safe size otherwise
        self.buffer_size = buffer_size if buffer_size is not None else (lambda: len(self.replay))
        self.curve: CurveServer | None = None
        self.auth = None
        self.control: zmq.Socket | None = None
        self.ipc_dir = ""
        self.hostname = pysocket.gethostname()
        try:  # nothing outlives a failed start: sockets, authenticator thread, temp folder
            if t.curve_keys_dir:
                self.auth = start_authenticator(self.ctx, t.curve_keys_dir)
                self.curve = load_server(t.curve_keys_dir)
            self.control = self._socket(zmq.ROUTER, CONTROL_MAX_MSG)
            self.control_endpoint = self._bind(self.control, control_endpoint or f"tcp://{t.bind}:{t.port}")
            self.ipc_dir = tempfile.mkdtemp(prefix="mario-apex-")
        except BaseException:
            self._close_sockets()
            raise

    # ------------------------------------------------------------------ sockets
    def _socket(self, kind: int, max_msg: int) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.linger = 0
        sock.setsockopt(zmq.MAXMSGSIZE, int(max_msg))  # ZeroMQ drops the connection past it: nothing allocated
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
        """Reclaim a (dead or replaced) collector's registration; the thread does it on its next round."""
        self._forget.append(collector_id)

    def forget_pid(self, pid: int) -> None:
        """Reclaim every registration of the local process `pid` (the supervisor replaced or lost it)."""
        self._forget_pids.append(pid)

    def _round(self, poller: zmq.Poller) -> None:
        self._reclaim(poller, time.monotonic())
        for state in self.collectors.values():  # a collector whose park is full is not read: its HWM holds it
            readable = len(state.pending) < self.park_limit
            if readable != state.polled:
                if readable:
                    poller.register(state.sock, zmq.POLLIN)
                else:
                    poller.unregister(state.sock)
                state.polled = readable
        parked = any(s.pending for s in self.collectors.values())
        timeout = (0 if self.gate.may_insert() else 10) if parked else 100  # 10 ms: re-check a shut gate soon
        events = dict(poller.poll(timeout))
        read = 0
        if self.control in events:
            self._drain_control(poller)
        for state in list(self.collectors.values()):
            if state.closed or state.sock not in events:
                continue
            for _ in range(DRAIN_PER_SOCKET):
                if len(state.pending) >= self.park_limit:
                    break  # leave the rest queued: its high-water mark / credits hold the collector back
                try:
                    frames = state.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                read += 1
                self._on_data(state, frames)
                if state.closed:
                    break
        self._insert_parked()
        if any(s.pending for s in self.collectors.values()):
            self.gated_rounds += 1
            now = time.monotonic()
            for state in self.collectors.values():
                if state.pending:
                    state.stall_clock = now  # held by the head: waiting, not stalled
        for state in list(self.collectors.values()):
            if state.closed:
                self._close(state, poller)
            elif self.credits and state.credit_seq() > state.credited_seq:
                self._credit(state)
        self.queue = read

    def _insert_parked(self) -> int:
        """Write parked chunks, least-recently-served collector first, while the gate admits."""
        done = 0
        states = list(self.collectors.values())
        while True:
            if not self.gate.may_insert():
                return done
            state = fair_next(states)
            if state is None:
                return done
            seq, msg = state.pending.popleft()
            self._tick += 1
            state.served_at = self._tick
            self._write_chunk(state, seq, msg)
            done += 1

    def _write_chunk(self, state: CollectorState, seq: int, msg: Any) -> None:
        chunk = msg.payload
        try:
            added = int(self.replay.add_chunk(chunk))
        except ValueError as exc:
            self._reject("replay_rejected", str(exc))
            return
        released = state.delivered(int(chunk.stream), added)
        with self._lock:
            self.chunks += 1
            self.transitions += added
            state.chunks += 1
            state.transitions += added
            self.transitions_by_slot[state.slot] += added
            self._count_episodes(released)

    def _count_episodes(self, released: list[EpisodeSummary]) -> None:
        for s in released:  # caller holds the lock
            self.episodes += 1
            self.recent_episodes.append(s)

    def _credit(self, state: CollectorState) -> None:
        """CREDIT (transport.max_chunks_in_flight): everything up to credit_seq() is handled.

        Never blocks: a collector that does not read credits only fills its own queue, and a dropped
        credit is superseded by the next (acknowledgements are cumulative)."""
        seq = state.credit_seq()
        try:
            send_parts(state.sock, [state.token, *encode_simple(CREDIT, state.collector_id, seq)], zmq.NOBLOCK)
            state.credited_seq = seq
        except zmq.ZMQError:  # Again (full), or EHOSTUNREACH: the owner is not connected yet
            pass

    def _reclaim(self, poller: zmq.Poller, now: float) -> None:
        while self._forget:
            state = self.collectors.get(self._forget.popleft())
            if state is not None:
                state.closed = True
        while self._forget_pids:
            pid = self._forget_pids.popleft()
            for state in self.collectors.values():
                if state.pid == pid and state.host == self.hostname:
                    state.closed = True
        if now >= self._next_reclaim:
            self._next_reclaim = now + RECLAIM_EVERY_S
            for state in self.collectors.values():
                if not state.held_by_head() and now - state.stall_clock > self.reclaim_after_s:
                    state.closed = True
        for state in [s for s in self.collectors.values() if s.closed]:
            self._close(state, poller)

    def _close(self, state: CollectorState, poller: zmq.Poller) -> None:
        """Free a registration: its socket, parked chunks, state and cached WELCOME (totals stay)."""
        if state.polled:
            poller.unregister(state.sock)
            state.polled = False
        state.sock.close(linger=0)
        state.pending.clear()
        if state.endpoint.startswith("ipc://"):
            try:
                os.unlink(state.endpoint[len("ipc://"):])
            except OSError:
                pass
        self._welcomes.pop(state.nonce, None)
        with self._lock:
            self.collectors.pop(state.collector_id, None)
            self.reclaimed += 1
        log.info("collector %d (slot %d, pid %d) left: registration reclaimed", state.collector_id, state.slot,
                 state.pid)

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
        if self.control is not None:
            self.control.close(linger=0)
        for state in self.collectors.values():
            state.sock.close(linger=0)  # closing twice is a no-op
        if self.ipc_dir:
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
            hello = validate_hello(msg.payload)
        except ProtocolError as exc:
            self._reject(exc.reason, exc.detail)
            return
        nonce = hello["nonce"]
        if nonce and nonce in self._welcomes:
            self._send_control(identity, self._welcomes[nonce])
            return
        if len(self.collectors) >= self.max_open:
            self._reject("too_many_collectors")
            refusal = {"refused": f"the head has {len(self.collectors)} open registrations (the limit); "
                                  f"retry after some collectors leave"}
            self._send_control(identity, encode_json(WELCOME, refusal))
            return
        reply = self._register(hello, poller, peer)
        if nonce:
            self._welcomes[nonce] = reply
            while len(self._welcomes) > WELCOME_CACHE:
                self._welcomes.popitem(last=False)
        self._send_control(identity, reply)

    def _send_control(self, identity: bytes, reply: list[bytes]) -> None:
        try:
            self.control.send_multipart([identity, *reply], zmq.NOBLOCK)
        except zmq.ZMQError:  # the peer is gone or not reading: it will retry its HELLO
            pass

    def _register(self, hello: dict[str, Any], poller: zmq.Poller, peer: str = "") -> list[bytes]:
        cid = self._next_id
        self._next_id += 1
        host = hello["host"]
        # Local means "connected over loopback", not "same hostname": a collector in another network
        # namespace or container shares the hostname but cannot be assumed to share /tmp.
        local = _is_loopback(peer) and host == self.hostname and self.config.transport.local_transport == "ipc"
        sock = self._socket(zmq.ROUTER, self.data_max_msg)  # data up, CREDIT down to the token's peer only
        sock.rcvhwm = self.config.transport.recv_hwm
        if self.config.transport.socket_buffer_bytes:  # bounds stale data in flight (TCP only; see config)
            sock.rcvbuf = self.config.transport.socket_buffer_bytes
        inproc = self.control_endpoint.startswith("inproc://")  # the in-process mode: collectors are threads
        if inproc:
            endpoint = self._bind(sock, f"{self.control_endpoint}-c{cid}")
        elif local:
            endpoint = self._bind(sock, f"ipc://{os.path.join(self.ipc_dir, f'c{cid}.ipc')}")
        else:
            endpoint = self._bind(sock, f"tcp://{self.config.transport.bind}:0")
        slot = hello["slot"]
        slot = slot if 0 <= slot < self.num_collectors else (cid - 1) % self.num_collectors
        c = self.config.collectors
        eps = collector_epsilon(slot, self.num_collectors, c.eps_base, c.eps_alpha)
        token = b"c" + secrets.token_bytes(16)  # a routing id must not start with a zero byte
        state = CollectorState(cid, endpoint, sock, token, host, hello["pid"], slot, eps, nonce=hello["nonce"])
        poller.register(sock, zmq.POLLIN)
        state.polled = True
        with self._lock:
            self.collectors[cid] = state
            self.registrations += 1
        kind = "inproc" if inproc else "local" if local else "remote"
        weights = self.weights_endpoints.get(kind) or self.weights_endpoints.get("remote", "")
        log.info("collector %d registered (host=%s pid=%s slot=%d eps=%.4f) -> %s", cid, host[:64], state.pid, slot,
                 eps, endpoint)
        welcome = {
            "collector_id": cid, "data_endpoint": endpoint, "data_token": token.hex(), "weights_endpoint": weights,
            "epsilon": eps, "num_collectors": self.num_collectors, "slot": slot, "config": self.config.to_dict(),
        }
        return encode_json(WELCOME, welcome, collector=cid)

    # ------------------------------------------------------------------ data
    def _on_data(self, state: CollectorState, frames: list[Any]) -> None:
        if len(frames) < 2 or frames[0].bytes != state.token:
            # another peer on this collector's endpoint: counted, never near the owner's seq or credits
            self._reject("foreign_peer", f"on collector {state.collector_id}'s socket")
            return
        parts = frames[1:]
        try:
            header = decode_header(parts[0])
            if header.collector != state.collector_id:
                raise ProtocolError("collector_mismatch", f"{header.collector} on {state.collector_id}'s socket")
            state.received_seq = max(state.received_seq, header.seq)  # read, even if rejected below: credit it
            if header.seq <= state.last_seq:
                raise ProtocolError("stale_seq", f"{header.seq} <= {state.last_seq}")
            if header.weight_version > self.latest_weight_version():
                raise ProtocolError("future_weights", str(header.weight_version))
            msg = decode(parts, self.spec)
            t = msg.header.msg_type
            if t == EPISODE_SUMMARY and not episode_bounds_ok(msg.payload, self.max_abs_reward):
                raise ProtocolError("episode_out_of_range", f"return {msg.payload.episode_return} "
                                                            f"in {msg.payload.length} steps")
            if t not in (TRANSITION_CHUNK, HEARTBEAT, EPISODE_SUMMARY, BYE):
                raise ProtocolError("unexpected_type", str(t))
        except ProtocolError as exc:
            self._reject(exc.reason, exc.detail)
            return
        now = time.monotonic()
        with self._lock:
            if header.seq > state.last_seq + 1:
                self.gaps += header.seq - state.last_seq - 1
            state.last_seq = header.seq
            state.last_seen = state.stall_clock = now
            state.heard = True
            state.weight_version = header.weight_version
            if t == TRANSITION_CHUNK:
                state.pending.append((header.seq, msg))
            elif t == HEARTBEAT:
                self.heartbeats += 1
                state.says_waiting = header.count == 1
            elif t == EPISODE_SUMMARY:
                self._count_episodes(state.summary(msg.payload))
            else:
                state.closed = True

    def _reject(self, reason: str, detail: str = "") -> None:
        with self._lock:
            self.rejected += 1
            self.rejected_by_reason[reason] += 1
        self._log_once(reason, "rejected message: %s %s", reason, detail[:200])

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
                      "last_seen_s": now - s.last_seen, "stall_s": now - s.stall_clock,
                      "waiting": s.waiting_for_head(), "heard": s.heard, "parked": len(s.pending),
                      "weight_version": s.weight_version, "chunks": s.chunks, "transitions": s.transitions,
                      "closed": s.closed}
                for cid, s in self.collectors.items()
            }
            return ConsolidationStats(
                self.transitions, self.chunks, self.rejected, dict(self.rejected_by_reason), self.gaps,
                self.heartbeats, self.episodes, self.registrations, self.buffer_size(), self.queue, collectors,
                list(self.recent_episodes), dict(self.transitions_by_slot), self.reclaimed,
                sum(c["parked"] for c in collectors.values()),
            )

    def silent_collectors(self, timeout_s: float | None = None) -> list[int]:
        """Ids of open collectors neither heard from nor held by the head for `timeout_s` (default stall_timeout_s)."""
        limit = self.config.transport.stall_timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        with self._lock:
            return [c for c, s in self.collectors.items() if not s.closed and now - s.stall_clock > limit]

    def stall_clock_of_pid(self, pid: int) -> tuple[float, bool] | None:
        """(newest time the local process `pid` was heard from or held, whether the head holds its chunks
        now); None when it has no open registration (the supervisor's stall check). A HEARTBEAT saying
        "waiting" refreshes the clock like any message; it cannot freeze it."""
        with self._lock:
            mine = [s for s in self.collectors.values() if s.pid == pid and s.host == self.hostname and not s.closed]
            if not mine:
                return None
            return max(s.stall_clock for s in mine), any(s.held_by_head() for s in mine)

    def processor_line(self) -> str:
        s = self.stats()
        return (f"[PROCESSOR] Processed: {s.transitions:,}, Batches: {s.chunks:,}, Drops: {s.rejected:,}, "
                f"Buffer: {s.buffer_size:,}, Consolidated Queue: {s.queue:,}, Parked: {s.parked:,}")
