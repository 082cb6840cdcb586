"""Learning-curve PNGs from runs' metrics.jsonl (headless: matplotlib's Agg backend).

Four panels: mean_x_pos_20 (how far Mario gets, the number that says whether it learned) and
mean_return_20, each against env steps (sample efficiency) and against wall-clock minutes (what the
user waits). Each is drawn over every collector and, where the run recorded it, over the least-exploring
collector slot alone (the curve closest to the greedy policy). The head's periodic evaluations
(evals.jsonl beside metrics.jsonl, launcher/evaluator.py) are drawn as points, and a random-policy
baseline (`python -m evaluate.random_policy`) as a horizontal line, so "better than chance" can be read
off the plot. `plot_runs` overlays several runs (seeds, variants) the same way.

    python -m evaluate.plots runs/a runs/b --labels "seed 0" "seed 1" --out curves.png [--baseline docs/...json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PANELS = (("mean_x_pos_20", "mean x_pos (last 20 episodes)", "mean_x_pos"),
          ("mean_return_20", "mean return (last 20 episodes)", "mean_return"))
GREEDY_SUFFIX = "_greedy"  # the same statistic over the lowest-epsilon slot (launcher/progress.py)
EVALS_FILE = "evals.jsonl"  # the head's periodic evaluations (launcher/evaluator.py)
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive")


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


def _wall_minutes(rows: list[dict[str, Any]]) -> list[float | None]:
    """Cumulative wall-clock minutes per row: a resumed run's elapsed_s starts again at 0 each segment."""
    out: list[float | None] = []
    offset, last = 0.0, 0.0
    for row in rows:
        t = row.get("elapsed_s")
        if not isinstance(t, (int, float)) or not math.isfinite(t):
            out.append(None)
            continue
        if t < last:  # a new segment
            offset += last
        last = float(t)
        out.append((offset + last) / 60.0)
    return out


def _series(rows: list[dict[str, Any]], key: str, wall: bool = False) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    times = _wall_minutes(rows) if wall else [row.get("env_steps") for row in rows]
    for row, x in zip(rows, times, strict=True):
        y = row.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def periodic_evals(metrics_path: Path, rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Periodic evaluations beside the metrics, each with its env steps and wall minutes (from the metrics)."""
    path = metrics_path.parent / EVALS_FILE
    if not path.is_file():
        return []
    pairs = [(float(r["env_steps"]), m) for r, m in zip(rows, _wall_minutes(rows), strict=True)
             if isinstance(r.get("env_steps"), (int, float)) and m is not None]
    out = []
    for row in read_metrics(path):
        x = row.get("env_steps")
        if not isinstance(x, (int, float)) or not pairs:
            continue
        # wall time of the first metrics row at or after the evaluation's env steps
        minute = next((m for s, m in pairs if s >= x), pairs[-1][1])
        out.append({"env_steps": float(x), "minutes": minute, **{k: row[k] for k in ("mean_x_pos", "mean_return",
                                                                                        "flag_rate") if k in row}})
    return out


def pyplot():
    """matplotlib.pyplot on the headless Agg backend (imported only when a figure is drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt, fig, out_png: str | Path) -> Path:
    """Lay `fig` out, write it to `out_png` (creating its folder) at 100 dpi, and close it."""
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def _axes(title: str):
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 6.5), sharex="col")
    for row, (_, label, _) in enumerate(PANELS):
        axes[row][0].set_ylabel(label)
    axes[1][0].set_xlabel("env steps")
    axes[1][1].set_xlabel("wall-clock minutes")
    fig.suptitle(title)
    return plt, fig, axes


def _finish(plt, fig, axes, out_png: str | Path) -> Path:
    for ax in (a for row in axes for a in row):
        ax.grid(True, alpha=0.3)
    # every panel draws the same series: one legend, where rising curves leave room (top left)
    axes[0][0].legend(loc="upper left", fontsize=7)
    return save_figure(plt, fig, out_png)


def _baseline_line(ax, random_baseline: Mapping[str, Any] | None, base_key: str) -> None:
    if random_baseline is not None and isinstance(random_baseline.get(base_key), (int, float)):
        value = float(random_baseline[base_key])
        ax.axhline(value, color="tab:red", linestyle="--", linewidth=1.2, label=f"random policy ({value:.0f})")


