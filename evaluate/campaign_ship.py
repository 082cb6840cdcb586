"""Ship one trained level: choose its snapshot, export it, picture it, record how it was made, measure it.

For a run in <campaign>/<level>/:
1. selection: the suite plays best/ and every kept/<updates>/ (the final checkpoint when the head finished no
   evaluation) on the selection seeds; the best by shared/ranking.py's rule is chosen;
2. export: its evaluation-only copy into <docs>/checkpoints/mario-<level>-<tag>/ with the run's metrics.jsonl
   and evals.jsonl;
3. the random policy's row for the level, once (<docs>/random_policy_<level>_<action set>.json);
4. a GIF of the best of a few episodes at epsilon 0.05: <docs>/images/mario_<level>_best_episode_<tag>.gif;
5. provenance.json beside the checkpoint: training minutes up to the snapshot, machine, date, commit, every
   training command, the export command, the preset, the selection and its seeds; for a run started from
   another network (learner.init_from) also that network's training (evaluate/lineage.py), counted into the
   totals the Levels table shows;
6. the suite on the held-out seeds into <results>/suite/mario-<level>-<tag>/suite.json: the Levels table's row.
The selection's and the held-out seeds are disjoint from each other and from the head's (checked by the caller).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluate.campaign_parts import ROOT, Evaluator, recorded
from evaluate.campaign_state import LevelProgress, Settings
from evaluate.evaluate import find_baseline
from evaluate.levels import Level, level_env_config
from evaluate.lineage import Prior, prior_training
from evaluate.run_time import training_seconds
from shared.config import Config
from shared.ranking import score

BEST_DIR, KEPT_DIR = "best", "kept"  # the head's periodic evaluator's folders in a run (launcher/evaluator.py)
LINEAGE_FILE = "lineage.json"  # in the ship's work folder: what the run's init_from network had trained


@dataclass(frozen=True)
class ShipTo:
    """Where a shipped level goes and how it is described."""

    docs: Path  # checkpoints/, random_policy_*.json and images/ (the GIFs)
    results: Path  # suite/: the suites' raw files, which the Levels table is built from
    tag: str  # mario-<level>-<tag>: the machine class (cpu, h100, ...)
    machine: str  # the provenance's machine: what the training ran on
    episodes: int  # per evaluation seed, in the selection and in the held-out suite
    gif_episodes: int
    random_episodes: int

    def name(self, level: Level) -> str:
        return f"mario-{level.name.replace(' ', '-')}-{self.tag}"


def candidates(run_dir: Path) -> list[Path]:
    """best/ and kept/* with a checkpoint each; the run itself (its final checkpoint) when there is none."""
    found = [p for p in (run_dir / BEST_DIR, *sorted((run_dir / KEPT_DIR).glob("*")))
             if (p / "checkpoint" / "meta.json").is_file()]
    return found or [run_dir]


def _counters(checkpoint: Path) -> dict[str, Any]:
    meta = checkpoint / "checkpoint" / "meta.json"
    return dict(json.loads(meta.read_text()).get("counters", {})) if meta.is_file() else {}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def preset_of(env_id: str) -> str:
    """The provenance's preset: the level's own entry in config_optimized.ENV_PRESETS, or none."""
    from config_optimized import ENV_PRESETS

    return f"{env_id} (config_optimized.ENV_PRESETS)" if env_id in ENV_PRESETS else "none"


def foreign_ship(level: Level, run_dir: Path, to: ShipTo) -> Path | None:
    """The shipped checkpoint folder for `level` when one exists that this run did not make (hand-made, or another
    campaign's): its provenance.json's campaign_run is not `run_dir`. None when the name is free or this run's."""
    ship = to.docs / "checkpoints" / to.name(level)
    if not ship.exists():
        return None
    try:
        made_by = json.loads((ship / "provenance.json").read_text()).get("campaign_run")
    except (OSError, ValueError, AttributeError):
        return ship
    return None if made_by in (recorded(run_dir), str(run_dir.resolve())) else ship


def ship_level(level: Level, run_dir: Path, work: Path, settings: Settings, progress: LevelProgress,
               evaluator: Evaluator, to: ShipTo, say: Callable[[str], None]) -> dict[str, Any]:
    """Steps 1-6 above; the `shipped` record of the campaign's state (what was chosen and measured)."""
    name = to.name(level)
    ship, suite_dir = to.docs / "checkpoints" / name, to.results / "suite" / name
    run_cfg = Config.from_dict(json.loads((run_dir / "config.json").read_text()))
    prior = _prior(run_cfg, work)  # before the export: a run may ship into the folder it started from
    cands = candidates(run_dir)
    say(f"level {level.name}: choosing among {len(cands)} snapshot(s) by {to.episodes * len(settings.selection_seeds)} "
        f"episodes (seeds {_seeds(settings.selection_seeds)})")
    evaluator.suite(cands, level.name, settings.selection_seeds, to.episodes, work / "select", to.docs)
    rows = json.loads((work / "select" / "suite.json").read_text())["levels"][0]["checkpoints"]
    if len(rows) != len(cands):
        raise ValueError(f"{work / 'select' / 'suite.json'}: {len(rows)} results for {len(cands)} snapshots")
    chosen_i = max(range(len(cands)), key=lambda i: (score(rows[i]), -i))  # a tie: the earlier (best/ first)
    chosen = cands[chosen_i]
    selection = [{"snapshot": str(c), "flag_rate": r["flag_rate"], "mean_x_pos": r["mean_x_pos"],
                  "episodes": r["episodes"]} for c, r in zip(cands, rows, strict=True)]
    say(f"level {level.name}: chose {chosen} (flags {_flags(rows[chosen_i])}, mean x_pos "
        f"{rows[chosen_i]['mean_x_pos']:.0f}); exporting to {ship}")
    exported_by = evaluator.export(chosen, ship)
    for record in ("metrics.jsonl", "evals.jsonl"):  # the learning curve and the head's evaluations travel too
        if (run_dir / record).is_file():
            shutil.copyfile(run_dir / record, ship / record)
    if find_baseline(level_env_config(run_cfg.env, level), to.docs) is None:
        say(f"level {level.name}: measuring the random policy ({to.random_episodes} episodes)")
        evaluator.random_policy(run_dir / "config.json", level.name, to.docs, to.random_episodes)
    gif_out = work / "gif"
    evaluator.gif(ship, gif_out, settings.held_out_seeds[0], to.gif_episodes)
    gif = to.docs / "images" / f"mario_{level.name.replace(' ', '-')}_best_episode_{to.tag}.gif"
    if (gif_out / "best_episode.gif").is_file():
        gif.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(gif_out / "best_episode.gif", gif)
    steps = int(_counters(chosen).get("env_steps", 0))
    minutes = training_seconds(run_dir, until_env_steps=steps) / 60
    lineage: dict[str, Any] = {}
    if prior is not None:  # the network's whole training: the source's and this run's
        lineage = {"training_minutes": round(minutes + prior.training_minutes), "env_steps": steps + prior.env_steps,
                   "lineage": prior.to_dict(recorded(prior.source))}
    provenance = {
        "training_minutes": round(minutes),
        "run_training_minutes": round(training_seconds(run_dir) / 60),
        **lineage,
        "machine": to.machine,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "commit": _commit(),
        "commands": list(progress.commands),
        "stopped_by": progress.reason,
        "exported_by": exported_by,
        "preset": preset_of(level.env_id),
        "selection": {"seeds": list(settings.selection_seeds), "episodes_per_seed": to.episodes,
                      "epsilon": 0.05, "snapshots": selection, "chosen": str(chosen)},
        "held_out_seeds": list(settings.held_out_seeds),
        "campaign_run": recorded(run_dir),  # which run this copy ships (a campaign replaces only its own)
        "gif": recorded(gif) if gif.is_file() else None,
        "details": (f"trained by the level campaign (python -m evaluate.campaign) in {run_dir}; the snapshot is the "
                    f"best of {len(cands)} by the suite on seeds {_seeds(settings.selection_seeds)}; the Levels table's "
                    f"figures are the suite on seeds {_seeds(settings.held_out_seeds)}, which chose nothing; "
                    "training_minutes: the run's training time up to the snapshot's env steps"
                    + (f", and the {prior.training_minutes:.0f} min and {prior.env_steps:,} env steps of "
                       f"{recorded(prior.source)}, whose network the run started from (learner.init_from)"
                       if prior is not None else "")),
    }
    (ship / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    say(f"level {level.name}: measuring {name} on the held-out seeds {_seeds(settings.held_out_seeds)}")
    evaluator.suite([ship], level.name, settings.held_out_seeds, to.episodes, suite_dir, to.docs)
    held = json.loads((suite_dir / "suite.json").read_text())["levels"][0]["checkpoints"][0]
    return {"name": name, "chosen": str(chosen), "selection": selection, "flag_rate": held["flag_rate"],
            "episodes": held["episodes"], "mean_x_pos": held["mean_x_pos"]}


def _prior(run_cfg: Config, work: Path) -> Prior | None:
    """What the run's learner.init_from network had trained (None without one), kept in work/lineage.json the first
    time: the export may replace the very folder the run started from, and shipping again must find the same."""
    if not run_cfg.learner.init_from:
        return None
    kept = work / LINEAGE_FILE
    if kept.is_file():
        d = json.loads(kept.read_text())
        return Prior(Path(d["source"]), float(d["training_minutes"]), int(d["env_steps"]))
    prior = prior_training(Path(run_cfg.learner.init_from))
    work.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({"source": str(prior.source), "training_minutes": prior.training_minutes,
                                "env_steps": prior.env_steps}) + "\n")
    return prior


def _flags(row: dict[str, Any]) -> str:
    return f"{round(row['flag_rate'] * row['episodes'])}/{row['episodes']}"


def _seeds(seeds: tuple[int, ...]) -> str:
    return ",".join(map(str, seeds))
