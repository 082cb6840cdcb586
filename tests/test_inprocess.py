"""The in-process mode (`make run ARGS="--inprocess ..."`): the whole topology in one process, collectors
as threads, every message still encoded and decoded by the real protocol over inproc:// sockets."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from launcher.cli import parse_args
from launcher.head import Head, StopAt

pytestmark = pytest.mark.slow


def test_cartpole_trains_in_one_process(tmp_path) -> None:
    cfg, opts = parse_args(["--env", "CartPole-v1", "--profile", "cpu", "--inprocess", "--collectors", "2",
                            "--run-dir", str(tmp_path / "run"), "--port", "0"])
    assert opts.inprocess
    cfg = replace(cfg, learner=replace(cfg.learner, warmup_transitions=500))
    before = {t.name for t in threading.enumerate()}
    head = Head(cfg, opts.run_dir, inprocess=True)
    try:
        assert head.consolidation.control_endpoint.startswith("inproc://")
        # the step budget ends the run; the time limit only bounds a broken one (a loaded 2-core machine has
        # run this topology at 26 env steps/s, i.e. ~60 s for these 1,500 past the 500 of warm-up)
        summary = head.run(StopAt(env_steps=2_000, seconds=480), threading.Event())
        stats = head.consolidation.stats()
        live = list(stats.collectors.values())
    finally:
        head.close()
    assert summary["reason"] == "max_env_steps", summary
    assert summary["updates"] > 0 and summary["episodes"] > 0 and summary["restarts"] == 0
    # both collectors registered through HELLO/WELCOME and sent real chunks over their own sockets
    assert stats.registrations == 2 and {c["slot"] for c in live} == {0, 1}
    assert stats.chunks > 0 and stats.rejected == 0 and stats.heartbeats > 0
    assert sorted(stats.transitions_by_slot) == [0, 1]
    assert (tmp_path / "run" / "checkpoint" / "meta.json").is_file()
    leftover = {t.name for t in threading.enumerate() if t.is_alive()} - before
    assert not {n for n in leftover if n.startswith(("collector-", "consolidation", "weight-publisher"))}, leftover
