"""How a CPU-only machine's cores split between collectors and the learner's torch threads.

Every profile holds the per-env-step rule (config_optimized.RULE_SAMPLES_PER_INSERT / RULE_BATCH: 0.25
updates of batch 32 per env step), so a CPU machine trains at the rate both sides can sustain at that ratio:

    env steps/s = min(learner updates/s at t threads / ratio, collector cores x env steps/s per core)

One nes-py collector core makes ~143 env steps/s while one bf16 learner thread makes ~34 updates/s, which holds the
ratio at only ~134 env steps/s: on a CPU the learner sets the pace, and cores beyond what the collectors need
are worth most as learner threads. `split_cpu` takes the thread count that makes the most env steps/s (the
fewest threads within MIN_GAIN of the best), then as many collectors as that rate needs, never fewer than
`min_collectors` (the Ape-X epsilon spread the recipe learned with: 0.4 and ~0.0007 over two collectors).

The head's own work is left out: ingest costs ~2 us of CPU per transition (BENCHMARKS.md, "One head under many
collectors"), 0.04% of a core at 200 env steps/s; a periodic evaluation takes a core while it plays.

Pure arithmetic over measured inputs (`CpuCosts`); the measured figures are below with their provenance.
Thread counts without a measurement are projected (`projected_updates_per_s`, Amdahl's law fitted to the
measured counts) and the result says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# CPU ms per env step of one collector, by Mario emulator backend: emulator (4 NES frames), preprocessing and its
# batched inference. The pipeline with the learner draining, 2 collectors x 8 envs on the 2-core VM (AMD EPYC with
# AVX512-BF16), both backends in one quiet run, medians of 3 rounds, 2026-12-04 at 04fc0f7 (`python -m bench --skip
# components --skip scale --skip naive --skip sweep`; results/bench/emulator_backends_2026-12-04.json): nes-py 6.97
# CPU s per 1,000 env steps (its emulator alone 6.11; 5.68 on 2026-11-23), retro 2.26 (its emulator alone 1.17). A
# core that only collects makes 1000 / 6.97 = 143 env steps/s on nes-py, 442 on retro.
ENV_STEP_CPU_MS: dict[str, float] = {"nes-py": 6.97, "retro": 2.26}

# Learner updates/s at batch 32 (the eager CPU learner, Nature CNN, `python -m bench.learner`) at 1 torch thread:
# the 2-core VM quiet, 2026-11-23 at 1e8debd (BENCHMARKS.md, "Learner on CPU and GPU"): bf16 33.5, fp32 17.8.
MEASURED_UPDATES_PER_S: dict[str, dict[int, float]] = {"bf16": {1: 33.5}, "fp32": {1: 17.8}}
# More threads: no quiet measurement on any machine. The one recorded is inside a 2-core Mario run, fp32, whose
# collectors shared the second core: 8.84-8.90 against 7.50-7.74 updates/s at 1 thread, x1.16 (2026-11-27,
# BENCHMARKS.md, "Design measurements"), a lower bound on a free core's gain. Every
# thread count above 1 is a PROJECTION from it (Amdahl's law, p = 0.28: at most 1.38x one thread's rate), for
# both precisions; `python -m bench.learner --by-threads 1,2,4,8` on a many-core machine measures them.
# On this 2-core VM beside a training run that kept both cores busy (load average 4.6-5.4), 2026-12-02 at 5b693fb,
# `OMP_NUM_THREADS=1 nice -n 5 python -m bench.learner --by-threads 1,2 --repeats 5 --seconds 8` (interleaved;
# results/bench/learner_threads_cpu_loaded_2026-12-02.json): bf16 7.65 (6.74-10.42) updates/s at 1 thread and 2.47
# (2.16-3.31) at 2, fp32 8.19 (2.77-10.38) and 10.18 (5.54-12.16): where the cores are taken a second thread waits
# for one, and bf16's loses 3x. That is a loaded machine's figure, not a free core's, so it is not used here; the
# split gives the learner only cores the collectors leave free.
TWO_THREAD_GAIN = 1.16
MAX_LEARNER_THREADS = 8  # no batch-32 learner has been measured beyond 8 threads: the split takes no more
MIN_COLLECTORS = 2  # the recipe's epsilon spread (0.4 and ~0.0007) needs two collectors
MIN_GAIN = 0.02  # a thread more is taken only where it adds at least 2% env steps/s


@dataclass(frozen=True)
class CpuCosts:
    """What the split is computed from: the machine's cores and the measured costs of each side."""

    cores: int
    env_step_cpu_ms: float  # CPU ms per env step of one collector
    updates_per_s: tuple[tuple[int, float], ...]  # (torch threads, measured updates/s) for the learner's precision
    precision: str  # the learner's precision these figures are for (named in the reason)
    updates_per_env_step: float  # the per-env-step rule's ratio
    two_thread_gain: float | None = None  # where only 1 thread is measured: the gain the projection assumes at 2
    min_collectors: int = MIN_COLLECTORS
    max_threads: int = MAX_LEARNER_THREADS


@dataclass(frozen=True)
class CpuSplit:
    """The chosen split and what it expects; learner_threads 0 leaves the learner its precision's own rule."""

    collectors: int
    learner_threads: int
    env_steps_per_s: float
    updates_per_s: float
    projected: bool  # the learner's rate at this thread count is a projection, not a measurement
    reason: str  # one line for the start-up log


