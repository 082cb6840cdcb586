"""The learner's optional levers on a real Learner: Munchausen and quantile (QR-DQN) targets (learner/dqn.py) and
periodic resets (learner/resets.py). Off, the update is the plain Double DQN one; on, each does what its docstring says, at the
update counts it says, and a resumed run does the same."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from launcher.__main__ import main
from learner.dqn import Munchausen, munchausen_targets
from learner.resets import HEAD_PREFIX, PeriodicReset
from shared.config import ConfigError, LearnerConfig
from tests.support.learner_fakes import FakeReplay, make_learner, small_config, state_copy

CLI_BASE = ["--profile", "cpu", "--max-seconds", "1", "--collectors", "0"]


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _adam(learner, name: str) -> dict[str, torch.Tensor]:
    param = dict(learner.online.named_parameters())[name]
    return {k: v.clone() for k, v in learner.optimizer.state[param].items()}


# ---------------------------------------------------------------------------- off: today's update
@pytest.mark.parametrize("levers", [{}, {"munchausen_tau": 0.5, "munchausen_clip": -3.0, "reset_head": False,
                                        "shrink_perturb": 0.2}], ids=["defaults", "off-with-other-knobs-set"])
def test_levers_off_is_the_plain_double_dqn_update_bit_for_bit(levers) -> None:
    """A Learner with both levers off against Double DQN written out here (same seed, same batches)."""
    updates = 5
    learner = make_learner(small_config(**levers), replay=FakeReplay(seed=5), seed=3)
    lc, rc = learner.lc, learner.replay_config
    assert lc.munchausen_alpha == 0 and lc.reset_every_updates == 0 and learner.resets is None
    online = copy.deepcopy(learner.online)
    target = copy.deepcopy(online)
    params = list(online.parameters())
    opt = torch.optim.Adam(params, lr=lc.lr, eps=lc.adam_eps, fused=True)  # the learner's kernels (make_optimizer)
    replay = FakeReplay(seed=5)
    initial = state_copy(online)
    try:
        learner.run_updates(updates)
        for u in range(1, updates + 1):
            b = replay.sample(lc.batch_size, rc.beta_start + (1.0 - rc.beta_start) * min(1.0, (u - 1) / rc.beta_steps))
            with torch.no_grad():
                best = online(b.next_obs).argmax(dim=1, keepdim=True)
                y = b.returns + b.discounts * target(b.next_obs).gather(1, best).squeeze(1)
            q = online(b.obs).gather(1, b.actions.view(-1, 1)).squeeze(1)
            loss = (b.weights * F.smooth_l1_loss(q, y, reduction="none", beta=1.0)).sum() / lc.batch_size
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, lc.max_grad_norm, foreach=True)
            opt.step()
            replay.update_priorities(b.indices, (y - q).detach().abs().numpy())
            if u % lc.target_update_every == 0:
                target.load_state_dict(online.state_dict())
        assert _equal(state_copy(learner.online), state_copy(online))
        assert _equal(state_copy(learner.target), state_copy(target))
        np.testing.assert_array_equal(learner.replay.priorities, replay.priorities)
        assert not _equal(state_copy(online), initial), "nothing was learned"
    finally:
        learner.close()


# ---------------------------------------------------------------------------- Munchausen in the learner
def test_learner_trains_on_munchausen_targets() -> None:
    """The priorities an update writes back are |y - Q(s, a)| with y the Munchausen target of the pre-update nets."""
    cfg = small_config(munchausen_alpha=0.9, munchausen_tau=0.03, munchausen_clip=-1.0, target_update_every=1000)
    learner = make_learner(cfg, replay=FakeReplay(seed=2), seed=4)
    try:
        learner.train_step()  # the target now lags the online network, so their targets differ
        online, target, probe = copy.deepcopy(learner.online), copy.deepcopy(learner.target), copy.deepcopy(
            learner.replay)
        b = probe.sample(learner.batch_per_update, learner.beta())
        stats = learner.train_step()
        with torch.no_grad():
            y = munchausen_targets(target, b.obs, b.actions, b.next_obs, b.returns, b.discounts,
                                   Munchausen(0.9, 0.03, -1.0))
            td = (y - online(b.obs).gather(1, b.actions.view(-1, 1)).squeeze(1)).abs()
        np.testing.assert_allclose(learner.replay.priorities[b.indices], td.numpy() + 1e-6, rtol=1e-5, atol=1e-6)
        assert np.isfinite(stats["loss"]) and stats["skipped"] == 0.0
    finally:
        learner.close()


def test_the_epsilon_greedy_bootstrap_starts_at_its_update() -> None:
    """learner.target_epsilon_from=2: the first two updates are the greedy-bootstrap learner's bit for bit, the third
    writes back |y - Q(s, a)| with y the epsilon-greedy Munchausen target."""
    levers = {"munchausen_alpha": 0.9, "target_update_every": 1000}
    switched = make_learner(small_config(**levers, target_epsilon=0.5, target_epsilon_from=2),
                            replay=FakeReplay(seed=2), seed=4)
    greedy = make_learner(small_config(**levers), replay=FakeReplay(seed=2), seed=4)
    for learner in (switched, greedy):  # the same weights with nonzero advantages: the policies are not uniform
        g = torch.Generator().manual_seed(9)
        with torch.no_grad():
            for p in learner.online.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.2)
        learner.target.load_state_dict(learner.online.state_dict())
    try:
        for _ in range(2):
            a, b = switched.train_step(), greedy.train_step()
            assert a["loss"] == b["loss"]
        assert _equal(state_copy(switched.online), state_copy(greedy.online))
        online, target, probe = copy.deepcopy(switched.online), copy.deepcopy(switched.target), copy.deepcopy(
            switched.replay)
        b = probe.sample(switched.batch_per_update, switched.beta())
        switched.train_step()
        greedy.train_step()
        with torch.no_grad():
            q = online(b.obs).gather(1, b.actions.view(-1, 1)).squeeze(1)
            m = Munchausen(0.9, 0.03, -1.0)
            y_eps = munchausen_targets(target, b.obs, b.actions, b.next_obs, b.returns, b.discounts, m, 0.5)
            y_greedy = munchausen_targets(target, b.obs, b.actions, b.next_obs, b.returns, b.discounts, m)
        np.testing.assert_allclose(switched.replay.priorities[b.indices], (y_eps - q).abs().numpy() + 1e-6,
                                   rtol=1e-5, atol=1e-6)
        assert (y_eps - y_greedy).abs().max() > 1e-3  # the epsilon-greedy target is not the greedy one here
    finally:
        switched.close()
        greedy.close()


# ---------------------------------------------------------------------------- QR-DQN in the learner
def test_learner_trains_on_quantile_targets() -> None:
    """learner.quantiles=8: the networks hold 8 quantiles per action, the priorities an update writes back are
    |mean T - mean theta(s, a)| of the pre-update nets, and what collectors act on is the quantiles' mean."""
    from learner.dqn import quantile_targets

    cfg = small_config(quantiles=8, target_update_every=1000)
    learner = make_learner(cfg, replay=FakeReplay(seed=2), seed=4)
    try:
        learner.train_step()  # the target now lags the online network
        online, target, probe = copy.deepcopy(learner.online), copy.deepcopy(learner.target), copy.deepcopy(
            learner.replay)
        b = probe.sample(learner.batch_per_update, learner.beta())
        stats = learner.train_step()
        with torch.no_grad():
            z = online(b.obs, quantiles=True)
            assert z.shape == (len(b), learner.spec.num_actions, 8)
            torch.testing.assert_close(online(b.obs), z.mean(dim=2))
            y = quantile_targets(lambda x: online(x, quantiles=True), lambda x: target(x, quantiles=True),
                                 b.next_obs, b.returns, b.discounts, double_q=True)
            theta = z.gather(1, b.actions.view(-1, 1, 1).expand(-1, 1, 8)).squeeze(1)
            td = (y.mean(dim=1) - theta.mean(dim=1)).abs()
        np.testing.assert_allclose(learner.replay.priorities[b.indices], td.numpy() + 1e-6, rtol=1e-5, atol=1e-6)
        assert np.isfinite(stats["loss"]) and stats["skipped"] == 0.0
    finally:
        learner.close()


