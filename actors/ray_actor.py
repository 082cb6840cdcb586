"""One collector as a Ray actor: the same `actors.session.collect` as `python -m actors --connect`.

Ray only places and supervises (the data plane stays ZeroMQ + CURVE + credits): the head
(launcher/ray_collectors.py) creates one `CollectorActor` per slot with `num_cpus=1` and a
restart budget. Its constructor starts the collector on a thread of the actor's process, so an
actor that Ray restarts (a new process, the constructor run again) collects again by itself.

CURVE without secrets in Ray. Ray keeps an actor's constructor arguments in its control store
(to restart the actor) and method results in its object store, and may log either, so no
secret key ever goes through them. Each incarnation makes its own client key pair here
(`zmq.curve_keypair`), and the secret stays in this process's memory: it is never returned,
logged or written. Only public keys cross Ray: the head's server public key comes in as an
argument, this actor's public key goes back through `identity()`. The head adds that key to its
ZAP allowlist and calls `admit(key)`, and only then does the collector send its HELLO. A
restarted actor has a new key, which the head admits the same way (and drops the old one).

A collector that ends by itself (head silence, an error, a failed registration) makes the
process exit with status 1 after a pause, which Ray counts as a crash and restarts; one told
to stop (`stop()`, or the head's STOP broadcast) just ends, and the head removes the actor.
"""

from __future__ import annotations

import logging
import os
import socket as pysocket
import threading
import time

log = logging.getLogger("actors")

CRASH_PAUSE_S = 2.0  # before exiting for a restart: a collector failing at start cannot spin the cluster
ADMIT_POLL_S = 0.5


class CollectorActor:
    """Wrapped with `ray.remote(...)` by the head; plain class here so actors/ needs no Ray to import."""

    def __init__(self, connect: str, slot: int, server_public: bytes | None, register_timeout_s: float = 60.0) -> None:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")  # one CPU per actor: extra BLAS threads only contend
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s[%(process)d] %(message)s")
        import zmq

        from shared.keys import CurveClient

        self._connect = connect
        self._slot = slot
        self._timeout = register_timeout_s
        self._curve = None
        if server_public:
            public, secret = zmq.curve_keypair()  # this incarnation's own pair; the secret stays here
            self._curve = CurveClient(public, secret, server_public)
        self._stop = threading.Event()
        self._admitted = threading.Event()
        self.ended = ""
        self._thread = threading.Thread(target=self._body, name=f"collector-{slot}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ called by the head
    def identity(self) -> dict:
        """Who this incarnation is: node, host, pid and CURVE public key (z85; "" without CURVE). Nothing secret."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": pysocket.gethostname(),
                "pid": os.getpid(), "public_key": self._curve.public.decode() if self._curve else "",
                "ended": self.ended}

    def admit(self, public_key: str) -> bool:
        """The head has allowed `public_key`: start registering if it is this incarnation's key.

        A call meant for an earlier incarnation (Ray retries calls on a restarted actor) names an old
        key and is ignored: this incarnation waits for its own key to be admitted."""
        mine = self._curve.public.decode() if self._curve else ""
        if public_key == mine:
            self._admitted.set()
        return self._admitted.is_set()

    def stop(self, timeout_s: float = 5.0) -> str:
        """End the collector cleanly (sockets closed with linger 0); returns why it ended."""
        self._stop.set()
        self._thread.join(timeout_s)
        return self.ended or "stop"

    # ------------------------------------------------------------------ the collector thread
    def _body(self) -> None:
        import zmq

        from actors.client import RegistrationError
        from actors.session import collect

        while not self._admitted.wait(ADMIT_POLL_S):
            if self._stop.is_set():
                self.ended = "stop"
                return
        started = time.monotonic()
        ctx = zmq.Context()
        try:
            reason = collect(ctx, self._connect, self._slot, self._stop, self._curve, self._timeout)
        except RegistrationError as exc:
            reason = f"registration failed: {exc}"
        except Exception:  # noqa: BLE001 - logged with its traceback; the restart is Ray's
            log.exception("collector slot %d failed", self._slot)
            reason = "error"
        finally:
            ctx.destroy(linger=0)  # not term(): a socket a failed path left open would block it forever
        self.ended = reason
        if self._stop.is_set() or reason == "stop":
            return  # asked to stop: the head removes the actor
        log.warning("collector slot %d ended (%s) after %.0f s; exiting so Ray restarts it", self._slot, reason,
                    time.monotonic() - started)
        time.sleep(CRASH_PAUSE_S)
        os._exit(1)  # not ray.actor.exit_actor(): that is a deliberate exit, which Ray does not restart
