"""Learner throughput benchmark: updates/s and samples/s of the real `Learner` per mode.

Runs the Nature CNN on 4x84x84 uint8 stacks from `RandomReplay`, a replay-like source that
gathers stacks out of a frame pool (numpy fancy indexing on CPU, torch indexing when the
frames live on the GPU) so the input pipeline does comparable work to the real replay.

Modes (key ``learner_updates_per_s`` maps mode -> updates/s):
  fp32_b{32,128,512}           eager fp32
  fp32_cl_b{128,512}           fp32 with channels_last (is NHWC worth it?)
  bf16_b* (CPU) / amp_b* (CUDA) mixed precision per learner.precision (CPU bf16 only
                               where oneDNN has native bf16; skipped-with-reason otherwise at
                               large batches because it runs 10-30x slower there)
  compiled_b32 / _b512         torch.compile(mode=default) at the device's default precision
  accum_b512x4                 512 x 4 gradient accumulation (effective batch 2048)
  *_gpustore (CUDA)            frames already on the GPU: no host->device copy
Also: data_wait_frac per mode, compile_s, forward_ms_b2048 (no-grad forward, 2048 stacks).

    python -m bench.learner [--quick] [--device cpu|cuda] [--out bench.json]
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from statistics import median
from typing import Any

# as the launcher does: with more than one torch thread, spinning OpenMP workers steal the cores a loaded
# machine's other processes (and the other thread) need (before torch is imported, where this module is first)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.report import print_json  # noqa: E402
from envs.spec import EnvSpec  # noqa: E402
from learner.precision import cpu_has_native_bf16, resolve_precision  # noqa: E402
from learner.trainer import Learner  # noqa: E402
from shared.batch import SampleBatch  # noqa: E402
from shared.config import Config, LearnerConfig  # noqa: E402
from shared.network import QNetwork  # noqa: E402

THREAD_COUNTS = (1, 2, 4, 8)  # the by-threads table: beyond 8 threads a batch of 32 has little left to split
BLOCK_S = 0.2  # a timed block of updates lasts at least this long (one device sync per block)
OBS_SHAPE = (84, 84)
STACK = 4
NUM_ACTIONS = 7
SPEC = EnvSpec(OBS_SHAPE, np.uint8, NUM_ACTIONS, STACK)  # Mario's: 4 x 84x84 uint8 frames, the simple action set


class RandomReplay:
    """Replay-like uniform source of random uint8 stacks (sample / update_priorities / counters)."""

    def __init__(self, device: torch.device | str = "cpu", pool: int = 4096, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.device = torch.device(device)
        frames = rng.integers(0, 256, size=(pool, *OBS_SHAPE), dtype=np.uint8)
        self.frames_np = frames
        self.frames_t = torch.from_numpy(frames).to(self.device) if self.device.type != "cpu" else None
        self.pool = pool
        self.rng = np.random.default_rng(seed + 1)
        self.transitions_added = 10**12
        self._offsets = np.arange(STACK, dtype=np.int64)

    def __len__(self) -> int:
        return self.pool - STACK - 4

    def sample(self, batch_size: int, beta: float = 0.4) -> SampleBatch:
        start = self.rng.integers(0, self.pool - STACK - 4, size=batch_size)
        idx = start[:, None] + self._offsets[None, :]
        actions = torch.from_numpy(self.rng.integers(0, NUM_ACTIONS, size=batch_size))
        returns = torch.from_numpy(self.rng.normal(size=batch_size).astype(np.float32))
        discounts = torch.full((batch_size,), 0.99**3, dtype=torch.float32)
        weights = torch.from_numpy(self.rng.uniform(0.1, 1.0, size=batch_size).astype(np.float32))
        if self.frames_t is not None:
            gi = torch.from_numpy(idx).to(self.device)
            obs, nxt = self.frames_t[gi], self.frames_t[gi + 3]
            dev = self.device
            actions, returns, discounts, weights = (t.to(dev) for t in (actions, returns, discounts, weights))
        else:
            obs, nxt = torch.from_numpy(self.frames_np[idx]), torch.from_numpy(self.frames_np[idx + 3])
        return SampleBatch(obs, actions, returns, discounts, nxt, weights, start.astype(np.int64))

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        if len(indices) != len(td_abs):
            raise ValueError("indices and td_abs differ in length")


def real_replay(device: torch.device, capacity: int = 100_000, seed: int = 0):
    """The project's prioritized ReplayBuffer filled with random 84x84 chunks: PER sampling,
    stack rebuilding and (on CUDA) frames stored on the GPU, as in a real run."""
    from replay.buffer import ReplayBuffer
    from shared.chunk import FLAG_FIRST, TransitionChunk

    buf = ReplayBuffer(capacity, OBS_SHAPE, np.uint8, STACK, 3, 0.99, device=device, seed=seed)
    rng = np.random.default_rng(seed)
    frames_per_chunk = 134
    flags = np.zeros(frames_per_chunk, np.uint8)
    flags[0] = FLAG_FIRST
    actions = np.r_[rng.integers(0, NUM_ACTIONS, frames_per_chunk - 1), -1].astype(np.int32)
    frames = rng.integers(0, 256, size=(frames_per_chunk, *OBS_SHAPE), dtype=np.uint8)
    for k in range(capacity // frames_per_chunk - 1):
        buf.add_chunk(TransitionChunk(k % 64, 0, frames, actions, rng.normal(size=frames_per_chunk).astype(np.float32),
                                      flags, rng.uniform(0.1, 2.0, frames_per_chunk).astype(np.float32)))
    return buf


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def collector_step_ms(net: QNetwork, envs: int, threads: int, budget_s: float, seed: int = 0
                      ) -> dict[str, float]:
    """Milliseconds per collector step of `net` (put in eval mode by the caller) on `envs` random uint8 stacks, as
    `Collector.step` runs it: new NoisyNet noise first where the network has it, then the forward in inference
    mode on `threads` torch threads. Wall and process-CPU milliseconds per step, and the steps timed."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        noisy = bool(net.noisy_layers())
        stacks = np.random.default_rng(seed).integers(0, 256, size=(envs, STACK, *OBS_SHAPE), dtype=np.uint8)

        def step() -> np.ndarray:
            if noisy:
                net.reset_noise()
            with torch.inference_mode():
                return net(torch.from_numpy(stacks)).float().numpy()

        for _ in range(3):
            step()
        n, cpu0, t0 = 0, time.process_time(), time.perf_counter()
        while n < 5 or time.perf_counter() - t0 < budget_s:
            step()
            n += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        torch.set_num_threads(saved)
    return {"wall_ms": 1000.0 * wall / n, "cpu_ms": 1000.0 * cpu / n, "calls": n}


