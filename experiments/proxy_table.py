"""Compare proxy runs per env step: one row per run, from the files `python -m experiments.proxy` leaves.

Learning per env step does not depend on how fast the steps came, so runs made on a shared or
drifting machine compare here where their minutes would not. Per run: env steps, updates and
updates per env step at the end; the least-exploring slot's mean x_pos over its last 20 episodes
(`mean_x_pos_20_greedy`) averaged over the 25k env steps up to each milestone; the head's periodic evaluations; the
final evaluation (`RUN/final_eval/eval.json`: 10 episodes at epsilon 0.05; `RUN/final_eval.json`, the
same file, in the copies kept under docs/).

    python -m experiments.proxy_table runs/scale/a-s0 runs/scale/u-s0 [--labels a u] [--milestones 50000,100000]
        [--json OUT.json]

Prints a Markdown table; --json writes the rows (and the command) for results/bench/.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from evaluate.plots import read_metrics

DEFAULT_MILESTONES = (50_000, 100_000, 150_000, 200_000)


WINDOW = 25_000  # env steps a milestone's value averages over: one 20-episode window swings by hundreds of x_pos


def at_milestone(rows: list[dict[str, Any]], key: str, env_steps: int, window: int = WINDOW) -> float | None:
    """Mean of `key` over the metrics rows in (env_steps - window, env_steps]; None if the run has none there
    or never got that far."""
    if not rows or rows[-1].get("env_steps", 0) < env_steps:
        return None
    values = [float(r[key]) for r in rows
              if env_steps - window < r.get("env_steps", 0) <= env_steps and isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def summarize_run(run_dir: Path, label: str, milestones: tuple[int, ...] = DEFAULT_MILESTONES) -> dict[str, Any]:
    """One run's row. Raises ValueError naming the file when the run has no metrics."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{metrics}: not found")
    rows = read_metrics(metrics)
    if not rows:
        raise ValueError(f"{metrics}: no rows")
    last = rows[-1]
    env_steps, updates = int(last.get("env_steps", 0)), int(last.get("updates", 0))
    row: dict[str, Any] = {
        "label": label,
        "run_dir": str(run_dir),
        "env_steps": env_steps,
        "updates": updates,
        "updates_per_env_step": round(updates / env_steps, 4) if env_steps else None,
        "training_flags": int(last.get("flags", 0)),
        "greedy_x20": {str(m): at_milestone(rows, "mean_x_pos_20_greedy", m) for m in milestones},
        "greedy_x20_end": last.get("mean_x_pos_20_greedy"),
    }
    evals_path = run_dir / "evals.jsonl"
    evals = read_metrics(evals_path) if evals_path.is_file() else []
    row["periodic_evals"] = [{"env_steps": e.get("env_steps"), "mean_x_pos": e.get("mean_x_pos"),
                              "flag_rate": e.get("flag_rate")} for e in evals]
    final = run_dir / "final_eval" / "eval.json"
    if not final.is_file():
        final = run_dir / "final_eval.json"
    if final.is_file():
        summary = json.loads(final.read_text())["summary"]
        row["final_eval"] = {k: summary.get(k) for k in ("episodes", "mean_x_pos", "max_x_pos", "flag_rate",
                                                         "mean_return")}
    else:
        row["final_eval"] = None
    return row


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(rows: list[dict[str, Any]], milestones: tuple[int, ...]) -> str:
    heads = ["run", "env steps", "updates/env step", *[f"greedy x20 @{m // 1000}k" for m in milestones],
             "evals (x_pos, flags)", "final eval x_pos (flags)"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        evals = ", ".join(f"{_fmt(e['mean_x_pos'])} ({round((e['flag_rate'] or 0) * 10)}/10)"
                          for e in r["periodic_evals"]) or "-"
        fe = r["final_eval"]
        final = "-" if fe is None else \
            f"{_fmt(fe['mean_x_pos'])} ({round((fe['flag_rate'] or 0) * (fe['episodes'] or 0))}/{fe['episodes']})"
        upe = r["updates_per_env_step"]
        cells = [r["label"], _fmt(r["env_steps"]), "-" if upe is None else f"{upe:.3f}",
                 *[_fmt(r["greedy_x20"][str(m)]) for m in milestones], evals, final]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.proxy_table", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run directories made by python -m experiments.proxy")
    ap.add_argument("--labels", nargs="+", default=None, help="one label per run (default: the dir names)")
    ap.add_argument("--milestones", default=",".join(str(m) for m in DEFAULT_MILESTONES),
                    help="env-step milestones, comma-separated")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    labels = args.labels or [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        print(f"error: {len(labels)} labels for {len(args.runs)} runs", file=sys.stderr)
        return 2
    try:
        milestones = tuple(int(m) for m in args.milestones.split(",") if m.strip())
    except ValueError:
        print(f"error: --milestones={args.milestones!r}: allowed comma-separated integers", file=sys.stderr)
        return 2
    try:
        rows = [summarize_run(Path(r), label, milestones) for r, label in zip(args.runs, labels, strict=True)]
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(rows, milestones))
    if args.json:
        cmd = "python -m experiments.proxy_table " + shlex.join(sys.argv[1:] if argv is None else argv)
        Path(args.json).write_text(json.dumps({"command": cmd, "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
