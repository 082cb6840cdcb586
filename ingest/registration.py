"""Registration: the head's control socket, HELLO -> WELCOME, and each collector's data socket.

The launcher owns it and hands it to the consolidation thread (ingest/consolidation.py), which
polls its control socket and calls `drain` from its own thread (ZeroMQ sockets belong to one
thread); everything here runs there. What registration decides:

- **who may register:** HELLO fields are checked (`validate_hello`); open registrations are capped
  below the context's socket limit and the open-file limit (libzmq aborts the process on EMFILE),
  and a HELLO past the cap gets a WELCOME carrying `refused`;
- **where a collector sends:** its own ROUTER data socket, on tcp; on ipc for a local collector
  (loopback, same hostname) when `local_transport=ipc`; on inproc in the in-process mode; with
  `MAXMSGSIZE` from the run's geometry and a secret routing id (`token`) that the consolidation
  thread requires on every message;
- **how it explores:** its slot and the Ape-X epsilon of each of its K env streams (shared/exploration.py);
  collectors beyond the configured count get slots of their own, so no epsilon repeats; a lone collector
  spreads them over its K envs.

A HELLO nonce is answered once: a retry of it (same nonce) on the same control connection, before
the registration sent any data, gets the same WELCOME, so retries never allocate twice; any other
copy is refused and counted (`replayed_hello`), so a peer that replays a seen HELLO never learns the
owner's routing id. `release` frees a registration's socket, ipc file and cached WELCOME when the
consolidation reclaims it.
"""

from __future__ import annotations

import collections
import errno
import heapq
import logging
import os
import secrets
import shutil
import socket as pysocket
from collections.abc import Callable, Collection, Mapping
from typing import Any

import zmq

from ingest.memory_guard import MemoryGuard
from ingest.peers import MAX_TRACKED_STREAMS, CollectorState, EpisodeRules, max_priority
from replay.chunk_plan import max_chunk_frames
from shared import open_files
from shared.config import CollectorConfig, ReplayConfig, TransportConfig
from shared.exploration import slot_epsilons
from shared.keys import AllowList, CurveServer, load_server, start_authenticator
from shared.open_files import FDS_SPARE, ListenerGuard, bind_tcp
from shared.protocol import (
    HEADER_SIZE,
    HELLO,
    WELCOME,
    ObsSpec,
    ProtocolError,
    decode,
    encode_json,
    validate_hello,
)
from shared.sizes import LogBudget
from shared.tempdirs import owned_tempdir

log = logging.getLogger(__name__)
DRAIN_PER_ROUND = 64  # HELLOs handled per consolidation round
MAX_OPEN_COLLECTORS = 1024  # live registrations; each costs a socket (the context gets room for them)
SOCKETS_RESERVED = 64  # the head's other sockets (control, weights, authenticator, wake pipes)
MAX_SOCKETS = MAX_OPEN_COLLECTORS + SOCKETS_RESERVED  # set on the head's zmq.Context before any socket
CONTROL_MAX_MSG = 64 * 1024  # a HELLO is a header and a small JSON object
WELCOME_CACHE = 2 * MAX_OPEN_COLLECTORS  # answered HELLO nonces kept for retries
# Room kept for the head's own collectors (a pid its supervisor started, over loopback), per configured
# collector: a dead one's registration stays open until reclaimed while its restart registers, so a few each.
# Everyone else shares the rest, at most MAX_PER_ADDRESS of it from one network address: a peer that keeps
# HELLOs with fresh nonces alive by heartbeats held every slot and stopped training.
RESERVED_PER_LOCAL_COLLECTOR = 4
MAX_PER_ADDRESS = 256
FDS_PER_COLLECTOR = 3  # a registration's data socket: its mailbox, its listener, its owner's connection
FDS_RESERVED = 256  # the rest of the head: libraries, logs, TensorBoard, checkpoints, other sockets' peers

