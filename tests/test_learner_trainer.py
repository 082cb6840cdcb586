"""The Learner API: warmup/ratio gating, prefetch thread roles, broadcasts, stats."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

from envs.spec import EnvSpec
from tests.support.learner_fakes import FakeReplay, learner_of, make_learner, small_config


def test_maybe_train_waits_for_warmup_then_respects_ratio() -> None:
    replay = FakeReplay(transitions_added=0)
    learner = make_learner(small_config(warmup_transitions=50, samples_per_insert=1.0, batch_size=8), replay=replay)
    try:
        assert learner.maybe_train(idle_sleep_s=0) == 0
        assert learner.stats()["ratio_state"] == "warming_up"
        assert replay.samples_drawn == 0  # nothing sampled before warmup
        replay.transitions_added = 50  # origin; slack = 2 batches = 16 samples
        assert learner.maybe_train(max_updates=10, time_budget_s=10) == 2
        assert learner.stats()["ratio_state"] == "throttled"
        replay.transitions_added = 50 + 24  # 24 more samples allowed = 3 updates
        assert learner.maybe_train(max_updates=10, time_budget_s=10) == 3
        assert learner.samples == 40
    finally:
        learner.close()


def test_prefetch_thread_owns_sample_and_priority_updates() -> None:
    replay = FakeReplay()
    learner = make_learner(small_config(prefetch=True, grad_accum_steps=2), replay=replay)
    try:
        for _ in range(6):
            learner.train_step()
        learner._source.flush()
        assert replay.updates_applied == 6
        assert len(replay.sample_threads) == 1
        assert replay.sample_threads == replay.update_threads
        assert threading.get_ident() not in replay.sample_threads
        st = learner.stats()
        assert 0.0 <= st["data_wait_frac"] <= 1.0
        assert st["updates"] == 6 and st["samples"] == 6 * 16
        assert st["replay_size"] == len(replay)
    finally:
        learner.close()
    assert not learner._source._thread.is_alive()


def test_sync_source_uses_caller_thread() -> None:
    replay = FakeReplay()
    learner = make_learner(small_config(prefetch=False), replay=replay)
    try:
        learner.train_step()
        assert replay.sample_threads == replay.update_threads == {threading.get_ident()}
    finally:
        learner.close()


def test_priorities_change_after_update() -> None:
    replay = FakeReplay()
    learner = make_learner(small_config(), replay=replay)
    try:
        before = replay.priorities.copy()
        learner.train_step()
        assert (replay.priorities != before).sum() > 0
    finally:
        learner.close()


def test_weight_broadcast_versions() -> None:
    calls: list[tuple[int, dict]] = []
    learner = make_learner(small_config(weight_broadcast_every=3),
                           on_weights=lambda v, sd: calls.append((v, {k: t.clone() for k, t in sd.items()})))
    try:
        learner.maybe_train(max_updates=7, time_budget_s=60)
        assert [v for v, _ in calls] == [0, 3, 6]  # version = updates at publication
        assert set(calls[0][1]) == set(learner.online.state_dict())
        assert not torch.equal(calls[0][1]["head.advantage.2.weight"], calls[2][1]["head.advantage.2.weight"])
        assert learner.stats()["weight_version"] == 6
    finally:
        learner.close()


def test_prefetch_error_surfaces_in_training_loop() -> None:
    class Broken(FakeReplay):
        def sample(self, batch_size, beta=0.4):
            raise RuntimeError("replay exploded")

    learner = make_learner(small_config(prefetch=True), replay=Broken())
    try:
        with pytest.raises(RuntimeError, match="replay exploded"):
            learner.train_step()
    finally:
        learner.close()


def test_stats_keys_and_interval_reset() -> None:
    learner = make_learner()
    try:
        learner.run_updates(3)
        st = learner.stats()
        for key in ("loss", "td_error", "mean_q", "grad_norm", "updates", "samples", "updates_per_s",
                    "samples_per_s", "data_wait_frac", "ratio_state", "replay_ratio", "compile_s", "beta",
                    "weight_version", "precision"):
            assert key in st, key
        assert np.isfinite(st["loss"]) and st["updates_per_s"] > 0
        assert learner.stats() == st  # cached for meter.min_period_s: cheap to poll
        learner.meter.window_s = learner.meter.min_period_s = 0.0
        learner.stats()
        again = learner.stats()  # no update since the previous read
        assert again["updates_per_s"] == 0.0 and again["loss"] == st["loss"]  # last means kept
    finally:
        learner.close()


def test_replay_returning_wrong_size_is_an_error() -> None:
    class Short(FakeReplay):
        def sample(self, batch_size, beta=0.4):
            return super().sample(batch_size - 1, beta)

    learner = make_learner(replay=Short())
    try:
        with pytest.raises(ValueError, match="batch_size x grad_accum_steps"):
            learner.train_step()
    finally:
        learner.close()


def test_vector_observations_train() -> None:
    """Low-dimensional observations ([B, 1, D], MLP torso) go through the same update."""
    replay = FakeReplay(obs_shape=(6,), stack=1, num_actions=3)
    learner = make_learner(small_config(batch_size=16), replay=replay)
    try:
        learner.run_updates(3)
        assert np.isfinite(learner.stats()["loss"])
        assert not learner.channels_last
    finally:
        learner.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("storage", ["cpu", "cuda"])
def test_cuda_learner_pinned_and_device_storage(storage: str) -> None:
    """CUDA: CPU storage goes through pinned buffers + side-stream copies; GPU storage is used as is."""
    from bench.learner import SPEC, RandomReplay

    replay = RandomReplay(storage)
    cfg = small_config(device="cuda", precision="auto", prefetch=True, batch_size=64, grad_accum_steps=2)
    learner = learner_of(cfg, SPEC, replay, torch.device("cuda"))
    try:
        learner.run_updates(5)
        st = learner.stats()
        assert st["precision"] == "fp16" and np.isfinite(st["loss"]) and st["updates"] == 5
        assert learner.channels_last
    finally:
        learner.close()


class SanitizingReplay(FakeReplay):
    """Records every |TD| handed back and, like ReplayBuffer, drops the non-finite ones."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.td_seen: list[np.ndarray] = []

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        self.td_seen.append(np.array(td_abs))
        keep = np.isfinite(td_abs)
        super().update_priorities(indices[keep], td_abs[keep])


