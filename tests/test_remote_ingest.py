"""The remote-ingest measurement (tests/hostile/remote_ingest.py) at its smallest: one collector per transport.

Checks the report's shape, that chunks really moved over both transports (CURVE over veth links from a network
namespace, loopback without CURVE), and that the run left nothing behind: no namespace or link of its own, no
process it started (found by a marker in their environment), no temp folder. Rates are not judged: they depend
on the machine and its load. Needs root and iproute2; skipped with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.hostile import netns
from tests.hostile.remote_ingest import TRANSPORTS, leftovers
from tests.support.cluster import ROOT
from tests.support.waits import wait_until

pytestmark = pytest.mark.slow  # as the multi-host fault tests


def _marked(marker: str) -> list[int]:
    """Live processes whose environment holds `marker`."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_both_transports_ingest_and_nothing_is_left_behind(tmp_path):
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"{reason}: remote ingest measurement not run")
    out = tmp_path / "remote_ingest.json"
    marker = f"REMOTE_INGEST_TEST={uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), marker.split("=")[0]: marker.split("=")[1]}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.hostile.remote_ingest", "--collectors", "1", "--seconds", "2.5",
         "--sender-processes", "1", "--profile", "cpu", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    if proc.returncode == 2 and "network namespaces could not be made" in proc.stderr:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())

    assert report["ok"] and not report["error"] and not report["interrupted"], report.get("error")
    assert report["commit"] and report["date"] and report["machine"]["cores"] >= 1 and "cpu_model" in report["machine"]
    settings = report["settings"]
    assert settings["collectors"] == [1] and settings["seconds"] == 2.5 and settings["rate"] == "unthrottled"
    assert settings["order"] == [f"{t}:1" for t in TRANSPORTS]
    rows = {r["transport"]: r for r in report["rows"]}
    assert sorted(rows) == sorted(TRANSPORTS) and len(report["rows"]) == 2
    for transport, row in rows.items():
        assert row["collectors"] == 1 and row["open_registrations"] == 1, row
        assert row["ingested_tps"] > 0 and row["sender_sent_transitions"] > 0, row
        assert row["rejected"] == 0 and row["gaps"] == 0, row
        for key in ("head_cpu_us_per_transition", "tps_per_head_core", "ingest_thread_cpu_us_per_transition",
                    "zmq_io_cpu_frac", "sender_cpu_us_per_transition"):
            assert row[key] is not None and row[key] > 0, (transport, key, row[key])
    assert rows["curve_veth"]["endpoint"].startswith(f"tcp://{settings['head_address']['curve_veth']}:")
    assert rows["loopback"]["endpoint"].startswith("tcp://127.0.0.1:")
    (ratio,) = report["ratios_curve_veth_over_loopback"]
    assert ratio["collectors"] == 1 and ratio["ingested_tps"] > 0
    assert "curve_veth" in proc.stdout and "loopback" in proc.stdout and "N=1:" in proc.stdout

    # nothing left: the run's namespaces and links, its processes (the guardian included), its temp folder
    tag = settings["netns_tag"]
    assert tag.startswith(netns.PREFIX) and report["leftovers"] == []
    assert leftovers(tag) == []
    wait_until(lambda: not _marked(marker), 30, "every process the run started gone")
    assert not Path(settings["workdir"]).exists()
