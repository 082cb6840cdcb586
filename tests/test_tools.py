"""The command-line tools beside the trainer (`python -m bench.<tool>`, `python -m experiments.<tool>`,
`python -m evaluate.<tool>`, the chaos harness in tests/hostile/, the fixture recorders): each starts from a fresh
interpreter with no path set up by hand, and the ones that take input refuse bad input with a one-line error and
exit code 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import proxy
from tests.support.cluster import ROOT

# the research tools (experiments/) carry the experiments mark: make test-experiments runs them
EXPERIMENTS = ["experiments.backend_steps", "experiments.cartpole_race", "experiments.cleanrl_dqn", "experiments.env_ceiling",
               "experiments.learner_checkouts",
               "experiments.profile_insert", "experiments.proxy"]
TOOLS = ["tests.hostile.attack", *(pytest.param(m, marks=pytest.mark.experiments) for m in EXPERIMENTS),
         "bench.record_scale_chunks", "tests.hostile.soak", "evaluate.average", "evaluate.export",
         "evaluate.campaign", "evaluate.levels_table",
         "evaluate.random_policy",
         "tests.record_mario_golden"]


def _run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("module", TOOLS)
def test_help_names_the_module(module: str) -> None:
    proc = _run(module, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m {module}")


@pytest.mark.experiments
@pytest.mark.parametrize("args", [["--env", "CartPole-v1"], ["--env", "SuperMarioBros-v0"], ["--blocks", "0"]])
def test_backend_steps_bad_input_is_one_line(args: list[str], capsys) -> None:
    from experiments import backend_steps

    assert backend_steps.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_export_of_a_missing_run_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _run("evaluate.export", str(tmp_path / "no-such-run"), str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_an_export_over_the_size_limit_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    from evaluate import export
    from tests.support.learner_fakes import make_learner

    learner = make_learner()
    try:
        learner.save_checkpoint(tmp_path / "run")
    finally:
        learner.close()
    assert export.main([str(tmp_path / "run"), str(tmp_path / "ok")]) == 0
    size = sum(f.stat().st_size for f in (tmp_path / "ok" / "checkpoint").rglob("*") if f.is_file())
    # half, not size - 1: meta.json's creation time is a float whose printed length varies by a byte or two
    monkeypatch.setattr(export, "MAX_BYTES", size // 2)
    assert export.main([str(tmp_path / "run"), str(tmp_path / "big")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert re.search(rf"copy is (\d+) bytes, over the {size // 2}-byte limit", err), err
    assert abs(int(re.search(r"copy is (\d+) bytes", err)[1]) - size) <= 16
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok", "run"]  # no out dir, no staging left


@pytest.mark.experiments
def test_proxy_refuses_a_non_positive_duration(tmp_path: Path) -> None:
    proc = _run("experiments.proxy", str(tmp_path / "run"), "--seed", "0", "--seconds", "0")
    assert proc.returncode == 2 and "--seconds=0.0" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args", [["--minutes", "0"], ["--capacity", "100"]])
def test_soak_refuses_bad_input_before_starting_anything(args: list[str], tmp_path: Path) -> None:
    proc = _run("tests.hostile.soak", *args, "--workdir", str(tmp_path / "soak"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "soak").exists()


@pytest.mark.experiments
def test_proxy_trains_then_evaluates_the_same_run_dir() -> None:
    train, evaluate = proxy.commands("runs/x", 3, 60.0, ["--profile", "cpu", "--set", "collectors.eps_per=stream"])
    assert train[1:3] == ["-m", "launcher"] and evaluate[1:3] == ["-m", "evaluate"]
    assert train[train.index("--run-dir") + 1] == "runs/x" and train[train.index("--seed") + 1] == "3"
    assert train[-4:] == ["--profile", "cpu", "--set", "collectors.eps_per=stream"]
    assert "transport.port=0" in train  # two proxies at once never race for a port
    assert evaluate[3] == "runs/x" and evaluate[evaluate.index("--out") + 1] == "runs/x/final_eval"
    assert evaluate[evaluate.index("--episodes") + 1] == "10" and evaluate[evaluate.index("--epsilon") + 1] == "0.05"
    own_port = proxy.commands("runs/x", 0, 60.0, ["--port", "7600"])[0]
    assert "transport.port=0" not in own_port and own_port[-2:] == ["--port", "7600"]
