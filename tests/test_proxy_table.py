"""experiments.proxy_table: per-env-step rows from a proxy run's files (hand-made runs, numbers computed by hand)."""

from __future__ import annotations

import json

import pytest

from experiments import proxy_table

pytestmark = pytest.mark.experiments


def _run(tmp_path, name, metrics, evals=(), final=None):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if evals:
        (run / "evals.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    if final is not None:
        (run / "final_eval").mkdir()
        (run / "final_eval" / "eval.json").write_text(json.dumps({"summary": final}))
    return run


def test_row_milestones_are_window_means_and_final_eval_is_read(tmp_path):
    metrics = [{"env_steps": s, "updates": s // 4, "flags": 1, "mean_x_pos_20_greedy": x}
               for s, x in ((10_000, 100.0), (30_000, 300.0), (40_000, 500.0), (50_000, 700.0), (60_000, 900.0))]
    run = _run(tmp_path, "a", metrics, evals=[{"env_steps": 40_000, "mean_x_pos": 800.0, "flag_rate": 0.1}],
               final={"episodes": 10, "mean_x_pos": 1234.5, "max_x_pos": 3161, "flag_rate": 0.3, "mean_return": 9.0})
    row = proxy_table.summarize_run(run, "a", milestones=(50_000, 100_000))
    assert row["env_steps"] == 60_000 and row["updates"] == 15_000 and row["updates_per_env_step"] == 0.25
    assert row["greedy_x20"] == {"50000": (300.0 + 500.0 + 700.0) / 3, "100000": None}  # (25k, 50k]; never reached
    assert row["final_eval"]["flag_rate"] == 0.3 and row["periodic_evals"][0]["mean_x_pos"] == 800.0
    table = proxy_table.markdown([row], (50_000, 100_000))
    assert "| a | 60,000 | 0.250 | 500 | - | 800 (1/10) | 1,234 (3/10) |" in table


def test_main_writes_json_and_refuses_a_missing_run(tmp_path, capsys):
    run = _run(tmp_path, "b", [{"env_steps": 1000, "updates": 10}])
    out = tmp_path / "rows.json"
    assert proxy_table.main([str(run), "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["runs"][0]["label"] == "b" and data["runs"][0]["final_eval"] is None
    assert proxy_table.main([str(tmp_path / "nope")]) == 2
    assert "metrics.jsonl: not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        proxy_table.main([])


def test_a_kept_copy_s_final_eval_json_is_read(tmp_path):
    run = _run(tmp_path, "kept", [{"env_steps": 1000, "updates": 250}])
    (run / "final_eval.json").write_text(json.dumps({"summary": {"episodes": 10, "mean_x_pos": 1458.0, "flag_rate": 0.0}}))
    row = proxy_table.summarize_run(run, "kept", milestones=(50_000,))
    assert row["final_eval"]["mean_x_pos"] == 1458.0
