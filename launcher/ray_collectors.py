"""Collectors as Ray actors: the third implementation of the head's `Collectors` seam.

`--launcher ray [--ray-address ADDR]`: the head stays where it is started (learner, replay and
sockets do not move), joins the Ray cluster as a driver and creates `--collectors N` actors
(actors/ray_actor.py), one CPU each, spread over the cluster's nodes (SPREAD scheduling). Each
runs the collector code of `python -m actors --connect` and registers with the head like any
collector, so the head's registration gives each its slot's Ape-X epsilon and a fresh collector
id whatever node it is on.

Supervision is Ray's: an actor whose process dies (a crash, its node lost, `ray.kill`) is
restarted on any node with a free CPU (max_restarts=-1), and calls to it are retried on the new
incarnation (max_task_retries=-1). The head only notices the new incarnation (a new pid and key
from `identity()`), admits its CURVE key, frees the old registration and counts the restart. A
collector alive but not stepping for transport.stall_timeout_s is killed through Ray, which
restarts it. The actors are owned by the head's driver: if the head dies, Ray removes them (fate
sharing, as PR_SET_PDEATHSIG does for local children); a graceful stop asks each to stop, then
kills it without restart.

Keys: only public keys go through Ray (see actors/ray_actor.py). The head passes its server
public key and admits each actor's own public key on its ZAP allowlist; client secrets are made
inside the actors and never leave them, so Ray's control store, object store and logs hold none.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from shared.config import ConfigError
from shared.keys import AllowList

log = logging.getLogger("mario_apex.ray")

RAY_NAMESPACE = "mario-apex"  # the actors' names (mario-apex-<head pid>-collector-<slot>) live here
IDENTITY_EVERY_S = 1.0  # how often each actor is asked who it is (how soon a restart is noticed)
RAY_MISSING = "--launcher ray needs Ray, which is not installed here: pip install -e '.[ray]' (make run EXTRAS=ray)"


def import_ray() -> Any:
    """Ray, imported only when the Ray launcher is used; ConfigError (one line) when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def connect_endpoint(control_endpoint: str, head_ip: str) -> str:
    """The control endpoint as actors on other nodes reach it: a wildcard bind becomes the head node's IP."""
    parts = urlsplit(control_endpoint)
    if parts.hostname in ("0.0.0.0", "*"):
        return f"tcp://{head_ip}:{parts.port}"
    return control_endpoint


def _is_loopback(host: str | None) -> bool:
    return bool(host) and (host.startswith("127.") or host == "localhost")


@dataclass
class _Actor:
    slot: int
    name: str
    handle: Any
    pending: Any = None  # the outstanding identity() call (an ObjectRef)
    asked_at: float = float("-inf")
    identity: dict | None = None  # the incarnation admitted last
    started_at: float = 0.0  # when that incarnation was admitted (the stall check's start)
    stall_killed: bool = False  # killed for stalling; not again until a new incarnation shows up


