"""The figures of training runs from the files they leave (metrics.jsonl, evals.jsonl), as JSON.

Per run: env steps/s, updates/s and updates per env step from the first update to the end; the first periodic
evaluation with a flag (its seconds from the command's start when --started-unix is given, else the head's
elapsed seconds, and its env steps), the first training episode with a flag, the best evaluation and the whole
evaluation curve. With several runs, `at_equal_env_steps` compares them at the env steps the shortest reached:
each run's last evaluation at or below them and its best up to there (learning per env step, whatever the
clock said).

    python -m bench.run_summary RUN [RUN ...] [--labels A B] [--started-unix T] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench.report import print_json
from evaluate.plots import read_metrics

CURVE_KEYS = ("elapsed_s", "env_steps", "updates", "mean_x_pos", "max_x_pos", "flag_rate", "mean_return", "episodes")


def _num(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rates(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """env steps/s, updates/s and updates per env step from the first row with an update to the last row."""
    timed = [r for r in rows if _num(r, "time") is not None and _num(r, "env_steps") is not None]
    first = next((r for r in timed if (_num(r, "updates") or 0) > 0), None)
    if first is None or timed[-1] is first:
        return {"why": "fewer than 2 metrics rows from the first update on"}
    last = timed[-1]
    dt = last["time"] - first["time"]
    steps = last["env_steps"] - first["env_steps"]
    updates = (_num(last, "updates") or 0) - (_num(first, "updates") or 0)
    if dt <= 0:
        return {"why": "no time passed between the first update and the last row"}
    return {"env_steps_per_s": round(steps / dt, 1), "updates_per_s": round(updates / dt, 1),
            "updates_per_env_step": round(updates / steps, 4) if steps > 0 else None, "window_s": round(dt, 1),
            "first_update_elapsed_s": _num(first, "elapsed_s")}


def _when(row: dict[str, Any], started_unix: float | None) -> float | None:
    """Seconds from the command's start to the end of this evaluation (else the head's elapsed seconds)."""
    start, took = _num(row, "started_unix"), _num(row, "eval_s")
    if started_unix is not None and start is not None:
        return round(start + (took or 0.0) - started_unix, 1)
    return _num(row, "elapsed_s")


def summarize_run(run_dir: Path, label: str = "", started_unix: float | None = None) -> dict[str, Any]:
    """One run's figures. Raises ValueError naming the file when the run has no metrics."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{metrics}: not found")
    rows = read_metrics(metrics)
    if not rows:
        raise ValueError(f"{metrics}: no rows")
    evals = read_metrics(run_dir / "evals.jsonl") if (run_dir / "evals.jsonl").is_file() else []
    last = rows[-1]
    env_steps, updates = int(last.get("env_steps", 0)), int(last.get("updates", 0))
    flagged = next((e for e in evals if (_num(e, "flag_rate") or 0) > 0), None)
    trained_flag = next((r for r in rows if (_num(r, "flags") or 0) > 0), None)
    best = max(evals, key=lambda e: (_num(e, "flag_rate") or 0, _num(e, "mean_x_pos") or 0), default=None)
    return {
        "label": label or run_dir.name,
        "run_dir": str(run_dir),
        "elapsed_s": _num(last, "elapsed_s"),
        "env_steps": env_steps,
        "updates": updates,
        "updates_per_env_step": round(updates / env_steps, 4) if env_steps else None,
        "from_first_update": rates(rows),
        "first_eval_flag": None if flagged is None else {
            "seconds": _when(flagged, started_unix), "env_steps": flagged.get("env_steps"),
            "updates": flagged.get("updates"), "flag_rate": flagged.get("flag_rate"),
            "mean_x_pos": flagged.get("mean_x_pos")},
        "first_training_flag": None if trained_flag is None else {
            "elapsed_s": trained_flag.get("elapsed_s"), "env_steps": trained_flag.get("env_steps")},
        "training_flags": int(last.get("flags", 0) or 0),
        "best_eval": None if best is None else {k: best.get(k) for k in CURVE_KEYS},
        "evals": [{**{k: e.get(k) for k in CURVE_KEYS}, "seconds": _when(e, started_unix)} for e in evals],
    }


def at_equal_env_steps(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each run's last evaluation at or below the env steps every run reached, and its best up to there."""
    common = min(r["env_steps"] for r in runs)
    out: dict[str, Any] = {"env_steps": common}
    for run in runs:
        upto = [e for e in run["evals"] if isinstance(e.get("env_steps"), (int, float)) and e["env_steps"] <= common]
        out[run["label"]] = {
            "last_eval": upto[-1] if upto else None,
            "best_mean_x_pos": max((e.get("mean_x_pos") or 0 for e in upto), default=None),
            "best_flag_rate": max((e.get("flag_rate") or 0 for e in upto), default=None),
            "updates_per_env_step": run["updates_per_env_step"],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run_summary", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (each with metrics.jsonl)")
    p.add_argument("--labels", nargs="+", default=None, help="one label per run (default: the folder names)")
    p.add_argument("--started-unix", type=float, default=None, help="the command's start (date +%%s): flag times from it")
    p.add_argument("--out", default=None, help="also write the JSON to this file")
    args = p.parse_args(argv)
    labels = args.labels or [""] * len(args.runs)
    if len(labels) != len(args.runs):
        print(f"error: --labels: {len(labels)} labels for {len(args.runs)} runs", file=sys.stderr)
        return 2
    try:
        runs = [summarize_run(r, lab, args.started_unix) for r, lab in zip(args.runs, labels, strict=True)]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"runs": runs, "command": " ".join(["python -m bench.run_summary", *(argv or sys.argv[1:])])}
    if len(runs) > 1:
        result["at_equal_env_steps"] = at_equal_env_steps(runs)
    print_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
