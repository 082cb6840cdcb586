"""evaluate.seeds: a recipe over seeds from the head's evaluations (first flag, goal rate, best rates, median and range)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluate.seeds import main, seed_row, spread


def _run(root: Path, name: str, evals: list[tuple[int, float]], resumed_at: int | None = None) -> Path:
    """A run dir: a metrics row every 10k env steps at 30 env steps/s (elapsed_s starting again after `resumed_at`
    env steps, as in a run resumed there), and evaluations (env steps, flag rate)."""
    run = root / name
    run.mkdir()
    rows = []
    for steps in range(10_000, max(s for s, _ in evals) + 10_000, 10_000):
        since = steps - resumed_at if resumed_at is not None and steps > resumed_at else steps
        rows.append({"env_steps": steps, "elapsed_s": since / 30.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "evals.jsonl").write_text("".join(
        json.dumps({"env_steps": s, "flag_rate": r, "mean_x_pos": 1000 + 3000 * r, "mean_return": 1.0}) + "\n"
        for s, r in evals))
    return run


def test_a_seed_s_first_flag_goal_and_best_rates(tmp_path):
    run = _run(tmp_path, "a", [(30_000, 0.0), (60_000, 0.1), (90_000, 0.6), (450_000, 0.9)])
    row = seed_row(run, 400_000, (60.0,), 0.5)
    assert row["first_flag"] == {"env_steps": 60_000, "minutes": 60_000 / 30 / 60}
    assert row["first_goal"]["env_steps"] == 90_000
    assert row["best_rate_by_400000_env_steps"] == 0.6  # the 0.9 came after the budget
    assert row["best_rate_by_60_min"] == 0.6  # 90k env steps at 30/s: 50 minutes
    assert [e["flag_rate"] for e in row["evaluations"]] == [0.0, 0.1, 0.6, 0.9]


def test_minutes_add_up_over_the_segments_of_a_resumed_run(tmp_path):
    run = _run(tmp_path, "r", [(100_000, 0.0), (190_000, 0.2)], resumed_at=100_000)
    row = seed_row(run, 400_000, (120.0,), 0.5)
    assert row["first_flag"]["minutes"] == pytest.approx(190_000 / 30 / 60)


def test_the_median_counts_a_seed_that_never_got_there_as_later_than_all():
    assert spread([10.0, None, 30.0]) == {"median": 30.0, "min": 10.0, "max": None}
    assert spread([10.0, None, None]) == {"median": None, "min": 10.0, "max": None}
    assert spread([10.0, 20.0, 30.0]) == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert spread([None, None]) == {"median": None, "min": None, "max": None}


def test_the_cli_prints_the_table_and_writes_json_and_png(tmp_path, capsys):
    runs = [_run(tmp_path, "s0", [(50_000, 0.0), (100_000, 0.5)]),
            _run(tmp_path, "s1", [(50_000, 0.2), (100_000, 0.7)]),
            _run(tmp_path, "s2", [(50_000, 0.0), (100_000, 0.0)])]
    out = tmp_path / "seeds.json"
    png = tmp_path / "seeds.png"
    assert main([*map(str, runs), "--labels", "a", "b", "c", "--by-minutes", "60", "--json", str(out),
                 "--png", str(png)]) == 0
    table = capsys.readouterr().out
    assert "| b | 50,000 / 28 |" in table and "| c | - | - |" in table
    assert "first flag, env steps: median 100,000, range 50,000 to never over 3 seeds" in table
    saved = json.loads(out.read_text())
    assert saved["labels"] == ["a", "b", "c"] and saved["summary"]["best_rate_by_400000_env_steps"]["median"] == 0.5
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["--labels", "x", "y"], "2 labels for 1 runs"),
    (["--goal-rate", "0"], "--goal-rate 0.0 is invalid"),
    (["--by-minutes", "sixty"], "--by-minutes 'sixty' is invalid"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, message):
    run = _run(tmp_path, "s", [(10_000, 0.0)])
    with pytest.raises(SystemExit) as exc:
        main([str(run), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]


def test_a_folder_without_metrics_exits_2_naming_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "nothing")])
    assert exc.value.code == 2 and "no metrics.jsonl in" in capsys.readouterr().err


def test_a_seeds_json_stands_in_for_its_runs_and_a_new_seed_joins_it(tmp_path, capsys):
    first = [_run(tmp_path, "s0", [(50_000, 0.0), (100_000, 0.5)]), _run(tmp_path, "s1", [(60_000, 0.2)])]
    old = tmp_path / "old.json"
    assert main([*map(str, first), "--labels", "seed 0", "seed 1", "--json", str(old)]) == 0
    for run in first:  # the run directories are gone; their recorded evaluations remain
        for f in run.iterdir():
            f.unlink()
        run.rmdir()
    new = _run(tmp_path, "s2", [(40_000, 0.1), (80_000, 0.6)])
    both = tmp_path / "both.json"
    capsys.readouterr()
    assert main([str(old), str(new), "--json", str(both)]) == 0
    table = capsys.readouterr().out
    saved, before = json.loads(both.read_text()), json.loads(old.read_text())
    assert saved["labels"] == ["seed 0", "seed 1", "s2"]
    assert saved["seeds"][:2] == before["seeds"]  # the same rows from the recorded evaluations
    assert saved["seeds"][2]["first_goal"]["env_steps"] == 80_000
    assert "| seed 1 | 60,000 / 33 |" in table
    assert saved["summary"]["first_flag_env_steps"] == {"median": 60_000, "min": 40_000, "max": 100_000}
    assert main([str(old), str(new), "--labels", "a", "b", "c"]) == 0


@pytest.mark.parametrize("text, message", [
    ("not json", "not a seeds JSON written by --json"),
    ('{"labels": ["a"]}', "missing key 'seeds'"),
    ('{"labels": ["a"], "seeds": [{"run": "r", "evaluations": [{"env_steps": 1, "minutes": "x", '
     '"flag_rate": 0, "mean_x_pos": 0}]}]}', "seed 'a': an evaluation field is not a finite number"),
    ('{"labels": ["a"], "seeds": [{"run": "r", "evaluations": [{"env_steps": 1, "minutes": 2, '
     '"flag_rate": NaN, "mean_x_pos": 0}]}]}', "seed 'a': an evaluation field is not a finite number"),
])
def test_a_bad_seeds_json_exits_2_naming_it(tmp_path, capsys, text, message):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    with pytest.raises(SystemExit) as exc:
        main([str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert str(bad) in err[-1] and message in err[-1]
