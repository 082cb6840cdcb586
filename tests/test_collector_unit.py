"""Collector internals without sockets: chunk cutting, priorities, weights loading."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import envs.testing  # noqa: F401
from actors.collector import Collector
from actors.stream import StreamRecorder
from config_optimized import load_config
from envs.factory import env_spec
from envs.testing import decode_frame
from shared.chunk import TransitionChunk, nstep_targets, stack_floors, stack_indices
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig
from shared.weights import cpu_state, encode_weights, network_template
from tests.support.fake_link import FakeLink


@pytest.mark.parametrize("n,stack,chunk_steps", [(3, 4, 8), (1, 1, 5), (5, 4, 3), (3, 2, 40)])
def test_stream_recorder_sends_every_transition_once_with_td_priorities(n: int, stack: int, chunk_steps: int) -> None:
    gamma = 0.9
    env = gym.make("ApeXCounting-v0", disable_env_checker=True, episode_length=11)
    rec = StreamRecorder(0, stack, n, gamma, chunk_steps, 4)
    obs, _ = env.reset(seed=3)
    rec.begin_episode(obs)
    rng = np.random.default_rng(1)
    q_of: dict[tuple[int, int], np.ndarray] = {}
    seen: list[tuple[int, int]] = []
    chunks: list[TransitionChunk] = []
    for _ in range(400):
        row = rng.random(4).astype(np.float32)
        q_of[decode_frame(rec.frames[-1])[1:]] = row
        rec.set_q(row)
        if rec.ready():
            chunks.append(rec.build_chunk())
        a = int(rng.integers(4))
        obs, r, te, tr, _ = env.step(a)
        idx = rec.record_step(a, r, obs, te, tr)
        if tr:
            row = rng.random(4).astype(np.float32)
            q_of[decode_frame(obs)[1:]] = row
            rec.set_q(row, idx)
        if te or tr:
            obs, _ = env.reset()
            rec.begin_episode(obs)
    for ch in chunks:
        assert ch.actions[-1] == -1
        t = nstep_targets(ch.actions, ch.rewards, ch.flags, ch.first_start, n, gamma)
        assert len(t.starts) > 0
        stacks = stack_indices(t.starts, stack_floors(ch.flags)[t.starts], stack)
        for j, s in enumerate(t.starts):
            ep, step = decode_frame(ch.frames[s])[1:]
            seen.append((ep, step))
            assert [decode_frame(ch.frames[i])[1:] for i in stacks[j]] == [
                (ep, max(0, step - k)) for k in range(stack - 1, -1, -1)]
            boot = decode_frame(ch.frames[t.bootstrap[j]])[1:]
            q_boot = q_of[boot].max() if t.discounts[j] > 0 else 0.0
            expected = abs(t.returns[j] + t.discounts[j] * q_boot - q_of[(ep, step)][ch.actions[s]])
            assert ch.priorities[s] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert len(seen) == len(set(seen))
    assert seen == [(e, s) for e in range(seen[-1][0] + 1) for s in range(11)][: len(seen)]
    assert len(seen) > 300
    assert len(rec.frames) <= chunk_steps + n + stack + 12  # history is trimmed


def small_config() -> Config:
    return replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                   collectors=CollectorConfig(envs_per_collector=3, chunk_steps=16), learner=LearnerConfig(hidden=16))


def small_collector(link: FakeLink, collector_id: int = 2) -> Collector:
    return Collector(small_config(), collector_id=collector_id, epsilon=0.5, link=link)


def test_collector_loop_emits_chunks_episodes_and_loads_weights() -> None:
    link = FakeLink()
    col = small_collector(link)
    assert col.run(max_steps=120) == "max_steps"
    assert {c.stream for c in link.chunks} == {0, 1, 2}
    assert len(link.episodes) == 9 and all(e.length == 37 for e in link.episodes)
    donor = small_collector(FakeLink(), collector_id=3).net  # another draw of the initial weights
    assert any(not torch.equal(col.net.state_dict()[name], t) for name, t in donor.state_dict().items())
    link.weights = (3, cpu_state(donor.state_dict()))
    col.step()
    assert col.weight_version == link.weight_version == 3
    for name, t in donor.state_dict().items():
        assert torch.equal(col.net.state_dict()[name], t)
    assert not col.load_weights(2, cpu_state(donor.state_dict()))  # not newer: ignored
    assert col.weight_version == 3
    t = col.timing
    assert t.steps == 121 and 0 < t.env_s < t.total_s and t.infer_s > 0
    col.close()


def test_version_0_replaces_the_initial_network_once() -> None:
    """Version 0 is the head's starting network (another run's trained one with `learner.init_from`): a collector
    still acting with its own initial network loads it; a second copy of it (re-sent to a late subscriber) is not
    newer than what it loaded, so it is ignored."""
    col = small_collector(FakeLink())
    donor = small_collector(FakeLink(), collector_id=3).net
    assert col.load_weights(0, cpu_state(donor.state_dict()))
    assert all(torch.equal(col.net.state_dict()[k], v) for k, v in donor.state_dict().items())
    assert col.weight_version == 0
    assert not col.load_weights(0, cpu_state(small_collector(FakeLink(), collector_id=4).net.state_dict()))
    assert all(torch.equal(col.net.state_dict()[k], v) for k, v in donor.state_dict().items())
    col.close()


def test_initial_network_is_drawn_from_the_run_seed_and_collector_id() -> None:
    """Before the first weights arrive a collector acts with its own initial network: the same seed and id draw
    the same network (a run's first episodes repeat), another id another one, and the global RNG is left alone."""
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first, again, other = (small_collector(FakeLink(), collector_id=i) for i in (2, 2, 5))
    assert torch.equal(torch.rand(3), expected_next)
    for name, t in first.net.state_dict().items():
        assert torch.equal(again.net.state_dict()[name], t)
    assert any(not torch.equal(other.net.state_dict()[name], t) for name, t in first.net.state_dict().items())
    for c in (first, again, other):
        c.close()


def test_epsilon_anneals_from_one_by_weight_version() -> None:
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(envs_per_collector=2, chunk_steps=16, eps_decay_updates=1000),
                  learner=LearnerConfig(hidden=16))
    col = Collector(cfg, collector_id=1, epsilon=0.1, link=FakeLink())
    assert col.current_epsilon() == pytest.approx(1.0)  # before any learning: uniformly random
    col.weight_version = 500
    assert col.current_epsilon() == pytest.approx(0.55)
    col.weight_version = 5000
    assert col.current_epsilon() == pytest.approx(0.1)  # settled at its Ape-X epsilon
    col.close()
    fixed = small_collector(FakeLink())
    fixed.weight_version = 0
    assert fixed.current_epsilon() == pytest.approx(0.5)  # eps_decay_updates=0: the Ape-X epsilon from the start
    fixed.close()


