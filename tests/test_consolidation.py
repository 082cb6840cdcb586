"""Consolidation thread over real sockets: registration, validation, sequence checks, CURVE, fuzz."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import fields, replace

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs.testing  # noqa: F401
from actors.client import RegistrationError, register
from envs.spec import EnvSpec
from ingest.consolidation import MAX_SEQ_JUMP, PARKED_WITHOUT_CREDITS
from ingest.peers import PENDING_SUMMARIES_PER_STREAM
from ingest.registration import Registrar, collector_config
from replay.buffer import ReplayBuffer
from shared import protocol as P
from shared.chunk import FLAG_FIRST, NO_ACTION, TransitionChunk
from shared.config import Config, ReplayConfig
from shared.exploration import collector_epsilon, stream_epsilons
from shared.keys import CurveClient, generate, load_client
from tests.hostile.attack import hello
from tests.support.ingest_head import (
    SPEC,
    TEMPLATE,
    Head,
    RecordingSink,
    counting_chunks,
    counting_stream,
    make_registrar,
    make_replay,
    small_config,
)
from tests.support.waits import wait_for


@pytest.fixture
def head():
    h = Head(make_replay())
    yield h
    h.close()


def test_epsilon_schedule() -> None:
    assert collector_epsilon(0, 1, 0.4, 7.0) == 0.4
    assert collector_epsilon(0, 8, 0.4, 7.0) == pytest.approx(0.4)
    assert collector_epsilon(7, 8, 0.4, 7.0) == pytest.approx(0.4 ** 8)
    assert collector_epsilon(3, 8, 0.4, 7.0) == pytest.approx(0.4 ** (1 + 7 * 3 / 7))


def test_registration_assigns_ids_endpoints_and_epsilon() -> None:
    head = Head(make_replay(), config=small_config().with_overrides(["collectors.eps_per=stream"]))
    try:
        _check_stream_epsilons(head)
    finally:
        head.close()


def test_local_collectors_get_ipc_endpoints_only_when_asked() -> None:
    """local_transport=ipc: a collector on this host (loopback, same hostname) sends over a unix socket;
    another host name gets TCP."""
    head = Head(make_replay(), config=small_config(local_transport="ipc"))
    try:
        assert head.welcome.data_endpoint.startswith("ipc://")
        remote = hello(head.ctx, head.thread.control_endpoint, {"host": "elsewhere", "pid": 1, "slot": 1,
                                                                "nonce": os.urandom(8).hex(), "envs": 2})
        assert remote["data_endpoint"].startswith("tcp://127.0.0.1:")
    finally:
        head.close()


def test_a_registration_without_a_descriptor_is_refused_and_the_next_one_welcomed(monkeypatch) -> None:
    """The data socket's listener cannot be made (EMFILE: a burst took the last descriptors after the
    registrar's check): the HELLO gets a refusal naming the cause, is counted, and nothing of it is kept."""
    import errno

    import ingest.registration as registration

    head = Head(make_replay())
    try:
        real = registration.bind_tcp

        def no_descriptor(*args, **kwargs):
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(registration, "bind_tcp", no_descriptor)
        fields = {"host": "elsewhere", "pid": 1, "slot": -1, "envs": 1}
        refused = hello(head.ctx, head.thread.control_endpoint, {**fields, "nonce": os.urandom(8).hex()})
        assert "short of file descriptors" in refused.get("refused", ""), refused
        assert wait_for(lambda: head.thread.stats().rejected_by_reason.get("too_many_collectors") == 1, 10)
        assert head.thread.stats().registrations == 1  # the harness's own
        monkeypatch.setattr(registration, "bind_tcp", real)
        welcome = hello(head.ctx, head.thread.control_endpoint, {**fields, "nonce": os.urandom(8).hex()})
        assert "refused" not in welcome and welcome["data_endpoint"].startswith("tcp://"), welcome
    finally:
        head.close()


def _check_stream_epsilons(head: Head) -> None:
    second = register(head.ctx, head.thread.control_endpoint, slot=1, timeout_s=10)
    assert head.cid == 1 and second.collector_id == 2
    assert head.welcome.data_endpoint != second.data_endpoint
    assert head.welcome.data_endpoint.startswith("tcp://127.0.0.1:")  # the default local_transport=tcp
    # N = 2 collectors x K = 2 envs: stream i = slot * 2 + k explores with 0.4 ** (1 + 7 i / 3)
    assert head.welcome.epsilons == pytest.approx([0.4, 0.4 ** (1 + 7 / 3)])
    assert second.epsilons == pytest.approx([0.4 ** (1 + 14 / 3), 0.4 ** 8])
    assert second.epsilon == pytest.approx(0.4 ** 8) and head.welcome.epsilon == pytest.approx(0.4 ** (1 + 7 / 3))
    assert head.welcome.config == Config.from_dict(collector_config(head.config.to_dict()))  # what collectors read


@pytest.mark.parametrize("per", ["stream", "collector"])
def test_collectors_beyond_the_count_get_their_own_slots_and_never_repeat_an_epsilon(per: str) -> None:
    """Remote collectors (no slot, or an out-of-range one) get slots N, N+1, ...: no epsilon repeats."""
    head = Head(make_replay(), config=small_config().with_overrides([f"collectors.eps_per={per}"]))
    try:
        _check_extra_slots(head, per)
    finally:
        head.close()


