"""One rate limiter for both sides of the replay (Reverb's SampleToInsertRatio).

Why: without it a fast learner overtrains on a small, slowly-changing buffer (each transition
replayed hundreds of times), and a slow learner silently falls behind the collectors. One
object holds the rule; the learner asks `may_sample` before each update and the consolidation
thread asks `may_insert` before writing a chunk, so the two sides can never disagree:

    may sample  iff  sampled + B_eff <= spi * inserted + slack
    may insert  iff  spi * inserted  <= sampled + slack + spi * max_insert_lead

counted from the *origin*: the moment warmup first passes in this process (`min_inserts`
transitions in the replay), so a resumed run whose replay starts empty, or whose counters were
restored, never ends up permanently throttled or permanently "behind". `slack` (default two
effective batches) lets the learner start at once after warmup and absorbs bursty inserts.
`max_insert_lead = 0` never holds inserts back (Ape-X: collectors never wait); `spi = 0`
disables the limit altogether.

Threads: `may_sample` is called by the learner's thread only (it also records the sample
count); `may_insert` and `stats` from any thread (they read ints the learner writes whole).

States for the monitoring line:
- ``warming_up``: fewer than ``min_inserts`` transitions inserted (no learning);
- ``throttled``: the learner is ahead of the target ratio and waits for inserts;
- ``training``: allowed to update. ``behind`` is set when the measured ratio is below
  ``lag_fraction`` of the target (collectors outpace the learner) so it is never silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

WARMING_UP = "warming_up"
TRAINING = "training"
THROTTLED = "throttled"


class InsertGate(Protocol):
    """What the consolidation thread consults before writing a chunk to the replay."""

    def may_insert(self, pending: int = 0) -> bool:
        """May one more chunk be written, `pending` transitions being admitted but not yet written?"""
        ...


@dataclass(frozen=True)
class RatioDecision:
    may_update: bool
    state: str  # WARMING_UP, TRAINING or THROTTLED
    ratio: float  # samples / inserts since the origin (nan before there are any inserts)
    behind: bool  # training but below lag_fraction * target


class RateLimiter:
    """Decides whether the learner may sample one more batch and whether collectors may insert."""

    def __init__(
        self,
        samples_per_insert: float,
        min_inserts: int,
        batch_per_update: int,
        inserted: Callable[[], int],
        max_insert_lead: int = 0,
        slack_batches: float = 2.0,
        lag_fraction: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if samples_per_insert < 0:
            raise ValueError(f"samples_per_insert={samples_per_insert} must be >= 0")
        if batch_per_update < 1:
            raise ValueError(f"batch_per_update={batch_per_update} must be >= 1")
        if min_inserts < 0:
            raise ValueError(f"min_inserts={min_inserts} must be >= 0")
        if max_insert_lead < 0:
            raise ValueError(f"max_insert_lead={max_insert_lead} must be >= 0")
        self.target = float(samples_per_insert)
        self.warmup = int(min_inserts)
        self.batch = int(batch_per_update)
        self.max_insert_lead = int(max_insert_lead)
        self.slack = float(slack_batches) * self.batch
        self.lag_fraction = float(lag_fraction)
        self._inserted = inserted  # the replay's insert counter (readable from any thread)
        self._clock = clock
        self._origin: tuple[int, int] | None = None  # (inserted, sampled) when warmup passed
        self._sampled = 0  # the learner's newest sample count
        self._last = RatioDecision(False, WARMING_UP, float("nan"), False)
        self.throttled_s = 0.0  # cumulative time the learner spent throttled (monitoring)
        self._throttled_since: float | None = None

    @classmethod
    def for_learner(cls, learner_config, batch_per_update: int, inserted: Callable[[], int]) -> RateLimiter:
        """From `LearnerConfig`: samples_per_insert, warmup_transitions, max_insert_lead."""
        return cls(learner_config.samples_per_insert, learner_config.warmup_transitions, batch_per_update, inserted,
                   learner_config.max_insert_lead)

    @property
    def started(self) -> bool:
        return self._origin is not None

    @property
    def last(self) -> RatioDecision:
        return self._last

    # ------------------------------------------------------------------ sample side (learner thread)
    def may_sample(self, sampled: int) -> RatioDecision:
        """May the learner draw one more effective batch, having drawn `sampled` transitions so far?"""
        self._sampled = int(sampled)
        inserted = int(self._inserted())
        if self._origin is None:
            if inserted < max(self.warmup, 1):
                return self._set(RatioDecision(False, WARMING_UP, float("nan"), False))
            self._origin = (inserted, self._sampled)
        inserts = inserted - self._origin[0]
        drawn = self._sampled - self._origin[1]
        ratio = drawn / inserts if inserts > 0 else float("nan")
        if self.target == 0.0:
            return self._set(RatioDecision(True, TRAINING, ratio, False))
        if drawn + self.batch > self.target * inserts + self.slack:
            return self._set(RatioDecision(False, THROTTLED, ratio, False))
        behind = inserts > 0 and drawn + self.slack < self.lag_fraction * self.target * inserts
        return self._set(RatioDecision(True, TRAINING, ratio, behind))

    # ------------------------------------------------------------------ insert side (any thread)
    def may_insert(self, pending: int = 0) -> bool:
        """False once inserts (plus `pending` admitted, not yet written) lead the target ratio by more
        than `max_insert_lead` transitions.

        Always True before learning starts, with no target, or with max_insert_lead == 0."""
        origin = self._origin
        if self.max_insert_lead <= 0 or origin is None or self.target == 0.0:
            return True
        inserts = int(self._inserted()) + int(pending) - origin[0]
        drawn = self._sampled - origin[1]
        return inserts * self.target <= drawn + self.slack + self.max_insert_lead * self.target

    # ------------------------------------------------------------------ monitoring
    def _set(self, decision: RatioDecision) -> RatioDecision:
        now = self._clock()
        if decision.state == THROTTLED and self._throttled_since is None:
            self._throttled_since = now
        elif decision.state != THROTTLED and self._throttled_since is not None:
            self.throttled_s += now - self._throttled_since
            self._throttled_since = None
        self._last = decision
        return decision

    def stats(self) -> dict[str, object]:
        d = self._last
        return {
            "ratio_state": d.state,
            "replay_ratio": d.ratio,
            "replay_ratio_target": self.target,
            "learner_behind": d.behind,
            "throttled_s": self.throttled_s,
        }
