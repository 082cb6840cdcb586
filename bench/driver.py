"""`make bench`: every throughput figure of the system, measured in one process tree, one sitting.

Ratios such as pipeline_sps / emulator_ceiling_sps only mean something when both sides ran on
the same machine under the same load, so this runs them back to back instead of quoting old
files. Every figure is measured here; a part that fails or is skipped leaves its figures null
with the reason in report["errors"], and the rest of the report is still written.

    python -m bench.driver --quick                 # < 3 min on an otherwise idle 2-core box
    python -m bench.driver --skip sweep --markdown # table for BENCHMARKS.md

The ceiling is measured before and again after the pipeline phases (Bench.ceiling_after): the
headline is their mean, so drift of the machine's speed cancels in pipeline_efficiency.

Every rate is steady state: worker start-up (spawn, imports, env builds) is outside the timed
windows of the baselines, and our pipeline is rated from the head's metrics after its first
data arrived (see Bench.pipeline). Where each part's wall time went is in settings.part_wall_s.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported anywhere in this tree

from bench.report import assemble_report, format_table, machine_facts, write_report  # noqa: E402
from shared.config import Config, ConfigError  # noqa: E402

PARTS = ("ceiling", "naive", "pipeline", "components", "sweep")
QUICK_SECONDS, FULL_SECONDS = 4.0, 30.0
QUICK_SWEEP, FULL_SWEEP = (1, 2), (1, 2, 4)
PIPELINE_LOG_S = 0.5  # head metrics period during the bench: the steady rate is read from these rows
BENCH_CHUNK_STEPS = 16  # per-env chunk for pipeline runs (unless --set): at 128 a message takes ~25 s on 2 cores
STARTUP_ALLOWANCE_S = {True: 40.0, False: 90.0}  # cap on head start-up before the timed window (quick, full)
BENCH_WARMUP = 256  # transitions before timed training: enough to sample batches from, small for --quick

# Component benches owned by other modules: (candidate (module, function) pairs, keys they report).
COMPONENTS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "replay": (
        (("replay.bench", "run_replay_bench"),),
        ("replay_insert_tps", "replay_sample32_ms", "replay_sample512_ms", "naive_replay_sample512_ms",
         "copy_floor_sample512_ms", "bytes_per_transition", "naive_bytes_per_transition", "torchrl_sample512_ms"),
    ),
    "transport": (  # collector side: run as `python -m actors.bench` (the learner never imports actors/)
        (("actors.bench", "run_transport_bench"),),
        ("transport_tps", "mpqueue_transport_tps", "collector_overhead_frac"),
    ),
    "learner": ((("bench.learner", "run_learner_bench"),), ("learner_updates_per_s",)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s phases, sweep {QUICK_SWEEP}: under 3 min")
    p.add_argument("--collectors", type=int, default=None, help="collector processes (default: the profile's)")
    p.add_argument("--envs-per-collector", type=int, default=None, help="K envs per collector (default: profile's)")
    p.add_argument("--env", default=None, help="env id (default SuperMarioBros-1-1-v0)")
    p.add_argument("--seconds", type=float, default=None, help="timed seconds per phase")
    p.add_argument("--skip", action="append", default=[], choices=PARTS, help="skip a part (repeatable)")
    p.add_argument("--out", default="runs/bench/latest.json", help="JSON path; a timestamped copy goes beside it")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--profile", default="auto", help="config_optimized profile (auto, cpu, ...)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="section.field=value override")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> Config:
    """The profile the real run would use, with the bench's CLI overrides and a short warmup."""
    from config_optimized import load_profile

    sets = list(args.overrides)
    if args.env:
        sets.append(f"env.env_id={args.env}")
    if args.collectors is not None:
        sets.append(f"collectors.count={args.collectors}")
    if args.envs_per_collector is not None:
        sets.append(f"collectors.envs_per_collector={args.envs_per_collector}")
    sets += [f"learner.warmup_transitions={BENCH_WARMUP}", "logging.tensorboard=false"]
    cfg = load_profile(args.profile, sets)
    if cfg.collectors.count < 1:
        raise ConfigError("collectors.count=0 is invalid for the bench: allowed at least 1")
    return cfg.check_valid()


