"""The device-resident learner step against the eager learner: updates/s, host CPU, device busy, data wait.

Every mode runs the real `Learner` on the real prioritized `ReplayBuffer` (84x84 uint8 frames in
episodes, stacks of 4, the Nature CNN, 7 actions: Mario's geometry), so the eager mode pays its host
sampler and prefetch thread and the device modes their ring drains:

  eager     learner.step_mode=eager, prefetch on (what the profiles run today)
  device    the whole update as tensor ops, run op by op (learner/device_step.py)
  captured  the same step under torch.compile(fullgraph=True); on CUDA replayed as one CUDA graph
  autotuned captured with learner.step_autotune (inductor's max-autotune: kernel choices timed at
            compile time); only when asked for with --modes
  compiled  the eager step with learner.compile_mode=default: both networks under torch.compile, sampling,
            loss glue and Adam eager (what compile_mode buys a profile); only when asked for with --modes

Per mode, batch and precision: steady updates/s over a timed window (blocks of updates, one device
sync per block), the first update's seconds (compile and capture included), the process CPU
seconds per update (every thread: the prefetch thread too), the data wait (eager: blocked on the
prefetch queue; device: mirroring the replay's new data), and on CUDA the GPU's busy fraction
(kernel time in a profiled block / its wall time; null on a CPU, where there is no separate device).
On CUDA the process CPU per update includes the host spinning while it waits on the GPU (CUDA's
default sync spins), so a GPU-bound learner reads as host-bound there; `learner_host_launch_ms_per_update`
is the host's own work: process CPU per update for a short block enqueued right after a sync, while the
GPU's queue has room and nothing waits (null on a CPU, where launching is computing).
`rate_10min_incl_compile` is the updates/s a 10-minute run gets once the first update's seconds are
paid. Modes are interleaved within each repeat, so ratios compare figures taken side by side. The
compile cache starts empty (unless --keep-compile-cache): the first repeat's compile is a cold one,
as on a machine's first run, the later repeats' come from inductor's on-disk cache, as on later runs.

    python -m bench.learner_step [--quick] [--device cpu|cuda] [--repeats 3] [--batches 32,64]
                                 [--precisions fp32,bf16] [--modes eager,captured,autotuned] [--seconds S]
                                 [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from statistics import median
from typing import Any

import numpy as np
import torch

from bench.learner import NUM_ACTIONS, OBS_SHAPE, STACK, real_replay, spread, sync_device
from bench.report import print_json

RUN_S = 600.0  # the run length the compile-inclusive rate is quoted for
MODES = ("eager", "device", "captured")  # the default set
ALL_MODES = MODES + ("autotuned", "compiled")
CAPTURED = ("captured", "autotuned")  # the whole step compiled
COMPILED = CAPTURED + ("compiled",)  # anything compiled: a cold compile on the first repeat


def _device_busy(learner: Any, device: torch.device, updates: int) -> float | None:
    """Fraction of a block's wall time the GPU spent in kernels (torch.profiler); None off CUDA."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    sync_device(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        learner.run_updates(updates)
        sync_device(device)
        wall = time.perf_counter() - t0
    busy_us = sum(e.self_device_time_total for e in prof.key_averages())
    return min(1.0, busy_us / 1e6 / wall)


LAUNCH_BLOCK = 16  # updates enqueued per launch-cost sample: fewer than the uniforms' refill period


def _host_launch_ms(learner: Any, device: torch.device, samples: int = 5) -> float | None:
    """Median process CPU ms per update to enqueue LAUNCH_BLOCK updates onto an idle GPU; None off CUDA."""
    if device.type != "cuda":
        return None
    per_update = []
    for _ in range(samples):
        sync_device(device)
        c0 = time.process_time()
        learner.run_updates(LAUNCH_BLOCK)
        per_update.append((time.process_time() - c0) / LAUNCH_BLOCK * 1000.0)
    sync_device(device)
    return median(per_update)


