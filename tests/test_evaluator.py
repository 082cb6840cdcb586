"""Periodic evaluation: snapshots evaluated in a separate process, evals.jsonl rows, best/ kept."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.evaluator import BEST_DIR, EVALS_DIR, KEPT_DIR, ROWS_FILE, PeriodicEvaluator, cleared, score
from shared.config import (
    CollectorConfig,
    Config,
    EnvConfig,
    LearnerConfig,
    LoggingConfig,
    ReplayConfig,
    TransportConfig,
)

# Stands in for `python -m evaluate CKPT ... --out DIR`: writes DIR/eval.json with the summary queued in
# the snapshot's parent (so each test decides what every evaluation "measures"), or fails when asked.
FAKE_PYTHON = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
out = Path(args[args.index("--out") + 1])
queue = out.parent.parent / "queue.json"
results = json.loads(queue.read_text())
summary = results.pop(0)
queue.write_text(json.dumps(results))
if summary == "fail":
    print("evaluate: boom", file=sys.stderr)
    sys.exit(2)
out.mkdir(parents=True)
(out / "eval.json").write_text(json.dumps({{"summary": summary}}))
"""


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _summary(flags: float, x: float) -> dict:
    return {"episodes": 10, "flag_rate": flags, "mean_x_pos": x, "max_x_pos": x, "mean_return": x / 10,
            "mean_length": 100.0}


def _snapshot_writer(tag: list[int]):
    def write(d: Path) -> Path:
        (d / "checkpoint").mkdir(parents=True)
        (d / "checkpoint" / "meta.json").write_text(json.dumps({"tag": tag[0]}))
        return d / "checkpoint"
    return write


def _run_to_completion(ev: PeriodicEvaluator, clock: Clock, updates: int) -> None:
    clock.t += ev.every_s
    ev.poll({"updates": updates, "env_steps": updates * 10})
    assert ev.running or ev._proc is not None
    ev._proc.wait(timeout=30)
    ev.poll({"updates": updates, "env_steps": updates * 10})  # folds the finished one in


def _fake_run(tmp_path: Path, summaries: list) -> tuple[Path, Path]:
    """A run dir whose evaluations "measure" `summaries` in turn, and the fake python that plays them."""
    fake = tmp_path / "fake_python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    run = tmp_path / "run"
    (run / EVALS_DIR).mkdir(parents=True)
    (run / EVALS_DIR / "queue.json").write_text(json.dumps(summaries))
    return run, fake


def test_score_orders_flags_then_distance_then_return() -> None:
    assert score(_summary(0.5, 1000)) > score(_summary(0.4, 3000))
    assert score(_summary(0.0, 2000)) > score(_summary(0.0, 1999))


def test_best_is_kept_worse_snapshots_are_dropped_and_failures_are_counted(tmp_path) -> None:
    run, fake = _fake_run(tmp_path, [_summary(0.0, 1500), _summary(0.3, 900), _summary(0.1, 3000), "fail"])
    clock, tag = Clock(), [0]
    ev = PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                           clock=clock, python=str(fake))
    ev.poll({"updates": 1})
    assert ev._proc is None  # not due yet
    for updates in (100, 200, 300, 400):
        tag[0] = updates
        _run_to_completion(ev, clock, updates)
    rows = [json.loads(line) for line in (run / ROWS_FILE).read_text().splitlines()]
    assert [r["updates"] for r in rows] == [100, 200, 300]  # the failed fourth leaves no row
    assert [r["best"] for r in rows] == [True, True, False]
    assert ev.completed == 3 and ev.failed == 1
    assert json.loads((run / BEST_DIR / "checkpoint" / "meta.json").read_text())["tag"] == 200  # flags 0.3 wins
    assert sorted(p.name for p in (run / EVALS_DIR).iterdir()) == ["queue.json"]  # no snapshot left behind
    assert not (run / KEPT_DIR).exists()  # keep 1: best/ alone
    # a resumed run keeps its best: only a better evaluation replaces best/
    again = PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                              clock=clock, python=str(fake))
    assert again.best == score(_summary(0.3, 900))


