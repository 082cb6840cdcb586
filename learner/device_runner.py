"""Binding the learner's parts to a device step, and launching it: eagerly, compiled, or as one CUDA graph.

`bind_state` gathers the tensors `learner.device_step.device_update` works on: the online and
target parameters, torch.optim.Adam's own state tensors (created here as Adam creates them when it
has not stepped yet), the GradScaler's scale and growth tracker, the learner's counters and the
ring's table, frames, claim and uniforms. Nothing is copied, so `state_dict()`, checkpoints and
broadcasts see what the step wrote.

`DeviceRunner` modes:

- ``device``: the step function runs eagerly, op by op (no compile time; the reference).
- ``captured``: `torch.compile(device_update, fullgraph=True)` -- no graph break anywhere in the
  update -- warmed up on a copy of the state (the warm-up trains nothing real). On CUDA the compiled
  step is then recorded once as a `torch.cuda.CUDAGraph` over the real, static tensors, and every
  update is one replay of that graph: no kernel launches from the host. Drains and uniform refills
  copy into those same tensors between replays.

While a graph is being recorded no other thread may touch the GPU: a copy or kernel launched meanwhile
(the head's ingest thread writing frames into a device replay) invalidates the capture. The runner
records inside `capture_guard()`, which the owner of such a thread supplies (the head: its writer's
pause); compiling and warming up run outside it, beside the writer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import fields, replace
from typing import Any

import torch
from torch import nn

from learner.device_step import StepConfig, StepState, device_update
from learner.dqn import Munchausen
from learner.precision import PrecisionPolicy

STEP_MODES = ("eager", "device", "captured")

CaptureGuard = Callable[[], AbstractContextManager[Any]]  # entered around recording a CUDA graph


def adam_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> tuple[list, list, list, dict]:
    """(exp_avg, exp_avg_sq, step tensors, the param group) of a plain Adam over `params`, created if absent.

    The step counters are kept on each parameter's device (fused and capturable Adam keep them there)."""
    if not isinstance(optimizer, torch.optim.Adam) or len(optimizer.param_groups) != 1:
        raise ValueError("a device step needs the learner's torch.optim.Adam with one parameter group")
    group = optimizer.param_groups[0]
    if group.get("amsgrad") or group.get("weight_decay") or group.get("maximize") or group.get("differentiable"):
        raise ValueError("a device step implements Adam without amsgrad, weight decay, maximize or differentiable")
    exp_avg, exp_avg_sq, steps = [], [], []
    for p in params:
        st = optimizer.state[p]
        if not st:
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        elif st["step"].device != p.device:
            st["step"] = st["step"].to(p.device)
        exp_avg.append(st["exp_avg"])
        exp_avg_sq.append(st["exp_avg_sq"])
        steps.append(st["step"])
    return exp_avg, exp_avg_sq, steps, group


def scaler_tensors(scaler: Any, policy: PrecisionPolicy, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, growth tracker): the GradScaler's own tensors under fp16 (so its state_dict follows the
    step), a constant 1 and 0 otherwise."""
    if not policy.use_scaler:
        return torch.ones((), dtype=torch.float32, device=device), torch.zeros((), dtype=torch.int32, device=device)
    scaler.scale(torch.ones((), device=device))  # creates the scale and tracker tensors on `device` if absent
    return scaler._scale.view(()), scaler._growth_tracker.view(())


def bind_state(online: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
               policy: PrecisionPolicy, ring: Any, *, meter_sums: torch.Tensor, skipped: torch.Tensor,
               updates: int) -> StepState:
    """The step's view of the learner's parts (see the module docstring); `updates`: the learner's count."""
    named = [(n, p) for n, p in online.named_parameters() if p.requires_grad]
    names, params = [n for n, _ in named], [p for _, p in named]
    target_named = dict(target.named_parameters())
    persistent = set(online.state_dict()) - {n for n, _ in online.named_parameters()}
    if persistent:  # NoisyNet's noise is a non-persistent buffer the learner redraws in place before each update
        raise ValueError(f"a device step supports networks without persistent buffers, got {sorted(persistent)}")
    exp_avg, exp_avg_sq, steps, group = adam_state(optimizer, params)
    device = params[0].device
    scale, tracker = scaler_tensors(scaler, policy, device)
    batch = ring.uniforms.shape[1]
    return StepState(
        names=names, params=params, target_params=[target_named[n] for n in names], exp_avg=exp_avg,
        exp_avg_sq=exp_avg_sq, adam_steps=steps,
        lr=torch.tensor(float(group["lr"]), dtype=torch.float32, device=device), scale=scale, growth_tracker=tracker,
        updates=torch.tensor(int(updates), dtype=torch.int64, device=device), meter_sums=meter_sums, skipped=skipped,
        stale_rows=torch.zeros((), dtype=torch.int64, device=device),
        last=torch.zeros(4, dtype=torch.float32, device=device),
        last_td=torch.zeros(batch, dtype=torch.float32, device=device),
        table=ring.table, frames=ring.frames, claim=ring.claim, uniforms=ring.uniforms,
    )