# ---------------------------------------------------------------------------- resets
@pytest.mark.parametrize(("reset_head", "shrink"), [(True, 0.5), (True, 1.0), (False, 0.5)])
def test_reset_happens_exactly_at_the_multiples(reset_head: bool, shrink: float) -> None:
    """A (resets every 3) against B (no resets), same seed and batches: equal until update 3; there A's head is the
    fresh draw (or the mix), its torso the convex mix of B's and the fresh one, Adam's state of what changed is
    zero, and the target is the reset online network; afterwards the target moves only at update 6."""
    every, total = 3, 7
    knobs = {"target_update_every": 1000, "reset_head": reset_head, "shrink_perturb": shrink}
    a = make_learner(small_config(reset_every_updates=every, **knobs), replay=FakeReplay(seed=6), seed=9)
    b = make_learner(small_config(**knobs), replay=FakeReplay(seed=6), seed=9)
    try:
        target_before = state_copy(a.target)
        for u in range(1, total + 1):
            a.train_step()
            b.train_step()
            reset_now = u % every == 0
            assert a.resets.due(u) == reset_now
            assert _equal(state_copy(a.target), target_before) != reset_now, f"update {u}: target moved iff a reset"
            target_before = state_copy(a.target)
            if u < every:
                assert _equal(state_copy(a.online), state_copy(b.online))
            if not reset_now:
                continue
            assert _equal(state_copy(a.target), state_copy(a.online))
            fresh = state_copy(a.resets.fresh(u))
            if u == every:  # B holds what A held before its reset
                before = state_copy(b.online)
                for name, value in state_copy(a.online).items():
                    if reset_head and name.startswith(HEAD_PREFIX):
                        assert torch.equal(value, fresh[name]), name
                        expect_cleared = True
                    else:
                        mixed = shrink * before[name] + (1.0 - shrink) * fresh[name]
                        torch.testing.assert_close(value, mixed, rtol=1e-6, atol=1e-7)
                        expect_cleared = shrink < 1.0
                        if not expect_cleared:
                            assert torch.equal(value, before[name])
                    adam_a, adam_b = _adam(a, name), _adam(b, name)
                    if expect_cleared:
                        assert all(not v.any() for v in adam_a.values()), name
                        assert adam_b["exp_avg_sq"].any()
                    else:
                        assert _equal(adam_a, adam_b), name
            elif reset_head:
                heads = [n for n in fresh if n.startswith(HEAD_PREFIX)]
                assert all(torch.equal(state_copy(a.online)[n], fresh[n]) for n in heads)
    finally:
        a.close()
        b.close()


