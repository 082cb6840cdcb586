"""What the image encoder (learner.encoder, learner.encoder_width) costs: learner updates and collector inference.

Per encoder variant (nature; impala at each width) and precision:

  learner   ms per update of the real `Learner` at one batch size (bench.learner's `_measure`: RandomReplay
            stacks of Mario's 4 x 84x84 uint8 frames, 7 actions, prefetch on), as wall time and as process CPU
            time (every thread: the prefetch thread too), which a shared machine's load inflates far less
  collector ms per forward of the collector's network (`Collector._q`: inference mode, `collectors.torch_threads`
            threads) on the stacks of `collectors.envs_per_collector` envs, and that per env step

Variants are interleaved within each repeat (their order rotating from repeat to repeat), so a ratio compares
figures taken side by side; each figure is reported as the median, min and max over the repeats.

    python -m experiments.learner_encoder [--repeats 5] [--seconds 4] [--batch 32] [--widths 1,2]
                                    [--precisions fp32,bf16] [--envs 8] [--out FILE]
"""

from __future__ import annotations

import argparse
from statistics import median
from typing import Any

import torch

from bench.learner import NUM_ACTIONS, OBS_SHAPE, SPEC, STACK, RandomReplay, _measure, collector_step_ms, spread
from bench.report import print_json
from shared.config import Config, LearnerConfig


def variants(widths: tuple[int, ...]) -> list[tuple[str, int]]:
    """(encoder, width) pairs: the nature CNN, then the IMPALA CNN at each width."""
    return [("nature", 1)] + [("impala", w) for w in widths]


def variant_name(encoder: str, width: int) -> str:
    return encoder if encoder == "nature" else f"{encoder}_w{width}"


def learner_ms(encoder: str, width: int, precision: str, batch: int, replay: RandomReplay,
               budget_s: float) -> dict[str, float]:
    """Wall and process-CPU milliseconds per update of a Learner with this encoder (steady state)."""
    lc = LearnerConfig(device="cpu", batch_size=batch, precision=precision, encoder=encoder, encoder_width=width,
                       warmup_transitions=0, samples_per_insert=0.0, prefetch=True, weight_broadcast_every=10**9,
                       torch_threads=torch.get_num_threads())
    r = _measure(Config(learner=lc), torch.device("cpu"), replay, budget_s, min_updates=3, warmup=2)
    return {"wall_ms": 1000.0 / r["updates_per_s"], "cpu_ms": r["cpu_ms_per_update"], "updates": r["updates"],
            "precision": r["precision"]}


def collector_ms(encoder: str, width: int, envs: int, threads: int, budget_s: float, seed: int = 0) -> dict[str, float]:
    """Milliseconds per forward of the collector's network on `envs` uint8 stacks, as `Collector._q` runs it."""
    from shared.network import build_q_network

    net = build_q_network(OBS_SHAPE, STACK, NUM_ACTIONS, LearnerConfig().hidden, True, encoder, width).eval()
    return collector_step_ms(net, envs, threads, budget_s, seed)


