"""The replay's one rate limiter: warmup, throttling at the samples-per-insert target, the 'behind'
flag, and the insert side of the same rule."""

from __future__ import annotations

import pytest

from replay.rate_limiter import THROTTLED, TRAINING, WARMING_UP, RateLimiter


class Inserts:
    """Stands in for the replay's transitions_added counter."""

    def __init__(self, n: int = 0) -> None:
        self.n = n

    def __call__(self) -> int:
        return self.n


def limiter(spi: float, warmup: int, batch: int, lead: int = 0, **kw) -> tuple[RateLimiter, Inserts]:
    inserted = Inserts()
    return RateLimiter(spi, warmup, batch, inserted, max_insert_lead=lead, **kw), inserted


def test_warmup_then_training() -> None:
    rl, inserted = limiter(4.0, 100, 8)
    inserted.n = 99
    assert rl.may_sample(0).state == WARMING_UP
    inserted.n = 100
    d = rl.may_sample(0)
    assert d.state == TRAINING and d.may_update  # slack of 2 batches lets it start at once


def test_throttles_at_target_and_resumes_with_inserts() -> None:
    rl, inserted = limiter(2.0, 10, 4, slack_batches=1.0)
    inserted.n = 10
    rl.may_sample(0)  # origin: 10 inserts, 0 samples
    samples = 0
    inserted.n = 20  # with 10 more inserts the learner may draw 2*10 + slack(4) = 24 samples = 6 updates
    for _ in range(100):
        d = rl.may_sample(samples)
        if not d.may_update:
            break
        samples += 4
    assert samples == 24 and d.state == THROTTLED
    inserted.n = 22
    assert rl.may_sample(samples).may_update  # 4 more samples allowed after 2 inserts
    assert rl.stats()["ratio_state"] == TRAINING
    assert rl.last.ratio == pytest.approx(24 / 12)


def test_unlimited_when_zero() -> None:
    rl, inserted = limiter(0.0, 0, 32, lead=10)
    inserted.n = 1
    assert rl.may_sample(10**9).may_update
    inserted.n = 10**9
    assert rl.may_insert()


def test_behind_flag_when_collectors_outpace() -> None:
    rl, inserted = limiter(4.0, 0, 32)
    inserted.n = 1
    rl.may_sample(0)
    inserted.n = 100_001
    d = rl.may_sample(1000)  # ratio 0.01 vs target 4
    assert d.may_update and d.behind and rl.stats()["learner_behind"]


def test_origin_is_session_local_after_resume() -> None:
    """Restored sample counters with a fresh (empty) replay must not throttle forever."""
    rl, inserted = limiter(1.0, 50, 10)
    assert rl.may_sample(1_000_000).state == WARMING_UP
    inserted.n = 50
    assert rl.may_sample(1_000_000).may_update


def test_rejects_bad_arguments() -> None:
    for args, field in (((-1.0, 0, 1), "samples_per_insert"), ((1.0, 0, 0), "batch_per_update"),
                        ((1.0, -1, 1), "min_inserts")):
        with pytest.raises(ValueError, match=field):
            RateLimiter(*args, Inserts())
    with pytest.raises(ValueError, match="max_insert_lead"):
        RateLimiter(1.0, 0, 1, Inserts(), max_insert_lead=-1)


def test_insert_side_is_the_same_rule_seen_from_the_collectors() -> None:
    rl, inserted = limiter(4.0, 100, 32, lead=10)
    inserted.n = 50
    assert rl.may_insert()  # before learning starts: never gated
    inserted.n = 100
    rl.may_sample(0)  # warmup passes: origin (100, 0)
    slack = 2 * 32
    # inserts may lead the ratio by max_insert_lead transitions (plus the learner's slack), not more
    inserted.n = 100 + 10 + slack // 4
    assert rl.may_insert()
    inserted.n += 1
    assert not rl.may_insert()
    rl.may_sample(4)  # the learner drew 4 more samples: caught up by one transition
    assert rl.may_insert()


def test_zero_lead_never_holds_collectors_back() -> None:
    rl, inserted = limiter(4.0, 0, 32, lead=0)
    inserted.n = 1
    rl.may_sample(0)
    inserted.n = 10**9
    assert rl.may_insert()  # Ape-X: collectors never wait


def test_pending_transitions_count_as_inserted() -> None:
    """A batch being assembled asks with its not-yet-written transitions: the same answer as after writing them."""
    rl, inserted = limiter(4.0, 100, 32, lead=10)
    inserted.n = 100
    rl.may_sample(0)
    edge = 10 + 2 * 32 // 4  # the last insert count the gate admits
    inserted.n = 100 + edge - 5
    assert rl.may_insert(pending=5) and not rl.may_insert(pending=6)
    inserted.n = 100 + edge + 1
    assert not rl.may_insert() and not rl.may_insert(pending=0)
