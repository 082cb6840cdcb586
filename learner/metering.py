"""Windowed means and rates of learner updates, without a host sync per update."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch


class UpdateMeter:
    """Windowed means and rates of learner updates; cheap to query as often as a loop likes.

    Why: the head asks `Learner.stats()` from several places (its loop, the log line, the
    summary). Per update, `add` only does device-side adds (no host sync on CUDA); `read`
    folds those into float64 totals at most every `min_period_s` (one sync) and otherwise
    returns the cached values. Means and rates are deltas against the newest snapshot at least
    `window_s` old (or the oldest kept), i.e. they describe roughly the last `window_s`
    seconds; with no update in the window the last known means are kept.
    """

    _KEYS = ("loss", "td_error", "mean_q", "grad_norm")

    def __init__(self, device: Any, window_s: float = 10.0, min_period_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:

        self.window_s, self.min_period_s, self._clock = float(window_s), float(min_period_s), clock
        self._dev = torch.zeros(4, dtype=torch.float32, device=device)
        self._torch = torch
        self._totals = [0.0, 0.0, 0.0, 0.0]  # loss sum, td sum, q sum, grad-norm sum (float64)
        self.updates, self.samples, self.loop_s = 0, 0, 0.0
        now = clock()
        self._snaps: list[tuple[float, list[float], int, int, float, float]] = [(now, [0.0] * 4, 0, 0, 0.0, 0.0)]
        self._last_means: dict[str, float | None] = {k: None for k in self._KEYS}
        self._cache: dict[str, Any] | None = None
        self._cache_t = -math.inf

    @property
    def last_refresh(self) -> float:
        """Clock time of the last real (non-cached) read."""
        return self._cache_t

    def add(self, loss: Any, td_sum: Any, q_sum: Any, grad_norm: Any, samples: int, loop_s: float) -> None:
        """One update's values (0-dim tensors on the learner device) and host-side counts."""
        self._dev += self._torch.stack([loss.float(), td_sum.float(), q_sum.float(), grad_norm.float()])
        self.updates += 1
        self.samples += int(samples)
        self.loop_s += float(loop_s)

    @property
    def device_sums(self) -> Any:
        """The float32 [4] device tensor (loss, |TD| sum, Q sum, grad-norm sum) that `read` folds and zeroes:
        a device-resident update adds its values into it in place and reports only counts (`count`)."""
        return self._dev

    def count(self, samples: int, loop_s: float) -> None:
        """One update whose values were added into `device_sums` on the device."""
        self.updates += 1
        self.samples += int(samples)
        self.loop_s += float(loop_s)

    def read(self, wait_s: float) -> dict[str, Any]:
        """loss, td_error, mean_q, grad_norm, updates_per_s, samples_per_s, data_wait_frac."""
        now = self._clock()
        if self._cache is not None and now - self._cache_t < self.min_period_s:
            return dict(self._cache)
        folded = self._dev.double().cpu().tolist()
        self._dev.zero_()
        self._totals = [a + b for a, b in zip(self._totals, folded, strict=True)]
        earlier = self._snaps
        base = earlier[0]
        for snap in earlier:
            if snap[0] <= now - self.window_s:
                base = snap
        self._snaps = [s for s in earlier if s[0] >= base[0]]
        self._snaps.append((now, list(self._totals), self.updates, self.samples, self.loop_s, float(wait_s)))
        t0, tot0, n0, s0, loop0, wait0 = base
        dn, ds, dt = self.updates - n0, self.samples - s0, max(1e-9, now - t0)
        if dn > 0:
            d = [a - b for a, b in zip(self._totals, tot0, strict=True)]
            self._last_means = {"loss": d[0] / dn, "td_error": d[1] / max(1, ds), "mean_q": d[2] / max(1, ds),
                                "grad_norm": d[3] / dn}
        dloop = self.loop_s - loop0
        out: dict[str, Any] = dict(self._last_means)
        out.update({
            "updates_per_s": dn / dt,
            "samples_per_s": ds / dt,
            "data_wait_frac": min(1.0, max(0.0, (float(wait_s) - wait0) / dloop)) if dloop > 0 else 0.0,
        })
        self._cache, self._cache_t = out, now
        return dict(out)