def _snapshot(learner) -> dict[str, torch.Tensor]:
    """Online weights plus every Adam state tensor (moments and step counts)."""
    out = {f"online/{k}": v.clone() for k, v in learner.online.state_dict().items()}
    for pid, entry in learner.optimizer.state_dict()["state"].items():
        out.update({f"optimizer/{pid}/{k}": v.clone() for k, v in entry.items()})
    return out


def _changed(learner, before: dict[str, torch.Tensor]) -> list[str]:
    now = _snapshot(learner)
    assert set(now) == set(before)
    return [k for k, v in now.items() if not torch.equal(v, before[k])]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_loss_skips_the_update_on_the_host(bad: float) -> None:
    """inf targets matter on their own: the Huber gradient stays finite (-1) for an infinite target,
    so only the loss check stops a step that would otherwise train on it."""
    replay = FakeReplay()
    learner = make_learner(replay=replay)
    try:
        learner.train_step()  # Adam has state now, so a skipped step must leave it untouched too
        before, priorities, applied = _snapshot(learner), replay.priorities.copy(), replay.updates_applied
        finite_returns = replay.returns.copy()
        replay.returns[:] = bad
        with pytest.warns(RuntimeWarning, match="skipped an optimizer update whose loss or gradient norm"):
            out = learner.train_step()
        assert out["skipped"] == 1.0 and not np.isfinite(out["loss"])
        assert _changed(learner, before) == []  # no weight, moment or step count moved
        assert replay.updates_applied == applied  # priorities of the skipped batch not written back
        np.testing.assert_array_equal(replay.priorities, priorities)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # warned once: the second skip is only counted
            assert learner.train_step()["skipped"] == 1.0
        st = learner.stats()
        assert st["skipped_updates"] == 2 and st["updates"] == 3
        assert np.isfinite(st["loss"]) and np.isfinite(st["grad_norm"])  # NaN kept out of the running means
        replay.returns[:] = finite_returns
        assert learner.train_step()["skipped"] == 0.0
        assert _changed(learner, before)  # training resumes
        assert learner.stats()["skipped_updates"] == 2
    finally:
        learner.close()