def test_every_stream_takes_the_stage_epsilon_from_its_update() -> None:
    """collectors.eps_stage_from: the Ape-X epsilons (annealed, if eps_decay_updates says so) up to that weight
    version, then the stage's one epsilon on every stream; a collector that joins later switches by the same
    clock."""
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(envs_per_collector=2, chunk_steps=16, eps_decay_updates=1000,
                                             eps_stage_from=3000, eps_stage=0.05),
                  learner=LearnerConfig(hidden=16))
    col = Collector(cfg, collector_id=1, epsilon=[0.4, 0.01], link=FakeLink())
    assert col.current_epsilon() == pytest.approx([1.0, 1.0])
    col.weight_version = 500
    assert col.current_epsilon() == pytest.approx([0.7, 0.505])
    col.weight_version = 2999
    assert col.current_epsilon() == pytest.approx([0.4, 0.01])
    col.weight_version = 3000
    assert col.current_epsilon() == pytest.approx([0.05, 0.05])
    donor = Collector(cfg, collector_id=2, epsilon=[0.4, 0.01], link=FakeLink())
    late = Collector(cfg, collector_id=3, epsilon=[0.3, 0.02], link=FakeLink())
    assert late.load_weights(3100, cpu_state(donor.net.state_dict()))
    assert late.current_epsilon() == pytest.approx([0.05, 0.05])
    for c in (col, donor, late):
        c.close()
    off = small_collector(FakeLink())  # eps_stage_from=0: no stage, whatever eps_stage says
    off.weight_version = 10**9
    assert off.current_epsilon() == pytest.approx(0.5)
    off.close()
    bad = replace(cfg, collectors=replace(cfg.collectors, eps_stage=float("nan")))
    with pytest.raises(ValueError, match="collectors.eps_stage"):
        Collector(bad, collector_id=1, epsilon=[0.4, 0.01], link=FakeLink())


