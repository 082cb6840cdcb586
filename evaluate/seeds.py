"""One recipe over several seeds, read from the head's periodic evaluations: when each seed first cleared the level,
how often, and the median over seeds with its range.

Each run directory holds `evals.jsonl` (the head's evaluations: 10 episodes at epsilon 0.05 every
logging.eval_every_s) and `metrics.jsonl`, whose rows give each evaluation its wall-clock minutes (summed over
the segments of a run resumed with --resume). Per seed: env steps and minutes at the first evaluation with a flag,
and at the first with at least `--goal-rate` of its episodes at the flag; the best flag rate by `--by-env-steps`
(the per-env-step goal, which a drifting machine cannot move) and by `--by-minutes`; every evaluation's flag rate.
Across seeds: the median and range of each, with a seed that never got there counted as not there (the median is
then "-" when most seeds did not).

    python -m evaluate.seeds runs/robust/s0 runs/robust/s1 runs/robust/s2 [--labels s0 s1 s2]
        [--by-env-steps 400000] [--by-minutes 60,120] [--goal-rate 0.5] [--json OUT] [--png OUT]

A RUN may also be a JSON that `--json` wrote: its seeds' recorded evaluations (env steps, minutes, flag rate,
mean x_pos) stand in for their run directories, which need not exist any more, so a new seed can join the
table of earlier ones (`python -m evaluate.seeds results/robust_1-1/seeds_0_1.json runs/robust/s2`). Its labels are
the recorded ones unless --labels names every seed.

Prints a Markdown table; --json writes the rows and the command; --png draws the seeds' evaluations (mean x_pos
and flag rate against env steps).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from evaluate.plots import periodic_evals, pyplot, read_metrics, save_figure
from shared.values import is_finite_number

METRICS_FILE = "metrics.jsonl"


def rate_keys(by_env_steps: int, by_minutes: tuple[float, ...]) -> list[tuple[str, str]]:
    """(row key, title) of each best-flag-rate budget: the env-step one, then one per minute budget."""
    return [(f"best_rate_by_{by_env_steps}_env_steps", f"best rate by {by_env_steps:,} env steps"),
            *[(f"best_rate_by_{m:g}_min", f"best rate by {m:g} min") for m in by_minutes]]


EVAL_FIELDS = ("env_steps", "minutes", "flag_rate", "mean_x_pos")


def run_evals(run_dir: Path) -> list[dict[str, Any]]:
    """`run_dir`'s evaluations with their wall-clock minutes (empty when it has no metrics)."""
    metrics = run_dir / METRICS_FILE
    return periodic_evals(metrics, read_metrics(metrics)) if metrics.is_file() else []


def recorded_seeds(path: Path) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(label, run, evaluations) of each seed in a JSON written by `--json`; ValueError naming what is wrong."""
    try:
        doc = json.loads(path.read_text())
        seeds, labels = doc["seeds"], doc["labels"]
        if not isinstance(seeds, list) or not isinstance(labels, list) or len(seeds) != len(labels):
            raise ValueError("'seeds' and 'labels' are not lists of one length")
        out = []
        for label, seed in zip(labels, seeds, strict=True):
            evals = [{k: e[k] for k in EVAL_FIELDS} for e in seed["evaluations"]]
            if not all(is_finite_number(e[k]) for e in evals for k in EVAL_FIELDS):
                raise ValueError(f"seed {label!r}: an evaluation field is not a finite number")
            out.append((str(label), str(seed["run"]), evals))
        return out
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path}: not a seeds JSON written by --json ({detail})") from None


def seed_row(run_dir: Path, by_env_steps: int, by_minutes: tuple[float, ...], goal_rate: float,
             evals: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One seed's figures from `run_dir`'s evaluations, or from `evals` (recorded ones) when given; empty lists
    and None where it has none."""
    evals = run_evals(run_dir) if evals is None else evals
    evals = [e for e in evals if isinstance(e.get("flag_rate"), (int, float))]

    def first(rate: float) -> dict[str, float] | None:
        hit = next((e for e in evals if e["flag_rate"] >= rate and e["flag_rate"] > 0), None)
        return None if hit is None else {"env_steps": hit["env_steps"], "minutes": hit["minutes"]}

    def best(pred) -> float | None:
        rates = [e["flag_rate"] for e in evals if pred(e)]
        return max(rates) if rates else None

    # one predicate per rate_keys entry: evaluated within the env-step budget, then within each minute budget
    budgets = [lambda e: e["env_steps"] <= by_env_steps, *[lambda e, m=m: e["minutes"] <= m for m in by_minutes]]
    last = evals[-1] if evals else {}
    return {
        "run": str(run_dir),
        "evaluations": [{k: e.get(k) for k in ("env_steps", "minutes", "flag_rate", "mean_x_pos")} for e in evals],
        "first_flag": first(0.0),
        "first_goal": first(goal_rate),
        **{key: best(within) for (key, _), within in zip(rate_keys(by_env_steps, by_minutes), budgets, strict=True)},
        "env_steps": last.get("env_steps"),
        "minutes": last.get("minutes"),
    }


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Median, min and max over seeds; a seed's None (never got there) ranks above every value."""
    if not values:
        return {"median": None, "min": None, "max": None}
    known = sorted(v for v in values if v is not None)
    ranked = known + [None] * (len(values) - len(known))
    mid = len(ranked) // 2
    if len(ranked) % 2:
        median = ranked[mid]
    else:
        pair = ranked[mid - 1:mid + 1]
        median = None if None in pair else statistics.mean(pair)
    return {"median": median, "min": known[0] if known else None,
            "max": None if len(known) < len(values) else (known[-1] if known else None)}


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def markdown(rows: list[dict[str, Any]], labels: list[str], summary: dict[str, Any], by_env_steps: int,
             by_minutes: tuple[float, ...], goal_rate: float) -> str:
    """The per-seed table, then one line per figure of `summary` (from `summarize(rows, ...)`)."""
    rates = rate_keys(by_env_steps, by_minutes)
    cols = ["seed", "first flag: env steps / min", f"first >= {goal_rate:.0%}: env steps / min",
            *[title for _, title in rates], "flag rate per evaluation", "evaluated up to (env steps / min)"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]

    def when(hit: dict[str, float] | None) -> str:
        return "-" if hit is None else f"{_fmt(hit['env_steps'])} / {_fmt(hit['minutes'])}"

    for label, row in zip(labels, rows, strict=True):
        flags = " ".join(f"{e['flag_rate'] * 10:.0f}" for e in row["evaluations"]) or "-"
        out.append("| " + " | ".join([
            label, when(row["first_flag"]), when(row["first_goal"]), *[_fmt(row[key], 1) for key, _ in rates],
            flags + " (/10)", f"{_fmt(row['env_steps'])} / {_fmt(row['minutes'])}"]) + " |")
    for key, title in (("first_flag_env_steps", "first flag, env steps"), ("first_flag_minutes", "first flag, min"),
                       ("first_goal_env_steps", f"first >= {goal_rate:.0%}, env steps"), *rates):
        s = summary[key]
        digits = 1 if key.startswith("best") else 0
        if s["min"] is None:
            span = "none got there"
        else:  # max None: a seed never got there
            span = f"range {_fmt(s['min'], digits)} to {'never' if s['max'] is None else _fmt(s['max'], digits)}"
        out.append(f"\n{title}: median {_fmt(s['median'], digits)}, {span} over {len(rows)} seeds")
    return "\n".join(out)


