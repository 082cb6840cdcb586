"""The second exploration stage (collectors.eps_stage_from) on the real thing: a head, its collector process, the
WELCOME, the data sockets and the weight broadcasts whose version is the stage's clock."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from launcher.head import Head, StopAt
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, ReplayConfig, TransportConfig
from shared.exploration import acting_epsilon
from tests.support.waits import wait_for

STAGE_FROM, STAGE_EPS = 60, 0.25


def staged_cartpole() -> Config:
    return replace(
        Config(),
        env=EnvConfig(env_id="CartPole-v1", max_episode_steps=200),
        collectors=CollectorConfig(count=1, envs_per_collector=2, chunk_steps=16, eps_base=0.4,
                                   eps_stage_from=STAGE_FROM, eps_stage=STAGE_EPS),
        replay=ReplayConfig(capacity=5_000),
        learner=LearnerConfig(device="cpu", precision="fp32", hidden=32, warmup_transitions=300,
                              weight_broadcast_every=10, target_epsilon=0.05, target_epsilon_from=STAGE_FROM),
        transport=TransportConfig(port=0),
    )


def test_acting_epsilon_is_the_apex_value_then_the_stage_s() -> None:
    assert acting_epsilon(0.4, STAGE_FROM - 1, 0, STAGE_FROM, STAGE_EPS) == 0.4
    assert acting_epsilon(0.4, STAGE_FROM, 0, STAGE_FROM, STAGE_EPS) == STAGE_EPS
    assert acting_epsilon(0.4, 0, 100, STAGE_FROM, STAGE_EPS) == 1.0  # the anneal still starts at 1
    assert acting_epsilon(0.4, 10**9, 0, 0, STAGE_EPS) == 0.4  # stage_from 0: no stage


@pytest.mark.slow
def test_a_head_s_collector_acts_at_the_stage_epsilon_once_its_weights_reach_the_stage(tmp_path) -> None:
    """The head's view of its collector (the weight version the collector stamps on what it sends, the epsilon
    that version means) moves to the stage's epsilon once the learner has published version >= eps_stage_from,
    and the collector process logs its switch."""
    head = Head(staged_cartpole(), tmp_path / "run")
    stop = threading.Event()
    result: dict = {}
    runner = threading.Thread(target=lambda: result.update(head.run(StopAt(updates=100_000, seconds=600), stop)))
    runner.start()
    try:
        def staged() -> bool:
            seen = head.consolidation.stats().collectors.values()
            return any(c["weight_version"] >= STAGE_FROM for c in seen)

        assert wait_for(staged, 300, 0.05), "the collector never stamped a version past the stage's start"
        for c in head.consolidation.stats().collectors.values():
            if c["weight_version"] >= STAGE_FROM:
                assert c["epsilon"] == pytest.approx(STAGE_EPS)
        assert head.learner.updates >= STAGE_FROM
    finally:
        stop.set()
        runner.join(120)
        head.close(checkpoint=False)
    assert not runner.is_alive()
    # the collector process itself switched: it read the stage from its WELCOME and says so when its weights reach it
    logs = "".join(p.read_text() for p in (tmp_path / "run" / "collectors").glob("*.log"))
    assert f"reach collectors.eps_stage_from={STAGE_FROM}: every stream now explores at eps {STAGE_EPS:.4f}" in logs