def _check_extra_slots(head: Head, per: str) -> None:
    extra = [register(head.ctx, head.thread.control_endpoint, slot=slot, timeout_s=10) for slot in (-1, 7, -1)]
    assert [w.slot for w in extra] == [2, 3, 4]
    local = register(head.ctx, head.thread.control_endpoint, slot=1, timeout_s=10)
    welcomes = [head.welcome, local, *extra]
    values = [e for w in welcomes for e in (w.epsilons if per == "stream" else w.epsilons[:1])]
    assert len(set(values)) == len(values) == (10 if per == "stream" else 5)
    assert max(e for w in extra for e in w.epsilons) < 0.4 ** 8  # past N (K): the sequence continues below
    assert stream_epsilons(0, 1, 1, 0.4, 7.0) == [0.4]


@pytest.mark.parametrize("count,slot", [(0, -1), (1, 0)], ids=["collectors-0-remote", "collectors-1"])
def test_a_lone_collector_spreads_the_ape_x_epsilons_over_its_envs(count: int, slot: int) -> None:
    """N = 1 divided by zero in eps_base ** (1 + eps_alpha * i / (N - 1)): a head started with --collectors 0
    gave its one remote collector eps_base ** (1 + eps_alpha) (1e-8 for CartPole) on every stream. A lone
    collector now gets the per-stream spread over its K envs, from slot 0."""
    config = small_config().with_overrides([f"collectors.count={count}", "collectors.envs_per_collector=4",
                                            "collectors.eps_base=0.1", "collectors.eps_per=collector"])
    head = Head(make_replay(), config=config, slot=slot)
    try:
        assert head.welcome.slot == 0 and head.welcome.num_collectors == 1
        assert head.welcome.epsilons == pytest.approx([0.1 ** (1 + 7 * k / 3) for k in range(4)])
        second = register(head.ctx, head.thread.control_endpoint, slot=-1, timeout_s=10)  # past N: continues below
        assert second.slot == 1 and max(second.epsilons) < min(head.welcome.epsilons)
        assert len(set(second.epsilons)) == 4
    finally:
        head.close()


def test_per_collector_epsilons_give_all_envs_of_a_slot_one_value() -> None:
    h = Head(make_replay(), config=small_config().with_overrides(["collectors.eps_per=collector"]))
    try:
        second = register(h.ctx, h.thread.control_endpoint, slot=1, timeout_s=10)
        assert h.welcome.epsilons == pytest.approx([0.4, 0.4]) and second.epsilons == pytest.approx([0.4 ** 8] * 2)
    finally:
        h.close()


def test_valid_messages_are_counted_and_written(head: Head) -> None:
    before = head.handled()
    chunks, summaries = counting_stream(3, episode_length=20)  # 24 transitions: the first episode's 20 steps end
    assert [e.length for e in summaries] == [20]
    for chunk in chunks:
        head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 5))
    head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
    head.send(P.encode_episode(summaries[0], head.cid, head.next_seq(), 5))
    head.wait_handled(before, 5)
    s = head.thread.stats()
    assert (s.chunks, s.heartbeats, s.episodes, s.rejected, s.gaps) == (3, 1, 1, 0, 0)
    assert s.transitions == 24
    assert s.collectors[head.cid]["weight_version"] == 5 and s.recent_episodes[0].x_pos == 100
    line = head.thread.processor_line()
    assert line.startswith("[PROCESSOR] Processed: ") and "Batches: 3, Drops: 0, Buffer: " in line
    assert "Consolidated Queue: " in line


def test_a_checkpoint_pauses_writes_but_not_the_thread(head: Head) -> None:
    """While a checkpoint holds `writes_paused`, chunks stay parked and nothing is written, yet the thread keeps
    reading (a HEARTBEAT is counted), so a long save never looks like a silent head; afterwards the chunk is written."""
    chunks, _ = counting_stream(1, episode_length=20)
    with head.thread.writes_paused():
        written = head.thread.stats().transitions
        head.send(P.encode_chunk(chunks[0], head.cid, head.next_seq(), 5))
        head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
        assert wait_for(lambda: head.thread.stats().heartbeats == 1 and head.thread.stats().parked == 1, 10, 0.005)
        assert head.thread.stats().transitions == written and head.thread.stats().chunks == 0
    assert wait_for(lambda: head.thread.stats().chunks == 1 and head.thread.stats().parked == 0, 10, 0.005)


@pytest.mark.parametrize("cap", [36, 37])
def test_an_episode_longer_than_the_envs_time_limit_is_not_counted(cap: int) -> None:
    """A summary is held to env.max_episode_steps as its return is to the reward bound: a 37-step episode
    (its transitions inserted, its summary matching them) where the env truncates at 36 steps is refused as
    episode_out_of_range and never reaches the episode statistics (a fabricated 600-step CartPole episode
    counted where the env caps at 500: ret20 20 -> 310); at a cap of 37 it counts."""
    config = small_config()
    h = Head(make_replay(), config=replace(config, env=replace(config.env, max_episode_steps=cap)))
    try:
        chunks, summaries = counting_stream(5)
        assert summaries[0].length == 37
        for chunk in chunks:
            h.send(P.encode_chunk(chunk, h.cid, h.next_seq(), 5))
        h.send(P.encode_episode(summaries[0], h.cid, h.next_seq(), 5))
        h.send(P.encode_simple(P.HEARTBEAT, h.cid, h.next_seq(), 5))
        assert wait_for(lambda: h.thread.stats().heartbeats == 1 and h.thread.stats().chunks == len(chunks), 10, 0.005)
        s = h.thread.stats()
        if cap < 37:
            assert s.episodes == 0 and s.rejected_by_reason == {"episode_out_of_range": 1}, s.rejected_by_reason
        else:
            assert s.episodes == 1 and s.rejected_by_reason == {}, s.rejected_by_reason
    finally:
        h.close()