def step_config(lc: Any, replay_config: Any, policy: PrecisionPolicy, scaler: Any, group: dict, *, stack: int,
                prioritized: bool, channels_last: bool, uniform_rows: int) -> StepConfig:
    """The constants of the learner's update: `lc` a LearnerConfig, `replay_config` a ReplayConfig."""
    betas = group["betas"]
    growth = {}
    if policy.use_scaler:
        growth = {"growth_factor": float(scaler.get_growth_factor()), "backoff_factor": float(scaler.get_backoff_factor()),
                  "growth_interval": int(scaler.get_growth_interval())}
    return StepConfig(
        batch=lc.batch_size * lc.grad_accum_steps, micro=lc.batch_size, accum=lc.grad_accum_steps, stack=stack,
        prioritized=prioritized, alpha=float(replay_config.alpha), priority_eps=float(replay_config.priority_eps),
        beta_start=float(replay_config.beta_start), beta_steps=int(replay_config.beta_steps), double_q=lc.double_q,
        max_grad_norm=float(lc.max_grad_norm), target_update_every=int(lc.target_update_every),
        polyak_tau=float(lc.polyak_tau), adam_beta1=float(betas[0]), adam_beta2=float(betas[1]),
        adam_eps=float(group["eps"]), device_type=policy.device_type, autocast_dtype=policy.autocast_dtype,
        use_scaler=policy.use_scaler, channels_last=channels_last, uniform_rows=uniform_rows,
        munchausen=Munchausen.of(lc), quantiles=lc.quantiles > 0, target_epsilon=float(lc.target_epsilon),
        target_epsilon_from=int(lc.target_epsilon_from), augment_shift=int(lc.augment_shift), **growth,
    )


def scratch_copy(state: StepState) -> StepState:
    """A copy of every tensor the step writes (frames, claim and uniforms are only read): a warm-up on it
    changes nothing real."""
    changes = {}
    for f in fields(state):
        value = getattr(state, f.name)
        if f.name in ("names", "frames", "claim", "uniforms"):
            continue
        changes[f.name] = [_clone(t) for t in value] if isinstance(value, list) else _clone(value)
    return replace(state, **changes)


def _clone(t: torch.Tensor) -> torch.Tensor:
    """A copy of the same kind (a compiled step guards on Parameter vs plain tensor)."""
    if isinstance(t, nn.Parameter):
        return nn.Parameter(t.detach().clone(), requires_grad=t.requires_grad)
    return t.clone()


class DeviceRunner:
    """Runs `device_update` on a bound state in the chosen mode (see the module docstring)."""

    def __init__(self, cfg: StepConfig, state: StepState, online: nn.Module, target: nn.Module, mode: str,
                 autotune: bool = False, capture_guard: CaptureGuard = contextlib.nullcontext) -> None:
        if mode not in ("device", "captured"):
            raise ValueError(f"DeviceRunner mode={mode!r}: allowed device, captured")
        if autotune and mode != "captured":
            raise ValueError(f"DeviceRunner autotune: only the captured mode compiles (mode={mode!r})")
        self.cfg, self.state, self.online, self.target, self.mode = cfg, state, online, target, mode
        self.capture_guard = capture_guard
        self.cuda = state.params[0].device.type == "cuda"
        # inductor's mode: autotune times kernel choices at compile time; "-no-cudagraphs" because the
        # runner records the one graph itself (prepare)
        self.compile_mode = ("max-autotune-no-cudagraphs" if autotune else "default") if mode == "captured" else None
        self._fn = device_update if mode == "device" else torch.compile(device_update, fullgraph=True, dynamic=False,
                                                                        mode=self.compile_mode)
        self._graph: Any = None
        self._ready = mode == "device"
        self.compile_s = 0.0

    def prepare(self) -> None:
        """Compile (warm-up on a scratch copy) and, on CUDA, record the graph; a no-op when done."""
        if self._ready:
            return
        t0 = time.perf_counter()
        scratch = scratch_copy(self.state)
        device = self.state.params[0].device
        # the warm-up draws nothing real either: torch's generators (random shifts) are as they were after it
        warm_up_rng = torch.random.fork_rng(devices=[device] if self.cuda else [], device_type=device.type)
        if self.cuda:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream())
            with warm_up_rng, torch.cuda.stream(side):
                for _ in range(2):  # compile, autotune and initialize the libraries outside the capture
                    self._fn(self.cfg, scratch, self.online, self.target)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with self.capture_guard(), torch.cuda.graph(graph):  # no other thread's GPU work meanwhile
                self._fn(self.cfg, self.state, self.online, self.target)
            self._graph = graph
            torch.cuda.synchronize()
        else:
            with warm_up_rng:
                self._fn(self.cfg, scratch, self.online, self.target)
        del scratch
        self._ready = True
        self.compile_s += time.perf_counter() - t0

    def rebind(self, state: StepState) -> None:
        """Use other tensors (e.g. Adam's state after a load): a CUDA graph is recorded again."""
        self.state = state
        if self._graph is not None:
            self._graph = None
            self._ready = False

    def __call__(self) -> None:
        self.prepare()
        if self._graph is not None:
            self._graph.replay()
        else:
            self._fn(self.cfg, self.state, self.online, self.target)
