"""The learner's one update tail (learner/step.py `apply_gradients`), on a small network with hand-set gradients:
clipping reports the pre-clip norm, torch's fused Adam kernel and the traceable formula step alike and as
torch.optim.Adam (with weight decay, AdamW) does, a non-finite or all-stale update changes nothing but the counters, and the target follows
its period whether the host or the device holds the count."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from learner.precision import PrecisionPolicy
from learner.step import StepConfig, apply_gradients, bind_step_state, sync_target

CFG = StepConfig(batch=4, micro=4, accum=1, stack=1, prioritized=True, alpha=0.6, priority_eps=1e-6, beta_start=0.4,
                 beta_steps=10, double_q=True, max_grad_norm=1.0, target_update_every=3, polyak_tau=0.0,
                 adam_beta1=0.9, adam_beta2=0.999, adam_eps=1e-4, device_type="cpu", autocast_dtype=None,
                 use_scaler=False)
FP32 = PrecisionPolicy("fp32", "cpu", None, False)


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    online = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    target = copy.deepcopy(online)
    optimizer = torch.optim.Adam(list(online.parameters()), lr=1e-2, eps=1e-4, fused=True)
    state = bind_step_state(online, target, optimizer, torch.amp.GradScaler("cpu", enabled=False), FP32,
                            meter_sums=torch.zeros(4), skipped=torch.zeros((), dtype=torch.int64), updates=0, batch=4)
    return online, target, optimizer, state


def _grads(params, scale: float, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) * scale for p in params]


def _apply(cfg, state, grads, loss=0.5, fresh=None, host_updates=None):
    return apply_gradients(cfg, state, grads, torch.tensor(loss), torch.ones(4), torch.tensor(2.0), fresh, host_updates)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernel", "traced-formula"])
@pytest.mark.parametrize("decay", [0.0, 0.5], ids=["adam", "adamw"])
def test_an_update_clips_to_the_norm_and_steps_as_torch_adam(fused: bool, decay: float) -> None:
    online, _, _, state = _parts()
    reference = copy.deepcopy(online)
    ref_opt = (torch.optim.AdamW(list(reference.parameters()), lr=1e-2, eps=1e-4, weight_decay=decay) if decay else
               torch.optim.Adam(list(reference.parameters()), lr=1e-2, eps=1e-4))
    norms = []
    for k in range(3):
        grads = _grads(state.params, scale=10.0, seed=k)
        expected_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        for p, g in zip(reference.parameters(), grads, strict=True):
            p.grad = g.clone()
        torch.nn.utils.clip_grad_norm_(list(reference.parameters()), CFG.max_grad_norm)
        ref_opt.step()
        grad_norm, applied = _apply(replace(CFG, fused_adam=fused, weight_decay=decay), state, [g.clone() for g in grads])
        assert bool(applied) and float(grad_norm) == pytest.approx(float(expected_norm), rel=1e-6)
        assert expected_norm > 10 * CFG.max_grad_norm  # clipping mattered
        norms.append(float(expected_norm))
    for p, r in zip(online.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-7)
    assert int(state.updates) == 3 and int(state.skipped) == 0 and float(state.adam_steps[0]) == 3.0
    assert float(state.meter_sums[3]) == pytest.approx(sum(norms), rel=1e-6)  # the meter's grad-norm sum


@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernel", "traced-formula"])
@pytest.mark.parametrize("case", ["nan-gradient", "infinite-loss", "no-fresh-row"])
def test_a_non_finite_or_stale_update_changes_nothing_but_the_counters(fused: bool, case: str) -> None:
    online, target, optimizer, state = _parts()
    cfg = replace(CFG, fused_adam=fused)
    _apply(cfg, state, _grads(state.params, 1.0))  # Adam has moments to keep
    before = [t.clone() for t in (*state.params, *state.exp_avg, *state.exp_avg_sq, *state.adam_steps)]
    sums = state.meter_sums.clone()
    grads = _grads(state.params, 1.0, seed=7)
    loss, fresh = 0.5, None
    if case == "nan-gradient":
        grads[0][0, 0] = float("nan")
    elif case == "infinite-loss":
        loss = float("inf")
    else:
        fresh = torch.zeros(4, dtype=torch.bool)
    _, applied = _apply(cfg, state, grads, loss=loss, fresh=fresh)
    assert not bool(applied)
    after = [*state.params, *state.exp_avg, *state.exp_avg_sq, *state.adam_steps]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert int(state.skipped) == 1 and int(state.updates) == 2 and torch.equal(state.meter_sums, sums)


def test_the_target_follows_its_period_whether_the_host_or_the_device_counts() -> None:
    for host in (True, False):
        online, target, _, state = _parts()
        for u in range(6):
            with torch.no_grad():
                for p in online.parameters():
                    p.add_(1.0)
            sync_target(CFG, state, u + 1 if host else torch.tensor(u + 1))
            copied = all(torch.equal(t, o) for t, o in zip(target.parameters(), online.parameters(), strict=True))
            assert copied == ((u + 1) % CFG.target_update_every == 0), (host, u)
    online, target, _, state = _parts()
    start = [t.clone() for t in target.parameters()]
    with torch.no_grad():
        for p in online.parameters():
            p.add_(4.0)
    sync_target(replace(CFG, polyak_tau=0.25), state, 1)
    for t, s0, o in zip(target.parameters(), start, online.parameters(), strict=True):
        torch.testing.assert_close(t, s0 + 0.25 * (o - s0))
