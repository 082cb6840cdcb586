"""Binding the learner's parts to a device step, and launching it: eagerly, compiled, or as one CUDA graph.

`bind_state` gathers the tensors `learner.device_step.device_update` works on: the update's own
(`learner.step.bind_step_state`: parameters, Adam's and the GradScaler's state tensors, counters) and the
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

from learner.device_step import DeviceStepState, device_update
from learner.precision import PrecisionPolicy
from learner.step import StepConfig, bind_step_state

STEP_MODES = ("eager", "device", "captured")

CaptureGuard = Callable[[], AbstractContextManager[Any]]  # entered around recording a CUDA graph


def bind_state(online: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
               policy: PrecisionPolicy, ring: Any, *, meter_sums: torch.Tensor, skipped: torch.Tensor,
               updates: int) -> DeviceStepState:
    """`bind_step_state` plus the ring's tensors the device feeder draws from."""
    state = bind_step_state(online, target, optimizer, scaler, policy, meter_sums=meter_sums, skipped=skipped,
                            updates=updates, batch=ring.uniforms.shape[1])
    return DeviceStepState(**{f.name: getattr(state, f.name) for f in fields(state)},
                           stale_rows=torch.zeros((), dtype=torch.int64, device=state.params[0].device),
                           table=ring.table, frames=ring.frames, claim=ring.claim, uniforms=ring.uniforms)


def scratch_copy(state: DeviceStepState) -> DeviceStepState:
    """A copy of every tensor the step writes (frames, claim and uniforms are only read): a warm-up on it
    changes nothing real."""
    changes = {}
    for f in fields(state):
        value = getattr(state, f.name)
        if f.name in ("names", "frames", "claim", "uniforms") or not isinstance(value, (list, torch.Tensor)):
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

    def __init__(self, cfg: StepConfig, state: DeviceStepState, online: nn.Module, target: nn.Module, mode: str,
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

    def rebind(self, state: DeviceStepState) -> None:
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
