"""The level campaign's own state: one small JSON in its folder, rewritten whole after every step.

    {"format": "mario-apex-campaign", "version": 1,
     "settings": {"seed": 0, "until_flags": 0.7, "stop_flag_evals": 2, "overrides": [...],
                  "selection_seeds": [...], "held_out_seeds": [...]},
     "levels": {"2-1": {"stage": "training", "commands": [...], "reason": null, ...}, ...}}

A level goes pending -> training -> trained -> shipped. The settings are what its runs were trained and
measured with: a campaign started again must give the same ones (a resume takes its settings from the
command line), while the per-level budget and the list of levels may change. A file that is not JSON, or
JSON that is not this format, is refused by name (StateError, one line): the campaign never overwrites what
it did not write.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

STATE_FILE = "campaign.json"
FORMAT = "mario-apex-campaign"
VERSION = 1
STAGES = ("pending", "training", "trained", "shipped")


class StateError(Exception):
    """A state file the campaign refuses (exit 2); the message is one line naming it."""


@dataclass(frozen=True)
class Settings:
    """What a level's runs are trained and measured with; fixed for the life of a campaign folder."""

    seed: int
    until_flags: float
    stop_flag_evals: int
    overrides: tuple[str, ...]
    selection_seeds: tuple[int, ...]
    held_out_seeds: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "until_flags": self.until_flags, "stop_flag_evals": self.stop_flag_evals,
                "overrides": list(self.overrides), "selection_seeds": list(self.selection_seeds),
                "held_out_seeds": list(self.held_out_seeds)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        return cls(int(d["seed"]), float(d["until_flags"]), int(d["stop_flag_evals"]),
                   tuple(str(o) for o in d["overrides"]), tuple(int(s) for s in d["selection_seeds"]),
                   tuple(int(s) for s in d["held_out_seeds"]))


@dataclass(frozen=True)
class LevelProgress:
    stage: str = "pending"
    commands: tuple[str, ...] = ()  # every training segment's command line, in order
    reason: str | None = None  # why training ended: flags_cleared or budget
    trained_s: float = 0.0  # the run's training seconds when it ended
    shipped: dict[str, Any] = field(default_factory=dict)  # what shipping chose and measured

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "commands": list(self.commands), "reason": self.reason,
                "trained_s": self.trained_s, "shipped": self.shipped}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LevelProgress:
        stage = str(d["stage"])
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} is not one of {', '.join(STAGES)}")
        return cls(stage, tuple(str(c) for c in d["commands"]), d["reason"], float(d["trained_s"]),
                   dict(d["shipped"]))


@dataclass(frozen=True)
class CampaignState:
    settings: Settings
    levels: dict[str, LevelProgress]

    def level(self, name: str) -> LevelProgress:
        return self.levels.get(name, LevelProgress())

    def with_level(self, name: str, **changes: Any) -> CampaignState:
        return replace(self, levels={**self.levels, name: replace(self.level(name), **changes)})

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "settings": self.settings.to_dict(),
                "levels": {name: p.to_dict() for name, p in self.levels.items()}}


def load(folder: Path, settings: Settings) -> CampaignState:
    """The folder's state, or a fresh one for `settings`; StateError for a corrupt, foreign or other campaign's file."""
    path = Path(folder) / STATE_FILE
    if not path.exists():
        return CampaignState(settings, {})
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: corrupt campaign state ({' '.join(str(exc).split())}): move it away to start "
                         "this campaign over, or give another --dir") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StateError(f"{path}: not a campaign state (no \"format\": \"{FORMAT}\"): the campaign does not "
                         "overwrite it; give another --dir")
    if data.get("version") != VERSION:
        raise StateError(f"{path}: campaign state version {data.get('version')!r}, this campaign reads {VERSION}")
    try:
        state = CampaignState(Settings.from_dict(data["settings"]),
                              {str(k): LevelProgress.from_dict(v) for k, v in data["levels"].items()})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateError(f"{path}: corrupt campaign state ({type(exc).__name__}: {exc}): move it away to start "
                         "this campaign over, or give another --dir") from None
    if state.settings != settings:
        old, new = state.settings.to_dict(), settings.to_dict()
        diff = ", ".join(f"{k} {old[k]} (now {new[k]})" for k in old if old[k] != new[k])
        raise StateError(f"{path}: this campaign was started with other settings: {diff}; give the same ones "
                         "(a resumed run takes its settings from the command line) or another --dir")
    return state


def save(folder: Path, state: CampaignState) -> None:
    """Whole or not at all: a kill while writing leaves the previous state."""
    path = Path(folder) / STATE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state.to_dict(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
