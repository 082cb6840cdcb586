"""Smoke test of the learner benchmark plumbing (the full run is `python -m bench.learner`)."""

from __future__ import annotations

import pytest
import torch

from bench.learner import NUM_ACTIONS, OBS_SHAPE, STACK, RandomReplay, _measure
from shared.config import Config, LearnerConfig


def test_random_replay_batches_look_like_the_replay() -> None:
    b = RandomReplay("cpu", pool=64).sample(8)
    assert b.obs.shape == (8, STACK, *OBS_SHAPE) and b.obs.dtype == torch.uint8
    assert b.next_obs.shape == b.obs.shape and b.indices.shape == (8,)
    assert int(b.actions.max()) < NUM_ACTIONS and b.weights.dtype == torch.float32


def test_measure_times_real_updates() -> None:
    cfg = Config(learner=LearnerConfig(device="cpu", batch_size=4, precision="fp32", warmup_transitions=0,
                                       samples_per_insert=0.0, hidden=32))
    r = _measure(cfg, torch.device("cpu"), RandomReplay("cpu", pool=64), budget_s=0.05, min_updates=2, warmup=1)
    assert r["updates"] >= 2 and r["learner_updates"] == r["updates"] + 1  # the learner's own count, warmup included
    assert r["weights_moved"] and r["precision"] == "fp32" and not r["compiled"]
    assert 0.0 <= r["data_wait_frac"] <= 1.0


def test_threads_table_measures_each_pair_and_restores_threads() -> None:
    from bench.learner import measurable_threads, run_threads_bench

    assert measurable_threads(16) == (1, 2, 4, 8) and measurable_threads(2) == (1, 2) and measurable_threads(1) == (1,)
    saved = torch.get_num_threads()
    out = run_threads_bench(threads=(1, 2), precisions=("fp32",), repeats=2, seconds=0.05, batch=4)
    assert torch.get_num_threads() == saved
    assert set(out["learner_updates_per_s_by_threads"]) == {"fp32_t1", "fp32_t2"}
    assert all(len(s["values"]) == 2 and s["median"] > 0 for s in out["learner_threads_spread"].values())
    assert out["threads_settings"]["threads"] == [1, 2] and len(out["threads_settings"]["load_average_start"]) == 3


def test_threads_cli_refuses_bad_counts(capsys) -> None:
    from bench.learner import main

    with pytest.raises(SystemExit) as exc:
        main(["--by-threads", "0,2"])
    assert exc.value.code == 2 and "--by-threads" in capsys.readouterr().err


def test_split_from_measured_names_the_measured_threads() -> None:
    from bench.learner import split_from_measured

    values = {"bf16_t1": [30.0, 31.0], "bf16_t2": [50.0], "bf16_t4": [80.0], "bf16_t8": [90.0]}
    reason = split_from_measured(values, (1, 2, 4, 8), ("bf16",), cores=16)["bf16"]
    assert reason.startswith("16 cores, bf16 learner: 8 torch thread(s)") and "projected" not in reason
