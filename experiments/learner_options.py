"""What a learner option costs on this CPU, per update and per collector step: the Mario recipe against the recipe
with the option.

The base is the learner and replay sections `make run` trains Mario 1-1 with on the `cpu` profile (the
Mario preset included: Munchausen targets, gamma 0.9); each variant is the base with `section.field=value`
assignments on top, e.g. `noisy:learner.noisy_sigma=0.5` or `qr:learner.quantiles=200,learner.munchausen_alpha=0`.
Every variant runs the real `Learner` (bench.learner's `_measure`: RandomReplay stacks of Mario's 4 x 84x84
uint8 frames, prefetch on, no warm-up, no rate limit, no weight broadcasts) and reports milliseconds per
update as wall time and as process CPU time (every thread), which a shared machine's load inflates far less.
Beside it, the collector's side of the option: CPU milliseconds per step of a collector's network on the stacks
of `collectors.envs_per_collector` envs, as `Collector.step` runs it (new NoisyNet noise first where the network
has it, then the forward in inference mode on `collectors.torch_threads` threads).

Variants are interleaved within each repeat (their order rotating from repeat to repeat), so a ratio compares
figures taken side by side; each figure is the median, min and max over the repeats, and each ratio is the
median of the per-repeat ratios to the base measured in the same round.

    python -m experiments.learner_options --variant noisy:learner.noisy_sigma=0.5 [--variant NAME:ASSIGNMENTS ...]
                                    [--repeats 5] [--seconds 4] [--precision fp32] [--threads 1] [--out FILE]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from statistics import median
from typing import Any

import torch

from bench.learner import SPEC, RandomReplay, _measure, collector_step_ms, spread
from bench.report import print_json
from shared.config import Config, ConfigError

BASE = "base"
SECTIONS = ("learner", "replay")  # what the Learner is built from; other sections do not change an update


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """`NAME:section.field=value[,section.field=value...]` -> (name, assignments); ConfigError if malformed."""
    name, sep, rest = text.partition(":")
    assignments = tuple(a.strip() for a in rest.split(",") if a.strip())
    if not sep or not name.strip() or not assignments:
        raise ConfigError(f"--variant {text!r}: expected NAME:section.field=value[,section.field=value...]")
    if name.strip() == BASE:
        raise ConfigError(f"--variant {text!r}: the name {BASE!r} is the recipe without options")
    for item in assignments:
        section = item.partition(".")[0]
        if section not in SECTIONS:
            raise ConfigError(f"--variant {text!r}: {item!r} sets {section!r}; an update reads only "
                              f"{' and '.join(SECTIONS)} settings")
    return name.strip(), assignments


def variant_config(base: Config, assignments: tuple[str, ...], precision: str, batch: int | None) -> Config:
    """`base` with the assignments, then the bench's own learner settings (checked like a run's config)."""
    cfg = base.with_overrides(list(assignments))
    learner = replace(cfg.learner, device="cpu", precision=precision, warmup_transitions=0, samples_per_insert=0.0,
                      prefetch=True, weight_broadcast_every=10**9, torch_threads=torch.get_num_threads(),
                      batch_size=batch or cfg.learner.batch_size)
    return replace(cfg, learner=learner).check_valid()


def base_config() -> Config:
    """The learner and replay sections of a Mario 1-1 run on the cpu profile (its env preset applied)."""
    from config_optimized import load_config

    return load_config("cpu")


def collector_ms(cfg: Config, budget_s: float, seed: int = 0) -> dict[str, float]:
    """CPU (and wall) milliseconds per collector step of this config's network: noise drawn (if any), one forward
    on `collectors.envs_per_collector` uint8 stacks in inference mode, `collectors.torch_threads` threads."""
    from shared.network import build_q_network_for

    net = build_q_network_for(SPEC, cfg.learner).eval()
    return collector_step_ms(net, cfg.collectors.envs_per_collector, cfg.collectors.torch_threads, budget_s, seed)


def run_options_bench(variants: list[tuple[str, tuple[str, ...]]], repeats: int = 3, seconds: float = 4.0,
                      precision: str = "fp32", batch: int | None = None, base: Config | None = None) -> dict[str, Any]:
    """The base and each variant side by side; JSON-able. Keys: wall_ms_per_update, cpu_ms_per_update and
    collector_cpu_ms_per_step (variant -> median), ratios (variant -> median per-round ratio to the base),
    spreads in `details`."""
    base = base if base is not None else base_config()
    plan = [(BASE, ())] + list(variants)
    configs = {name: variant_config(base, assignments, precision, batch) for name, assignments in plan}
    replay = RandomReplay("cpu")
    rounds: list[dict[str, dict[str, float]]] = []
    for rep in range(repeats):
        order = plan[rep % len(plan):] + plan[:rep % len(plan)]  # rotate: no variant always runs first
        figures = {}
        for name, _ in order:
            r = _measure(configs[name], torch.device("cpu"), replay, seconds, min_updates=3, warmup=2)
            c = collector_ms(configs[name], seconds / 2)
            figures[name] = {"wall_ms": 1000.0 / r["updates_per_s"], "cpu_ms": r["cpu_ms_per_update"],
                             "updates": r["updates"], "precision": r["precision"],
                             "collector_cpu_ms": c["cpu_ms"], "collector_wall_ms": c["wall_ms"]}
        rounds.append(figures)

    def column(name: str, key: str) -> list[float]:
        return [f[name][key] for f in rounds]

    names = [name for name, _ in plan]
    ratios: dict[str, Any] = {}
    for name in names[1:]:
        for key in ("wall_ms", "cpu_ms", "collector_cpu_ms"):
            per_round = [f[name][key] / f[BASE][key] for f in rounds]
            ratios[f"{name}_{key}_vs_{BASE}"] = spread(per_round, 3)
    return {
        "device": "cpu",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "seconds_per_measurement": seconds,
        "precision_ran": {name: rounds[0][name]["precision"] for name in names},
        "batch_size": configs[BASE].learner.batch_size,
        "geometry": {"obs_shape": list(SPEC.obs_shape), "stack": SPEC.stack, "num_actions": SPEC.num_actions},
        "variants": {name: list(assignments) for name, assignments in plan},
        "wall_ms_per_update": {name: round(median(column(name, "wall_ms")), 2) for name in names},
        "cpu_ms_per_update": {name: round(median(column(name, "cpu_ms")), 2) for name in names},
        "collector_envs": configs[BASE].collectors.envs_per_collector,
        "collector_torch_threads": configs[BASE].collectors.torch_threads,
        "collector_cpu_ms_per_step": {name: round(median(column(name, "collector_cpu_ms")), 2) for name in names},
        "ratios": ratios,
        "details": {
            "wall_ms": {name: spread(column(name, "wall_ms")) for name in names},
            "cpu_ms": {name: spread(column(name, "cpu_ms")) for name in names},
            "updates": {name: [int(u) for u in column(name, "updates")] for name in names},
            "collector_cpu_ms": {name: spread(column(name, "collector_cpu_ms")) for name in names},
            "collector_wall_ms": {name: spread(column(name, "collector_wall_ms")) for name in names},
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.learner_options",
                                     description="Per-update and per-collector-step cost of learner options "
                                                 "against the Mario recipe (JSON on stdout)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:ASSIGNMENTS",
                        help="a named variant: NAME:section.field=value[,section.field=value...]; repeatable")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per measurement (default 4)")
    parser.add_argument("--precision", default="fp32", help="learner.precision for every variant (default fp32)")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default: the recipe's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: keep)")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if not args.variant:
        parser.error("give at least one --variant NAME:section.field=value")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: need at least 1")
    if not args.seconds > 0:
        parser.error(f"--seconds={args.seconds}: need a positive duration")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch={args.batch}: need at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        variants = [parse_variant(v) for v in args.variant]
        if len({name for name, _ in variants}) != len(variants):
            raise ConfigError("--variant: each name once")
        base = base_config()
        for _, assignments in variants:
            variant_config(base, assignments, args.precision, args.batch)  # a bad value fails before any timing
    except ConfigError as exc:
        parser.error(str(exc))
    result = run_options_bench(variants, repeats=args.repeats, seconds=args.seconds, precision=args.precision,
                               batch=args.batch, base=base)
    print_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
