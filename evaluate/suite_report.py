"""suite.json's content: per level, each checkpoint's numbers, the IQM across checkpoints (training
seeds) with its bootstrap interval (evaluate/stats.py), and the random policy's row.

Only what the inputs determine goes in (no timings, no dates): the same checkpoints, levels, seeds
and settings give the same file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evaluate.evaluate import ROOT, EpisodeResult, summarize
from evaluate.levels import Level
from evaluate.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, aggregate

AGGREGATED = ("flag_rate", "mean_x_pos")  # the per-checkpoint numbers aggregated across checkpoints
RANDOM_KEYS = ("flag_rate", "mean_x_pos", "max_x_pos", "mean_return", "mean_length", "episodes", "max_steps")
METHOD = (f"IQM: mean of the middle 50% of the per-checkpoint values (floor(n/4) dropped at each end; the mean "
          f"for n < 4). Interval: {CONFIDENCE:.0%} percentile bootstrap, {BOOTSTRAP_RESAMPLES} resamples of the "
          f"checkpoints with replacement, stratified by level (each level's checkpoints resampled on their own), "
          f"numpy generator seed {BOOTSTRAP_SEED}; as rliable (Agarwal et al., 2021)")


@dataclass(frozen=True)
class SuiteSettings:
    levels: tuple[Level, ...]
    episodes: int  # per evaluation seed
    eval_seeds: tuple[int, ...]
    epsilon: float
    max_steps: int | None  # cap on agent steps per episode (None: the env's time limit)

    @property
    def episodes_per_level(self) -> int:
        return self.episodes * len(self.eval_seeds)


@dataclass(frozen=True)
class Played:
    """One episode of the suite: the evaluation seed it was played under and what happened."""

    eval_seed: int
    result: EpisodeResult


def display_path(path: Path | str) -> str:
    """`path` relative to the repository when inside it (the report reads the same on every machine)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def checkpoint_row(played: Sequence[Played]) -> dict[str, Any]:
    """One checkpoint on one level: summarize()'s numbers, the stages played and every episode."""
    results = [p.result for p in played]
    row = summarize(results)
    stages: dict[str, int] = {}
    for r in results:
        key = f"{r.world}-{r.stage}"
        stages[key] = stages.get(key, 0) + 1
    row["stages_played"] = dict(sorted(stages.items()))
    row["episode_results"] = [{"eval_seed": p.eval_seed, **asdict(p.result)} for p in played]
    return row


def random_row(found: tuple[Mapping[str, Any], Path] | None) -> dict[str, Any] | None:
    if found is None:
        return None
    data, path = found
    return {"path": display_path(path), **{k: data.get(k) for k in RANDOM_KEYS}}


def build_report(settings: SuiteSettings, checkpoints: Sequence[Mapping[str, Any]],
                 played: Mapping[tuple[int, str], Sequence[Played]],
                 baselines: Mapping[str, tuple[Mapping[str, Any], Path] | None]) -> dict[str, Any]:
    """The suite.json dict. `played[(checkpoint index, level name)]`; `baselines[level name]`."""
    n = len(checkpoints)
    levels = []
    table = {key: np.empty((n, len(settings.levels))) for key in AGGREGATED}
    for j, level in enumerate(settings.levels):
        rows = [checkpoint_row(played[(i, level.name)]) for i in range(n)]
        for key in AGGREGATED:
            table[key][:, j] = [row[key] for row in rows]
        levels.append({
            "name": level.name, "env_id": level.env_id, "stages": list(level.stages) or None,
            "checkpoints": [{"checkpoint": checkpoints[i]["path"], **row} for i, row in enumerate(rows)],
            "across_checkpoints": {key: aggregate(table[key][:, j]) for key in AGGREGATED},
            "random": random_row(baselines.get(level.name)),
        })
    notes = []
    if n == 1:
        notes.append("one checkpoint (one training seed): each interval is the point itself; it measures no "
                     "spread across training seeds")
    capped = [lv["name"] for lv in levels if lv["random"] and lv["random"]["max_steps"] != settings.max_steps]
    if capped:
        notes.append(f"the random rows of {', '.join(capped)} were played with another cap on episode steps "
                     f"(max_steps) than this suite's ({settings.max_steps}): they compare only roughly")
    return {
        "settings": {
            "levels": [level.env_id for level in settings.levels],
            "episodes_per_seed": settings.episodes, "eval_seeds": list(settings.eval_seeds),
            "episodes_per_level": settings.episodes_per_level, "epsilon": settings.epsilon,
            "max_steps": settings.max_steps,
            "episode_seeding": "episode k under evaluation seed s: (env reset seed, epsilon-draw seed) = "
                               "numpy SeedSequence([s, k]).generate_state(2)",
            "statistics": {"method": METHOD, "resamples": BOOTSTRAP_RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED,
                           "confidence": CONFIDENCE},
        },
        "checkpoints": list(checkpoints),
        "levels": levels,
        # every level's flag rate together: the IQM over (checkpoint, level) with checkpoints resampled per level
        "all_levels": {"flag_rate": aggregate(table["flag_rate"])},
        "notes": notes,
    }
