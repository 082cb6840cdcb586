"""The level campaign (evaluate/campaign.py): trains each level until cleared or out of its budget of training time,
resumes after a kill, refuses a corrupt or foreign state, ships through the suite on seeds disjoint from the
head's and from each other, and regenerates the Levels table. Fakes stand in for training and playing
(tests/support/campaign_fakes.py); the last test ships a real checkpoint with the real tools, a few steps per episode."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import config_optimized as opt
from evaluate import campaign, campaign_state, levels_table
from evaluate.campaign_parts import Children, LauncherTrainer, ModuleEvaluator, TrainJob, done_reason, shown
from evaluate.campaign_ship import ShipTo, ship_level
from evaluate.levels import parse_level
from evaluate.run_time import training_seconds
from tests.support.campaign_fakes import MARKER, FakeEvaluator, FakeTrainer, write_segment
from tests.support.cluster import ROOT, head_env
from tests.support.waits import wait_for

README = f"# readme\n\nprose\n\n{levels_table.START}\n{levels_table.END}\n\nmore prose\n"


def _args(tmp_path: Path, levels: str = "2-1 3-1", hours: str = "1", *extra: str) -> list[str]:
    readme = tmp_path / "README.md"
    if not readme.exists():
        readme.write_text(README)
    return ["--levels", levels, "--hours", hours, "--dir", str(tmp_path / "campaign"), "--docs", str(tmp_path / "docs"),
            "--results", str(tmp_path / "results"), "--readme", str(readme), "--machine", "a test machine", *extra]


def _campaign(tmp_path: Path, trainer: FakeTrainer, evaluator: FakeEvaluator, *args: str) -> campaign.Campaign:
    return campaign.Campaign(campaign.parse(_args(tmp_path, *args)), trainer, evaluator, say=lambda line: None)


def _state(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "campaign" / "campaign.json").read_text())


def test_each_level_trains_until_cleared_ships_and_regenerates_the_table(tmp_path: Path) -> None:
    trainer = FakeTrainer(segment_s=600, reasons=["max_seconds", "flags_cleared", "flags_cleared"])
    evaluator = FakeEvaluator(flags={"0000000200": 0.6, "best": 0.5, "mario-2-1-cpu": 0.6})
    _campaign(tmp_path, trainer, evaluator).run()
    state = _state(tmp_path)
    assert [state["levels"][lv]["stage"] for lv in ("2-1", "3-1")] == ["shipped", "shipped"]
    assert state["levels"]["2-1"]["reason"] == "flags_cleared" and len(state["levels"]["2-1"]["commands"]) == 2
    # 2-1: a new run, then a resume of the same run dir with the rest of the budget
    assert [(j.env_id, j.run_dir.name, j.resume, j.max_seconds) for j in trainer.jobs] == [
        ("SuperMarioBros-2-1-v0", "2-1", False, 3600), ("SuperMarioBros-2-1-v0", "2-1", True, 3000),
        ("SuperMarioBros-3-1-v0", "3-1", False, 3600)]
    # the runner-up the selection suite liked best ships, not best/
    assert state["levels"]["2-1"]["shipped"]["chosen"].endswith("kept/0000000200")
    ship = tmp_path / "docs" / "checkpoints" / "mario-2-1-cpu"
    prov = json.loads((ship / "provenance.json").read_text())
    assert prov["commands"] == state["levels"]["2-1"]["commands"] and prov["stopped_by"] == "flags_cleared"
    assert prov["commands"][0].startswith("python -m launcher --env SuperMarioBros-2-1-v0 --seed 0 --port 0 ")
    assert prov["preset"] == "none" and prov["machine"] == "a test machine"
    assert prov["held_out_seeds"] == list(opt.CAMPAIGN_HELD_OUT_SEEDS)
    assert prov["training_minutes"] == 20 and prov["run_training_minutes"] == 20
    assert (ship / "metrics.jsonl").is_file() and (tmp_path / "docs" / "images" / "mario_2-1_best_episode_cpu.gif").is_file()
    assert [c[1] for c in evaluator.calls if c[0] == "random"] == ["2-1", "3-1"]  # once per new level
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# readme\n\nprose\n") and text.endswith("\nmore prose\n")
    assert "| 2-1 | `mario-2-1-cpu` (2-1) | 18/30 (60%) | 1,600 |" in text
    assert "20 min on a test machine" in text and "| none | 0%, 300 |" in text
    assert "- 2-1, 3-1: 10 episodes under each of the seeds 1000,1001,1002 (held out" in text


def test_a_level_continued_from_its_shipped_network_ships_the_whole_lineage_into_the_same_folder(tmp_path: Path) -> None:
    """--set learner.init_from=<the shipped folder's checkpoint>: the new run's training goes on top of the source's
    (its provenance, read before the export replaces that folder, and kept for a second ship), and the table shows
    the totals."""
    trainer, evaluator = FakeTrainer(segment_s=600, reasons=["flags_cleared"]), FakeEvaluator()
    ship = tmp_path / "docs" / "checkpoints" / "mario-2-1-cpu"
    (ship / "checkpoint").mkdir(parents=True)
    (ship / "checkpoint" / "meta.json").write_text(json.dumps({"counters": {"env_steps": 203_000}}))
    (ship / "provenance.json").write_text(json.dumps({"training_minutes": 72, "campaign_run": str(
        (tmp_path / "campaign" / "2-1").resolve())}))
    init = f"learner.init_from={ship / 'checkpoint'}"
    _campaign(tmp_path, trainer, evaluator, "2-1", "1", "--set", init).run()
    assert trainer.jobs[0].overrides == (init,)
    prov = json.loads((ship / "provenance.json").read_text())
    assert (prov["training_minutes"], prov["env_steps"], prov["run_training_minutes"]) == (82, 204_000, 10)
    assert prov["lineage"] == {"init_from": str(ship.resolve()), "training_minutes": 72, "env_steps": 203_000}
    assert "the 72 min and 203,000 env steps of" in prov["details"]
    assert "204k env steps, 82 min on a test machine" in (tmp_path / "README.md").read_text()
    kept = json.loads((tmp_path / "campaign" / "ship" / "2-1" / "lineage.json").read_text())
    assert (kept["training_minutes"], kept["env_steps"]) == (72, 203_000)


def test_a_network_to_continue_that_cannot_say_what_it_trained_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "bare" / "checkpoint").mkdir(parents=True)
    (tmp_path / "bare" / "checkpoint" / "meta.json").write_text(json.dumps({"counters": {"env_steps": 5}}))
    code = campaign.main(_args(tmp_path, "2-1", "1", "--set", f"learner.init_from={tmp_path / 'bare'}"),
                         parts=lambda children, plan: (FakeTrainer(), FakeEvaluator()))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "learner.init_from:" in err[0] and "neither provenance.json" in err[0]
    assert not (tmp_path / "campaign" / "2-1").exists()


def test_held_out_seeds_are_disjoint_from_the_selection_and_the_heads(tmp_path: Path) -> None:
    evaluator = FakeEvaluator()
    _campaign(tmp_path, FakeTrainer(reasons=["flags_cleared"]), evaluator, "2-1", "4").run()
    suites = [c[1] for c in evaluator.calls if c[0] == "suite"]
    (cands, _, selection), (shipped, _, held_out) = suites
    assert len(cands) == 3 and shipped == [tmp_path / "docs" / "checkpoints" / "mario-2-1-cpu"]
    assert selection == opt.CAMPAIGN_SELECTION_SEEDS and held_out == opt.CAMPAIGN_HELD_OUT_SEEDS
    cfg = opt.load_config("auto", ["env.env_id=SuperMarioBros-2-1-v0"])
    head = range(0, campaign.head_seeds_bound(campaign.parse(_args(tmp_path, "2-1", "4")).settings, 4 * 3600,
                                              cfg.logging.eval_every_s, cfg.logging.eval_episodes))
    assert not set(selection) & set(held_out) and not (set(selection) | set(held_out)) & set(head)
    assert max(head) >= 4 * 3600 / cfg.logging.eval_every_s + cfg.logging.eval_episodes - 1  # every eval's seeds


@pytest.mark.parametrize(("extra", "says"), [
    (("--selection-seeds", "7,1000"), "share [1000]"),
    (("--held-out-seeds", "5,6"), "among the head's own evaluation seeds"),
    (("--seed", "990"), "among the head's own evaluation seeds"),
])
def test_seeds_that_could_have_chosen_or_trained_are_refused(tmp_path: Path, extra, says, capsys) -> None:
    assert campaign.main(_args(tmp_path, "2-1", "4", *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1


def test_the_budget_counts_training_time_across_resumes_and_an_adopted_run(tmp_path: Path) -> None:
    write_segment(tmp_path / "campaign" / "2-1", "SuperMarioBros-2-1-v0", 1000, 500)  # trained before the campaign
    trainer = FakeTrainer(segment_s=1500)
    _campaign(tmp_path, trainer, FakeEvaluator(), "2-1", "1").run()
    assert [(j.resume, j.max_seconds) for j in trainer.jobs] == [(True, 2600), (True, 1100)]
    assert training_seconds(tmp_path / "campaign" / "2-1") == 3600
    level = _state(tmp_path)["levels"]["2-1"]
    assert level["reason"] == "budget" and level["commands"][0].startswith("(adopted: 17 min trained")
    # run again with a bigger budget: a shipped level stays shipped, nothing trains
    trainer2 = FakeTrainer()
    _campaign(tmp_path, trainer2, FakeEvaluator(), "2-1", "2").run()
    assert trainer2.jobs == []


def test_a_killed_campaign_continues_the_level_and_run_it_was_on(tmp_path: Path) -> None:
    args = _args(tmp_path, "2-1 3-1", "1")
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.campaign_fakes", "block", *args], cwd=ROOT, env=head_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # waits on the child's own report that its segment is on disk
            lines.append(line)
            if MARKER in line:
                break
        assert any("level 2-1: training (new run in" in line for line in lines), lines
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert _state(tmp_path)["levels"]["2-1"]["stage"] == "training"
    trainer = FakeTrainer(reasons=["flags_cleared", "flags_cleared"])
    assert campaign.main(args, parts=lambda children, plan: (trainer, FakeEvaluator())) == 0
    first = trainer.jobs[0]
    assert (first.run_dir.name, first.resume, first.max_seconds) == ("2-1", True, 3600 - 1000)
    state = _state(tmp_path)
    assert [state["levels"][lv]["stage"] for lv in ("2-1", "3-1")] == ["shipped", "shipped"]
    assert len(state["levels"]["2-1"]["commands"]) == 2 and "--resume" in state["levels"]["2-1"]["commands"][1]


@pytest.mark.parametrize(("content", "says"), [
    ("{\"format\": \"mario-apex-campaign\", \"levels\"", "corrupt campaign state"),
    ("{\"hello\": 1}", "not a campaign state"),
    ("[1, 2]", "not a campaign state"),
])
def test_a_corrupt_or_foreign_state_is_refused_by_name_and_left_alone(tmp_path: Path, content: str, says: str,
                                                                       capsys) -> None:
    state = tmp_path / "campaign" / "campaign.json"
    state.parent.mkdir()
    state.write_text(content)
    trainer = FakeTrainer()
    assert campaign.main(_args(tmp_path), parts=lambda children, plan: (trainer, FakeEvaluator())) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {state}: {says}") and err.count("\n") == 1, err
    assert state.read_text() == content and trainer.jobs == []


def test_a_state_from_other_settings_is_refused(tmp_path: Path, capsys) -> None:
    _campaign(tmp_path, FakeTrainer(reasons=["flags_cleared"]), FakeEvaluator(), "2-1").run()
    before = _state(tmp_path)
    assert campaign.main(_args(tmp_path, "2-1", "1", "--seed", "1"), parts=lambda c, p: (FakeTrainer(),
                                                                                       FakeEvaluator())) == 2
    err = capsys.readouterr().err
    assert "other settings: seed 0 (now 1)" in err and err.count("\n") == 1
    assert _state(tmp_path) == before


@pytest.mark.parametrize(("extra", "says"), [
    (("--levels", "9-9"), "--levels: unknown level '9-9'"),
    (("--hours", "0"), "--hours=0.0: allowed a number > 0"),
    (("--until-flags", "1.5"), "--until-flags=1.5"),
    (("--stop-flag-evals", "0"), "--stop-flag-evals=0"),
    (("--set", "learner.nope=1"), "2-1:"),
    (("--selection-seeds", "a,b"), "--selection-seeds='a,b'"),
])
def test_bad_arguments_are_one_line_errors(tmp_path: Path, extra, says, capsys) -> None:
    argv = _args(tmp_path, "2-1", "1")
    if extra[0] in ("--levels", "--hours"):  # the given one replaces _args' value
        argv[argv.index(extra[0]) + 1] = extra[1]
        extra = ()
    assert campaign.main([*argv, *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert not (tmp_path / "campaign" / "campaign.json").exists()


def test_an_unknown_flag_is_a_one_line_error_of_the_command(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "evaluate.campaign", "--levels", "2-1", "--hours", "1", "--bogus"],
                          cwd=tmp_path, env=head_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unrecognized arguments: --bogus")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "runs").exists()


def test_a_shipped_checkpoint_the_campaign_did_not_make_is_not_replaced(tmp_path: Path, capsys) -> None:
    hand_made = tmp_path / "docs" / "checkpoints" / "mario-2-1-cpu"
    hand_made.mkdir(parents=True)
    (hand_made / "provenance.json").write_text('{"training_minutes": 1}')
    trainer = FakeTrainer()
    assert campaign.main(_args(tmp_path, "2-1", "1"), parts=lambda c, p: (trainer, FakeEvaluator())) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {hand_made}: a shipped checkpoint") and err.count("\n") == 1
    assert trainer.jobs == [] and (hand_made / "provenance.json").read_text() == '{"training_minutes": 1}'
    # under another tag it ships beside it; and a campaign's own earlier copy is replaced
    assert campaign.main(_args(tmp_path, "2-1", "1", "--tag", "t"), parts=lambda c, p: (
        FakeTrainer(reasons=["flags_cleared"]), FakeEvaluator())) == 0
    assert (tmp_path / "docs" / "checkpoints" / "mario-2-1-t" / "provenance.json").is_file()
    state = _state(tmp_path)
    state["levels"]["2-1"]["stage"] = "trained"  # as if stopped while shipping: it ships again over its own copy
    (tmp_path / "campaign" / "campaign.json").write_text(json.dumps(state))
    assert campaign.main(_args(tmp_path, "2-1", "1", "--tag", "t"), parts=lambda c, p: (FakeTrainer(),
                                                                                       FakeEvaluator())) == 0


def test_another_campaign_on_the_folder_is_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    import fcntl

    folder = tmp_path / "campaign"
    folder.mkdir()
    with open(folder / campaign.LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        monkeypatch.setattr(campaign, "LOCK_WAIT_S", 0.0)
        assert campaign.main(_args(tmp_path), parts=lambda c, p: (FakeTrainer(), FakeEvaluator())) == 2
    assert "another campaign (or its training child) is running" in capsys.readouterr().err


def test_the_training_command_is_the_one_an_adoptable_run_was_started_with() -> None:
    job = TrainJob("SuperMarioBros-2-1-v0", Path("runs/campaign/2-1"), False, 7800, 0, 0.7, 2, (), Path("log"))
    assert LauncherTrainer(Children(), launcher=("python", "-m", "launcher")).command(job) == (
        "python -m launcher --env SuperMarioBros-2-1-v0 --seed 0 --port 0 --until-flags 0.7 "
        "--set logging.stop_flag_evals=2 --run-dir runs/campaign/2-1 --max-seconds 7800").split()
    resumed = LauncherTrainer(Children()).command(TrainJob(**{**job.__dict__, "resume": True, "overrides": ("a.b=1",)}))
    assert resumed[3:5] == ["--resume", "runs/campaign/2-1"] and resumed[-6:-3] == ["--set", "a.b=1", "--run-dir"]
    assert done_reason("x\n[DONE] {'reason': 'flags_cleared', 'elapsed_s': 1.5}\n") == "flags_cleared"
    assert done_reason("no summary\n") is None


def test_training_time_sums_the_segments_of_a_resumed_run(tmp_path: Path) -> None:
    rows = [(10, 100), (60, 600), (5, 650), (40, 1000), (20, 1200)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"elapsed_s": e, "env_steps": s}) + "\n"
                                                    for e, s in rows) + '{"elapsed_s": 99')
    assert training_seconds(tmp_path) == 60 + 40 + 20
    assert training_seconds(tmp_path, until_env_steps=1000) == 60 + 40
    assert training_seconds(tmp_path / "none") == 0


def test_ctrl_c_reaches_the_training_child_once_and_leaves_no_process(tmp_path: Path) -> None:
    """The real trainer and child handling, with a stand-in for python -m launcher that waits for its SIGINT."""
    args = _args(tmp_path, "2-1", "1")
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.campaign_fakes", "stub-launcher", *args], cwd=ROOT,
                            env=head_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    run_dir = tmp_path / "campaign" / "2-1"
    log = tmp_path / "campaign" / "logs" / "2-1-train.log"
    try:
        # the stub's own line (the log's first line is the command, which contains the words too)
        assert wait_for(lambda: log.is_file() and "\nstub head: ready\n" in log.read_text(), 60), proc.poll()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, out
    assert (run_dir / "signals").read_text() == f"{int(signal.SIGINT)}\n"  # one SIGINT, passed on by the campaign
    with pytest.raises(ProcessLookupError):
        os.kill(int((run_dir / "pid").read_text()), 0)
    assert "the same command continues" in out and _state(tmp_path)["levels"]["2-1"]["stage"] == "training"


@pytest.mark.slow
def test_a_shipped_checkpoint_goes_through_the_real_suite_export_gif_and_table(tmp_path: Path, monkeypatch) -> None:
    """Real tools on the shipped 1-1 network as a run's best/, 1 episode of 5 steps per seed: seconds, not figures.
    Paths relative to a folder outside the repository, where the repository's own docs/ must not be read."""
    monkeypatch.chdir(tmp_path)
    run = Path("campaign") / "1-1"
    shutil.copytree(ROOT / "docs" / "checkpoints" / "mario-1-1-cpu" / "checkpoint", run / "best" / "checkpoint")
    shutil.copyfile(run / "best" / "checkpoint" / "config.json", run / "config.json")
    (run / "metrics.jsonl").write_text(json.dumps({"elapsed_s": 120.0, "env_steps": 10**6}) + "\n")
    docs, readme = Path("docs"), Path("README.md")
    readme.write_text(README)
    settings = campaign_state.Settings(0, 0.7, 2, (), (100,), (1000,))
    progress = campaign_state.LevelProgress("trained", ("python -m launcher ...",), "flags_cleared", 120.0)
    children = Children(env=head_env())
    evaluator = ModuleEvaluator(children, tmp_path / "evaluate.log", max_steps=5)
    shipped = ship_level(parse_level("1-1"), run, Path("work"), settings, progress, evaluator,
                         ShipTo(docs, Path("results"), "cpu", "a test machine", 1, 1, 1), say=lambda line: None)
    campaign.write_table(Path("results"), readme)
    assert shipped["episodes"] == 1 and shipped["chosen"] == str(run / "best")
    ship = docs / "checkpoints" / "mario-1-1-cpu"
    assert (ship / "checkpoint" / "meta.json").is_file() and (docs / "images" / "mario_1-1_best_episode_cpu.gif").is_file()
    prov = json.loads((ship / "provenance.json").read_text())
    assert prov["exported_by"] == f"python -m evaluate.export {run / 'best'} {ship}"
    assert prov["training_minutes"] == 2 and prov["selection"]["seeds"] == [100]
    assert list(docs.glob("random_policy_1-1_right_only.json"))
    text = readme.read_text()
    assert "| 1-1 | `mario-1-1-cpu` (1-1) |" in text and "2 min on a test machine" in text
    assert "- 1-1: 1 episodes under each of the seeds 1000 (held out" in text


def test_recorded_commands_and_paths_name_no_folder_of_the_machine(tmp_path: Path) -> None:
    from evaluate.campaign_parts import ROOT, recorded

    argv = [sys.executable, "-m", "evaluate.export", str(ROOT / "runs" / "a b"), str(ROOT / "docs"), "/elsewhere/x"]
    assert shown(argv) == "python -m evaluate.export 'runs/a b' docs /elsewhere/x"
    assert recorded(ROOT / "runs" / "campaign" / "2-1") == "runs/campaign/2-1"
    assert recorded(tmp_path / "run") == str((tmp_path / "run").resolve())
