"""`make bench` plumbing: every headline key is written, nulls carry reasons, nothing is invented.

The fast tests drive the report code and the orchestrator with parts skipped or faked, so they
take milliseconds; the one real measurement (tiny CartPole settings) is marked slow. No test
asserts a speed: figures depend on the machine and its load.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from bench import driver as bench
from bench.report import HEADLINE_KEYS, assemble_report, format_table, machine_facts, write_report

ALL_SKIPPED = [a for part in bench.PARTS for a in ("--skip", part)]


def test_assemble_report_keeps_every_key_and_explains_nulls():
    report = assemble_report({"emulator_ceiling_sps": 200.0, "pipeline_sps": 150.0}, {"training_sps": "boom"})
    assert set(HEADLINE_KEYS) <= set(report)
    assert report["pipeline_efficiency"] == pytest.approx(0.75)
    for key in HEADLINE_KEYS:
        if report[key] is None:
            assert report["errors"][key], key
    assert report["errors"]["training_sps"] == "boom"
    assert "pipeline_efficiency" not in report["errors"]


def test_efficiency_reason_names_the_missing_input():
    report = assemble_report({"pipeline_sps": 150.0}, {})
    assert report["pipeline_efficiency"] is None
    assert "emulator_ceiling_sps" in report["errors"]["pipeline_efficiency"]


def test_write_report_writes_latest_and_timestamped_copy(tmp_path):
    report = assemble_report({"emulator_ceiling_sps": 1.5, "learner_updates_per_s": {"fp32": 3.0}}, {})
    latest, stamped = write_report(report, tmp_path / "bench" / "latest.json")
    assert latest.exists() and stamped.exists() and latest != stamped
    data = json.loads(latest.read_text())
    assert data == json.loads(stamped.read_text())
    assert data["learner_updates_per_s"] == {"fp32": 3.0}
    assert data["training_sps"] is None and "training_sps" in data["errors"]


def test_markdown_table_has_rows_for_every_key_and_the_sweep():
    sweep = [{"collectors": 1, "emulator_ceiling_sps": 70.0, "pipeline_sps": None, "pipeline_efficiency": None}]
    report = assemble_report({"emulator_ceiling_sps": 70.0}, {}, sweep=sweep, facts={"cores": 2, "gpu": None})
    text = format_table(report, markdown=True)
    table_lines = [line for line in text.splitlines() if line.startswith("|")]
    assert table_lines[0].startswith("| figure |") and table_lines[1].startswith("|---")
    for key in HEADLINE_KEYS:
        assert f"| {key} |" in text
    assert "| collectors |" in text and "| 1 | 70 | n/a | n/a |" in text
    by_mode = format_table(assemble_report({"learner_updates_per_s": {"fp32_b32": 12.5}}, {}), markdown=True)
    assert "| learner_updates_per_s.fp32_b32 | 12.5 |  |" in by_mode
    plain = format_table(report)
    assert "emulator_ceiling_sps" in plain and "|" not in plain.splitlines()[0]


def test_machine_facts_name_the_machine_and_versions():
    facts = machine_facts(["--quick"])
    assert facts["cores"] >= 1
    assert "gpu" in facts and "cpu_model" in facts and facts["memory_bytes"]
    for dist in ("torch", "numpy", "nes-py", "gym-super-mario-bros"):
        assert dist in facts["versions"]
    assert facts["python"] and facts["command"].endswith("-m bench.driver --quick")


def test_everything_skipped_still_writes_a_complete_report(tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert bench.main([*ALL_SKIPPED, "--out", str(out), "--markdown"]) == 0
    data = json.loads(out.read_text())
    for key in HEADLINE_KEYS:
        assert data[key] is None and data["errors"][key], key
    assert data["errors"]["emulator_ceiling_sps"] == "skipped (--skip ceiling)"
    assert data["sweep"] == [] and data["machine"]["cores"] >= 1
    assert "| figure | value |" in capsys.readouterr().out


def test_bad_config_is_a_usage_error(tmp_path):
    assert bench.main([*ALL_SKIPPED, "--collectors", "0", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def _fake_module(monkeypatch, name: str, **attrs) -> None:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def _run(monkeypatch, tmp_path, *args: str) -> dict:
    out = tmp_path / "latest.json"
    assert bench.main([*args, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_pipeline_figures_are_steady_rates_from_the_head(monkeypatch, tmp_path):
    calls = []

    def run_training(cfg, run_dir, max_env_steps=None, max_seconds=None, train=True, stop_event=None):
        calls.append((cfg.collectors.count, train, max_seconds, stop_event is not None))
        rate = 40.0 if train else 90.0
        rows = [{"time": 0.0, "env_steps": 0}, {"time": 5.0, "env_steps": 128},  # start-up, then data
                {"time": 7.0, "env_steps": 128 + 2 * rate, "updates": 6 if train else 0}]
        rows[1]["updates"] = 0
        Path(run_dir).mkdir(parents=True)
        (Path(run_dir) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        print("[PROGRESS] this goes to the log file, not the table")
        return {"env_steps": 999, "elapsed_s": 7.0, "env_steps_per_s": 1.0, "updates": 3, "updates_per_s": 3.0}

    _fake_module(monkeypatch, "launcher.head", run_training=run_training)
    out = tmp_path / "latest.json"
    args = ["--skip", "ceiling", "--skip", "naive", "--skip", "components", "--quick", "--collectors", "2", "--seconds", "0.5"]
    assert bench.main([*args, "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["pipeline_sps"] == pytest.approx(90.0) and data["training_sps"] == pytest.approx(40.0)
    wall = 0.5 + bench.STARTUP_ALLOWANCE_S[True]
    assert {(2, False, wall, True), (2, True, wall, True), (1, False, wall, True)} == set(calls)
    assert [row["collectors"] for row in data["sweep"]] == [1, 2]
    assert all(row["pipeline_sps"] == pytest.approx(90.0) for row in data["sweep"])
    assert data["sweep"][0]["errors"]["emulator_ceiling_sps"] == "skipped (--skip ceiling)"
    assert data["details"]["pipeline"]["env_steps_per_s"] == 1.0  # the head's own figure is kept
    assert "[PROGRESS]" in Path(data["details"]["pipeline"]["stdout_log"]).read_text()


def test_ceiling_brackets_the_pipeline_and_the_headline_is_the_mean(monkeypatch, tmp_path):
    """The ceiling is read before and after the pipeline phases: machine drift cancels in the ratio."""
    order = []

    def run_emulator_ceiling(env, counts, k, seconds, project_counts=()):
        order.append("ceiling")
        sps = 200.0 if len(order) == 1 else 300.0  # the machine got faster meanwhile
        return {"raw": {n: {"sps": sps} for n in counts}, "project": {n: {"sps": sps} for n in project_counts}}

    def run_training(cfg, run_dir, max_env_steps=None, max_seconds=None, train=True, stop_event=None):
        order.append("train" if train else "drain")
        rows = [{"time": 0.0, "env_steps": 0}, {"time": 1.0, "env_steps": 100}, {"time": 3.0, "env_steps": 600}]
        Path(run_dir).mkdir(parents=True)
        (Path(run_dir) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"env_steps": 600, "elapsed_s": 3.0, "env_steps_per_s": 200.0, "updates": 0, "updates_per_s": 0.0}

    _fake_module(monkeypatch, "bench.baselines", run_emulator_ceiling=run_emulator_ceiling)
    _fake_module(monkeypatch, "launcher.head", run_training=run_training)
    data = _run(monkeypatch, tmp_path, "--quick", "--seconds", "0.5",
                *[a for p in ("naive", "components", "sweep") for a in ("--skip", p)])
    assert order == ["ceiling", "drain", "train", "ceiling"]
    assert data["emulator_ceiling_sps"] == pytest.approx(250.0)
    assert data["pipeline_efficiency"] == pytest.approx(250.0 / 250.0)
    after = data["details"]["ceiling_after"]
    assert (after["before_sps"], after["after_sps"], after["drift"]) == (200.0, 300.0, pytest.approx(1.5))


def test_pipeline_without_steady_window_is_null_not_startup_diluted(monkeypatch, tmp_path):
    def run_training(cfg, run_dir, max_env_steps=None, max_seconds=None, train=True, stop_event=None):
        return {"env_steps": 0, "elapsed_s": 14.0, "env_steps_per_s": 0.0, "updates": 0, "updates_per_s": 0.0}

    _fake_module(monkeypatch, "launcher.head", run_training=run_training)
    data = _run(monkeypatch, tmp_path, *[a for p in ("ceiling", "naive", "components", "sweep") for a in ("--skip", p)])
    assert data["pipeline_sps"] is None and "no steady-state window" in data["errors"]["pipeline_sps"]
    assert data["details"]["pipeline"]["env_steps_per_s"] == 0.0


def test_steady_rate_starts_at_the_first_data_row(tmp_path):
    rows = [{"time": 100.0, "env_steps": 0, "updates": 0}, {"time": 101.0, "env_steps": 0, "updates": 0},
            {"time": 102.0, "env_steps": 128, "updates": 0}, {"time": 104.0, "env_steps": 528, "updates": 10}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steady = bench.steady_rates(path)
    assert steady["env_steps_per_s"] == pytest.approx(200.0) and steady["updates_per_s"] == pytest.approx(5.0)
    assert steady["first_data_after_s"] == pytest.approx(2.0)
    path.write_text(json.dumps(rows[0]) + "\n")
    assert "env_steps_per_s" not in bench.steady_rates(path) and bench.steady_rates(path)["why"]
    assert "no readable" in bench.steady_rates(tmp_path / "missing.jsonl")["why"]


def test_steady_rate_window_ends_at_the_last_arrival(tmp_path):
    """Chunks land in bursts: trailing rows without an arrival must not dilute the rate."""
    rows = [{"time": 0.0, "env_steps": 0}]
    rows += [{"time": 0.5 * i, "env_steps": 128 * ((i + 1) // 2)} for i in range(1, 11)]  # 128 per s, a burst every s
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert rows[-1]["env_steps"] == rows[-2]["env_steps"]  # the run ended between bursts
    steady = bench.steady_rates(path)
    assert steady["env_steps_per_s"] == pytest.approx(128.0)  # ending at rows[-1] would give 512 / 4.5 s
    assert steady["window_s"] == pytest.approx(4.0)


def test_pipeline_failure_is_an_explicit_error(monkeypatch, tmp_path):
    def run_training(*args, **kwargs):
        raise RuntimeError("head exploded")

    _fake_module(monkeypatch, "launcher.head", run_training=run_training)
    data = _run(monkeypatch, tmp_path, *[a for p in ("ceiling", "naive", "components", "sweep") for a in ("--skip", p)])
    assert data["pipeline_sps"] is None and "head exploded" in data["errors"]["pipeline_sps"]
    assert "head exploded" in data["details"]["pipeline"]["error"]
    assert "head exploded" in data["errors"]["training_sps"]


def test_components_are_wired_and_absences_explained(monkeypatch, tmp_path):
    _fake_module(monkeypatch, "fake_replay_bench", run_replay_bench=lambda quick: {"replay_insert_tps": 1e6, "quick": quick})
    monkeypatch.setattr(bench, "COMPONENTS", {  # only fakes: the real component benches take minutes
        "replay": ((("fake_replay_bench", "run_replay_bench"),), ("replay_insert_tps", "bytes_per_transition")),
        "transport": ((("no_such_module_xyz", "run_no_such_bench_xyz"),), ("transport_tps",)),
    })
    data = _run(monkeypatch, tmp_path, "--quick", *[a for p in ("ceiling", "naive", "pipeline", "sweep") for a in ("--skip", p)])
    assert data["replay_insert_tps"] == 1e6 and data["details"]["replay"]["quick"] is True
    assert "reported no 'bytes_per_transition'" in data["errors"]["bytes_per_transition"]
    assert data["transport_tps"] is None and "no_such_module_xyz" in data["errors"]["transport_tps"]


def test_mario_action_masks_are_the_joypad_bitmasks():
    from bench.baselines import mario_action_masks

    assert mario_action_masks("right_only") == [0, 128, 129, 130, 131]
    assert mario_action_masks("simple") == [0, 128, 129, 130, 131, 1, 64]


@pytest.mark.slow
def test_tiny_real_run_measures_ceiling_and_naive(tmp_path):
    """Real processes, tiny settings: every measured figure is a positive number from this run."""
    data = _run(None, tmp_path, "--env", "CartPole-v1", "--collectors", "1", "--envs-per-collector", "1", "--set", "learner.precision=fp32",
                "--seconds", "0.5", "--quick", "--skip", "pipeline", "--skip", "components")
    for key in ("emulator_ceiling_sps", "naive_drain_sps", "naive_pipeline_sps"):
        assert data[key] is not None and data[key] > 0, data["errors"].get(key)
    assert data["details"]["naive_train"]["updates"] > 0
    assert [row["collectors"] for row in data["sweep"]] == [1, 2]
    assert all(row["emulator_ceiling_sps"] > 0 for row in data["sweep"])
