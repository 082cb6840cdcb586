"""A collector the head's supervisor does not own (a remote one, or any started by hand) whose registration
the head reclaims: it learns so from its data socket and registers again, instead of blocking until stopped.

The head promises a CREDIT on every data socket at least every `credit_every_s` (the WELCOME says so); a
collector that still hears the head's weights socket transport.head_timeout_s after its last CREDIT knows its
registration is gone; a head that stopped altogether is head silence instead (docs/PROTOCOL.md, "Registrations
end" and "Liveness and shutdown")."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.head import Head, StopAt
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig
from tests.support.cluster import ROOT, head_env
from tests.support.waits import wait_for

pytestmark = pytest.mark.slow


def config() -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=500),
        collectors=CollectorConfig(count=0, envs_per_collector=2, chunk_steps=16, heartbeat_s=0.5),
        replay=ReplayConfig(capacity=10_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=10_000_000),
        transport=TransportConfig(port=0, head_timeout_s=3.0, max_chunks_in_flight=0),
    )


def test_a_reclaimed_collector_learns_it_and_registers_again(tmp_path: Path) -> None:
    head = Head(config(), tmp_path / "run")
    stop = threading.Event()
    runner = threading.Thread(target=head.run, args=(StopAt(seconds=600.0), stop))
    log = tmp_path / "collector.log"
    proc = None
    try:
        runner.start()
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "actors", "--connect", head.consolidation.control_endpoint,
                                     "--slot", "0"], cwd=ROOT, env=head_env(), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)

        def live() -> dict:
            return head.consolidation.stats().collectors

        def flowing(after: int = 0) -> list[int]:
            """Registrations of the collector, newer than `after`, whose data reached the replay."""
            return [cid for cid, c in live().items() if cid > after and c["pid"] == proc.pid and c["transitions"] > 0]

        assert wait_for(lambda: flowing() or proc.poll() is not None, 120), log.read_text()[-3000:]
        first = flowing()[-1]
        head.consolidation.forget(first)  # the head reclaims it (as after head_timeout_s of silence)
        assert wait_for(lambda: first not in live(), 30)
        # it registers again by itself and its data flows on the new registration
        assert wait_for(lambda: flowing(first) or proc.poll() is not None, 120), log.read_text()[-3000:]
        assert proc.poll() is None, log.read_text()[-3000:]
        stats = head.consolidation.stats()
        assert stats.registrations > first and stats.reclaimed >= 1
        text = log.read_text()
        assert "the head reclaimed this registration" in text and "registering again" in text, text[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        stop.set()
        runner.join(120)
        head.close(checkpoint=False)