class RayCollectors:
    """Creates, watches and removes `count` collector actors on a Ray cluster (see the module doc)."""

    def __init__(
        self,
        count: int,
        control_endpoint: str,
        server_public: bytes | None,
        allow: AllowList | None,
        stall_clock: Callable[[int, str], tuple[float, bool] | None],
        stall_timeout_s: float,
        on_exit: Callable[[int, str], None] = lambda pid, host: None,
        address: str = "",
        register_timeout_s: float = 60.0,
    ) -> None:
        self._ray = ray = import_ray()
        self._count = count
        self._server_public = server_public
        self._allow = allow
        self._stall_clock = stall_clock
        self._stall_timeout_s = stall_timeout_s
        self._on_exit = on_exit
        self._timeout = register_timeout_s
        self._actors: list[_Actor] = []
        self._stopping = False
        self.restarts_total = 0
        self.stall_kills = 0
        try:  # "" = Ray's own rule: RAY_ADDRESS if set, else a new single-node Ray on this machine
            ray.init(address=address or None, namespace=RAY_NAMESPACE, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            hint = " (start one with `ray start --head`)" if address else ""
            raise ConfigError(f"--ray-address {address or '(none)'}: cannot join a Ray cluster{hint}: "
                              f"{' '.join(str(exc).split())}") from None
        self._connected = True
        head_ip = ray.util.get_node_ip_address()
        self.connect = connect_endpoint(control_endpoint, head_ip)
        bind_host = urlsplit(control_endpoint).hostname
        others = sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")} - {head_ip})
        if _is_loopback(bind_host) and others:
            self.close()
            raise ConfigError(f"transport.bind={bind_host} cannot be reached from the cluster's other machines "
                              f"({', '.join(others[:4])}): bind 0.0.0.0 (or this node's address {head_ip}) with "
                              "--curve-keys")
        self._tag = f"mario-apex-{os.getpid()}"  # actor names: `ray list actors` shows whose they are
        log.info("Ray cluster: %d alive node(s), %s CPUs; collectors connect to %s",
                 sum(1 for n in ray.nodes() if n.get("Alive")), ray.cluster_resources().get("CPU", 0), self.connect)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        from actors.ray_actor import CollectorActor

        remote_cls = self._ray.remote(CollectorActor)
        for slot in range(self._count):
            name = f"{self._tag}-collector-{slot}"
            handle = remote_cls.options(
                name=name, num_cpus=1, max_restarts=-1, max_task_retries=-1, scheduling_strategy="SPREAD",
            ).remote(self.connect, slot, self._server_public, self._timeout)
            self._actors.append(_Actor(slot, name, handle))
        log.info("%d collector actors requested (one CPU each, spread over the nodes)", self._count)

    def pids(self) -> list[int]:
        return []  # nothing local to SIGKILL: actors are owned by this driver and die with it

    def poll(self) -> None:
        """Notice new incarnations (admit them, count restarts) and kill stalled collectors (Ray restarts them)."""
        if self._stopping or not self._actors:
            return
        ray = self._ray
        now = time.monotonic()
        pending = [a.pending for a in self._actors if a.pending is not None]
        done = set(ray.wait(pending, num_returns=len(pending), timeout=0)[0]) if pending else set()
        for actor in self._actors:
            if actor.pending is not None and actor.pending in done:
                ref, actor.pending = actor.pending, None
                try:
                    self._seen(actor, ray.get(ref), now)
                except ray.exceptions.RayError as exc:  # e.g. out of restarts: asked again next time
                    log.warning("collector actor %s: %s", actor.name, " ".join(str(exc).split())[:300])
            if actor.pending is None and now - actor.asked_at >= IDENTITY_EVERY_S:
                actor.pending = actor.handle.identity.remote()
                actor.asked_at = now
            if actor.identity is not None and not actor.stall_killed and self._stalled(actor, now):
                log.warning("collector slot %d (%s, pid %d) sent nothing for %.0f s while the head was ready to "
                            "read (not stepping); killing it for Ray to restart", actor.slot, actor.identity["host"],
                            actor.identity["pid"], self._stall_timeout_s)
                ray.kill(actor.handle, no_restart=False)
                actor.stall_killed = True
                self.stall_kills += 1

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask every actor to stop (sockets closed cleanly), wait up to `grace_s`, then kill them without restart.

        Their keys stay admitted until the head closes its sockets: `ray.kill` is asynchronous, and the
        head's ZAP thread may still be answering a handshake an actor began before it was told to stop.
        Refusing that would log a "ZAP DENIED" that names no misconfiguration; the secrets never left
        the actors' processes, which are going away."""
        if self._stopping:
            return
        self._stopping = True
        ray = self._ray
        if self._actors:
            stops = [a.handle.stop.remote(grace_s) for a in self._actors]
            ray.wait(stops, num_returns=len(stops), timeout=grace_s)
            for actor in self._actors:
                ray.kill(actor.handle, no_restart=True)
                if actor.identity is not None:  # registration freed; the key stays admitted (see above)
                    self._on_exit(actor.identity["pid"], actor.identity["host"])
            log.info("%d collector actors removed from the cluster", len(self._actors))
        self._actors.clear()
        self.close()

    def close(self) -> None:
        """Leave the cluster (a Ray this head started for itself is shut down with it). Idempotent."""
        if getattr(self, "_connected", False):
            self._connected = False
            self._ray.shutdown()

    # ------------------------------------------------------------------ internals
    def _seen(self, actor: _Actor, ident: dict, now: float) -> None:
        known = actor.identity
        key = (ident["node_id"], ident["pid"], ident["public_key"])
        if known is not None and key == (known["node_id"], known["pid"], known["public_key"]):
            return  # the incarnation already admitted
        if known is not None:
            self.restarts_total += 1
            log.warning("collector slot %d restarted by Ray: pid %d on node %s -> pid %d on node %s (restart #%d)",
                        actor.slot, known["pid"], known["node_id"][:12], ident["pid"], ident["node_id"][:12],
                        self.restarts_total)
            self._retire(known)
        if ident["public_key"]:
            if self._allow is None:
                raise RuntimeError("an actor has a CURVE key but the head runs without CURVE")
            self._allow.add(ident["public_key"])
        actor.handle.admit.remote(ident["public_key"])  # fire and forget: the actor checks it is its own key
        actor.identity, actor.started_at, actor.stall_killed = ident, now, False
        log.info("collector slot %d: actor %s on node %s (host %s, pid %d)", actor.slot, actor.name,
                 ident["node_id"], ident["host"], ident["pid"])

    def _retire(self, ident: dict) -> None:
        """An incarnation is gone: its key is no longer admitted and its registration is freed."""
        if ident["public_key"] and self._allow is not None:
            self._allow.discard(ident["public_key"])
        self._on_exit(ident["pid"], ident["host"])

    def _stalled(self, actor: _Actor, now: float) -> bool:
        from launcher.supervisor import stalled

        ident = actor.identity
        return stalled(actor.started_at, self._stall_clock(ident["pid"], ident["host"]), now, self._stall_timeout_s)
