"""Helpers for tests that run the real head (`python -m launcher`) as a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from evaluate import plots as evaluate_plots
from tests.hostile.procs import children_of  # noqa: F401 - the tests import it from here
from tests.support.waits import wait_for

ROOT = Path(__file__).resolve().parents[2]


def head_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_head(args: list[str], log_path: Path) -> subprocess.Popen:
    """Start the head in its own session so a test can signal it like a terminal would."""
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=ROOT, env=head_env(),
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    finally:
        log.close()


def wait_endpoints(run_dir: Path, proc: subprocess.Popen, timeout: float = 180.0) -> dict[str, str]:
    """The endpoints a head started with --port 0 bound (its run dir's endpoints.json, written once its sockets
    are up); AssertionError if the head exits or the deadline passes first."""
    path = run_dir / "endpoints.json"
    assert wait_for(lambda: path.exists() or proc.poll() is not None, timeout), f"no {path} after {timeout} s"
    assert path.exists(), f"the head exited with {proc.poll()} before binding its sockets"
    return json.loads(path.read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl so far ([] before the first; a live run's half-written line skipped)."""
    path = run_dir / "metrics.jsonl"
    return evaluate_plots.read_metrics(path) if path.exists() else []


def stop_head(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def kill_tree(proc: subprocess.Popen) -> None:
    """Last-resort cleanup so a failing test never leaves processes behind."""
    kids = children_of(proc.pid)
    for pid in [proc.pid, *kids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def launch_collectors(connect: str, n: int, *extra: str) -> subprocess.Popen:
    """`python -m actors --connect CONNECT --collectors N`: n collector processes of this repository, children of
    this test process (they exit with it), their log at WARNING."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "actors", "--connect", connect, "--collectors", str(n),
            "--parent-pid", str(os.getpid()), "--log-level", "WARNING", *extra]
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