def run_encoder_bench(repeats: int = 3, seconds: float = 3.0, batch: int = 32, widths: tuple[int, ...] = (1, 2),
                      precisions: tuple[str, ...] | None = None, envs: int = 8, collector_threads: int = 1
                      ) -> dict[str, Any]:
    """The encoder variants side by side on this CPU; JSON-able. Keys: learner_ms_per_update and
    collector_ms_per_env_step (variant -> median), their spreads and CPU-time counterparts in `details`,
    and ratios to the nature CNN (of medians)."""
    from learner.precision import cpu_has_native_bf16
    from shared.network import build_q_network

    skipped: dict[str, str] = {}
    if precisions is None:
        precisions = ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",)
        if not cpu_has_native_bf16():
            skipped["*_bf16"] = "CPU lacks native bf16 (oneDNN reference kernels, 10-30x slower)"
    plan = variants(widths)
    replay = RandomReplay("cpu")
    learner: dict[str, list[dict[str, float]]] = {}
    collector: dict[str, list[dict[str, float]]] = {}
    for rep in range(repeats):
        order = plan[rep % len(plan):] + plan[:rep % len(plan)]  # rotate: no variant always runs first
        for encoder, width in order:
            name = variant_name(encoder, width)
            for precision in precisions:
                learner.setdefault(f"{name}_{precision}_b{batch}", []).append(
                    learner_ms(encoder, width, precision, batch, replay, seconds))
            collector.setdefault(name, []).append(collector_ms(encoder, width, envs, collector_threads, seconds / 2))
    params = {variant_name(e, w): sum(p.numel() for p in build_q_network(OBS_SHAPE, STACK, NUM_ACTIONS, 512, True, e, w)
                                      .parameters()) for e, w in plan}
    learner_fig = {k: median(r["wall_ms"] for r in v) for k, v in learner.items()}
    learner_cpu = {k: median(r["cpu_ms"] for r in v) for k, v in learner.items()}
    step_fig = {k: median(r["wall_ms"] for r in v) / envs for k, v in collector.items()}
    ratios: dict[str, float] = {}
    for encoder, width in plan[1:]:
        name = variant_name(encoder, width)
        for precision in precisions:
            key, base = f"{name}_{precision}_b{batch}", f"nature_{precision}_b{batch}"
            ratios[f"learner_{key}_vs_nature"] = round(learner_fig[key] / learner_fig[base], 2)
            ratios[f"learner_cpu_{key}_vs_nature"] = round(learner_cpu[key] / learner_cpu[base], 2)
        ratios[f"collector_{name}_vs_nature"] = round(step_fig[name] / step_fig["nature"], 2)
    return {
        "device": "cpu",
        "torch": torch.__version__,
        "torch_threads_learner": torch.get_num_threads(),
        "torch_threads_collector": collector_threads,
        "cpu_native_bf16": cpu_has_native_bf16(),
        "repeats": repeats,
        "seconds_per_measurement": seconds,
        "batch_size": batch,
        "envs_per_collector": envs,
        "geometry": {"obs_shape": list(SPEC.obs_shape), "stack": SPEC.stack, "num_actions": SPEC.num_actions,
                     "hidden": LearnerConfig().hidden, "dueling": True},
        "parameters": params,
        "learner_ms_per_update": {k: round(v, 2) for k, v in learner_fig.items()},
        "learner_cpu_ms_per_update": {k: round(v, 2) for k, v in learner_cpu.items()},
        "collector_ms_per_env_step": {k: round(v, 3) for k, v in step_fig.items()},
        "ratios": ratios,
        "details": {
            "learner_wall_ms": {k: spread([r["wall_ms"] for r in v]) for k, v in learner.items()},
            "learner_cpu_ms": {k: spread([r["cpu_ms"] for r in v]) for k, v in learner.items()},
            "learner_updates": {k: [r["updates"] for r in v] for k, v in learner.items()},
            "learner_precision_ran": {k: v[0]["precision"] for k, v in learner.items()},
            "collector_ms_per_forward": {k: spread([r["wall_ms"] for r in v]) for k, v in collector.items()},
            "collector_cpu_ms_per_forward": {k: spread([r["cpu_ms"] for r in v]) for k, v in collector.items()},
        },
        "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.learner_encoder",
                                     description="Learner and collector cost of each image encoder (JSON on stdout)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per learner measurement "
                        "(the collector's get half)")
    parser.add_argument("--batch", type=int, default=32, help="learner batch size (default 32)")
    parser.add_argument("--widths", default="1,2", help="comma-separated impala widths (default 1,2)")
    parser.add_argument("--precisions", default=None, help="comma-separated learner.precision values (default: "
                        "fp32, and bf16 where this CPU has native bf16)")
    parser.add_argument("--envs", type=int, default=8, help="observations per collector forward (default 8)")
    parser.add_argument("--threads", type=int, default=None, help="learner torch threads (default: keep)")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: need at least 1")
    if not args.seconds > 0:
        parser.error(f"--seconds={args.seconds}: need a positive duration")
    if args.batch < 1 or args.envs < 1:
        parser.error(f"--batch={args.batch} --envs={args.envs}: need at least 1")
    try:
        widths = tuple(int(w) for w in args.widths.split(","))
    except ValueError:
        parser.error(f"--widths={args.widths!r}: need comma-separated integers, e.g. 1,2")
    if min(widths) < 1:
        parser.error(f"--widths={args.widths!r}: widths must be >= 1")
    precisions = None if args.precisions is None else tuple(args.precisions.split(","))
    if precisions is not None and not set(precisions) <= {"fp32", "bf16", "auto"}:
        parser.error(f"--precisions={args.precisions!r}: allowed fp32, bf16, auto")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_encoder_bench(repeats=args.repeats, seconds=args.seconds, batch=args.batch, widths=widths,
                               precisions=precisions, envs=args.envs)
    print_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
