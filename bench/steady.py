"""Steady-state rates from a run's metrics.jsonl, the CPU time of its window, and repeat statistics.

The pipeline phases of `make bench` run the real head, which writes a metrics row every
PIPELINE_LOG_S; these functions turn those rows into env steps/s and updates/s over whole
arrival periods (`steady_rates`), snapshot the process tree's CPU time as rows appear
(`stop_after_first_data`), summarize repeats (`median`, `spread`) and turn the repeats of the
compared pairs into the headline figures (`pair_figures`).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

CPU_WATCH_S = 0.05  # how often the pipeline watcher looks for a new metrics row (and snapshots CPU)


def stop_after_first_data(path: Path, seconds: float, stop: threading.Event, done: threading.Event,
                           snaps: dict[int, tuple[float, dict[int, float]]] | None = None,
                           collectors: int | None = None) -> None:
    """Set `stop` once `seconds` have passed since the steady window opened (metrics.jsonl first
    showed env steps from all `collectors`, see steady_rates). Until `done` (the run has
    returned), put (env_steps, CPU snapshot of the process tree) in `snaps[i]` as soon as row i
    appears: the last rows are written after `stop`, while the head shuts down."""
    from bench import cpu_time

    first: float | None = None
    rows = 0
    while not done.is_set():
        try:
            lines = [line for line in path.read_text().splitlines() if line.strip()]
        except OSError:
            lines = []
        if len(lines) > rows:
            if snaps is not None:
                snap = cpu_time.tree_cpu()
                for i in range(rows, len(lines)):
                    try:
                        snaps[i] = (float(json.loads(lines[i]).get("env_steps", 0)), snap)
                    except ValueError:  # a row still being written: read again next time
                        break
            rows = len(snaps) if snaps is not None else len(lines)
            if first is None and "first_data_after_s" in steady_rates(path, need_rows=1, collectors=collectors):
                first = time.monotonic()
        if first is not None and not stop.is_set() and time.monotonic() - first >= seconds:
            stop.set()
        done.wait(CPU_WATCH_S)


def window_cpu_per_1k(steady: dict[str, Any], snaps: dict[int, tuple[float, dict[int, float]]]) -> float | None:
    """CPU seconds per 1,000 env steps from the steady window's first row to its last row that
    has a snapshot and new steps (the watcher may miss the very last row of a shutting-down head)."""
    from bench import cpu_time

    a, b = steady.get("first_row"), steady.get("last_row")
    if a is None or b is None or a not in snaps:
        return None
    steps_a, cpu_a = snaps[a]
    ends = [i for i in snaps if a < i <= b and snaps[i][0] > steps_a]
    if not ends:
        return None
    steps_b, cpu_b = snaps[max(ends)]
    return cpu_time.per_1k(cpu_time.cpu_between(cpu_a, cpu_b), steps_b - steps_a)


def median(values: list[float]) -> float | None:
    import statistics

    return float(statistics.median(values)) if values else None


def spread(values: list[float]) -> dict[str, Any] | None:
    """{median, min, max, values} of the repeats (None when there is none)."""
    if not values:
        return None
    return {"median": median(values), "min": float(min(values)), "max": float(max(values)),
            "values": [float(v) for v in values]}


def replay_ratio(records: list[dict[str, Any]], batch: int) -> float | None:
    """Sampled transitions per consumed one (updates x batch / env steps), median over repeats."""
    ratios = [r["ups"] * batch / r["sps"] for r in records if r.get("ups") is not None and r.get("sps")]
    return median(ratios)


def steady_rates(metrics_path: Path, need_rows: int = 2, collectors: int | None = None) -> dict[str, Any]:
    """env_steps/s and updates/s from the first metrics row with data from every collector to the
    last row where data arrived.

    Why both ends sit on arrivals: the head counts env steps when a chunk lands, i.e. in bursts of
    envs_per_collector * chunk_steps per collector. A window ending between bursts would count
    the time of a partial period but none of its steps: up to one whole period too little (~25%
    of a 4 s --quick window), while the baselines count every step as it happens. Between two
    rows that each follow an arrival lie whole periods only. updates/s uses the same window.

    Why the window opens only once every collector has delivered (rows' `collectors_delivered`
    reaching `collectors`, or its largest value in the file when `collectors` is None): collectors
    start seconds apart (each builds its envs first), so the first arrival is one collector's.
    Opening there counts the later collectors' start-up, when they step nothing, as window time:
    3-12% too low for 14 collectors started up to 10 s apart with 512-transition chunks
    (tests/test_bench.py). Once all have delivered, each collector is at an unrelated point of its
    period when the window opens, so its whole chunks inside the window are, on average, exactly
    its steps inside it. With need_rows=1 and `collectors` given, the window has not opened until
    that many have delivered; if one never delivers, a finished file opens once all the others
    have. Files without the field (older heads) open at the first data row.
    """
    try:
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        return {"why": f"no readable {metrics_path.name}: {exc}"}
    index = [i for i, r in enumerate(rows)  # line numbers of the usable rows (the watcher's snapshot keys)
             if isinstance(r.get("time"), (int, float)) and isinstance(r.get("env_steps"), (int, float))]
    rows = [rows[i] for i in index]
    if not rows:
        return {"why": "metrics.jsonl has no rows with time and env_steps"}
    base = rows[0]["env_steps"]
    first = next((i for i, r in enumerate(rows) if r["env_steps"] > base), None)
    if first is None:
        return {"why": f"{len(rows)} metrics rows, none with env steps"}
    delivered = [r.get("collectors_delivered") for r in rows]
    if isinstance(delivered[first], int):  # the head reports it: open once every collector has delivered
        most = max(d or 0 for d in delivered)
        want = most if collectors is None else collectors
        opened = next((i for i in range(first, len(rows)) if (delivered[i] or 0) >= want), None)
        if opened is None:
            if need_rows <= 1:
                return {"why": f"{most} of {want} collectors have delivered"}
            opened = next(i for i in range(first, len(rows)) if (delivered[i] or 0) >= most)  # one never did
        first = opened
    if need_rows <= 1:
        return {"first_data_after_s": rows[first]["time"] - rows[0]["time"]}
    if first >= len(rows) - 1:
        return {"why": f"{len(rows)} metrics rows, fewer than 2 from the first data on"}
    last = max(i for i in range(first, len(rows)) if i == first or rows[i]["env_steps"] > rows[i - 1]["env_steps"])
    a, b = rows[first], rows[last]
    dt = b["time"] - a["time"]
    if dt <= 0 or b["env_steps"] <= a["env_steps"]:
        return {"why": "no env steps arrived after the first data row"}
    out: dict[str, Any] = {"env_steps_per_s": (b["env_steps"] - a["env_steps"]) / dt, "window_s": dt,
                           "first_data_after_s": a["time"] - rows[0]["time"], "rows": last - first + 1,
                           "steps": b["env_steps"] - a["env_steps"], "first_row": index[first], "last_row": index[last],
                           "collectors_delivered": delivered[first]}
    if isinstance(a.get("updates"), (int, float)) and isinstance(b.get("updates"), (int, float)):
        out["updates_per_s"] = (b["updates"] - a["updates"]) / dt
    return out


def pair_figures(reps: dict[str, list[dict[str, Any]]], batch_size: int,
                 train_overrides: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(figures, details) of the compared pairs from the per-phase repeat records `reps` (each
    {"sps", "ups", "cpu_s_per_1k_steps"}): efficiencies per repeat with both sides from the same
    round, the like-for-like train pair and the drain pair, as medians with min-max spreads."""
    figures: dict[str, Any] = {}
    details: dict[str, Any] = {}
    cpu = {phase: median([r["cpu_s_per_1k_steps"] for r in recs if r.get("cpu_s_per_1k_steps") is not None])
           for phase, recs in reps.items()}
    if any(v is not None for v in cpu.values()):
        figures["cpu_s_per_1k_steps"] = cpu
    details["repeats"] = reps
    # cores the design kept busy in its window (rate x CPU per step): below the machine's cores
    # when other tenants took them, so wall-clock rates of two windows compare only at equal cores
    details["cores_used"] = {
        phase: median([r["sps"] * r["cpu_s_per_1k_steps"] / 1000.0 for r in recs if r.get("cpu_s_per_1k_steps")])
        for phase, recs in reps.items()}
    pairs = list(zip(reps.get("ceiling", []), reps.get("pipeline", []), strict=False))
    figures["pipeline_efficiency"] = spread([p["sps"] / c["sps"] for c, p in pairs if c["sps"]])
    # CPU efficiency against the env the collectors step (the project env: the package env's
    # per-frame Python work, which the raw ceiling pays, is not the pipeline's); the raw
    # ceiling's version is in details. Per repeat, both sides from the same round.
    def cpu_ratio(ref: str, phase: str) -> dict[str, Any] | None:
        both = zip(reps.get(ref, []), reps.get(phase, []), strict=False)
        return spread([e["cpu_s_per_1k_steps"] / p["cpu_s_per_1k_steps"] for e, p in both
                       if e.get("cpu_s_per_1k_steps") and p.get("cpu_s_per_1k_steps")])

    figures["cpu_efficiency"] = cpu_ratio("project_env", "pipeline")
    figures["cpu_efficiency_training"] = cpu_ratio("project_env", "training")
    details["cpu_efficiency_vs_raw_ceiling"] = {"draining": cpu_ratio("ceiling", "pipeline"),
                                                "training": cpu_ratio("ceiling", "training")}
    ours, naive = reps.get("training", []), reps.get("naive_train", [])
    if ours or naive:
        figures["train_pair"] = {
            "ours_sps": median([r["sps"] for r in ours]), "ours_ups": median([r["ups"] for r in ours if r.get("ups") is not None]),
            "naive_sps": median([r["sps"] for r in naive]), "naive_ups": median([r["ups"] for r in naive]),
        }
        details["train_pair_spread"] = {
            "ours_sps": spread([r["sps"] for r in ours]), "naive_sps": spread([r["sps"] for r in naive]),
            "ours_ups": spread([r["ups"] for r in ours if r.get("ups") is not None]),
            "naive_ups": spread([r["ups"] for r in naive]),
            "settings": {"batch_size": batch_size, "overrides": list(train_overrides),
                         "replay_ratio_ours": replay_ratio(ours, batch_size),
                         "replay_ratio_naive": replay_ratio(naive, batch_size)},
        }
    drains = list(zip(reps.get("naive_drain", []), reps.get("pipeline", []), strict=False))
    details["drain_pair"] = {"ours_over_naive": spread([p["sps"] / d["sps"] for d, p in drains if d["sps"]])}
    return figures, details
