"""One collector's life: register, connect, collect until told to stop, close; register again when needed.

Shared by the collector process (`python -m actors --slot i`, which adds signals and its own
ZeroMQ context) and the in-process mode (collectors as threads of the head, sharing its
context and talking to it over `inproc://` with the same messages, byte for byte).

A registration ends with STOP, a stop request, head silence (nothing from the head for
transport.head_timeout_s) or the head reclaiming it (no CREDIT for that long while the head kept
publishing). After a reclaim the collector registers again at once. After head silence a
collector given a `Rejoin` (a remote one: `python -m actors` without --parent-pid) registers
again too; it retries a failed registration (either way) with backoff until `Rejoin.give_up_s`.
One without (a child of the head, an in-process or Ray collector, whose head, supervisor or Ray
restarts it) ends on head silence and tries a registration after a reclaim once. Either way the new
registration starts over as a new collector: new sockets, new envs (the episodes in progress are
dropped: the head must not take a new stream for the continuation of an old one) and its own
initial network until the head's newest WEIGHTS arrive; chunks sent and not acknowledged on the
old registration are never sent again (the head may have stored them).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import zmq

from actors.client import HeadLink, HeadUnavailable, RegistrationError, Welcome, register
from actors.collector import Collector
from envs.factory import env_spec
from shared.keys import CurveClient
from shared.stop_flag import StopRequest
from shared.weights import network_template

log = logging.getLogger("actors")

REJOIN_FIRST_BACKOFF_S = 1.0  # the wait after the first failed registration attempt ...
REJOIN_MAX_BACKOFF_S = 30.0  # ... doubling up to this


def pause(stop: StopRequest, seconds: float) -> None:
    """Sleep `seconds`, waking within 0.1 s of a stop request."""
    deadline = time.monotonic() + seconds
    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(0.1, left))


@dataclass(frozen=True)
class Rejoin:
    """How a collector that lost its registration (head silence, a reclaim) registers again: a new HELLO (new
    nonce) per attempt, `first_backoff_s` doubling up to `max_backoff_s` between failed attempts, until
    `give_up_s` seconds after the registration ended (0: never gives up)."""

    give_up_s: float
    first_backoff_s: float = REJOIN_FIRST_BACKOFF_S
    max_backoff_s: float = REJOIN_MAX_BACKOFF_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[StopRequest, float], None] = pause

    def backoffs(self) -> Iterator[float]:
        """The waits after each failed attempt: first_backoff_s, doubled each time, at most max_backoff_s."""
        wait = self.first_backoff_s
        while True:
            yield wait
            wait = min(2 * wait, self.max_backoff_s)

    def register(self, attempt: Callable[[float], Welcome], stop: StopRequest, attempt_s: float) -> Welcome | None:
        """`attempt(timeout_s)` (one registration, at most `attempt_s`) until it returns a WELCOME; None once
        stopped or give_up_s after the call. No answer or a refusal (HeadUnavailable) is retried; any other
        RegistrationError (an unusable WELCOME) is raised, as for a first registration."""
        deadline = self.clock() + self.give_up_s if self.give_up_s else math.inf
        waits = self.backoffs()
        while True:
            try:
                return attempt(min(attempt_s, max(0.0, deadline - self.clock())))
            except HeadUnavailable as exc:
                failure = exc
            except RegistrationError:
                if stop.is_set():
                    return None
                raise
            left = deadline - self.clock()
            if stop.is_set():
                return None
            if left <= 0:
                log.warning("no head for %.0f s (--rejoin-timeout; last try: %s): giving up", self.give_up_s, failure)
                return None
            wait = min(next(waits), left)
            log.warning("cannot register again yet (%s); next HELLO in %.0f s", failure, wait)
            self.sleep(stop, wait)

    def describe(self) -> str:
        """The give-up time, for logs."""
        return f"giving up after {self.give_up_s:.0f} s" if self.give_up_s else "never giving up"


def collect(ctx: zmq.Context, connect: str, slot: int, stop: StopRequest, curve: CurveClient | None = None,
            register_timeout_s: float = 60.0, rejoin: Rejoin | None = None) -> str:
    """Run one collector until STOP, `stop` or head silence; returns why it ended ('stop', 'head_silent', ...).
    A collector whose registration the head reclaimed registers again; with `rejoin` one whose head fell silent
    does too (see the module docstring), and returns 'head_silent' only once rejoin.give_up_s have passed.

    Raises RegistrationError when the first registration fails (no answer within register_timeout_s, a refusal,
    an unusable WELCOME), and when registering again does without `rejoin`."""

    def attempt(timeout_s: float) -> Welcome:
        return register(ctx, connect, slot, curve, timeout_s, should_stop=stop.is_set)

    welcome = attempt(register_timeout_s)
    while True:
        reason, again = _collect_registered(ctx, welcome, stop, curve, rejoin)
        if not again:
            return reason
        welcome = attempt(register_timeout_s) if rejoin is None else rejoin.register(attempt, stop, register_timeout_s)
        if welcome is None:  # stopped, or gave up
            reason = "stop" if stop.is_set() else reason
            log.info("collector exiting (%s)", reason)
            return reason


def _registers_again(reason: str, rejoin: Rejoin | None, stop: StopRequest) -> bool:
    """After a reclaimed registration always, after head silence with `rejoin`; never once stopped."""
    return not stop.is_set() and (reason == "reclaimed" or (reason == "head_silent" and rejoin is not None))


def _collect_registered(ctx: zmq.Context, welcome: Welcome, stop: StopRequest, curve: CurveClient | None,
                        rejoin: Rejoin | None) -> tuple[str, bool]:
    """One registration's life: (why it ended, whether to register again)."""
    eps = welcome.epsilons or (welcome.epsilon,)
    log.info("registered as collector %d (slot %d, eps %.4f..%.4f over %d streams), data -> %s", welcome.collector_id,
             welcome.slot, max(eps), min(eps), len(eps), welcome.data_endpoint)
    template = network_template(env_spec(welcome.config.env), welcome.config.learner)
    link = HeadLink(ctx, welcome, template, curve, should_stop=stop.is_set)
    collector = None
    try:
        collector = Collector(welcome.config, welcome.collector_id, welcome.epsilons or welcome.epsilon, link)
        reason = collector.run()
        t = collector.timing
        if link.reclaimed() and not stop.is_set():
            log.warning("collector %d: the head reclaimed this registration (no CREDIT on its data socket for over "
                        "%.0f s while the head kept publishing); registering again", welcome.collector_id,
                        link.reclaim_after_s)
            reason = "reclaimed"
        again = _registers_again(reason, rejoin, stop)
        if again and reason == "head_silent":
            log.warning("collector %d: nothing from the head for over %.0f s; registering again (a new collector: "
                        "unacknowledged chunks and the episodes in progress are dropped; %s)", welcome.collector_id,
                        link.head_timeout_s, rejoin.describe())
        log.info("collector %d %s (%s) after %d steps, overhead %.1f%% of env time, %.1f s waiting for credit",
                 welcome.collector_id, "leaves this registration" if again else "exiting", reason, t.steps,
                 100 * t.overhead_frac if t.env_s else 0.0, link.credit_wait_s)
        return reason, again
    finally:
        if collector is not None:
            collector.close()
        link.close()
