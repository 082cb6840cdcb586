"""What the repository itself holds: the required top level, and nothing that belongs to one machine.

A virtual environment, a run folder or a link committed by mistake (a worktree's `.venv` link, say) would
travel into every clone; a checkout replacing a real folder with such a link deletes what was there. The
tracked files are read from git where this is a git checkout (CI's clean clone is one)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("setup.cfg", "actors", "envs", "learner", "replay", "shared", "tests", "config_optimized.py", "Makefile",
            "README.md", ".ci/run")
MAX_FILE_BYTES = 16 * 2**20  # a shipped evaluation-only checkpoint is at most 15 MiB (evaluate/export.py)
MACHINE_LOCAL = (".venv", "runs", "wheelhouse", "keys")  # .gitignore's; built or written on each machine


def test_the_required_top_level_is_there() -> None:
    missing = [name for name in REQUIRED if not (ROOT / name).exists()]
    assert not missing, missing


def _tracked() -> list[tuple[str, str]]:
    """(mode, path) of every tracked file; skips where this is not a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    rows = []
    for entry in out.decode().split("\0"):
        if entry:
            meta, path = entry.split("\t", 1)
            rows.append((meta.split()[0], path))
    return rows


def test_no_link_and_nothing_machine_local_is_tracked() -> None:
    tracked = _tracked()
    links = [path for mode, path in tracked if mode == "120000"]
    assert not links, f"tracked symbolic links: {links}"
    local = [path for _, path in tracked if path.split("/")[0].startswith(MACHINE_LOCAL)]
    assert not local, f"tracked machine-local paths: {local[:10]}"


def test_no_tracked_file_is_larger_than_a_shipped_checkpoint() -> None:
    big = [(path, (ROOT / path).stat().st_size) for _, path in _tracked()
           if (ROOT / path).is_file() and (ROOT / path).stat().st_size > MAX_FILE_BYTES]
    assert not big, big