def learner_config(mode: str, batch: int, precision: str, device: torch.device, space_to_depth: str = "auto") -> Any:
    """The learner section one mode runs: no warm-up, no rate limit, no broadcasts; the mode's step and compile."""
    from shared.config import LearnerConfig

    return LearnerConfig(device=device.type, batch_size=batch, precision=precision, warmup_transitions=0,
                         samples_per_insert=0.0, prefetch=True, weight_broadcast_every=10**9,
                         torch_threads=torch.get_num_threads(),
                         step_mode="captured" if mode in CAPTURED else "eager" if mode == "compiled" else mode,
                         step_autotune=mode == "autotuned", compile_mode="default" if mode == "compiled" else "off",
                         space_to_depth=space_to_depth)


def measure(mode: str, batch: int, precision: str, device: torch.device, replay: Any, budget_s: float,
            block_s: float = 0.5, space_to_depth: str = "auto") -> dict[str, Any]:
    """One mode at one batch size and precision on `replay`: see the module docstring."""
    from envs.spec import EnvSpec
    from learner.trainer import Learner
    from shared.config import Config

    cfg = Config(learner=learner_config(mode, batch, precision, device, space_to_depth))
    cfg = replace(cfg, replay=replace(cfg.replay, storage_device="auto"))
    if mode in COMPILED:
        torch._dynamo.reset()  # compile as a new process would: from inductor's on-disk cache at best
    learner = Learner(cfg.learner, cfg.replay, EnvSpec(OBS_SHAPE, np.uint8, NUM_ACTIONS, STACK), replay, device,
                      config_json=cfg.to_json())
    try:
        t0 = time.perf_counter()
        learner.run_updates(1)  # compiles and records in the captured mode
        sync_device(device)
        first_s = time.perf_counter() - t0 + (learner.compile_s if mode == "compiled" else 0.0)  # it compiles at build
        learner.run_updates(2)
        sync_device(device)
        learner.meter.window_s = learner.meter.min_period_s = 0.0  # stats() = since the previous call
        learner.stats()
        n, block, cpu0, t0 = 0, 1, time.process_time(), time.perf_counter()
        while True:
            tb = time.perf_counter()
            learner.run_updates(block)
            n += block
            sync_device(device)
            now = time.perf_counter()
            if now - t0 >= budget_s and n >= 3:
                break
            if now - tb < block_s:
                block *= 2
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stats = learner.stats()
        busy = _device_busy(learner, device, max(8, min(n, 64)))
        launch = _host_launch_ms(learner, device)
        rate = n / wall
        return {
            "updates_per_s": rate, "updates": n, "first_update_s": first_s,
            "compile_s": learner.compile_s if mode in COMPILED else 0.0,
            "host_cpu_ms_per_update": cpu / n * 1000.0, "wait_frac": stats["data_wait_frac"],
            "host_launch_ms_per_update": launch, "device_busy_frac": busy, "skipped_updates": stats["skipped_updates"],
            "rate_10min_incl_compile": max(0.0, RUN_S - first_s) * rate / RUN_S,
            "space_to_depth": learner.space_to_depth,
        }
    finally:
        learner.close()