class Bench:
    """Runs the parts in order and collects figures, errors, details and sweep rows."""

    def __init__(self, cfg: Config, args: argparse.Namespace, argv: list[str] | None = None) -> None:
        self.cfg, self.args, self.argv = cfg, args, argv
        self.quick = bool(args.quick)
        self.seconds = float(args.seconds if args.seconds is not None else (QUICK_SECONDS if self.quick else FULL_SECONDS))
        self.skip = set(args.skip)
        self.startup_allowance = STARTUP_ALLOWANCE_S[self.quick]
        self.figures: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.details: dict[str, Any] = {}
        self.sweep: list[dict[str, Any]] = []
        self.run_root = Path(args.out).parent / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self._port = random.Random().randrange(20000, 60000, 20)  # distinct ports per head run
        self._ceiling_by_n: dict[int, float] = {}
        self._pipeline_by_n: dict[int, float] = {}
        self._load_start = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        self.part_wall_s: dict[str, float] = {}  # where the bench's own wall time went (start-ups included)

    def attempt(self, label: str, keys: tuple[str, ...], fn: Callable[[], Any]) -> Any:
        """Run one measurement; on failure null its keys and record why (never a made-up value)."""
        t0 = time.perf_counter()
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - one broken part must not lose the others
            self.part_wall_s[label] = round(time.perf_counter() - t0, 2)
            reason = f"{label}: {type(exc).__name__}: {exc}"
            for key in keys:
                self.errors[key] = reason
            self.details[label] = {"error": reason}
            print(f"[bench] {label} failed: {reason}", file=sys.stderr)
            return None
        self.part_wall_s[label] = round(time.perf_counter() - t0, 2)
        print(f"[bench] {label}: {self.part_wall_s[label]:.1f} s", file=sys.stderr)
        return result

    def skipped(self, part: str, keys: tuple[str, ...]) -> None:
        for key in keys:
            self.errors[key] = f"skipped (--skip {part})"

    # ------------------------------------------------------------------ parts
    def ceiling(self, counts: list[int]) -> None:
        """All collector counts from one worker group (one start-up); the project env at the main count."""
        from bench.baselines import run_emulator_ceiling

        main_n = self.cfg.collectors.count
        res = self.attempt("ceiling", ("emulator_ceiling_sps", "project_env_sps"), lambda: run_emulator_ceiling(
            self.cfg.env, counts, self.cfg.collectors.envs_per_collector, self.seconds, [main_n]))
        if res is None:
            return
        for n, r in res["raw"].items():
            self.details["ceiling" if n == main_n else f"ceiling_c{n}"] = r
            self._ceiling_by_n[n] = float(r["sps"])
        if main_n in self._ceiling_by_n:
            self.figures["emulator_ceiling_sps"] = self._ceiling_by_n[main_n]
        if main_n in res["project"]:
            self.details["project_env"] = res["project"][main_n]
            self.figures["project_env_sps"] = float(res["project"][main_n]["sps"])

    def ceiling_after(self, n: int) -> None:
        """The ceiling again, right after the pipeline phases; the headline is the mean of both.

        Why: this VM's speed drifts by more than the efficiency goal's margin (the same emulator
        measured twice, seconds apart, differed by 25%). A ceiling taken on both sides of the
        pipeline phases brackets them, so slow drift cancels in pipeline_sps / ceiling; both
        readings and their ratio stay in details["ceiling_after"].
        """
        from bench.baselines import run_emulator_ceiling

        before = self._ceiling_by_n.get(n)
        if before is None:
            return
        res = self.attempt("ceiling_after", (), lambda: run_emulator_ceiling(
            self.cfg.env, [n], self.cfg.collectors.envs_per_collector, self.seconds))
        if res is None or n not in res["raw"]:
            return
        after = float(res["raw"][n]["sps"])
        mean = (before + after) / 2
        self.details["ceiling_after"] = {**res["raw"][n], "before_sps": before, "after_sps": after,
                                         "drift": after / before if before else None}
        self._ceiling_by_n[n] = mean
        self.figures["emulator_ceiling_sps"] = mean

    def naive(self) -> None:
        """Drain then train on one collector group: separates transport cost from learner cost."""
        from bench.baselines import run_naive_pipeline

        res = self.attempt("naive", ("naive_drain_sps", "naive_pipeline_sps"),
                           lambda: run_naive_pipeline(self.cfg, self.seconds, ("drain", "train"), BENCH_WARMUP))
        if res is None:
            return
        for phase, key in (("drain", "naive_drain_sps"), ("train", "naive_pipeline_sps")):
            self.details[f"naive_{phase}"] = res[phase]
            self.figures[key] = float(res[phase]["sps"])

    def pipeline(self, n: int, train: bool) -> float | None:
        """Our pipeline through the head API, rated in steady state (after the first data arrived).

        run_training's own env_steps_per_s divides by a wall time that includes collector
        start-up, which the baselines exclude; so a watcher thread tails the head's metrics.jsonl
        (logged every PIPELINE_LOG_S), sets run_training's stop_event `seconds` after the first
        data arrived, and the rate is taken between that first data row and the last row. If no
        steady window happened within the start-up cap, the figure is null with the reason
        (the start-up-diluted summary rate stays in details, never in the headline).
        """
        sets = [f"collectors.count={n}", f"transport.port={self._port}", f"logging.interval_s={PIPELINE_LOG_S}"]
        if not any(o.startswith("collectors.chunk_steps=") for o in self.args.overrides):
            sets.append(f"collectors.chunk_steps={BENCH_CHUNK_STEPS}")  # a message every few s, not every ~25 s
        cfg = self.cfg.with_overrides(sets)
        self._port += 20
        label = f"{'training' if train else 'pipeline'}" + ("" if n == self.cfg.collectors.count else f"_c{n}")
        key = "training_sps" if train else "pipeline_sps"
        run_dir = self.run_root / label

        def call() -> dict[str, Any]:
            from launcher.head import run_training

            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log_path = run_dir.parent / f"{label}.stdout.log"
            stop, done = threading.Event(), threading.Event()
            kwargs: dict[str, Any] = {"max_seconds": self.seconds + self.startup_allowance, "train": train,
                                      "stop_event": stop}
            threading.Thread(target=_stop_after_first_data, daemon=True, name="bench-watch",
                             args=(run_dir / "metrics.jsonl", self.seconds + PIPELINE_LOG_S, stop, done)).start()
            try:
                with open(log_path, "w") as log, contextlib.redirect_stdout(log):  # progress lines would bury the table
                    res = run_training(cfg, str(run_dir), **kwargs)
            finally:
                done.set()
            if not isinstance(res, dict) or res.get("env_steps_per_s") is None:
                raise RuntimeError(f"run_training returned no env_steps_per_s: {res!r}")
            return {**res, "stdout_log": str(log_path)}

        res = self.attempt(label, (key,) if n == self.cfg.collectors.count else (), call)
        if res is None:
            return None
        steady = steady_rates(run_dir / "metrics.jsonl")
        res["steady"] = steady
        self.details[label] = res
        rate = steady.get("env_steps_per_s")
        if rate is None:
            reason = (f"{label}: no steady-state window within {self.seconds + self.startup_allowance:.0f} s "
                      f"({steady.get('why')}); whole-run rate incl. start-up {res['env_steps_per_s']:.1f}/s is in details")
            res["error"] = reason
            if n == self.cfg.collectors.count:
                self.errors[key] = reason
            return None
        if not train:
            self._pipeline_by_n[n] = float(rate)
        return float(rate)

    def components(self) -> None:
        for name, (candidates, keys) in COMPONENTS.items():
            res = self.attempt(name, keys, lambda c=candidates: _call_component(c, self.quick))
            if res is None:
                continue
            self.details[name] = res
            for key in keys:
                if key in res and res[key] is not None:
                    self.figures[key] = res[key]
                elif isinstance(res.get("errors"), dict) and key in res["errors"]:
                    self.errors[key] = f"{name}: {res['errors'][key]}"
                elif key in res:
                    self.errors[key] = f"{name}: its bench returned null for {key!r}" + _null_hint(key)
                else:
                    self.errors[key] = f"{name}: its bench reported no {key!r}"

    def sweep_counts(self) -> list[int]:
        return [] if "sweep" in self.skip else list(QUICK_SWEEP if self.quick else FULL_SWEEP)

    def run(self) -> dict[str, Any]:
        n = self.cfg.collectors.count
        if "ceiling" in self.skip:
            self.skipped("ceiling", ("emulator_ceiling_sps", "project_env_sps"))
        else:
            self.ceiling(sorted({n, *self.sweep_counts()}))
        if "naive" in self.skip:
            self.skipped("naive", ("naive_drain_sps", "naive_pipeline_sps"))
        else:
            self.naive()
        if "pipeline" in self.skip:
            self.skipped("pipeline", ("pipeline_sps", "training_sps"))
        else:
            for train, key in ((False, "pipeline_sps"), (True, "training_sps")):
                if (v := self.pipeline(n, train)) is not None:
                    self.figures[key] = v
            if "ceiling" not in self.skip:
                self.ceiling_after(n)
        if "components" in self.skip:
            for _, keys in COMPONENTS.values():
                self.skipped("components", keys)
        else:
            self.components()
        if "sweep" not in self.skip:
            self.run_sweep()
        return self.report()

    def run_sweep(self) -> None:
        """Ceiling and pipeline per collector count; counts already measured above are reused."""
        for n in self.sweep_counts():
            row: dict[str, Any] = {"collectors": n}
            if "pipeline" not in self.skip and n not in self._pipeline_by_n and n != self.cfg.collectors.count:
                self.pipeline(n, train=False)
            row["emulator_ceiling_sps"] = self._ceiling_by_n.get(n)
            row["pipeline_sps"] = self._pipeline_by_n.get(n)
            for key, label, part in (("emulator_ceiling_sps", "ceiling", "ceiling"), ("pipeline_sps", "pipeline", "pipeline")):
                if row[key] is not None:
                    continue
                detail = self.details.get(label if n == self.cfg.collectors.count else f"{label}_c{n}") or self.details.get(label)
                reason = f"skipped (--skip {part})" if part in self.skip else (detail or {}).get("error", "not measured")
                row.setdefault("errors", {})[key] = reason
            ceil, pipe = row["emulator_ceiling_sps"], row["pipeline_sps"]
            row["pipeline_efficiency"] = pipe / ceil if ceil and pipe is not None else None
            self.sweep.append(row)

    def report(self) -> dict[str, Any]:
        settings = {
            "quick": self.quick, "seconds_per_phase": self.seconds, "skip": sorted(self.skip),
            "env_id": self.cfg.env.env_id, "frame_skip": self.cfg.env.frame_skip, "action_set": self.cfg.env.action_set,
            "collectors": self.cfg.collectors.count, "envs_per_collector": self.cfg.collectors.envs_per_collector,
            "batch_size": self.cfg.learner.batch_size, "warmup_transitions": BENCH_WARMUP, "profile": self.args.profile,
            "pipeline_chunk_steps": next((int(o.split("=", 1)[1]) for o in self.args.overrides
                                          if o.startswith("collectors.chunk_steps=")), BENCH_CHUNK_STEPS), "pipeline_log_s": PIPELINE_LOG_S,
            "pipeline_startup_allowance_s": self.startup_allowance, "load_average_start": self._load_start, "part_wall_s": self.part_wall_s, "config": self.cfg.to_dict(),
        }
        return assemble_report(self.figures, self.errors, sweep=self.sweep, details=self.details,
                               settings=settings, facts=machine_facts(self.argv))


