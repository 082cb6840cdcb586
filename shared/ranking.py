"""Which of two evaluations is better: flags first, then distance, then return.

One rule for every choice between snapshots: the head's periodic evaluator (which snapshot becomes
best/) and the level campaign (which snapshot ships, by the suite's episodes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def score(summary: Mapping[str, Any]) -> tuple[float, float, float]:
    """The order in which evaluations are better: flag rate, then mean x_pos, then mean return."""
    return (float(summary.get("flag_rate") or 0.0), float(summary.get("mean_x_pos") or 0.0),
            float(summary.get("mean_return") or 0.0))
