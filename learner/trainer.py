"""The Learner: owns the networks, optimizer, input pipeline, ratio control and checkpoints.

One optimizer update (`train_step`) = one effective batch of ``batch_size x grad_accum_steps``
transitions, drawn in ONE `replay.sample()` call and split into ``grad_accum_steps``
micro-batches. Why one call: the replay normalizes importance weights by their max over the
batch it returns, so this normalizes over the whole effective batch and the accumulated
update equals the one-big-batch update exactly (each micro-loss divides by B_eff).

Weight versions: ``version`` is the number of optimizer updates when the weights were
published. The first `maybe_train`/`train_step` call publishes the starting weights (version 0
on a fresh run, the restored update count after `load_checkpoint`); then every
``weight_broadcast_every`` updates. Versions are therefore monotonic and ``lag = learner
updates - collector's version`` is measured in updates. The callback receives the live
state dict and must copy what it keeps (WeightPublisher.publish does one CPU copy).

Thread use: `maybe_train`, `train_step`, `stats`, checkpointing and `close` are called from
one thread (the head's training loop); the prefetch thread is the replay's reader thread.

The update itself is learner/step.py's, in every `learner.step_mode`: fed host-sampled batches by
learner/update.py (eager) or drawn on the device by learner/device_step.py (device, captured).

Non-finite updates. An update whose loss or gradient norm is NaN/inf is skipped on the device
(learner/step.py), counted (`stats()["skipped_updates"]`) and warned about once: on the CPU at once
(reading the outcome is free there), on CUDA when the meter next syncs. Priorities are not written back
for a batch known on the host to be skipped; on CUDA they are, and the replay drops non-finite |TD| values. Weights holding NaN/inf are
never handed to `on_weights` (a refused broadcast is counted) nor written to a checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from envs.spec import EnvSpec
from learner import checkpoint as ckpt
from learner.checkpoint_checks import check_learner_state, check_state_dict
from learner.device_runner import CaptureGuard
from learner.device_source import DeviceSource
from learner.dqn import make_optimizer
from learner.metering import UpdateMeter
from learner.precision import learner_threads, resolve_precision
from learner.prefetch import PrefetchSource, SyncSource
from learner.resets import PeriodicReset
from learner.update import EagerStep, compile_networks
from replay.rate_limiter import RateLimiter
from shared.batch import SampleBatch
from shared.config import LearnerConfig, ReplayConfig
from shared.config_checks import check_augment
from shared.network import build_q_network_for, use_space_to_depth

WeightsCallback = Callable[[int, Mapping[str, torch.Tensor]], None]

log = logging.getLogger("mario_apex.learner")


class Replay(Protocol):
    """What the learner needs of a replay (replay.buffer.ReplayBuffer; test and bench fakes).

    `sample`, `update_priorities` and `len` belong to the replay's reader thread (the prefetch
    thread when there is one); `transitions_added` may be read from any thread; `save`/`restore`
    only while the reader is paused (checkpoints)."""

    @property
    def transitions_added(self) -> int: ...
    def __len__(self) -> int: ...
    def sample(self, batch_size: int, beta: float = 0.4) -> SampleBatch: ...
    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None: ...


class Learner:
    def __init__(
        self,
        learner_config: LearnerConfig,
        replay_config: ReplayConfig,
        spec: EnvSpec,
        replay: Replay,
        device: torch.device | str,
        on_weights: WeightsCallback | None = None,
        *,
        config_json: str = "{}",
        meter_window_s: float = 10.0,
        rate_limiter: RateLimiter | None = None,
        channels_last: bool | None = None,
        prefetch_depth: int = 2,
    ) -> None:
        """`learner_config`: the network, optimizer, precision and update schedule; `replay_config`: the
        importance-sampling exponent's annealing (beta_start, beta_steps); `spec`: the env the network is
        built for; `config_json`: the run's config as checkpoints record it (config.json, `Config.to_json()`);
        `meter_window_s`: the window of the rates and means `stats()` reports (logging.interval_s)."""
        lc = learner_config
        check_augment(lc, spec)  # random shifts need frames: refused (ConfigError) before anything is built
        self.lc = lc
        self.replay_config = replay_config
        self.spec = spec
        self.config_json = config_json
        self.replay = replay
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())  # so device equality checks hold
        self.on_weights = on_weights
        # meta.json's record, checked on load
        self.geometry = ckpt.geometry_of(spec, lc.hidden, lc.dueling, lc.encoder, lc.encoder_width, lc.quantiles,
                                         lc.noisy_sigma > 0)
        image = spec.image
        # channels_last: NHWC convs feed CUDA tensor cores; on CPU (1 thread, AVX2, fp32) it
        # measured no consistent gain (BENCHMARKS.md, "Design measurements"), so it stays off there
        # (the learner bench reports fp32_cl_b* to recheck).
        self.channels_last = bool(image and (self.device.type == "cuda" if channels_last is None else channels_last))
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        self.noisy = lc.noisy_sigma > 0
        self.online = self.build_network().to(self.device, memory_format=fmt)
        self.space_to_depth = use_space_to_depth(self.online, lc.space_to_depth, self.device.type)  # target: a copy
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)
        self.params = [p for p in self.online.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params, lc.lr, lc.adam_eps, self.device)
        self.precision = resolve_precision(lc.precision, self.device)
        if self.device.type == "cpu":
            torch.set_num_threads(learner_threads(lc.torch_threads, self.precision))
            log.info("learner: %s on the CPU, %d torch threads", self.precision.name, torch.get_num_threads())
        self.scaler = self.precision.make_scaler()
        self.micro = int(lc.batch_size)
        self.accum = int(lc.grad_accum_steps)
        self.batch_per_update = self.micro * self.accum
        # the replay's rate limiter, shared with the consolidation thread's insert side (one rule for both)
        self.limiter = rate_limiter or RateLimiter.for_learner(lc, self.batch_per_update,
                                                               lambda: int(self.replay.transitions_added))
        self.prefetch_depth = int(prefetch_depth)
        # counters (checkpointed)
        self.updates = 0
        self.samples = 0
        self.broadcasts = 0
        self.weight_version = -1  # last version handed to on_weights; -1 = none yet
        # non-finite updates (see the module docstring): host-known skips, plus a device-side count read
        # when stats() refreshes (no per-update sync), and broadcasts refused for non-finite weights
        # skips are counted on the device by the update; on the CPU reading that count is free, so the host
        # looks at every update's outcome there
        self._skips_on_host = self.device.type == "cpu"
        self._skipped_dev = torch.zeros((), dtype=torch.int64, device=self.device)
        self._skipped_dev_seen = 0
        self._skip_warned = False
        self.broadcasts_refused = 0
        self.meter = UpdateMeter(self.device, window_s=float(meter_window_s))
        # what the update calls for each network: the network itself, or its torch.compile wrapper
        self.fwd_online: Any = self.online
        self.fwd_target: Any = self.target
        self.compile_s = 0.0
        self.compiled = False
        self.compile_error: str | None = None
        if lc.compile_mode != "off":
            result = compile_networks(self.online, self.target, lc.compile_mode, self.device,
                                      warm_up=lambda fo, ft: self._new_eager_step().warm_up(fo, ft, self.geometry,
                                                                                             self.device))
            self.fwd_online, self.fwd_target, self.compiled = result.fwd_online, result.fwd_target, result.ok
            self.compile_error, self.compile_s = result.error, result.seconds
        self._eager: EagerStep | None = None  # bound at the first eager update
        self._source: SyncSource | PrefetchSource | DeviceSource | None = None
        # entered around recording the captured step's CUDA graph (read at each recording, e.g. after a resume);
        # whoever runs another thread that writes to this device (the head's ingest) sets it to that thread's pause
        self.capture_guard: CaptureGuard = contextlib.nullcontext
        self._grad_scale: float | None = None
        # periodic resets (learner/resets.py): fresh draws seeded from the seed torch was given before this learner
        self.resets = PeriodicReset(lc, self.build_network, torch.initial_seed()) if lc.reset_every_updates else None

    def build_network(self) -> torch.nn.Module:
        """A freshly initialized Q-network of this learner's architecture, on the CPU (online net, resets)."""
        return build_q_network_for(self.spec, self.lc)

    # ------------------------------------------------------------------ the update
    def _step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool | torch.Tensor]:
        self._ensure_initial_broadcast()
        source = self._ensure_source()
        if isinstance(source, DeviceSource):
            return self._device_step(source)
        t0 = time.perf_counter()
        batch = source.get()
        self._draw_noise()
        if self._eager is None:
            self._eager = self._new_eager_step()
        loss, td, q_sum, grad_norm, applied_dev = self._eager(self.fwd_online, self.fwd_target, batch, self.updates)
        applied: bool | torch.Tensor = bool(applied_dev) if self._skips_on_host else applied_dev
        if applied is False:  # known on the host: nothing learned from this batch, its priorities stay
            self._warn_skipped(float(loss), float(grad_norm))
        else:
            source.update_priorities(batch.indices, td)  # the replay drops non-finite |TD| (CUDA)
        self.updates += 1
        self.samples += len(batch)
        self._maybe_reset()
        if self.updates % self.lc.weight_broadcast_every == 0:
            self.broadcast()
        self.meter.count(len(batch), time.perf_counter() - t0)  # its values went into the meter's device sums
        return loss, td, q_sum, grad_norm, applied

    def _new_eager_step(self) -> EagerStep:
        """The update bound to this learner's parts as they are now (learner/update.py)."""
        return EagerStep(self.lc, self.replay_config, online=self.online, target=self.target, optimizer=self.optimizer,
                         scaler=self.scaler, policy=self.precision, channels_last=self.channels_last,
                         stack=self.geometry["stack"], meter_sums=self.meter.device_sums, skipped=self._skipped_dev,
                         updates=self.updates, device=self.device,
                         mark_cudagraph_steps=self.compiled and self.lc.compile_mode == "reduce-overhead"
                         and self.device.type == "cuda")

    def _draw_noise(self) -> None:
        """NoisyNet: fresh weight noise for the next update, independent in the online and target nets. In place
        (the noise buffers keep their tensors), so the device step and its CUDA graph read the new draw."""
        if self.noisy:
            self.online.reset_noise()
            self.target.reset_noise()

    def _maybe_reset(self) -> None:
        """The periodic reset (learner/resets.py) right after the update that ends a period, in every step mode:
        it writes the parameters, Adam's state and the target in place, the tensors the device step is bound to."""
        if self.resets is not None and self.resets.due(self.updates):
            self.resets.apply(self.updates, self.online, self.target, self.optimizer)

    def _device_step(self, source: DeviceSource) -> tuple[torch.Tensor, ...]:
        """One update run on the device (learner.step_mode device/captured): it samples, trains, writes the
        priorities back, syncs the target and adds its metrics into the meter's device sums by itself."""
        t0 = time.perf_counter()
        self._draw_noise()
        out = source.update(self.updates)
        self.updates += 1
        self.samples += source.batch
        self._maybe_reset()
        if self.updates % self.lc.weight_broadcast_every == 0:
            self.broadcast()
        self.meter.count(source.batch, time.perf_counter() - t0)
        return out

    def _warn_skipped(self, loss: float | None = None, grad_norm: float | None = None) -> None:
        if self._skip_warned:
            return
        self._skip_warned = True
        seen = "" if loss is None else f" (loss={loss}, grad_norm={grad_norm})"
        # fp16's GradScaler starts at a scale that overflows on purpose and halves it per overflow
        scaling = (" With fp16 loss scaling a few such skips at the start are expected: the scaler "
                   "lowers its scale after each overflow." if self.precision.use_scaler else "")
        warnings.warn(
            f"learner: skipped an optimizer update whose loss or gradient norm was not finite{seen}; the weights "
            f"are unchanged.{scaling} Further skips are only counted in stats()['skipped_updates'].",
            RuntimeWarning,
            stacklevel=3,
        )

    @property
    def skipped_updates(self) -> int:
        """Updates skipped for a non-finite loss/gradient norm (on CUDA as of the last stats() that synced)."""
        return int(self._skipped_dev) if self._skips_on_host else self._skipped_dev_seen

    def train_step(self) -> dict[str, float]:
        """Exactly one optimizer update, priorities handed back; returns floats (syncs on CUDA).

        Ignores the ratio controller and warmup (the caller asked for exactly one update);
        `maybe_train` is the rate-limited, sync-free entry point. `skipped` is 1.0 when the update
        was skipped for a non-finite loss or gradient norm (loss etc. then show the bad values).
        """
        loss, td, q_sum, grad_norm, applied = self._step()
        return {
            "loss": float(loss),
            "td_error": float(td.mean()),
            "mean_q": float(q_sum) / self.batch_per_update,
            "grad_norm": float(grad_norm),
            "updates": self.updates,
            "samples": self.samples,
            "skipped": 0.0 if bool(applied) else 1.0,
        }

    def run_updates(self, n: int) -> None:
        """`n` updates back to back, ignoring warmup/ratio and without a host sync (benchmarks, tests)."""
        for _ in range(int(n)):
            self._step()

    def maybe_train(self, max_updates: int | None = None, time_budget_s: float = 0.05,
                    idle_sleep_s: float = 0.002) -> int:
        """Do updates while warmup/ratio allow, up to `max_updates` or `time_budget_s`; returns how many.

        When warming up or throttled it sleeps `idle_sleep_s` once (so a polling head loop does
        not spin) and returns 0. Publishes the starting weights on the first call.
        """
        self._ensure_initial_broadcast()
        done = 0
        end = time.monotonic() + time_budget_s
        while max_updates is None or done < max_updates:
            decision = self.limiter.may_sample(self.samples)
            if not decision.may_update:
                if done == 0 and idle_sleep_s > 0:
                    time.sleep(idle_sleep_s)
                break
            self._step()
            done += 1
            if time.monotonic() >= end:
                break
        return done

    # ------------------------------------------------------------------ plumbing
    def beta(self) -> float:
        """PER importance exponent, annealed linearly from beta_start to 1 over beta_steps updates."""
        r = self.replay_config
        return r.beta_start + (1.0 - r.beta_start) * min(1.0, self.updates / r.beta_steps)

    def _ensure_source(self) -> SyncSource | PrefetchSource | DeviceSource:
        """Created at the first update, so nothing samples the replay before warmup has passed."""
        if self._source is None:
            if self.lc.step_mode != "eager":
                self._source = DeviceSource(
                    replay=self.replay, device=self.device, lc=self.lc, replay_config=self.replay_config,
                    stack=self.geometry["stack"], online=self.online, target=self.target, optimizer=self.optimizer,
                    scaler=self.scaler, policy=self.precision, channels_last=self.channels_last,
                    meter_sums=self.meter.device_sums, skipped=self._skipped_dev, updates=self.updates,
                    mode=self.lc.step_mode, capture_guard=lambda: self.capture_guard())  # read when recording
                self._skips_on_host = False  # the device step's outcome stays on the device: stats() reads the count
                self.compile_s, self.compiled = self._source.prepare(), self.lc.step_mode == "captured"
            elif self.lc.prefetch:
                self._source = PrefetchSource(self.replay, self.batch_per_update, self.beta, self.device,
                                              depth=self.prefetch_depth)
            else:
                self._source = SyncSource(self.replay, self.batch_per_update, self.beta, self.device)
        return self._source

    def _ensure_initial_broadcast(self) -> None:
        if self.weight_version < 0:
            self.broadcast()

    def broadcast(self) -> None:
        """Publish the online weights as version = updates (see module docstring).

        Weights holding NaN/inf are never published: the broadcast is refused (counted in
        `broadcasts_refused`, warned once) and collectors keep the last good version. The check
        costs one host sync per broadcast on CUDA (the publisher's CPU copy syncs anyway).
        """
        if self.on_weights is None:
            self.weight_version = self.updates
            self.broadcasts += 1
            return
        state = self.online.state_dict()
        bad = ckpt.nonfinite_report(state, "online")
        if bad is not None:
            self.broadcasts_refused += 1
            if self.broadcasts_refused == 1:
                warnings.warn(f"learner: weights not broadcast, non-finite weights in {bad}; collectors keep "
                              f"version {self.weight_version}", RuntimeWarning, stacklevel=2)
            return
        self.weight_version = self.updates
        self.broadcasts += 1
        self.on_weights(self.updates, state)

    def stats(self) -> dict[str, Any]:
        """Learner metrics; means/rates over about the last logging.interval_s (see UpdateMeter).

        Cheap to call often: at most one host sync per 0.5 s, counters always current.
        """
        refreshed_at = self.meter.last_refresh
        out: dict[str, Any] = self.meter.read(self._source.wait_s if self._source is not None else 0.0)
        refreshed = self.meter.last_refresh != refreshed_at
        if self.precision.use_scaler and (refreshed or self._grad_scale is None):
            self._grad_scale = float(self.scaler.get_scale())  # a host sync: only when the meter refreshed
        if refreshed and not self._skips_on_host:
            self._skipped_dev_seen = int(self._skipped_dev)  # read with the meter's sync
            if self._skipped_dev_seen:
                self._warn_skipped()
        out.update({
            "updates": self.updates,
            "samples": self.samples,
            "beta": self.beta(),
            "weight_version": self.weight_version,
            "broadcasts": self.broadcasts,
            "compile_s": self.compile_s,
            "compiled": self.compiled,
            "precision": self.precision.name,
            "batch_per_update": self.batch_per_update,
            "transitions_added": int(self.replay.transitions_added),
            "skipped_updates": self.skipped_updates,
            "broadcasts_refused": self.broadcasts_refused,
        })
        # len(replay) belongs to the reader (prefetch) thread: use its last reading; before the
        # first sample (warmup <= capacity, so no wrap yet) the insert count is the size
        out["replay_size"] = self._source.replay_size if self._source is not None else out["transitions_added"]
        if self.precision.use_scaler:
            out["grad_scale"] = self._grad_scale
        out.update(self.limiter.stats())
        return out

    def close(self) -> None:
        """Stop the prefetch thread (pending priority updates are applied first). Idempotent."""
        if self._source is not None:
            self._source.close()

    def __enter__(self) -> Learner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ state
    def counters(self) -> dict[str, int]:
        return {"updates": self.updates, "samples": self.samples, "broadcasts": self.broadcasts}

    def state_dict(self) -> dict[str, Any]:
        """In-memory state (networks, optimizer, scaler, counters); see save_checkpoint for disk."""
        return {
            "online": self.online.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "counters": self.counters(),
        }

    def load_state_dict(self, state: Mapping[str, Any], where: str = "state_dict") -> None:
        """Restore `state_dict()` output; CheckpointError on any key/shape/type mismatch or non-finite
        weights (nothing changed then)."""
        check_learner_state(state, self.online.state_dict(), self.target.state_dict(), self.params,
                            self.precision.use_scaler, where)
        c = state["counters"]
        # which Adam kernels run (fused, foreach) is this machine's choice, not the checkpoint's: a checkpoint
        # written with other kernels (another device, older code) resumes with this learner's (the check above
        # made param_groups a list of dicts)
        kernels = {k: self.optimizer.param_groups[0].get(k) for k in ("fused", "foreach")}
        saved = {**state["optimizer"], "param_groups": [{**g, **kernels} for g in state["optimizer"]["param_groups"]]}
        try:  # first: Adam's own checks may still refuse it, and then nothing has changed
            self.optimizer.load_state_dict(saved)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ckpt.CheckpointError(f"{where}[optimizer]: not loadable ({type(exc).__name__}: {exc})") from exc
        # Adam's state dict carries the lr and eps it was saved with; the run's config says what to train with
        # now (the same values unless the resume was given others on purpose)
        for group in self.optimizer.param_groups:
            if (group["lr"], group["eps"]) != (self.lc.lr, self.lc.adam_eps):
                log.info("resume: Adam lr %g, eps %g from the config (the checkpoint had %g, %g)", self.lc.lr,
                         self.lc.adam_eps, group["lr"], group["eps"])
            group["lr"], group["eps"] = float(self.lc.lr), float(self.lc.adam_eps)
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        if self.precision.use_scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.updates, self.samples = int(c.get("updates", 0)), int(c.get("samples", 0))
        self.broadcasts = int(c.get("broadcasts", 0))
        if self.weight_version >= 0:  # collectors already got other weights: publish the restored ones
            self.broadcast()

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, run_dir: str | Path, replay: Any = None, *,
                        counters: Mapping[str, int | float] | None = None) -> Path:
        """Atomically write run_dir/checkpoint/ (replay included when given); returns its path.

        `counters` (env steps, episodes, ... from the head) are stored and returned by
        `load_checkpoint`. The prefetch thread is paused (and pending priority updates applied)
        while the replay is saved, since the replay belongs to that thread.
        """
        state = self.state_dict()
        merged = {**dict(counters or {}), **state["counters"],
                  "transitions_added": int(self.replay.transitions_added)}
        data = ckpt.CheckpointData(geometry=self.geometry, model={"online": state["online"], "target": state["target"]},
                                   optimizer=state["optimizer"], scaler=state["scaler"], counters=merged,
                                   config_json=self.config_json, rng=ckpt.capture_rng())
        if replay is not None and self._source is not None:
            with self._source.pause():
                return ckpt.save_checkpoint(run_dir, data, replay)
        return ckpt.save_checkpoint(run_dir, data, replay)

    def save_eval_snapshot(self, run_dir: str | Path, counters: Mapping[str, int | float] | None = None) -> Path:
        """run_dir/checkpoint/ holding only the online weights (`checkpoint.eval_only`): what an evaluation
        process loads. Cheap: no optimizer state, replay or RNG."""
        merged = {**dict(counters or {}), **self.counters()}
        data = ckpt.CheckpointData(geometry=self.geometry, model={"online": self.online.state_dict(), "target": {}},
                                   optimizer={}, scaler={}, counters=merged, config_json=self.config_json, rng={})
        return ckpt.save_checkpoint(run_dir, ckpt.eval_only(data))

    def load_weights(self, path: str | Path) -> dict[str, Any]:
        """Start from another run's network: the online weights of the checkpoint at `path` (a run dir or a
        checkpoint dir, training or evaluation-only) become both this learner's online and target networks,
        as a fresh learner's target starts as a copy of its online network. The optimizer, the counters and
        the replay stay as they are (fresh): a new run that starts where that network left off
        (`learner.init_from`). CheckpointError, with nothing changed, when the checkpoint's geometry, keys or
        shapes differ from this learner's, or it is corrupt or non-finite. Returns the checkpoint's counters."""
        data = ckpt.load_checkpoint(path)
        where = data.path or Path(path)
        ckpt.check_geometry(self.geometry, data.geometry, where / "meta.json")
        online = data.model["online"]
        check_state_dict(self.online.state_dict(), online, f"{where / 'model.pt'}[online]")
        self.online.load_state_dict(online)
        self.target.load_state_dict(online)
        if self.weight_version >= 0:  # collectors already got other weights: publish these
            self.broadcast()
        return dict(data.counters)

    def load_checkpoint(self, path: str | Path, replay: Any = None, restore_rng: bool = True) -> dict[str, Any]:
        """Restore from a run dir or checkpoint dir; returns the stored counters (incl. extra ones).

        With `replay` given and a replay in the checkpoint, the replay is restored too (the
        caller keeps the replay's writer quiescent; its files are checked against meta.json's sizes
        and sha256 first). CheckpointError on any mismatch, corruption or non-finite weights.
        """
        data = ckpt.load_checkpoint(path, verify_replay=replay is not None)
        where = data.path or Path(path)
        ckpt.check_geometry(self.geometry, data.geometry, where / "meta.json")
        state = {"online": data.model["online"], "target": data.model["target"], "optimizer": data.optimizer,
                 "scaler": data.scaler, "counters": data.counters}
        self.load_state_dict(state, where=str(where / "model.pt"))
        if restore_rng:
            try:
                ckpt.restore_rng(data.rng)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise ckpt.CheckpointError(f"{where / 'rng.pt'}: generator state not restorable ({exc})") from exc
        if replay is not None and data.has_replay:
            try:
                if self._source is not None:
                    with self._source.pause():
                        replay.restore(where / "replay")
                else:
                    replay.restore(where / "replay")
            except Exception as exc:  # its own ValueErrors, plus KeyError/TypeError/invariant errors on bad content
                raise ckpt.CheckpointError(f"{where / 'replay'}: {type(exc).__name__}: {exc}") from exc
        return dict(data.counters)