def _stop_after_first_data(path: Path, seconds: float, stop: threading.Event, done: threading.Event) -> None:
    """Set `stop` once `seconds` have passed since metrics.jsonl first showed env steps."""
    first: float | None = None
    while not done.is_set():
        if first is None and "first_data_after_s" in steady_rates(path, need_rows=1):
            first = time.monotonic()
        if first is not None and time.monotonic() - first >= seconds:
            stop.set()
            return
        done.wait(0.25)


def steady_rates(metrics_path: Path, need_rows: int = 2) -> dict[str, Any]:
    """env_steps/s and updates/s from the first metrics row with data to the last row where data arrived.

    Why both ends sit on arrivals: the head counts env steps when a chunk lands, i.e. in bursts of
    envs_per_collector * chunk_steps per collector. A window ending between bursts would count
    the time of a partial period but none of its steps: up to one whole period too little (~25%
    of a 4 s --quick window), while the baselines count every step as it happens. Between two
    rows that each follow an arrival lie whole periods only. updates/s uses the same window.
    """
    try:
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        return {"why": f"no readable {metrics_path.name}: {exc}"}
    rows = [r for r in rows if isinstance(r.get("time"), (int, float)) and isinstance(r.get("env_steps"), (int, float))]
    if not rows:
        return {"why": "metrics.jsonl has no rows with time and env_steps"}
    base = rows[0]["env_steps"]
    first = next((i for i, r in enumerate(rows) if r["env_steps"] > base), None)
    if first is None:
        return {"why": f"{len(rows)} metrics rows, none with env steps"}
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
                           "first_data_after_s": a["time"] - rows[0]["time"], "rows": last - first + 1}
    if isinstance(a.get("updates"), (int, float)) and isinstance(b.get("updates"), (int, float)):
        out["updates_per_s"] = (b["updates"] - a["updates"]) / dt
    return out


