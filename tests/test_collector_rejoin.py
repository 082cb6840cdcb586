"""A collector whose head falls silent: a remote one registers again by itself (backoff, give-up time), a child of
the head exits; the exit reason says head_silent even when the silence was met while waiting for credit.

No sockets: registration and the head link are fakes (tests/support/fake_link.py); the collector, its envs
(ApeXCounting-v0, whose frames name their env seed, episode and step) and the session logic are the real ones."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import replace

import pytest

import actors.session as session
import envs.testing  # noqa: F401
from actors.__main__ import DEFAULT_REJOIN_TIMEOUT_S, child_argv, option_error, parse_args, rejoin_timeout
from actors.client import HeadUnavailable, RegistrationError, Welcome
from actors.collector import Collector
from actors.session import Rejoin, collect
from envs.testing import decode_frame
from shared.chunk import FLAG_FIRST
from shared.config import CollectorConfig, Config, EnvConfig, LearnerConfig, TransportConfig
from shared.stop_flag import StopFlag
from shared.weights import cpu_state
from tests.support.cluster import ROOT, head_env
from tests.support.fake_link import FakeLink

K = 2  # env streams per collector


def config() -> Config:
    return replace(Config(), env=EnvConfig(env_id="ApeXCounting-v0"),
                   collectors=CollectorConfig(envs_per_collector=K, chunk_steps=8), learner=LearnerConfig(hidden=16),
                   transport=TransportConfig(max_chunks_in_flight=2))


def welcome(collector_id: int) -> Welcome:
    return Welcome(collector_id, "inproc://data", "inproc://weights", 0.1, 1, 0, config(), b"tok", (0.1,) * K, 1.0)


class ScriptedLink(FakeLink):
    """A head link that takes `accept` chunks, then blocks on the next one "waiting for credit" while the head
    falls silent (with `reclaim`: reclaims the registration; with `stop`: the collector is told to stop); the
    chunk it was waiting to send is `abandoned`."""

    def __init__(self, accept: int, weights=None, stop: StopFlag | None = None, reclaim: bool = False) -> None:
        super().__init__()
        self.accept, self.stop, self.reclaim = accept, stop, reclaim
        self.weights = weights
        self.silent = self.reclaimed_now = False
        self.abandoned = None
        self.closed = False
        self.head_timeout_s = self.reclaim_after_s = 8.0
        self.credit_wait_s = 0.0

    def send_chunk(self, chunk) -> bool:
        if len(self.chunks) < self.accept:
            return super().send_chunk(chunk)
        self.abandoned = chunk
        if self.stop is not None:
            self.stop.set()
        elif self.reclaim:
            self.reclaimed_now = True  # no CREDIT for head_timeout_s while the head kept publishing
        else:
            self.silent = True  # met while waiting for credit: nothing came from the head for head_timeout_s
        return False

    def must_exit(self) -> bool:
        return self.silent or self.reclaimed_now or (self.stop is not None and self.stop.is_set())

    def head_silent(self) -> bool:
        return self.silent

    def reclaimed(self) -> bool:
        return self.reclaimed_now

    def close(self) -> None:
        self.closed = True


class FakeHead:
    """Stands in for `register` and `HeadLink`: registration n gets collector id 10 + n and links[n]; `refusals`
    registrations fail (HeadUnavailable) before each one that succeeds after the first."""

    def __init__(self, links: list[ScriptedLink], refusals: int = 0) -> None:
        self.links, self.refusals = links, refusals
        self.hellos: list[float] = []  # each attempt's timeout
        self.welcomes: list[Welcome] = []
        self._failed = 0

    def register(self, ctx, connect, slot, curve, timeout_s, should_stop=lambda: False) -> Welcome:
        self.hellos.append(timeout_s)
        if self.welcomes and self._failed < self.refusals:
            self._failed += 1
            raise HeadUnavailable("no WELCOME from inproc://control within 1 s")
        self._failed = 0
        self.welcomes.append(welcome(10 + len(self.welcomes)))
        return self.welcomes[-1]

    def link(self, ctx, w: Welcome, template, curve=None, should_stop=lambda: False) -> ScriptedLink:
        return self.links[[x.collector_id for x in self.welcomes].index(w.collector_id)]


@pytest.fixture
def head(monkeypatch):
    def install(links: list[ScriptedLink], refusals: int = 0) -> FakeHead:
        fake = FakeHead(links, refusals)
        monkeypatch.setattr(session, "register", fake.register)
        monkeypatch.setattr(session, "HeadLink", fake.link)
        return fake
    return install


def no_sleep_rejoin(give_up_s: float, slept: list[float]) -> Rejoin:
    return Rejoin(give_up_s, sleep=lambda stop, s: slept.append(s))


def weights(version: int, collector_id: int) -> tuple[int, dict]:
    """WEIGHTS of `version` as the link hands them over: another collector's initial network."""
    donor = Collector(config(), collector_id=collector_id, epsilon=0.1, link=FakeLink())
    donor.close()
    return version, cpu_state(donor.net.state_dict())


