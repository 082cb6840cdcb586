"""One collector's life: register, connect, collect until told to stop, close.

Shared by the collector process (`python -m actors --slot i`, which adds signals and its own
ZeroMQ context) and the in-process mode (collectors as threads of the head, sharing its
context and talking to it over `inproc://` with the same messages, byte for byte).
"""

from __future__ import annotations

import logging

import zmq

from actors.client import HeadLink, register
from actors.collector import Collector
from shared.keys import CurveClient
from shared.stop_flag import StopRequest
from shared.weights import network_template

log = logging.getLogger("actors")


def collect(ctx: zmq.Context, connect: str, slot: int, stop: StopRequest, curve: CurveClient | None = None,
            register_timeout_s: float = 60.0) -> str:
    """Run one collector until STOP, head silence or `stop`; returns why it ended. A collector whose
    registration the head reclaimed (it stopped sending CREDIT) registers again with a new HELLO.

    Raises RegistrationError when the head does not answer (or refuses) within the timeout."""
    while True:
        reason, reclaimed = _collect_once(ctx, connect, slot, stop, curve, register_timeout_s)
        if not reclaimed or stop.is_set():
            return reason


def _collect_once(ctx: zmq.Context, connect: str, slot: int, stop: StopRequest, curve: CurveClient | None,
                  register_timeout_s: float) -> tuple[str, bool]:
    """One registration's life: (why it ended, whether the head had reclaimed it)."""
    welcome = register(ctx, connect, slot, curve, register_timeout_s, should_stop=stop.is_set)
    eps = welcome.epsilons or (welcome.epsilon,)
    log.info("registered as collector %d (slot %d, eps %.4f..%.4f over %d streams), data -> %s", welcome.collector_id,
             welcome.slot, max(eps), min(eps), len(eps), welcome.data_endpoint)
    template = network_template(welcome.config)
    link = HeadLink(ctx, welcome, template, curve, should_stop=stop.is_set)
    collector = None
    try:
        collector = Collector(welcome.config, welcome.collector_id, welcome.epsilons or welcome.epsilon, link)
        reason = collector.run()
        t = collector.timing
        reclaimed = link.reclaimed() and not stop.is_set()
        if reclaimed:
            log.warning("collector %d: the head reclaimed this registration (no CREDIT on its data socket for over "
                        "%.0f s while the head kept publishing); registering again", welcome.collector_id,
                        link.reclaim_after_s)
            reason = "reclaimed"
        log.info("collector %d exiting (%s) after %d steps, overhead %.1f%% of env time, %.1f s waiting for credit",
                 welcome.collector_id, reason, t.steps, 100 * t.overhead_frac if t.env_s else 0.0, link.credit_wait_s)
        return reason, reclaimed
    finally:
        if collector is not None:
            collector.close()
        link.close()
