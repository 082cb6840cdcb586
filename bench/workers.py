"""Spawned bench workers that start once and then run timed commands: start-up stays outside every window."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

STARTUP_TIMEOUT_S = 120.0  # spawn + torch import + K env builds on a loaded 2-core box


class WorkerGroup:
    """Spawned workers that build their envs once, then run timed commands on request.

    Start-up (spawn, imports, K env builds: ~1 s per Mario env on a loaded 2-core box) happens
    once per group, outside every timed window, so several measurements share one start-up.
    Each target is called as target(*args, cmd_q, ready_q, result_q, stop_evt): it puts its
    index on ready_q when built, then answers each command from cmd_q on result_q until None.
    """

    def __init__(self, target: Callable[..., None], args_list: list[tuple[Any, ...]], data_queue: Any = None) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.ready_q, self.result_q, self.stop_evt = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.cmd_qs = [ctx.Queue() for _ in args_list]
        self.data_queue = data_queue
        self._early: list[Any] = []  # results that arrived before the call that asks for them (see results)
        self.procs = [
            ctx.Process(target=target, args=(*a, cq, self.ready_q, self.result_q, self.stop_evt), daemon=True)
            for a, cq in zip(args_list, self.cmd_qs, strict=True)
        ]

    def __enter__(self) -> WorkerGroup:
        t0 = time.perf_counter()
        for p in self.procs:
            p.start()
        try:
            self._await(self.ready_q, len(self.procs), "ready")
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - t0  # reported so the bench's own wall time is explained
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def send(self, indices: list[int], command: Any) -> None:
        for i in indices:
            self.cmd_qs[i].put(command)

    def results(self, count: int, key: str | None = None) -> list[Any]:
        """`count` results; with `key`, `count` results that carry that key. A command answered twice (say
        "registered", later "sent") can interleave across workers on a loaded machine, one worker's second
        answer arriving before another's first: such an answer waits for the call that asks for its key."""
        if key is None:
            return self._await(self.result_q, count, "result")
        got: list[Any] = []
        rest: list[Any] = []
        for item in self._early:
            (got if key in item and len(got) < count else rest).append(item)
        self._early = rest
        while len(got) < count:
            for item in self._await(self.result_q, 1, f"result with {key!r}"):
                (got if key in item else self._early).append(item)
        return got

    def close(self) -> None:
        self.stop_evt.set()
        for cq in self.cmd_qs:
            cq.put(None)
        deadline = time.monotonic() + 10.0
        while any(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
            discard(self.data_queue)  # a child cannot exit while its queue feeder still holds data
            time.sleep(0.02)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
            p.join(timeout=5.0)

    def _await(self, q: Any, count: int, what: str) -> list[Any]:
        got: list[Any] = []
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(got) < count:
            try:
                item = q.get(timeout=0.1)
            except queue.Empty:
                discard(self.data_queue)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{count - len(got)} of {count} workers sent no {what} in {STARTUP_TIMEOUT_S:.0f} s") from None
                dead = [p for p in self.procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"worker exited with code {dead[0].exitcode} before sending its {what}") from None
                continue
            if isinstance(item, dict) and "error" in item:
                raise RuntimeError(f"worker failed: {item['error']}")
            got.append(item)
        return got


def discard(q: Any) -> None:
    if q is None:
        return
    try:
        while True:
            q.get_nowait()
    except (queue.Empty, OSError, ValueError):
        pass
