"""`make bench`: every throughput figure of the system, measured in one process tree, one sitting.

Ratios such as pipeline_sps / emulator_ceiling_sps only mean something when both sides ran on
the same machine under the same load, so this runs them back to back instead of quoting old
files. Every figure is measured here; a part that fails or is skipped leaves its figures null
with the reason in report["errors"], and the rest of the report is still written.

    python -m bench.driver --quick                 # < 3 min on an otherwise idle 2-core box
    python -m bench.driver --skip sweep --markdown # table for BENCHMARKS.md

Compared pairs run REPEATS times, interleaved (ceiling, our pipeline draining, the naive design
draining then training, our pipeline training; then again), and the report gives median and
min-max: this VM's speed drifts by more than the margins the goals ask for, and interleaving
spreads the drift over both sides of every pair. Beside every wall-clock rate is the CPU time
(user + sys of every process of the design, bench/cpu_time.py) per 1,000 env steps, which a
shared VM's steal moves far less. An efficiency above 1.0 is physically impossible and is
flagged as noise (bench/report.py), never printed as a result. The scale simulation
(bench/scale.py) runs 1-64 synthetic collectors of recorded real chunks through the real head.

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

from bench.report import PHYSICAL_LIMIT, assemble_report, format_table, machine_facts, write_report  # noqa: E402
from shared.config import Config, ConfigError  # noqa: E402

PARTS = ("ceiling", "naive", "pipeline", "components", "scale", "sweep")
QUICK_SECONDS, FULL_SECONDS = 3.0, 20.0
# Each compared pair runs REPEATS times, interleaved: median and min-max in the report. --quick is
# a smoke test that must finish in 3 minutes: one round, K=QUICK_ENVS envs per collector (each
# Mario env takes 1-3 s to build, and every pipeline repeat builds them again), no sweep.
REPEATS = {True: 1, False: 3}
QUICK_ENVS = 2
QUICK_SWEEP, FULL_SWEEP = (), (1, 2, 4)
CPU_WATCH_S = 0.05  # how often the pipeline watcher looks for a new metrics row (and snapshots CPU)
# like-for-like training: the naive learner trains as fast as it can, so ours runs without a replay ratio too
TRAIN_PAIR_SETS = ("learner.samples_per_insert=0", "learner.max_insert_lead=0")
PIPELINE_LOG_S = 0.5  # head metrics period during the bench: the steady rate is read from these rows
BENCH_CHUNK_STEPS = 16  # per-env chunk for pipeline runs (unless --set): at 128 a message takes ~25 s on 2 cores
STARTUP_ALLOWANCE_S = {True: 40.0, False: 90.0}  # cap on head start-up before the timed window (quick, full)
BENCH_WARMUP = 256  # transitions before timed training: enough to sample batches from, small for --quick

# Component benches owned by other modules: (candidate (module, function) pairs, keys they report).
COMPONENTS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "replay": (
        (("replay.bench", "run_replay_bench"),),
        ("replay_insert_tps", "replay_sample32_ms", "replay_sample512_ms", "naive_replay_sample512_ms",
         "copy_floor_sample512_ms", "bytes_per_transition", "naive_bytes_per_transition", "torchrl_sample512_ms",
         "insert_copy_floor_tps"),
    ),
    "transport": (  # collector side: run as `python -m actors.bench` (the learner never imports actors/)
        (("actors.bench", "run_transport_bench"),),
        ("transport_tps", "mpqueue_transport_tps", "collector_overhead_frac"),
    ),
    "learner": ((("bench.learner", "run_learner_bench"),), ("learner_updates_per_s",)),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help=f"smoke test under 3 min: {QUICK_SECONDS:g} s phases, one round, "
                   f"{QUICK_ENVS} envs per collector, no sweep")
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
    elif args.quick and not any(o.startswith("collectors.envs_per_collector=") for o in args.overrides):
        sets.append(f"collectors.envs_per_collector={QUICK_ENVS}")
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
        self.repeats = REPEATS[self.quick]
        self.figures: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.details: dict[str, Any] = {}
        self.sweep: list[dict[str, Any]] = []
        self.run_root = Path(args.out).parent / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self._port = random.Random().randrange(20000, 60000, 20)  # distinct ports per head run
        self._ceiling_by_n: dict[int, float] = {}
        self._pipeline_by_n: dict[int, float] = {}
        self.reps: dict[str, list[dict[str, Any]]] = {}  # phase -> one record per repeat (sps, ups, cpu)
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
    def _rep(self, phase: str, record: dict[str, Any] | None) -> None:
        if record is not None:
            self.reps.setdefault(phase, []).append(record)

    def ceiling_once(self, ceiling: Any, rep: int) -> None:
        """The raw emulator ceiling and the project env (what collectors step) at the main count."""
        n = self.cfg.collectors.count
        for kind, phase in (("raw", "ceiling"), ("project", "project_env")):
            res = self.attempt(f"{phase}_{rep}", (), lambda kind=kind: ceiling.measure(kind, n, self.seconds))
            if res is not None:
                self.details.setdefault(phase, []).append(res)
                self._rep(phase, {"sps": res["sps"], "cpu_s_per_1k_steps": res["cpu_s_per_1k_steps"]})

    def naive(self, rep: int) -> None:
        """Drain then train on one collector group: separates transport cost from learner cost."""
        from bench.baselines import run_naive_pipeline

        res = self.attempt(f"naive_{rep}", (),
                           lambda: run_naive_pipeline(self.cfg, self.seconds, ("drain", "train"), BENCH_WARMUP))
        if res is None:
            return
        for phase in ("drain", "train"):
            self.details.setdefault(f"naive_{phase}", []).append(res[phase])
            r = res[phase]
            self._rep(f"naive_{phase}", {"sps": r["sps"], "ups": r["updates_per_s"], "cpu_s_per_1k_steps": r["cpu_s_per_1k_steps"]})

    def pipeline(self, n: int, train: bool, rep: int = 0) -> float | None:
        """Our pipeline through the head API, rated in steady state (after the first data arrived).

        run_training's own env_steps_per_s divides by a wall time that includes collector
        start-up, which the baselines exclude; so a watcher thread tails the head's metrics.jsonl
        (logged every PIPELINE_LOG_S), snapshots the process tree's CPU time at every new row,
        and sets run_training's stop_event `seconds` after the first data arrived. The rate is
        taken between that first data row and the last row where data arrived, and the CPU time
        between the snapshots of those same rows. If no steady window happened within the
        start-up cap, the figure is null with the reason (the start-up-diluted summary rate
        stays in details, never in the headline). Training runs without a replay ratio
        (TRAIN_PAIR_SETS), as the naive learner does, so the train pair is like for like.
        """
        sets = [f"collectors.count={n}", f"transport.port={self._port}", f"logging.interval_s={PIPELINE_LOG_S}"]
        if not any(o.startswith("collectors.chunk_steps=") for o in self.args.overrides):
            sets.append(f"collectors.chunk_steps={BENCH_CHUNK_STEPS}")  # a message every few s, not every ~25 s
        if train:
            sets += [s for s in TRAIN_PAIR_SETS if not any(o.startswith(s.split("=")[0] + "=") for o in self.args.overrides)]
        cfg = self.cfg.with_overrides(sets)
        self._port += 20
        main = n == self.cfg.collectors.count
        label = f"{'training' if train else 'pipeline'}" + ("" if main else f"_c{n}") + f"_{rep}"
        run_dir = self.run_root / label
        snaps: dict[int, tuple[float, dict[int, float]]] = {}  # metrics row -> (env_steps, CPU snapshot when it appeared)

        def call() -> dict[str, Any]:
            from launcher.head import run_training

            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log_path = run_dir.parent / f"{label}.stdout.log"
            stop, done = threading.Event(), threading.Event()
            kwargs: dict[str, Any] = {"max_seconds": self.seconds + self.startup_allowance, "train": train,
                                      "stop_event": stop}
            threading.Thread(target=_stop_after_first_data, daemon=True, name="bench-watch",
                             args=(run_dir / "metrics.jsonl", self.seconds + PIPELINE_LOG_S, stop, done, snaps)).start()
            try:
                with open(log_path, "w") as log, contextlib.redirect_stdout(log):  # progress lines would bury the table
                    res = run_training(cfg, str(run_dir), **kwargs)
            finally:
                done.set()
            if not isinstance(res, dict) or res.get("env_steps_per_s") is None:
                raise RuntimeError(f"run_training returned no env_steps_per_s: {res!r}")
            return {**res, "stdout_log": str(log_path)}

        res = self.attempt(label, (), call)
        if res is None:
            return None
        steady = steady_rates(run_dir / "metrics.jsonl")
        res["steady"] = steady
        res["cpu_s_per_1k_steps"] = _window_cpu_per_1k(steady, snaps)
        self.details.setdefault(label.rsplit("_", 1)[0], []).append(res)
        rate = steady.get("env_steps_per_s")
        if rate is None:
            res["error"] = (f"{label}: no steady-state window within {self.seconds + self.startup_allowance:.0f} s "
                            f"({steady.get('why')}); whole-run rate incl. start-up {res['env_steps_per_s']:.1f}/s is in details")
            return None
        if main:
            self._rep("training" if train else "pipeline", {"sps": float(rate), "ups": steady.get("updates_per_s"),
                                                            "cpu_s_per_1k_steps": res["cpu_s_per_1k_steps"]})
        elif not train:
            self._pipeline_by_n[n] = float(rate)
        return float(rate)

    def paired(self) -> None:
        """REPEATS rounds of: ceiling, ours draining, naive (drain, train), ours training."""
        from bench.baselines import EmulatorCeiling

        n = self.cfg.collectors.count
        ceiling_ctx: Any = contextlib.nullcontext(None)
        if "ceiling" not in self.skip:
            width = max([n, *self.sweep_counts()])
            ceiling_ctx = EmulatorCeiling(self.cfg.env, width, self.cfg.collectors.envs_per_collector)
        with contextlib.ExitStack() as stack:
            ceiling = self.attempt("ceiling_start", (), lambda: stack.enter_context(ceiling_ctx)) \
                if "ceiling" not in self.skip else None
            for rep in range(self.repeats):
                if ceiling is not None:
                    self.ceiling_once(ceiling, rep)
                if "pipeline" not in self.skip:
                    self.pipeline(n, train=False, rep=rep)
                if "naive" not in self.skip:
                    self.naive(rep)
                if "pipeline" not in self.skip:
                    self.pipeline(n, train=True, rep=rep)
            if ceiling is not None:  # the sweep's other counts, from the same workers
                for m in self.sweep_counts():
                    if m != n:
                        res = self.attempt(f"ceiling_c{m}", (), lambda m=m: ceiling.measure("raw", m, self.seconds))
                        if res is not None:
                            self.details[f"ceiling_c{m}"] = res
                            self._ceiling_by_n[m] = float(res["sps"])
        self.summarize_pairs()

    def summarize_pairs(self) -> None:
        """Headline figures: medians over the repeats; spreads and per-repeat values in details."""
        reps, n = self.reps, self.cfg.collectors.count
        for phase, key in (("ceiling", "emulator_ceiling_sps"), ("project_env", "project_env_sps"),
                           ("pipeline", "pipeline_sps"), ("training", "training_sps"),
                           ("naive_drain", "naive_drain_sps"), ("naive_train", "naive_pipeline_sps")):
            values = [r["sps"] for r in reps.get(phase, [])]
            if values:
                self.figures[key] = median(values)
            elif key not in self.errors:
                part = {"ceiling": "ceiling", "project_env": "ceiling", "naive_drain": "naive",
                        "naive_train": "naive"}.get(phase, "pipeline")
                self.errors[key] = f"skipped (--skip {part})" if part in self.skip else _why(self.details, phase)
        if "emulator_ceiling_sps" in self.figures:
            self._ceiling_by_n[n] = self.figures["emulator_ceiling_sps"]
        if "pipeline_sps" in self.figures:
            self._pipeline_by_n[n] = self.figures["pipeline_sps"]
        cpu = {phase: median([r["cpu_s_per_1k_steps"] for r in recs if r.get("cpu_s_per_1k_steps") is not None])
               for phase, recs in reps.items()}
        if any(v is not None for v in cpu.values()):
            self.figures["cpu_s_per_1k_steps"] = cpu
        else:
            self.errors.setdefault("cpu_s_per_1k_steps", "no phase was measured" if not reps else
                                   "no CPU figure: /proc/<pid>/stat unreadable here")
        self.details["repeats"] = reps
        # cores the design kept busy in its window (rate x CPU per step): below the machine's cores
        # when other tenants took them, so wall-clock rates of two windows compare only at equal cores
        self.details["cores_used"] = {
            phase: median([r["sps"] * r["cpu_s_per_1k_steps"] / 1000.0 for r in recs if r.get("cpu_s_per_1k_steps")])
            for phase, recs in reps.items()}
        pairs = list(zip(reps.get("ceiling", []), reps.get("pipeline", []), strict=False))
        self.figures["pipeline_efficiency"] = spread([p["sps"] / c["sps"] for c, p in pairs if c["sps"]])
        # CPU efficiency against the env the collectors step (the project env: the package env's
        # per-frame Python work, which the raw ceiling pays, is not the pipeline's); the raw
        # ceiling's version is in details. Per repeat, both sides from the same round.
        def cpu_ratio(ref: str, phase: str) -> dict[str, Any] | None:
            both = zip(reps.get(ref, []), reps.get(phase, []), strict=False)
            return spread([e["cpu_s_per_1k_steps"] / p["cpu_s_per_1k_steps"] for e, p in both
                           if e.get("cpu_s_per_1k_steps") and p.get("cpu_s_per_1k_steps")])

        self.figures["cpu_efficiency"] = cpu_ratio("project_env", "pipeline")
        self.figures["cpu_efficiency_training"] = cpu_ratio("project_env", "training")
        self.details["cpu_efficiency_vs_raw_ceiling"] = {"draining": cpu_ratio("ceiling", "pipeline"),
                                                         "training": cpu_ratio("ceiling", "training")}
        for key in ("pipeline_efficiency", "cpu_efficiency", "cpu_efficiency_training"):
            if self.figures[key] is None:
                self.errors.setdefault(key, "needs at least one ceiling and one pipeline repeat")
        ours, naive = reps.get("training", []), reps.get("naive_train", [])
        if ours or naive:
            self.figures["train_pair"] = {
                "ours_sps": median([r["sps"] for r in ours]), "ours_ups": median([r["ups"] for r in ours if r.get("ups") is not None]),
                "naive_sps": median([r["sps"] for r in naive]), "naive_ups": median([r["ups"] for r in naive]),
            }
            self.details["train_pair_spread"] = {
                "ours_sps": spread([r["sps"] for r in ours]), "naive_sps": spread([r["sps"] for r in naive]),
                "ours_ups": spread([r["ups"] for r in ours if r.get("ups") is not None]),
                "naive_ups": spread([r["ups"] for r in naive]),
                "settings": {"batch_size": self.cfg.learner.batch_size, "overrides": list(TRAIN_PAIR_SETS),
                             "replay_ratio_ours": _replay_ratio(ours, self.cfg.learner.batch_size),
                             "replay_ratio_naive": _replay_ratio(naive, self.cfg.learner.batch_size)},
            }
        drains = list(zip(reps.get("naive_drain", []), reps.get("pipeline", []), strict=False))
        self.details["drain_pair"] = {"ours_over_naive": spread([p["sps"] / d["sps"] for d, p in drains if d["sps"]])}

    def scale(self) -> None:
        from bench.scale import run_scale

        keys = ("head_capacity_tps", "naive_head_capacity_tps")
        res = self.attempt("scale", ("scale", *keys), lambda: run_scale(self.cfg, self.quick, Path(self.args.out).parent))
        if res is None:
            return
        self.figures["scale"] = res["scale"]
        for key in keys:
            if res.get(key) is not None:
                self.figures[key] = res[key]
            else:
                self.errors[key] = f"scale: {res['errors'].get(key, 'not measured')}"
        self.figures["ingest_cpu_us_per_transition"] = res.get("ingest_cpu_us_per_transition")
        self.details["scale"] = {**res["details"], "plot": res.get("plot"),
                                 "errors": {k: v for k, v in res["errors"].items() if k not in keys}}

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
        if "ceiling" in self.skip:
            self.skipped("ceiling", ("emulator_ceiling_sps", "project_env_sps"))
        if "naive" in self.skip:
            self.skipped("naive", ("naive_drain_sps", "naive_pipeline_sps"))
        if "pipeline" in self.skip:
            self.skipped("pipeline", ("pipeline_sps", "training_sps"))
        self.paired()
        if "components" in self.skip:
            for _, keys in COMPONENTS.values():
                self.skipped("components", keys)
        else:
            self.components()
        if "scale" in self.skip:
            self.skipped("scale", ("scale", "head_capacity_tps", "naive_head_capacity_tps"))
        else:
            self.scale()
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
                reason = f"skipped (--skip {part})" if part in self.skip else _why(self.details, label if n == self.cfg.collectors.count else f"{label}_c{n}")
                row.setdefault("errors", {})[key] = reason
            ceil, pipe = row["emulator_ceiling_sps"], row["pipeline_sps"]
            row["pipeline_efficiency"] = pipe / ceil if ceil and pipe is not None else None
            if row["pipeline_efficiency"] is not None and row["pipeline_efficiency"] > PHYSICAL_LIMIT:
                row.setdefault("errors", {})["pipeline_efficiency"] = (
                    f"noise: {row['pipeline_efficiency']:.3g} is above the physical limit {PHYSICAL_LIMIT:g} "
                    "(ceiling and pipeline of this row ran minutes apart, not interleaved)")
                row["pipeline_efficiency"] = None
            self.sweep.append(row)

    def report(self) -> dict[str, Any]:
        settings = {
            "quick": self.quick, "seconds_per_phase": self.seconds, "repeats": self.repeats, "skip": sorted(self.skip),
            "env_id": self.cfg.env.env_id, "frame_skip": self.cfg.env.frame_skip, "action_set": self.cfg.env.action_set,
            "collectors": self.cfg.collectors.count, "envs_per_collector": self.cfg.collectors.envs_per_collector,
            "batch_size": self.cfg.learner.batch_size, "warmup_transitions": BENCH_WARMUP, "profile": self.args.profile,
            "pipeline_chunk_steps": next((int(o.split("=", 1)[1]) for o in self.args.overrides
                                          if o.startswith("collectors.chunk_steps=")), BENCH_CHUNK_STEPS), "pipeline_log_s": PIPELINE_LOG_S,
            "pipeline_startup_allowance_s": self.startup_allowance, "load_average_start": self._load_start, "part_wall_s": self.part_wall_s, "config": self.cfg.to_dict(),
        }
        report = assemble_report(self.figures, self.errors, sweep=self.sweep, details=self.details,
                                 settings=settings, facts=machine_facts(self.argv), quick=self.quick)
        return report


def _stop_after_first_data(path: Path, seconds: float, stop: threading.Event, done: threading.Event,
                           snaps: dict[int, tuple[float, dict[int, float]]] | None = None) -> None:
    """Set `stop` once `seconds` have passed since metrics.jsonl first showed env steps. Until
    `done` (the run has returned), put (env_steps, CPU snapshot of the process tree) in `snaps[i]`
    as soon as row i appears: the last rows are written after `stop`, while the head shuts down."""
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
            if first is None and "first_data_after_s" in steady_rates(path, need_rows=1):
                first = time.monotonic()
        if first is not None and not stop.is_set() and time.monotonic() - first >= seconds:
            stop.set()
        done.wait(CPU_WATCH_S)


def _window_cpu_per_1k(steady: dict[str, Any], snaps: dict[int, tuple[float, dict[int, float]]]) -> float | None:
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


def _replay_ratio(records: list[dict[str, Any]], batch: int) -> float | None:
    """Sampled transitions per consumed one (updates x batch / env steps), median over repeats."""
    ratios = [r["ups"] * batch / r["sps"] for r in records if r.get("ups") is not None and r.get("sps")]
    return median(ratios)


def _why(details: dict[str, Any], label: str) -> str:
    """The recorded reason a phase has no figure (its last failure), or 'not measured'."""
    found = details.get(label)
    entries = found if isinstance(found, list) else [found] if isinstance(found, dict) else []
    for entry in reversed(entries):
        if isinstance(entry, dict) and entry.get("error"):
            return str(entry["error"])
    for key, value in details.items():
        if key.startswith(label + "_") and isinstance(value, dict) and value.get("error"):
            return str(value["error"])
    return "not measured"


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
    index = [i for i, r in enumerate(rows)  # line numbers of the usable rows (the watcher's snapshot keys)
             if isinstance(r.get("time"), (int, float)) and isinstance(r.get("env_steps"), (int, float))]
    rows = [rows[i] for i in index]
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
                           "first_data_after_s": a["time"] - rows[0]["time"], "rows": last - first + 1,
                           "steps": b["env_steps"] - a["env_steps"], "first_row": index[first], "last_row": index[last]}
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
