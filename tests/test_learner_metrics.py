"""MetricsLogger: JSON lines, the [MAIN] line, TensorBoard scalars."""

from __future__ import annotations

import json
import math

import pytest

from launcher.metrics import REQUIRED_KEYS, MetricsLogger, format_main_line


def test_main_line_format() -> None:
    line = format_main_line({"updates": 100, "loss": 0.0234, "td_error": 0.0156, "mean_return_20": 125.5,
                             "mean_x_pos_20": 1523.4, "epsilon": 0.75, "replay_size": 45000})
    assert line == ("[MAIN] Epoch 100 - Loss: 0.0234, TD Error: 0.0156, Reward: 125.50, Distance: 1523.4, "
                    "Epsilon: 0.750, Buffer: 45,000")
    assert format_main_line({"updates": 250}, epoch_updates=100).startswith("[MAIN] Epoch 2 - Loss: n/a")
    assert "Epsilon: 0.125" in format_main_line({"epsilon_mean": 0.125})


def test_jsonl_records_and_derived_rates(tmp_path) -> None:
    times = iter([100.0, 110.0])
    printed: list[str] = []
    with MetricsLogger(tmp_path, tensorboard=False, print_fn=printed.append, clock=lambda: next(times)) as log:
        log.log({"env_steps": 1000, "updates": 10, "replay_size": 500, "loss": float("nan"), "ratio_state": "training"})
        log.log({"env_steps": 3000, "updates": 30, "replay_size": 900, "mean_return_20": 12.0, "flag_get": True})
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert set(REQUIRED_KEYS) <= set(row)
    assert rows[0]["loss"] is None and rows[0]["env_steps_per_s"] is None  # NaN -> null; no rate yet
    assert rows[1]["env_steps_per_s"] == pytest.approx(200.0) and rows[1]["updates_per_s"] == pytest.approx(2.0)
    assert rows[1]["time"] == 110.0 and rows[1]["flag_get"] is True
    assert printed[1].startswith("[MAIN] Epoch 30 - ") and "Buffer: 900" in printed[1]


def test_tensorboard_scalars_written(tmp_path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from shared.config import Config

    with MetricsLogger(tmp_path, Config().logging) as log:  # tensorboard on by default in LoggingConfig
        assert log.writer is not None
        log.log({"env_steps": 50, "updates": 5, "loss": 0.5, "data_wait_frac": 0.1, "x_pos": 300.0,
                 "ratio_state": "training"})
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"learner/loss", "learner/data_wait_frac", "episode/x_pos", "actors/env_steps"} <= tags
    assert not any("ratio_state" in t for t in tags)  # strings are JSON-only
    (event,) = acc.Scalars("learner/loss")
    assert event.step == 50 and math.isclose(event.value, 0.5)


def test_update_meter_windows_and_caching() -> None:
    import torch

    from learner.metering import UpdateMeter

    now = [0.0]
    meter = UpdateMeter("cpu", window_s=10.0, min_period_s=0.5, clock=lambda: now[0])
    one = torch.tensor(1.0)
    for _ in range(4):  # t=0..: 4 updates of 8 samples, loss 1, td sum 8, 0.25 s each of which 0.05 s waiting
        meter.add(one, one * 8, one * 16, one * 3, samples=8, loop_s=0.25)
    now[0] = 2.0
    r = meter.read(wait_s=0.2)
    assert r["loss"] == 1.0 and r["td_error"] == 1.0 and r["mean_q"] == 2.0 and r["grad_norm"] == 3.0
    assert r["updates_per_s"] == 2.0 and r["samples_per_s"] == 16.0 and r["data_wait_frac"] == pytest.approx(0.2)
    meter.add(one * 5, one, one, one, samples=8, loop_s=0.25)
    now[0] = 2.2
    assert meter.read(0.2) == r  # cached within min_period_s
    now[0] = 13.0  # window: deltas against the snapshot at t=2
    r2 = meter.read(0.2)
    assert r2["loss"] == 5.0 and r2["updates_per_s"] == pytest.approx(1 / 11)
    now[0] = 30.0
    r3 = meter.read(0.2)  # nothing new: rates 0, means kept
    assert r3["updates_per_s"] == 0.0 and r3["loss"] == 5.0
