"""evaluate.suite (`make suite`) with evaluate.levels, evaluate.stats and `evaluate.random_policy --levels`.

The statistics are checked on hand-made numbers whose IQM and bootstrap interval follow by hand. The
suite plays the real emulator: the shipped 1-1 checkpoint (docs/checkpoints/mario-1-1-cpu) and a fresh
network saved by a real Learner, on two levels, a couple of episodes capped at a few dozen steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from envs.factory import make_env
from envs.testing import COUNTING_ENV_ID
from evaluate import random_policy as rpb
from evaluate.evaluate import find_baseline
from evaluate.levels import RANDOM_STAGES, Level, LevelError, parse_level, parse_levels
from evaluate.stats import aggregate, iqm, stratified_bootstrap_ci
from evaluate.suite import episode_seeds
from evaluate.suite import main as suite_main
from shared.config import Config, EnvConfig
from tests.support.cluster import ROOT, head_env
from tests.support.learner_fakes import make_run_dir

SHIPPED = ROOT / "docs" / "checkpoints" / "mario-1-1-cpu"
SHIPPED_ENV = Config.from_dict(json.loads((SHIPPED / "checkpoint" / "config.json").read_text())).env
PER_CHECKPOINT = ("flag_rate", "mean_x_pos", "max_x_pos", "mean_return", "mean_length", "episodes")


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory) -> Path:
    """A right_only Mario checkpoint (another 'training seed' than the shipped one): greedy runs right."""
    return make_run_dir(tmp_path_factory.mktemp("fresh") / "run", SHIPPED_ENV,
                     num_actions=5, favor_action=1)


# ---------------------------------------------------------------------- statistics
def test_iqm_on_hand_made_numbers() -> None:
    assert iqm(np.array([1, 2, 3, 4, 100, 5, 6, 7])) == 4.5  # 8 scores: drop 2 at each end, mean of 3, 4, 5, 6
    assert iqm(np.array([[0, 10], [1, 1], [2, 3], [100, -5]])) == 1.75  # all 8 together: mean of 1, 1, 2, 3
    assert iqm(np.array([3.0])) == 3.0
    assert iqm(np.array([0.0, 1.0])) == 0.5  # n < 4: nothing dropped, the mean
    assert iqm(np.array([1.0, 2.0, 10.0])) == pytest.approx(13 / 3)
    assert iqm(np.array([9, 1, 5, 7, 3])) == 5.0  # floor(5/4) = 1 dropped at each end: mean of 3, 5, 7
    with pytest.raises(ValueError):
        iqm(np.array([]))


def test_bootstrap_interval_on_hand_made_numbers() -> None:
    # one checkpoint: every resample is the point
    assert stratified_bootstrap_ci(np.array([0.4])) == (0.4, 0.4)
    assert stratified_bootstrap_ci(np.array([[0.2, 0.9]])) == (0.55, 0.55)
    assert stratified_bootstrap_ci(np.full(5, 0.3)) == (0.3, 0.3)
    # two seeds 0 and 1: resamples {0,0}, {0,1}, {1,1} with probability 1/4, 1/2, 1/4, so the 2.5% and 97.5%
    # quantiles of 2,000 resamples lie in the masses at 0 and 1
    assert stratified_bootstrap_ci(np.array([0.0, 1.0])) == (0.0, 1.0)
    # stratified: level A's runs are both 0, level B's both 1, so every resample holds two 0s and two 1s
    # (IQM 0.5); the same four numbers as one stratum resample to anything between 0 and 1
    assert stratified_bootstrap_ci(np.array([[0.0, 1.0], [0.0, 1.0]])) == (0.5, 0.5)
    assert stratified_bootstrap_ci(np.array([0.0, 0.0, 1.0, 1.0])) == (0.0, 1.0)


def test_bootstrap_is_seeded_and_brackets_the_point() -> None:
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.6, 0.2])
    first = stratified_bootstrap_ci(scores)
    assert stratified_bootstrap_ci(scores) == first  # fixed generator seed: the same interval
    low, high = first
    assert 0.1 <= low < iqm(scores) < high <= 0.8
    narrow = stratified_bootstrap_ci(scores, confidence=0.5)
    assert low <= narrow[0] <= narrow[1] <= high
    assert aggregate(scores) == {"iqm": iqm(scores), "ci_low": low, "ci_high": high, "runs": 6}
    with pytest.raises(ValueError):
        stratified_bootstrap_ci(scores, resamples=0)


# ---------------------------------------------------------------------- levels
def test_level_names() -> None:
    assert parse_level("1-2") == Level("1-2", "SuperMarioBros-1-2-v0")
    assert parse_level(" SuperMarioBros-1-2-v0 ") == Level("1-2", "SuperMarioBros-1-2-v0")
    assert parse_level("SuperMarioBros-4-3-v1") == Level("4-3-v1", "SuperMarioBros-4-3-v1")
    random = parse_level("SuperMarioBrosRandomStages-v0")
    assert random.env_id == "SuperMarioBrosRandomStages-v0" and random.stages == ("1-1", "1-2", "1-3", "1-4")
    assert [lv.name for lv in parse_levels("1-1,1-2,1-3,1-4")] == ["1-1", "1-2", "1-3", "1-4"]
    for bad in ("9-1", "1-5", "SuperMarioBros-v0", "SuperMarioBros2-v0", "SuperMarioBrosRandomStages-v4", "world1"):
        with pytest.raises(LevelError, match="allowed"):
            parse_level(bad)
    with pytest.raises(LevelError, match="twice"):
        parse_levels("1-2,SuperMarioBros-1-2-v0")
    with pytest.raises(LevelError, match="no level"):
        parse_levels(" ")


def test_random_stages_draw_world_1_stages_as_the_package_does() -> None:
    env = make_env(replace(SHIPPED_ENV, env_id="SuperMarioBrosRandomStages-v0"))
    try:
        drawn = []
        for seed in range(6):
            _, info = env.reset(seed=seed)
            # the package's draw: np_random.seed(seed); np_random.choice(stages)
            expected = np.random.RandomState(seed).choice(list(RANDOM_STAGES))
            assert f"{info['world']}-{info['stage']}" == expected
            _, _, _, _, info = env.step(1)
            assert (info["world"], info["stage"]) == tuple(int(v) for v in expected.split("-"))
            drawn.append(expected)
        assert len(set(drawn)) > 1
        _, again = env.reset(seed=3)
        assert f"{again['world']}-{again['stage']}" == drawn[3]
    finally:
        env.close()


def test_episode_seeds_differ_per_seed_and_episode() -> None:
    seeds = {episode_seeds(s, k) for s in range(3) for k in range(4)}
    assert len(seeds) == 12 and episode_seeds(1, 2) == episode_seeds(1, 2)


# ---------------------------------------------------------------------- the suite end to end
def _suite_args(out: Path, fresh_run: Path, seeds: str = "3") -> list[str]:
    return [str(SHIPPED), str(fresh_run / "checkpoint"), "--levels", "1-1,SuperMarioBros-1-2-v0",
            "--episodes", "2", "--seeds", seeds, "--epsilon", "0.5", "--max-steps", "25", "--out", str(out)]


def test_suite_two_levels_two_checkpoints_is_deterministic(fresh_run: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "evaluate.suite", *_suite_args(tmp_path / "a", fresh_run)],
                          cwd=ROOT, env=head_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "across 2 checkpoint(s)" in proc.stdout
    report = json.loads((tmp_path / "a" / "suite.json").read_text())

    assert suite_main(_suite_args(tmp_path / "b", fresh_run)) == 0  # the same inputs again, in this process
    assert json.loads((tmp_path / "b" / "suite.json").read_text()) == report

    s = report["settings"]
    assert s["levels"] == ["SuperMarioBros-1-1-v0", "SuperMarioBros-1-2-v0"] and s["eval_seeds"] == [3]
    assert (s["episodes_per_level"], s["epsilon"], s["max_steps"]) == (2, 0.5, 25)
    assert s["statistics"]["resamples"] == 2000
    assert [c["path"] for c in report["checkpoints"]][0] == "docs/checkpoints/mario-1-1-cpu/checkpoint"
    assert report["checkpoints"][1]["env"]["action_set"] == "right_only"
    assert [lv["name"] for lv in report["levels"]] == ["1-1", "1-2"]
    for level, stage in zip(report["levels"], (1, 2), strict=True):
        rows = level["checkpoints"]
        assert len(rows) == 2
        for row in rows:
            assert set(PER_CHECKPOINT) <= set(row) and row["episodes"] == 2
            episodes = row["episode_results"]
            assert [(e["eval_seed"], e["episode"]) for e in episodes] == [(3, 0), (3, 1)]
            assert all(0 < e["steps"] <= 25 and (e["world"], e["stage"]) == (1, stage) for e in episodes)
            assert row["mean_x_pos"] == np.mean([e["x_pos"] for e in episodes])
            assert row["max_x_pos"] == max(e["x_pos"] for e in episodes)
            assert row["flag_rate"] == np.mean([e["flag_get"] for e in episodes])
            assert row["stages_played"] == {f"1-{stage}": 2}
        for key in ("flag_rate", "mean_x_pos"):
            agg = level["across_checkpoints"][key]
            assert agg["runs"] == 2 and agg["iqm"] == pytest.approx(np.mean([r[key] for r in rows]))  # n < 4: mean
            assert min(r[key] for r in rows) == agg["ci_low"] <= agg["iqm"] <= agg["ci_high"] == max(
                r[key] for r in rows)
        recorded = json.loads((ROOT / level["random"]["path"]).read_text())
        assert recorded["env_id"] == level["env_id"] and recorded["action_set"] == "right_only"
        assert level["random"]["mean_x_pos"] == recorded["mean_x_pos"]
    assert any("max_steps" in note for note in report["notes"])  # recorded uncapped, played capped
    assert report["all_levels"]["flag_rate"]["runs"] == 2
    with Image.open(tmp_path / "a" / "suite.png") as im:
        assert im.format == "PNG" and im.size[0] > 600

    # other evaluation seeds: other episodes (the seeds reach the env and the epsilon draws)
    assert suite_main(_suite_args(tmp_path / "c", fresh_run, seeds="4")) == 0
    other = json.loads((tmp_path / "c" / "suite.json").read_text())
    assert [r["episode_results"] for lv in other["levels"] for r in lv["checkpoints"]] != [
        r["episode_results"] for lv in report["levels"] for r in lv["checkpoints"]]


def test_one_checkpoint_interval_is_the_point_and_says_so(tmp_path: Path, capsys) -> None:
    assert suite_main([str(SHIPPED), "--levels", "1-1", "--episodes", "1", "--seeds", "0,1", "--max-steps", "10",
                       "--out", str(tmp_path)]) == 0
    assert "one checkpoint: the interval is the point" in capsys.readouterr().out
    report = json.loads((tmp_path / "suite.json").read_text())
    agg = report["levels"][0]["across_checkpoints"]["mean_x_pos"]
    assert agg["ci_low"] == agg["iqm"] == agg["ci_high"] == report["levels"][0]["checkpoints"][0]["mean_x_pos"]
    assert any("one checkpoint" in note for note in report["notes"])


# ---------------------------------------------------------------------- bad input: one line, exit 2
def _fails(argv: list[str], capsys, *expected: str) -> None:
    assert suite_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err


def test_bad_input_exits_2_with_one_line(fresh_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    ckpt = str(fresh_run)
    _fails([ckpt, "--levels", "1-1,1-9", "--out", str(out)], capsys, "'1-9'", "allowed")
    _fails([str(tmp_path / "nope"), "--levels", "1-1", "--out", str(out)], capsys, str(tmp_path / "nope"))
    _fails([ckpt, "--levels", "1-1", "--seeds", "0,x", "--out", str(out)], capsys, "--seeds")
    _fails([ckpt, "--levels", "1-1", "--episodes", "0", "--out", str(out)], capsys, "--episodes=0")
    _fails([ckpt, "--levels", "1-1", "--epsilon", "2", "--out", str(out)], capsys, "--epsilon=2.0")
    _fails([ckpt, "--levels", "1-1", "--backend", "snes", "--out", str(out)], capsys, "--backend",
           "env.backend='snes'", "allowed auto, nes-py, retro")
    assert not out.exists()  # nothing written for bad input


def test_non_mario_and_mixed_checkpoints_exit_2(fresh_run: Path, tmp_path: Path, capsys) -> None:
    counting = make_run_dir(tmp_path / "counting", EnvConfig(env_id=COUNTING_ENV_ID), num_actions=4)
    _fails([str(counting), "--levels", "1-1", "--out", str(tmp_path / "o")], capsys, COUNTING_ENV_ID,
           "not Super Mario Bros")
    simple = make_run_dir(tmp_path / "simple", EnvConfig(), num_actions=7)  # 7 actions: the simple set
    _fails([str(fresh_run), str(simple), "--levels", "1-1", "--out", str(tmp_path / "o")], capsys, "disagree")


# ---------------------------------------------------------------------- random-policy rows
def test_random_policy_writes_one_json_per_level(tmp_path: Path) -> None:
    config = SHIPPED / "checkpoint" / "config.json"
    assert rpb.main(["--config", str(config), "--levels", "1-3,SuperMarioBrosRandomStages-v0", "--episodes", "2",
                     "--max-steps", "6", "--out-dir", str(tmp_path)]) == 0
    stage = json.loads((tmp_path / "random_policy_1-3_right_only.json").read_text())
    assert stage["env"] == asdict(replace(SHIPPED_ENV, env_id="SuperMarioBros-1-3-v0"))
    assert stage["episodes"] == 2 and all(0 < n <= 6 for n in stage["lengths"])
    random = json.loads((tmp_path / "random_policy_random-W1_right_only.json").read_text())
    assert random["env_id"] == "SuperMarioBrosRandomStages-v0"
    found = find_baseline(replace(SHIPPED_ENV, env_id="SuperMarioBros-1-3-v0"), tmp_path)
    assert found is not None and found[1].name == "random_policy_1-3_right_only.json"
    for bad in (["--levels", "1-3", "--out", str(tmp_path / "x.json")], ["--levels", "1-3"],
                ["--out-dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as exc:
            rpb.main(bad)
        assert exc.value.code == 2
    assert rpb.main(["--levels", "1-9", "--out-dir", str(tmp_path)]) == 2


@pytest.mark.parametrize("stage", [1, 2, 3, 4])
def test_recorded_random_rows_use_the_shipped_checkpoints_env(stage: int) -> None:
    env = replace(SHIPPED_ENV, env_id=f"SuperMarioBros-1-{stage}-v0")
    found = find_baseline(env)
    assert found is not None and found[1].name == f"random_policy_1-{stage}_right_only.json"
    data = found[0]
    # every field recorded is the shipped env's; fields added to EnvConfig since (env.backend) keep the defaults the
    # recording ran with (the rule of tests/record_mario_golden.py replays_alike)
    assert data["env"].items() <= asdict(env).items() and data["episodes"] >= 20 and data["max_steps"] is None
    assert len(data["x_pos"]) == data["episodes"] and data["mean_x_pos"] == pytest.approx(np.mean(data["x_pos"]))
