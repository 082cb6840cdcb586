"""Credit-based flow control (transport.max_chunks_in_flight) over real sockets and a real HeadLink.

Why it exists: with the insert gate shut, whatever sits in socket buffers is stale by the time
the learner reads it. Credits bound it by chunks, not bytes: a collector holds its next chunk
(and so stops stepping) until the head has read all but N of the earlier ones.
"""

from __future__ import annotations

import threading
import time

import zmq

from actors.client import HeadLink
from shared import protocol as P
from tests.support.ingest_head import TEMPLATE, Head, RecordingSink, counting_chunks, small_config
from tests.support.waits import wait_for


def _credits(sock: zmq.Socket, timeout_ms: int = 1000, until: int | None = None) -> list[int]:
    """CREDIT sequence numbers: until one reaches `until` (waiting up to timeout_ms for each), or, without
    `until`, every one that arrives within timeout_ms of the first poll (then 100 ms apart)."""
    out: list[int] = []
    while sock.poll(timeout_ms):
        header = P.decode_header(sock.recv_multipart()[0])
        assert header.msg_type == P.CREDIT
        out.append(header.seq)
        if until is not None:
            if header.seq >= until:
                break
        else:
            timeout_ms = 100
    return out


def test_collector_holds_chunks_beyond_the_credit_limit_until_the_head_reads() -> None:
    config = small_config(local_transport="tcp", max_chunks_in_flight=2, head_timeout_s=60.0)
    sink = RecordingSink()
    gate_open = threading.Event()  # shut: the learner is "behind", chunks are parked, not written
    head = Head(sink, config, raw_socket=False, may_insert=gate_open.is_set)
    stop = threading.Event()
    link = HeadLink(head.ctx, head.welcome, TEMPLATE, should_stop=stop.is_set)
    chunks = counting_chunks(6)
    results: list[bool] = []

    def send_all() -> None:
        for chunk in chunks:
            ok = link.send_chunk(chunk)
            results.append(ok)
            if not ok:
                return

    sender = threading.Thread(target=send_all)
    try:
        time.sleep(0.25)  # a round that began before the gate shut (poll up to 100 ms) has finished
        sender.start()
        assert wait_for(lambda: len(link.unacked_chunks) == 2, 60, 0.005), "the first two chunks were not sent"
        # meanwhile its heartbeats say it is waiting for the head, and the head holds its two chunks
        def held() -> bool:
            state = head.thread.stats().collectors[head.cid]
            return state["waiting"] and state["parked"] == 2 and head.thread.stats().heartbeats >= 1

        assert wait_for(held, 60, 0.01), head.thread.stats().collectors[head.cid]
        # two more "waiting" heartbeats: each comes from a round of the credit loop that polled the head and
        # found no credit, so the third chunk had its chances to go out, were credit not enforced
        beats = head.thread.stats().heartbeats
        assert wait_for(lambda: head.thread.stats().heartbeats >= beats + 2, 60, 0.01), "the collector went silent"
        assert head.thread.stats().collectors[head.cid]["waiting"]
        assert len(results) == 2, "a third chunk went out without credit"
        assert list(link.unacked_chunks) == [1, 2] and sink.chunks == []
        gate_open.set()
        sender.join(60)
        assert not sender.is_alive() and results == [True] * 6
        assert wait_for(lambda: len(sink.chunks) == 6, 60, 0.005), "not all six chunks reached the replay"

        def all_credited() -> bool:
            link.poll_head()
            return not link.unacked_chunks

        assert wait_for(all_credited, 60, 0.005), "the last credit never arrived"
        assert link.credit_wait_s > 0.4
        assert head.thread.stats().rejected == 0
    finally:
        stop.set()
        if sender.is_alive():
            sender.join(5)
        link.close()
        head.close()


def test_a_collector_waiting_for_credit_exits_on_stop() -> None:
    config = small_config(local_transport="tcp", max_chunks_in_flight=1, head_timeout_s=60.0)
    head = Head(RecordingSink(), config, raw_socket=False, may_insert=lambda: False)
    stop = threading.Event()
    link = HeadLink(head.ctx, head.welcome, TEMPLATE, should_stop=stop.is_set)
    try:
        time.sleep(0.25)
        chunks = counting_chunks(2)
        assert link.send_chunk(chunks[0])
        stop.set()
        assert link.send_chunk(chunks[1]) is False  # returns instead of waiting forever
        assert link.seq == 1
    finally:
        link.close()
        head.close()


def test_rejected_messages_are_credited_too() -> None:
    """A chunk the head refuses still leaves the collector's window, or a buggy chunk would wedge it."""
    config = small_config(max_chunks_in_flight=4)
    head = Head(RecordingSink(refuse=True), config)
    try:
        before = head.handled()
        for chunk in counting_chunks(3):
            head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 0))
        head.wait_handled(before, 3)
        assert head.thread.stats().rejected == 3
        assert max(_credits(head.push, timeout_ms=30_000, until=3)) == 3
    finally:
        head.close()


def test_no_credit_traffic_when_the_limit_is_off() -> None:
    # no acknowledgements: with the limit off a CREDIT is only the keep-alive every collectors.heartbeat_s
    head = Head(RecordingSink(), small_config().with_overrides(["collectors.heartbeat_s=60", "transport.head_timeout_s=120"]))
    try:
        before = head.handled()
        for chunk in counting_chunks(3):
            head.send(P.encode_chunk(chunk, head.cid, head.next_seq(), 0))
        head.wait_handled(before, 3)
        assert _credits(head.push, timeout_ms=300) == []
    finally:
        head.close()


def test_credit_is_a_header_only_message() -> None:
    parts = P.encode_simple(P.CREDIT, 7, 42)
    msg = P.decode(parts)
    assert (msg.header.msg_type, msg.header.collector, msg.header.seq) == (P.CREDIT, 7, 42)



def test_credits_on_or_off_a_keep_alive_reaches_every_data_socket() -> None:
    """A CREDIT at least every credit_every_s (the WELCOME's promise): how a collector learns its registration
    is alive, and from their absence that the head reclaimed it."""
    head = Head(RecordingSink(), small_config().with_overrides(["collectors.heartbeat_s=0.2"]), may_insert=lambda: False)
    try:
        assert head.welcome.credit_every_s == 0.2
        head.send(P.encode_chunk(counting_chunks(1)[0], head.cid, head.next_seq(), 0))  # parked: nothing to credit
        assert wait_for(lambda: head.thread.stats().parked == 1, 10, 0.005)
        seen: list[int] = []

        def three_keep_alives() -> bool:
            seen.extend(_credits(head.push, 100))
            return len(seen) >= 3

        assert wait_for(three_keep_alives, 30, 0.0)
        assert set(seen) == {0}  # the parked chunk (seq 1) is not acknowledged: they only say "alive"
    finally:
        head.close()
