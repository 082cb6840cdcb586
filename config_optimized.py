"""Hardware profiles: the one file that tunes Mario Ape-X to a machine.

Pick one with `make run ARGS="--profile NAME"` and override single fields with
`--set section.field=value` (e.g. `--set replay.capacity=200000`). `auto` (the default)
looks at cores, memory and CUDA and fills in the rest. Field meanings and trade-offs are
commented in `shared/config.py`; here each profile says why its values suit its machine.

Rules of thumb that the profiles follow:
- The emulator is the ceiling on the collector side (~1 ms per NES frame per core), so one
  collector process per spare core; K envs per collector only batch inference, they do not
  add emulator throughput.
- Without a GPU the learner competes with collectors for cores; with one, it should never
  wait on the CPU side (replay frames on the GPU, big batches, AMP, torch.compile).
- Replay memory is one 84x84 uint8 frame (7 KiB) per transition: 1M transitions ~ 7 GiB.
"""

from __future__ import annotations

import os
from dataclasses import replace

from shared.config import (
    CollectorConfig,
    Config,
    ConfigError,
    LearnerConfig,
    ReplayConfig,
    TransportConfig,
    available_memory_bytes,
    estimate_replay_bytes,
)


def cpu_profile() -> Config:
    """This 2-core, 24 GiB, no-GPU machine: collectors on both cores, a light bf16 learner."""
    return Config(
        collectors=CollectorConfig(count=2, envs_per_collector=8, chunk_steps=128),
        replay=ReplayConfig(capacity=100_000, storage_device="cpu"),
        # Credits: each collector has at most 2 unacknowledged chunks, so when learner.max_insert_lead makes
        # collectors wait, the data they then send is at most 2 chunks old (without credits the socket
        # queues held ~10k transitions: a weight lag of 1,300-2,500 updates, BENCHMARKS.md "insert gate")
        transport=TransportConfig(max_chunks_in_flight=2),
        learner=LearnerConfig(
            device="cpu",
            batch_size=32,  # CPU updates cost ~24 ms at 32 (bf16); bigger batches starve collectors
            precision="auto",  # bf16 where the CPU has native bf16 kernels (AVX512-BF16/AMX), else fp32
            compile_mode="off",  # compile time (tens of s) is not repaid on a 2-core box
            warmup_transitions=5_000,
            samples_per_insert=4.0,
            weight_broadcast_every=100,
        ),
    )


def gpu_workstation_profile() -> Config:
    """8-16 cores and one consumer GPU (e.g. 24 GB): most cores collect, frames live on the GPU."""
    return Config(
        collectors=CollectorConfig(count=10, envs_per_collector=16, chunk_steps=128),
        replay=ReplayConfig(capacity=1_000_000, storage_device="auto", gpu_memory_fraction=0.4),
        learner=LearnerConfig(
            device="cuda",
            batch_size=256,
            grad_accum_steps=1,
            precision="auto",  # fp16 + GradScaler (bf16 where supported and asked for)
            compile_mode="default",
            lr=2.5e-4,
            warmup_transitions=50_000,
            samples_per_insert=8.0,
            weight_broadcast_every=200,
        ),
    )


def gpu_server_profile() -> Config:
    """32+ cores and an H100-class GPU: many collectors, effective batch 2048 (512 x 4)."""
    return Config(
        collectors=CollectorConfig(count=30, envs_per_collector=32, chunk_steps=128),
        replay=ReplayConfig(capacity=2_000_000, storage_device="auto", gpu_memory_fraction=0.5),
        learner=LearnerConfig(
            device="cuda",
            batch_size=512,
            grad_accum_steps=4,
            precision="bf16",  # H100 supports bf16: no GradScaler needed
            compile_mode="max-autotune",
            lr=5e-4,
            warmup_transitions=100_000,
            samples_per_insert=8.0,
            weight_broadcast_every=400,
        ),
    )


def auto_profile() -> Config:
    """Detect cores, memory and CUDA; start from the nearest profile and fit it to the machine."""
    cores = os.cpu_count() or 1
    has_cuda = _cuda_available()
    if not has_cuda:
        base = cpu_profile()
        collectors = max(1, cores if cores <= 2 else cores - 1)  # on >2 cores leave one for the learner
    elif cores >= 32:
        base = gpu_server_profile()
        collectors = cores - 2
    else:
        base = gpu_workstation_profile()
        collectors = max(1, cores - 2)
    cfg = replace(base, collectors=replace(base.collectors, count=collectors))
    # Fit replay capacity into 40% of available memory (the check_valid limit is 80%).
    budget = 0.4 * available_memory_bytes()
    capacity = cfg.replay.capacity
    while capacity > 10_000 and estimate_replay_bytes(replace(cfg, replay=replace(cfg.replay, capacity=capacity))) > budget:
        capacity //= 2
    return replace(cfg, replay=replace(cfg.replay, capacity=capacity))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


PROFILES = {
    "cpu": cpu_profile,
    "gpu-workstation": gpu_workstation_profile,
    "gpu-server": gpu_server_profile,
    "auto": auto_profile,
}


def load_profile(name: str = "auto", overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build a profile, apply `--set` overrides; validation is the caller's next step."""
    if name not in PROFILES:
        raise ConfigError(f"--profile {name!r} is unknown: allowed one of {', '.join(PROFILES)}")
    return PROFILES[name]().with_overrides(list(overrides))
