"""The head process: replay, consolidation thread, learner, weight publisher and local collectors.

`Head` wires the parts together in the order that keeps failures cheap: the config is already
validated, then the env's EnvSpec is read (one env built at most; the CLI hands over the one it read
for its checks), the replay allocated, sockets bound, the learner built and (on --resume) restored
or (with learner.init_from) given another run's network, and only then are collector processes
started. The main thread runs the learner and, between updates, the periodic work: progress lines,
metrics, supervision, checkpoints and stop conditions. Shutdown reverses the order: collectors are
told to stop (STOP broadcast, then SIGTERM, then SIGKILL for stragglers), the checkpoint is written,
threads joined and sockets closed. Both are one path: every part, once built, registers how it is
closed on the head's exit stack, so a start that fails half way and `close()` unwind the same steps in
reverse order of construction (a failed start writes no checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq

from envs.factory import env_spec
from envs.spec import EnvSpec
from ingest.consolidation import ConsolidationThread
from ingest.registration import MAX_SOCKETS, Registrar
from launcher.evaluator import PeriodicEvaluator
from launcher.metrics import MetricsLogger
from launcher.progress import ProgressTracker
from launcher.supervisor import Collectors, CollectorSupervisor, ThreadCollectors
from learner.broadcast import WeightPublisher
from learner.checkpoint import find_checkpoint
from learner.trainer import Learner
from replay.buffer import ReplayBuffer
from replay.rate_limiter import RateLimiter
from shared.config import Config
from shared.keys import load_server
from shared.protocol import ObsSpec
from shared.stop_flag import StopRequest
from shared.tempdirs import owned_tempdir, sweep_stale

log = logging.getLogger("mario_apex.head")


@dataclass(frozen=True)
class StopAt:
    """Limits after which the head shuts down by itself (None = no limit)."""

    env_steps: int | None = None
    updates: int | None = None
    seconds: float | None = None
    mean_return: float | None = None  # stop once the last logging.episode_window episodes average this


_HEAD_COUNTERS = ("env_steps", "episodes")
ENDPOINTS_FILE = "endpoints.json"  # in the run dir while the head runs: its bound control and weights endpoints
SUPERVISE_EVERY_S = 0.25  # how often the main loop checks collector processes
# The data plane raising this many times with no chunk accepted in between is a bug on the head's side (a
# peer's bad input is rejected, never raised): stop with a clear error instead of training on nothing.
CONSOLIDATION_FAILURE_ROUNDS = 50
FAILURE_REASONS = frozenset({"consolidation_failed"})  # stop reasons that make `python -m launcher` exit 1
CHECKPOINT_RETRY_S = 60.0  # after a failed periodic checkpoint (e.g. a full disk)


def resolve_device(name: str) -> torch.device:
    from shared.config import ConfigError  # one-line error at the CLI (exit 2), not a traceback

    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("learner.device='cuda' is invalid: torch sees no CUDA device; "
                              "allowed here: learner.device=cpu or auto")
        return torch.device("cuda")
    return torch.device("cpu")


class Head:
    last_checkpoint: Path | None = None  # the newest checkpoint this head wrote
    final_checkpoint_error: str | None = None  # why close() could not write the final checkpoint

    def __init__(self, cfg: Config, run_dir: Path, train: bool = True, resume: Path | None = None,
                 inprocess: bool = False, launcher: str = "local", ray_address: str = "",
                 env_spec: EnvSpec | None = None) -> None:
        """`env_spec`: the env's spec when the caller has read it already (the CLI does, to check memory);
        None: the head reads it. Either way the env is built at most once."""
        self._closed = False
        self._started = False  # set once every part is built: a failed start unwinds without a checkpoint
        self._checkpoint_on_close = True
        self._stack = contextlib.ExitStack()  # how each built part is closed, in order of construction
        self.inprocess = inprocess  # collectors as threads over inproc:// (one process, one debugger, one log)
        self.launcher = launcher  # "local": child processes of the head; "ray": actors on a Ray cluster
        self.ray_address = ray_address
        try:
            self._start(cfg, run_dir, train, resume, env_spec)
        except BaseException:
            self._unwind()  # a failed start leaves nothing behind: threads stopped, sockets closed, folders removed
            raise
        self._started = True

    def __enter__(self) -> Head:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, cfg: Config, run_dir: Path, train: bool, resume: Path | None, spec: EnvSpec | None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.train = train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.set_num_threads(max(1, cfg.learner.torch_threads))  # 0 (auto): the learner sets it once it knows its precision
        self.device = resolve_device(cfg.learner.device)
        self.env_spec = spec = env_spec(cfg.env) if spec is None else spec  # what every part below is sized by
        # the env's choices: preprocessing, image (CNN) or vector (MLP) path, observation, actions
        log.info("env %s: %s; obs %s %s, stack %d; learner on %s", cfg.env.env_id, spec.description,
                 spec.obs_shape, spec.obs_dtype, spec.stack, self.device)
        # --seed fixes the head's randomness too: the network's initial weights and the sampler's draws (a
        # resume restores both generators from the checkpoint afterwards)
        torch.manual_seed(cfg.env.seed)
        sampler_seed = int(np.random.SeedSequence([cfg.env.seed, 1]).generate_state(1)[0])
        self.replay = ReplayBuffer.build(cfg.replay, spec, self.device, seed=sampler_seed)
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, MAX_SOCKETS)  # room for every registration (before the first socket)
        self._stack.callback(self._close_context)  # last: every socket is closed by then
        self._stack.callback(self._remove_endpoints_file)
        t = cfg.transport
        curve = load_server(t.curve_keys_dir) if t.curve_keys_dir else None
        sweep_stale()  # ipc folders of heads killed before they could remove them
        self.ipc_dir: Path | None = None  # only with transport.local_transport=ipc (shared/config.py says why)
        if t.local_transport == "ipc":
            self.ipc_dir = Path(owned_tempdir())
            self._stack.callback(shutil.rmtree, self.ipc_dir, True)
        self.publisher = WeightPublisher(
            [f"tcp://{t.bind}:{t.port + 1 if t.port else 0}",
             *([f"ipc://{self.ipc_dir / 'weights.ipc'}"] if self.ipc_dir else []),
             *([f"inproc://mapx-weights-{id(self)}"] if self.inprocess else [])],
            context=self.ctx, heartbeat_s=cfg.collectors.heartbeat_s, curve=curve,
        )
        self._stack.callback(self.publisher.close)
        remote_weights = self.publisher.endpoints[0]
        local_weights = self.publisher.endpoints[1] if self.ipc_dir else remote_weights
        # one rate limiter: the learner asks it before sampling, the consolidation thread before inserting
        self.limiter = RateLimiter.for_learner(cfg.learner, cfg.learner.batch_size * cfg.learner.grad_accum_steps,
                                               lambda: int(self.replay.transitions_added))
        self.learner = Learner(cfg.learner, cfg.replay, spec, self.replay, self.device,
                               on_weights=self.publisher.publish, config_json=cfg.to_json(),
                               meter_window_s=cfg.logging.interval_s, rate_limiter=self.limiter)
        self._stack.callback(self.learner.close)
        self.counters: dict[str, int] = {}
        if resume is not None:
            self._resume(resume)
        elif cfg.learner.init_from:
            self._init_from(Path(cfg.learner.init_from))
        # after a resume or a starting network is accepted: a refused one leaves the run's record of how it was
        # trained as it was
        (self.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        # what the data plane checks chunks and summaries against (make_env truncates at env.max_episode_steps)
        obs_spec = ObsSpec.of(spec, max_episode_steps=cfg.env.max_episode_steps)
        registrar = Registrar(
            obs_spec, {"local": local_weights, "remote": remote_weights,
                       **({"inproc": self.publisher.endpoints[-1]} if self.inprocess else {})},
            self.ctx, transport=t, collectors=cfg.collectors, replay=cfg.replay, welcome_config=cfg.to_dict(),
            num_collectors=max(1, cfg.collectors.count),
            # room is kept for the collector processes the supervisor started (their HELLOs come over loopback)
            own_pids=lambda: self.supervisor.pids() if hasattr(self, "supervisor") else (),
            control_endpoint=f"inproc://mapx-control-{id(self)}" if self.inprocess else f"tcp://{t.bind}:{t.port}",
            memory_expected_bytes=self.replay.nbytes(),  # a generous bound where the replay is on a GPU
        )
        self._stack.callback(self._close_registrar, registrar)
        self.consolidation = ConsolidationThread(
            self.replay, obs_spec, registrar, transport=t, collectors=cfg.collectors,
            episode_window=cfg.logging.episode_window, latest_weight_version=lambda: self.publisher.version,
            gate=self.limiter,
        )
        self._stack.callback(self.consolidation.stop)
        self._stack.callback(self._final_checkpoint)  # after the collectors stopped, before the threads do
        # the ingest thread writes into a device replay: it pauses while the learner records a CUDA graph
        self.learner.capture_guard = self.consolidation.writes_paused
        self.consolidation.start()
        if self.inprocess:
            self.supervisor: Collectors = ThreadCollectors(cfg.collectors.count, self.ctx,
                                                           self.consolidation.control_endpoint)
        elif self.launcher == "ray":
            from launcher.ray_collectors import RayCollectors  # ray: imported only for this launcher

            self.supervisor = RayCollectors(
                cfg.collectors.count, self.consolidation.control_endpoint, curve.public if curve else None,
                registrar.allow, self.consolidation.stall_clock_of_pid, t.stall_timeout_s,
                on_exit=self.consolidation.forget_pid, address=self.ray_address,
            )
            self._stack.callback(self.supervisor.close)  # leave the cluster
        else:
            self.supervisor = CollectorSupervisor(
                cfg.collectors.count, self._collector_argv, self._stall_clock, t.stall_timeout_s,
                env=_collector_env(), log_dir=str(self.run_dir / "collectors"), on_exit=self.consolidation.forget_pid,
            )
        self._stack.callback(self._stop_collectors)
        self.metrics = MetricsLogger(self.run_dir, cfg.logging)
        self._stack.callback(self.metrics.close)
        self.progress = ProgressTracker(cfg.logging.episode_window, base_env_steps=self.counters.get("env_steps", 0))
        self.checkpoint_failures = 0
        lg = cfg.logging
        self.evaluator = PeriodicEvaluator(
            self.run_dir, lg.eval_every_s if train else 0.0, lg.eval_episodes, lg.eval_epsilon,
            write_snapshot=lambda d: self.learner.save_eval_snapshot(d, counters={"env_steps": self.env_steps()}),
            seed=cfg.env.seed, keep=lg.eval_keep,
        )
        self._stack.callback(self.evaluator.close)
        self.endpoints = {"control": self.consolidation.control_endpoint, "weights": remote_weights,
                          "weights_local": local_weights}
        _write_json(self.run_dir / ENDPOINTS_FILE, self.endpoints)  # port 0: where the head is reachable
        log.info("listening: control %s, weights %s", self.endpoints["control"], remote_weights)

    # ------------------------------------------------------------------ wiring helpers
    def _collector_argv(self, slot: int) -> list[str]:
        argv = [sys.executable, "-m", "actors", "--connect", self.consolidation.control_endpoint, "--slot", str(slot),
                "--parent-pid", str(os.getpid())]
        if self.cfg.transport.curve_keys_dir:
            argv += ["--curve-keys", self.cfg.transport.curve_keys_dir]
        return argv

    def _stall_clock(self, pid: int) -> tuple[float, bool] | None:
        """(when the local collector `pid` was last heard from or held back by the head, whether it is
        waiting for the head now); None before it registered. Flow control never counts as a stall."""
        return self.consolidation.stall_clock_of_pid(pid)

    def _resume(self, resume: Path) -> None:
        ckpt = find_checkpoint(resume)  # CheckpointError naming the path when there is none
        restored = self.learner.load_checkpoint(ckpt, replay=self.replay)
        self.counters = {k: int(v) for k, v in restored.items() if isinstance(v, (int, float))}
        log.info("resumed from %s: %s", ckpt, self.counters)

    def _init_from(self, path: Path) -> None:
        source = self.learner.load_weights(path)  # CheckpointError when it does not fit this run's network
        log.info("network from %s (it had trained %s env steps, %s updates); optimizer, counters and replay fresh",
                 path, source.get("env_steps", "?"), source.get("updates", "?"))

    # ------------------------------------------------------------------ main loop
    def run(self, stop_at: StopAt, stop_event: StopRequest) -> dict[str, Any]:
        cfg = self.cfg
        self.supervisor.start()
        started = time.monotonic()
        next_log = started + cfg.logging.interval_s
        next_ckpt = started + cfg.learner.checkpoint_every_s
        next_poll = started
        reason = "stopped"
        while True:
            if stop_event.is_set():
                reason = "signal"
                break
            if self.train:
                self.learner.maybe_train()  # sleeps briefly by itself when warming up or throttled
            else:  # drain-only (benchmarks): the consolidation thread writes; this thread is the only reader
                self.replay.sync()
                time.sleep(0.01)
            now = time.monotonic()
            if now >= next_log:
                self._log_progress()
                next_log = now + cfg.logging.interval_s
            if now >= next_poll:  # restarts back off >= 0.5 s: no need to look after every update burst
                self.supervisor.poll()
                next_poll = now + SUPERVISE_EVERY_S
                if stop_at.mean_return is not None and self._window_mean_return() >= stop_at.mean_return:
                    reason = "target_return"
                    break
                self.evaluator.poll({"updates": self.learner.updates, "env_steps": self.env_steps(),
                                     "elapsed_s": now - started})
                if self.train and self.evaluator.cleared(cfg.logging.stop_flag_rate, cfg.logging.stop_flag_evals):
                    log.info("cleared: the last %d evaluation(s) reached a flag rate of %.2f (logging.stop_flag_rate)",
                             cfg.logging.stop_flag_evals, cfg.logging.stop_flag_rate)
                    reason = "flags_cleared"
                    break
                if self.consolidation.errors_since_accepted >= CONSOLIDATION_FAILURE_ROUNDS:
                    log.error("the consolidation thread failed %d times without accepting a chunk (last: %s): "
                              "stopping; this is a bug in the head, please report it with head.log",
                              self.consolidation.errors_since_accepted, self.consolidation.last_error)
                    reason = "consolidation_failed"
                    break
            if self.train and now >= next_ckpt:
                next_ckpt = now + (cfg.learner.checkpoint_every_s if self._try_checkpoint()
                                   else min(CHECKPOINT_RETRY_S, cfg.learner.checkpoint_every_s))
            env_steps = self.env_steps()
            if stop_at.env_steps is not None and env_steps >= stop_at.env_steps:
                reason = "max_env_steps"
                break
            if stop_at.updates is not None and self.learner.updates >= stop_at.updates:
                reason = "max_updates"
                break
            if stop_at.seconds is not None and now - started >= stop_at.seconds:
                reason = "max_seconds"
                break
        elapsed = time.monotonic() - started
        self._log_progress()
        summary = self._summary(elapsed, reason)
        log.info("stopping (%s) after %.1f s: %s", reason, elapsed, summary)
        return summary

    def _window_mean_return(self) -> float:
        """Mean return of the last episode_window episodes; -inf until the window is full."""
        episodes = self.consolidation.stats().recent_episodes
        if not episodes or len(episodes) < self.cfg.logging.episode_window:
            return float("-inf")
        return sum(e.episode_return for e in episodes) / len(episodes)

    def env_steps(self) -> int:
        # a plain counter read: called after every update burst, so no stats snapshot here
        return self.counters.get("env_steps", 0) + self.consolidation.transitions

    def _summary(self, elapsed: float, reason: str) -> dict[str, Any]:
        stats = self.consolidation.stats()
        lstats = self.learner.stats()
        new_steps = stats.transitions
        updates = int(lstats.get("updates", 0))
        return {
            "reason": reason,
            "env_steps": self.env_steps(),
            "elapsed_s": elapsed,
            "env_steps_per_s": new_steps / elapsed if elapsed > 0 else 0.0,
            "updates": updates,
            "updates_per_s": (updates - self.counters.get("updates", 0)) / elapsed if elapsed > 0 else 0.0,
            "episodes": stats.episodes,
            "rejected": stats.rejected,
            "restarts": self.supervisor.restarts_total,
            "replay_size": len(self.replay),
        }

    def _log_progress(self) -> None:
        stats = self.consolidation.stats()
        lstats = self.learner.stats()
        record = self.progress.record(stats, lstats, len(self.replay), self.cfg.replay.capacity,
                                      self.publisher.version, self.supervisor.restarts_total, self.counters)
        if self.evaluator.last is not None:  # the latest periodic evaluation, for the progress line and metrics
            record.update({f"eval_{k}": self.evaluator.last[k] for k in ("mean_x_pos", "flag_rate", "mean_return",
                                                                          "episodes", "updates")})
        print(self.progress.progress_line(record), flush=True)
        print(self.consolidation.processor_line(), flush=True)
        print(self.metrics.main_line(record), flush=True)
        self.metrics.log(record)

    def _try_checkpoint(self) -> bool:
        """A periodic checkpoint that fails (full disk, non-finite weights) is a warning; the last good one stays."""
        try:
            self.save_checkpoint()
            return True
        except Exception as exc:  # noqa: BLE001 - the run goes on; the next attempt may succeed
            self.checkpoint_failures += 1
            log.warning("checkpoint failed (%s); the previous checkpoint is kept; retrying in %.0f s", exc,
                        min(CHECKPOINT_RETRY_S, self.cfg.learner.checkpoint_every_s))
            return False

    def save_checkpoint(self) -> Path:
        with self.consolidation.writes_paused():  # the replay and the counts of what it holds, as of one instant
            counters = dict(self.counters)
            counters["env_steps"] = self.env_steps()
            counters["episodes"] = self.counters.get("episodes", 0) + self.consolidation.stats().episodes
            path = self.learner.save_checkpoint(
                self.run_dir, replay=self.replay if self.cfg.learner.save_replay else None,
                counters={k: v for k, v in counters.items() if k in _HEAD_COUNTERS})
        log.info("checkpoint written to %s", path)
        self.last_checkpoint = path
        return path

    # ------------------------------------------------------------------ shutdown
    def close(self, checkpoint: bool = True) -> None:
        """Stop collectors, write the checkpoint (unless `checkpoint` is false), stop threads, close sockets: the
        exit stack's steps (see the module docstring). Idempotent."""
        if self._closed:
            return
        self._checkpoint_on_close = checkpoint
        self._unwind()

    def _unwind(self) -> None:
        """Every registered closing step, newest first; one that fails is logged and the rest still run."""
        self._closed = True
        try:
            self._stack.close()  # a step that raises does not keep the later ones from running
        except Exception as exc:  # noqa: BLE001 - shutdown goes on regardless; the first failure is reported
            log.warning("a shutdown step failed: %r", exc)

    def _stop_collectors(self) -> None:
        """STOP to every collector, then the supervisor's SIGTERM and SIGKILL for stragglers."""
        try:
            self.publisher.stop_collectors()
        except Exception as exc:  # noqa: BLE001 - shutdown goes on regardless
            log.warning("STOP broadcast failed: %r", exc)
        self.supervisor.stop(grace_s=5.0)

    def _final_checkpoint(self) -> None:
        """The checkpoint at shutdown: none after a failed start, nor with close(checkpoint=False) or --no-train."""
        if not (self._started and self._checkpoint_on_close and self.train):
            return
        try:
            self.save_checkpoint()
        except Exception as exc:  # noqa: BLE001 - shutdown goes on; `python -m launcher` exits 3
            self.final_checkpoint_error = " ".join(f"{type(exc).__name__}: {exc}".split())
            since = (f"its last checkpoint ({self.last_checkpoint})" if self.last_checkpoint
                     else "it started (it wrote no checkpoint)")
            log.error("final checkpoint failed (%s): the training this run did since %s is not on disk",
                      self.final_checkpoint_error, since)

    def _close_registrar(self, registrar: Registrar) -> None:
        """The registrar's sockets, unless the consolidation thread that owns them is still running (it closes them
        when it stops; the context's destroy does otherwise)."""
        consolidation = getattr(self, "consolidation", None)
        if consolidation is None or not consolidation.is_alive():
            registrar.close()

    def _close_context(self) -> None:
        """term() after a clean shutdown; destroy(linger=0) after a failed start (a socket a half-built part left
        open would block term() forever) or when a head thread did not stop."""
        alive = getattr(self, "consolidation", None) is not None and self.consolidation.is_alive() or \
            getattr(self, "publisher", None) is not None and self.publisher.alive()
        if self._started and not alive:
            self.ctx.term()
            return
        if self._started:
            log.warning("a head thread did not stop; closing its sockets from here")
        self.ctx.destroy(linger=0)

    def _remove_endpoints_file(self) -> None:
        try:  # a run dir gone read-only (a disk error) must not turn the exit status into a traceback's
            (self.run_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s (%s); it names endpoints this head no longer serves",
                        self.run_dir / ENDPOINTS_FILE, " ".join(f"{type(exc).__name__}: {exc}".split()))


def _collector_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("MKL_NUM_THREADS", "1")
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a reader polling for `path` never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