def test_episode_summaries_count_only_once_their_steps_arrived(head: Head) -> None:
    """A forged summary (no transitions behind it) never reaches the episode statistics."""
    send = head.send
    for _ in range(20):  # 20 "solved" episodes at 0 env steps: what stopped a --target-return run
        send(P.encode_episode(P.EpisodeSummary(0, 1, 475.0, 0, False, 1, 1), head.cid, head.next_seq(), 5))
    send(P.encode_episode(P.EpisodeSummary(1, 1, 5e9, 0, False, 1, 1), head.cid, head.next_seq(), 5))
    send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
    assert wait_for(lambda: head.thread.stats().heartbeats == 1, 10, 0.005)
    s = head.thread.stats()
    assert s.episodes == 0 and s.recent_episodes == []
    assert s.rejected_by_reason == {"episode_out_of_range": 1}  # 5e9 in one step is beyond any reward bound
    # the stream's transitions arrive: 8 of them end no episode, so nothing counts yet (8 transitions once made
    # 8 one-step episodes count); when its first episode (37 steps) ends, no forged one matches it
    chunks, summaries = counting_stream(5)
    send(P.encode_chunk(chunks[0], head.cid, head.next_seq(), 5))
    assert wait_for(lambda: head.thread.stats().transitions > 0, 10, 0.005)
    assert head.thread.stats().episodes == 0
    for chunk in chunks[1:]:
        send(P.encode_chunk(chunk, head.cid, head.next_seq(), 5))
    assert wait_for(lambda: head.thread.stats().rejected == 21, 10, 0.005)
    s = head.thread.stats()
    assert s.episodes == 0 and s.rejected_by_reason == {"episode_out_of_range": 1, "episode_mismatch": 20}
    assert 20 <= PENDING_SUMMARIES_PER_STREAM  # all of them waited for the episode's end
    send(P.encode_episode(summaries[0], head.cid, head.next_seq(), 5))  # the genuine one counts
    assert wait_for(lambda: head.thread.stats().episodes == 1, 10, 0.005)
    assert head.thread.stats().recent_episodes == summaries[:1] and summaries[0].length == 37


def test_sequence_duplicates_rejected_gaps_counted(head: Head) -> None:
    """A duplicate is stale (also of a jump not yet followed); a gap counts once the message after it
    continues from there."""
    chunks = counting_chunks(5)
    before = head.handled()
    for chunk, seq in zip(chunks, (1, 1, 3, 3, 4), strict=True):
        head.send(P.encode_chunk(chunk, head.cid, seq, 0))
    head.wait_handled(before, 5)
    s = head.thread.stats()
    assert s.chunks == 3 and s.rejected_by_reason == {"stale_seq": 2} and s.gaps == 1


def test_one_message_at_the_largest_jump_cannot_make_the_owners_messages_stale(head: Head) -> None:
    """With a sniffed token (a plaintext WELCOME), one HEARTBEAT with seq exactly 2**20 sent before the owner's
    first message made the owner's next messages stale_seq. A jump moves the sequence only once the next
    message continues it; the owner's own sequence continues from where it was, and its credits with it."""
    before = head.handled()
    head.send(P.encode_simple(P.HEARTBEAT, head.cid, MAX_SEQ_JUMP, 5))  # the forged one
    for _ in range(13):
        head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
    head.wait_handled(before, 14)
    s = head.thread.stats()
    assert s.rejected_by_reason == {} and s.heartbeats == 14 and s.gaps == 0, s.rejected_by_reason
    state = head.thread.collectors[head.cid]
    assert state.last_seq == 13 and state.credit_seq() == 13  # the forged 2**20 acknowledges nothing
    chunk = counting_chunks(1)[0]
    head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 5))
    head.wait_handled(before + 14, 1)
    assert head.thread.stats().chunks == 1


def test_future_weights_wrong_collector_and_replay_refusal() -> None:
    h = Head(RecordingSink(refuse=True))
    try:
        chunk = counting_chunks(1)[0]
        before = h.handled()
        h.send(P.encode_chunk(chunk, h.cid, 1, 6))  # the head published only up to 5
        h.send(P.encode_chunk(chunk, h.cid + 7, 2, 0))
        h.send(P.encode_chunk(chunk, h.cid, 3, 0))  # the sink raises ValueError
        h.wait_handled(before, 3)
        s = h.thread.stats()
        assert s.rejected_by_reason == {"future_weights": 1, "collector_mismatch": 1, "replay_rejected": 1}
        assert s.chunks == 0 and h.thread.is_alive()
    finally:
        h.close()


def test_bad_control_messages_do_not_register(head: Head) -> None:
    dealer = head.ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(head.thread.control_endpoint)
    dealer.send_multipart([b"garbage"])
    dealer.send_multipart(P.encode_simple(P.HEARTBEAT))
    deadline = time.monotonic() + 5
    while head.thread.stats().rejected < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    s = head.thread.stats()
    assert s.rejected_by_reason == {"bad_header_size": 1, "unexpected_type": 1} and s.registrations == 1
    dealer.close(0)


# ------------------------------------------------------------------ fuzz over a real socket
KINDS = ["random", "truncated", "magic", "version", "type", "shape", "huge_count", "nan_reward", "inf_reward",
         "nan_priority", "flags", "action", "first_start", "duplicate_seq", "missing_frame", "dtype"]