def run_step_bench(quick: bool = True, device: str | torch.device | None = None, repeats: int | None = None,
                   capacity: int | None = None, seconds: float | None = None, batches: tuple[int, ...] | None = None,
                   precisions: tuple[str, ...] | None = None, modes: tuple[str, ...] = MODES,
                   space_to_depth: tuple[str, ...] = ("auto",)) -> dict[str, Any]:
    """The step modes side by side; JSON-able. Keys: learner_updates_per_s (mode_precision_bBATCH -> median
    updates/s, with _s2d-on or _s2d-off appended where learner.space_to_depth is not auto),
    learner_host_cpu_ms_per_update, learner_device_busy_frac, learner_wait_frac (same keys), and the spreads,
    first-update seconds and compile-inclusive rates in `details`."""
    from learner.precision import cpu_has_native_bf16

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    repeats = repeats if repeats is not None else (1 if quick else 3)
    budget = seconds if seconds is not None else (2.0 if quick else 6.0)
    skipped: dict[str, str] = {}
    if batches is None:
        batches = (32, 64, 512) if cuda else ((32,) if quick else (32, 64))
        if not cuda:
            skipped["*_b512"] = "CPU: about 1 update/s at batch 512 (BENCHMARKS.md); measured on CUDA only"
    if precisions is None:
        precisions = ("fp32",)
        if cuda or cpu_has_native_bf16():
            precisions += ("auto" if cuda else "bf16",)
        elif not cuda:
            skipped["*_bf16_*"] = "CPU lacks native bf16 (oneDNN reference kernels, 10-30x slower)"
    plan = []
    for b in batches:
        for p in precisions:
            for mode in modes:
                if quick and not cuda and (mode in COMPILED or p != "fp32"):
                    skipped[f"{mode}_{p}_b{b}"] = ("--quick on CPU: compiling the step takes about a minute per batch and "
                                                   "precision, bf16 runs in full runs")
                    continue
                plan.extend((mode, b, p, s) for s in space_to_depth)
    cap = capacity or (20_000 if quick or not cuda else 200_000)
    replay = real_replay(dev, cap)
    runs: dict[str, list[dict[str, Any]]] = {}
    failed: dict[str, str] = {}
    for _ in range(repeats):
        for mode, b, p, s2d in plan:
            key = f"{mode}_{p}_b{b}" + ("" if s2d == "auto" else f"_s2d-{s2d}")
            if key in failed:
                continue
            try:
                result = measure(mode, b, p, dev, replay, budget, space_to_depth=s2d)
            except Exception as exc:  # one mode failing on a new device must not lose the others' figures
                failed[key] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
                runs.pop(key, None)
                print(f"[learner_step] {key}: failed: {failed[key]}", file=sys.stderr, flush=True)
                continue
            runs.setdefault(key, []).append(result)
            print(f"[learner_step] {key}: {result['updates_per_s']:.1f} updates/s, first update "
                  f"{result['first_update_s']:.1f} s, host {result['host_cpu_ms_per_update']:.2f} ms/update",
                  file=sys.stderr, flush=True)
    key_fig = {k: median([r["updates_per_s"] for r in v]) for k, v in runs.items()}

    def per_key(field: str, digits: int = 4) -> dict[str, Any]:
        return {k: (None if v[0][field] is None else round(median([r[field] for r in v]), digits)) for k, v in runs.items()}

    ratios = {}
    for key, value in key_fig.items():
        mode, rest = key.split("_", 1)
        base = key_fig.get(f"eager_{rest}")
        if mode != "eager" and base:
            ratios[f"{key}_vs_eager"] = round(value / base, 3)
            ratios[f"{key}_vs_eager_10min_incl_compile"] = round(
                median([r["rate_10min_incl_compile"] for r in runs[key]])
                / median([r["rate_10min_incl_compile"] for r in runs[f"eager_{rest}"]]), 3)
        off = key_fig.get(key.removesuffix("_s2d-on") + "_s2d-off") if key.endswith("_s2d-on") else None
        if off:
            ratios[f"{key}_vs_s2d-off"] = round(value / off, 3)
    busy = per_key("device_busy_frac")
    return {
        "device": str(dev) if not cuda else f"cuda ({torch.cuda.get_device_name(dev)})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "quick": quick,
        "repeats": repeats,
        "replay_capacity": cap,
        "learner_updates_per_s": {k: round(v, 3) for k, v in key_fig.items()},
        "learner_host_cpu_ms_per_update": per_key("host_cpu_ms_per_update", 3),
        "learner_host_launch_ms_per_update": per_key("host_launch_ms_per_update", 3) if cuda else None,
        "learner_device_busy_frac": busy if cuda else None,
        "learner_wait_frac": per_key("wait_frac"),
        "learner_space_to_depth": {k: v[0]["space_to_depth"] for k, v in runs.items()},  # what auto resolved to
        "ratios": ratios,
        "details": {
            "updates_per_s": {k: spread([r["updates_per_s"] for r in v], 3) for k, v in runs.items()},
            "first_update_s": {k: spread([r["first_update_s"] for r in v], 2) for k, v in runs.items()},
            "compile_s": {k: spread([r["compile_s"] for r in v], 2) for k, v in runs.items() if k.split("_")[0] in COMPILED},
            "rate_10min_incl_compile": {k: spread([r["rate_10min_incl_compile"] for r in v], 3) for k, v in runs.items()},
            "skipped_updates": {k: [r["skipped_updates"] for r in v] for k, v in runs.items()},
        },
        "errors": {**failed, **({} if cuda else {
            "learner_device_busy_frac": "CPU: the host runs the update itself, there is no separate device to be busy",
            "learner_host_launch_ms_per_update": "CPU: launching an update is running it (see host_cpu_ms_per_update)"})},
        "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learner_step",
                                     description="Device-resident learner step vs the eager learner (JSON on stdout)")
    parser.add_argument("--quick", action="store_true", help="short windows, batch 32 fp32, no compile on a CPU")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3, --quick 1)")
    parser.add_argument("--capacity", type=int, default=None, help="replay slots (default 20,000; CUDA 200,000)")
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per measurement")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default: 32,64 on a CPU, "
                        "32,64,512 on CUDA; --quick: 32)")
    parser.add_argument("--precisions", default=None, help="comma-separated learner.precision values (default: "
                        "fp32 and bf16 where native, fp32 and auto on CUDA)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated step modes, of "
                        f"{', '.join(ALL_MODES)} (default: {','.join(MODES)})")
    parser.add_argument("--space-to-depth", default="auto", help="comma-separated learner.space_to_depth values, "
                        "each measured beside the others (default: auto: on with CUDA, off on a CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: keep)")
    parser.add_argument("--keep-compile-cache", action="store_true",
                        help="use inductor's usual cache (default: a fresh one, so compile_s is a cold compile)")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: need at least 1")
    if args.seconds is not None and not args.seconds > 0:
        parser.error(f"--seconds={args.seconds}: need a positive duration")
    try:
        batches = None if args.batches is None else tuple(int(b) for b in args.batches.split(","))
    except ValueError:
        parser.error(f"--batches={args.batches!r}: need comma-separated integers, e.g. 32,64")
    if batches is not None and min(batches) < 1:
        parser.error(f"--batches={args.batches!r}: sizes must be >= 1")
    precisions = None if args.precisions is None else tuple(args.precisions.split(","))
    from shared.config import PRECISIONS

    if precisions is not None and not set(precisions) <= set(PRECISIONS):
        parser.error(f"--precisions={args.precisions!r}: allowed {', '.join(PRECISIONS)}")
    modes = tuple(args.modes.split(","))
    if not modes or not set(modes) <= set(ALL_MODES) or len(set(modes)) != len(modes):
        parser.error(f"--modes={args.modes!r}: a comma-separated subset of {', '.join(ALL_MODES)}, each once")
    from shared.config import SPACE_TO_DEPTH

    s2d = tuple(args.space_to_depth.split(","))
    if not set(s2d) <= set(SPACE_TO_DEPTH) or len(set(s2d)) != len(s2d):
        parser.error(f"--space-to-depth={args.space_to_depth!r}: a comma-separated subset of "
                     f"{', '.join(SPACE_TO_DEPTH)}, each once")
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        if not args.keep_compile_cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        result = run_step_bench(quick=args.quick, device=args.device, repeats=args.repeats, capacity=args.capacity,
                                seconds=args.seconds, batches=batches, precisions=precisions, modes=modes,
                                space_to_depth=s2d)
    print_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
