"""StopFlag: what signal handlers set. A handler runs between two bytecodes of anything the main thread
does, including a previous run of itself; these tests run a second set() at every line of the first."""

from __future__ import annotations

import sys
import threading

from shared.stop_flag import StopFlag


def _set_interrupted_at_every_line(flag) -> None:
    """flag.set(), with a nested flag.set() at each line it executes, as a second signal's handler would run."""
    nested = [False]

    def tracer(frame, event, _arg):
        if event == "line" and not nested[0]:
            nested[0] = True
            try:
                flag.set()
            finally:
                nested[0] = False
        return tracer

    sys.settrace(tracer)
    try:
        flag.set()
    finally:
        sys.settrace(None)


def test_set_interrupted_by_another_set_returns_and_is_set():
    flag = StopFlag()
    done = threading.Event()

    def body():
        _set_interrupted_at_every_line(flag)
        done.set()

    threading.Thread(target=body, daemon=True).start()
    assert done.wait(60), "a set() interrupted by another set() never returned"
    assert flag.is_set()


def test_wait_returns_at_once_when_set_and_times_out_when_not():
    flag = StopFlag()
    assert flag.wait(0.0) is False
    flag.set()
    assert flag.wait(3600) is True  # set already: no sleep at all


def test_wait_wakes_when_another_thread_sets_it():
    flag = StopFlag(poll_s=0.001)
    waiting = threading.Event()
    result: list[bool] = []

    def body():
        waiting.set()
        result.append(flag.wait(3600))

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert waiting.wait(60)
    flag.set()
    thread.join(60)
    assert result == [True]
