"""What a network started with `learner.init_from` (`--init-from`) had trained before its run began.

A run started from another network has fresh counters and its own training clock, so its checkpoint alone
understates what the shipped network cost. `prior_training` reads the source: a shipped checkpoint folder
(docs/checkpoints/<name>/, its `provenance.json` gives the minutes and env steps of its whole lineage) or a
run folder (its metrics.jsonl up to the env steps its checkpoint holds, evaluate/run_time.py). Either may be
named by the folder or by its `checkpoint/` inside, as `--init-from` accepts both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluate.run_time import METRICS_FILE, training_seconds

MAX_DEPTH = 16  # runs started from runs started from ...: more than this is a loop, not a lineage


class LineageError(Exception):
    """The source cannot say what it trained (one line naming the file)."""


@dataclass(frozen=True)
class Prior:
    source: Path  # the folder that holds the source's checkpoint/
    training_minutes: float
    env_steps: int

    def to_dict(self, name: str) -> dict[str, Any]:
        """The provenance's record of it; `name`: how the provenance names the source."""
        return {"init_from": name, "training_minutes": round(self.training_minutes), "env_steps": self.env_steps}


def prior_training(init_from: Path, depth: int = 0) -> Prior:
    """The training behind `init_from` (a checkpoint folder, or the folder holding `checkpoint/`)."""
    owner = init_from.parent if (init_from / "meta.json").is_file() else init_from
    meta = owner / "checkpoint" / "meta.json"
    try:
        counters = json.loads(meta.read_text()).get("counters", {})
        steps = int(counters.get("env_steps", 0))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise LineageError(f"{meta}: no readable checkpoint counters ({type(exc).__name__}: {exc})") from exc
    provenance = owner / "provenance.json"
    if provenance.is_file():  # a shipped network: its record holds its own lineage's totals
        try:
            prov = json.loads(provenance.read_text())
            return Prior(owner, float(prov["training_minutes"]), int(prov.get("env_steps", steps)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LineageError(f"{provenance}: needs training_minutes (and a whole number as env_steps where it has "
                               f"one): {type(exc).__name__}: {exc}") from exc
    if not (owner / METRICS_FILE).is_file():
        raise LineageError(f"{owner}: neither provenance.json nor {METRICS_FILE} says how long it trained")
    minutes = training_seconds(owner, until_env_steps=steps) / 60
    earlier = _init_from_of(owner)
    if earlier is not None:  # a run that itself started from another network
        if depth >= MAX_DEPTH:
            raise LineageError(f"{owner}: a lineage of more than {MAX_DEPTH} runs started from one another")
        before = prior_training(earlier, depth + 1)
        return Prior(owner, minutes + before.training_minutes, steps + before.env_steps)
    return Prior(owner, minutes, steps)


def _init_from_of(run: Path) -> Path | None:
    """The learner.init_from a run folder's config.json names (relative to the working folder, as the launcher
    read it), or None."""
    try:
        init = json.loads((run / "config.json").read_text()).get("learner", {}).get("init_from", "")
    except (OSError, ValueError, AttributeError):
        return None
    return Path(init) if init else None
