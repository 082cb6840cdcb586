"""Collectors on two other "machines" behind faulty networks: partitions, latency with jitter, a bandwidth cap, a
stall and connection resets, then a partition longer than transport.head_timeout_s.

The head runs in the root namespace, bound to a veth address with CURVE keys, port 0, no local collectors. Each
of two collector hosts (tests/hostile/netns.py) runs a real collector (`python -m actors --connect ...
--curve-keys ...`) and the soak's tagged collector (tests/hostile/soak.py: complete episodes whose frames name their
chunk, acknowledged by CREDIT), and reaches the head only through its router, where a transparent proxy
(tests/hostile/fault_proxy.py) carries every connection, the data sockets the WELCOME names included. Faults,
one after the other: a partition of 5 s, latency 50-300 ms (175 +- 125 ms) with a 64 KB/s cap, a stall of 4 s
(connections held, nothing forwarded), a reset of every connection. After each: every collector is still
registered (no registration reclaimed, none new), data keeps arriving from each one through its proxy, the head
counts no sequence gap (after the reset: gaps only where a reset connection lost messages) and rejects nothing.
At the end: every chunk the head acknowledged to a tagged collector is in the checkpoint's replay exactly once
(a chunk in flight at the reset at most once), none twice, and the replay holds what the head counted.

The last fault partitions host 0 for longer than transport.head_timeout_s. What the protocol says happens, and
this test checks: host 0's collector notices the head's silence after head_timeout_s and leaves its registration
(logged "(head_silent)", also when the silence found it waiting for credit, as it usually does), the head reclaims
both of host 0's registrations (one reclaim each, logged), and once the link is back the real collector, the same
process, registers again by itself (a new collector id) within REJOIN_S and its data arrives again; host 0's
tagged collector does what the protocol asks of it (a new registration, nothing unacknowledged sent again), so the
accounting covers a rejoin; host 1's collectors are unaffected.
Needs root and iproute2 (`ip netns`); skipped with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.hostile.netns import HostNet, unavailable
from tests.hostile.remote_cluster import (
    HEAD_TIMEOUT_S,
    RECLAIMED,
    Cluster,
)
from tests.hostile.soak import TAG_STEPS, TAG_X
from tests.support.cluster import ROOT, stop_head
from tests.support.waits import wait_until

pytestmark = pytest.mark.slow

PARTITION_S = 5.0
LATENCY_S = 6.0
STALL_S = 4.0
LONG_PARTITION_S = HEAD_TIMEOUT_S + 5.0
RECOVER_S = 45.0  # how long data may take to flow again after a fault ends, on a loaded machine
# how long after the heal the partitioned collector may take to register again: its first HELLO goes out at once,
# the kernel resends the SYN of its pending connection within a few seconds, then envs and sockets are set up
REJOIN_S = 45.0




# ---------------------------------------------------------------------------- fixtures
@pytest.fixture
def net():
    reason = unavailable()
    if reason:
        pytest.skip(f"{reason}: multi-host fault test not run")
    hostnet = HostNet(2)
    try:
        hostnet.start()
    except OSError as exc:
        hostnet.close()
        pytest.skip(f"network namespaces not permitted here ({exc})")
    try:
        yield hostnet
    finally:
        hostnet.close()
        assert hostnet.leftovers() == [], hostnet.leftovers()


@pytest.fixture
def cluster(net, tmp_path):
    c = Cluster(net, tmp_path)
    try:
        yield c
    finally:
        c.close()


def _rejections(row: dict) -> dict[str, int]:
    return {k: v for k, v in row.get("rejected_by_reason", {}).items() if v}


def _after_fault(c: Cluster, name: str, since: dict, registered: list[int], hosts: list[int], gaps: int | None,
                 log: list[str], rejected: dict[str, int] | None = None) -> dict:
    """The checks after each fault; returns the snapshot that starts the next phase. `gaps`: the sequence gaps
    the head must have counted so far (None: not checked); `rejected`: the rejections it must have counted."""
    wait_until(lambda: c.flowing(since, hosts), RECOVER_S, f"data from every collector again after the {name}")
    wait_until(lambda: c.row().get("time", 0) > time.time() - 0.5, 10, "a metrics row after the data")  # not stale
    row, now = c.row(), c.snapshot()
    log.append(f"{name}: recovered in {now['time'] - since['time']:.1f} s, env_steps {now['env_steps']}, "
               f"gaps {row.get('gaps')}, rejected {_rejections(row)}, alive {row.get('collectors_alive')}, "
               f"tagged credited {now['credited']}, real bytes up {now['bytes']}")
    assert now["registrations"] == registered, f"{name}: registrations changed {registered} -> {now['registrations']}"
    assert row.get("registrations_reclaimed") == 0, f"{name}: {row.get('registrations_reclaimed')} reclaimed"
    assert row.get("collectors_alive") == len(registered), f"{name}: {row.get('collectors_alive')} alive"
    assert _rejections(row) == (rejected or {}), f"{name}: rejected {_rejections(row)}, expected {rejected or {}}"
    if gaps is not None:
        assert row.get("gaps") == gaps, f"{name}: {row.get('gaps')} sequence gaps, expected {gaps}"
    assert all(p.poll() is None for p in c.collectors), f"{name}: a collector exited\n{c.head_out()}"
    return now


# ---------------------------------------------------------------------------- the tests
def test_collectors_ride_out_partition_latency_stall_and_reset(cluster, net, capsys):
    c = cluster
    log: list[str] = []
    started = time.monotonic()
    c.start()
    zero = {"bytes": [0, 0], "credited": [0, 0], "env_steps": 0, "time": started}
    wait_until(lambda: len(c.registrations()) == 4 and c.flowing(zero, [0, 1]), 240,
               "both hosts' collectors registered and delivering")
    registered = sorted(c.registrations())
    for i in (0, 1):
        assert len(c.real_ids(i)) == 1, c.registrations()
    assert all(p.ports() == c.proxies[0].ports() and len(p.ports()) >= 6 for p in c.proxies), \
        [p.ports() for p in c.proxies]  # control, weights, four data ports: every one of them proxied
    _after_fault(c, "start", c.snapshot() | {"bytes": [0, 0], "credited": [0, 0], "env_steps": 0},
                        registered, [0, 1], 0, log)

    # a partition shorter than head_timeout_s: TCP holds on, nothing is lost or repeated
    net.partition(0)
    net.partition(1)
    time.sleep(PARTITION_S)
    net.heal(0)
    net.heal(1)
    _after_fault(c, "partition", c.snapshot(), registered, [0, 1], 0, log)

    # latency 50-300 ms with jitter, and a 64 KB/s link each way
    for proxy in c.proxies:
        proxy.set_latency(175, 125)
        proxy.set_bandwidth(64_000)
    during = c.snapshot()
    wait_until(lambda: c.flowing(during, [0, 1]), RECOVER_S, "data through latency and the bandwidth cap")
    time.sleep(max(0.0, LATENCY_S - (time.monotonic() - during["time"])))
    for proxy in c.proxies:
        proxy.set_latency(0)
        proxy.set_bandwidth(None)
    _after_fault(c, "latency", c.snapshot(), registered, [0, 1], 0, log)

    # a stall: connections held open, nothing forwarded either way
    for proxy in c.proxies:
        proxy.stall()
    stalled = c.snapshot()
    time.sleep(STALL_S)
    assert c.snapshot()["bytes"] == stalled["bytes"], "bytes got through a stalled proxy"
    for proxy in c.proxies:
        proxy.resume()
    _after_fault(c, "stall", c.snapshot(), registered, [0, 1], 0, log)

    # every connection reset (RST to both ends): what was in flight may be lost, as a counted gap, never repeated
    with contextlib.ExitStack() as held:
        for tagged in c.tagged:
            held.enter_context(tagged.lock)  # no chunk is sent between noting what is in flight and the reset
            tagged.note_in_flight()
            log.append(f"reset: tagged collector {tagged.segment} had {sorted(tagged.in_flight)} in flight")
        resets = sum(proxy.reset_all() for proxy in c.proxies)
    assert resets >= 4, resets  # at least every data connection, and the weights ones
    since = c.snapshot()
    wait_until(lambda: c.flowing(since, [0, 1]), RECOVER_S, "data from every collector again after the reset")
    time.sleep(2.0)  # the summaries of episodes a lost chunk held: judged when their stream's next ends arrive
    row = c.row()
    gaps_after_reset, rejected = row.get("gaps", 0), _rejections(row)
    assert gaps_after_reset <= 4, gaps_after_reset  # at most one lost run of messages per data connection
    # a chunk lost with its connection takes episode ends with it: the summaries of those episodes match
    # nothing inserted (episode_mismatch), which is the only rejection a lost message may cause
    assert set(rejected) <= {"episode_mismatch"} and sum(rejected.values()) <= 8 * gaps_after_reset, rejected
    _after_fault(c, "reset", since, registered, [0, 1], gaps_after_reset, log, rejected)

    # a partition longer than head_timeout_s, of host 0 only: host 0's collector rejoins (see the module docstring)
    real0, tagged0, pid0 = c.real_ids(0)[0], c.tagged[0].collector_id, c.collector_pid(0)

    def out0() -> str:
        return (c.tmp / "collector0.out").read_text(errors="replace")

    t0 = time.monotonic()
    net.partition(0)
    wait_until(lambda: "registering again" in out0() or time.monotonic() >= t0 + LONG_PARTITION_S,
               LONG_PARTITION_S + 30, "host 0's collector noticing the head's silence or the long partition ending")
    noticed_after = time.monotonic() - t0 if "registering again" in out0() else None
    time.sleep(max(0.0, t0 + LONG_PARTITION_S - time.monotonic()))
    net.heal(0)
    healed = time.monotonic()
    c.tagged[0].reconnect()  # a new registration; what the lost one holds unacknowledged is never sent again
    wait_until(lambda: len(c.real_ids(0)) == 2 or c.collectors[0].poll() is not None, REJOIN_S,
               "host 0's collector registering again after the heal")
    rejoined_after = time.monotonic() - healed
    assert c.collectors[0].poll() is None and c.collector_pid(0) == pid0, out0()[-2000:]  # the same process
    after = c.snapshot()
    wait_until(lambda: c.flowing(after, [0, 1]), RECOVER_S, "data from every collector after the long partition")
    flowing_after = time.monotonic() - healed
    reclaimed = sorted(int(cid) for cid, _ in RECLAIMED.findall(c.head_log()))
    log.append(f"long partition {LONG_PARTITION_S:.0f} s: host 0's collector {real0} noticed the silence after "
               f"{noticed_after if noticed_after is None else round(noticed_after, 1)} s, registered again as "
               f"{c.real_ids(0)[1:]} {rejoined_after:.1f} s after the heal, data flowing {flowing_after:.1f} s after "
               f"it; head reclaimed {reclaimed} (tagged {tagged0}); host 0's lines: "
               + " | ".join(line[-160:] for line in out0().splitlines()
                            if "exiting" in line or "registration" in line or "registering" in line))
    assert c.collectors[0].poll() is None and c.collector_pid(0) == pid0, out0()[-2000:]
    assert noticed_after is not None and HEAD_TIMEOUT_S - 1 <= noticed_after <= HEAD_TIMEOUT_S + 6, noticed_after
    # head silence met while it waited for credit is reported as head_silent, as anywhere else
    assert re.search(rf"collector {real0} leaves this registration \(head_silent\)", out0()), out0()[-2000:]
    assert "(send)" not in out0(), out0()[-2000:]
    assert reclaimed == sorted([real0, tagged0]), reclaimed  # both of host 0's registrations, each once
    new0 = c.real_ids(0)
    assert len(new0) == 2 and new0[0] == real0 and new0[1] > real0, new0
    assert sorted(c.registrations()) == sorted([*registered, new0[1], c.tagged[0].collector_id]), c.registrations()
    wait_until(lambda: c.row().get("time", 0) > time.time() - 0.5, 10, "a metrics row after the data")
    row = c.row()
    assert row.get("registrations_reclaimed") == 2 and row.get("collectors_alive") == 4, row
    assert row.get("gaps") == gaps_after_reset, "the long partition made sequence gaps"  # a new socket starts at 1
    assert _rejections(row) == rejected, (_rejections(row), rejected)
    assert c.collectors[1].poll() is None

    # the end: the tagged collectors' every acknowledged chunk stored exactly once
    for tagged in c.tagged:
        tagged.finish()
    assert stop_head(c.head) == 0, c.head_out()
    _check_replay(c, log)
    log.append(f"wall time {time.monotonic() - started:.0f} s")
    with capsys.disabled():
        print("\n" + "\n".join(f"[multihost faults] {line}" for line in log))


def _check_replay(c: Cluster, log: list[str]) -> None:
    """The soak's accounting (tests/hostile/soak.py): chunks credited to a tagged collector are in the replay once each,
    a chunk in flight at the reset at most once, none twice; the replay holds what the head counted."""
    ckpt = c.run_dir / "checkpoint"
    meta = json.loads((ckpt / "meta.json").read_text())
    state = json.loads((ckpt / "replay" / "state.json").read_text())
    assert state["transitions_added"] == meta["counters"]["env_steps"], (state["transitions_added"], meta["counters"])
    frames = np.load(ckpt / "replay" / "frames.npy")
    for tagged in c.tagged:
        assert not tagged.errors, tagged.errors
        mine = frames[(frames[:, 0] == TAG_X) & (frames[:, 1] == np.float32(tagged.segment / 128))]
        copies = Counter(np.rint(mine[:, 2] * 65536).astype(np.int64).tolist())
        twice = sorted(n for n, k in copies.items() if k > TAG_STEPS + 1)
        missing = sorted(n for n in tagged.credited - tagged.in_flight if copies.get(n, 0) != TAG_STEPS + 1)
        lost = sorted(n for n in tagged.in_flight if copies.get(n, 0) == 0)
        log.append(f"tagged collector {tagged.segment}: sent {tagged.sent}, credited {len(tagged.credited)}, "
                   f"in flight at the reset or when it closed {sorted(tagged.in_flight)}, lost {lost}")
        assert tagged.sent > 20 and len(tagged.credited) >= tagged.sent - 2, (tagged.sent, len(tagged.credited))
        assert not twice, f"stored twice: {twice[:10]}"
        assert not missing, f"acknowledged and not stored: {missing[:10]}"


_HARNESS = """
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from tests.hostile.netns import HostNet
net = HostNet(2)
net.start()
sleeper = net.popen(net.host(1).ns, ["sleep", "600"])
adopted = subprocess.Popen(["sleep", "600"])
net.adopt(adopted)
print(net.tag, sleeper.pid, adopted.pid, flush=True)
time.sleep(600)
"""


def test_hostnet_leaves_nothing_behind_when_its_process_is_killed(tmp_path):
    """SIGKILL of the harness process: its guardian removes the namespaces and links and kills what ran in them
    and what it adopted; a HostNet closed normally leaves nothing either."""
    reason = unavailable()
    if reason:
        pytest.skip(f"{reason}: namespace harness test not run")
    from tests.hostile import netns

    proc = subprocess.Popen([sys.executable, "-c", _HARNESS, str(ROOT)], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline().split()
        if not line:
            proc.wait(30)
            pytest.skip("network namespaces not permitted here (the harness could not build its network)")
        tag, pids = line[0], [int(p) for p in line[1:]]
        owned = [n for n in netns.namespaces() + netns.root_links() if n.startswith(tag)]
        assert len(owned) == 6, owned  # 2 hosts x (host, router, uplink)
        proc.kill()
        proc.wait(10)

        def gone() -> bool:
            return (not [n for n in netns.namespaces() + netns.root_links() if n.startswith(tag)]
                    and not [p for p in pids if Path(f"/proc/{p}").exists()
                             and "sleep" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")])
        wait_until(gone, 60, f"{tag}'s namespaces, links and processes removed")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with HostNet(1) as hostnet:
        assert len(hostnet.leftovers()) == 3
    assert hostnet.leftovers() == []
