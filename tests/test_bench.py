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

import numpy as np
import pytest

from bench import driver as bench
from bench.report import HEADLINE_KEYS, assemble_report, format_table, machine_facts, write_report

ALL_SKIPPED = [a for part in bench.PARTS for a in ("--skip", part)]


def test_assemble_report_keeps_every_key_and_explains_nulls():
    report = assemble_report({"emulator_ceiling_sps": 200.0, "pipeline_sps": 150.0}, {"training_sps": "boom"}, quick=True)
    assert set(HEADLINE_KEYS) <= set(report)
    assert report["quick"] is True
    assert report["pipeline_efficiency"]["median"] == pytest.approx(0.75)
    for key in HEADLINE_KEYS:
        if report[key] is None:
            assert report["errors"][key], key
    assert report["errors"]["training_sps"] == "boom"
    assert "pipeline_efficiency" not in report["errors"]


def test_efficiency_reason_names_the_missing_input():
    report = assemble_report({"pipeline_sps": 150.0}, {})
    assert report["pipeline_efficiency"] is None
    assert "emulator_ceiling_sps" in report["errors"]["pipeline_efficiency"]


def test_limits_are_ratios_to_the_copy_floors():
    report = assemble_report({"replay_insert_tps": 400.0, "insert_copy_floor_tps": 500.0, "replay_sample512_ms": 4.0,
                              "copy_floor_sample512_ms": 3.2}, {})
    assert report["insert_vs_copy_floor"] == pytest.approx(0.8)
    assert report["sample512_vs_copy_floor"] == pytest.approx(1.25)


def test_efficiency_above_one_is_flagged_as_noise_not_reported():
    """1.0 is a physical limit: a median above it is null with the reason; single repeats above it are named."""
    over = {"median": 1.1, "min": 0.9, "max": 1.2, "values": [0.9, 1.1, 1.2]}
    some = {"median": 0.9, "min": 0.85, "max": 1.05, "values": [0.85, 0.9, 1.05]}
    report = assemble_report({"cpu_efficiency": over, "pipeline_efficiency": some}, {})
    assert report["cpu_efficiency"]["median"] is None and report["cpu_efficiency"]["noise"] == [1.1, 1.2]
    assert "noise" in report["errors"]["cpu_efficiency"] and "physical limit" in report["errors"]["cpu_efficiency"]
    assert report["pipeline_efficiency"]["median"] == 0.9 and report["pipeline_efficiency"]["noise"] == [1.05]
    assert "1.05" in report["errors"]["pipeline_efficiency.noise"]
    text = format_table(report, markdown=True)
    assert "| cpu_efficiency | noise (0.9-1.2) |" in text
    assert "| pipeline_efficiency | 0.9 (0.85-1.05), noise: 1.05 |" in text


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
        if key == "quick":
            assert data[key] is False
            continue
        assert data[key] is None and data["errors"][key], key
    assert data["errors"]["emulator_ceiling_sps"] == "skipped (--skip ceiling)"
    assert data["errors"]["head_capacity_tps"] == "skipped (--skip scale)" and data["scale"] is None
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


def _fake_head(monkeypatch, run) -> None:
    """launcher.head with a Head whose run() is `run(cfg, run_dir, max_seconds=..., train=..., stop_event=...)`."""
    from launcher.head import StopAt

    class Head:
        def __init__(self, cfg, run_dir, train: bool = True) -> None:
            self.cfg, self.run_dir, self.train = cfg, run_dir, train

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def run(self, stop_at, stop_event):
            return run(self.cfg, str(self.run_dir), max_seconds=stop_at.seconds, train=self.train, stop_event=stop_event)

    _fake_module(monkeypatch, "launcher.head", Head=Head, StopAt=StopAt)


