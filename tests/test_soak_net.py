"""Two minutes of the multi-host fault soak (tests/hostile/soak_net.py): a CURVE head and remote collectors on two
namespace hosts through a long partition, a reset and a head killed and resumed on its port (the first faults of
every schedule), then what else fits; every invariant of the report holds and nothing is left behind. Ctrl-C of a
soak in full swing leaves nothing behind either. The 30-minute soak: `make soak-net`.
Needs root and iproute2 (`ip netns`); skipped with the reason where namespaces cannot be made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile import netns
from tests.support.cluster import ROOT, head_env
from tests.support.waits import wait_for, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INVARIANTS = ("acknowledged_stored_once", "never_twice", "checkpoint_after_faults", "kill_loses_only_after_checkpoint",
              "recovered_within_bound", "collectors_came_back_by_themselves", "weights_newest_after_fault",
              "rejections_only_from_faults", "gaps_only_after_resets", "memory_bounded", "head_exit_clean",
              "replay_counts_what_the_head_accepted", "nothing_left_behind")


@pytest.fixture
def namespaces():
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"{reason}: multi-host soak not run")
    try:
        with netns.HostNet(1):
            pass
    except OSError as exc:
        pytest.skip(f"network namespaces not permitted here ({exc})")


def _soak(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.hostile.soak_net", "--json", str(tmp_path / "soak.json"),
                             *args], cwd=ROOT, env=head_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _processes_naming(*texts: str) -> list[int]:
    """Live processes whose command line contains every one of `texts`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if all(t in cmdline for t in texts) and state != "Z":
                found.append(int(entry.name))
    return found


def _owned(pid: int) -> list[str]:
    return [n for n in netns.namespaces() + netns.root_links() if n.startswith(f"{netns.PREFIX}{pid}")]


def test_two_minutes_of_network_faults_lose_nothing_acknowledged(namespaces, tmp_path):
    work = tmp_path / "work"
    proc = _soak(tmp_path, "--minutes", "2", "--seed", "5", "--workdir", str(work))
    try:
        out, _ = proc.communicate(timeout=840)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    report_path = tmp_path / "soak.json"
    assert report_path.exists(), out[-4000:]
    report = json.loads(report_path.read_text())
    failed = {k: v for k, v in report["invariants"].items() if not v["ok"]}
    assert proc.returncode == 0 and report["ok"], json.dumps(failed, indent=1)[:6000] + out[-2000:]
    kinds = [f["kind"] for f in report["schedule"]]
    assert {"partition", "reset", "head_kill"} <= set(kinds), kinds
    assert any(f["kind"] == "partition" and f["seconds"] > report["head_timeout_s"] for f in report["faults"])
    for name in INVARIANTS:  # each one was judged, and held
        assert report["invariants"].get(name, {}).get("ok") is True, (name, report["invariants"].get(name))
    kill = next(f for f in report["faults"] if f["kind"] == "head_kill")
    assert kill["checks"]["head_restarted_on_its_port"] and kill["recovered_after_s"] <= kill["bound_s"], kill
    totals = report["totals"]
    assert totals["head_generations"] >= 2 and totals["tagged_credited"] > 100, totals
    assert totals["registrations_reclaimed"] >= 2, totals  # the long partition's registrations, at least
    assert all(not v for v in report["final"]["leftovers"].values()), report["final"]["leftovers"]
    assert not _processes_naming(str(work)), _processes_naming(str(work))
    assert not _owned(proc.pid), _owned(proc.pid)


def test_ctrl_c_leaves_nothing_behind(namespaces, tmp_path):
    """SIGINT while the head and the remote collectors run: exit 130, a report, no namespace, link, process or
    work folder left."""
    proc = _soak(tmp_path, "--minutes", "5", "--seed", "2")
    try:
        # its head and collectors name its work folder (a new soak-net-* folder) on their command lines
        wait_until(lambda: proc.poll() is not None or (_owned(proc.pid) and _processes_naming("soak-net-", "-m launcher")
                                                       and _processes_naming("soak-net-", "-m actors")), 240,
                   "the soak's namespaces, head and collectors")
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out[-3000:]
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["interrupted"] and not report["ok"]
    assert all(not v for v in report["final"]["leftovers"].values()), report["final"]["leftovers"]
    assert wait_for(lambda: not _owned(proc.pid), 30), _owned(proc.pid)
    assert not Path(report["workdir"]).exists(), report["workdir"]
    assert not _processes_naming(report["workdir"]), _processes_naming(report["workdir"])


def test_schedule_starts_with_the_faults_every_soak_needs_and_repeats_with_its_seed():
    from itertools import islice

    from tests.hostile.soak_net import FIRST, OTHERS, schedule

    faults = list(islice(schedule(5, 2), 12))
    kinds = [f.kind for f in faults]
    assert kinds[:3].count("partition") == 1 and {"reset", "head_kill"} <= set(kinds[:3]), kinds
    long = next(f for f in faults[:3] if f.kind == "partition")
    assert long.params["past_head_timeout"], long  # the first partition outlasts transport.head_timeout_s
    assert set(kinds[3:3 + len(OTHERS)]) == set(OTHERS), kinds  # then one of every other kind
    assert [f.to_json() for f in islice(schedule(5, 2), 12)] == [f.to_json() for f in faults]
    assert [f.to_json() for f in islice(schedule(6, 2), 12)] != [f.to_json() for f in faults]
    assert len(FIRST) == 3


def test_judging_a_replay_finds_chunks_stored_twice_in_part_or_not_at_all():
    """The accounting can fail: a chunk acknowledged before the checkpoint and absent, one stored twice, one torn;
    a chunk acknowledged after the checkpoint, or excused (lost with a killed head, maybe overwritten), is not owed."""
    from collections import Counter
    from types import SimpleNamespace

    from tests.hostile.soak_net import FRAMES_PER_CHUNK, judge_tagged

    tagged = SimpleNamespace(credit_time={1: 10.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 30.0, 6: 10.0})
    copies = Counter({1: FRAMES_PER_CHUNK, 2: 2 * FRAMES_PER_CHUNK, 3: FRAMES_PER_CHUNK - 4, 7: FRAMES_PER_CHUNK})
    wrong = judge_tagged(tagged, copies, written_at=20.0, excused={6})
    assert wrong == {"twice": [2], "torn": [3], "missing": [2, 3, 4]}, wrong
    assert judge_tagged(tagged, Counter({n: FRAMES_PER_CHUNK for n in range(1, 7)}), 20.0, set()) == \
        {"twice": [], "torn": [], "missing": []}
