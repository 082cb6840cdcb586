"""torch.compile path: compiled update matches eager; a failing compile falls back with ONE warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.support.learner_fakes import FakeReplay, make_learner, small_config


def test_compile_failure_falls_back_with_one_warning(monkeypatch) -> None:
    def broken_compile(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken_compile)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learner = make_learner(small_config(compile_mode="default"))
        try:
            learner.run_updates(3)
            st = learner.stats()
        finally:
            learner.close()
    compile_warnings = [w for w in caught if "torch.compile" in str(w.message)]
    assert len(compile_warnings) == 1 and "no compiler here" in str(compile_warnings[0].message)
    assert not st["compiled"] and st["updates"] == 3
    assert learner.compile_error == "RuntimeError: no compiler here"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compiled_update_matches_eager() -> None:
    """One update compiled (mode=default, CPU inductor) vs eager from the same init and batch."""
    states = {}
    for mode in ("off", "default"):
        learner = make_learner(small_config(compile_mode=mode, batch_size=8), replay=FakeReplay(seed=2), seed=3)
        try:
            stats = learner.train_step()
            states[mode] = ({k: v.clone() for k, v in learner.online.state_dict().items()}, stats, learner.stats())
        finally:
            learner.close()
    eager, compiled = states["off"], states["default"]
    assert compiled[2]["compiled"], "compilation fell back to eager on CPU"
    assert compiled[2]["compile_s"] > 0.0
    assert set(compiled[0]) == set(eager[0])  # no _orig_mod. prefixes in the state dict
    assert compiled[1]["loss"] == pytest.approx(eager[1]["loss"], rel=1e-4)
    for k in eager[0]:
        torch.testing.assert_close(compiled[0][k], eager[0][k], rtol=1e-4, atol=1e-5)