def test_the_collector_acts_at_the_stage_epsilon_once_its_weights_reach_it() -> None:
    """Greedy streams (epsilon 0) with a flat Q always take action 0; after weights of version >= eps_stage_from
    (eps_stage 1) they act uniformly at random: seen in the actions their chunks carry."""
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(envs_per_collector=2, chunk_steps=16, eps_stage_from=5, eps_stage=1.0),
                  learner=LearnerConfig(hidden=16))
    link = FakeLink()
    col = Collector(cfg, collector_id=1, epsilon=[0.0, 0.0], link=link, seed=3)
    with torch.no_grad():
        for p in col.net.parameters():
            p.zero_()
    flat = cpu_state(col.net.state_dict())

    def actions_after(steps: int) -> np.ndarray:  # what the chunks sent during `steps` more loop steps carry
        link.chunks.clear()
        col.run(max_steps=col.timing.steps + steps)
        return np.concatenate([c.actions[c.actions >= 0] for c in link.chunks])

    assert col.load_weights(4, flat)
    before = actions_after(200)
    assert len(before) > 200 and (before == 0).all()  # version 4 < 5: the WELCOME's epsilon 0
    assert col.load_weights(5, flat)
    after = actions_after(300)
    # uniform over 4 actions: 3/4 not greedy (a chunk's first steps may still be from before the switch)
    assert len(after) > 300 and 0.6 < (after != 0).mean() < 0.9
    col.close()


def test_each_env_stream_explores_with_its_own_epsilon() -> None:
    """WELCOME's per-stream epsilons: with a flat Q (greedy = action 0), stream 0 (eps 1) acts at random,
    stream 1 (eps 0) always greedily, seen in the actions its chunks carry."""
    link = FakeLink()
    cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                  collectors=CollectorConfig(envs_per_collector=2, chunk_steps=16), learner=LearnerConfig(hidden=16))
    col = Collector(cfg, collector_id=1, epsilon=[1.0, 0.0], link=link, seed=3)
    assert col.current_epsilon() == pytest.approx([1.0, 0.0])
    with torch.no_grad():
        for p in col.net.parameters():
            p.zero_()
    col.run(max_steps=300)
    actions = {k: np.concatenate([c.actions[c.actions >= 0] for c in link.chunks if c.stream == k]) for k in (0, 1)}
    assert len(actions[0]) > 200 and len(actions[1]) > 200
    assert (actions[1] == 0).all()  # greedy on a flat Q: argmax is the first action
    assert 0.6 < (actions[0] != 0).mean() < 0.9  # uniform over the counting env's 4 actions: 3/4 not greedy
    col.close()
    with pytest.raises(ValueError, match="expected one value or 2 values"):
        Collector(cfg, collector_id=1, epsilon=[0.1, 0.2, 0.3], link=FakeLink())


def test_reward_scale_applies_to_learning_data_not_to_reported_returns() -> None:
    def run(scale: float) -> FakeLink:
        cfg = replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0", reward_scale=scale),
                      collectors=CollectorConfig(envs_per_collector=1, chunk_steps=16), learner=LearnerConfig(hidden=16))
        link = FakeLink()
        torch.manual_seed(0)  # same network, same greedy actions
        col = Collector(cfg, collector_id=1, epsilon=0.3, link=link, seed=7)
        col.run(max_steps=80)
        col.close()
        return link

    plain, scaled = run(1.0), run(0.25)
    assert len(plain.chunks) == len(scaled.chunks) > 0
    for a, b in zip(plain.chunks, scaled.chunks, strict=True):
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_allclose(b.rewards, a.rewards * 0.25)
    assert [e.episode_return for e in plain.episodes] == [e.episode_return for e in scaled.episodes]


