"""Attack a running head (`python -m launcher`) the way a hostile or broken peer would.

Each attack is a function returning a dict of what it sent and what came back, so
tests/test_adversarial.py imports them, and a person can replay any of them by hand:

    make run ARGS="--env CartPole-v1 --port 5555"                       # one terminal
    python -m tests.hostile.attack --connect tcp://127.0.0.1:5555 --attack nan

then read the head's `[PROCESSOR] ... Drops: N` line and head.log ("rejected message: <reason>").

Attacks (--count sets how many messages; the head's reason for each is in parentheses):

  nan             registered fake collector: chunks whose observations contain NaN (nonfinite_obs)
  huge            ... whose observations are 3e38 (obs_out_of_range)
  reward          ... whose one reward is 3.4e38 (reward_out_of_range)
  deep-json       HELLOs nested far deeper than the JSON limit (bad_json); no WELCOME comes back
  hello-flood     HELLOs with distinct nonces from one DEALER: registrations up to the head's cap, then
                  WELCOMEs carrying "refused" (too_many_collectors); silent ones are reclaimed later
  oversize        raw TCP to the control port and to a data endpoint: a ZMTP greeting, READY and a frame
                  declaring 4 GiB, then junk (ZeroMQ drops the connection: nothing is counted, nothing allocated)
  endless-multipart  raw TCP to the control port and to a data endpoint: a ZMTP greeting, READY, then 32 KiB
                  frames with MORE set and never a last one, up to 2 GiB each: every frame is under MAXMSGSIZE,
                  and libzmq holds an unfinished message whole; the head closes the connection once its memory
                  passes its ingress limit (transport.memory_margin_mb)
  second-peer     a registered fake owner; two other peers on its data endpoint send HEARTBEAT with seq 2**64-1
                  (foreign_peer); a passive one must never see a CREDIT; the owner's chunks are still credited
  xpub-spam       (un)subscriptions to the weights port as fast as possible for --seconds (with
                  --distinct-topics each XSUB subscription is a new 64-byte topic, unsubscribed at once)
  tcp-burst       --count idle TCP connections (default 1,500) to the control port, held for --seconds: past
                  a head's open-file limit when --count exceeds it (this process raises its own soft limit)
  forged-summary  registered fake collector: EPISODE_SUMMARY with return 475 and no transitions (not counted
                  as episodes, cannot stop a --target-return run; not a rejection either)
  summary-flood   registered fake collector: --count EPISODE_SUMMARY (default 20,000) on as many distinct
                  stream ids and no transitions: the head keeps at most a bounded backlog per registration
                  (stream_range past the collector's streams, summary_backlog past the caps)
  forged-episodes registered fake collector: one valid 40-frame CartPole chunk (37 transitions, no episode
                  end), then --count summaries of (length 1, return 500) and as many of (1, 2e6): none may
                  count as an episode or stop a --target-return run (episode_mismatch, episode_out_of_range)
  replayed-hello  an owner's HELLO sent again, byte for byte, from another connection: refused
                  (replayed_hello), so the replayer never learns the owner's routing id; were it answered, the
                  replayer would connect with that id first, send HEARTBEAT seq 2**64-1, and the owner's
                  chunks would never be read

The chunk attacks assume a float observation env (CartPole-v1: --obs-dim 4). With --curve-keys DIR (from
`make keys`) the fake collectors authenticate like a real one (an authorized but malicious collector); the
raw oversize connections never authenticate. Prints one JSON object per attack.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import selectors
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import zmq

from actors.client import client_socket, reachable_endpoint  # the collector's own socket and endpoint rules
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, NO_ACTION, TransitionChunk
from shared.protocol import (
    CREDIT,
    HEARTBEAT,
    HELLO,
    MAX_JSON_DEPTH,
    WELCOME,
    EpisodeSummary,
    Header,
    decode,
    decode_header,
    encode_chunk,
    encode_episode,
    encode_json,
    encode_simple,
    send_parts,
)

CHUNK_ATTACKS = {"nan": "nonfinite_obs", "huge": "obs_out_of_range", "reward": "reward_out_of_range"}
ATTACKS = (*CHUNK_ATTACKS, "deep-json", "second-peer", "oversize", "endless-multipart", "xpub-spam", "forged-summary", "hello-flood",
           "summary-flood", "forged-episodes", "replayed-hello", "tcp-burst")
SEQ_MAX = 2**64 - 1


class Refused(RuntimeError):
    """The head answered HELLO with a refusal (or not at all)."""


def _curve(keys_dir: str | None):
    if not keys_dir:
        return None
    from shared.keys import load_client

    return load_client(keys_dir)


def weights_endpoint_of(connect: str) -> str:
    """The head's weights XPUB listens on the control port + 1."""
    base, port = connect.rsplit(":", 1)
    return f"{base}:{int(port) + 1}"


