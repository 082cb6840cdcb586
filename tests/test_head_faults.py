"""Faults around the head that are not a peer's doing: a full disk, a failed start, a collector
told to stop while it is still registering, and a replaced collector's registration."""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import zmq

import launcher.head as head_module
from launcher.head import Head, StopAt
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig
from shared.protocol import WELCOME, encode_json
from tests.support.cluster import ROOT, head_env

pytestmark = pytest.mark.slow


def cartpole(collectors: int = 0, **learner) -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=500),
        collectors=CollectorConfig(count=collectors, envs_per_collector=2, chunk_steps=16),
        replay=ReplayConfig(capacity=10_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=200, **learner),
        transport=TransportConfig(port=0),
    )


def test_a_failing_periodic_checkpoint_is_a_warning_and_the_run_goes_on(tmp_path, monkeypatch, caplog) -> None:
    """ENOSPC at every periodic checkpoint: warned and retried, the previous checkpoint kept, exit normal."""
    monkeypatch.setattr(head_module, "CHECKPOINT_RETRY_S", 0.2)
    head = Head(cartpole(collectors=1, checkpoint_every_s=0.3), tmp_path / "run")
    head.save_checkpoint()  # the last good one
    good = (tmp_path / "run" / "checkpoint" / "meta.json").read_bytes()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(head.learner, "save_checkpoint", full_disk)
    try:
        # the run goes on: it reaches its env-step budget (the collector's start-up may take long on a loaded
        # machine; the seconds limit only catches a run that stopped collecting)
        summary = head.run(StopAt(env_steps=3000, seconds=300.0), threading.Event())
    finally:
        head.close(checkpoint=False)
    assert summary["reason"] == "max_env_steps" and summary["env_steps"] >= 3000
    assert head.checkpoint_failures >= 3  # retried every CHECKPOINT_RETRY_S, not every loop turn
    assert "checkpoint failed" in caplog.text and "No space left on device" in caplog.text
    assert (tmp_path / "run" / "checkpoint" / "meta.json").read_bytes() == good


def _our_temp_dirs() -> set[str]:
    """The ipc folders in this test's own temp dir (tests/conftest.py): other heads cannot appear here."""
    return {p.name for p in Path(tempfile.gettempdir()).iterdir() if p.name.startswith(("mapx-", "mario-apex-"))}