def test_fresh_draws_are_an_init_reproducible_and_leave_the_global_rng_alone() -> None:
    learner = make_learner(small_config(reset_every_updates=2), seed=1)
    try:
        resets = learner.resets
        assert _equal(state_copy(resets.fresh(4)), state_copy(resets.fresh(4)))
        assert not _equal(state_copy(resets.fresh(4)), state_copy(resets.fresh(6)))
        other = PeriodicReset(learner.lc, learner.build_network, base_seed=resets.base_seed + 1)
        assert not _equal(state_copy(resets.fresh(4)), state_copy(other.fresh(4)))
        assert not _equal(state_copy(resets.fresh(4)), state_copy(learner.online))
        torch.manual_seed(123)
        expected = torch.rand(4)
        torch.manual_seed(123)
        resets.fresh(2)
        assert torch.equal(torch.rand(4), expected), "a fresh draw consumed the global RNG"
        # an initialization, not arbitrary values: He-normal weights, zero biases (shared/network.py)
        for layer in resets.fresh(8).head.modules():
            if isinstance(layer, torch.nn.Linear):
                assert not layer.bias.any()
                he_std = (2.0 / layer.weight.shape[1]) ** 0.5
                if layer.weight.numel() >= 1000:
                    assert layer.weight.std().item() == pytest.approx(he_std, rel=0.15)
    finally:
        learner.close()


