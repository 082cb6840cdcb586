"""Input pipeline: sample the next batch while the current one trains.

The replay's `sample` and `update_priorities` must run on one thread (its reader thread), so
the prefetch thread owns *both*: the training loop takes batches from a bounded queue and
hands priority updates back through an inbox the thread drains before every sample. With
prefetching off, `SyncSource` does both inline on the caller's thread (same interface).

Copies (never more than needed):
- storage already on the learner device (GPU replay, or CPU learner + CPU replay): none; the
  replay's tensors are used as they are (micro-batches are views).
- CUDA learner, CPU storage: the thread copies into a ring of preallocated *pinned* host
  buffers and issues non_blocking host->device copies on its own CUDA stream; the consumer's
  stream waits on an event recorded after the copy, so the copy overlaps training. A pinned
  slot is reused only after its copy event completed.

Buffer lifetime: the CPU replay rotates `out_pool` (default 4) output buffers per batch size,
so a sampled batch stays valid for `out_pool - 1` further samples. With queue depth 2 at most
two samples are drawn after the batch being trained on, which fits.

`data_wait_frac` = time the training loop spent blocked in `get()` / wall time of the loop,
reported by the Learner per stats interval.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shared.batch import SampleBatch

_STOP = object()


class PrefetchError(RuntimeError):
    """The prefetch thread failed; the original exception is chained."""


def _td_numpy(td_abs: torch.Tensor | np.ndarray, ready: Any) -> np.ndarray:
    if ready is not None:
        ready.synchronize()  # CUDA event recorded after td was computed on the training stream
    if isinstance(td_abs, torch.Tensor):
        return td_abs.detach().to("cpu", torch.float32).numpy()
    return np.asarray(td_abs, dtype=np.float32)


class SyncSource:
    """No background thread: sample and update priorities on the caller's thread."""

    def __init__(self, replay: Any, batch_size: int, beta_fn: Callable[[], float], device: torch.device) -> None:
        self.replay = replay
        self.batch_size = int(batch_size)
        self.beta_fn = beta_fn
        self.device = device
        self.wait_s = 0.0  # time spent producing batches inside get() (all of it is waiting)
        self.replay_size = 0  # len(replay) at the last sample (len() is a reader-thread call)

    def get(self) -> SampleBatch:
        t0 = time.perf_counter()
        batch = self.replay.sample(self.batch_size, self.beta_fn())
        self.replay_size = len(self.replay)
        if batch.obs.device != self.device:
            batch = batch.to(self.device, non_blocking=False)
        self.wait_s += time.perf_counter() - t0
        return batch

    def update_priorities(self, indices: np.ndarray, td_abs: torch.Tensor | np.ndarray) -> None:
        self.replay.update_priorities(indices, _td_numpy(td_abs, None))

    def flush(self) -> None:
        """Nothing is pending in synchronous mode."""

    def pause(self) -> _Paused:
        return _Paused(None)

    def close(self) -> None:
        pass


