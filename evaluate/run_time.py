"""How long a run has trained, across its resumes, from its own metrics.jsonl.

Every progress row of `python -m launcher` carries `elapsed_s`, the seconds since that head started; a
resumed run appends to the same file, so its elapsed_s starts again from zero. The training time is the
sum over these segments of each one's last elapsed_s (a segment killed before its final row counts up to
its last row). Wall time between segments (a run lying stopped) does not count.
"""

from __future__ import annotations

import json
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def _rows(run_dir: Path) -> list[tuple[float, int]]:
    """(elapsed_s, env_steps) of every readable row; a torn last line (a killed head) is skipped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
            rows.append((float(row["elapsed_s"]), int(row.get("env_steps") or 0)))
        except (ValueError, KeyError, TypeError):
            continue
    return rows


def training_seconds(run_dir: Path, until_env_steps: int | None = None) -> float:
    """Seconds `run_dir` has trained over all its segments; with `until_env_steps`, up to the first row that
    reached that many env steps (the time behind a snapshot taken there)."""
    total, segment, last = 0.0, 0.0, -1.0
    for elapsed, env_steps in _rows(run_dir):
        if elapsed < last:  # a new segment (a resume) starts its clock again
            total += segment
        segment = last = elapsed
        if until_env_steps is not None and env_steps >= until_env_steps:
            break
    return total + segment
