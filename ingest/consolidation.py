"""The head's consolidation thread: the data plane from collectors' sockets into the replay.

It is the replay's only writer and owns every socket it polls: the control socket and each
collector's data socket, both made by the launcher's registration (passed in as
`registrations`; ingest/registration.py decides who may register and binds the sockets).
Every message is decoded and validated before anything touches the buffer; a bad one is counted
under its reason (logged once per reason) and dropped; nothing raises out of the thread:

- each collector's ROUTER accepts only its owner's routing id (the WELCOME's `token`); any other
  peer's messages are rejected as `foreign_peer` and never touch the owner's sequence or credits;
  a sequence number far ahead (`seq_jump`) moves nothing either;
- what a registration may make the head keep is bounded, and summaries count only for episodes
  its chunks ended (ingest/peers.py); priorities above the registration's cap are clipped;
- registrations are reclaimed (socket, state, cached WELCOME) on BYE, when the supervisor says
  their process was replaced, or after `transport.head_timeout_s` in which the head was ready to
  read and heard nothing.

Chunks read from a collector are parked in its bounded `pending` queue and written to the
replay in least-recently-served order while the insert gate (`gate`, the replay's rate limiter:
`learner.max_insert_lead`) allows, so a gate that opens briefly serves every collector in turn.
A collector whose chunks are parked is waiting for the head, never "stalled". With
transport.max_chunks_in_flight the socket carries CREDIT back once chunks are written (or
rejected), so a collector never has more than that many chunks unacknowledged; credits on or off,
a CREDIT goes out at least every collectors.heartbeat_s, so a collector whose registration was
reclaimed learns it from their absence.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import zmq

from ingest.consolidation_types import (
    ALWAYS_OPEN,
    ConsolidationStats,
    Registrations,
    ReplaySink,
)
from ingest.memory_guard import POLL_MS
from ingest.peers import CollectorState, Verdict, episode_bounds_ok, fair_next
from replay.rate_limiter import InsertGate
from shared.chunk import TransitionChunk
from shared.config import CollectorConfig, TransportConfig
from shared.exploration import acting_epsilon
from shared.protocol import (
    BYE,
    CREDIT,
    EPISODE_SUMMARY,
    HEARTBEAT,
    TRANSITION_CHUNK,
    EpisodeSummary,
    ObsSpec,
    ProtocolError,
    decode,
    decode_header,
    encode_simple,
    send_parts,
)
from shared.sizes import LogBudget

log = logging.getLogger(__name__)
DRAIN_PER_SOCKET = 64  # messages read from one collector per poll round (fairness)
PARKED_WITHOUT_CREDITS = 4  # chunks read ahead per collector when credits are off (then its HWM applies)
RECLAIM_EVERY_S = 0.5
# Largest step of a data socket's sequence number: a collector numbers every message it sends, so only messages
# lost on the way make gaps (bounded by its send queue and socket buffers: thousands, never a million)
MAX_SEQ_JUMP = 1 << 20
INSERT_BATCH = 64  # parked chunks written to the replay in one call: 64 inserts at 0.77x the copy floor, 16 at 0.69x (BENCHMARKS.md)


class ConsolidationThread(threading.Thread):
    """Owns the control ROUTER and every collector's data socket; writes chunks to the replay."""

    def __init__(
        self,
        replay: ReplaySink,
        spec: ObsSpec,
        registrations: Registrations,
        *,
        transport: TransportConfig,
        collectors: CollectorConfig,
        episode_window: int,
        latest_weight_version: Callable[[], int] = lambda: 0,
        buffer_size: Callable[[], int] | None = None,
        gate: InsertGate = ALWAYS_OPEN,
    ) -> None:
        """`spec`: what chunks must match, and the reward bound an episode summary is checked against;
        `transport`: credits, parking, reclaim and stall timeouts; `collectors`: the epsilon schedule stats()
        reports; `episode_window`: recent episodes kept (logging.episode_window)."""
        super().__init__(name="consolidation", daemon=True)
        self.replay = replay
        self.spec = spec
        self.registrations = registrations
        self.latest_weight_version = latest_weight_version
        self.transport = t = transport
        self.eps_decay_updates = collectors.eps_decay_updates
        self.eps_stage_from, self.eps_stage = collectors.eps_stage_from, collectors.eps_stage
        self.credit_every_s = collectors.heartbeat_s  # a CREDIT at least this often on every data socket
        # summaries carry unscaled returns; spec.max_abs_reward bounds the scaled rewards chunks carry
        self.max_abs_reward = float(spec.max_abs_reward) / float(spec.reward_scale)
        self.credits = t.max_chunks_in_flight > 0  # send CREDIT back on each data socket
        # parked chunks per collector before its socket is left unread: with credits one more than it may have
        # in flight, so a collector that keeps the rule is always read (its heartbeats too)
        self.park_limit = t.max_chunks_in_flight + 1 if self.credits else PARKED_WITHOUT_CREDITS
        self.reclaim_after_s = t.head_timeout_s
        # before its first message a collector is still building its envs and network (seconds on a loaded
        # machine): it gets as long as the head gives a local collector before restarting it
        self.first_message_after_s = max(t.head_timeout_s, t.stall_timeout_s)
        self.gate = gate  # the replay's rate limiter, insert side (learner.max_insert_lead)
        self.gated_rounds = 0
        self.collectors: dict[int, CollectorState] = {}
        self._tick = 0  # insert-scheduler clock (fair service)
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # held for each replay write and its counts; `writes_paused` holds it too
        self._logged: set[str] = set()
        self._forget: collections.deque[int] = collections.deque()
        self._forget_pids: collections.deque[tuple[int, str]] = collections.deque()
        self._log_budget = LogBudget()  # reclaim lines: a HELLO flood must not flood the log
        self._next_reclaim = time.monotonic() + RECLAIM_EVERY_S
        self.transitions = self.chunks = self.rejected = self.gaps = 0
        self.priorities_capped = 0  # chunks whose priorities were clipped to their registration's max_priority
        self.heartbeats = self.episodes = self.registrations_total = self.queue = self.reclaimed = 0
        self.rejected_by_reason: collections.Counter[str] = collections.Counter()
        self.transitions_by_slot: collections.Counter[int] = collections.Counter()
        self.recent_episodes: collections.deque[EpisodeSummary] = collections.deque(maxlen=episode_window)
        self.recent_by_slot: collections.defaultdict[int, collections.deque[EpisodeSummary]] = \
            collections.defaultdict(lambda: collections.deque(maxlen=episode_window))
        self.errors = 0
        self.errors_since_accepted = 0
        self.last_error = ""
        # len(ReplayBuffer) belongs to the replay's reader thread; pass a thread-safe size otherwise
        self.buffer_size = buffer_size if buffer_size is not None else (lambda: len(self.replay))

    @property
    def control_endpoint(self) -> str:
        return self.registrations.control_endpoint

    @property
    def hostname(self) -> str:
        return self.registrations.hostname

    # ------------------------------------------------------------------ thread
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.registrations.control, zmq.POLLIN)
        try:
            while not self._stop_event.is_set():
                chunks = self.chunks
                try:
                    self._round(poller)
                except Exception as exc:  # noqa: BLE001 - the thread survives; the head decides (Head.run)
                    self.errors += 1
                    self.errors_since_accepted += 1
                    self.last_error = repr(exc)[:300]
                    self._log_once(f"internal:{type(exc).__name__}", "consolidation error: %r", exc)
                if self.chunks != chunks:
                    self.errors_since_accepted = 0
        finally:
            self._close_sockets()

    def forget(self, collector_id: int) -> None:
        """Reclaim a (dead or replaced) collector's registration; the thread does it on its next round."""
        self._forget.append(collector_id)

    def forget_pid(self, pid: int, host: str | None = None) -> None:
        """Reclaim every registration of process `pid` on `host` (default: this machine); the supervisor
        replaced or lost it."""
        self._forget_pids.append((pid, host or self.hostname))

    def _round(self, poller: zmq.Poller) -> None:
        self._reclaim(poller, time.monotonic())
        self.registrations.check_descriptors(time.monotonic())  # idle connections must not take the last ones
        self.registrations.check_memory(time.monotonic())  # nor unfinished messages all the memory
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
        if self.registrations.memory is not None:  # an unfinished message wakes no poll: look at memory anyway
            timeout = min(timeout, POLL_MS)
        events = dict(poller.poll(timeout))
        read = 0
        if self.registrations.control in events:
            self.registrations.drain(len(self.collectors), self._reject, lambda state: self._admit(poller, state))
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
        now = time.monotonic()
        for state in list(self.collectors.values()):
            if state.closed:
                self._close(state, poller)
            elif (self.credits and state.credit_seq() > state.credited_seq) or now >= state.credit_due:
                self._credit(state, now)
        self.queue = read

    def _insert_parked(self) -> int:
        """Write parked chunks, least-recently-served collector first, while the gate admits.

        Chunks go to the replay in batches of up to INSERT_BATCH (one vectorized write amortizes
        the per-chunk bookkeeping); the gate is asked before each chunk joins a batch, with the
        batch's not-yet-written transitions counted as pending, so it admits what one-by-one
        writes would have admitted (counting each chunk's upper bound: frames after first_start).
        """
        if not self._writing.acquire(blocking=False):
            return 0  # a checkpoint is saving the replay: the chunks stay parked and this thread keeps serving
        try:
            return self._insert_parked_now()
        finally:
            self._writing.release()

    def _insert_parked_now(self) -> int:
        done = 0
        states = list(self.collectors.values())
        while True:
            batch: list[tuple[CollectorState, TransitionChunk]] = []
            pending = 0
            while len(batch) < INSERT_BATCH and self.gate.may_insert(pending):
                state = fair_next(states)
                if state is None:
                    break
                _, msg = state.pending.popleft()
                self._tick += 1
                state.served_at = self._tick
                chunk = msg.payload
                batch.append((state, chunk))
                pending += chunk.num_frames - int(chunk.first_start)
            if not batch:
                return done
            self._write_batch_now(batch)  # the caller holds _writing
            done += len(batch)

    @contextlib.contextmanager
    def writes_paused(self) -> Iterator[None]:
        """No replay write, and no count of one, while the caller is inside: a checkpoint saves the replay and the
        head's counters as of one instant (the replay's save needs a quiescent writer). This thread does not
        wait meanwhile: it keeps reading, crediting and heartbeating, and the chunks that arrive stay parked, as
        behind a shut insert gate (a save of seconds must not look like a silent head to the collectors)."""
        with self._writing:
            yield

    def _write_batch(self, batch: list[tuple[CollectorState, TransitionChunk]]) -> None:
        """One replay write for the batch; each chunk is then credited to its collector or rejected."""
        with self._writing:
            self._write_batch_now(batch)

    def _write_batch_now(self, batch: list[tuple[CollectorState, TransitionChunk]]) -> None:
        results = self.replay.add_chunks([chunk for _, chunk in batch])
        for (state, chunk), added in zip(batch, results, strict=True):
            if isinstance(added, ValueError):
                self._reject("replay_rejected", str(added))
                continue
            verdict = state.delivered(chunk, int(added))  # episode ends among them settle waiting summaries
            with self._lock:
                self.chunks += 1
                self.transitions += added
                state.chunks += 1
                state.transitions += added
                self.transitions_by_slot[state.slot] += added
            self._count_episodes(state.slot, verdict)

    def _count_episodes(self, slot: int, verdict: Verdict) -> None:
        """Summaries that now count go to the statistics; those rejected are counted under their reason."""
        if verdict.counted:
            with self._lock:
                for s in verdict.counted:
                    self.episodes += 1
                    self.recent_episodes.append(s)
                    self.recent_by_slot[slot].append(s)
        for reason, detail in verdict.rejected:
            self._reject(reason, detail)

    def _credit(self, state: CollectorState, now: float) -> None:
        """CREDIT: everything up to credit_seq() is handled (transport.max_chunks_in_flight), and the registration
        is alive: one goes out at least every collectors.heartbeat_s, credits on or off (the WELCOME's
        credit_every_s), so a collector whose registration was reclaimed learns it from their absence.

        Never blocks: a collector that does not read credits only fills its own queue, and a dropped
        credit is superseded by the next (acknowledgements are cumulative)."""
        seq = state.credit_seq()
        try:
            send_parts(state.sock, [state.token, *encode_simple(CREDIT, state.collector_id, seq)], zmq.NOBLOCK)
            state.credited_seq = seq
            state.credit_due = now + self.credit_every_s
        except zmq.ZMQError:  # Again (full), or EHOSTUNREACH: the owner is not connected yet
            pass

    def _admit(self, poller: zmq.Poller, state: CollectorState) -> None:
        """Open a registration: poll its data socket, count it (before its WELCOME leaves)."""
        poller.register(state.sock, zmq.POLLIN)
        state.polled = True
        state.credit_due = time.monotonic() + self.credit_every_s
        with self._lock:
            self.collectors[state.collector_id] = state
            self.registrations_total += 1

    def _reclaim(self, poller: zmq.Poller, now: float) -> None:
        while self._forget:
            state = self.collectors.get(self._forget.popleft())
            if state is not None:
                state.closed = True
        while self._forget_pids:
            pid, host = self._forget_pids.popleft()
            for state in self.collectors.values():
                if state.pid == pid and state.host == host:
                    state.closed = True
        if now >= self._next_reclaim:
            self._next_reclaim = now + RECLAIM_EVERY_S
            for state in self.collectors.values():
                limit = self.reclaim_after_s if state.heard else self.first_message_after_s
                if not state.held_by_head() and now - state.stall_clock > limit:
                    state.closed = True
        for state in [s for s in self.collectors.values() if s.closed]:
            self._close(state, poller)

    def _close(self, state: CollectorState, poller: zmq.Poller) -> None:
        """Free a registration: its socket, parked chunks, state and cached WELCOME (totals stay)."""
        if state.polled:
            poller.unregister(state.sock)
            state.polled = False
        if state.pending:  # it left (BYE, replaced): what it sent is still good data, and bounded (park_limit)
            self._write_batch([(state, msg.payload) for _, msg in state.pending])
            state.pending.clear()
        self.registrations.release(state)
        with self._lock:
            self.collectors.pop(state.collector_id, None)
            self.reclaimed += 1
        allowed, dropped = self._log_budget.allow()
        if allowed:
            log.info("collector %d (slot %d, pid %d) left: registration reclaimed%s", state.collector_id, state.slot,
                     state.pid, f" ({dropped} more not logged)" if dropped else "")

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to finish its round, close its sockets (linger 0) and join it."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)
        elif not self._started.is_set():  # type: ignore[attr-defined]
            self._close_sockets()

    def _close_sockets(self) -> None:
        for state in self.collectors.values():
            self.registrations.release(state)  # closing twice is a no-op
        self.registrations.close()

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
            line = max(state.last_seq, state.received_seq)  # the socket's sequence so far
            if header.seq > line + MAX_SEQ_JUMP:
                # not credited and nothing moves: one message cannot make every later one of its socket stale
                raise ProtocolError("seq_jump", f"{header.seq} after {state.last_seq}")
            # a jump past the next number moves the sequence only once the message after it continues from it:
            # until then the sequence stays where it was, so one message (a peer with a sniffed token, before
            # the owner connects) cannot make the owner's next ones stale; lost messages leave a gap the next
            # message confirms
            jump = header.seq > line + 1 and header.seq != state.tentative_seq + 1
            if header.seq <= state.last_seq or (jump and header.seq == state.tentative_seq):
                raise ProtocolError("stale_seq", f"{header.seq} <= {max(state.last_seq, state.tentative_seq)}")
            confirms = state.tentative_seq if not jump and header.seq == state.tentative_seq + 1 else 0
            if jump:
                state.tentative_seq = header.seq  # read, but credits stay with the sequence until it is followed
            else:
                state.received_seq, state.tentative_seq = max(line, header.seq), 0  # read, even if rejected below
            if header.weight_version > self.latest_weight_version():
                raise ProtocolError("future_weights", str(header.weight_version))
            msg = decode(parts, self.spec)
            t = msg.header.msg_type
            if t == EPISODE_SUMMARY and not episode_bounds_ok(msg.payload, self.max_abs_reward,
                                                             self.spec.max_episode_steps):
                raise ProtocolError("episode_out_of_range", f"return {msg.payload.episode_return} "
                                                            f"in {msg.payload.length} steps (time limit "
                                                            f"{self.spec.max_episode_steps})")
            if t not in (TRANSITION_CHUNK, HEARTBEAT, EPISODE_SUMMARY, BYE):
                raise ProtocolError("unexpected_type", str(t))
        except ProtocolError as exc:
            self._reject(exc.reason, exc.detail)
            return
        capped = state.capped(msg.payload) if t == TRANSITION_CHUNK else None
        if capped is not None:  # stored, with no priority above what a transition can be worth
            msg = replace(msg, payload=capped)
            self._log_once("priorities_capped", "collector %d sent priorities above %.6g: clipped to it, counted "
                           "in priorities_capped", state.collector_id, state.rules.max_priority)
        now = time.monotonic()
        with self._lock:
            if not jump:  # a jump's own gap counts once the next message confirms it
                self.gaps += max(0, (confirms or header.seq) - state.last_seq - 1)
                state.last_seq = header.seq
            state.last_seen = state.stall_clock = now
            state.heard = True
            state.weight_version = header.weight_version
            if t == TRANSITION_CHUNK:
                state.pending.append((header.seq, msg))
                self.priorities_capped += capped is not None
            elif t == HEARTBEAT:
                self.heartbeats += 1
                state.says_waiting = header.count == 1
            elif t != EPISODE_SUMMARY:
                state.closed = True
        if t == EPISODE_SUMMARY:  # counts once its episode's end is inserted (ingest/peers.py)
            self._count_episodes(state.slot, state.summary(msg.payload))

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
        schedule = (self.eps_decay_updates, self.eps_stage_from, self.eps_stage)  # report what collectors act with now
        with self._lock:
            collectors = {
                cid: {"host": s.host, "pid": s.pid, "slot": s.slot,
                      "epsilon": acting_epsilon(s.epsilon, s.weight_version, *schedule),
                      "last_seen_s": now - s.last_seen, "stall_s": now - s.stall_clock,
                      "waiting": s.waiting_for_head(), "heard": s.heard, "parked": len(s.pending),
                      "weight_version": s.weight_version, "chunks": s.chunks, "transitions": s.transitions,
                      "closed": s.closed}
                for cid, s in self.collectors.items()
            }
            return ConsolidationStats(
                self.transitions, self.chunks, self.rejected, dict(self.rejected_by_reason), self.gaps,
                self.heartbeats, self.episodes, self.registrations_total, self.buffer_size(), self.queue, collectors,
                list(self.recent_episodes), dict(self.transitions_by_slot), self.reclaimed,
                sum(c["parked"] for c in collectors.values()),
                {slot: list(episodes) for slot, episodes in self.recent_by_slot.items()},
                self.errors, self.errors_since_accepted, self.last_error, self.priorities_capped,
            )

    def silent_collectors(self, timeout_s: float | None = None) -> list[int]:
        """Ids of open collectors neither heard from nor held by the head for `timeout_s` (default stall_timeout_s)."""
        limit = self.transport.stall_timeout_s if timeout_s is None else timeout_s
        now = time.monotonic()
        with self._lock:
            return [c for c, s in self.collectors.items() if not s.closed and now - s.stall_clock > limit]

    def stall_clock_of_pid(self, pid: int, host: str | None = None) -> tuple[float, bool] | None:
        """(newest time process `pid` on `host` (default: this machine) was heard from or held, whether the
        head holds its chunks now or it is still starting: registered, nothing heard yet, as while it builds
        its envs); None when it has no open registration (the supervisor's stall check). A HEARTBEAT saying
        "waiting" refreshes the clock like any message; it cannot freeze it. A registration that stays
        unheard is reclaimed after transport.head_timeout_s, which bounds the start."""
        host = host or self.hostname
        with self._lock:
            mine = [s for s in self.collectors.values() if s.pid == pid and s.host == host and not s.closed]
            if not mine:
                return None
            return max(s.stall_clock for s in mine), any(s.held_by_head() or not s.heard for s in mine)

    def processor_line(self) -> str:
        s = self.stats()
        return (f"[PROCESSOR] Processed: {s.transitions:,}, Batches: {s.chunks:,}, Drops: {s.rejected:,}, "
                f"Buffer: {s.buffer_size:,}, Consolidated Queue: {s.queue:,}, Parked: {s.parked:,}")
