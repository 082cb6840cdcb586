"""Smoke test of the learner-option cost bench's plumbing (the full run is `python -m experiments.learner_options`)."""

from __future__ import annotations

import pytest

from experiments.learner_options import (
    base_config,
    collector_ms,
    main,
    parse_variant,
    run_options_bench,
    variant_config,
)
from shared.config import ConfigError

pytestmark = pytest.mark.experiments


def test_parse_variant_names_its_assignments() -> None:
    assert parse_variant("qr:learner.quantiles=8, learner.munchausen_alpha=0") == (
        "qr", ("learner.quantiles=8", "learner.munchausen_alpha=0"))


@pytest.mark.parametrize("text", ["noisy", "noisy:", ":learner.noisy_sigma=0.5", "base:learner.noisy_sigma=0.5",
                                  "fs:env.frame_skip=2"])
def test_parse_variant_refuses_malformed_text(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_variant(text)


def test_the_base_is_the_mario_recipe_and_a_variant_changes_only_its_fields() -> None:
    base = base_config()
    assert base.learner.munchausen_alpha > 0 and base.replay.gamma == pytest.approx(0.9)  # the Mario preset
    cfg = variant_config(base, ("learner.noisy_sigma=0.5",), "fp32", 4)
    assert cfg.learner.noisy_sigma == 0.5 and cfg.learner.batch_size == 4
    assert cfg.learner.munchausen_alpha == base.learner.munchausen_alpha and cfg.replay == base.replay


def test_collector_ms_times_a_collector_step_of_the_variant_s_network() -> None:
    cfg = variant_config(base_config(), ("learner.noisy_sigma=0.5",), "fp32", None)
    r = collector_ms(cfg, budget_s=0.01)
    assert r["calls"] >= 5 and r["wall_ms"] > 0 and r["cpu_ms"] > 0


def test_one_short_round_reports_the_base_every_variant_and_their_ratios() -> None:
    r = run_options_bench([("noisy", ("learner.noisy_sigma=0.5",))], repeats=1, seconds=0.01, batch=2)
    assert set(r["wall_ms_per_update"]) == set(r["cpu_ms_per_update"]) == {"base", "noisy"}
    assert set(r["collector_cpu_ms_per_step"]) == {"base", "noisy"}
    assert all(v > 0 for v in r["wall_ms_per_update"].values())
    assert r["details"]["collector_wall_ms"]["noisy"]["median"] > 0
    assert r["variants"] == {"base": [], "noisy": ["learner.noisy_sigma=0.5"]}
    ratio = r["ratios"]["noisy_wall_ms_vs_base"]["median"]
    assert ratio == pytest.approx(r["details"]["wall_ms"]["noisy"]["values"][0]
                                  / r["details"]["wall_ms"]["base"]["values"][0], rel=0.01)


@pytest.mark.parametrize("argv", [[], ["--variant", "x:learner.noisy_sigma=abc"], ["--variant", "x:env.frame_skip=2"],
                                  ["--variant", "a:learner.noisy_sigma=0.5", "--variant", "a:learner.quantiles=8"],
                                  ["--variant", "a:learner.noisy_sigma=0.5", "--repeats", "0"],
                                  ["--variant", "a:learner.noisy_sigma=0.5", "--seconds", "0"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
