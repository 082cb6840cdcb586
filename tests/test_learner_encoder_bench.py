"""Smoke test of the encoder cost bench's plumbing (the full run is `python -m experiments.learner_encoder`)."""

from __future__ import annotations

import pytest

from experiments.learner_encoder import collector_ms, main, run_encoder_bench, variants

pytestmark = pytest.mark.experiments


def test_variants_start_with_the_nature_cnn() -> None:
    assert variants((1, 2)) == [("nature", 1), ("impala", 1), ("impala", 2)]


def test_collector_ms_times_the_collector_forward() -> None:
    r = collector_ms("impala", 1, envs=2, threads=1, budget_s=0.01)
    assert r["calls"] >= 5 and r["wall_ms"] > 0 and r["cpu_ms"] > 0


def test_one_short_round_reports_every_variant_and_its_ratio() -> None:
    r = run_encoder_bench(repeats=1, seconds=0.01, batch=2, widths=(1,), precisions=("fp32",), envs=2)
    assert set(r["learner_ms_per_update"]) == {"nature_fp32_b2", "impala_w1_fp32_b2"}
    assert set(r["collector_ms_per_env_step"]) == {"nature", "impala_w1"}
    assert all(v > 0 for v in r["learner_ms_per_update"].values())
    assert all(v > 0 for v in r["learner_cpu_ms_per_update"].values())
    assert r["parameters"]["impala_w1"] > r["parameters"]["nature"]  # the wider torso's features: 3872 vs 3136
    ratio = r["ratios"]["learner_impala_w1_fp32_b2_vs_nature"]
    assert ratio == pytest.approx(r["learner_ms_per_update"]["impala_w1_fp32_b2"]
                                  / r["learner_ms_per_update"]["nature_fp32_b2"], rel=0.02)
    assert r["details"]["learner_precision_ran"] == {"nature_fp32_b2": "fp32", "impala_w1_fp32_b2": "fp32"}


@pytest.mark.parametrize("argv", [["--repeats", "0"], ["--widths", "0"], ["--widths", "a"], ["--seconds", "0"],
                                  ["--precisions", "fp8"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
