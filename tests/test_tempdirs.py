"""Temp folders named after their owner (shared/tempdirs.py): under TMPDIR, removed by a starting head once
their owner is gone, never while it lives. Everything happens inside the test's own temp folder
(tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shared import tempdirs
from tests.support.cluster import ROOT, head_env, kill_tree
from tests.support.waits import wait_for


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _owned(base: Path, pid: int, ticks: int) -> Path:
    path = base / f"{tempdirs.PREFIX}{pid}-{ticks}-abcd1234"
    path.mkdir()
    (path / "c1.ipc").write_text("")  # a plain file where a socket was: nothing listens
    return path


def test_owned_folder_is_private_under_tmpdir_and_names_its_owner(own_tmpdir):
    path = Path(tempdirs.owned_tempdir())
    assert path.parent == own_tmpdir
    assert path.stat().st_mode & 0o777 == 0o700
    pid = os.getpid()
    assert tempdirs.owner(path.name) == (pid, tempdirs.start_ticks(pid))
    assert tempdirs.start_ticks(pid) > 0  # Linux: the real start time, so a reused pid is told apart


def test_sweep_removes_only_folders_whose_owner_is_gone(own_tmpdir):
    me, my_ticks = os.getpid(), tempdirs.start_ticks(os.getpid())
    dead = _owned(own_tmpdir, _dead_pid(), 12345)
    reused = _owned(own_tmpdir, me, my_ticks + 1)  # this pid, but a process that started at another time
    mine = _owned(own_tmpdir, me, my_ticks)
    parent = _owned(own_tmpdir, os.getppid(), tempdirs.start_ticks(os.getppid()))
    foreign = [own_tmpdir / "mapx-abcd1234", own_tmpdir / "mario-apex-abcd1234", own_tmpdir / "mapx-12-x"]
    for path in foreign:  # no recorded owner (older versions, other tools): never touched
        path.mkdir()
    (own_tmpdir / "mapx-1-2-file").write_text("not a folder")
    removed = tempdirs.sweep_stale()
    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert not dead.exists() and not reused.exists()
    assert mine.exists() and parent.exists() and all(p.exists() for p in foreign)
    assert (own_tmpdir / "mapx-1-2-file").exists()
    assert tempdirs.sweep_stale() == []


def test_a_folder_whose_socket_still_listens_is_kept(own_tmpdir):
    """A dead-looking owner whose socket answers (a head in another pid namespace sharing this temp dir)."""
    folder = own_tmpdir / f"{tempdirs.PREFIX}{_dead_pid()}-1-abcd1234"
    folder.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(folder / "weights.ipc"))
        server.listen()
        assert tempdirs.sweep_stale() == [] and folder.exists()
    assert tempdirs.sweep_stale() == [str(folder)]  # closed: the socket file stays, nobody answers


def test_a_temp_dir_too_long_for_socket_paths_falls_back_to_tmp(tmp_path, monkeypatch):
    long = tmp_path / ("x" * 60)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    assert tempdirs.root() == tempdirs.FALLBACK_ROOT
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    if len(str(tmp_path)) + tempdirs.NAME_ROOM + tempdirs.SOCKET_NAME_ROOM + 2 <= tempdirs.SOCKET_PATH_MAX:
        assert tempdirs.root() == str(tmp_path)


def _head(tmpdir: Path, run_dir: Path, out: Path) -> subprocess.Popen:
    with open(out, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "launcher", "--env", "CartPole-v1", "--profile", "cpu", "--collectors", "0",
             "--port", "0", "--run-dir", str(run_dir), "--set", "transport.local_transport=ipc"],
            cwd=ROOT, env=dict(head_env(), TMPDIR=str(tmpdir)), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)


def _folders_of(tmpdir: Path, pid: int) -> set[Path]:
    return {p for p in tmpdir.iterdir() if (tempdirs.owner(p.name) or (0,))[0] == pid}


@pytest.mark.slow
def test_a_killed_heads_folders_are_removed_by_the_next_head_and_a_live_ones_kept(own_tmpdir, tmp_path_factory):
    """kill -9 leaves a head's ipc folders (it cannot clean up); the next head's start removes them, and
    keeps the folders of a head that still runs."""
    tmpdir = own_tmpdir
    work = tmp_path_factory.mktemp("heads")
    live = _head(tmpdir, work / "live", work / "live.out")
    victim = _head(tmpdir, work / "victim", work / "victim.out")
    heads = [live, victim]
    try:
        for proc in heads:  # each head made two: the weights socket's and the data sockets'
            assert wait_for(lambda p=proc: p.poll() is not None or len(_folders_of(tmpdir, p.pid)) == 2, 180), \
                (work / "victim.out").read_text()[-2000:]
            assert proc.poll() is None
        victims = _folders_of(tmpdir, victim.pid)
        assert any((f / "weights.ipc").exists() for f in victims)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=30)
        assert all(f.exists() for f in victims), "a killed head cannot remove its folders"
        third = _head(tmpdir, work / "third", work / "third.out")
        heads.append(third)
        assert wait_for(lambda: third.poll() is not None or len(_folders_of(tmpdir, third.pid)) == 2, 180), \
            (work / "third.out").read_text()[-2000:]
        assert not any(f.exists() for f in victims), victims
        assert len(_folders_of(tmpdir, live.pid)) == 2  # the live head's folders were kept
        assert "removed 2 temp folder(s)" in (work / "third" / "head.log").read_text()
        for proc in (live, third):
            proc.send_signal(signal.SIGTERM)
        for proc, name in ((live, "live"), (third, "third")):
            assert proc.wait(timeout=120) == 0, (work / f"{name}.out").read_text()[-2000:]
        # clean exits remove their own (torch may leave its compile cache, torchinductor_<user>, beside them)
        assert not [p.name for p in tmpdir.iterdir() if p.name.startswith(tempdirs.PREFIX)]
    finally:
        for proc in heads:
            kill_tree(proc)
