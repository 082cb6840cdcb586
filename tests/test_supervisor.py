"""The supervisor's stall rule (launcher/supervisor.py `stalled`): a collector is stalled when the head was
ready to read from it and heard nothing for the stall timeout; flow control and start-up are not stalls."""

from __future__ import annotations

import pytest

from launcher.supervisor import STARTUP_ALLOWANCE_S, stalled

T = 3.0  # stall timeout
START = 1000.0  # when the process was started (monotonic seconds)


@pytest.mark.parametrize(
    ("clock", "now", "expected"),
    [
        (None, START + 2 * T, False),  # not registered yet: starting (imports, emulators), not stepping
        (None, START + STARTUP_ALLOWANCE_S - 1, False),
        (None, START + STARTUP_ALLOWANCE_S + 1, True),  # a start that hangs is cut
        ((START + 5.0, False), START + 5.0 + T - 0.1, False),  # heard recently
        ((START + 5.0, False), START + 5.0 + T + 0.1, True),  # registered, then silent past the timeout
        ((START + 5.0, True), START + 500.0, False),  # its chunks held by the head: waiting, however long
        ((START - 50.0, False), START + T - 0.1, False),  # a clock older than this process counts from its start
        ((START - 50.0, False), START + T + 0.1, True),
    ],
)
def test_stalled(clock, now, expected):
    assert stalled(START, clock, now, T) is expected


def test_a_stall_timeout_longer_than_the_startup_allowance_wins():
    long = STARTUP_ALLOWANCE_S * 2
    assert not stalled(START, None, START + STARTUP_ALLOWANCE_S + 1, long)
    assert stalled(START, None, START + long + 1, long)
