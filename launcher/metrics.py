"""Run metrics: TensorBoard scalars, a JSON-lines file and the ``[MAIN]`` progress line.

The head calls `MetricsLogger.log(stats)` once per logging interval with one flat dict
merging its own counters (env_steps, episodes, mean_return_20, x_pos, flag_get, epsilon,
weight version lag, ...) and `Learner.stats()`. Each call:

1. appends one JSON object to ``run_dir/metrics.jsonl`` -- always with the keys in
   `REQUIRED_KEYS` (null when unknown) plus everything else given; non-finite floats become
   null (strict JSON); rates missing from the dict are derived from the previous call;
2. writes every numeric value as a TensorBoard scalar (``run_dir/tb``) when tensorboard is
   importable, tagged ``<group>/<key>``, at global step = env_steps (one x-axis for all
   curves; updates when env_steps is absent);
3. returns (and prints, when print_fn is given) the ``[MAIN]`` line (also `main_line(stats)`):

   ``[MAIN] Epoch 100 - Loss: 0.0234, TD Error: 0.0156, Reward: 125.50, Distance: 1523.4, Epsilon: 0.750, Buffer: 45,000``

   Epoch = learner updates // `epoch_updates` (default 1: Epoch is the update count);
   Distance = mean_x_pos_20 (or x_pos), Epsilon = epsilon (or epsilon_mean), Buffer = replay_size.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shared.config import LoggingConfig

REQUIRED_KEYS = (
    "time", "env_steps", "updates", "replay_size", "env_steps_per_s", "updates_per_s", "mean_return_20",
)

# key -> TensorBoard group; anything else goes under "stats/"
_GROUPS = {
    "loss": "learner", "td_error": "learner", "mean_q": "learner", "grad_norm": "learner",
    "updates_per_s": "learner", "samples_per_s": "learner", "data_wait_frac": "learner",
    "replay_ratio": "learner", "compile_s": "learner", "beta": "learner", "lr": "learner",
    "replay_size": "replay", "transitions_added": "replay",
    "mean_return_20": "episode", "episode_return": "episode", "x_pos": "episode", "mean_x_pos_20": "episode",
    "mean_x_pos_20_greedy": "episode", "mean_return_20_greedy": "episode", "flag_rate_20_greedy": "episode",
    "flag_get": "episode", "flag_rate_20": "episode", "episodes": "episode",
    "best_x_pos": "episode", "flags": "episode",
    "epsilon": "actors", "epsilon_mean": "actors", "env_steps_per_s": "actors", "weight_version_lag": "actors",
    "weight_lag": "actors", "weight_version": "actors", "env_steps": "actors", "collectors_alive": "actors",
    "collectors_waiting": "actors", "collectors_delivered": "actors",
}

_RATES = (("env_steps", "env_steps_per_s"), ("updates", "updates_per_s"), ("samples", "samples_per_s"))


def _jsonable(value: Any) -> Any:
    """Plain JSON types; numpy/torch scalars via .item(); non-finite floats -> None."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _num(d: Mapping[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = d.get(k)
        if v is None or isinstance(v, bool):
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            return f
    return None


def format_main_line(d: Mapping[str, Any], epoch_updates: int = 1) -> str:
    """The `[MAIN]` line (the format of the original single-process Mario DQN); unknown values print as n/a."""
    updates = _num(d, "updates")
    epoch = int(updates) // max(1, epoch_updates) if updates is not None else 0

    def fmt(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    buffer = _num(d, "replay_size")
    return (
        f"[MAIN] Epoch {epoch} - Loss: {fmt(_num(d, 'loss'), '.4f')}, TD Error: {fmt(_num(d, 'td_error'), '.4f')}, "
        f"Reward: {fmt(_num(d, 'mean_return_20'), '.2f')}, Distance: {fmt(_num(d, 'mean_x_pos_20', 'x_pos'), '.1f')}, "
        f"Epsilon: {fmt(_num(d, 'epsilon', 'epsilon_mean'), '.3f')}, Buffer: {fmt(None if buffer is None else int(buffer), ',')}"
    )


class MetricsLogger:
    """One interval's metrics to JSON lines, TensorBoard and the [MAIN] line."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        logging_config: LoggingConfig | None = None,
        *,
        tensorboard: bool | None = None,
        print_fn: Callable[[str], None] | None = None,
        epoch_updates: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`logging_config` supplies `tensorboard` unless it is given explicitly (neither: on).

        `print_fn=None` (default): `log` only returns the [MAIN] line (the head prints it via
        `main_line`); pass `print` to have `log` print it.
        """
        if tensorboard is None:
            tensorboard = logging_config.tensorboard if logging_config is not None else True
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self.print_fn = print_fn
        self.epoch_updates = max(1, int(epoch_updates))
        self._clock = clock
        self._prev: dict[str, float] = {}
        self.writer: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(self.run_dir / "tb"))
            except Exception as exc:  # tensorboard missing or broken: JSON lines still work
                warnings.warn(f"TensorBoard disabled: {exc}", RuntimeWarning, stacklevel=2)

    def main_line(self, stats: Mapping[str, Any]) -> str:
        """The [MAIN] line for `stats` (no side effects)."""
        return format_main_line(stats, self.epoch_updates)

    def log(self, stats: Mapping[str, Any]) -> str:
        """Record one interval; returns the [MAIN] line (also printed via print_fn)."""
        now = float(stats["time"]) if _num(stats, "time") is not None else self._clock()
        record: dict[str, Any] = {k: None for k in REQUIRED_KEYS}
        record.update({str(k): _jsonable(v) for k, v in stats.items()})
        record["time"] = now
        for count_key, rate_key in _RATES:
            count = _num(record, count_key)
            if record.get(rate_key) is None and count is not None and "time" in self._prev and count_key in self._prev:
                dt = now - self._prev["time"]
                if dt > 0:
                    record[rate_key] = (count - self._prev[count_key]) / dt
            if count is not None:
                self._prev[count_key] = count
        self._prev["time"] = now
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()
        if self.writer is not None:
            step_f = _num(record, "env_steps", "updates")
            step = int(step_f) if step_f is not None else None
            try:
                for key, value in record.items():
                    if key == "time" or not isinstance(value, (int, float)):
                        continue  # strings (ratio_state) and nulls are JSON-only; bools plot as 0/1
                    self.writer.add_scalar(f"{_GROUPS.get(key, 'stats')}/{key}", float(value), global_step=step,
                                           walltime=now)
                self.writer.flush()
            except OSError as exc:  # its writer thread reopens the file at each write (e.g. EMFILE): a view only
                warnings.warn(f"TensorBoard disabled: {exc}", RuntimeWarning, stacklevel=2)
                writer, self.writer = self.writer, None
                with contextlib.suppress(Exception):
                    writer.close()
        line = format_main_line(record, self.epoch_updates)
        if self.print_fn is not None:
            self.print_fn(line)
        return line

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