def test_runners_up_are_kept_by_score_and_a_resumed_run_trims_them_to_its_keep(tmp_path) -> None:
    run, fake = _fake_run(tmp_path, [_summary(0.0, 1500), _summary(0.3, 900), _summary(0.1, 3000),
                                     _summary(0.0, 1000), _summary(0.2, 100)])
    clock, tag = Clock(), [0]
    ev = PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                           clock=clock, python=str(fake), keep=3)
    for updates in (100, 200, 300, 400, 500):
        tag[0] = updates
        _run_to_completion(ev, clock, updates)

    def kept_tags(root: Path) -> list[int]:
        return [json.loads((d / "checkpoint" / "meta.json").read_text())["tag"]
                for d in sorted((root / KEPT_DIR).iterdir(), reverse=True)]

    assert json.loads((run / BEST_DIR / "checkpoint" / "meta.json").read_text())["tag"] == 200
    # 100 was best/ until 200 beat it, then fell out of the two runners-up; 400 never entered
    assert kept_tags(run) == [500, 300]
    assert all((d / "eval" / "eval.json").is_file() for d in (run / KEPT_DIR).iterdir())
    assert sorted(p.name for p in (run / EVALS_DIR).iterdir()) == ["queue.json"]
    rows = [json.loads(line) for line in (run / ROWS_FILE).read_text().splitlines()]
    assert [r["best"] for r in rows] == [True, True, False, False, False]  # the rows do not change with keep
    # a resumed run finds its runners-up; a folder without a finished evaluation is not one
    (run / KEPT_DIR / "0000000600" / "checkpoint").mkdir(parents=True)
    again = PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                              clock=clock, python=str(fake), keep=3)
    assert [p.name for _, p in again.kept] == ["0000000500", "0000000300"]
    assert kept_tags(run) == [500, 300]
    # resumed with a smaller keep, only the best runner-up stays; keep 1 is best/ alone
    PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                      clock=clock, python=str(fake), keep=2)
    assert kept_tags(run) == [500]
    PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                      clock=clock, python=str(fake))
    assert kept_tags(run) == [] and (run / BEST_DIR).is_dir()


def test_the_stop_rule_needs_its_evaluations_in_a_row() -> None:
    assert not cleared([], 0.8, 1)
    assert cleared([0.8], 0.8, 1) and not cleared([0.7], 0.8, 1)
    assert not cleared([0.9, 0.7], 0.8, 1)  # the last one decides
    assert cleared([0.0, 0.9, 0.8], 0.8, 2) and not cleared([0.9, 0.7, 0.8], 0.8, 2)
    assert not cleared([0.8], 0.8, 2)  # fewer evaluations than the rule needs
    assert not cleared([1.0, 1.0], 0.0, 1)  # rate 0: the rule is off
    assert cleared([0.1 * 8], 0.8, 1)  # 8/10 as the evaluation computes it


def test_the_stop_rule_counts_a_resumed_runs_evaluations(tmp_path) -> None:
    run, fake = _fake_run(tmp_path, [_summary(0.9, 3000), _summary(0.3, 900), _summary(0.8, 3100),
                                     _summary(0.9, 3200)])
    clock, tag = Clock(), [0]

    def evaluator() -> PeriodicEvaluator:
        return PeriodicEvaluator(run, every_s=60, episodes=10, epsilon=0.05, write_snapshot=_snapshot_writer(tag),
                                 clock=clock, python=str(fake))

    ev = evaluator()
    for updates in (100, 200):
        tag[0] = updates
        _run_to_completion(ev, clock, updates)
    assert ev.cleared(0.8, 1) is False  # 0.9 then 0.3: the streak is broken
    tag[0] = 300
    _run_to_completion(ev, clock, 300)
    assert ev.cleared(0.8, 1) and not ev.cleared(0.8, 2)
    again = evaluator()  # resumed: the rows in evals.jsonl count
    assert again.cleared(0.8, 1) and not again.cleared(0.8, 2)
    tag[0] = 400
    _run_to_completion(again, clock, 400)
    assert again.cleared(0.8, 2) and not again.cleared(0.8, 3)


def test_close_stops_a_running_evaluation_and_leaves_nothing(tmp_path) -> None:
    sleeper = tmp_path / "slow_python"
    sleeper.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(60)\n")
    sleeper.chmod(0o755)
    clock = Clock()
    ev = PeriodicEvaluator(tmp_path / "run", every_s=1, episodes=1, epsilon=0.0, write_snapshot=_snapshot_writer([1]),
                           clock=clock, python=str(sleeper))
    clock.t = 2
    ev.poll({"updates": 5})
    proc = ev._proc
    assert proc is not None and proc.poll() is None
    ev.close()
    assert proc.poll() is not None
    assert not (tmp_path / "run" / EVALS_DIR).exists() and not (tmp_path / "run" / BEST_DIR).exists()