def bad_message(kind: str, data: st.DataObject, head: Head, chunk: TransitionChunk) -> list[bytes]:
    good = [bytes(memoryview(p).cast("B")) if isinstance(p, np.ndarray) else bytes(p)
            for p in P.encode_chunk(chunk, head.cid, head.seq + 1, 0)]
    hdr = bytearray(good[0])

    def header_with(offset: int, fmt: str, value) -> list[bytes]:
        import struct

        struct.pack_into(fmt, hdr, offset, value)
        return [bytes(hdr), *good[1:]]

    def array(index: int, values: np.ndarray) -> list[bytes]:
        return [*good[:index], values.tobytes(), *good[index + 1:]]

    f = chunk.num_frames
    if kind == "random":
        return data.draw(st.lists(st.binary(max_size=128), min_size=1, max_size=7))
    if kind == "truncated":
        i = data.draw(st.integers(0, 5))
        cut = data.draw(st.integers(0, max(0, len(good[i]) - 1)))
        return [*good[:i], good[i][:cut], *good[i + 1:]]
    if kind == "magic":
        return header_with(0, "4s", data.draw(st.binary(min_size=4, max_size=4).filter(lambda b: b != P.MAGIC)))
    if kind == "version":
        return header_with(4, "<H", data.draw(st.integers(0, 65535).filter(lambda v: v != P.VERSION)))
    if kind == "type":
        return header_with(6, "<B", data.draw(st.integers(0, 255).filter(lambda v: v not in P.MESSAGE_TYPES or v in (
            P.HELLO, P.WELCOME, P.WEIGHTS, P.HEAD_HEARTBEAT, P.STOP))))
    if kind == "shape":
        return header_with(28, "<I", data.draw(st.integers(0, 2**32 - 1).filter(lambda v: v != 84)))
    if kind == "huge_count":
        return header_with(20, "<I", data.draw(st.integers(P.MAX_FRAMES + 1, 2**32 - 1)))
    if kind == "dtype":
        return header_with(24, "<B", data.draw(st.integers(2, 255)))
    if kind in ("nan_reward", "inf_reward"):
        r = chunk.rewards.copy()
        r[data.draw(st.integers(0, f - 1))] = np.nan if kind == "nan_reward" else -np.inf
        return array(3, r)
    if kind == "nan_priority":
        p = chunk.priorities.copy()
        p[data.draw(st.integers(0, f - 1))] = np.nan
        return array(5, p)
    if kind == "flags":
        fl = chunk.flags.copy()
        fl[data.draw(st.integers(0, f - 1))] |= data.draw(st.sampled_from([8, 16, 128]))
        return array(4, fl)
    if kind == "action":
        a = chunk.actions.copy()
        a[data.draw(st.integers(0, f - 1))] = data.draw(st.sampled_from([4, 99, -2, -(2**31)]))
        return array(2, a)
    if kind == "first_start":
        return header_with(56, "<I", data.draw(st.integers(f, 2**32 - 1)))
    if kind == "duplicate_seq":
        return header_with(12, "<Q", data.draw(st.integers(0, head.seq)))
    if kind == "missing_frame":
        return good[: data.draw(st.integers(1, 5))]
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def fuzz_head():
    replay = make_replay()
    h = Head(replay)
    chunk = counting_chunks(1)[0]
    before = h.handled()
    h.send(P.encode_chunk(chunk, h.cid, h.next_seq(), 0))  # one good chunk so the buffer is non-empty
    h.wait_handled(before)
    yield h, chunk
    h.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_every_bad_message_is_rejected(fuzz_head, data: st.DataObject) -> None:
    head, chunk = fuzz_head
    kind = data.draw(st.sampled_from(KINDS))
    parts = bad_message(kind, data, head, chunk)
    before = head.thread.stats()
    head.push.send_multipart(parts)
    deadline = time.monotonic() + 10
    while head.thread.stats().rejected == before.rejected:
        assert time.monotonic() < deadline, f"{kind} message was not rejected"
        time.sleep(0.001)
    after = head.thread.stats()
    assert after.rejected == before.rejected + 1 and after.chunks == before.chunks, kind
    assert head.thread.is_alive() and head.thread.errors == 0


def test_fuzz_left_the_buffer_valid(fuzz_head) -> None:
    head, _ = fuzz_head
    head.replay.check_valid()
    s = head.thread.stats()
    assert s.chunks == 1 and head.thread.is_alive() and head.thread.errors == 0


# ------------------------------------------------------------------ CURVE
def test_curve_admits_authorized_clients_only(tmp_path, caplog) -> None:
    keys = generate(tmp_path / "keys")
    other = load_client(generate(tmp_path / "stranger"))
    stranger = CurveClient(other.public, other.secret, load_client(keys).server_public)  # knows the server, not authorized
    cfg = small_config(curve_keys_dir=str(keys))
    sink = RecordingSink()
    caplog.set_level(logging.WARNING, logger="shared.keys")
    h = Head(sink, config=cfg, curve=load_client(keys))
    try:
        h.send(P.encode_chunk(counting_chunks(1)[0], h.cid, 1, 0))
        deadline = time.monotonic() + 10
        while h.thread.stats().chunks < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(RegistrationError):
            register(h.ctx, h.thread.control_endpoint, curve=stranger, timeout_s=1.5, retry_s=0.5)
        assert any("ZAP DENIED" in r.getMessage() for r in caplog.records)
        assert h.thread.stats().registrations == 1
    finally:
        h.close()


