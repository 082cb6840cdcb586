"""`make help` lists every target of the Makefile, one line each: the README points there instead of listing them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _phony() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith(".PHONY:")]
    assert lines, "the Makefile declares no .PHONY targets"
    return [t for line in lines for t in line.partition(":")[2].split()]


def test_make_help_lists_every_target_once() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    listed = [m.group(1) for m in re.finditer(r"^make (\S+) ", out, re.M)]
    assert sorted(listed) == sorted(set(listed)), f"listed twice: {sorted(t for t in set(listed) if listed.count(t) > 1)}"
    missing = sorted(set(_phony()) - set(listed))
    assert not missing, f"make help does not list {missing}"
    unknown = sorted(set(listed) - set(_phony()))
    assert not unknown, f"make help lists targets the Makefile does not declare: {unknown}"