def test_a_skip_the_host_does_not_look_at_is_counted_on_the_device_and_read_with_the_meter() -> None:
    """The CUDA path (no host sync), run on CPU: the update skips by itself (fused Adam's found_inf), the host hands
    the |TD| back undecided, and the count and the warning come with the meter's next sync."""
    replay = SanitizingReplay()
    learner = make_learner(replay=replay)
    try:
        learner._skips_on_host = False  # as on CUDA
        assert learner.train_step()["skipped"] == 0.0
        before = _snapshot(learner)
        replay.returns[:] = float("inf")
        out = learner.train_step()
        assert out["skipped"] == 1.0
        assert _changed(learner, before) == []
        assert np.isinf(replay.td_seen[-1]).all()  # handed back undecided; the replay drops them
        with pytest.warns(RuntimeWarning, match="skipped an optimizer update"):
            st = learner.stats()  # the device-side count is read when the meter refreshes
        assert st["skipped_updates"] == 1 and np.isfinite(st["loss"])
        replay.returns[:] = 0.25
        assert learner.train_step()["skipped"] == 0.0 and _changed(learner, before)
    finally:
        learner.close()


def test_grad_scaler_path_skips_an_infinite_loss() -> None:
    """The fp16 path, run on CPU with a CPU GradScaler: an infinite target leaves the gradients finite, and the
    update's own check of the loss skips the step and backs the scale off as the scaler would."""
    from learner.precision import PrecisionPolicy

    replay = SanitizingReplay()
    learner = make_learner(replay=replay)
    try:
        learner.precision = PrecisionPolicy("fp16", "cpu", None, True)
        learner.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        assert learner.train_step()["skipped"] == 0.0
        before = _snapshot(learner)
        replay.returns[:] = float("inf")
        with pytest.warns(RuntimeWarning, match="skipped an optimizer update.*fp16 loss scaling"):
            assert learner.train_step()["skipped"] == 1.0
        assert _changed(learner, before) == []
        assert learner.scaler.get_scale() == 2.0**9  # backed off, in the scaler's own tensor
        assert learner.stats()["skipped_updates"] == 1
    finally:
        learner.close()


def test_nonfinite_weights_are_never_broadcast() -> None:
    calls: list[int] = []
    learner = make_learner(on_weights=lambda v, sd: calls.append(v))
    try:
        learner.train_step()
        assert calls == [0]
        with torch.no_grad():
            dict(learner.online.named_parameters())["head.advantage.2.weight"][0, 0] = float("nan")
        pattern = r"not broadcast, non-finite weights in online/head\.advantage\.2\.weight: 1 of \d+ values"
        with pytest.warns(RuntimeWarning, match=pattern):
            learner.broadcast()
        assert calls == [0] and learner.weight_version == 0
        st = learner.stats()
        assert st["broadcasts_refused"] == 1 and st["broadcasts"] == 1
    finally:
        learner.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_cuda_nonfinite_batches_skip_on_the_device(precision: str) -> None:
    """fp16: the loss is folded into the gradients so the GradScaler skips; bf16/fp32: fused Adam's found_inf."""
    replay = SanitizingReplay()
    spec = EnvSpec(replay.obs_shape, np.uint8, replay.num_actions, replay.stack)
    learner = learner_of(small_config(device="cuda", precision=precision), spec, replay, torch.device("cuda"))
    try:
        assert learner.precision.use_scaler == (precision == "fp16") and not learner._skips_on_host
        assert learner.train_step()["skipped"] == 0.0
        before = {k: v.clone() for k, v in learner.online.state_dict().items()}
        replay.returns[:] = float("inf")  # finite gradients, infinite loss: the case the scaler alone misses
        for _ in range(3):
            assert learner.train_step()["skipped"] == 1.0
        for k, v in learner.online.state_dict().items():
            assert torch.equal(v, before[k]), k
        with pytest.warns(RuntimeWarning, match="skipped an optimizer update"):
            assert learner.stats()["skipped_updates"] == 3
    finally:
        learner.close()