def plot_learning_curve(metrics_path: str | Path, out_png: str | Path,
                        random_baseline: Mapping[str, Any] | None = None, title: str | None = None,
                        eval_point: Mapping[str, float] | None = None) -> Path:
    """Write the four-panel PNG of one run; ValueError (naming the file) when no row has the plotted keys.

    `eval_point` ({"env_steps", "mean_x_pos", "mean_return"}) marks an evaluation of the checkpoint on the
    env-steps panels, so training (exploring) and evaluation numbers sit side by side.
    """
    metrics_path = Path(metrics_path)
    rows = read_metrics(metrics_path)
    if not any(_series(rows, key)[0] for key, _, _ in PANELS):
        raise ValueError(f"{metrics_path}: no rows with env_steps and mean_x_pos_20/mean_return_20 to plot")
    evals = periodic_evals(metrics_path, rows)
    plt, fig, axes = _axes(title or f"Learning curve: {metrics_path.parent.name}")
    for row_axes, (key, _, base_key) in zip(axes, PANELS, strict=True):
        for ax, wall in zip(row_axes, (False, True), strict=True):
            xs, ys = _series(rows, key, wall)
            ax.plot(xs, ys, color="tab:blue", linewidth=1.5, marker="." if len(xs) < 50 else None,
                    label="all collectors")
            gx, gy = _series(rows, key + GREEDY_SUFFIX, wall)
            if gx:
                ax.plot(gx, gy, color="tab:orange", linewidth=1.5, marker="." if len(gx) < 50 else None,
                        label="least-exploring slot")
            points = [e for e in evals if isinstance(e.get(base_key), (int, float))]
            if points:
                ax.plot([e["minutes" if wall else "env_steps"] for e in points], [e[base_key] for e in points],
                        marker="D", markersize=6, color="tab:green", linestyle=":", label="periodic evaluation")
            _baseline_line(ax, random_baseline, base_key)
            if not wall and eval_point is not None and isinstance(eval_point.get(base_key), (int, float)):
                ax.plot([float(eval_point.get("env_steps", 0))], [float(eval_point[base_key])], marker="*",
                        markersize=14, color="tab:green", linestyle="none",
                        label=f"checkpoint eval ({float(eval_point[base_key]):.0f})")
    return _finish(plt, fig, axes, out_png)


def plot_runs(runs: Sequence[tuple[str, str | Path]], out_png: str | Path,
              random_baseline: Mapping[str, Any] | None = None, title: str | None = None) -> Path:
    """Overlay several runs (label, run dir or metrics.jsonl): each run's least-exploring slot (solid; every
    collector where the run has no slot curve) and its periodic evaluations (points), in one color per run."""
    if not runs:
        raise ValueError("plot_runs: no runs given")
    plt, fig, axes = _axes(title or "Learning curves")
    for n, (label, where) in enumerate(runs):
        path = Path(where)
        metrics = path / "metrics.jsonl" if path.is_dir() else path
        if not metrics.is_file():
            plt.close(fig)
            raise ValueError(f"{metrics}: not found")
        rows = read_metrics(metrics)
        evals = periodic_evals(metrics, rows)
        color = COLORS[n % len(COLORS)]
        for row_axes, (key, _, base_key) in zip(axes, PANELS, strict=True):
            greedy = bool(_series(rows, key + GREEDY_SUFFIX)[0])
            for ax, wall in zip(row_axes, (False, True), strict=True):
                xs, ys = _series(rows, key + GREEDY_SUFFIX if greedy else key, wall)
                ax.plot(xs, ys, color=color, linewidth=1.3, label=label)
                points = [e for e in evals if isinstance(e.get(base_key), (int, float))]
                if points:
                    ax.plot([e["minutes" if wall else "env_steps"] for e in points], [e[base_key] for e in points],
                            marker="D", markersize=5, color=color, linestyle="none", label=f"{label}: evaluations")
    for row_axes, (_, _, base_key) in zip(axes, PANELS, strict=True):
        for ax in row_axes:
            _baseline_line(ax, random_baseline, base_key)
    return _finish(plt, fig, axes, out_png)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evaluate.plots", description="overlay runs' learning curves")
    ap.add_argument("runs", nargs="+", help="run dirs (or metrics.jsonl files)")
    ap.add_argument("--labels", nargs="+", default=None, help="one label per run (default: the dir names)")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--baseline", default=None, help="random-policy JSON (python -m evaluate.random_policy)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)
    labels = args.labels or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        print(f"error: {len(labels)} labels for {len(args.runs)} runs", file=sys.stderr)
        return 2
    try:
        baseline = json.loads(Path(args.baseline).read_text()) if args.baseline else None
        out = plot_runs(list(zip(labels, args.runs, strict=True)), args.out, baseline, args.title)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
