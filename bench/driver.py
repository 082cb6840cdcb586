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
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported anywhere in this tree
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the launcher: learner threads must not spin on a loaded box

from bench.components import COMPONENTS, call_component, null_hint  # noqa: E402
from bench.report import PHYSICAL_LIMIT, assemble_report, format_table, machine_facts, write_report  # noqa: E402
from bench.steady import (  # noqa: E402  (steady_rates, window_cpu_per_1k: also the tests' import path)
    median,
    pair_figures,
    steady_rates,
    stop_after_first_data,
    window_cpu_per_1k,
)
from shared.config import Config, ConfigError  # noqa: E402

PARTS = ("ceiling", "naive", "pipeline", "components", "scale", "sweep")
QUICK_SECONDS, FULL_SECONDS = 3.0, 20.0
# Each compared pair runs REPEATS times, interleaved: median and min-max in the report. --quick is
# a smoke test that must finish in 3 minutes: one round, K=QUICK_ENVS envs per collector (each
# Mario env takes 1-3 s to build, and every pipeline repeat builds them again), no sweep.
REPEATS = {True: 1, False: 3}
QUICK_ENVS = 2
QUICK_SWEEP, FULL_SWEEP = (), (1, 2, 4)
# like-for-like training: the naive learner trains as fast as it can, so ours runs without a replay ratio too
TRAIN_PAIR_SETS = ("learner.samples_per_insert=0", "learner.max_insert_lead=0")
PIPELINE_LOG_S = 0.5  # head metrics period during the bench: the steady rate is read from these rows
BENCH_CHUNK_STEPS = 16  # per-env chunk for pipeline runs (unless --set): at 128 a message takes ~25 s on 2 cores
STARTUP_ALLOWANCE_S = {True: 40.0, False: 90.0}  # cap on head start-up before the timed window (quick, full)
BENCH_WARMUP = 256  # transitions before timed training: enough to sample batches from, small for --quick

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
    p.add_argument("--backends", nargs="+", default=None, choices=("nes-py", "retro"),
                   help="Mario emulator backends measured side by side (default: both where stable-retro is installed)")
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
        self.by_backend: dict[str, dict[str, Any]] = {}  # Mario backend -> its paired figures (other_backends)

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

        the head's own env_steps_per_s divides by a wall time that includes collector
        start-up, which the baselines exclude; so a watcher thread tails the head's metrics.jsonl
        (logged every PIPELINE_LOG_S), snapshots the process tree's CPU time at every new row,
        and sets the head's stop_event `seconds` after the first data arrived. The rate is
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
            from launcher.head import Head, StopAt

            run_dir.parent.mkdir(parents=True, exist_ok=True)
            log_path = run_dir.parent / f"{label}.stdout.log"
            stop, done = threading.Event(), threading.Event()
            stop_at = StopAt(seconds=self.seconds + self.startup_allowance)
            threading.Thread(target=stop_after_first_data, daemon=True, name="bench-watch",
                             args=(run_dir / "metrics.jsonl", self.seconds + PIPELINE_LOG_S, stop, done, snaps, n)).start()
            try:
                with open(log_path, "w") as log, contextlib.redirect_stdout(log):  # progress lines would bury the table
                    with Head(cfg, run_dir, train=train) as head:
                        res = head.run(stop_at, stop)
            finally:
                done.set()
            if not isinstance(res, dict) or res.get("env_steps_per_s") is None:
                raise RuntimeError(f"the head's run returned no env_steps_per_s: {res!r}")
            return {**res, "stdout_log": str(log_path)}

        res = self.attempt(label, (), call)
        if res is None:
            return None
        steady = steady_rates(run_dir / "metrics.jsonl", collectors=n)
        res["steady"] = steady
        res["cpu_s_per_1k_steps"] = window_cpu_per_1k(steady, snaps)
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
        figures, details = pair_figures(reps, self.cfg.learner.batch_size, TRAIN_PAIR_SETS)
        self.figures.update(figures)
        self.details.update(details)
        if "cpu_s_per_1k_steps" not in figures:
            self.errors.setdefault("cpu_s_per_1k_steps", "no phase was measured" if not reps else
                                   "no CPU figure: /proc/<pid>/stat unreadable here")
        for key in ("pipeline_efficiency", "cpu_efficiency", "cpu_efficiency_training"):
            if figures[key] is None:
                self.errors.setdefault(key, "needs at least one ceiling and one pipeline repeat")

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
            res = self.attempt(name, keys, lambda c=candidates: call_component(c, self.quick))
            if res is None:
                continue
            self.details[name] = res
            for key in keys:
                if key in res and res[key] is not None:
                    earlier = self.figures.get(key)  # a by-mode mapping two components fill joins into one
                    both = isinstance(earlier, dict) and isinstance(res[key], dict)
                    self.figures[key] = {**earlier, **res[key]} if both else res[key]
                elif isinstance(res.get("errors"), dict) and key in res["errors"]:
                    self.errors[key] = f"{name}: {res['errors'][key]}"
                elif key in res:
                    self.errors[key] = f"{name}: its bench returned null for {key!r}" + null_hint(key)
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
        self.other_backends()
        return self.report()

    def backend_list(self) -> list[str]:
        """The Mario backends to measure side by side: --backends, else both where stable-retro is installed."""
        from envs.mario.backend import resolve_backend, retro_installed
        from shared.config import is_mario

        if not is_mario(self.cfg.env.env_id):
            return []
        if self.args.backends:
            return list(dict.fromkeys(self.args.backends))
        return ["nes-py", "retro"] if retro_installed() else [resolve_backend(self.cfg.env.backend)]

    def other_backends(self) -> None:
        """The ceiling and our pipeline (draining, training) on each other Mario backend, as `paired` ran them on
        the config's: report["backends"] holds every backend's figures side by side (the config's from above)."""
        from dataclasses import replace

        from envs.mario.backend import resolve_backend

        backends = self.backend_list()
        if not backends:
            return
        own = resolve_backend(self.cfg.env.backend)
        self.by_backend[own] = self._backend_figures(self)
        for backend in backends:
            if backend == own:
                continue
            cfg = replace(self.cfg, env=replace(self.cfg.env, backend=backend))
            sub = Bench(cfg, self.args, self.argv)
            sub.skip = self.skip | {"naive", "components", "scale", "sweep"}
            sub.run_root = self.run_root / f"backend-{backend}"
            sub._port = self._port + 10
            self.attempt(f"backend_{backend}", (), sub.paired)
            self.by_backend[backend] = self._backend_figures(sub)
            self.part_wall_s.update({f"{backend}:{k}": v for k, v in sub.part_wall_s.items()})
            self.details[f"backend_{backend}"] = sub.details

    @staticmethod
    def _backend_figures(bench: Bench) -> dict[str, Any]:
        keys = ("emulator_ceiling_sps", "project_env_sps", "pipeline_sps", "training_sps", "pipeline_efficiency",
                "cpu_efficiency", "cpu_efficiency_training", "cpu_s_per_1k_steps")
        out: dict[str, Any] = {key: bench.figures.get(key) for key in keys}
        errors = {key: bench.errors[key] for key in keys if out[key] is None and key in bench.errors}
        if errors:
            out["errors"] = errors
        return out

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
        report["backends"] = self.by_backend
        return report


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


def _backend_line(figures: dict[str, Any]) -> str:
    """One backend's side-by-side figures on one line: medians of the repeats, n/a where not measured."""
    parts = []
    for key, value in figures.items():
        if key == "errors":
            continue
        if isinstance(value, dict):
            value = value.get("median", value.get("pipeline"))
        parts.append(f"{key} {value:.3g}" if isinstance(value, (int, float)) else f"{key} n/a")
    return ", ".join(parts)


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
    for backend, figures in report["backends"].items():
        print(f"backend {backend}: {_backend_line(figures)}")
    print(f"\nwrote {latest} and {stamped} in {report['settings']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
