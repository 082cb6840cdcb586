"""Two minutes of the fault soak (tests/hostile/soak.py): a CartPole head whose collectors are killed and stopped, which
takes poisoned chunks, deep HELLOs and foreign peers, runs once on a full disk, is killed once and resumed; the
replay stays valid, every acknowledged tagged chunk is stored exactly once, every rejection is one the soak
caused, and nothing is left behind. The 60-minute soak: `make soak` (BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import ROOT, head_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_two_minutes_of_faults_lose_nothing_acknowledged(tmp_path):
    report_path = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "tests.hostile.soak", "--minutes", "2", "--seed", "3",
                           "--workdir", str(tmp_path / "soak"), "--json", str(report_path)],
                          cwd=ROOT, env=head_env(), capture_output=True, text=True, timeout=1100)
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0 and report["ok"], json.dumps(report["failed"]) + proc.stderr[-2000:]
    kinds = [s["kind"] for s in report["segments"]]
    assert {"clean", "disk_full", "head_killed"} <= set(kinds) and kinds[-1] == "clean", kinds
    totals = report["totals"]
    for fault in ("collector_killed", "collector_stopped", "poisoned_chunk"):
        assert totals["faults"].get(fault, 0) > 0, totals["faults"]  # each kind of fault happened at least once
    assert totals["tagged_credited"] > 0 and sum(totals["rejections"].values()) > 0, totals
    for s in report["segments"]:  # the checks of what is left behind looked where the heads put their folders
        assert s["checks"]["head_temp_folders_where_the_soak_looks"], s
    clean = [s for s in report["segments"] if s["kind"] == "clean"]
    for s in clean:  # the checks that make a clean segment count
        for check in ("replay_valid", "replay_counts_what_the_head_accepted",
                      "tagged_never_twice", "tagged_acknowledged_stored_once", "no_temp_folder_left"):
            assert s["checks"].get(check) is True, (s["index"], check, s["checks"])
    disk_full = next(s for s in report["segments"] if s["kind"] == "disk_full")
    assert disk_full["exit_code"] == 3 and disk_full["checks"]["previous_checkpoint_untouched"]
    after_kill = report["segments"][kinds.index("head_killed") + 1]
    assert after_kill["checks"].get("killed_heads_temp_folders_removed") is True, after_kill["checks"]
    assert report["final"] == {"no_process_left": True, "no_temp_folder_left": True, "last_segment_clean": True}


def test_plan_runs_every_kind_even_when_the_machine_is_slower_than_planned(tmp_path):
    """The 2-minute plan on a machine where each segment overruns: no time is left after the first segment, yet
    the soak still runs one segment of each kind, in order, then a clean last one."""
    import argparse

    from tests.hostile.soak import KINDS, Soak

    soak = Soak(argparse.Namespace(seed=3, workdir=str(tmp_path / "w"), minutes=2.0, capacity=400_000))
    try:
        plans = []
        remaining = 30.0  # already nearly out of time after the first segment's startup
        for index in range(10):
            kind, seconds, last = soak.plan(remaining, index)
            plans.append(kind)
            assert seconds > 0
            remaining -= 60.0
            if last:
                break
        assert tuple(plans[:len(KINDS)]) == KINDS and plans[len(KINDS):] == ["clean"], plans
    finally:
        soak.ctx.destroy(linger=0)


def test_the_heads_tmpdir_is_a_folder_of_the_soak_s_own_even_when_every_path_is_too_long(tmp_path, own_tmpdir,
                                                                                         monkeypatch):
    """Too long a workdir and TMPDIR for unix socket paths: the soak's heads get a new soak-* folder under /tmp, never
    /tmp itself (where other heads' folders would count as leftovers, and which the soak removes when done)."""
    import tempfile

    from tests.hostile.soak import heads_tmpdir

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    got = heads_tmpdir(deep / "work")
    try:
        assert got.parent == Path("/tmp") and got.name.startswith("soak-") and got.is_dir() and not any(got.iterdir())
    finally:
        got.rmdir()
    short = heads_tmpdir(own_tmpdir / "w")  # a short enough workdir keeps its own t/
    assert short == own_tmpdir / "w" / "t" and short.is_dir()