def test_a_registration_is_open_before_its_welcome_leaves() -> None:
    """A collector holding a WELCOME is among the head's open registrations (the supervisor's stall
    check asks by pid right after a collector registers)."""
    ctx = zmq.Context()
    registrar = make_registrar(ctx, small_config(), "inproc://registration-order")
    client = ctx.socket(zmq.DEALER)
    states = []
    try:
        client.connect(registrar.control_endpoint)
        hello = {"host": "h", "pid": 7, "slot": 0, "nonce": "n", "envs": 2}
        client.send_multipart(P.encode_json(P.HELLO, hello))
        assert registrar.control.poll(10_000)
        welcome_waiting: list[bool] = []

        def admit(state) -> None:
            states.append(state)
            welcome_waiting.append(bool(client.poll(0)))

        admitted = registrar.drain(0, lambda reason, detail: pytest.fail(f"rejected: {reason} {detail}"), admit)
        assert admitted == 1 and welcome_waiting == [False]  # admitted once, before the WELCOME was sent
        assert client.poll(10_000)  # and then the WELCOME
        assert P.decode(client.recv_multipart()).header.msg_type == P.WELCOME
    finally:
        client.close(0)
        for state in states:
            registrar.release(state)
        registrar.close()
        ctx.term()


def test_silent_collectors_and_forget(head: Head) -> None:
    _, starting = head.thread.stall_clock_of_pid(head.welcome_pid)
    assert starting  # registered and not heard from yet: starting (building its envs), not stalled
    head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
    deadline = time.monotonic() + 30
    while not head.thread.stats().collectors[head.cid]["heard"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)
    assert head.thread.silent_collectors(0.2) == [head.cid]
    clock, held = head.thread.stall_clock_of_pid(head.welcome_pid)
    assert time.monotonic() - clock >= 0.3 and not held
    head.thread.forget(head.cid)
    deadline = time.monotonic() + 5
    while head.cid in head.thread.stats().collectors:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert head.thread.silent_collectors(0.2) == [] and head.thread.is_alive()
    assert head.thread.stall_clock_of_pid(head.welcome_pid) is None and head.thread.stats().reclaimed == 1


def _in_flight_while_gated(socket_buffer_bytes: int, limit: int = 5_000) -> int:
    """How many small messages a real HeadLink can queue towards a head whose insert gate is shut."""
    from actors.client import HeadLink

    config = small_config(local_transport="tcp", socket_buffer_bytes=socket_buffer_bytes)
    head = Head(RecordingSink(), config, raw_socket=False, may_insert=lambda: False)  # the learner is "behind"
    try:
        link = HeadLink(head.ctx, head.welcome, TEMPLATE)
        assert link.data.sndbuf == (socket_buffer_bytes or link.data.sndbuf)
        for seq, chunk in enumerate(counting_chunks(PARKED_WITHOUT_CREDITS), start=1):  # fill the park:
            P.send_parts(link.data, P.encode_chunk(chunk, head.cid, seq, 5))  # then the socket is not read
        assert wait_for(lambda: head.thread.stats().parked == PARKED_WITHOUT_CREDITS, 10, 0.005)
        message = P.encode_simple(P.HEARTBEAT, head.cid, PARKED_WITHOUT_CREDITS + 1, 5)
        sent, stalled_since = 0, None
        while sent < limit:
            try:
                link.data.send_multipart(message, zmq.NOBLOCK)
                sent, stalled_since = sent + 1, None
            except zmq.Again:  # the TCP connection may still be coming up or draining (slowly on a loaded
                stalled_since = stalled_since or time.monotonic()  # machine): full only after 2 s without room
                if time.monotonic() - stalled_since > 2.0:
                    break
                time.sleep(0.01)
        link.close()
        assert head.thread.stats().heartbeats == 0
        return sent
    finally:
        head.close()


def test_socket_buffer_bytes_bounds_the_data_in_flight() -> None:
    """Small kernel buffers are what keep gated data fresh (CartPole's lag fell from ~800 to ~200 updates)."""
    bounded = _in_flight_while_gated(4096)
    unbounded = _in_flight_while_gated(0)
    assert bounded < 1_000, bounded  # measured 256 heartbeats (~18 KB with ZeroMQ framing)
    assert unbounded == 5_000, unbounded  # the OS default takes every message offered (>20k measured)


def _blank_chunk(num_frames: int) -> TransitionChunk:
    """A valid chunk of `num_frames` blank frames that starts an episode."""
    actions = np.zeros(num_frames, np.int32)
    actions[-1] = NO_ACTION
    flags = np.zeros(num_frames, np.uint8)
    flags[0] = FLAG_FIRST
    return TransitionChunk(0, 0, np.zeros((num_frames, *SPEC.obs_shape), SPEC.obs_dtype), actions,
                           np.zeros(num_frames, np.float32), flags, np.ones(num_frames, np.float32))


@pytest.mark.parametrize("capacity", [5, 64, 8194])  # 8194: the cap on chunk length applies, not half the ring
def test_the_data_socket_admits_exactly_the_chunks_the_replay_accepts(capacity: int) -> None:
    """The data sockets' MAXMSGSIZE and the replay's chunk limit come from one number: the most frames whose
    observations fit one message frame under the socket's limit is the most frames the replay accepts."""
    config = replace(small_config(), replay=ReplayConfig(capacity=capacity))
    ctx = zmq.Context()
    registrar = make_registrar(ctx, config, "tcp://127.0.0.1:0")
    registrar.close()
    ctx.term()
    frame_bytes = int(np.prod(SPEC.obs_shape)) * SPEC.obs_dtype.itemsize  # 7056: more than the limit's slack
    fits = registrar.data_max_msg // frame_bytes
    replay = ReplayBuffer.build(config.replay, EnvSpec(SPEC.obs_shape, SPEC.obs_dtype, 5, 4), "cpu")
    accepted, refused = replay.add_chunks([_blank_chunk(fits), _blank_chunk(fits + 1)])
    assert isinstance(accepted, int), accepted
    assert isinstance(refused, ValueError) and "max_chunk_frames" in str(refused), refused