def summarize(rows: list[dict[str, Any]], by_env_steps: int, by_minutes: tuple[float, ...]) -> dict[str, Any]:
    def hit(row: dict[str, Any], key: str, field: str) -> float | None:
        return None if row[key] is None else row[key][field]

    out = {"first_flag_env_steps": spread([hit(r, "first_flag", "env_steps") for r in rows]),
           "first_flag_minutes": spread([hit(r, "first_flag", "minutes") for r in rows]),
           "first_goal_env_steps": spread([hit(r, "first_goal", "env_steps") for r in rows])}
    # a best rate is a score, not a time: a seed without evaluations there is missing, not "later"
    for key, _ in rate_keys(by_env_steps, by_minutes):
        known = sorted(r[key] for r in rows if r[key] is not None)
        out[key] = {"median": statistics.median(known) if known else None, "min": known[0] if known else None,
                    "max": known[-1] if known else None}
    return out


def plot(rows: list[dict[str, Any]], labels: list[str], out_png: str | Path, title: str) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for label, row in zip(labels, rows, strict=True):
        xs = [e["env_steps"] for e in row["evaluations"]]
        axes[0].plot(xs, [e["mean_x_pos"] for e in row["evaluations"]], marker="o", label=label)
        axes[1].plot(xs, [10 * e["flag_rate"] for e in row["evaluations"]], marker="o", label=label)
    axes[0].set_ylabel("mean x_pos (10 episodes, epsilon 0.05)")
    axes[1].set_ylabel("flags out of 10")
    axes[1].set_ylim(-0.3, 10.3)  # the whole scale: a run without a flag is a line at 0, not a zoomed-in axis
    for ax in axes:
        ax.set_xlabel("env steps")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    return save_figure(plt, fig, out_png)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluate.seeds", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--labels", nargs="+")
    p.add_argument("--by-env-steps", type=int, default=400_000)
    p.add_argument("--by-minutes", default="60,120", help="comma-separated minutes")
    p.add_argument("--goal-rate", type=float, default=0.5)
    p.add_argument("--json")
    p.add_argument("--png")
    p.add_argument("--title", default="Mario 1-1: the head's evaluations per seed")
    args = p.parse_args(argv)
    # one (label, run, recorded evaluations or None) per seed: a JSON expands to its seeds
    seeds: list[tuple[str, Path, list[dict[str, Any]] | None]] = []
    for run in args.runs:
        if run.is_file():
            try:
                seeds += [(label, Path(name), evals) for label, name, evals in recorded_seeds(run)]
            except ValueError as exc:
                p.exit(2, f"error: {exc}\n")
        elif not (run / METRICS_FILE).is_file():
            p.exit(2, f"error: no {METRICS_FILE} in {run}\n")
        else:
            seeds.append((run.name, run, None))
    labels = args.labels or [label for label, _, _ in seeds]
    if len(labels) != len(seeds):
        p.exit(2, f"error: --labels: {len(labels)} labels for {len(seeds)} runs\n")
    try:
        by_minutes = tuple(float(m) for m in args.by_minutes.split(",") if m.strip())
    except ValueError:
        p.exit(2, f"error: --by-minutes {args.by_minutes!r} is invalid: expected comma-separated minutes\n")
    if not 0 < args.goal_rate <= 1:
        p.exit(2, f"error: --goal-rate {args.goal_rate} is invalid: allowed 0 < rate <= 1\n")
    rows = [seed_row(run, args.by_env_steps, by_minutes, args.goal_rate, evals) for _, run, evals in seeds]
    summary = summarize(rows, args.by_env_steps, by_minutes)
    print(markdown(rows, labels, summary, args.by_env_steps, by_minutes, args.goal_rate))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "command": "python -m evaluate.seeds " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
            "labels": labels, "seeds": rows, "summary": summary},
            indent=1) + "\n")
    if args.png:
        plot(rows, labels, args.png, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
