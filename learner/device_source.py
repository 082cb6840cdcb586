"""The learner's input side when the whole update runs on the device (learner.step_mode device/captured).

Takes the place of `learner.prefetch.SyncSource`/`PrefetchSource`: the learner's thread is the
replay's reader thread. Per update it drains the writer's published records into the device ring
(replay/device_ring.py), refills the uniforms every `uniform_rows` updates, and launches the step
(learner/device_runner.py); the step samples, trains and writes the priorities back itself, so there
is no batch to hand over and no priority update to return.

`pause()` brackets checkpoint saves and restores, as the prefetch source's does: on entry the device
priorities are written into the replay's host tree (what `ReplayBuffer.save` writes) and the
replay's generator is rewound over the uniforms drawn ahead but not used, on exit the whole reader
state is copied back (a restore may have replaced it) and the next update draws its uniforms from
the generator as it then is. A change of the learner's update counter or
of Adam's state tensors (a loaded state dict) re-binds the step to them before the next update.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

from learner.device_runner import CaptureGuard, DeviceRunner, bind_state
from learner.precision import PrecisionPolicy
from learner.step import needs_rebind, step_config
from replay.buffer import ReplayBuffer
from replay.device_ring import DeviceRing

UNIFORM_ROWS = 64  # updates per host-to-device copy of sampling uniforms


class DeviceSource:
    """Owns the device ring and the step runner; called from the learner's thread only."""

    def __init__(self, *, replay: Any, device: torch.device, lc: Any, replay_config: Any, stack: int,
                 online: torch.nn.Module, target: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
                 policy: PrecisionPolicy, channels_last: bool, meter_sums: torch.Tensor, skipped: torch.Tensor,
                 updates: int, mode: str, capture_guard: CaptureGuard = contextlib.nullcontext) -> None:
        if not isinstance(replay, ReplayBuffer):
            raise ValueError(f"learner.step_mode={mode}: needs the project's ReplayBuffer, got {type(replay).__name__}")
        batch = lc.batch_size * lc.grad_accum_steps
        self.ring = DeviceRing(replay, device, batch=batch, uniform_rows=UNIFORM_ROWS)
        self._parts = (online, target, optimizer, scaler, policy, meter_sums, skipped)
        self.state = self._bind(updates)
        cfg = step_config(lc, replay_config, policy, scaler, optimizer.param_groups[0], stack=stack,
                          prioritized=self.ring.prioritized, channels_last=channels_last, uniform_rows=UNIFORM_ROWS)
        self.runner = DeviceRunner(cfg, self.state, online, target, mode, autotune=bool(lc.step_autotune),
                                   capture_guard=capture_guard)
        self.batch = batch
        self._expected_updates = int(updates)
        self.wait_s = 0.0  # host time spent mirroring the replay's new data onto the device
        self.replay_size = self.ring.reader.count

    def _bind(self, updates: int):
        online, target, optimizer, scaler, policy, meter_sums, skipped = self._parts
        return bind_state(online, target, optimizer, scaler, policy, self.ring, meter_sums=meter_sums,
                          skipped=skipped, updates=updates)

    def prepare(self) -> float:
        """Compile / record the step now (else at the first update); returns the seconds it took so far."""
        self.runner.prepare()
        return self.runner.compile_s

    def _rebind_if_needed(self, updates: int) -> None:
        _, _, optimizer, scaler, policy, _, _ = self._parts
        if needs_rebind(self.state, optimizer, scaler, policy, updates, self._expected_updates):
            self.state = self._bind(updates)
            self.runner.rebind(self.state)
            self.ring.discard_uniforms()

    def update(self, updates: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run update number `updates` (the learner's count before it); returns the step's (loss, |TD|,
        Q sum, grad norm, applied) as device tensors that the next update overwrites."""
        t0 = time.perf_counter()
        self.ring.drain()
        self.replay_size = self.ring.reader.count
        self._rebind_if_needed(updates)
        self.ring.refill_uniforms(updates)
        self.wait_s += time.perf_counter() - t0
        self.runner()
        self._expected_updates = updates + 1
        last = self.state.last
        return last[0], self.state.last_td, last[1], last[2], last[3] > 0

    @property
    def stale_rows(self) -> int:
        """Drawn rows a concurrent write made stale (a host sync)."""
        return int(self.state.stale_rows)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        self.ring.push()
        self.ring.rewind_uniforms(self._expected_updates)
        try:
            yield
        finally:
            self.ring.pull()
            self.ring.discard_uniforms()

    def flush(self) -> None:
        """Priorities are written by the step itself: nothing is pending."""

    def close(self) -> None:
        """Nothing runs in the background."""