def test_a_leaving_collector_s_parked_chunks_are_written_not_lost() -> None:
    sink = RecordingSink()
    head = Head(sink, may_insert=lambda: False)  # gate shut: chunks are parked
    try:
        for chunk in counting_chunks(2):
            head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 5))
        assert wait_for(lambda: head.thread.stats().parked == 2, 10, 0.005)
        assert sink.chunks == []
        head.send(P.encode_simple(P.BYE, head.cid, head.next_seq(), 5))
        assert wait_for(lambda: head.cid not in head.thread.stats().collectors, 10, 0.005)
        assert len(sink.chunks) == 2 and head.thread.stats().reclaimed == 1
    finally:
        head.close()


def test_log_budget_bounds_lines_per_window_and_counts_the_rest() -> None:
    from shared.sizes import LogBudget

    now = [0.0]
    budget = LogBudget(per_window=2, window_s=10.0, clock=lambda: now[0])
    assert [budget.allow() for _ in range(5)] == [(True, 0), (True, 0), (False, 0), (False, 0), (False, 0)]
    now[0] = 10.0
    assert budget.allow() == (True, 3)  # the next allowed line says how many were dropped


class LimitGate:
    """Admits while the upper bounds of the written chunks plus `pending` stay under a limit (None: shut)."""

    def __init__(self, sink: RecordingSink) -> None:
        self.sink, self.limit = sink, None

    def may_insert(self, pending: int = 0) -> bool:
        written = sum(c.num_frames - c.first_start for c in self.sink.chunks)
        return self.limit is not None and written + pending < self.limit


def test_a_batched_write_admits_what_one_by_one_writes_would() -> None:
    """Parked chunks leave in one batch, but the gate is asked per chunk with the batch's pending transitions."""
    sink = RecordingSink()
    gate = LimitGate(sink)
    head = Head(sink)
    head.thread.gate = gate
    try:
        chunks = counting_chunks(4)
        for chunk in chunks:
            head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 5))
        assert wait_for(lambda: head.thread.stats().parked == 4, 10, 0.005)
        bounds = [c.num_frames - c.first_start for c in chunks]
        gate.limit = bounds[0] + bounds[1] + 1  # admits chunks 0, 1 and 2 (2 is asked with 0 and 1 pending)
        assert wait_for(lambda: len(sink.chunks) == 3, 10, 0.005)
        time.sleep(0.1)
        assert len(sink.chunks) == 3 and head.thread.stats().parked == 1
    finally:
        head.close()


# ------------------------------------------------------------------ admitted but hostile peers
def test_a_summary_flood_keeps_the_registration_bounded_and_counted() -> None:
    """20,000 EPISODE_SUMMARY on distinct stream ids and no transitions (1,000,000 grew a head by > 1 GB):
    the registration keeps only its own streams' backlog, and the rest is counted."""
    from tests.hostile.attack import summary_flood

    head = Head(make_replay(), config=small_config(max_chunks_in_flight=2))
    try:
        result = summary_flood(head.ctx, head.thread.control_endpoint, count=20_000)
        assert result["acknowledged"], result
        streams = head.config.collectors.envs_per_collector  # the flood's HELLO says envs 1: the config's K wins
        state = head.thread.collectors[result["collector_id"]]
        assert len(state.streams) == streams and state.pending_summaries == streams
        s = head.thread.stats()
        assert s.rejected_by_reason == {"stream_range": 20_000 - streams} and s.episodes == 0
    finally:
        head.close()


def test_a_replayed_hello_is_refused_and_the_owner_keeps_its_registration() -> None:
    """The owner's HELLO bytes sent again from another connection returned the owner's WELCOME (its routing id):
    the replayer connected with it first, and ZeroMQ never read the owner's data. Now the replay is refused."""
    from tests.hostile.attack import replayed_hello

    head = Head(make_replay(), config=small_config(max_chunks_in_flight=2))
    try:
        result = replayed_hello(head.ctx, head.thread.control_endpoint, owner_messages=5)
        assert result["replay_refused"] and not result["replay_got_token"], result
        assert result["owner_credited"] == 5, result  # every owner message read and acknowledged
        s = head.thread.stats()
        assert s.rejected_by_reason == {"replayed_hello": 1} and s.registrations == 2 and s.heartbeats == 5
    finally:
        head.close()


def test_a_retried_hello_gets_the_same_welcome_until_the_registration_is_used() -> None:
    """A collector that resends its HELLO (same bytes, same connection) because no WELCOME came yet gets the same
    WELCOME, never a second registration; once the registration has sent data, the nonce is spent."""
    head = Head(make_replay(), config=small_config(max_chunks_in_flight=2))
    dealer = head.ctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        dealer.connect(head.thread.control_endpoint)
        hello = P.encode_json(P.HELLO, {"host": "retry", "pid": 1, "slot": -1, "nonce": "n" * 32, "envs": 2})
        for _ in range(3):
            dealer.send_multipart(hello)
        replies = []
        for _ in range(3):
            assert dealer.poll(10_000)
            replies.append(P.decode(dealer.recv_multipart()).payload)
        assert all("refused" not in r for r in replies), replies
        assert len({(r["collector_id"], r["data_token"]) for r in replies}) == 1
        assert wait_for(lambda: head.thread.stats().registrations == 2, 10, 0.005)
        assert head.thread.stats().rejected == 0
        owner = head.ctx.socket(zmq.DEALER)
        owner.linger = 0
        owner.setsockopt(zmq.ROUTING_ID, bytes.fromhex(replies[0]["data_token"]))
        owner.connect(replies[0]["data_endpoint"])
        P.send_parts(owner, P.encode_simple(P.HEARTBEAT, replies[0]["collector_id"], 1))
        assert wait_for(lambda: head.thread.stats().heartbeats == 1, 10, 0.005)
        owner.close(0)
        dealer.send_multipart(hello)  # the registration is in use: a late copy is refused, counted
        assert dealer.poll(10_000)
        assert "refused" in P.decode(dealer.recv_multipart()).payload
        assert wait_for(lambda: head.thread.stats().rejected_by_reason == {"replayed_hello": 1}, 10, 0.005)
        assert head.thread.stats().registrations == 2
    finally:
        dealer.close(0)
        head.close()