def measured_costs(cores: int, precision: str, updates_per_env_step: float, backend: str = "nes-py") -> CpuCosts:
    """CpuCosts from this module's measured figures for a learner in `precision` (bf16 or fp32) and collectors on the
    Mario emulator `backend` (nes-py or retro: a resolved backend, not auto)."""
    if precision not in MEASURED_UPDATES_PER_S:
        raise ValueError(f"precision {precision!r}: allowed {', '.join(MEASURED_UPDATES_PER_S)}")
    if backend not in ENV_STEP_CPU_MS:
        raise ValueError(f"backend {backend!r}: allowed {', '.join(ENV_STEP_CPU_MS)}")
    table = tuple(sorted(MEASURED_UPDATES_PER_S[precision].items()))
    return CpuCosts(cores=cores, env_step_cpu_ms=ENV_STEP_CPU_MS[backend], updates_per_s=table, precision=precision,
                    updates_per_env_step=updates_per_env_step, two_thread_gain=TWO_THREAD_GAIN)


def projected_updates_per_s(costs: CpuCosts, threads: int) -> tuple[float, bool]:
    """Updates/s at `threads`: the measurement where there is one (False), else a projection (True) by Amdahl's
    law, speedup(t) = 1 / ((1 - p) + p / t), with p fitted to 1 thread and the most threads measured, or where
    only 1 thread is measured to `costs.two_thread_gain` at 2 (no gain assumed without either; none lost where
    the fit says more threads slow it down)."""
    rates = dict(costs.updates_per_s)
    if threads in rates:
        return rates[threads], False
    if 1 not in rates:
        raise ValueError("the learner's updates/s at 1 thread is needed to project other thread counts")
    top = max(rates)
    if top == 1 and costs.two_thread_gain is None:
        return rates[1], True
    speedup = rates[top] / rates[1] if top > 1 else costs.two_thread_gain
    top = top if top > 1 else 2
    p = min(1.0, max(0.0, (1.0 - 1.0 / speedup) / (1.0 - 1.0 / top)))
    return rates[1] / ((1.0 - p) + p / threads), True


def split_cpu(costs: CpuCosts) -> CpuSplit:
    """Collectors and learner torch threads for a CPU-only machine so that neither side waits at the ratio."""
    if costs.cores < 1 or costs.env_step_cpu_ms <= 0 or costs.updates_per_env_step <= 0:
        raise ValueError(f"cores, env_step_cpu_ms and updates_per_env_step must be positive: {costs}")
    per_core = 1000.0 / costs.env_step_cpu_ms  # env steps/s of one collector core
    ratio = costs.updates_per_env_step
    if costs.cores <= 2:
        # no split to make: the measured 2-core recipe runs a collector on every core and the learner beside them
        # (threads by its precision's rule, learner/precision.py), 130-141 env steps/s at 32-35 updates/s
        # (bf16, docs/experiments/seeds_1-1.md); one core each would hold the same learner-bound rate
        ups, _ = projected_updates_per_s(costs, 1)
        rate = min(ups / ratio, costs.cores * per_core)
        return CpuSplit(costs.cores, 0, rate, rate * ratio, False,
                        f"{costs.cores} core{'s' if costs.cores > 1 else ''}, {costs.precision} learner: a collector on every core and the learner "
                        f"time-sharing them (the measured 2-core recipe; ~{rate:.0f} env steps/s at "
                        f"{ratio:g} updates per env step, the learner's ~{ups:.1f} updates/s set the pace)")
    options = []
    for threads in range(1, min(costs.max_threads, costs.cores - 1) + 1):
        ups, projected = projected_updates_per_s(costs, threads)
        rate = min(ups / ratio, (costs.cores - threads) * per_core)
        options.append((threads, ups, projected, rate))
    best = max(rate for *_, rate in options)
    threads, ups, projected, rate = next(o for o in options if o[3] >= (1.0 - MIN_GAIN) * best)
    collectors = max(costs.min_collectors, math.ceil(rate / per_core - 1e-9))
    learner_bound = ups / ratio <= (costs.cores - threads) * per_core
    spare = costs.cores - threads - rate / per_core
    cap = min(costs.max_threads, costs.cores - 1)
    why_no_more = (f"a thread more adds < {MIN_GAIN:.0%}" if threads < cap else
                   f"no learner is measured beyond {costs.max_threads} threads" if cap == costs.max_threads else
                   "every other core is a learner thread")
    reason = (f"{costs.cores} cores, {costs.precision} learner: {threads} torch thread(s) make ~{ups:.1f} updates/s"
              f"{' (projected: no such learner measured)' if projected else ''}, which hold {ratio:g} updates per env "
              f"step at ~{rate:.0f} env steps/s; {collectors} collectors supply that (~{per_core:.0f} env steps/s a "
              f"core, {rate / per_core:.1f} cores busy); "
              + (f"the learner sets the pace, {spare:.1f} cores spare ({why_no_more})"
                 if learner_bound else "the collectors set the pace"))
    return CpuSplit(collectors, threads, rate, rate * ratio, projected, reason)