def _null_hint(key: str) -> str:
    """A checked (not guessed) reason for a null component figure, where one is known."""
    import importlib.util

    if key.startswith("torchrl") and importlib.util.find_spec("torchrl") is None:
        return " (torchrl is not installed)"
    return " (no reason given)"


def _run_in_subprocess(module_name: str, func_name: str, quick: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", module_name, *(["--quick"] if quick else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    result = json.loads(done.stdout[done.stdout.index("{"):])
    return {**result, "source": f"{module_name}.{func_name} (subprocess)"}


def _call_component(candidates: tuple[tuple[str, str], ...], quick: bool) -> dict[str, Any]:
    """Call the component's bench(quick). Collector-side benches (actors/) run in a child
    process (`python -m MODULE [--quick]`, JSON on stdout) so this process never imports actors/."""
    missing = []
    for module_name, func_name in candidates:
        if module_name.startswith("actors."):
            return _run_in_subprocess(module_name, func_name, quick)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                missing.append(module_name)
                continue
            raise
        fn = getattr(module, func_name, None)
        if fn is None:
            missing.append(f"{module_name}.{func_name}")
            continue
        result = fn(quick)
        if not isinstance(result, dict):
            raise TypeError(f"{module_name}.{func_name} returned {type(result).__name__}, expected dict")
        return {**result, "source": f"{module_name}.{func_name}"}
    raise ImportError(f"not available: {', '.join(missing)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        cfg = build_config(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    bench = Bench(cfg, args, argv)
    report = bench.run()
    report["settings"]["wall_s"] = time.perf_counter() - t0
    latest, stamped = write_report(report, args.out)
    print(format_table(report, markdown=args.markdown))
    print(f"\nwrote {latest} and {stamped} in {report['settings']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
