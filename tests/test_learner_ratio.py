"""Replay-ratio control: warmup, throttling at the samples-per-insert target, 'behind' flag."""

from __future__ import annotations

import pytest

from learner.ratio import THROTTLED, TRAINING, WARMING_UP, RatioController


def test_warmup_then_training() -> None:
    rc = RatioController(samples_per_insert=4.0, warmup_transitions=100, batch_per_update=8)
    assert rc.decide(transitions_added=99, samples=0).state == WARMING_UP
    d = rc.decide(transitions_added=100, samples=0)
    assert d.state == TRAINING and d.may_update  # slack of 2 batches lets it start at once


def test_throttles_at_target_and_resumes_with_inserts() -> None:
    rc = RatioController(samples_per_insert=2.0, warmup_transitions=10, batch_per_update=4, slack_batches=1.0)
    rc.decide(10, 0)  # origin: 10 inserts, 0 samples
    samples = 0
    # with 10 more inserts the learner may draw 2*10 + slack(4) = 24 samples = 6 updates
    for _ in range(100):
        d = rc.decide(20, samples)
        if not d.may_update:
            break
        samples += 4
    assert samples == 24 and d.state == THROTTLED
    assert rc.decide(22, samples).may_update  # 4 more samples allowed after 2 inserts
    assert rc.stats()["ratio_state"] == TRAINING
    assert rc.last.ratio == pytest.approx(24 / 12)


def test_unlimited_when_zero() -> None:
    rc = RatioController(0.0, 0, 32)
    assert rc.decide(1, 10**9).may_update


def test_behind_flag_when_collectors_outpace() -> None:
    rc = RatioController(samples_per_insert=4.0, warmup_transitions=0, batch_per_update=32)
    rc.decide(1, 0)
    d = rc.decide(100_001, 1000)  # ratio 0.01 vs target 4
    assert d.may_update and d.behind and rc.stats()["learner_behind"]


def test_origin_is_session_local_after_resume() -> None:
    """Restored sample counters with a fresh (empty) replay must not throttle forever."""
    rc = RatioController(samples_per_insert=1.0, warmup_transitions=50, batch_per_update=10)
    assert rc.decide(0, samples=1_000_000).state == WARMING_UP
    assert rc.decide(50, samples=1_000_000).may_update


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="samples_per_insert"):
        RatioController(-1.0, 0, 1)
    with pytest.raises(ValueError, match="batch_per_update"):
        RatioController(1.0, 0, 0)


def test_insert_side_limit_holds_collectors_back_only_when_asked():
    from learner.ratio import RatioController

    rc = RatioController(samples_per_insert=4.0, warmup_transitions=100, batch_per_update=32)
    assert rc.inserts_allowed(50, 0, max_lead=10)  # before learning starts: never gated
    rc.decide(transitions_added=100, samples=0)  # warmup passes: origin (100, 0)
    slack = 2 * 32
    # inserts may lead the ratio by max_lead transitions (plus the learner's slack), not more
    assert rc.inserts_allowed(100 + 10 + slack // 4, 0, max_lead=10)
    assert not rc.inserts_allowed(100 + 11 + slack // 4, 0, max_lead=10)
    assert rc.inserts_allowed(100 + 11 + slack // 4, 4, max_lead=10)  # the learner caught up by one transition
    assert rc.inserts_allowed(10**9, 0, max_lead=0)  # 0 = Ape-X: collectors never wait
