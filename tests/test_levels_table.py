"""The README's Levels table (evaluate/levels_table.py): generated from the suites' JSON, checked against it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evaluate import levels_table
from tests.support.cluster import ROOT

SHIPPED = ROOT / "results" / "suite" / "mario-1-1-cpu" / "suite.json"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evaluate.levels_table", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_readme_table_is_the_shipped_suites_table() -> None:
    proc = _run("--check")
    assert proc.returncode == 0, proc.stderr
    readme = (ROOT / "README.md").read_text()
    assert levels_table.render(levels_table.default_suites()) in readme
    assert "| 1-1 | `mario-1-1-cpu` (1-1) |" in readme


def _suite_trained_on(level: str, base: dict) -> dict:
    """The shipped suite as if its checkpoint had been trained on `level` and lived elsewhere."""
    suite = copy.deepcopy(base)
    path = f"runs/{level}/checkpoint"
    suite["checkpoints"][0]["env"]["env_id"] = f"SuperMarioBros-{level}-v0"
    suite["checkpoints"][0]["path"] = path
    for lv in suite["levels"]:
        lv["checkpoints"][0]["checkpoint"] = path
    return suite


def test_each_level_lists_its_own_checkpoint_first_and_says_what_is_not_recorded(tmp_path: Path) -> None:
    base = json.loads(SHIPPED.read_text())
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_suite_trained_on("1-2", base)))
    table = levels_table.render([SHIPPED, other], root=ROOT).splitlines()
    body = [line for line in table[2:] if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in body] == ["1-1", "1-1", "1-2", "1-2", "1-3", "1-3", "1-4", "1-4"]
    assert "`1-2` (1-2)" in body[2] and "`mario-1-1-cpu` (1-1)" in body[3]  # 1-2's own first
    assert "time and machine not recorded" in body[2]  # no provenance.json beside runs/1-2
    assert "120 min on the 2-core VM" in body[3]
    assert "| not recorded | 0%, 490 |" in body[2] and "| none | 0%, 490 |" in body[3]  # the preset column


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"levels": []')
    no_markers = tmp_path / "README.md"
    no_markers.write_text("# a readme without the block\n")
    for args, says in (([str(bad)], "bad.json: not a suite.json"),
                       ([str(tmp_path / "missing.json")], "missing.json: cannot read"),
                       ([str(SHIPPED), "--readme", str(no_markers), "--check"], "no '<!-- levels-table:start -->'")):
        proc = _run(*args)
        assert proc.returncode == 2 and proc.stderr.startswith("error: ") and says in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_check_fails_on_a_stale_table_and_write_fixes_it(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{levels_table.START}\n| stale |\n{levels_table.END}\nafter\n")
    assert _run(str(SHIPPED), "--readme", str(readme), "--check").returncode == 1
    assert _run(str(SHIPPED), "--readme", str(readme), "--write").returncode == 0
    assert _run(str(SHIPPED), "--readme", str(readme), "--check").returncode == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "| stale |" not in text


@pytest.mark.parametrize("field", ["training_minutes", "machine"])
def test_a_provenance_without_its_fields_is_named(tmp_path: Path, field: str) -> None:
    base = json.loads(SHIPPED.read_text())
    suite = _suite_trained_on("1-3", base)
    (tmp_path / "runs" / "1-3").mkdir(parents=True)
    prov = {"training_minutes": 60, "machine": "m", "date": "d"}
    del prov[field]
    (tmp_path / "runs" / "1-3" / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(levels_table.TableError, match="provenance.json: needs training_minutes, machine and date"):
        levels_table.rows(suite, root=tmp_path)


def test_a_provenance_total_replaces_the_counters_of_a_network_started_from_another(tmp_path: Path) -> None:
    base = json.loads(SHIPPED.read_text())
    suite = _suite_trained_on("1-3", base)
    (tmp_path / "runs" / "1-3").mkdir(parents=True)
    prov = {"training_minutes": 60, "machine": "m", "date": "d"}
    (tmp_path / "runs" / "1-3" / "provenance.json").write_text(json.dumps(prov))
    counted = base["checkpoints"][0]["counters"]["env_steps"]
    assert f"{counted / 1000:,.0f}k env steps, 60 min on m (d)" in levels_table.rows(suite, root=tmp_path)[0][2]
    (tmp_path / "runs" / "1-3" / "provenance.json").write_text(json.dumps({**prov, "env_steps": 1_436_000}))
    assert "1,436k env steps, 60 min on m (d)" in levels_table.rows(suite, root=tmp_path)[0][2]


def test_a_provenance_env_steps_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    suite = _suite_trained_on("1-3", json.loads(SHIPPED.read_text()))
    (tmp_path / "runs" / "1-3").mkdir(parents=True)
    prov = {"training_minutes": 60, "machine": "m", "date": "d", "env_steps": "lots"}
    (tmp_path / "runs" / "1-3" / "provenance.json").write_text(json.dumps(prov))
    with pytest.raises(levels_table.TableError, match="a whole number as env_steps where it has one"):
        levels_table.rows(suite, root=tmp_path)


def test_under_the_table_the_seeds_and_whether_they_chose_the_snapshot(tmp_path: Path) -> None:
    base = json.loads(SHIPPED.read_text())
    suite = _suite_trained_on("2-1", base)
    suite["settings"]["eval_seeds"] = [1000, 1001, 1002]
    (tmp_path / "runs" / "2-1").mkdir(parents=True)
    prov = {"training_minutes": 60, "machine": "m", "date": "d", "preset": "none"}
    (tmp_path / "runs" / "2-1" / "provenance.json").write_text(json.dumps(prov))
    (tmp_path / "s.json").write_text(json.dumps(suite))
    lines = levels_table.render([tmp_path / "s.json"], root=tmp_path).splitlines()
    assert lines[-1].endswith("10 episodes under each of the seeds 1000,1001,1002 (not held out)")
    (tmp_path / "runs" / "2-1" / "provenance.json").write_text(json.dumps({**prov, "held_out_seeds": [1000, 1001,
                                                                                                       1002]}))
    chosen_on = {**base, "settings": {**base["settings"], "eval_seeds": [0, 1, 2]}}  # seeds its snapshot's choice used
    (tmp_path / "shipped.json").write_text(json.dumps(chosen_on))
    lines = levels_table.render([tmp_path / "s.json", tmp_path / "shipped.json"], root=tmp_path).splitlines()
    assert lines[-3:] == ["Evaluation seeds (epsilon 0.05):",
                          "- 1-1, 1-2, 1-3, 1-4: 10 episodes under each of the seeds 0,1,2 (not held out)",
                          "- 1-1, 1-2, 1-3, 1-4: 10 episodes under each of the seeds 1000,1001,1002 (held out: the "
                          "snapshots were chosen on other seeds)"]