class _PinnedRing:
    """Preallocated pinned host buffers for CPU->CUDA copies, reused once their copy finished."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._bufs: list[dict[str, torch.Tensor] | None] = [None] * slots
        self._events: list[Any] = [None] * slots
        self._next = 0

    def stage(self, batch: SampleBatch, device: torch.device, stream: Any) -> tuple[SampleBatch, Any]:
        k = self._next
        self._next = (k + 1) % self.slots
        if self._events[k] is not None:
            self._events[k].synchronize()  # the previous copy out of this slot is done
        names = ("obs", "actions", "returns", "discounts", "next_obs", "weights")
        bufs = self._bufs[k]
        if bufs is None or any(bufs[n].shape != getattr(batch, n).shape for n in names):
            bufs = {n: torch.empty_like(getattr(batch, n), device="cpu").pin_memory() for n in names}
            self._bufs[k] = bufs
        for n in names:
            bufs[n].copy_(getattr(batch, n))
        with torch.cuda.stream(stream):
            moved = {n: bufs[n].to(device, non_blocking=True) for n in names}
            event = torch.cuda.Event()
            event.record(stream)
        self._events[k] = event
        out = SampleBatch(moved["obs"], moved["actions"], moved["returns"], moved["discounts"],
                          moved["next_obs"], moved["weights"], batch.indices)
        return out, event


class _Paused:
    def __init__(self, source: PrefetchSource | None) -> None:
        self._source = source

    def __enter__(self) -> None:
        if self._source is not None:
            self._source._set_paused(True)

    def __exit__(self, *exc: object) -> None:
        if self._source is not None:
            self._source._set_paused(False)


class PrefetchSource:
    """Background thread that samples ahead (queue of `depth`) and applies priority updates."""

    def __init__(
        self,
        replay: Any,
        batch_size: int,
        beta_fn: Callable[[], float],
        device: torch.device,
        depth: int = 2,
    ) -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth={depth} must be >= 1")
        self.replay = replay
        self.batch_size = int(batch_size)
        self.beta_fn = beta_fn
        self.device = device
        self._out: queue.Queue = queue.Queue(maxsize=depth)
        self._inbox: queue.Queue = queue.Queue()
        self._cv = threading.Condition()
        self._paused = False
        self._idle = False  # thread acknowledged the pause (no sample in flight, inbox drained)
        self._stop = False
        self._error: BaseException | None = None
        self.wait_s = 0.0
        self.replay_size = 0  # len(replay) at the last sample (len() is a reader-thread call)
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if self._cuda else None
        self._ring = _PinnedRing(depth + 2) if self._cuda else None
        self._thread = threading.Thread(target=self._run, name="learner-prefetch", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ consumer side
    def get(self, timeout_s: float = 300.0) -> SampleBatch:
        """Next batch on the learner device; blocks (counted as data wait) until one is ready."""
        t0 = time.perf_counter()
        deadline = t0 + timeout_s
        while True:
            self._raise_if_failed()
            try:
                item = self._out.get(timeout=0.05)
                break
            except queue.Empty:
                if time.perf_counter() > deadline:
                    raise PrefetchError(f"no batch from the prefetch thread within {timeout_s:.0f} s") from None
        self._wake()
        batch, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in (batch.obs, batch.actions, batch.returns, batch.discounts, batch.next_obs, batch.weights):
                t.record_stream(current)  # allocated on the copy stream, used on this one
        self.wait_s += time.perf_counter() - t0
        return batch

    def update_priorities(self, indices: np.ndarray, td_abs: torch.Tensor | np.ndarray) -> None:
        """Hand |TD| to the thread; on CUDA it syncs on an event there, not in the training loop."""
        ready = None
        if self._cuda and isinstance(td_abs, torch.Tensor) and td_abs.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self.device))
        self._inbox.put((indices, td_abs, ready))
        self._wake()

    def flush(self, timeout_s: float = 60.0) -> None:
        """Block until every priority update handed over so far has been applied."""
        done = threading.Event()
        self._inbox.put(done)
        self._wake()
        end = time.monotonic() + timeout_s
        while not done.wait(0.05):
            self._raise_if_failed()
            if time.monotonic() > end:
                raise PrefetchError(f"priority updates not applied within {timeout_s:.0f} s")

    def pause(self) -> _Paused:
        """Context: the thread applies pending updates and stops touching the replay (for save)."""
        return _Paused(self)

    def close(self) -> None:
        """Apply pending priority updates, stop the thread, drop prefetched batches."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout=30.0)

    # ------------------------------------------------------------------ thread side
    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def _set_paused(self, paused: bool) -> None:
        with self._cv:
            self._paused = paused
            self._idle = False
            self._cv.notify_all()
            if paused:
                while not self._idle and self._thread.is_alive() and self._error is None:
                    self._cv.wait(0.05)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise PrefetchError(f"prefetch thread failed: {self._error!r}") from self._error

    def _drain_inbox(self) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            indices, td_abs, ready = item
            self.replay.update_priorities(indices, _td_numpy(td_abs, ready))

    def _run(self) -> None:
        try:
            while True:
                self._drain_inbox()
                with self._cv:
                    if self._stop:
                        break
                    if self._paused or self._out.full():
                        self._idle = self._paused
                        self._cv.notify_all()
                        self._cv.wait(0.05)
                        continue
                batch = self.replay.sample(self.batch_size, self.beta_fn())
                self.replay_size = len(self.replay)
                # own the indices: a pooled replay output may be reused before the update comes back
                batch.indices = np.array(batch.indices, dtype=np.int64, copy=True)
                event = None
                if batch.obs.device != self.device:
                    if self._cuda and batch.obs.device.type == "cpu":
                        batch, event = self._ring.stage(batch, self.device, self._stream)
                    else:
                        batch = batch.to(self.device)
                self._out.put((batch, event))
            self._drain_inbox()
        except BaseException as exc:  # surfaced to the consumer by get()/flush()/pause()
            self._error = exc
            with self._cv:
                self._cv.notify_all()