# ---------------------------------------------------------------------------- chunks
def valid_chunk(steps: int = 16, stream: int = 0, obs_dim: int = 4, seed: int = 0,
                reward: float = 0.1, end: bool = True, priority: float = 1.0) -> TransitionChunk:
    """One episode's first `steps` steps with small float observations (vector env, stack 1): what a collector
    sends. `end`: the last step terminates the episode (every transition is complete); otherwise the episode
    goes on, and with n-step n the last n - 1 starts are incomplete (40 frames, n = 3: 37 transitions)."""
    rng = np.random.default_rng(seed)
    frames = rng.uniform(-0.05, 0.05, size=(steps + 1, obs_dim)).astype(np.float32)
    actions = rng.integers(0, 2, size=steps + 1).astype(np.int32)
    actions[-1] = NO_ACTION
    rewards = np.full(steps + 1, reward, dtype=np.float32)
    rewards[-1] = 0.0
    flags = np.zeros(steps + 1, dtype=np.uint8)
    flags[0] = FLAG_FIRST
    if end:
        flags[steps - 1] |= FLAG_TERMINATED
    priorities = np.full(steps + 1, priority, dtype=np.float32)
    return TransitionChunk(stream, 0, frames, actions, rewards, flags, priorities)


def poisoned_chunk(kind: str, steps: int = 16, stream: int = 0, obs_dim: int = 4, seed: int = 0) -> TransitionChunk:
    """A well-formed chunk with one bad value: 'nan' (obs NaN), 'huge' (obs 3e38) or 'reward' (one reward 3.4e38)."""
    c = valid_chunk(steps, stream, obs_dim, seed)
    frames, rewards = c.frames.copy(), c.rewards.copy()
    if kind == "nan":
        frames[steps // 2, 1] = np.nan
    elif kind == "huge":
        frames[steps // 2, :] = np.float32(3e38)
    elif kind == "reward":
        rewards[steps // 2] = np.float32(3.4e38)
    else:
        raise ValueError(f"unknown poison {kind!r}; allowed: {', '.join(CHUNK_ATTACKS)}")
    return TransitionChunk(c.stream, c.first_start, frames, c.actions, rewards, c.flags, c.priorities)


# ---------------------------------------------------------------------------- registration
def hello(ctx: zmq.Context, connect: str, fields: dict[str, Any], curve=None, timeout_s: float = 20.0) -> dict[str, Any]:
    """One HELLO, sent once (a retry of a refused nonce would be refused and counted again); the WELCOME's JSON."""
    sock = client_socket(ctx, zmq.DEALER, curve)
    try:
        sock.connect(connect)
        sock.send_multipart(encode_json(HELLO, fields))
        if not sock.poll(timeout_s * 1000):
            raise Refused(f"no WELCOME from {connect} within {timeout_s:.0f} s")
        msg = decode(sock.recv_multipart())
        if msg.header.msg_type != WELCOME:
            raise Refused(f"expected WELCOME, got type {msg.header.msg_type}")
        return msg.payload
    finally:
        sock.close(linger=0)


class FakeCollector:
    """A registered collector under our control: real HELLO/WELCOME, a DEALER with the WELCOME's routing id."""

    def __init__(self, ctx: zmq.Context, connect: str, curve=None, host: str = "attacker", slot: int = -1,
                 timeout_s: float = 20.0) -> None:
        self.nonce = uuid.uuid4().hex
        welcome = hello(ctx, connect, {"host": host, "pid": os.getpid(), "slot": slot, "nonce": self.nonce,
                                       "envs": 1}, curve, timeout_s)
        if "refused" in welcome:
            raise Refused(str(welcome["refused"]))
        self.welcome = welcome
        self.collector_id = int(welcome["collector_id"])
        self.endpoint = reachable_endpoint(str(welcome["data_endpoint"]), connect)
        self.token = bytes.fromhex(str(welcome["data_token"]))
        self.data = client_socket(ctx, zmq.DEALER, curve)
        self.data.setsockopt(zmq.ROUTING_ID, self.token)
        self.data.connect(self.endpoint)
        self.seq = 0
        self.credited = 0  # newest CREDIT seq seen

    def _send(self, parts: list[Any]) -> int:
        send_parts(self.data, parts)
        return self.seq

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def heartbeat(self) -> int:
        return self._send(encode_simple(HEARTBEAT, self.collector_id, self.next_seq()))

    def chunk(self, chunk: TransitionChunk) -> int:
        return self._send(encode_chunk(chunk, self.collector_id, self.next_seq(), 0))

    def summary(self, episode_return: float, length: int, stream: int = 0) -> int:
        s = EpisodeSummary(stream, length, float(episode_return))
        return self._send(encode_episode(s, self.collector_id, self.next_seq(), 0))

    def wait_credit(self, seq: int, timeout_s: float) -> bool:
        """True once the head has acknowledged everything up to `seq` (CREDIT: read and written or rejected)."""
        deadline = time.monotonic() + timeout_s
        while self.credited < seq and time.monotonic() < deadline:
            if self.data.poll(100):
                header = decode_header(self.data.recv_multipart()[0])
                if header.msg_type == CREDIT:
                    self.credited = max(self.credited, header.seq)
        return self.credited >= seq

    def close(self) -> None:
        self.data.close(linger=0)


# ---------------------------------------------------------------------------- attacks
def chunk_attack(ctx: zmq.Context, connect: str, kinds: list[str], count: int = 1, curve=None,
                 obs_dim: int = 4) -> dict[str, Any]:
    """Register, one accepted HEARTBEAT, then `count` poisoned chunks of each kind; waits for their CREDIT."""
    fake = FakeCollector(ctx, connect, curve)
    try:
        fake.heartbeat()  # accepted: the registration is alive
        sent: dict[str, int] = {}
        for kind in kinds:
            for i in range(count):
                fake.chunk(poisoned_chunk(kind, obs_dim=obs_dim, seed=i))
            sent[CHUNK_ATTACKS[kind]] = count
        acknowledged = fake.wait_credit(fake.seq, 30.0)  # rejected chunks are credited at once
        return {"attack": "chunks", "collector_id": fake.collector_id, "sent_by_reason": sent,
                "sent": sum(sent.values()), "acknowledged": acknowledged}
    finally:
        fake.close()


def deep_json_hellos(depth: int) -> list[list[bytes]]:
    """Two HELLO bodies too deep for the head: a '[' run (the C scanner's recursion limit) and nested objects."""
    header = Header(HELLO).pack()
    nested: dict[str, Any] = {"nonce": "deep"}
    for _ in range(MAX_JSON_DEPTH + 8):
        nested = {"x": nested}
    return [[header, b"[" * depth], [header, json.dumps(nested).encode()]]


def deep_json(ctx: zmq.Context, connect: str, count: int = 15, curve=None, depth: int = 60_000,
              wait_s: float = 1.0) -> dict[str, Any]:
    """`count` HELLOs nested too deep (alternating the two kinds). `depth` must stay below the control socket's
    64 KiB message limit, or ZeroMQ drops the connection before the head ever decodes it."""
    sock = client_socket(ctx, zmq.DEALER, curve)
    bodies = deep_json_hellos(depth)
    try:
        sock.connect(connect)
        for i in range(count):
            sock.send_multipart(bodies[i % 2])
        replies = 0
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if sock.poll(50):
                sock.recv_multipart()
                replies += 1
        return {"attack": "deep-json", "sent": count, "replies": replies, "expect_reason": "bad_json"}
    finally:
        sock.close(linger=2000)


def hello_flood(ctx: zmq.Context, connect: str, count: int = 2000, curve=None, timeout_s: float = 60.0,
                sockets: int = 1) -> dict[str, Any]:
    """`count` HELLOs with distinct nonces over `sockets` DEALERs; counts WELCOMEs and refusals."""
    socks = []
    for _ in range(max(1, sockets)):
        s = client_socket(ctx, zmq.DEALER, curve)
        s.rcvhwm = 0  # keep every reply: the counts must be exact
        s.sndhwm = 0
        s.connect(connect)
        socks.append(s)
    welcomes, refusals, refusal_text = 0, 0, ""
    run = uuid.uuid4().hex[:8]

    def drain(sock: zmq.Socket) -> None:
        nonlocal welcomes, refusals, refusal_text
        while True:
            try:
                parts = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            payload = decode(parts).payload
            if "refused" in payload:
                refusals += 1
                refusal_text = refusal_text or str(payload["refused"])
            else:
                welcomes += 1

    t0 = time.monotonic()
    try:
        for i in range(count):
            sock = socks[i % len(socks)]
            sock.send_multipart(encode_json(HELLO, {"host": "flood", "pid": 1, "slot": -1,
                                                    "nonce": f"flood-{run}-{i}", "envs": 1}))
            drain(sock)
        deadline = time.monotonic() + timeout_s
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        while welcomes + refusals < count and time.monotonic() < deadline:
            for s, _ in poller.poll(200):
                drain(s)
        return {"attack": "hello-flood", "sent": count, "welcomes": welcomes, "refusals": refusals,
                "refusal": refusal_text, "seconds": round(time.monotonic() - t0, 2)}
    finally:
        for s in socks:
            s.close(linger=0)


def zmtp_greeting(mechanism: bytes = b"NULL") -> bytes:
    """ZMTP 3.0 greeting: signature (0xFF, 8 padding bytes, 0x7F), version 3.0, mechanism, as-server 0, filler."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def zmtp_ready(socket_type: bytes = b"DEALER") -> bytes:
    """NULL mechanism READY command with one Socket-Type property (a short command frame)."""
    name = b"Socket-Type"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(socket_type)) + socket_type
    return bytes([0x04, len(body)]) + body


def zmtp_connect(endpoint: str, mechanism: bytes = b"NULL", timeout_s: float = 5.0) -> socket.socket:
    """A TCP connection that has exchanged ZMTP 3.0 greetings (ours, then the peer's 64 bytes; sending more
    before the peer's greeting arrived sometimes makes libzmq drop the connection); NULL also sends READY."""
    host, port = urlsplit(endpoint).hostname, urlsplit(endpoint).port
    s = socket.create_connection((host, port), timeout=timeout_s)
    try:
        s.sendall(zmtp_greeting(mechanism))
        got = b""
        while len(got) < 64:
            data = s.recv(64 - len(got))
            if not data:
                raise ConnectionResetError("the peer closed during the greeting")
            got += data
        if mechanism == b"NULL":
            s.sendall(zmtp_ready())
        return s
    except BaseException:
        s.close()
        raise


def raw_zmtp_hello(endpoint: str, timeout_s: float = 10.0) -> bool:
    """The hand-made ZMTP peer of `oversize`, sending a small valid HELLO instead: True when a WELCOME comes
    back (proves the greeting and READY are right, so the oversize drop is the size limit, not bad framing)."""
    header, body = encode_json(HELLO, {"host": "raw", "nonce": uuid.uuid4().hex})
    got = b""
    try:
        with zmtp_connect(endpoint, timeout_s=timeout_s) as s:
            s.sendall(bytes([0x01, len(header)]) + header + bytes([0x02]) + struct.pack(">Q", len(body)) + body)
            deadline = time.monotonic() + timeout_s
            while b"MAPX" not in got and time.monotonic() < deadline:
                data = s.recv(65536)
                if not data:
                    break
                got += data
    except OSError:  # reset or timed out: e.g. a CURVE head refuses the NULL mechanism
        pass
    return b"MAPX" in got


def oversize(endpoint: str, declare: int = 4 << 30, junk_bytes: int = 64 << 20, mechanism: bytes = b"NULL",
             command: bool = False, frames: int = 1, timeout_s: float = 5.0) -> dict[str, Any]:
    """A raw TCP peer that declares `frames` long frames of `declare` bytes each and streams up to `junk_bytes`
    of each. NULL: greeting + READY + data frame; other mechanisms (CURVE): greeting + a long *command* frame
    (the handshake itself), never authenticating. Stops at the first send error or `timeout_s` stall."""
    sent = 0
    outcome = "sent everything"
    t0 = time.monotonic()
    try:
        with zmtp_connect(endpoint, mechanism, timeout_s) as s:
            block = b"\xa5" * (1 << 20)
            for _ in range(frames):
                flags = 0x02 | (0x04 if command or mechanism != b"NULL" else 0)
                s.sendall(bytes([flags]) + struct.pack(">Q", declare))
                left = min(junk_bytes, declare)
                while left > 0:
                    n = min(left, len(block))
                    s.sendall(block[:n])
                    sent += n
                    left -= n
    except (BrokenPipeError, ConnectionResetError) as exc:
        outcome = f"closed by the head ({type(exc).__name__})"
    except TimeoutError:
        outcome = "the head stopped reading (send timed out)"
    return {"attack": "oversize", "endpoint": endpoint, "mechanism": mechanism.decode(), "declared": declare,
            "frames": frames, "junk_sent": sent, "outcome": outcome, "seconds": round(time.monotonic() - t0, 2)}


def endless_multipart(endpoint: str, frame_bytes: int = 32 << 10, total_bytes: int = 2 << 30,
                      timeout_s: float = 10.0) -> dict[str, Any]:
    """A raw TCP peer that sends one message whose frames never end: `frame_bytes` frames with MORE set (each under
    the endpoint's MAXMSGSIZE) until `total_bytes` went out, the head closed the connection, or a send stalled for
    `timeout_s`. libzmq keeps an unfinished message whole until its last frame: only closing the connection frees
    it."""
    sent = 0
    outcome = "sent everything"
    t0 = time.monotonic()
    frame = bytes([0x03]) + struct.pack(">Q", frame_bytes) + b"\x5a" * frame_bytes  # MORE | LONG
    block = frame * max(1, (1 << 20) // len(frame))
    try:
        with zmtp_connect(endpoint, timeout_s=timeout_s) as s:
            while sent < total_bytes:
                s.sendall(block)
                sent += len(block)
    except (BrokenPipeError, ConnectionResetError) as exc:
        outcome = f"closed by the head ({type(exc).__name__})"
    except TimeoutError:
        outcome = "the head stopped reading (send timed out)"
    return {"attack": "endless-multipart", "endpoint": endpoint, "frame_bytes": frame_bytes, "sent": sent,
            "outcome": outcome, "seconds": round(time.monotonic() - t0, 2)}


def second_peer(ctx: zmq.Context, connect: str, curve=None, owner_chunks: int = 3, poll_s: float = 2.0,
                credit_timeout_s: float = 30.0) -> dict[str, Any]:
    """A fake owner registers; an anonymous DEALER and one with a wrong routing id send HEARTBEAT seq 2**64-1
    on its data endpoint (2 x foreign_peer); a passive DEALER connects and never sends. Then the owner sends
    `owner_chunks` valid chunks, which must still be credited, while the passive peer must receive nothing."""
    owner = FakeCollector(ctx, connect, curve)
    peers: list[zmq.Socket] = []
    try:
        owner.heartbeat()  # seq 1, accepted
        anonymous = client_socket(ctx, zmq.DEALER, curve)
        wrong = client_socket(ctx, zmq.DEALER, curve)
        wrong.setsockopt(zmq.ROUTING_ID, b"c" + os.urandom(16))
        passive = client_socket(ctx, zmq.DEALER, curve)
        peers = [anonymous, wrong, passive]
        for p in peers:
            p.connect(owner.endpoint)
        for p in (anonymous, wrong):
            send_parts(p, encode_simple(HEARTBEAT, owner.collector_id, SEQ_MAX))
        time.sleep(0.5)  # let the forged seq arrive first: it must not move the owner's sequence
        for i in range(owner_chunks):
            owner.chunk(valid_chunk(stream=0, seed=100 + i))
        credited = owner.wait_credit(owner.seq, credit_timeout_s)
        received = {"anonymous": 0, "wrong_token": 0, "passive": 0}
        deadline = time.monotonic() + poll_s
        poller = zmq.Poller()
        for p in peers:
            poller.register(p, zmq.POLLIN)
        names = dict(zip(peers, received, strict=True))
        while time.monotonic() < deadline:
            for p, _ in poller.poll(100):
                p.recv_multipart()
                received[names[p]] += 1
        return {"attack": "second-peer", "collector_id": owner.collector_id, "foreign_sent": 2,
                "owner_last_seq": owner.seq, "owner_credited": owner.credited, "owner_not_stalled": credited,
                "received_by_other_peers": received, "data_endpoint": owner.endpoint}
    finally:
        for p in peers:
            p.close(linger=0)
        owner.close()


def xpub_spam(ctx: zmq.Context, weights: str, seconds: float = 10.0, curve=None, churn_subs: int = 8,
              distinct: bool = False) -> dict[str, Any]:
    """One XSUB sending b'\\x01spam' / b'\\x00spam' (`distinct`: a new 64-byte topic each time, subscribed then
    unsubscribed) as fast as it can, plus `churn_subs` SUB sockets that subscribe and unsubscribe random topics in
    the same loop, for `seconds`."""
    xsub = client_socket(ctx, zmq.XSUB, curve)
    xsub.sndhwm = 0
    xsub.connect(weights)
    subs = []
    for _ in range(churn_subs):
        s = client_socket(ctx, zmq.SUB, curve)
        s.connect(weights)
        subs.append(s)
    sent = churned = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for _ in range(256):
                topic = (b"%064d" % (sent // 2)) if distinct else b"spam"
                try:
                    xsub.send((b"\x01" if sent % 2 == 0 else b"\x00") + topic, zmq.NOBLOCK)
                    sent += 1
                except zmq.Again:
                    break
            for i, s in enumerate(subs):
                topic = b"t%d-%d" % (i, churned % 64)
                s.setsockopt(zmq.SUBSCRIBE, topic)
                s.setsockopt(zmq.UNSUBSCRIBE, topic)
                churned += 2
        return {"attack": "xpub-spam", "endpoint": weights, "xsub_messages": sent, "sub_churn": churned,
                "seconds": seconds, "distinct_topics": distinct}
    finally:
        xsub.close(linger=0)
        for s in subs:
            s.close(linger=0)


def raise_open_files(want: int) -> int:
    """Raises this process's soft open-file limit toward `want` (never past the hard one); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


def tcp_burst(endpoint: str, count: int = 1500, hold_s: float = 10.0, connect_timeout_s: float = 10.0,
              stop: threading.Event | None = None) -> dict[str, Any]:
    """`count` TCP connections to `endpoint`, opened at once and held idle (nothing sent) for `hold_s` (or until
    `stop` is set), then closed.
    `established` counts what the kernel completed: a listener that cannot get a descriptor for accept() leaves
    connections in its backlog, so how many the head really holds is its own descriptor count. At the end,
    `dropped_by_head` counts connections the head closed meanwhile (ZeroMQ drops a peer that never greets after
    its handshake interval)."""
    host, port = urlsplit(endpoint).hostname, urlsplit(endpoint).port
    room = raise_open_files(count + 64) - 64
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    established = failed = 0
    t0 = time.monotonic()
    try:
        for _ in range(min(count, room)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            socks.append(s)
            rc = s.connect_ex((host, port))
            if rc == 0:
                established += 1
            elif rc == errno.EINPROGRESS:
                sel.register(s, selectors.EVENT_WRITE)
            else:
                failed += 1
        deadline = time.monotonic() + connect_timeout_s
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                sel.unregister(key.fileobj)
                if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    established += 1
                else:
                    failed += 1
        connecting = len(sel.get_map())
        opened_s = time.monotonic() - t0
        (stop or threading.Event()).wait(hold_s)
        dropped = 0
        for s in socks:
            try:
                dropped += s.recv(1, socket.MSG_PEEK) == b""
            except BlockingIOError:
                pass
            except OSError:
                dropped += 1
        return {"attack": "tcp-burst", "endpoint": endpoint, "asked": count, "opened": len(socks),
                "established": established, "failed": failed, "still_connecting": connecting,
                "dropped_by_head": dropped, "open_s": round(opened_s, 2), "held_s": hold_s,
                "own_soft_nofile": room + 64}
    finally:
        sel.close()
        for s in socks:
            s.close()


def forged_summaries(ctx: zmq.Context, connect: str, count: int = 20, curve=None, episode_return: float = 475.0,
                     length: int = 500) -> dict[str, Any]:
    """A registered fake collector sends `count` EPISODE_SUMMARY (return 475) and no transitions at all."""
    fake = FakeCollector(ctx, connect, curve)
    try:
        for i in range(count):
            fake.summary(episode_return, length, stream=i % 4)
        acknowledged = fake.wait_credit(fake.seq, 30.0)
        return {"attack": "forged-summary", "collector_id": fake.collector_id, "sent": count,
                "return": episode_return, "acknowledged": acknowledged}
    finally:
        fake.close()


def summary_flood(ctx: zmq.Context, connect: str, count: int = 20_000, curve=None,
                  credit_timeout_s: float = 60.0) -> dict[str, Any]:
    """A registered fake collector sends `count` EPISODE_SUMMARY on stream ids 0, 1, ..., count - 1 and no
    transitions; waits for their CREDIT (heads with transport.max_chunks_in_flight > 0)."""
    fake = FakeCollector(ctx, connect, curve)
    try:
        t0 = time.monotonic()
        for stream in range(count):
            fake.summary(475.0, 500, stream=stream)
        acknowledged = fake.wait_credit(fake.seq, credit_timeout_s)
        return {"attack": "summary-flood", "collector_id": fake.collector_id, "sent": count,
                "acknowledged": acknowledged, "seconds": round(time.monotonic() - t0, 2)}
    finally:
        fake.close()


def forged_episodes(ctx: zmq.Context, connect: str, count: int = 20, curve=None, obs_dim: int = 4,
                    returns: tuple[float, ...] = (500.0, 2e6), credit_timeout_s: float = 30.0) -> dict[str, Any]:
    """A registered fake collector sends one valid 40-frame chunk on stream 0 (37 transitions, the episode not
    ended), then `count` summaries of (length 1, return r) on stream 0 for each r in `returns`; waits for
    their CREDIT. With --target-return 475 on CartPole these stopped a run as solved at 37 env steps."""
    fake = FakeCollector(ctx, connect, curve)
    try:
        fake.chunk(valid_chunk(steps=39, stream=0, obs_dim=obs_dim, end=False))
        for episode_return in returns:
            for _ in range(count):
                fake.summary(episode_return, 1, stream=0)
        acknowledged = fake.wait_credit(fake.seq, credit_timeout_s)
        return {"attack": "forged-episodes", "collector_id": fake.collector_id, "transitions": 37,
                "summaries": count * len(returns), "returns": list(returns), "acknowledged": acknowledged}
    finally:
        fake.close()


def replayed_hello(ctx: zmq.Context, connect: str, curve=None, owner_messages: int = 5, timeout_s: float = 10.0,
                   credit_timeout_s: float = 10.0) -> dict[str, Any]:
    """An owner registers with HELLO bytes B; a second connection sends B again. Were the replay answered with
    the owner's WELCOME, the replayer connects to the owner's data endpoint with its routing id first and sends
    HEARTBEAT seq 2**64-1. Then the owner connects and sends `owner_messages` HEARTBEATs: they must be read and
    credited (heads with transport.max_chunks_in_flight > 0)."""
    hello_bytes = encode_json(HELLO, {"host": "owner", "pid": os.getpid(), "slot": -1, "nonce": uuid.uuid4().hex,
                                      "envs": 1})
    socks: list[zmq.Socket] = []

    def ask(sock: zmq.Socket) -> dict[str, Any] | None:
        sock.connect(connect)
        sock.send_multipart(hello_bytes)
        return decode(sock.recv_multipart()).payload if sock.poll(timeout_s * 1000) else None

    try:
        owner_ctl, thief_ctl = client_socket(ctx, zmq.DEALER, curve), client_socket(ctx, zmq.DEALER, curve)
        socks += [owner_ctl, thief_ctl]
        welcome = ask(owner_ctl)
        if welcome is None or "refused" in welcome:
            raise Refused(f"the owner's HELLO was not welcomed: {welcome}")
        stolen = ask(thief_ctl)
        token = bytes.fromhex(str(welcome["data_token"]))
        endpoint = reachable_endpoint(str(welcome["data_endpoint"]), connect)
        got_token = stolen is not None and stolen.get("data_token") == welcome["data_token"]
        if got_token:  # the theft: connect with the owner's routing id before the owner does
            thief = client_socket(ctx, zmq.DEALER, curve)
            socks.append(thief)
            thief.setsockopt(zmq.ROUTING_ID, token)
            thief.connect(endpoint)
            send_parts(thief, encode_simple(HEARTBEAT, int(welcome["collector_id"]), SEQ_MAX))
            time.sleep(0.5)
        owner = client_socket(ctx, zmq.DEALER, curve)
        socks.append(owner)
        owner.setsockopt(zmq.ROUTING_ID, token)
        owner.connect(endpoint)
        for seq in range(1, owner_messages + 1):
            send_parts(owner, encode_simple(HEARTBEAT, int(welcome["collector_id"]), seq))
        credited = 0
        deadline = time.monotonic() + credit_timeout_s
        while credited < owner_messages and time.monotonic() < deadline:
            if owner.poll(100):
                header = decode_header(owner.recv_multipart()[0])
                if header.msg_type == CREDIT:
                    credited = max(credited, header.seq)
        return {"attack": "replayed-hello", "collector_id": int(welcome["collector_id"]),
                "replay_answered": stolen is not None, "replay_refused": stolen is not None and "refused" in stolen,
                "replay_got_token": got_token, "owner_sent": owner_messages, "owner_credited": credited}
    finally:
        for sock in socks:
            sock.close(linger=0)


def control_and_data(ctx: zmq.Context, connect: str, curve, name: str,
                     raw_peer: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """`raw_peer` on the control port, then on a data endpoint: a fake collector registers to learn one (the raw
    peer itself never authenticates)."""
    results = [raw_peer(connect)]
    try:
        fake = FakeCollector(ctx, connect, curve)
        fake.close()
        results.append(raw_peer(fake.endpoint))
    except Refused as exc:
        results.append({"attack": name, "skipped": f"no data endpoint: {exc}"})
    return {"attack": name, "results": results}


def run_attack(name: str, connect: str, count: int | None = None, curve_keys: str | None = None,
               seconds: float = 10.0, weights: str | None = None, obs_dim: int = 4,
               ctx: zmq.Context | None = None, distinct_topics: bool = False) -> dict[str, Any]:
    """Run one attack by its command-line name; returns its result dict."""
    own = ctx is None
    ctx = ctx or zmq.Context()
    curve = _curve(curve_keys)
    try:
        if name in CHUNK_ATTACKS:
            return chunk_attack(ctx, connect, [name], count or 1, curve, obs_dim)
        if name == "deep-json":
            return deep_json(ctx, connect, count or 15, curve)
        if name == "hello-flood":
            return hello_flood(ctx, connect, count or 2000, curve)
        if name == "oversize":
            return control_and_data(ctx, connect, curve, name, oversize)
        if name == "endless-multipart":
            return control_and_data(ctx, connect, curve, name, endless_multipart)
        if name == "second-peer":
            return second_peer(ctx, connect, curve)
        if name == "xpub-spam":
            return xpub_spam(ctx, weights or weights_endpoint_of(connect), seconds, curve, distinct=distinct_topics)
        if name == "tcp-burst":
            return tcp_burst(connect, count or 1500, seconds)
        if name == "forged-summary":
            return forged_summaries(ctx, connect, count or 20, curve)
        if name == "summary-flood":
            return summary_flood(ctx, connect, count or 20_000, curve)
        if name == "forged-episodes":
            return forged_episodes(ctx, connect, count or 20, curve, obs_dim)
        if name == "replayed-hello":
            return replayed_hello(ctx, connect, curve)
        raise ValueError(f"unknown attack {name!r}; allowed: {', '.join(ATTACKS)}, all")
    finally:
        if own:
            ctx.destroy(linger=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.hostile.attack", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("--connect", required=True, help="the head's control endpoint, e.g. tcp://127.0.0.1:5555")
    parser.add_argument("--attack", required=True, choices=[*ATTACKS, "all"])
    parser.add_argument("--count", type=int, help="messages per attack (defaults: chunks 1, deep-json 15, "
                                                  "hello-flood 2000, forged-summary 20, summary-flood 20000, "
                                                  "forged-episodes 20, tcp-burst 1500)")
    parser.add_argument("--curve-keys", help="keys dir from `make keys`: fake collectors authenticate with it")
    parser.add_argument("--seconds", type=float, default=10.0, help="xpub-spam duration, tcp-burst hold")
    parser.add_argument("--distinct-topics", action="store_true", help="xpub-spam: a new topic per subscription")
    parser.add_argument("--weights", help="weights endpoint (default: control port + 1)")
    parser.add_argument("--obs-dim", type=int, default=4, help="float observation size of the head's env")
    args = parser.parse_args(argv)
    names = ATTACKS if args.attack == "all" else (args.attack,)
    for name in names:
        result = run_attack(name, args.connect, args.count, args.curve_keys, args.seconds, args.weights, args.obs_dim,
                            distinct_topics=args.distinct_topics)
        print(json.dumps(result, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
