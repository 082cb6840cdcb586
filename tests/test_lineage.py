"""What a network started with learner.init_from had trained (evaluate/lineage.py): a shipped folder's provenance
gives its lineage's totals, a run folder its metrics up to its checkpoint's env steps (plus the run it started from),
and a source that cannot say is refused naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluate.lineage import MAX_DEPTH, LineageError, prior_training


def _checkpoint(folder: Path, env_steps: int) -> Path:
    (folder / "checkpoint").mkdir(parents=True, exist_ok=True)
    (folder / "checkpoint" / "meta.json").write_text(json.dumps({"counters": {"env_steps": env_steps}}))
    return folder


def _run(folder: Path, rows: list[tuple[float, int]], env_steps: int, init_from: str = "") -> Path:
    _checkpoint(folder, env_steps)
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"elapsed_s": s, "env_steps": n}) + "\n" for s, n in rows))
    (folder / "config.json").write_text(json.dumps({"learner": {"init_from": init_from}}))
    return folder


def test_a_shipped_folder_gives_its_provenance_totals_by_folder_or_by_checkpoint(tmp_path: Path) -> None:
    ship = _checkpoint(tmp_path / "mario-2-1-cpu", env_steps=50_000)  # its own counters: a continued run's
    (ship / "provenance.json").write_text(json.dumps({"training_minutes": 72, "env_steps": 203_000}))
    for named in (ship, ship / "checkpoint"):
        prior = prior_training(named)
        assert (prior.source, prior.training_minutes, prior.env_steps) == (ship, 72.0, 203_000)
    (ship / "provenance.json").write_text(json.dumps({"training_minutes": 30}))  # no lineage: its counters
    assert prior_training(ship).env_steps == 50_000


def test_a_run_folder_counts_its_time_up_to_its_checkpoint_and_the_run_it_started_from(tmp_path: Path) -> None:
    first = _run(tmp_path / "first", [(600.0, 10_000), (1200.0, 20_000), (1800.0, 30_000)], env_steps=20_000)
    prior = prior_training(first / "checkpoint")
    assert (prior.training_minutes, prior.env_steps) == (20.0, 20_000)
    second = _run(tmp_path / "second", [(300.0, 5_000), (600.0, 9_000)], env_steps=9_000,
                  init_from=str(first / "checkpoint"))
    chained = prior_training(second)
    assert (chained.source, chained.training_minutes, chained.env_steps) == (second, 30.0, 29_000)


def test_a_source_that_cannot_say_what_it_trained_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(LineageError, match=r"nothing/checkpoint/meta.json: no readable checkpoint counters"):
        prior_training(tmp_path / "nothing")
    bare = _checkpoint(tmp_path / "bare", env_steps=10)
    with pytest.raises(LineageError, match=r"bare: neither provenance.json nor metrics.jsonl"):
        prior_training(bare)
    (bare / "provenance.json").write_text(json.dumps({"minutes": 3}))
    with pytest.raises(LineageError, match=r"bare/provenance.json: needs training_minutes"):
        prior_training(bare)
    loop = _run(tmp_path / "loop", [(60.0, 100)], env_steps=100)
    (loop / "config.json").write_text(json.dumps({"learner": {"init_from": str(loop)}}))
    with pytest.raises(LineageError, match=f"more than {MAX_DEPTH} runs"):
        prior_training(loop)