def test_resets_survive_checkpoint_and_resume(tmp_path) -> None:
    """5 updates straight (resets at 2 and 4) == 3 updates, a checkpoint, a new learner, 2 more."""
    cfg = small_config(reset_every_updates=2, shrink_perturb=0.5, target_update_every=1000)
    straight = make_learner(cfg, replay=FakeReplay(seed=8), seed=2)
    try:
        straight.run_updates(5)
    finally:
        straight.close()
    first = make_learner(cfg, replay=FakeReplay(seed=8), seed=2)
    try:
        first.run_updates(3)
        first.save_checkpoint(tmp_path)
    finally:
        first.close()
    resumed = make_learner(cfg, replay=first.replay, seed=2)  # the same replay object: its sampling RNG goes on
    try:
        resumed.load_checkpoint(tmp_path)
        assert resumed.updates == 3
        resumed.run_updates(1)
        assert _equal(state_copy(resumed.target), state_copy(resumed.online)), "update 4 reset and copied the target"
        resumed.run_updates(1)
        assert _equal(state_copy(resumed.online), state_copy(straight.online))
        assert _equal(state_copy(resumed.target), state_copy(straight.target))
        for name, _ in straight.online.named_parameters():
            assert _equal(_adam(resumed, name), _adam(straight, name)), name
    finally:
        resumed.close()


# ---------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(("sets", "words"), [
    (["learner.munchausen_alpha=1.5"], ["learner.munchausen_alpha=1.5", "[0.0, 1.0]"]),
    (["learner.munchausen_tau=0"], ["learner.munchausen_tau=0.0", "(0.0, 100.0]"]),
    (["learner.munchausen_clip=0.5"], ["learner.munchausen_clip=0.5"]),
    (["learner.reset_every_updates=-1"], ["learner.reset_every_updates=-1"]),
    (["learner.shrink_perturb=1.5"], ["learner.shrink_perturb=1.5", "[0.0, 1.0]"]),
    (["learner.reset_every_updates=100", "learner.reset_head=false"], ["changes nothing"]),
    (["learner.quantiles=-1"], ["learner.quantiles=-1", "[0, 1024]"]),
    (["learner.quantiles=32", "learner.munchausen_alpha=0.9"], ["learner.quantiles=32", "munchausen_alpha"]),
    (["learner.noisy_sigma=-0.5"], ["learner.noisy_sigma=-0.5", "[0.0, 10.0]"]),
    (["learner.target_epsilon=-0.1"], ["learner.target_epsilon=-0.1", "[0.0, 1.0]"]),
    (["learner.quantiles=8", "learner.munchausen_alpha=0", "learner.target_epsilon=0.05"],
     ["learner.target_epsilon=0.05", "learner.quantiles=8"]),
    (["learner.target_epsilon_from=-5"], ["learner.target_epsilon_from=-5", "[0, inf]"]),
    (["learner.target_epsilon_from=100"], ["learner.target_epsilon_from=100", "learner.target_epsilon=0"]),
    (["collectors.eps_stage_from=-1"], ["collectors.eps_stage_from=-1", "[0, inf]"]),
    (["collectors.eps_stage=1.5"], ["collectors.eps_stage=1.5", "[0.0, 1.0]"]),
    (["collectors.explore_repeat_mu=1"], ["collectors.explore_repeat_mu=1.0", "(1.0, 100.0]"]),
    (["collectors.explore_repeat_max=0"], ["collectors.explore_repeat_max=0", "[1, 100000]"]),
])
def test_bad_lever_settings_are_one_error_line_and_status_2(sets, words, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    code = main([*CLI_BASE, "--run-dir", str(run_dir), *(arg for s in sets for arg in ("--set", s))])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not run_dir.exists()


def test_levers_are_off_by_default_and_valid_in_every_step_mode() -> None:
    lc = LearnerConfig()
    assert lc.munchausen_alpha == 0.0 and lc.reset_every_updates == 0 and lc.target_epsilon == 0.0
    for mode in ("device", "captured"):  # the device step trains with them (tests/test_device_step.py)
        every = small_config(step_mode=mode, reset_every_updates=10, noisy_sigma=0.5)
        assert every.check_valid() is every
    ok = replace(small_config(), learner=replace(small_config().learner, munchausen_alpha=0.9,
                                                  reset_every_updates=10, shrink_perturb=0.5))
    assert ok.check_valid() is ok
    with pytest.raises(ConfigError, match="learner.reset_every_updates"):
        replace(ok, learner=replace(ok.learner, reset_head=False, shrink_perturb=1.0)).check_valid()
