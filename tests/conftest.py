"""Every test gets a temp dir of its own: TMPDIR for the processes it starts, tempfile's for itself.

So a test that looks for what a head leaves behind looks only at its own folder (another head on the
machine, or a test running beside it, cannot make it fail), and the ipc folders the heads it starts
make land in pytest's temp tree. The folder's path is short (unix socket paths must stay under ~107
bytes, shared/tempdirs.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def own_tmpdir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.mktemp("t")
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path