Reject = Callable[[str, str], None]
# What a collector reads of the run's config, and all of it the WELCOME carries (docs/PROTOCOL.md, "Observations,
# `stack` and the configuration"): the env section whole (the collector builds the same env), these fields of the
# others (None: the section whole). Nothing else of the head's config leaves the head: no paths, ports or keys.
WELCOME_CONFIG: dict[str, tuple[str, ...] | None] = {
    "env": None,
    "collectors": ("envs_per_collector", "chunk_steps", "heartbeat_s", "send_hwm", "eps_decay_updates",
                   "eps_stage_from", "eps_stage", "explore_repeat_mu", "explore_repeat_max", "torch_threads"),
    "replay": ("n_step", "gamma", "capacity"),
    "learner": ("hidden", "dueling", "encoder", "encoder_width", "quantiles", "noisy_sigma"),
    "transport": ("max_chunks_in_flight", "head_timeout_s", "socket_buffer_bytes"),
}


def collector_config(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The part of a run's config (`Config.to_dict()`) a WELCOME carries: WELCOME_CONFIG's sections and fields."""
    out = {}
    for section, names in WELCOME_CONFIG.items():
        values = dict(config.get(section, {}))
        out[section] = values if names is None else {name: values[name] for name in names if name in values}
    return out


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




def data_max_msg_bytes(spec: ObsSpec, max_chunk_frames: int) -> int:
    """Largest frame a collector may send: a chunk's observations (other frames are smaller)."""
    return max(HEADER_SIZE, max_chunk_frames * max(spec.frame_bytes, 8)) + 4096




def _peer_address(frame: zmq.Frame) -> str:
    """The TCP peer of a received message ("" when the transport has none, e.g. inproc)."""
    try:
        return frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        return ""




def _is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "localhost")


