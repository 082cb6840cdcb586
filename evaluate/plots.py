"""Learning-curve PNG from a run's metrics.jsonl (headless: matplotlib's Agg backend).

Two panels against env steps: mean_x_pos_20 (how far Mario gets, the number that says whether
it learned) and mean_return_20, each over every collector and, where the run recorded it, over
the least-exploring collector slot alone (the curve closest to the greedy policy). A random-policy baseline (scripts/random_policy_baseline.py)
is drawn as horizontal lines so "better than chance" can be read off the plot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PANELS = (("mean_x_pos_20", "mean x_pos (last 20 episodes)", "mean_x_pos"),
          ("mean_return_20", "mean return (last 20 episodes)", "mean_return"))
GREEDY_SUFFIX = "_greedy"  # the same statistic over the lowest-epsilon slot (launcher/progress.py)


def read_metrics(metrics_path: str | Path) -> list[dict[str, Any]]:
    """Rows of metrics.jsonl; unparsable lines (a live run's half-written last line) are skipped."""
    rows = []
    with open(metrics_path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        x, y = row.get("env_steps"), row.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def plot_learning_curve(metrics_path: str | Path, out_png: str | Path,
                        random_baseline: Mapping[str, Any] | None = None, title: str | None = None,
                        eval_point: Mapping[str, float] | None = None) -> Path:
    """Write the two-panel PNG; ValueError (naming the file) when no row has the plotted keys.

    `eval_point` ({"env_steps", "mean_x_pos", "mean_return"}) marks a greedy evaluation of the
    checkpoint on the curve, so training (exploring) and evaluation numbers sit side by side.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    rows = read_metrics(metrics_path)
    series = {key: _series(rows, key) for key, _, _ in PANELS}
    if not any(xs for xs, _ in series.values()):
        raise ValueError(f"{metrics_path}: no rows with env_steps and mean_x_pos_20/mean_return_20 to plot")
    fig, axes = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for ax, (key, label, base_key) in zip(axes, PANELS, strict=True):
        xs, ys = series[key]
        ax.plot(xs, ys, color="tab:blue", linewidth=1.5, marker="." if len(xs) < 50 else None,
                label="all collectors")
        gx, gy = _series(rows, key + GREEDY_SUFFIX)
        if gx:
            ax.plot(gx, gy, color="tab:orange", linewidth=1.5, marker="." if len(gx) < 50 else None,
                    label="least-exploring slot")
        if random_baseline is not None and isinstance(random_baseline.get(base_key), (int, float)):
            value = float(random_baseline[base_key])
            ax.axhline(value, color="tab:red", linestyle="--", linewidth=1.2, label=f"random policy ({value:.0f})")
        if eval_point is not None and isinstance(eval_point.get(base_key), (int, float)):
            ax.plot([float(eval_point.get("env_steps", 0))], [float(eval_point[base_key])], marker="*",
                    markersize=14, color="tab:green", linestyle="none",
                    label=f"checkpoint eval ({float(eval_point[base_key]):.0f})")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("env steps")
    fig.suptitle(title or f"Learning curve: {metrics_path.parent.name}")
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