def test_the_link_decodes_weights_against_its_network_and_refuses_a_mismatch(caplog) -> None:
    import zmq

    from actors.client import HeadLink, Welcome

    donor = small_collector(FakeLink()).net
    template = network_template(env_spec(small_config().env), small_config().learner)
    ctx = zmq.Context()
    welcome = Welcome(1, "inproc://nowhere-data", "inproc://nowhere-weights", 0.1, 1, 0, Config(), b"tok")
    link = HeadLink(ctx, welcome, template)
    try:
        link._weights = encode_weights(3, cpu_state(donor.state_dict()))  # as poll_head keeps the newest
        version, state = link.take_weights()
        assert version == 3 and all(torch.equal(state[k], v) for k, v in donor.state_dict().items())
        assert link.take_weights() is None  # taken once
        bad = dict(donor.state_dict())
        bad[next(iter(bad))] = torch.zeros(1)
        link._weights = encode_weights(4, cpu_state(bad))
        assert link.take_weights() is None and "refused weights: weights_mismatch" in caplog.text
    finally:
        link.close()
        ctx.term()


def test_a_link_takes_the_head_s_first_broadcast_over_real_sockets() -> None:
    """A real publisher sends version 0 (as a head started from another run's network does, before its first
    update) and re-sends it to a subscriber that joins late: the link takes it, and the collector acts with it."""
    import zmq

    from actors.client import HeadLink, Welcome
    from learner.broadcast import WeightPublisher
    from tests.support.waits import wait_for

    col = small_collector(FakeLink())
    donor = small_collector(FakeLink(), collector_id=3).net
    template = network_template(env_spec(small_config().env), small_config().learner)
    ctx = zmq.Context()
    pub = WeightPublisher(["tcp://127.0.0.1:0"], context=ctx, heartbeat_s=0.05)
    link = None
    try:
        pub.publish(0, donor.state_dict())
        welcome = Welcome(1, "inproc://nowhere-data", pub.endpoints[0], 0.1, 1, 0, Config(), b"tok")
        link = HeadLink(ctx, welcome, template)
        taken: list = []

        def took() -> bool:
            link.poll_head()
            got = link.take_weights()
            if got is not None:
                taken.append(got)
            return bool(taken)

        assert wait_for(took, 30, 0.01), "the version-0 broadcast never reached the link"
        version, state = taken[0]
        assert version == 0 and col.load_weights(version, state)
        assert all(torch.equal(col.net.state_dict()[k], v) for k, v in donor.state_dict().items())
    finally:
        if link is not None:
            link.close()
        pub.close()
        ctx.term()
        col.close()


def _welcome_json(**changes: Any) -> dict[str, Any]:
    data = {"collector_id": 1, "data_endpoint": "ipc:///tmp/x/c1.ipc", "data_token": "63" + "ab" * 16,
            "weights_endpoint": "ipc:///tmp/x/weights.ipc", "epsilon": 0.1, "epsilons": [0.1],
            "num_collectors": 1, "slot": 0, "config": Config().to_dict()}
    data.update(changes)
    return data


@pytest.mark.parametrize(("key", "value"), [
    ("data_endpoint", "garbage"), ("data_endpoint", 7), ("weights_endpoint", "tcp://" + "h" * 2000),
    ("weights_endpoint", ["tcp://127.0.0.1:1"]), ("data_token", ""), ("data_token", "00ab"),
    ("data_token", "ab" * 256), ("data_token", "not hex"),
])
def test_a_welcome_with_unusable_endpoints_or_token_is_refused_by_name(key: str, value: Any) -> None:
    """The head is a peer too: what would make a socket call fail is refused before any socket sees it."""
    from actors.client import RegistrationError, _parse_welcome

    assert _parse_welcome(_welcome_json(), "tcp://127.0.0.1:5555").data_token[0] == 0x63  # the unchanged one is fine
    with pytest.raises(RegistrationError, match=f"unusable WELCOME: {key}"):
        _parse_welcome(_welcome_json(**{key: value}), "tcp://127.0.0.1:5555")


