"""evaluate.evaluate (`make eval`), evaluate.plots, evaluate.video and evaluate.random_policy.

Checkpoints come from a real `Learner.save_checkpoint` over a fake replay (no cluster run): the
counting env (84x84 uint8 frames) keeps the fast tests fast, the Mario test (slow) plays a fresh
network on the real emulator and checks the GIF holds real RGB screens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from envs.testing import COUNTING_ENV_ID
from evaluate import random_policy as rpb
from evaluate.evaluate import find_baseline
from evaluate.evaluate import main as evaluate_main
from evaluate.plots import _wall_minutes, periodic_evals, plot_learning_curve, plot_runs, read_metrics
from evaluate.plots import main as plots_main
from evaluate.video import FrameRecorder, to_rgb, write_gif
from shared.config import EnvConfig
from tests.support.cluster import ROOT, head_env
from tests.support.learner_fakes import FakeReplay, make_learner, make_run_dir, small_config


@pytest.fixture(scope="module")
def counting_run(tmp_path_factory) -> Path:
    return make_run_dir(tmp_path_factory.mktemp("counting") / "run", EnvConfig(env_id=COUNTING_ENV_ID), num_actions=4)


def _gif_frames(path: Path) -> tuple[int, tuple[int, int], str]:
    with Image.open(path) as im:
        n = getattr(im, "n_frames", 1)
        return n, im.size, im.format


# ---------------------------------------------------------------------- CLI end to end
def test_cli_writes_json_gif_and_png(counting_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "evaluate.evaluate", str(counting_run), "--episodes", "2",
                           "--epsilon", "0.3", "--out", str(out)], cwd=ROOT, env=head_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "episode   1/2" in proc.stdout and "summary (2 episodes" in proc.stdout
    report = json.loads((out / "eval.json").read_text())
    s = report["summary"]
    assert s["episodes"] == 2 and len(report["episodes"]) == 2
    assert s["mean_length"] == 37 and s["flag_rate"] == 0.0 and s["max_x_pos"] == 0  # counting env: no x_pos
    assert report["counters"]["env_steps"] == 4096 and report["counters"]["updates"] == 1
    n, size, fmt = _gif_frames(out / "best_episode.gif")
    assert fmt == "GIF" and n > 1 and size == (252, 252)  # 84x84 observation upscaled x3 (no renderer)
    assert report["video"]["source"] == "observation" and report["video"]["frames"] == 38
    with Image.open(out / "learning_curve.png") as im:
        assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 300


def test_default_out_is_run_eval_and_checkpoint_dir_accepted(counting_run: Path, capsys) -> None:
    assert evaluate_main([str(counting_run / "checkpoint"), "--episodes", "1", "--no-video"]) == 0
    report = json.loads((counting_run / "eval" / "eval.json").read_text())
    assert report["video"] == {} and report["learning_curve"].endswith("learning_curve.png")
    assert "note" not in capsys.readouterr().out  # one episode: nothing to call identical


def test_greedy_deterministic_env_notes_identical_episodes(counting_run: Path, tmp_path: Path, capsys) -> None:
    assert evaluate_main([str(counting_run), "--episodes", "2", "--out", str(tmp_path), "--no-video",
                          "--max-steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "all episodes identical" in out
    report = json.loads((tmp_path / "eval.json").read_text())
    assert [e["steps"] for e in report["episodes"]] == [5, 5]
    assert {e["ended_by"] for e in report["episodes"]} == {"max_steps"}


# ---------------------------------------------------------------------- errors: exit 2 naming the file
def test_corrupt_checkpoint_exits_2_naming_the_file(counting_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(counting_run, run, ignore=shutil.ignore_patterns("eval"))
    model = run / "checkpoint" / "model.pt"
    model.write_bytes(model.read_bytes()[:100])
    proc = subprocess.run([sys.executable, "-m", "evaluate.evaluate", str(run)], cwd=ROOT, env=head_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert str(model) in proc.stderr and "truncated" in proc.stderr
    assert not (run / "eval").exists()


def test_missing_checkpoint_exits_2(tmp_path: Path, capsys) -> None:
    assert evaluate_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint found" in err and str(tmp_path / "checkpoint" / "meta.json") in err


def test_geometry_mismatch_exits_2(tmp_path: Path, capsys) -> None:
    run = make_run_dir(tmp_path / "run", EnvConfig(env_id=COUNTING_ENV_ID), num_actions=5)  # the env has 4
    assert evaluate_main([str(run)]) == 2
    err = capsys.readouterr().err
    assert "model.pt" in err and "5 actions" in err and "4 actions" in err


def test_bad_arguments_exit_2(counting_run: Path) -> None:
    for bad in (["--episodes", "0"], ["--epsilon", "1.5"], ["--max-steps", "0"]):
        with pytest.raises(SystemExit) as exc:
            evaluate_main([str(counting_run), *bad])
        assert exc.value.code == 2


# ---------------------------------------------------------------------- modules
def test_frame_recorder_is_bounded_and_spans_the_episode() -> None:
    rec = FrameRecorder(max_frames=10)
    for t in range(1000):
        rec.add(np.full((2, 2, 3), t % 256, dtype=np.uint8))
    assert len(rec.frames) < 10 and rec.stride >= 128
    assert rec.stride * len(rec.frames) > 1000 - rec.stride  # still spans the whole episode
    firsts = [int(f[0, 0, 0]) for f in rec.frames]
    assert firsts[:3] == [0, rec.stride % 256, (2 * rec.stride) % 256]


def test_to_rgb_and_gif(tmp_path: Path) -> None:
    assert to_rgb(np.zeros(4, dtype=np.float32)) is None  # vector observation: nothing to show
    gray = to_rgb(np.arange(16, dtype=np.uint8).reshape(4, 4), upscale=2)
    assert gray is not None and gray.shape == (8, 8, 3)
    frames = [np.full((8, 8, 3), v, dtype=np.uint8) for v in (0, 128, 255)]
    n, size, fmt = _gif_frames(write_gif(frames, tmp_path / "a.gif", fps=15))
    assert (n, size, fmt) == (3, (8, 8), "GIF")


def test_wall_minutes_join_resumed_segments() -> None:
    rows = [{"elapsed_s": 60}, {"elapsed_s": 120}, {"elapsed_s": 30}, {"elapsed_s": 90}, {"x": 1}]
    assert _wall_minutes(rows) == [1.0, 2.0, 2.5, 3.5, None]  # the second segment starts where the first ended


def test_plot_runs_overlays_runs_with_their_periodic_evaluations(tmp_path: Path) -> None:
    for name, slope in (("a", 1), ("b", 2)):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(
            {"env_steps": i * 100, "elapsed_s": i * 10.0, "mean_x_pos_20": 100 + slope * i, "mean_return_20": i,
             "mean_x_pos_20_greedy": 110 + slope * i, "mean_return_20_greedy": i + 1}) for i in range(6)))
        (run / "evals.jsonl").write_text(json.dumps({"env_steps": 250, "mean_x_pos": 300.0, "mean_return": 5.0,
                                                     "flag_rate": 0.1}) + "\n")
    rows = read_metrics(tmp_path / "a" / "metrics.jsonl")
    evals = periodic_evals(tmp_path / "a" / "metrics.jsonl", rows)
    assert evals == [{"env_steps": 250.0, "minutes": 0.5, "mean_x_pos": 300.0, "mean_return": 5.0, "flag_rate": 0.1}]
    png = plot_runs([("seed 0", tmp_path / "a"), ("seed 1", tmp_path / "b" / "metrics.jsonl")], tmp_path / "r.png",
                    {"mean_x_pos": 200.0, "mean_return": 2.0})
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size[0] > im.size[1]  # four panels, two columns
    with pytest.raises(ValueError, match="nope"):
        plot_runs([("x", tmp_path / "nope")], tmp_path / "s.png")
    assert plots_main([str(tmp_path / "a"), "--out", str(tmp_path / "t.png"), "--labels", "one", "two"]) == 2
    assert plots_main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "t.png")]) == 0


def test_plot_with_random_baseline(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps({"env_steps": i * 100, "mean_x_pos_20": 100 + i, "mean_return_20": i})
                                 for i in range(5)) + "\nnot json\n")
    assert len(read_metrics(metrics)) == 5
    png = plot_learning_curve(metrics, tmp_path / "c.png", {"mean_x_pos": 250.0, "mean_return": 180.0},
                              eval_point={"env_steps": 400, "mean_x_pos": 120.0, "mean_return": 3.0})
    with Image.open(png) as im:
        assert im.format == "PNG"
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"env_steps": 1}\n')
    with pytest.raises(ValueError, match="empty.jsonl"):
        plot_learning_curve(empty, tmp_path / "d.png")


def test_recorded_mario_baseline_is_found_for_the_default_env() -> None:
    found = find_baseline(EnvConfig())  # docs/random_policy_1-1.json: 1-1, simple, frame skip 4
    assert found is not None and found[1].name == "random_policy_1-1.json"
    assert found[0]["episodes"] >= 20 and found[0]["mean_x_pos"] > 40
    right = find_baseline(EnvConfig(action_set="right_only"))  # docs/random_policy_1-1_right_only.json
    assert right is not None and right[1].name == "random_policy_1-1_right_only.json"
    assert right[0]["action_set"] == "right_only" and right[0]["episodes"] >= 20
    assert find_baseline(EnvConfig(action_set="complex")) is None  # no recording for that action set: no line


def test_random_baseline_script(tmp_path: Path) -> None:
    result = rpb.run_baseline(EnvConfig(env_id=COUNTING_ENV_ID), episodes=3, seed=1, verbose=False)
    assert result["episodes"] == 3 and len(result["returns"]) == 3 and result["env_id"] == COUNTING_ENV_ID
    assert {"mean_x_pos", "std", "mean_return", "action_set", "frame_skip"} <= set(result)
    assert result["lengths"] == [37, 37, 37]
    out = tmp_path / "b.json"
    assert rpb.main(["--env-id", COUNTING_ENV_ID, "--episodes", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["episodes"] == 2
    assert rpb.main(["--env-id", "NoSuchEnv-v9", "--episodes", "1"]) == 2


# ---------------------------------------------------------------------- real Mario
@pytest.mark.slow
def test_mario_fresh_network_real_frames_gif(tmp_path: Path) -> None:
    # 1-1, simple (7 actions), 84x84 x4; greedy = "right" so Mario visibly moves
    run = make_run_dir(tmp_path / "run", EnvConfig(), num_actions=7, favor_action=1)
    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "-m", "evaluate.evaluate", str(run), "--episodes", "2",
                           "--epsilon", "0.2", "--max-steps", "200", "--out", str(out)],
                          cwd=ROOT, env=head_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "eval.json").read_text())
    assert report["env"]["env_id"] == "SuperMarioBros-1-1-v0"
    assert all(0 < e["steps"] <= 200 for e in report["episodes"])
    assert report["summary"]["max_x_pos"] > 100  # Mario starts at x=40 and walked right
    assert {(e["world"], e["stage"]) for e in report["episodes"]} == {(1, 1)}
    assert report["video"]["source"] == "rgb"
    n, size, fmt = _gif_frames(out / "best_episode.gif")
    assert fmt == "GIF" and n > 1 and size == (256, 240)  # the NES screen, not a grayscale observation
    with Image.open(out / "best_episode.gif") as im:
        im.seek(n - 1)
        colors = im.convert("RGB").getcolors(maxcolors=1 << 16)
        assert colors is not None and len(colors) > 8  # a real picture: sky, ground, Mario
    assert (out / "learning_curve.png").is_file()


# ---------------------------------------------------------------------- the encoder read from the geometry
def _impala_run(run_dir: Path) -> Path:
    cfg = replace(small_config(encoder="impala", encoder_width=2), env=EnvConfig(env_id=COUNTING_ENV_ID))
    learner = make_learner(cfg, replay=FakeReplay(obs_shape=(84, 84), stack=4, num_actions=4, pool=16))
    try:
        learner.run_updates(1)
        learner.save_checkpoint(run_dir, counters={"env_steps": 64, "episodes": 1})
    finally:
        learner.close()
    return run_dir


def test_an_impala_checkpoint_is_played_with_its_encoder(tmp_path: Path) -> None:
    run = _impala_run(tmp_path / "run")
    assert evaluate_main([str(run), "--episodes", "1", "--no-video", "--max-steps", "5",
                          "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert [e["steps"] for e in report["episodes"]] == [5]


def test_an_unknown_encoder_in_the_geometry_exits_2(tmp_path: Path, capsys) -> None:
    run = _impala_run(tmp_path / "run")
    meta_path = run / "checkpoint" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["geometry"]["encoder"] = "resnet"
    meta_path.write_text(json.dumps(meta))
    assert evaluate_main([str(run), "--episodes", "1", "--no-video"]) == 2
    err = capsys.readouterr().err
    assert "meta.json" in err and "'resnet'" in err and "nature, impala" in err
