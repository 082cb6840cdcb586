"""The cluster end to end: real head, real collector processes, real sockets, real torch.

These run `python -m launcher` exactly as `make run ARGS=...` does, then check what a user would:
exit status, metrics growing, a checkpoint, restart after faults, and no process left behind.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.cluster import children_of, kill_tree, read_metrics, start_head, stop_head
from tests.support.waits import wait_for

CARTPOLE = ["--env", "CartPole-v1", "--profile", "cpu", "--collectors", "2", "--log-interval", "1",
            "--set", "transport.port=0", "--set", "collectors.envs_per_collector=4"]


def _checkpoint_exists(run_dir: Path) -> bool:
    return any((run_dir / "checkpoint").glob("*")) if (run_dir / "checkpoint").exists() else False


@pytest.mark.slow
def test_sigint_checkpoints_and_resume_continues_counters(tmp_path):
    """A CartPole run stopped with SIGINT checkpoints; resumed, it counts on from there, stops by itself at
    --max-env-steps with exit 0, its metrics and a checkpoint, and leaves no collector behind."""
    run_dir = tmp_path / "run"
    proc = start_head([*CARTPOLE, "--run-dir", str(run_dir)], tmp_path / "first.out")
    try:
        assert wait_for(lambda: any(r["updates"] > 0 for r in read_metrics(run_dir)), 180), \
            (tmp_path / "first.out").read_text()[-3000:]
        code = stop_head(proc)
    finally:
        kill_tree(proc)
    assert code == 0, (tmp_path / "first.out").read_text()[-3000:]
    assert _checkpoint_exists(run_dir)
    assert wait_for(lambda: not children_of(proc.pid), 10)
    first = read_metrics(run_dir)
    first_steps, first_updates = first[-1]["env_steps"], first[-1]["updates"]

    proc2 = start_head([*CARTPOLE, "--resume", str(run_dir), "--max-env-steps", str(first_steps + 6000)],
                       tmp_path / "second.out")
    try:
        code2 = proc2.wait(timeout=240)
    finally:
        kill_tree(proc2)
    out2 = (tmp_path / "second.out").read_text()
    assert code2 == 0, out2[-3000:]
    rows = read_metrics(run_dir)[len(first):]
    assert len(rows) >= 2, out2[-3000:]
    # counters continue from the checkpoint rather than restarting at zero
    assert rows[0]["env_steps"] >= first_steps
    assert rows[-1]["updates"] >= first_updates
    steps = [r["env_steps"] for r in rows]
    updates = [r["updates"] for r in rows]
    assert steps == sorted(steps) and steps[-1] >= first_steps + 6000
    assert updates == sorted(updates) and updates[-1] > updates[0]  # the resumed learner trained
    for key in ("time", "env_steps", "updates", "replay_size", "env_steps_per_s", "updates_per_s", "mean_return_20"):
        assert key in rows[-1]
    assert _checkpoint_exists(run_dir)
    assert "[PROGRESS]" in out2 and "[PROCESSOR]" in out2 and "[MAIN]" in out2
    assert wait_for(lambda: not children_of(proc2.pid), 10), children_of(proc2.pid)


@pytest.mark.slow
def test_killed_collector_is_restarted_and_killed_head_leaves_no_orphans(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_head([*CARTPOLE, "--run-dir", str(run_dir)], tmp_path / "head.out")
    try:
        assert wait_for(lambda: len(children_of(proc.pid)) == 2, 60)
        assert wait_for(lambda: any(r["env_steps"] > 0 for r in read_metrics(run_dir)), 120)
        victim = children_of(proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        # restarted: a new pid appears in its place and env steps keep growing
        assert wait_for(lambda: len(children_of(proc.pid)) == 2 and victim not in children_of(proc.pid), 60)
        steps_after_kill = read_metrics(run_dir)[-1]["env_steps"]
        assert wait_for(lambda: read_metrics(run_dir)[-1]["env_steps"] > steps_after_kill + 1000, 120)
        assert wait_for(lambda: read_metrics(run_dir)[-1].get("restarts", 0) >= 1, 20)
        assert "restart" in (run_dir / "head.log").read_text()
        collectors = children_of(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the head dies without any chance to clean up
        proc.wait(timeout=10)
        # they exit by themselves (parent-death signal, then the head's silence): the deadline is generous
        assert wait_for(lambda: not any(_alive(pid) for pid in collectors), 120), "collectors outlived the head"
    finally:
        kill_tree(proc)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return ") Z" not in stat


def test_bad_config_exits_2_naming_the_field(tmp_path):
    proc = start_head(["--set", "replay.alpha=7", "--run-dir", str(tmp_path / "r")], tmp_path / "out")
    code = proc.wait(timeout=120)
    out = (tmp_path / "out").read_text()
    assert code == 2
    assert "replay.alpha=7" in out and "allowed" in out
    assert not (tmp_path / "r").exists()  # refused before anything was created


@pytest.mark.slow
def test_mario_short_run_end_to_end_reports_x_pos(tmp_path):
    """The real emulator through the whole cluster: a short budget, then the same checks as CartPole."""
    run_dir = tmp_path / "run"
    args = ["--profile", "cpu", "--collectors", "2", "--log-interval", "2", "--max-env-steps", "1500",
            "--run-dir", str(run_dir), "--set", "transport.port=0", "--set", "collectors.envs_per_collector=2",
            "--set", "collectors.chunk_steps=16", "--set", "learner.warmup_transitions=400",
            "--set", "replay.capacity=20000", "--set", "learner.weight_broadcast_every=10"]
    proc = start_head(args, tmp_path / "head.out")
    try:
        code = proc.wait(timeout=400)
    finally:
        kill_tree(proc)
    log = (tmp_path / "head.out").read_text()
    assert code == 0, log[-4000:]
    rows = read_metrics(run_dir)
    steps = [r["env_steps"] for r in rows]
    assert steps == sorted(steps) and steps[-1] >= 1500
    assert rows[-1]["updates"] > 0, log[-3000:]
    assert rows[-1]["episodes"] > 0 and rows[-1]["best_x_pos"] > 40  # Mario starts at x=40 and moves
    assert rows[-1]["mean_x_pos_20"] is not None
    assert _checkpoint_exists(run_dir)
    assert "x20" in log and "best_x" in log
    assert wait_for(lambda: not children_of(proc.pid), 10), children_of(proc.pid)


def test_busy_port_exits_2_with_a_clear_message(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = start_head(["--env", "CartPole-v1", "--port", str(port), "--run-dir", str(tmp_path / "r")], tmp_path / "out")
        try:
            code = proc.wait(timeout=120)
        finally:
            kill_tree(proc)
    out = (tmp_path / "out").read_text()
    assert code == 2, out[-2000:]
    assert "Address already in use" in out and "--port" in out and "Traceback" not in out