MARIO = "SuperMarioBros-1-1-v0"


def _welcome_with(section: str, field: str, value: Any) -> dict[str, Any]:
    from ingest.registration import collector_config

    config = collector_config(load_config("cpu", [f"env.env_id={MARIO}"]).to_dict())  # what a Mario head sends
    config[section][field] = value
    return _welcome_json(config=config)


def test_a_real_heads_welcome_config_passes_the_collectors_checks() -> None:
    from actors.client import _parse_welcome
    from ingest.registration import collector_config

    for env_id in (MARIO, "CartPole-v1", "ApeXCounting-v0", "ALE/Pong-v5"):
        sent = collector_config(load_config("auto", [f"env.env_id={env_id}"]).check_valid().to_dict())
        assert _parse_welcome(_welcome_json(config=sent), "tcp://127.0.0.1:5555").config.env.env_id == env_id


@pytest.mark.parametrize(("section", "field", "value"), [
    ("collectors", "eps_decay_updates", -5), ("collectors", "eps_stage_from", -1), ("collectors", "eps_stage", 1.5),
    ("collectors", "chunk_steps", 0), ("collectors", "envs_per_collector", 100_000), ("collectors", "send_hwm", 0),
    ("collectors", "heartbeat_s", 0.0), ("collectors", "torch_threads", 10_000), ("collectors", "explore_repeat_mu", 0.5),
    ("env", "frame_skip", 0), ("env", "frame_stack", 99), ("env", "frame_size", 4096), ("replay", "n_step", 0),
    ("replay", "gamma", 2.0), ("replay", "capacity", 8), ("learner", "hidden", 10**9), ("learner", "encoder", "vit"),
    ("learner", "quantiles", -3), ("learner", "noisy_sigma", float("inf")), ("transport", "head_timeout_s", -1.0),
    ("transport", "max_chunks_in_flight", -2), ("transport", "socket_buffer_bytes", 1 << 40),
])
def test_a_welcome_config_out_of_range_is_refused_by_name(section: str, field: str, value: Any) -> None:
    """A head is a peer: a collector checks the config it is sent with the head's own rules before building
    anything from it, and names the field."""
    from actors.client import RegistrationError, _parse_welcome

    with pytest.raises(RegistrationError, match=f"unusable WELCOME: {section}.{field}="):
        _parse_welcome(_welcome_with(section, field, value), "tcp://127.0.0.1:5555")


def test_a_welcome_network_too_large_for_this_machine_is_refused() -> None:
    from envs.checks import check_welcome

    config = load_config("cpu", [f"env.env_id={MARIO}", "learner.hidden=512"])
    check_welcome(config, available_bytes=8 << 30)
    with pytest.raises(ValueError, match="learner.hidden=512 makes a Q-network"):
        check_welcome(config, available_bytes=1 << 20)


@pytest.mark.timeout(60)  # a socket left open by the failed link made term() wait forever
def test_a_link_that_cannot_connect_raises_and_leaves_no_socket_open() -> None:
    import zmq

    from actors.client import HeadLink, RegistrationError, Welcome

    template = network_template(env_spec(small_config().env), small_config().learner)
    ctx = zmq.Context()
    for data, weights in (("tcp://", "inproc://w"), ("inproc://d", "tcp://")):  # schemes fine, addresses not
        with pytest.raises(RegistrationError, match="cannot use its endpoints") as failed:
            HeadLink(ctx, Welcome(1, data, weights, 0.1, 1, 0, Config(), b"tok"), template)
        assert failed.traceback is not None  # the half-built link is still referenced, as in an except block
    ctx.term()