def _below_ephemeral_ports() -> tuple[int, int]:
    """A port range the kernel never hands out for port 0 or an outgoing connection: a port found free there
    stays free until the head binds it, unless something binds that very number on purpose."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return max(1024, low - 12_000), low - 2


def _port_pair_with_one_taken(taken: int) -> tuple[socket.socket, int]:
    """A listening TCP socket holding port + taken (the head binds control on port, weights on port + 1); the
    other is free. A plain socket, not a ZeroMQ one: its close() frees the port before it returns, where a
    ZeroMQ socket's close leaves the unbinding to the context's I/O thread, which a loaded machine runs late."""
    low, high = _below_ephemeral_ports()
    for held in random.Random().sample(range(low + 1, high), 50):
        blocker = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        port = held - taken
        try:
            blocker.bind(("127.0.0.1", held))
            blocker.listen(1)
            probe.bind(("127.0.0.1", port + 1 - taken))  # the head's other port must be free
            return blocker, port
        except OSError:
            blocker.close()
        finally:
            probe.close()
    raise RuntimeError("no pair of adjacent free ports on 127.0.0.1")


@pytest.mark.timeout(120)  # a socket left open by a half-built part made the cleanup's term() wait forever
@pytest.mark.parametrize("taken", [0, 1], ids=["control_port_taken", "weights_port_taken"])
def test_a_failed_start_leaves_no_temp_folder_and_no_socket(tmp_path, taken: int) -> None:
    """The head fails after its replay and temp folders exist: at the control port (the publisher is up by
    then) or at the weights port (the publisher itself fails half-built)."""
    blocker, port = _port_pair_with_one_taken(taken)
    before = _our_temp_dirs()
    try:
        cfg = replace(cartpole(), transport=TransportConfig(port=port, local_transport="ipc"))  # with temp folders
        with pytest.raises(OSError):  # the head's TCP listeners are Python sockets (shared/open_files.py)
            Head(cfg, tmp_path / "run")
    finally:
        blocker.close()
    assert _our_temp_dirs() - before == set()
    # and the same ports work again right away: nothing of the failed head still holds them
    head = Head(replace(cartpole(), transport=TransportConfig(port=port)), tmp_path / "run2")
    head.close(checkpoint=False)


@pytest.mark.timeout(120)
def test_a_start_failing_after_the_threads_started_unwinds_like_a_close_without_a_checkpoint(tmp_path,
                                                                                              monkeypatch) -> None:
    """The last parts fail to build (the evaluator): the ingest and weights threads already run, the supervisor exists.
    The exit stack stops them, closes every socket and temp folder, and writes no checkpoint; the ports are free."""
    import threading

    class Broken(Exception):
        pass

    def broken_evaluator(*args, **kwargs):
        raise Broken("no evaluator")

    monkeypatch.setattr(head_module, "PeriodicEvaluator", broken_evaluator)
    before, threads = _our_temp_dirs(), set(threading.enumerate())
    cfg = replace(cartpole(), transport=TransportConfig(port=0, local_transport="ipc"))
    with pytest.raises(Broken):
        Head(cfg, tmp_path / "run")
    assert set(threading.enumerate()) - threads == set()  # consolidation and the publisher's threads joined
    assert _our_temp_dirs() - before == set()
    assert not (tmp_path / "run" / "checkpoint").exists() and not (tmp_path / "run" / "endpoints.json").exists()
    monkeypatch.undo()
    with Head(replace(cartpole(), transport=TransportConfig(port=0)), tmp_path / "run2") as head:
        assert head.endpoints["control"].startswith("tcp://127.0.0.1:")
    assert (tmp_path / "run2" / "checkpoint" / "meta.json").is_file()  # a close after a good start checkpoints
    assert not (tmp_path / "run2" / "endpoints.json").exists()


def test_port_0_binds_free_ports_and_reports_them(tmp_path) -> None:
    """--port 0: the head binds any free control and weights ports and says which (endpoints.json in the run dir,
    removed at exit), so nothing probes a port, releases it and hopes to bind it later."""
    import json

    from actors.client import register
    from launcher.head import ENDPOINTS_FILE

    head = Head(cartpole(), tmp_path / "run")
    try:
        endpoints = json.loads((tmp_path / "run" / ENDPOINTS_FILE).read_text())
        assert endpoints == head.endpoints
        for key in ("control", "weights"):
            port = int(endpoints[key].rsplit(":", 1)[1])
            with socket.socket() as probe, pytest.raises(OSError):  # the head holds it
                probe.bind(("127.0.0.1", port))
        with zmq.Context() as ctx:
            welcome = register(ctx, endpoints["control"], timeout_s=60)
        assert welcome.collector_id >= 1
    finally:
        head.close(checkpoint=False)
    assert not (tmp_path / "run" / ENDPOINTS_FILE).exists()


@contextmanager
def _collector_facing_a_fake_head(register_timeout_s: int) -> Iterator[tuple[zmq.Socket, subprocess.Popen]]:
    """A ROUTER standing in for the head, and a real collector process that has sent it HELLO."""
    with zmq.Context() as ctx:
        fake = ctx.socket(zmq.ROUTER)
        port = fake.bind_to_random_port("tcp://127.0.0.1")
        proc = subprocess.Popen([sys.executable, "-m", "actors", "--connect", f"tcp://127.0.0.1:{port}", "--slot", "0",
                                 "--parent-pid", str(os.getpid()), "--register-timeout", str(register_timeout_s)],
                                cwd=ROOT, env=head_env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert fake.poll(30_000), "the collector never sent HELLO"
            yield fake, proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            fake.close(0)


def test_a_collector_still_registering_exits_on_sigterm() -> None:
    """Nobody answers its HELLO; SIGTERM must end it, not --register-timeout: that is ten times the wait
    here, so a collector that ignored the signal would still be registering when the wait gives up."""
    with _collector_facing_a_fake_head(1200) as (_, proc):
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode in (0, 2), proc.stderr.read().decode()[-2000:]


@pytest.mark.parametrize("endpoint", ["garbage", "tcp://"], ids=["refused_by_the_checks", "refused_by_zeromq"])
def test_a_collector_given_an_unusable_welcome_exits_2_naming_it(endpoint: str) -> None:
    """A head (or an impostor) answers HELLO with a data endpoint no socket can use: the collector
    exits 2 with the reason, instead of hanging on the socket its failed link left open."""
    with _collector_facing_a_fake_head(60) as (fake, proc):
        identity = fake.recv_multipart()[0]
        welcome = {"collector_id": 1, "data_endpoint": endpoint, "data_token": "63" + "ab" * 16,
                   "weights_endpoint": "tcp://127.0.0.1:1", "epsilon": 0.1, "epsilons": [0.1],
                   "num_collectors": 1, "slot": 0, "config": cartpole().to_dict()}
        fake.send_multipart([identity, *encode_json(WELCOME, welcome, collector=1)])
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err.decode()[-2000:]
    assert "unusable WELCOME" in err.decode()


def test_a_killed_collector_leaves_the_live_set(tmp_path) -> None:
    """kill -9 a local collector: its registration is reclaimed at once; the replacement is the only live one."""
    head = Head(cartpole(collectors=1), tmp_path / "run")
    stop = threading.Event()
    runner = threading.Thread(target=head.run, args=(StopAt(seconds=600.0), stop))  # the test's stop ends it
    runner.start()
    try:
        deadline = time.monotonic() + 300  # a collector starting on a loaded 2-core machine, twice
        while not head.consolidation.stats().collectors:
            assert time.monotonic() < deadline, "the collector never registered"
            time.sleep(0.1)
        first = head.supervisor.pids()[0]
        os.kill(first, signal.SIGKILL)
        while head.consolidation.stats().registrations < 2 or len(head.consolidation.stats().collectors) != 1:
            assert time.monotonic() < deadline, head.consolidation.stats()
            time.sleep(0.1)
        live = head.consolidation.stats().collectors
        assert [c["pid"] for c in live.values()] != [first] and head.consolidation.stats().reclaimed == 1
    finally:
        stop.set()
        runner.join(30)
        head.close(checkpoint=False)


def test_a_stopped_collector_is_killed_as_stalled_and_replaced(tmp_path) -> None:
    """SIGSTOP a collector that is stepping: nothing holds its chunks, so after the stall timeout the supervisor
    kills it (a stall kill, not an exit) and a replacement registers; the test waits on those counters."""
    cfg = replace(cartpole(collectors=1), transport=TransportConfig(port=0, stall_timeout_s=3.0))
    head = Head(cfg, tmp_path / "run")
    stop = threading.Event()
    runner = threading.Thread(target=head.run, args=(StopAt(seconds=600.0), stop))
    runner.start()
    victim = 0
    try:
        deadline = time.monotonic() + 300
        while not any(c["chunks"] for c in head.consolidation.stats().collectors.values()):
            assert runner.is_alive() and time.monotonic() < deadline, "the collector never delivered a chunk"
            time.sleep(0.1)
        victim = head.supervisor.pids()[0]
        os.kill(victim, signal.SIGSTOP)
        while head.supervisor.stall_kills < 1 or head.consolidation.stats().registrations < 2:
            assert runner.is_alive() and time.monotonic() < deadline, (head.supervisor.stall_kills,
                                                                       head.consolidation.stats())
            time.sleep(0.1)
        assert victim not in head.supervisor.pids() and head.supervisor.restarts_total >= 1
    finally:
        stop.set()
        runner.join(60)
        head.close(checkpoint=False)
        if victim:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_checkpoints_taken_while_collectors_write_hold_what_the_head_counted(tmp_path, monkeypatch) -> None:
    """Periodic checkpoints while two collectors write: each one's replay holds exactly the transitions its
    counters say the head accepted (the replay was saved while the consolidation thread went on writing, so a
    checkpoint could hold a chunk its counters did not count, and a resumed run would carry the skew)."""
    import json

    head = Head(cartpole(collectors=2, checkpoint_every_s=0.2, save_replay=True), tmp_path / "run")
    seen: list[tuple[int, int]] = []
    real_save = head.learner.save_checkpoint

    def save_and_read(*args, **kwargs):  # the real save, then what it wrote (on the head's own thread: no race)
        path = real_save(*args, **kwargs)
        meta = json.loads((path / "meta.json").read_text())
        state = json.loads((path / "replay" / "state.json").read_text())
        seen.append((int(meta["counters"]["env_steps"]), int(state["transitions_added"])))
        return path

    monkeypatch.setattr(head.learner, "save_checkpoint", save_and_read)
    stop = threading.Event()
    runner = threading.Thread(target=head.run, args=(StopAt(seconds=600.0), stop))
    runner.start()
    try:
        deadline = time.monotonic() + 300
        while sum(1 for steps, _ in seen if steps > 0) < 30:  # checkpoints taken while data flowed
            assert runner.is_alive() and time.monotonic() < deadline, seen[-5:]
            time.sleep(0.1)
    finally:
        stop.set()
        runner.join(60)
        head.close(checkpoint=False)
    skewed = [(steps, added) for steps, added in seen if steps != added]
    assert not skewed, f"{len(skewed)} of {len(seen)} checkpoints: (head env_steps, replay transitions) {skewed[:5]}"


def test_a_data_plane_that_keeps_raising_stops_the_head_with_a_clear_error(tmp_path, monkeypatch, caplog) -> None:
    """A bug in writing chunks (numpy 2 once made every chunk raise) must not leave a run training on nothing
    while every chunk is lost: the head stops with reason consolidation_failed and says why."""
    monkeypatch.setattr(head_module, "CONSOLIDATION_FAILURE_ROUNDS", 5)
    head = Head(cartpole(collectors=1), tmp_path / "run")

    def broken(*args, **kwargs):
        raise OverflowError("Python integer -8 out of bounds for uint8")

    monkeypatch.setattr(head.replay, "add_chunks", broken)
    try:
        summary = head.run(StopAt(seconds=600.0), threading.Event())  # the failure ends it, not the time
    finally:
        head.close(checkpoint=False)
    assert summary["reason"] == "consolidation_failed" and summary["env_steps"] == 0
    assert head.consolidation.stats().errors >= 5
    assert re.search(r"failed \d+ times without accepting a chunk", caplog.text)
    assert "out of bounds for uint8" in caplog.text
    assert head_module.FAILURE_REASONS == {"consolidation_failed"}