def test_a_sequence_number_far_ahead_is_rejected_without_moving_the_sequence(head: Head) -> None:
    """One HEARTBEAT with seq 2**64-1 made every later message of its registration stale_seq."""
    before = head.handled()
    head.send(P.encode_simple(P.HEARTBEAT, head.cid, 2**64 - 1, 5))
    for _ in range(3):
        head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
    head.wait_handled(before, 4)
    s = head.thread.stats()
    assert s.rejected_by_reason == {"seq_jump": 1} and s.heartbeats == 3 and s.gaps == 0


def test_a_registration_has_until_the_stall_timeout_to_send_its_first_message() -> None:
    """A collector on a loaded machine can take longer than head_timeout_s between its WELCOME and its first
    HEARTBEAT (building its network, connecting its data socket): it was reclaimed before it spoke, again and
    again. Before its first message a registration gets stall_timeout_s; one that spoke and fell silent is
    reclaimed after head_timeout_s as before. Ordered by events: the silent-after-speaking one goes first."""
    sink = RecordingSink()
    head = Head(sink, config=small_config(head_timeout_s=2.0, stall_timeout_s=10.0))
    try:
        quiet = register(head.ctx, head.thread.control_endpoint, slot=1, timeout_s=10)
        head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
        assert wait_for(lambda: head.cid not in head.thread.stats().collectors, 30, 0.01)
        assert quiet.collector_id in head.thread.stats().collectors  # never spoke: still starting, kept
        assert wait_for(lambda: quiet.collector_id not in head.thread.stats().collectors, 60, 0.05)
        assert head.thread.stats().reclaimed == 2
    finally:
        head.close()


def test_collector_priorities_are_capped_like_the_learner_s() -> None:
    """Priorities were only checked finite and >= 0: 3e38 made one collector's transitions dominate sampling.
    They are clipped to the cap (the learner's |TD| cap, or the config's reward bound when tighter) and the
    chunks clipped are counted; the chunk itself is stored."""
    from ingest.peers import max_priority
    from replay.sampler import MAX_PRIORITY_TD

    sink = RecordingSink()
    config = small_config().with_overrides(["env.max_abs_reward=10", "replay.gamma=0.9"])  # rewards <= 9 here
    head = Head(sink, config=config)
    try:
        cap = max_priority(config.env.max_abs_reward, config.replay.gamma)
        assert cap == pytest.approx(2 * 10 / (1 - 0.9)) and cap < MAX_PRIORITY_TD
        assert max_priority(1e30, 1.0) == MAX_PRIORITY_TD
        chunks = counting_chunks(2)
        hostile = replace(chunks[1], priorities=np.full_like(chunks[1].priorities, 3e38))
        for chunk in (chunks[0], hostile):
            head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 5))
        assert wait_for(lambda: len(sink.chunks) == 2, 10, 0.005)
        np.testing.assert_array_equal(sink.chunks[0].priorities, chunks[0].priorities)  # below the cap: as sent
        assert float(sink.chunks[1].priorities.max()) == pytest.approx(cap) and sink.chunks[1].priorities.dtype == np.float32
        s = head.thread.stats()
        assert s.priorities_capped == 1 and s.rejected == 0 and s.chunks == 2
    finally:
        head.close()


def test_the_welcome_carries_what_a_collector_reads_and_no_path_of_the_head(tmp_path) -> None:
    """The WELCOME carried the whole config, the head's run directory and keys path included. Now: the env
    section and the fields a collector reads (ingest.registration.WELCOME_CONFIG), which rebuild its Config."""
    from ingest.registration import WELCOME_CONFIG

    run_dir, keys = tmp_path / "head-run", generate(tmp_path / "head-keys")
    cfg = small_config(curve_keys_dir=str(keys)).with_overrides([f"logging.run_dir={run_dir}", "replay.gamma=0.95",
                                                                "learner.hidden=64", "collectors.heartbeat_s=0.5"])
    head = Head(RecordingSink(), config=cfg, curve=load_client(keys))
    dealer = head.ctx.socket(zmq.DEALER)
    dealer.linger = 0
    load_client(keys).apply(dealer)
    try:
        dealer.connect(head.thread.control_endpoint)
        dealer.send_multipart(P.encode_json(P.HELLO, {"host": "remote", "nonce": "w" * 32}))
        assert dealer.poll(10_000)
        raw = dealer.recv_multipart()[1].decode()
        sent = json.loads(raw)["config"]
        for secret in (str(tmp_path), '"run_dir"', '"curve_keys_dir"', '"bind"', '"port"', '"logging"'):
            assert secret not in raw, secret
        assert set(sent) == set(WELCOME_CONFIG) and sent["env"] == cfg.to_dict()["env"]
        for section, names in WELCOME_CONFIG.items():
            if names is not None:
                assert set(sent[section]) == set(names), section
        rebuilt = Config.from_dict(sent)  # what the reference collector acts on
        for section, names in WELCOME_CONFIG.items():
            for name in names or [f.name for f in fields(getattr(cfg, section))]:
                assert getattr(getattr(rebuilt, section), name) == getattr(getattr(cfg, section), name), name
        assert head.welcome.config == rebuilt and head.welcome.config.logging.run_dir == ""
    finally:
        dealer.close(0)
        head.close()