def _run(monkeypatch, tmp_path, *args: str) -> dict:
    """One backend (the default config's): the faked parts count their calls for one paired sequence."""
    out = tmp_path / "latest.json"
    assert bench.main([*args, "--backends", "nes-py", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _metrics_rows(run_dir, rate: float, train: bool) -> None:
    rows = [{"time": 0.0, "env_steps": 0}, {"time": 5.0, "env_steps": 128, "updates": 0},  # start-up, then data
            {"time": 7.0, "env_steps": 128 + 2 * rate, "updates": 6 if train else 0}]
    Path(run_dir).mkdir(parents=True)
    (Path(run_dir) / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


SKIP_ALL_BUT_PIPELINE = [a for p in ("ceiling", "naive", "components", "scale", "sweep") for a in ("--skip", p)]


def test_pipeline_figures_are_steady_rates_from_the_head(monkeypatch, tmp_path):
    calls = []

    def run_training(cfg, run_dir, max_env_steps=None, max_seconds=None, train=True, stop_event=None):
        calls.append((cfg.collectors.count, train, max_seconds, stop_event is not None, cfg.learner.samples_per_insert))
        _metrics_rows(run_dir, 40.0 if train else 90.0, train)
        print("[PROGRESS] this goes to the log file, not the table")
        return {"env_steps": 999, "elapsed_s": 7.0, "env_steps_per_s": 1.0, "updates": 3, "updates_per_s": 3.0}

    _fake_head(monkeypatch, run_training)
    data = _run(monkeypatch, tmp_path, *SKIP_ALL_BUT_PIPELINE, "--quick", "--collectors", "2", "--seconds", "0.5")
    assert data["pipeline_sps"] == pytest.approx(90.0) and data["training_sps"] == pytest.approx(40.0)
    wall = 0.5 + bench.STARTUP_ALLOWANCE_S[True]
    # every repeat: draining, then training without a replay ratio (like the naive learner)
    spi = bench.build_config(bench.parse_args([])).learner.samples_per_insert
    assert calls == [(2, False, wall, True, spi), (2, True, wall, True, 0.0)] * bench.REPEATS[True]
    assert data["sweep"] == []  # --quick: no sweep
    assert data["train_pair"]["ours_sps"] == pytest.approx(40.0) and data["train_pair"]["ours_ups"] == pytest.approx(3.0)
    assert data["train_pair"]["naive_sps"] is None
    assert len(data["details"]["pipeline"]) == bench.REPEATS[True]
    assert data["details"]["pipeline"][0]["env_steps_per_s"] == 1.0  # the head's own figure is kept
    assert "[PROGRESS]" in Path(data["details"]["pipeline"][0]["stdout_log"]).read_text()


class FakeCeiling:
    """EmulatorCeiling without processes: 200 steps/s costing 5 CPU s per 1,000 steps."""

    order: list[str] = []

    def __init__(self, env, width, k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def measure(self, kind, n, seconds):
        FakeCeiling.order.append("ceiling" if kind == "raw" else "project")
        return {"sps": 200.0, "cpu_s_per_1k_steps": 5.0}


def test_pairs_are_interleaved_and_reported_as_median_and_spread(monkeypatch, tmp_path):
    FakeCeiling.order = order = []
    drains = iter([180.0, 150.0, 210.0])  # the third repeat beats the ceiling: noise

    def run_training(cfg, run_dir, max_env_steps=None, max_seconds=None, train=True, stop_event=None):
        order.append("train" if train else "drain")
        _metrics_rows(run_dir, 40.0 if train else next(drains), train)
        return {"env_steps": 600, "elapsed_s": 3.0, "env_steps_per_s": 200.0, "updates": 0, "updates_per_s": 0.0}

    def run_naive_pipeline(cfg, seconds, phases, warmup):
        order.append("naive")
        return {"drain": {"sps": 100.0, "updates_per_s": 0.0, "cpu_s_per_1k_steps": 9.0},
                "train": {"sps": 50.0, "updates_per_s": 4.0, "cpu_s_per_1k_steps": 20.0}}

    _fake_module(monkeypatch, "bench.baselines", EmulatorCeiling=FakeCeiling, run_naive_pipeline=run_naive_pipeline)
    _fake_head(monkeypatch, run_training)
    data = _run(monkeypatch, tmp_path, "--seconds", "0.5",
                *[a for p in ("components", "scale", "sweep") for a in ("--skip", p)])
    assert order == ["ceiling", "project", "drain", "naive", "train"] * 3
    eff = data["pipeline_efficiency"]
    assert (eff["median"], eff["min"], eff["max"]) == (pytest.approx(0.9), pytest.approx(0.75), pytest.approx(1.05))
    assert eff["noise"] == [pytest.approx(1.05)]
    assert data["pipeline_sps"] == pytest.approx(180.0) and data["emulator_ceiling_sps"] == pytest.approx(200.0)
    assert data["train_pair"] == {"ours_sps": pytest.approx(40.0), "ours_ups": pytest.approx(3.0),
                                  "naive_sps": 50.0, "naive_ups": 4.0}
    assert data["cpu_s_per_1k_steps"]["ceiling"] == 5.0 and data["cpu_s_per_1k_steps"]["naive_train"] == 20.0
    assert data["details"]["drain_pair"]["ours_over_naive"]["median"] == pytest.approx(1.8)
    assert data["project_env_sps"] == pytest.approx(200.0)


def test_pipeline_cpu_is_read_between_the_window_rows(tmp_path):
    steady = {"first_row": 1, "last_row": 4, "steps": 500}
    snaps = {1: (100.0, {10: 1.0, 11: 2.0}), 3: (500.0, {10: 2.0, 11: 4.0, 12: 1.0})}  # pid 12 started inside
    # row 4 (written while the head shut down) has no snapshot: the window ends at row 3, steps and CPU alike
    assert bench.window_cpu_per_1k(steady, snaps) == pytest.approx(1000 * 4.0 / 400)
    assert bench.window_cpu_per_1k({"first_row": 0, "last_row": 3, "steps": 400}, snaps) is None
    rows = [{"time": 0.0, "env_steps": 0}, {"time": 1.0, "env_steps": 100}, {"time": 3.0, "env_steps": 500}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    s = bench.steady_rates(path)
    assert (s["first_row"], s["last_row"], s["steps"]) == (1, 2, 400)


def test_pipeline_without_steady_window_is_null_not_startup_diluted(monkeypatch, tmp_path):
    def run_training(cfg, run_dir, max_env_steps=None, max_seconds=None, train=True, stop_event=None):
        return {"env_steps": 0, "elapsed_s": 14.0, "env_steps_per_s": 0.0, "updates": 0, "updates_per_s": 0.0}

    _fake_head(monkeypatch, run_training)
    data = _run(monkeypatch, tmp_path, *SKIP_ALL_BUT_PIPELINE)
    assert data["pipeline_sps"] is None and "no steady-state window" in data["errors"]["pipeline_sps"]
    assert data["details"]["pipeline"][0]["env_steps_per_s"] == 0.0


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


def _skewed_collector_rows(seed: int, n: int = 14, rate: float = 100.0, chunk: int = 512, skew_s: float = 10.0,
                           run_s: float = 35.0, row_s: float = 0.5) -> list[dict]:
    """Metrics rows of n collectors that start up to skew_s apart and then each land a chunk every chunk/rate s."""
    starts = np.random.default_rng(seed).uniform(0.0, skew_s, n)
    rows = []
    for k in range(int(run_s / row_s) + 1):
        done = np.floor(np.maximum(k * row_s - starts, 0.0) / (chunk / rate))
        rows.append({"time": k * row_s, "env_steps": int(done.sum()) * chunk, "collectors_delivered": int((done > 0).sum())})
    return rows


def test_steady_window_opens_once_every_collector_has_delivered(tmp_path):
    """Opening at the first arrival counts late starters' idle start-up as window time."""
    path, old = tmp_path / "metrics.jsonl", tmp_path / "old.jsonl"
    worst_old = worst_new = 0.0
    for seed in range(5):
        rows = _skewed_collector_rows(seed)
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        old.write_text("\n".join(json.dumps({k: v for k, v in r.items() if k != "collectors_delivered"}) for r in rows))
        true = 14 * 100.0
        worst_new = max(worst_new, abs(bench.steady_rates(path, collectors=14)["env_steps_per_s"] / true - 1))
        worst_old = max(worst_old, abs(bench.steady_rates(old)["env_steps_per_s"] / true - 1))
        assert bench.steady_rates(path)["first_row"] == bench.steady_rates(path, collectors=14)["first_row"]
    assert worst_old > 0.1 and worst_new < 0.04, (worst_old, worst_new)
    # while the run is live, the window (and the stop timer) has not opened until all have delivered
    rows = _skewed_collector_rows(0)
    opened = next(i for i, r in enumerate(rows) if r["collectors_delivered"] == 14)
    path.write_text("\n".join(json.dumps(r) for r in rows[:opened]) + "\n")
    assert "of 14 collectors have delivered" in bench.steady_rates(path, need_rows=1, collectors=14)["why"]
    path.write_text("\n".join(json.dumps(r) for r in rows[:opened + 1]) + "\n")
    assert bench.steady_rates(path, need_rows=1, collectors=14)["first_data_after_s"] == rows[opened]["time"]
    # a collector that never delivers: the window opens once all the others have
    for r in rows:
        r["collectors_delivered"] = min(r["collectors_delivered"], 13)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    steady = bench.steady_rates(path, collectors=14)
    assert steady["collectors_delivered"] == 13 and steady["env_steps_per_s"] > 0


def test_pipeline_failure_is_an_explicit_error(monkeypatch, tmp_path):
    def run_training(*args, **kwargs):
        raise RuntimeError("head exploded")

    _fake_head(monkeypatch, run_training)
    data = _run(monkeypatch, tmp_path, *SKIP_ALL_BUT_PIPELINE)
    assert data["pipeline_sps"] is None and "head exploded" in data["errors"]["pipeline_sps"]
    assert "head exploded" in data["details"]["pipeline_0"]["error"]
    assert "head exploded" in data["errors"]["training_sps"]


def test_components_are_wired_and_absences_explained(monkeypatch, tmp_path):
    _fake_module(monkeypatch, "fake_replay_bench", run_replay_bench=lambda quick: {"replay_insert_tps": 1e6, "quick": quick})
    monkeypatch.setattr(bench, "COMPONENTS", {  # only fakes: the real component benches take minutes
        "replay": ((("fake_replay_bench", "run_replay_bench"),), ("replay_insert_tps", "bytes_per_transition")),
        "transport": ((("no_such_module_xyz", "run_no_such_bench_xyz"),), ("transport_tps",)),
    })
    data = _run(monkeypatch, tmp_path, "--quick", *[a for p in ("ceiling", "naive", "pipeline", "scale", "sweep") for a in ("--skip", p)])
    assert data["replay_insert_tps"] == 1e6 and data["details"]["replay"]["quick"] is True
    assert "reported no 'bytes_per_transition'" in data["errors"]["bytes_per_transition"]
    assert data["transport_tps"] is None and "no_such_module_xyz" in data["errors"]["transport_tps"]


def test_mario_action_masks_are_the_joypad_bitmasks():
    from bench.baselines import mario_action_masks

    assert mario_action_masks("right_only") == [0, 128, 129, 130, 131]
    assert mario_action_masks("simple") == [0, 128, 129, 130, 131, 1, 64]


@pytest.mark.slow
@pytest.mark.alone  # measures rates over short windows
def test_tiny_real_run_measures_ceiling_and_naive(tmp_path):
    """Real processes, tiny settings: every measured figure is a positive number from this run."""
    data = _run(None, tmp_path, "--env", "CartPole-v1", "--collectors", "1", "--envs-per-collector", "1", "--set", "learner.precision=fp32",
                "--seconds", "0.5", "--quick", "--skip", "pipeline", "--skip", "components", "--skip", "scale")
    for key in ("emulator_ceiling_sps", "naive_drain_sps", "naive_pipeline_sps"):
        assert data[key] is not None and data[key] > 0, data["errors"].get(key)
    assert all(r["updates"] > 0 for r in data["details"]["naive_train"])
    assert len(data["details"]["repeats"]["ceiling"]) == bench.REPEATS[True]
    for phase in ("ceiling", "naive_drain", "naive_train"):  # CPU per step of every process, every repeat
        assert all(r["cpu_s_per_1k_steps"] > 0 for r in data["details"]["repeats"][phase]), phase


def test_backends_are_reported_side_by_side_with_reasons(tmp_path, capsys):
    out = tmp_path / "latest.json"
    assert bench.main([*ALL_SKIPPED, "--quick", "--backends", "nes-py", "retro", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["backends"]) == ["nes-py", "retro"]
    for figures in report["backends"].values():
        assert figures["emulator_ceiling_sps"] is None and figures["cpu_efficiency"] is None
        assert figures["errors"]["emulator_ceiling_sps"] == "skipped (--skip ceiling)"
    assert "backend retro: emulator_ceiling_sps n/a" in capsys.readouterr().out
