"""Real collector processes and sockets: exactly-once delivery, weights, shutdown paths."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import replace

import numpy as np
import pytest

import envs.testing  # noqa: F401
from envs.testing import decode_frame
from replay.buffer import ReplayBuffer
from shared.chunk import TransitionChunk, nstep_targets, stack_floors, stack_indices
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig
from shared.network import build_q_network
from shared.protocol import ObsSpec
from tests.support.cluster import launch_collectors
from tests.support.local_head import LocalHead
from tests.support.waits import wait_until

SPEC = ObsSpec((84, 84), np.dtype(np.uint8), 4)
EPISODE_LENGTH = 37


def counting_config(head_timeout_s: float = 5.0) -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id="ApeXCounting-v0", frame_stack=4),
        collectors=CollectorConfig(count=2, envs_per_collector=2, chunk_steps=8, heartbeat_s=0.2),
        replay=ReplayConfig(capacity=8192, n_step=3, gamma=0.99),
        learner=LearnerConfig(hidden=32),
        transport=TransportConfig(head_timeout_s=head_timeout_s),
    )


class TeeSink:
    """Forwards to the real ReplayBuffer and keeps what it accepted."""

    def __init__(self) -> None:
        self.buffer = ReplayBuffer(8192, (84, 84), np.uint8, 4, 3, 0.99)
        self.chunks: list[TransitionChunk] = []
        self.lock = threading.Lock()

    def add_chunks(self, chunks: list[TransitionChunk]) -> list[int | ValueError]:
        added = self.buffer.add_chunks(chunks)
        with self.lock:
            self.chunks.extend(c for c, a in zip(chunks, added, strict=True) if not isinstance(a, ValueError))
        return added

    def __len__(self) -> int:
        return len(self.chunks)


def starts_by_stream(chunks_by_collector: dict[int, list[TransitionChunk]]) -> dict[tuple[int, int], list]:
    """(collector, stream) -> [(episode, t)] of every transition start, in arrival order."""
    out: dict[tuple[int, int], list] = {}
    for cid, chunks in chunks_by_collector.items():
        for ch in chunks:
            t = nstep_targets(ch.actions, ch.rewards, ch.flags, ch.first_start, 3, 0.99)
            floors = stack_floors(ch.flags)
            stacks = stack_indices(t.starts, floors[t.starts], 4)
            for start, stack in zip(t.starts, stacks, strict=True):
                stream_seed, episode, step = decode_frame(ch.frames[start])
                # the stack is the episode's frames t-3..t, padded with its first frame
                decoded = [decode_frame(ch.frames[j])[1:] for j in stack]
                assert decoded == [(episode, max(0, step - k)) for k in (3, 2, 1, 0)]
                assert ch.rewards[start] == step % 7 + ch.actions[start]
                out.setdefault((cid, ch.stream), []).append((episode, step, stream_seed))
    return out


@pytest.mark.alone  # both collectors must register within fixed waits
def test_two_collectors_deliver_every_transition_exactly_once_in_order() -> None:
    cfg = counting_config()
    sink = TeeSink()
    with LocalHead(cfg, sink, SPEC, port=0) as head:
        proc = launch_collectors(head.connect, 2)
        try:
            wait_until(lambda: head.consolidation.stats().registrations == 2, 60, "2 registrations")
            net = build_q_network((84, 84), 4, 4, hidden=32)
            head.publisher.publish(1, net.state_dict())
            wait_until(lambda: head.consolidation.stats().transitions >= 1500, 90, "transitions")
            wait_until(lambda: all(c["weight_version"] == 1 for c in head.consolidation.stats().collectors.values()),
                     30, "collectors acting with published weights")
            head.publisher.stop_collectors()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
        stats = head.consolidation.stats()
    assert stats.rejected == 0 and stats.gaps == 0 and stats.episodes > 0 and stats.heartbeats > 0
    by_collector: dict[int, list[TransitionChunk]] = {}
    # chunks arrive per collector socket in order; the sink saw them in arrival order
    ids = sorted(stats.collectors)
    assert len(ids) == 2
    # attribute chunks to collectors by the stream seed in their frames (seed = 1000 * id + stream)
    for ch in sink.chunks:
        seed = decode_frame(ch.frames[0])[0]
        by_collector.setdefault(seed // 1000, []).append(ch)
    assert sorted(by_collector) == ids
    streams = starts_by_stream(by_collector)
    assert len(streams) == 4
    total = 0
    for (cid, stream), starts in streams.items():
        assert {s[2] for s in starts} == {1000 * cid + stream}
        pairs = [(e, t) for e, t, _ in starts]
        assert len(pairs) == len(set(pairs)), "duplicate transition"
        expected = [(e, t) for e in range(pairs[-1][0] + 1) for t in range(EPISODE_LENGTH)][: len(pairs)]
        assert pairs == expected, f"collector {cid} stream {stream}: not contiguous/in order"
        total += len(pairs)
    assert total == stats.transitions == sink.buffer.transitions_added
    sink.buffer.check_valid()


def test_collectors_exit_when_head_goes_silent_and_on_sigterm() -> None:
    cfg = counting_config(head_timeout_s=2.0)
    sink = TeeSink()
    head = LocalHead(cfg, sink, SPEC, port=0)
    silent = launch_collectors(head.connect, 1)
    try:
        wait_until(lambda: head.consolidation.stats().chunks >= 2, 60, "first chunks")
    finally:
        head.close()  # no more heartbeats
    # its launcher (this process) lives on: only the head's silence (head_timeout_s) can make it exit, and
    # exit 0 says it stopped by its own decision (the wait is generous: a loaded machine is slow, not wrong)
    assert silent.wait(timeout=120) == 0

    with LocalHead(cfg, TeeSink(), SPEC, port=0) as head2:
        proc = launch_collectors(head2.connect, 2)
        wait_until(lambda: head2.consolidation.stats().chunks >= 2, 60, "chunks")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_local_children_die_with_their_launcher() -> None:
    """SIGKILL the launcher: PR_SET_PDEATHSIG makes its collector exit instead of orphaning."""
    cfg = counting_config(head_timeout_s=1200.0)  # only the parent-death signal can stop it in time
    with LocalHead(cfg, TeeSink(), SPEC, port=0) as head:
        proc = launch_collectors(head.connect, 1)
        wait_until(lambda: head.consolidation.stats().chunks >= 1, 60, "chunks")
        child = next(iter(head.consolidation.stats().collectors.values()))["pid"]
        proc.kill()
        proc.wait(timeout=10)

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{child}/stat") as fh:  # reaped later by init: a zombie counts as gone
                return fh.read().split(")")[-1].split()[0] == "Z"

        wait_until(gone, 120, "child exit after its launcher died")


def test_collector_over_curve(tmp_path) -> None:
    """Every socket encrypted: registration, data, weights and heartbeats all pass CURVE."""
    from shared.keys import generate

    keys = generate(tmp_path / "keys")
    cfg = replace(counting_config(), transport=TransportConfig(head_timeout_s=5.0, curve_keys_dir=str(keys)))
    with LocalHead(cfg, TeeSink(), SPEC, port=0) as head:
        proc = launch_collectors(head.connect, 1, "--curve-keys", str(keys))
        try:
            wait_until(lambda: head.consolidation.stats().chunks >= 3, 60, "chunks over CURVE")
            head.publisher.publish(2, build_q_network((84, 84), 4, 4, hidden=32).state_dict())
            wait_until(lambda: all(c["weight_version"] == 2 for c in head.consolidation.stats().collectors.values()),
                     30, "weights over CURVE")
            head.publisher.stop_collectors()
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
        assert head.consolidation.stats().rejected == 0