def spread(values: list[float], digits: int = 2) -> dict[str, Any]:
    """Median, min, max and the values themselves, rounded: how the learner benches report repeated figures."""
    return {"median": round(median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "values": [round(v, digits) for v in values]}


def _measure(cfg: Config, device: torch.device, replay: RandomReplay, budget_s: float, min_updates: int,
             warmup: int, channels_last: bool | None = None) -> dict[str, Any]:
    learner = Learner(cfg.learner, cfg.replay, SPEC, replay, device, meter_window_s=cfg.logging.interval_s,
                      channels_last=channels_last)
    try:
        learner.run_updates(warmup)
        sync_device(device)
        learner.meter.window_s = learner.meter.min_period_s = 0.0  # stats() = since the previous call
        learner.stats()  # mark the start: measure steady state only
        first = next(learner.online.parameters()).detach().clone()
        # Throughput, not latency: the device is synchronized once per block of updates (as a real
        # training loop never syncs per update), and the block doubles until it takes >= BLOCK_S.
        # On CPU sync_device is a no-op, so there only the stopping check's granularity changes.
        n, block, t0, cpu0 = 0, max(1, min_updates), time.perf_counter(), time.process_time()
        while True:
            tb = time.perf_counter()
            learner.run_updates(block)
            n += block
            sync_device(device)
            now = time.perf_counter()
            if (n >= min_updates and now - t0 >= budget_s) or now - t0 > 4 * budget_s:
                break
            if now - tb < BLOCK_S:
                block *= 2
        dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        st = learner.stats()
        moved = bool((next(learner.online.parameters()).detach() != first).any())
        return {"updates_per_s": n / dt, "samples_per_s": n * learner.batch_per_update / dt, "updates": n,
                "learner_updates": learner.updates, "weights_moved": moved,  # the updates were real ones
                "cpu_ms_per_update": 1000.0 * cpu / n,  # process CPU, every thread (the prefetch thread too)
                "data_wait_frac": st["data_wait_frac"], "compile_s": learner.compile_s,
                "compiled": learner.compiled, "precision": learner.precision.name}
    finally:
        learner.close()


def _forward_ms(device: torch.device, precision: str, batch: int = 2048, reps: int = 3) -> float:
    from shared.network import build_q_network

    net = build_q_network(OBS_SHAPE, STACK, NUM_ACTIONS).to(device)
    policy = resolve_precision(precision, device)
    obs = torch.randint(0, 256, (batch, STACK, *OBS_SHAPE), dtype=torch.uint8, device=device)
    with torch.no_grad(), policy.autocast():
        net(obs)
        sync_device(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            net(obs)
        sync_device(device)
    return (time.perf_counter() - t0) / reps * 1000.0


def measurable_threads(cores: int | None = None) -> tuple[int, ...]:
    """The torch thread counts the by-threads table measures on this machine: 1, 2, 4, 8 up to the cores."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return tuple(t for t in THREAD_COUNTS if t <= cores)


def run_threads_bench(threads: tuple[int, ...] | None = None, precisions: tuple[str, ...] | None = None,
                      repeats: int = 1, seconds: float = 1.0, batch: int = 32) -> dict[str, Any]:
    """Updates/s of the eager CPU learner at batch `batch` per torch thread count and precision: the figures the
    `auto` profile splits a CPU-only machine's cores by (shared/cpu_split.py). Rounds interleave every
    (precision, threads) pair, so a machine's drift spreads over all of them; medians and min-max per pair.
    bf16 is measured only where the CPU has native bf16 kernels (elsewhere `precision=auto` runs fp32)."""
    threads = threads or measurable_threads()
    precisions = precisions or (("bf16", "fp32") if cpu_has_native_bf16() else ("fp32",))
    saved = torch.get_num_threads()
    load_start = list(os.getloadavg())  # other work on the machine: more threads lose most where it is loaded
    replay = RandomReplay("cpu")
    values: dict[str, list[float]] = {}
    cpu_ms: dict[str, list[float]] = {}
    try:
        for _ in range(max(1, repeats)):
            for precision in precisions:
                for t in threads:
                    lcfg = LearnerConfig(device="cpu", warmup_transitions=0, samples_per_insert=0.0, prefetch=True,
                                         weight_broadcast_every=10**9, target_update_every=2000, batch_size=batch,
                                         precision=precision, torch_threads=t)
                    res = _measure(Config(learner=lcfg), torch.device("cpu"), replay, seconds, min_updates=3, warmup=1)
                    key = f"{precision}_t{t}"
                    values.setdefault(key, []).append(res["updates_per_s"])
                    cpu_ms.setdefault(key, []).append(res["cpu_ms_per_update"])
    finally:
        torch.set_num_threads(saved)
    return {"learner_updates_per_s_by_threads": {k: round(median(v), 2) for k, v in values.items()},
            "split_from_measured": split_from_measured(values, threads, precisions),
            "learner_threads_spread": {k: spread(v) for k, v in values.items()},
            "learner_threads_cpu_ms_per_update": {k: spread(v, 1) for k, v in cpu_ms.items()},
            "threads_settings": {"threads": list(threads), "precisions": list(precisions), "repeats": repeats,
                                 "seconds": seconds, "batch_size": batch, "cores": os.cpu_count(),
                                 "load_average_start": load_start, "load_average_end": list(os.getloadavg())}}


def split_from_measured(values: dict[str, list[float]], threads: tuple[int, ...], precisions: tuple[str, ...],
                        cores: int | None = None) -> dict[str, str]:
    """What `auto`'s CPU split (shared/cpu_split.py) would choose on this machine from these medians instead of
    its recorded figures, per precision: the reason line, measured and projected thread counts named."""
    from config_optimized import RULE_BATCH, RULE_SAMPLES_PER_INSERT
    from shared.cpu_split import ENV_STEP_CPU_MS, CpuCosts, split_cpu

    out = {}
    for precision in precisions:
        table = tuple((t, median(values[f"{precision}_t{t}"])) for t in sorted(threads))
        if 1 not in dict(table):
            continue
        costs = CpuCosts(cores=cores or os.cpu_count() or 1, env_step_cpu_ms=ENV_STEP_CPU_MS["nes-py"], updates_per_s=table,
                         precision=precision, updates_per_env_step=RULE_SAMPLES_PER_INSERT / RULE_BATCH)
        out[precision] = split_cpu(costs).reason
    return out


def run_learner_bench(quick: bool = True, device: str | torch.device | None = None) -> dict[str, Any]:
    """Benchmark the learner per mode on `device` (default: cuda if available); JSON-able dict."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = dev.type == "cuda"
    budget = 1.0 if quick else 8.0
    base = LearnerConfig(device=dev.type, warmup_transitions=0, samples_per_insert=0.0, prefetch=True,
                         weight_broadcast_every=10**9, target_update_every=2000, precision="fp32",
                         torch_threads=torch.get_num_threads())
    amp_name = "amp" if cuda else "bf16"
    amp_precision = "auto" if cuda else "bf16"
    native_bf16 = cuda or cpu_has_native_bf16()
    default_precision = resolve_precision("auto", dev).name
    plan: list[tuple[str, LearnerConfig, bool | None, bool | str]] = []  # (mode, cfg, channels_last, storage)
    for b in (32, 128, 512):
        plan.append((f"fp32_b{b}", replace(base, batch_size=b), None, False))
    for b in (128, 512) if not quick else (128,):
        plan.append((f"fp32_cl_b{b}", replace(base, batch_size=b), True, False))
    skipped: dict[str, str] = {}
    for b in (32, 128, 512):
        if not native_bf16 and b > 32:
            skipped[f"{amp_name}_b{b}"] = "CPU lacks native bf16 (oneDNN reference kernels, 10-30x slower)"
            continue
        plan.append((f"{amp_name}_b{b}", replace(base, batch_size=b, precision=amp_precision), None, False))
    if quick and not cuda:  # --quick on a CPU: compiling takes tens of seconds; both modes run in full runs
        skipped["compiled_b32"] = skipped["accum_b512x4"] = "--quick on CPU (measured in full runs)"
    else:
        for b in (32,) if quick or not cuda else (32, 512):
            plan.append((f"compiled_b{b}", replace(base, batch_size=b, precision="auto", compile_mode="default"),
                         None, False))
        plan.append(("accum_b512x4", replace(base, batch_size=512, grad_accum_steps=4, precision="auto"), None, False))
    if cuda:
        for b in (128, 512):
            plan.append((f"{amp_name}_b{b}_gpustore", replace(base, batch_size=b, precision="auto"), None, True))
        # the real prioritized replay with frames on the GPU: what a training run actually does
        plan.append(("fp32_b512_per_gpu", replace(base, batch_size=512), None, "per"))
        plan.append(("amp_b512_per_gpu", replace(base, batch_size=512, precision="auto"), None, "per"))
        plan.append(("amp_compiled_b512_per_gpu",
                     replace(base, batch_size=512, precision="auto", compile_mode="default"), None, "per"))

    cpu_replay = RandomReplay("cpu")
    gpu_replay = RandomReplay(dev) if cuda else None
    per_replay = real_replay(dev) if cuda else None
    results: dict[str, Any] = {}
    for mode, lcfg, cl, gpustore in plan:
        big = lcfg.batch_size * lcfg.grad_accum_steps >= 512
        cfg = Config(learner=lcfg)
        source = per_replay if gpustore == "per" else gpu_replay if gpustore else cpu_replay
        results[mode] = _measure(cfg, dev, source, budget,
                                 min_updates=1 if (big and not cuda) else 3, warmup=1 if not cuda else 3,
                                 channels_last=cl)
    forward = {"fp32": _forward_ms(dev, "fp32")}
    if native_bf16:
        forward[amp_name] = _forward_ms(dev, amp_precision)
    compiled = {m: r for m, r in results.items() if m.startswith("compiled")}
    # the CPU learner per thread count (what `auto` splits a CPU-only machine's cores by), restored after
    by_threads = run_threads_bench(repeats=1 if quick else 2, seconds=budget) if not cuda else {}
    return {
        "device": str(dev) if not cuda else f"cuda ({torch.cuda.get_device_name(dev)})",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "quick": quick,
        "cpu_native_bf16": cpu_has_native_bf16(),
        "default_precision": default_precision,
        "learner_updates_per_s": {m: round(r["updates_per_s"], 3) for m, r in results.items()},
        "learner_samples_per_s": {m: round(r["samples_per_s"], 1) for m, r in results.items()},
        "data_wait_frac": {m: round(r["data_wait_frac"], 4) for m, r in results.items()},
        "measured_updates": {m: r["updates"] for m, r in results.items()},
        "compile_s": {m: round(r["compile_s"], 2) for m, r in compiled.items()},
        "compiled_ok": {m: r["compiled"] for m, r in compiled.items()},
        "forward_ms_b2048": {k: round(v, 2) for k, v in forward.items()},
        "skipped": skipped,
        **by_threads,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learner", description="Learner throughput benchmark (JSON on stdout)")
    parser.add_argument("--quick", action="store_true", help="short time budget per mode")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: keep)")
    parser.add_argument("--by-threads", default=None, metavar="T,T",
                        help="only the CPU learner's updates/s per torch thread count (e.g. 1,2,4,8), interleaved rounds")
    parser.add_argument("--precisions", default=None, help="with --by-threads: e.g. bf16,fp32 (default: those this CPU runs)")
    parser.add_argument("--repeats", type=int, default=3, help="with --by-threads: interleaved rounds")
    parser.add_argument("--seconds", type=float, default=8.0, help="with --by-threads: timed seconds per measurement")
    parser.add_argument("--out", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if args.by_threads is not None:
        try:
            threads = tuple(int(t) for t in args.by_threads.split(","))
        except ValueError:
            threads = ()
        if not threads or min(threads) < 1:
            parser.error(f"--by-threads {args.by_threads!r}: allowed comma-separated positive integers, e.g. 1,2")
        if args.repeats < 1 or not args.seconds > 0:
            parser.error("--repeats must be >= 1 and --seconds > 0")
        precisions = tuple(args.precisions.split(",")) if args.precisions else None
        if precisions and not set(precisions) <= {"fp32", "bf16"}:
            parser.error(f"--precisions {args.precisions!r}: allowed fp32, bf16")
        print_json(run_threads_bench(threads, precisions, args.repeats, args.seconds), args.out)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_learner_bench(quick=args.quick, device=args.device)
    print_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