class _Control:
    """A Registrar driven from the test's thread: raw HELLOs in, its drain called until each is answered."""

    def __init__(self, ctx: zmq.Context, registrar: Registrar) -> None:
        self.ctx, self.registrar, self.open, self.n = ctx, registrar, [], 0

    def hello(self, pid: int, slot: int = -1) -> dict:
        self.n += 1
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger = 0
        try:
            sock.connect(self.registrar.control_endpoint)
            sock.send_multipart(P.encode_json(P.HELLO, {"host": "h", "pid": pid, "slot": slot, "nonce": f"n{self.n}",
                                                        "envs": 2}))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                self.registrar.drain(len(self.open), lambda reason, detail: None, self.open.append)
                if sock.poll(5):
                    return P.decode(sock.recv_multipart()).payload
            raise TimeoutError("no WELCOME")
        finally:
            sock.close(0)

    def release(self, state) -> None:
        self.open.remove(state)
        self.registrar.release(state)


@pytest.fixture
def control(monkeypatch):
    import ingest.registration as registration

    monkeypatch.setattr(registration, "MAX_OPEN_COLLECTORS", 16)
    monkeypatch.setattr(registration, "MAX_PER_ADDRESS", 6)
    ctx = zmq.Context()
    config = small_config()  # collectors.count = 2: the head's own collectors, slots 0 and 1
    registrar = Registrar(SPEC, {"local": "inproc://w", "remote": "inproc://w"}, ctx, transport=config.transport,
                          collectors=config.collectors, replay=config.replay, welcome_config=config.to_dict(),
                          control_endpoint="tcp://127.0.0.1:0", own_pids=lambda: {os.getpid()})
    try:
        c = _Control(ctx, registrar)
        yield c
    finally:
        for state in list(c.open):
            c.release(state)
        registrar.close()
        ctx.term()


def test_a_heartbeating_sybil_cannot_hold_the_registrations_the_heads_own_collectors_need(control) -> None:
    """1,023 HELLOs with distinct nonces, each registration kept alive by heartbeats, held every slot: the
    supervisor's restarted collector was refused (exit 2, five times) and training stopped. Registrations of
    the head's own collectors (a pid it started, over loopback) have room kept for them, and one address holds
    at most MAX_PER_ADDRESS registrations of everyone else."""
    import ingest.registration as registration

    reg = control.registrar
    assert reg.reserved == registration.RESERVED_PER_LOCAL_COLLECTOR * 2 and reg.max_open == 16
    sybil = [control.hello(pid=40_000 + i) for i in range(20)]  # from one address, none the head's own
    admitted = [w for w in sybil if "refused" not in w]
    assert len(admitted) == min(registration.MAX_PER_ADDRESS, reg.max_open - reg.reserved) == 6
    assert "address" in sybil[-1]["refused"], sybil[-1]
    for slot in (0, 1, 0, 1):  # the head's own collectors, restarted twice before their old registrations are reclaimed
        welcome = control.hello(pid=os.getpid(), slot=slot)
        assert "refused" not in welcome and welcome["slot"] == slot, welcome
    assert len(control.open) == 10


def test_a_re_registering_remote_collector_reuses_a_freed_slot(control) -> None:
    """A remote collector (no slot of its own) that registers again after its registration was reclaimed
    used to take a new slot past N each time: its epsilon drifted down the schedule and the slot count grew
    without bound. A freed slot is handed out again, lowest first."""
    slots = []
    for _ in range(10):
        welcome = control.hello(pid=777)
        slots.append(welcome["slot"])
        control.release(control.open[-1])
    assert slots == [2] * 10, slots
    first, second = control.hello(pid=1), control.hello(pid=2)
    assert (first["slot"], second["slot"]) == (2, 3)
    control.release(control.open[0])
    assert control.hello(pid=3)["slot"] == 2


def test_descriptors_are_shed_on_data_endpoints_too(head: Head, monkeypatch) -> None:
    """4,070 connections to a collector's data endpoint were never closed under descriptor pressure (the head
    shed its control and weights connections only): HELLOs went unanswered and the TensorBoard writer died of
    EMFILE. Short of descriptors, the head closes every connection of its TCP data endpoints too, binds them
    again on the same port once descriptors are back, and the owner's socket reconnects by itself."""
    import socket

    import shared.open_files as open_files

    host, port = open_files.split_tcp(head.welcome.data_endpoint)
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(20)]  # connections that never speak
    try:
        before = head.handled()
        head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
        head.wait_handled(before, 1)
        monkeypatch.setattr(open_files, "fds_left", lambda probe: 0)  # the process is out of descriptors
        for conn in idle:  # the head closes them: EOF (or a reset) instead of a timeout
            conn.settimeout(10)
            try:
                assert conn.recv(4096 * 4) is not None
                while conn.recv(4096):
                    pass
            except ConnectionResetError:
                pass
        monkeypatch.setattr(open_files, "fds_left", lambda probe: 1 << 30)  # descriptors are back
        before = head.handled()
        # the owner's socket reconnects to the same port by itself and, as a collector does, keeps sending heartbeats
        # (one sent while its connection was down may be lost: a gap, as after any reconnect)
        deadline = time.monotonic() + 20
        while head.handled() == before and time.monotonic() < deadline:
            head.send(P.encode_simple(P.HEARTBEAT, head.cid, head.next_seq(), 5))
            wait_for(lambda: head.handled() > before, 0.3, 0.01)
        assert head.handled() > before, "the owner's heartbeats never arrived after the data endpoint was bound again"
        assert head.thread.stats().rejected_by_reason == {}
    finally:
        for conn in idle:
            conn.close()
