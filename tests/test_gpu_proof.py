"""The GPU window's check script (bench/gpu_proof.sh, steps flag, ratio and cpu16) runs end to end on a CPU in its
dry-run mode, and its run summary (bench/run_summary.py) reads the figures the window is for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run_summary import at_equal_env_steps, main, summarize_run

ROOT = Path(__file__).resolve().parent.parent


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _fake_run(run: Path, flag_at: int | None, steps: int = 4000) -> None:
    run.mkdir(parents=True)
    rows = [{"time": 1000.0 + t, "elapsed_s": float(t), "env_steps": 100 * t, "updates": max(0, 25 * (t - 10)),
             "flags": 1 if t >= 30 else 0} for t in range(0, steps // 100 + 1)]
    _write_jsonl(run / "metrics.jsonl", rows)
    evals = [{"elapsed_s": 20.0 * k, "started_unix": 1000.0 + 20 * k - 5, "eval_s": 5.0, "env_steps": 2000 * k,
              "updates": 500 * k, "mean_x_pos": 300.0 * k, "max_x_pos": 400 * k,
              "flag_rate": 0.1 if flag_at is not None and k >= flag_at else 0.0} for k in (1, 2)]
    _write_jsonl(run / "evals.jsonl", evals)


def test_summary_finds_rates_and_the_first_flag(tmp_path):
    _fake_run(tmp_path / "a", flag_at=2)
    s = summarize_run(tmp_path / "a", started_unix=990.0)
    rates = s["from_first_update"]
    assert rates["env_steps_per_s"] == pytest.approx(100.0) and rates["updates_per_s"] == pytest.approx(25.0)
    assert rates["updates_per_env_step"] == pytest.approx(0.25)
    assert s["first_eval_flag"] == {"seconds": 50.0, "env_steps": 4000, "updates": 1000, "flag_rate": 0.1,
                                    "mean_x_pos": 600.0}  # ends at 1000 + 40 - 5 + 5, 50 s after 990
    assert s["first_training_flag"] == {"elapsed_s": 30.0, "env_steps": 3000}
    assert s["best_eval"]["mean_x_pos"] == 600.0 and len(s["evals"]) == 2


def test_two_runs_compare_at_equal_env_steps(tmp_path):
    _fake_run(tmp_path / "a", flag_at=None, steps=4000)
    _fake_run(tmp_path / "b", flag_at=1, steps=2500)
    runs = [summarize_run(tmp_path / "a", "a"), summarize_run(tmp_path / "b", "b")]
    cmp = at_equal_env_steps(runs)
    assert cmp["env_steps"] == 2500
    assert cmp["a"]["last_eval"]["env_steps"] == 2000 and cmp["a"]["best_flag_rate"] == 0.0
    assert cmp["b"]["best_flag_rate"] == 0.1


def test_summary_refuses_a_folder_without_metrics(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="needs bash and timeout")
def test_gpu_window_steps_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "proof"
    env = {**os.environ, "PY": sys.executable, "PYTHONPATH": str(ROOT), "DRY_RUN": "1", "DRY_SECONDS": "6",
           "OUT_DIR": str(out), "STEPS": "flag ratio cpu16", "COMMIT": "dryrun"}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_proof.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    for name in ("flag", "ratio_spi8", "ratio_spi32", "cpu16_threads", "cpu16_run"):
        assert f"{name}: exit 0" in summary, summary
    assert "failed" not in summary, summary
    flag = json.loads((out / "flag.json").read_text())["runs"][0]
    assert flag["env_steps"] > 0 and flag["from_first_update"].get("updates_per_s", 0) > 0, flag
    assert (out / "flag" / "export").is_dir() and not (out / "flag" / "checkpoint").exists()
    ratio = json.loads((out / "ratio.json").read_text())
    assert [r["label"] for r in ratio["runs"]] == ["spi8", "spi32"] and "at_equal_env_steps" in ratio
    threads = json.loads((out / "cpu16_threads.json").read_text())
    assert set(threads["learner_updates_per_s_by_threads"]) == {"fp32_t1", "fp32_t2"}
    assert "profile auto on a CPU-only machine" in (out / "cpu16_run" / "head.log").read_text()
    assert json.loads((out / "cpu16_run.json").read_text())["runs"][0]["env_steps"] > 0