def seeds_of(collector_id: int) -> set[int]:
    """The env seeds (the stream field of ApeXCounting frames) of a collector with this id."""
    return {config().env.seed + 1000 * collector_id + i for i in range(K)}


# ---------------------------------------------------------------------------- the backoff and the give-up time
def test_rejoin_backs_off_from_1_s_doubling_to_30_s_and_gives_up_after_its_timeout() -> None:
    now = [0.0]
    slept: list[float] = []
    timeouts: list[float] = []

    def attempt(timeout_s: float) -> Welcome:
        timeouts.append(timeout_s)
        now[0] += min(timeout_s, 5.0)  # each attempt waits up to 5 s for a WELCOME that never comes
        raise HeadUnavailable("no WELCOME")

    def sleep(stop, seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    rejoin = Rejoin(300.0, clock=lambda: now[0], sleep=sleep)
    assert rejoin.register(attempt, StopFlag(), attempt_s=60.0) is None
    assert slept[:7] == [1, 2, 4, 8, 16, 30, 30] and set(slept[5:-1]) == {30}, slept
    assert now[0] == pytest.approx(300.0)  # gave up at the give-up time, not before, not a backoff later
    assert all(t <= 60.0 for t in timeouts) and timeouts[-1] < 60.0  # the last attempt ends at the give-up time


def test_rejoin_with_timeout_0_never_gives_up_and_retries_a_refusal_until_welcomed() -> None:
    slept: list[float] = []
    tries = iter([HeadUnavailable("the head refused the registration: retry later")] * 40 + [welcome(3)])

    def attempt(timeout_s: float) -> Welcome:
        assert timeout_s == 60.0
        result = next(tries)
        if isinstance(result, Exception):
            raise result
        return result

    got = Rejoin(0.0, clock=lambda: 1e9 + len(slept) * 1e6, sleep=lambda stop, s: slept.append(s)).register(
        attempt, StopFlag(), 60.0)
    assert got is not None and got.collector_id == 3 and len(slept) == 40 and max(slept) == 30.0


def test_rejoin_raises_an_unusable_welcome_and_stops_when_asked() -> None:
    def unusable(timeout_s: float) -> Welcome:
        raise RegistrationError("unusable WELCOME: data_token: expected hex")

    with pytest.raises(RegistrationError, match="unusable WELCOME"):
        Rejoin(100.0, sleep=lambda stop, s: None).register(unusable, StopFlag(), 1.0)
    stop = StopFlag()

    def refused_then_stopped(timeout_s: float) -> Welcome:
        stop.set()
        raise HeadUnavailable("no WELCOME")

    assert Rejoin(100.0, sleep=lambda stop, s: pytest.fail("paused after a stop")).register(
        refused_then_stopped, stop, 1.0) is None


# ---------------------------------------------------------------------------- the session
def test_a_remote_collector_registers_again_after_head_silence_and_resends_nothing(head, caplog) -> None:
    stop = StopFlag()
    first = ScriptedLink(accept=5, weights=weights(9, collector_id=90))
    second = ScriptedLink(accept=8, weights=weights(7, collector_id=91), stop=stop)  # a restarted head: older weights
    fake = head([first, second], refusals=3)
    slept: list[float] = []
    with caplog.at_level(logging.INFO, logger="actors"):
        reason = collect(None, "inproc://control", -1, stop, None, 60.0, no_sleep_rejoin(3600.0, slept))
    assert reason == "stop"
    assert [w.collector_id for w in fake.welcomes] == [10, 11] and len(fake.hellos) == 5  # 1 + 3 refused + 1
    assert slept == [1.0, 2.0, 4.0]
    assert first.closed and first.abandoned is not None and len(first.chunks) == 5
    # the new registration is a new collector: fresh episodes from its own env seeds, nothing of the old one
    old_seeds, new_seeds = seeds_of(10), seeds_of(11)
    assert {decode_frame(c.frames[0])[0] for c in first.chunks} <= old_seeds
    abandoned = {first.abandoned.frames.tobytes(), *(c.frames.tobytes() for c in first.chunks)}
    assert len(second.chunks) == 8 and not abandoned & {c.frames.tobytes() for c in second.chunks}
    for stream in range(K):
        mine = [c for c in second.chunks if c.stream == stream]
        seed, episode, t = decode_frame(mine[0].frames[0])
        assert seed in new_seeds and (episode, t) == (0, 0) and mine[0].flags[0] & FLAG_FIRST, (seed, episode, t)
        assert all(decode_frame(f)[0] == seed for c in mine for f in c.frames)
    # it acts with the new head's newest weights (7), not the version the lost head had sent (9)
    assert first.weight_version == 9 and second.weight_version == 7
    text = caplog.text
    assert "collector 10 leaves this registration (head_silent)" in text and "registering again" in text, text
    assert "collector 11 exiting (stop)" in text, text


def test_a_collector_that_gives_up_rejoining_ends_head_silent(head) -> None:
    fake = head([ScriptedLink(accept=2)], refusals=10**6)
    now = [0.0]

    def attempt_clock() -> float:
        now[0] += 1.0
        return now[0]

    rejoin = Rejoin(50.0, clock=attempt_clock, sleep=lambda stop, s: now.__setitem__(0, now[0] + s))
    assert collect(None, "inproc://control", -1, StopFlag(), None, 60.0, rejoin) == "head_silent"
    assert len(fake.welcomes) == 1 and len(fake.hellos) > 3


def test_a_child_of_the_head_exits_on_head_silence(head, caplog) -> None:
    link = ScriptedLink(accept=3)
    fake = head([link])
    with caplog.at_level(logging.INFO, logger="actors"):
        assert collect(None, "inproc://control", 0, StopFlag(), None, 60.0, rejoin=None) == "head_silent"
    assert len(fake.hellos) == 1 and link.closed
    assert "collector 10 exiting (head_silent)" in caplog.text and "registering again" not in caplog.text


def test_a_reclaimed_registration_is_retried_with_backoff_by_a_remote_collector_and_once_by_a_child(head) -> None:
    stop = StopFlag()
    fake = head([ScriptedLink(accept=2, reclaim=True), ScriptedLink(accept=2, stop=stop)], refusals=2)
    slept: list[float] = []
    assert collect(None, "inproc://control", -1, stop, None, 60.0, no_sleep_rejoin(3600.0, slept)) == "stop"
    assert len(fake.welcomes) == 2 and len(fake.hellos) == 4 and slept == [1.0, 2.0]
    fake = head([ScriptedLink(accept=2, reclaim=True)], refusals=1)
    with pytest.raises(HeadUnavailable):  # a child of the head: one try, then its supervisor takes over
        collect(None, "inproc://control", 0, StopFlag(), None, 60.0, rejoin=None)
    assert len(fake.hellos) == 2


# ---------------------------------------------------------------------------- the exit reason
def test_head_silence_met_while_waiting_for_credit_is_reported_as_head_silent() -> None:
    link = ScriptedLink(accept=4)
    col = Collector(config(), collector_id=1, epsilon=0.1, link=link)
    try:
        assert col.run() == "head_silent"
    finally:
        col.close()
    assert link.abandoned is not None  # it was blocked on a chunk when the silence was noticed


def test_a_send_abandoned_without_a_reason_to_exit_is_reported_as_send() -> None:
    class Refusing(FakeLink):
        def send_chunk(self, chunk) -> bool:
            return False

    col = Collector(config(), collector_id=1, epsilon=0.1, link=Refusing())
    try:
        assert col.run() == "send"
    finally:
        col.close()


# ---------------------------------------------------------------------------- the command line
def test_who_rejoins_by_default_and_what_a_launcher_passes_its_collectors() -> None:
    remote = parse_args(["--connect", "tcp://h:5555", "--collectors", "8"])
    head_child = parse_args(["--connect", "tcp://h:5555", "--slot", "0", "--parent-pid", "4321"])
    assert rejoin_timeout(remote) == DEFAULT_REJOIN_TIMEOUT_S == 86400.0
    assert rejoin_timeout(head_child) is None
    assert rejoin_timeout(parse_args(["--connect", "tcp://h:5555", "--slot", "0", "--parent-pid", "4321",
                                      "--rejoin-timeout", "0"])) == 0.0
    # the launcher's children have --parent-pid (the launcher): its rule goes along explicitly
    child = parse_args(child_argv(remote, 3)[3:])
    assert child.parent_pid and child.slot == 3 and rejoin_timeout(child) == DEFAULT_REJOIN_TIMEOUT_S
    launched_by_head = parse_args(["--connect", "tcp://h:5555", "--collectors", "2", "--parent-pid", "4321"])
    assert "--rejoin-timeout" not in child_argv(launched_by_head, 0)
    assert rejoin_timeout(parse_args(child_argv(launched_by_head, 0)[3:])) is None


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_rejoin_timeout_is_refused_in_one_line_with_exit_2(value: str) -> None:
    assert "--rejoin-timeout must be" in option_error(parse_args(["--connect", "tcp://h:1", "--rejoin-timeout",
                                                                   value]))
    proc = subprocess.run([sys.executable, "-m", "actors", "--connect", "tcp://127.0.0.1:9", "--slot", "0",
                           "--rejoin-timeout", value], cwd=ROOT, env=head_env(), capture_output=True, text=True,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--rejoin-timeout must be" in lines[0], proc.stderr