class Registrar:
    """The control ROUTER and every data socket it binds; used from the consolidation thread only."""

    def __init__(
        self,
        spec: ObsSpec,
        weights_endpoints: dict[str, str],
        context: zmq.Context,
        *,
        transport: TransportConfig,
        collectors: CollectorConfig,
        replay: ReplayConfig,
        welcome_config: Mapping[str, Any],
        control_endpoint: str | None = None,
        num_collectors: int | None = None,
        own_pids: Callable[[], Collection[int]] | None = None,
        memory_expected_bytes: int = 0,
    ) -> None:
        """`transport`: endpoints, CURVE, socket options; `collectors`: the count and the epsilon schedule;
        `replay`: its capacity sets the largest chunk, hence the data sockets' MAXMSGSIZE; `welcome_config`:
        the run's whole config (`Config.to_dict()`): every WELCOME carries the part a collector reads
        (`collector_config`), and its env section says how collectors' episode summaries are checked;
        `own_pids`: the pids of the collectors the head itself runs (None: no room is kept for them);
        `memory_expected_bytes`: what the head's memory will still grow by by itself (its replay filling up), on
        top of which transport.memory_margin_mb is what peers may make it hold (ingest/memory_guard.py)."""
        t = self.transport = transport
        self.collectors = collectors
        self.welcome_config = collector_config(welcome_config)
        self.weights_endpoints = weights_endpoints  # {"local": ipc://..., "remote": tcp://..., "inproc": ...}
        self.num_collectors = max(1, num_collectors if num_collectors is not None else collectors.count)
        self.ctx = context
        sockets_room = self.ctx.get(zmq.MAX_SOCKETS) - SOCKETS_RESERVED
        self.max_open = max(1, min(MAX_OPEN_COLLECTORS, sockets_room, open_files_room(MAX_OPEN_COLLECTORS)))
        self.own_pids = own_pids
        self.reserved = min(self.max_open - 1, RESERVED_PER_LOCAL_COLLECTOR * collectors.count) if own_pids else 0
        self._others: dict[int, str] = {}  # open registrations not of the head's own collectors: cid -> address
        self._per_address: collections.Counter[str] = collections.Counter()
        self._extra_of: dict[int, int] = {}  # cid -> the extra slot it was handed (returned on release)
        self._free_extra: list[int] = []  # extra slots handed out before and released since (a heap)
        self.data_max_msg = data_max_msg_bytes(spec, max_chunk_frames(replay.capacity))
        self.hostname = pysocket.gethostname()
        # nonce -> (WELCOME, the control connection it answered, its registration)
        self._welcomes: collections.OrderedDict[str, tuple[list[bytes], bytes, CollectorState]] = \
            collections.OrderedDict()
        # what the head enforces on every collector's chunks and summaries (ingest/peers.py)
        env = dict(self.welcome_config.get("env", {}))
        self.episode_rules = EpisodeRules(
            float(env.get("reward_scale", 1.0)), verify_returns=not env.get("clip_rewards", False),
            max_priority=max_priority(spec.max_abs_reward, replay.gamma))
        self._next_id = 1
        self._extra_slots = 0  # slots handed to collectors beyond num_collectors (remote ones)
        self._log_budget = LogBudget()  # a HELLO flood must not flood the log
        self.curve: CurveServer | None = None
        self.allow: AllowList | None = None  # with CURVE: the client keys admitted (the Ray launcher adds its actors')
        self.auth = None
        self.control: zmq.Socket | None = None
        self.guard: ListenerGuard | None = None  # the control endpoint's, when it is TCP
        self.memory: MemoryGuard | None = None  # with a TCP control endpoint: the bound on peers' unfinished messages
        self._probe = -1
        self._data_guards: dict[int, ListenerGuard] = {}  # cid -> its TCP data endpoint's guard
        self._shed: set[int] = set()  # cids whose data endpoint is unbound, to bind again
        self.ipc_dir = ""
        try:  # nothing outlives a failed start: sockets, authenticator thread, temp folder
            if t.curve_keys_dir:
                self.allow = AllowList(t.curve_keys_dir)
                self.auth = start_authenticator(self.ctx, t.curve_keys_dir, self.allow)
                self.curve = load_server(t.curve_keys_dir)
            self.control = self._socket(zmq.ROUTER, CONTROL_MAX_MSG)
            self.control_endpoint = self._bind(self.control, control_endpoint or f"tcp://{t.bind}:{t.port}")
            if self.control_endpoint.startswith("tcp://"):
                self.guard = ListenerGuard(self.control, self.control.getsockopt_string(zmq.LAST_ENDPOINT))
                self._probe = os.open(os.devnull, os.O_RDONLY)  # the data endpoints' guards count with it
                self.memory = MemoryGuard.for_head(t.memory_margin_mb << 20, memory_expected_bytes)
            if t.local_transport == "ipc":  # named after this process: a later head removes it if we are killed
                self.ipc_dir = owned_tempdir()
        except BaseException:
            self.close()
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
        if endpoint.startswith("tcp://"):  # OSError at the open-file limit, where libzmq's own bind aborts
            return bind_tcp(sock, endpoint)
        sock.bind(endpoint)
        return endpoint

    def check_descriptors(self, now: float) -> None:
        """Every turn of the consolidation loop: the control endpoint's guard, then the data endpoints'. Short
        of descriptors, every TCP data endpoint sheds its connections (idle ones past the handshake held 4,070
        descriptors of one, and nothing closed them), and each binds again on its port once they are back."""
        if self.guard is None:
            return
        self.guard.check(now)
        left = open_files.fds_left(self._probe)
        if left < FDS_SPARE:
            for cid, guard in self._data_guards.items():
                if guard.bound:
                    guard.reset(now, f"{left} file descriptors left (collector {cid}'s data endpoint)")
                    self._shed.add(cid)
        elif self._shed and left >= FDS_SPARE // 2:
            for cid in list(self._shed):
                guard = self._data_guards.get(cid)
                if guard is not None:
                    guard.check(now)
                if guard is None or guard.bound:
                    self._shed.discard(cid)

    def check_memory(self, now: float) -> None:
        """Every turn of the consolidation loop: above the memory guard's limit, close every TCP connection of the
        control and data endpoints (a message whose frames never end is held until its connection closes); each
        endpoint binds again on its port at the next turns, and collectors reconnect."""
        if self.memory is None or self.guard is None:
            return
        rss = self.memory.due(now)
        if rss is None:
            return
        why = f"resident memory {rss >> 20} MiB above the ingress limit {self.memory.limit >> 20} MiB"
        self.guard.reset(now, why)
        for cid, guard in self._data_guards.items():
            if guard.bound:
                guard.reset(now, f"{why} (collector {cid}'s data endpoint)")
                self._shed.add(cid)

    # ------------------------------------------------------------------ HELLO -> WELCOME
    def drain(self, open_count: int, reject: Reject, admit: Callable[[CollectorState], None]) -> int:
        """Answer the queued HELLOs; returns how many registered. Each new registration (its data socket
        bound) goes to `admit` before its WELCOME is sent, so a collector that holds a WELCOME is already
        among the head's open registrations."""
        new = 0
        for _ in range(DRAIN_PER_ROUND):
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if self._on_hello([f.bytes for f in frames], _peer_address(frames[-1]), open_count + new, reject, admit):
                new += 1
        return new

    def _on_hello(self, parts: list[bytes], peer: str, open_count: int, reject: Reject,
                  admit: Callable[[CollectorState], None]) -> bool:
        if len(parts) < 2:
            reject("bad_frame_count", "")
            return False
        identity, body = parts[0], parts[1:]
        try:
            msg = decode(body)
            if msg.header.msg_type != HELLO:
                raise ProtocolError("unexpected_type", "control expects HELLO")
            hello = validate_hello(msg.payload)
        except ProtocolError as exc:
            reject(exc.reason, exc.detail)
            return False
        nonce = hello["nonce"]
        if nonce and nonce in self._welcomes:
            reply, asked_by, state = self._welcomes[nonce]
            if identity == asked_by and not state.heard and not state.closed:
                self._send(identity, reply)  # a retry: the WELCOME may still be on its way
            else:  # another connection, or a registration in use: answered once, never again
                reject("replayed_hello", f"nonce {nonce[:64]!r}")
                self._send(identity, encode_json(WELCOME, {"refused": "this HELLO's nonce was answered already; "
                                                                      "register with a new nonce"}))
            return False
        if self.guard is not None and self.guard.short():  # its socket and listener would likely fail: not tried
            self._refuse_short_of_files(identity, reject)
            return False
        own = (self.own_pids is not None and (peer == "" or _is_loopback(peer))
               and hello["pid"] in self.own_pids())
        refusal = ""
        if open_count >= self.max_open:
            refusal = f"the head has {open_count} open registrations (the limit)"
        elif not own and len(self._others) >= self.max_open - self.reserved:
            refusal = (f"the head has {len(self._others)} open registrations of collectors it did not start (the "
                       f"limit; {self.reserved} are kept for its own)")
        elif not own and self._per_address[peer] >= MAX_PER_ADDRESS:
            refusal = f"the head has {MAX_PER_ADDRESS} open registrations from this address (the limit per address)"
        if refusal:
            reject("too_many_collectors", refusal)
            self._send(identity, encode_json(WELCOME, {"refused": f"{refusal}; retry after some collectors leave"}))
            return False
        try:
            state, reply = self._register(hello, peer)
        except (OSError, zmq.ZMQError) as exc:  # no descriptor for its socket or listener: refused, nothing kept
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            self._refuse_short_of_files(identity, reject)
            return False
        if nonce:
            self._welcomes[nonce] = (reply, identity, state)
            while len(self._welcomes) > WELCOME_CACHE:
                self._welcomes.popitem(last=False)
        if not own:
            self._others[state.collector_id] = peer
            self._per_address[peer] += 1
        admit(state)
        self._send(identity, reply)
        return True

    def _refuse_short_of_files(self, identity: bytes, reject: Reject) -> None:
        reject("too_many_collectors", "open files")
        self._send(identity, encode_json(WELCOME, {"refused": "the head is short of file descriptors; retry later"}))

    def _send(self, identity: bytes, reply: list[bytes]) -> None:
        try:
            self.control.send_multipart([identity, *reply], zmq.NOBLOCK)
        except zmq.ZMQError:  # the peer is gone or not reading: it will retry its HELLO
            pass

    def _register(self, hello: dict[str, Any], peer: str) -> tuple[CollectorState, list[bytes]]:
        cid = self._next_id
        self._next_id += 1
        host = hello["host"]
        t = self.transport
        # Local means "connected over loopback", not "same hostname": a collector in another network
        # namespace or container shares the hostname but cannot be assumed to share /tmp.
        local = _is_loopback(peer) and host == self.hostname and t.local_transport == "ipc"
        inproc = self.control_endpoint.startswith("inproc://")  # the in-process mode: collectors are threads
        sock = self._socket(zmq.ROUTER, self.data_max_msg)  # data up, CREDIT down to the token's peer only
        try:
            sock.rcvhwm = t.recv_hwm
            if t.socket_buffer_bytes:  # bounds stale data in flight (TCP only; see config)
                sock.rcvbuf = t.socket_buffer_bytes
            if inproc:
                endpoint = self._bind(sock, f"{self.control_endpoint}-c{cid}")
            elif local:
                endpoint = self._bind(sock, f"ipc://{os.path.join(self.ipc_dir, f'c{cid}.ipc')}")
            else:
                endpoint = self._bind(sock, f"tcp://{t.bind}:0")
                if self._probe >= 0:
                    self._data_guards[cid] = ListenerGuard(sock, endpoint, probe=self._probe)
        except BaseException:
            sock.close(linger=0)
            raise
        slot = hello["slot"]
        if not 0 <= slot < self.num_collectors:  # remote (or unslotted): a slot of its own while it is registered
            # after the local collectors' slots, from slot 0 when there are none (--collectors 0); the lowest one
            # a released registration freed first, so slots (and epsilons) stay within the open registrations
            if self._free_extra:
                slot = heapq.heappop(self._free_extra)
            else:
                slot = (self.num_collectors if self.collectors.count > 0 else 0) + self._extra_slots
                self._extra_slots += 1
            self._extra_of[cid] = slot
        epsilons = self._epsilons(slot)
        eps = min(epsilons)  # the slot's least-exploring stream: what "the greedy slot" is chosen by
        token = b"c" + secrets.token_bytes(16)  # a routing id must not start with a zero byte
        state = CollectorState(cid, endpoint, sock, token, host, hello["pid"], slot, eps, nonce=hello["nonce"],
                               stream_limit=min(MAX_TRACKED_STREAMS, max(self.collectors.envs_per_collector,
                                                                         hello["envs"])),
                               rules=self.episode_rules)
        kind = "inproc" if inproc else "local" if local else "remote"
        weights = self.weights_endpoints.get(kind) or self.weights_endpoints.get("remote", "")
        allowed, dropped = self._log_budget.allow()
        if allowed:
            log.info("collector %d registered (host=%s pid=%s slot=%d eps=%.4f) -> %s%s", cid, host[:64], state.pid,
                     slot, eps, endpoint, f" ({dropped} more registrations not logged)" if dropped else "")
        welcome = {
            "collector_id": cid, "data_endpoint": endpoint, "data_token": token.hex(), "weights_endpoint": weights,
            "epsilon": eps, "epsilons": epsilons, "num_collectors": self.num_collectors, "slot": slot,
            "config": self.welcome_config, "credit_every_s": self.collectors.heartbeat_s,
        }
        return state, encode_json(WELCOME, welcome, collector=cid)

    def _epsilons(self, slot: int) -> list[float]:
        """The Ape-X epsilon of each of the slot's K envs (shared.exploration.slot_epsilons)."""
        c = self.collectors
        return slot_epsilons(slot, self.num_collectors, c.envs_per_collector, c.eps_base, c.eps_alpha, c.eps_per)

    # ------------------------------------------------------------------ teardown
    def release(self, state: CollectorState) -> None:
        """Free a reclaimed registration: its socket, ipc file, cached WELCOME, extra slot and quota
        (idempotent)."""
        state.sock.close(linger=0)
        guard = self._data_guards.pop(state.collector_id, None)
        if guard is not None:
            guard.close()
        self._shed.discard(state.collector_id)
        peer = self._others.pop(state.collector_id, None)
        if peer is not None:
            self._per_address[peer] -= 1
            if self._per_address[peer] <= 0:
                del self._per_address[peer]
        slot = self._extra_of.pop(state.collector_id, None)
        if slot is not None:
            heapq.heappush(self._free_extra, slot)
        if state.endpoint.startswith("ipc://"):
            try:
                os.unlink(state.endpoint[len("ipc://"):])
            except OSError:
                pass
        cached = self._welcomes.get(state.nonce)
        if cached is not None and cached[2] is state:
            del self._welcomes[state.nonce]

    def close(self) -> None:
        """Close the control socket, stop the authenticator, remove the ipc folder (idempotent)."""
        if self.control is not None:
            self.control.close(linger=0)
        if self.guard is not None:
            self.guard.close()
        for guard in self._data_guards.values():
            guard.close()
        self._data_guards.clear()
        if self._probe >= 0:
            os.close(self._probe)
            self._probe = -1
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
        if self.auth is not None:
            self.auth.stop()
            self.auth = None
