"""Temporally extended epsilon-greedy (actors/action_repeat.py): holds, their lengths, and a collector using it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

import envs.testing  # noqa: F401
from actors.action_repeat import ActionRepeat
from actors.collector import Collector
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig
from tests.support.fake_link import FakeLink


def runs_of(actions: np.ndarray) -> list[int]:
    """Lengths of the runs of equal consecutive actions."""
    cuts = np.flatnonzero(np.diff(actions)) + 1
    return np.diff(np.concatenate([[0], cuts, [len(actions)]])).tolist()


def test_an_exploratory_draw_holds_its_action_and_greedy_resumes_after() -> None:
    rng = np.random.default_rng(0)
    rep = ActionRepeat(2, mu=2.0, max_steps=5, rng=rng)
    out = rep.actions(np.array([True, False]), np.array([3, 2]), np.array([0, 0]))
    assert out.tolist()[1] == 0 and out[0] == 3  # stream 1 did not explore: greedy
    held = int(rep.left[0]) + 1  # this step and what is left
    assert 1 <= held <= 5
    for _ in range(held - 1):  # the hold ignores the draws and the network until it ends
        assert rep.actions(np.array([False, False]), np.array([1, 1]), np.array([0, 0]))[0] == 3
    assert rep.actions(np.array([False, False]), np.array([1, 1]), np.array([0, 0]))[0] == 0
    rep.action[0], rep.left[0] = 2, 3  # a hold in progress when the episode ends
    rep.end_episode(0)
    assert rep.left[0] == 0
    assert rep.actions(np.array([False, False]), np.array([1, 1]), np.array([0, 0]))[0] == 0  # not held into it


def test_hold_lengths_follow_the_capped_zeta_distribution() -> None:
    """Always exploring: every hold is one run of one action; P(n = 1) = 1 / zeta(2) = 0.608 at mu = 2, and
    none is longer than the cap."""
    rng = np.random.default_rng(1)
    rep = ActionRepeat(1, mu=2.0, max_steps=20, rng=rng)
    lengths, current = [], 0
    for t in range(40_000):
        before = int(rep.left[0])
        rep.actions(np.array([True]), np.array([t % 7]), np.array([0]))
        if before == 0:  # a new hold started this step
            if current:
                lengths.append(current)
            current = 0
        current += 1
    lengths = np.array(lengths)
    assert lengths.max() <= 20 and len(lengths) > 10_000
    assert abs((lengths == 1).mean() - 6 / np.pi**2) < 0.02
    assert abs((lengths == 2).mean() - 6 / np.pi**2 / 4) < 0.02


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="mu > 1"):
        ActionRepeat(1, mu=1.0, max_steps=10, rng=np.random.default_rng())
    with pytest.raises(ValueError, match="at least 1"):
        ActionRepeat(1, mu=2.0, max_steps=0, rng=np.random.default_rng())


@pytest.mark.parametrize("mu", [0.0, 2.0])
def test_a_collector_holds_exploratory_actions_only_when_asked(mu: float) -> None:
    """A stream exploring every step (epsilon 1) on a flat Q: plain epsilon-greedy draws every action anew
    (runs of one action average 4/3 over the counting env's 4 actions), ez-greedy holds them (longer runs);
    the greedy stream (epsilon 0) is untouched either way."""
    link = FakeLink()
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(envs_per_collector=2, chunk_steps=16, explore_repeat_mu=mu,
                                             explore_repeat_max=50),
                  learner=LearnerConfig(hidden=16))
    col = Collector(cfg, collector_id=1, epsilon=[1.0, 0.0], link=link, seed=3)
    assert (col.repeat is None) == (mu == 0)
    with torch.no_grad():
        for p in col.net.parameters():
            p.zero_()
    col.run(max_steps=400)
    col.close()
    actions = {k: np.concatenate([c.actions[c.actions >= 0] for c in link.chunks if c.stream == k]) for k in (0, 1)}
    assert len(actions[0]) > 300 and (actions[1] == 0).all()
    mean_run = float(np.mean(runs_of(actions[0])))
    if mu == 0:
        assert 1.1 < mean_run < 1.6
    else:
        assert mean_run > 2.0
