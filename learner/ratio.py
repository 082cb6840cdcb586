"""Replay-ratio control: how many sampled transitions per inserted one (samples-per-insert).

Why: without it a fast learner overtrains on a small, slowly-changing buffer (each
transition replayed hundreds of times), and a slow learner silently falls behind the
collectors. Rule (Reverb's SampleToInsertRatio, measured from when learning started):

    may update  iff  samples_since_start + B_eff <= spi * inserts_since_start + slack

`slack` (default: 2 effective batches) lets the learner start immediately after warmup and
absorb bursty inserts. The accounting starts when warmup first passes in *this* process
(the origin), so a resumed run whose replay starts empty, or whose counters were restored,
never ends up permanently throttled or permanently "behind".

States for the monitoring line:
- ``warming_up``: fewer than ``warmup_transitions`` transitions inserted (no learning);
- ``throttled``: the learner is ahead of the target ratio and waits for inserts;
- ``training``: allowed to update. ``behind`` is set when the measured ratio is below
  ``lag_fraction`` of the target (collectors outpace the learner) so it is never silent.
``spi == 0`` disables the limit (always ``training`` after warmup).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

WARMING_UP = "warming_up"
TRAINING = "training"
THROTTLED = "throttled"


@dataclass(frozen=True)
class RatioDecision:
    may_update: bool
    state: str  # WARMING_UP, TRAINING or THROTTLED
    ratio: float  # samples / inserts since the origin (nan before there are any inserts)
    behind: bool  # training but below lag_fraction * target


class RatioController:
    """Decides whether the learner may do one more update now; keeps the state for logging."""

    def __init__(
        self,
        samples_per_insert: float,
        warmup_transitions: int,
        batch_per_update: int,
        slack_batches: float = 2.0,
        lag_fraction: float = 0.5,
        clock=time.monotonic,
    ) -> None:
        if samples_per_insert < 0:
            raise ValueError(f"samples_per_insert={samples_per_insert} must be >= 0")
        if batch_per_update < 1:
            raise ValueError(f"batch_per_update={batch_per_update} must be >= 1")
        if warmup_transitions < 0:
            raise ValueError(f"warmup_transitions={warmup_transitions} must be >= 0")
        self.target = float(samples_per_insert)
        self.warmup = int(warmup_transitions)
        self.batch = int(batch_per_update)
        self.slack = float(slack_batches) * self.batch
        self.lag_fraction = float(lag_fraction)
        self._clock = clock
        self._origin: tuple[int, int] | None = None  # (inserts, samples) when warmup passed
        self._last = RatioDecision(False, WARMING_UP, float("nan"), False)
        self.throttled_s = 0.0  # cumulative time spent throttled (for monitoring)
        self._throttled_since: float | None = None

    @property
    def started(self) -> bool:
        return self._origin is not None

    @property
    def last(self) -> RatioDecision:
        return self._last

    def decide(self, transitions_added: int, samples: int) -> RatioDecision:
        """One decision from the replay's insert counter and the learner's sample count.

        Warmup is judged on `transitions_added` (readable from any thread; the replay's len()
        belongs to its reader thread), which equals the replay size until the ring wraps.
        """
        if self._origin is None:
            if transitions_added < max(self.warmup, 1):
                return self._set(RatioDecision(False, WARMING_UP, float("nan"), False))
            self._origin = (int(transitions_added), int(samples))
        inserts = int(transitions_added) - self._origin[0]
        drawn = int(samples) - self._origin[1]
        ratio = drawn / inserts if inserts > 0 else float("nan")
        if self.target == 0.0:
            return self._set(RatioDecision(True, TRAINING, ratio, False))
        allowed = self.target * inserts + self.slack
        if drawn + self.batch > allowed:
            return self._set(RatioDecision(False, THROTTLED, ratio, False))
        behind = inserts > 0 and drawn + self.slack < self.lag_fraction * self.target * inserts
        return self._set(RatioDecision(True, TRAINING, ratio, behind))

    def inserts_allowed(self, transitions_added: int, samples: int, max_lead: int) -> bool:
        """Insert-side limit (any thread): False once inserts lead the target ratio by more than
        `max_lead` transitions, so collectors wait for a slow learner instead of outrunning it.
        Always True before learning starts, with no target, or with max_lead == 0 (Ape-X: never wait)."""
        origin = self._origin
        if max_lead <= 0 or origin is None or self.target == 0.0:
            return True
        inserts = int(transitions_added) - origin[0]
        drawn = int(samples) - origin[1]
        return inserts * self.target <= drawn + self.slack + max_lead * self.target

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