@pytest.mark.slow
def test_a_training_head_evaluates_periodically_and_keeps_a_playable_best(tmp_path, monkeypatch) -> None:
    """Real head, real collector process, real `python -m evaluate` subprocesses on CartPole."""
    from launcher import evaluator
    from launcher.head import Head, StopAt
    from learner.checkpoint import load_checkpoint

    # at their usual lower priority the evaluations get almost no CPU beside a head that fills both cores of a
    # small machine (80-110 s for two); at the head's priority they take seconds, and what is checked is the same
    monkeypatch.setattr(evaluator, "NICE", 0)

    cfg = replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=200),
        collectors=CollectorConfig(count=1, envs_per_collector=2, chunk_steps=16),
        replay=ReplayConfig(capacity=10_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=200),
        transport=TransportConfig(port=0),
        logging=LoggingConfig(eval_every_s=3.0, eval_episodes=2, eval_epsilon=0.0, eval_keep=2),
    )
    head = Head(cfg, tmp_path / "run")
    rows_file = tmp_path / "run" / ROWS_FILE
    stop = threading.Event()

    def stop_after_two_rows() -> None:  # a loaded CI machine runs the niced evaluations slowly: wait for them
        while not stop.wait(0.5):
            if rows_file.is_file() and len(rows_file.read_text().splitlines()) >= 2:
                stop.set()

    watcher = threading.Thread(target=stop_after_two_rows, daemon=True)
    watcher.start()
    try:
        # the watcher ends the run once two evaluations are in; the deadline only catches a hang (one loaded
        # 2-core run finished a single evaluation in 240 s), within the suite's 600 s per test
        summary = head.run(StopAt(seconds=500.0), stop)
    finally:
        stop.set()
        head.close(checkpoint=False)
    assert summary["updates"] > 0
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(rows) >= 2 and rows[0]["best"] and rows[0]["episodes"] == 2
    assert all(r["mean_return"] is not None and r["updates"] >= 0 for r in rows)
    best = load_checkpoint(tmp_path / "run" / BEST_DIR)
    assert set(best.model) == {"online", "target"} and not best.optimizer["state"]  # eval-only weights
    assert best.counters["updates"] == max(r["updates"] for r in rows if r["best"])
    # keep 2: best/ and one runner-up, also playable (on a loaded machine both can be taken before the first update)
    kept = list((tmp_path / "run" / KEPT_DIR).iterdir())
    assert len(kept) == 1 and int(kept[0].name) in {r["updates"] for r in rows}
    assert load_checkpoint(kept[0]).counters["updates"] == int(kept[0].name)
    assert not head.evaluator.running
    leftovers = list((tmp_path / "run" / EVALS_DIR).iterdir()) if (tmp_path / "run" / EVALS_DIR).exists() else []
    assert leftovers == []


@pytest.mark.slow
def test_a_head_with_the_stop_rule_stops_once_cleared_and_writes_its_checkpoint(tmp_path, monkeypatch) -> None:
    """Real head and collector on CartPole; the evaluations are the fake's (a flag rate of 1.0, then 0.9): the run
    ends by itself with reason flags_cleared after the second, its final checkpoint written."""
    import functools

    from launcher import head as head_module
    from launcher.head import Head, StopAt
    from learner.checkpoint import load_checkpoint

    run, fake = _fake_run(tmp_path, [_summary(1.0, 3000), _summary(0.9, 3000), _summary(0.0, 0)])
    monkeypatch.setattr(head_module, "PeriodicEvaluator", functools.partial(PeriodicEvaluator, python=str(fake)))
    cfg = replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=200),
        collectors=CollectorConfig(count=1, envs_per_collector=2, chunk_steps=16),
        replay=ReplayConfig(capacity=10_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=200),
        transport=TransportConfig(port=0),
        logging=LoggingConfig(eval_every_s=1.0, eval_episodes=10, stop_flag_rate=0.8, stop_flag_evals=2),
    )
    head = Head(cfg, run)
    try:
        summary = head.run(StopAt(seconds=500.0), threading.Event())  # the deadline only catches a hang
    finally:
        head.close()
    assert summary["reason"] == "flags_cleared"
    rows = [json.loads(line) for line in (run / ROWS_FILE).read_text().splitlines()]
    assert [r["flag_rate"] for r in rows] == [1.0, 0.9]
    assert load_checkpoint(run).counters["updates"] == summary["updates"]
