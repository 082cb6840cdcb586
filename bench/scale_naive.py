"""The naive design's two processes in the scale simulation (bench/scale.py): the seed's head and collectors.

Head: a drain thread moving pickled transitions from one shared `multiprocessing.Queue` into a
locked `deque` (bench.baselines.naive_drain), and a consumer sampling with `random.sample` under
the lock, then `np.stack` per field. Senders: each synthetic collector puts one
(state, action, reward, next_state, done) transition at a time, cut from the recorded chunks.
"""

from __future__ import annotations

import heapq
import queue
import random
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from bench.baselines import naive_drain
from bench.scale_consumer import PREFILL_TRANSITIONS, SAMPLE_BATCH, STACK, Consumer, measure_window

NAIVE_CAPACITY = 16_384  # deque length: 56 KiB per transition (0.9 GiB), our replay holds the profile's
NAIVE_QUEUE_MAX = 2048  # items on the naive queue before put() refuses (bounds the backlog's memory)


def naive_transitions(limit: int = 256) -> list[tuple[np.ndarray, int, float, np.ndarray, bool]]:
    """(state, action, reward, next_state, done) of the seed's collector, cut from the recorded chunks."""
    from bench.recorded import load_chunks

    chunks, _ = load_chunks()
    out = []
    for c in chunks:
        for i in range(max(c.first_start, STACK - 1), c.num_frames - 1):
            if c.actions[i] < 0:
                continue
            s, s2 = c.frames[i - STACK + 1:i + 1], c.frames[i - STACK + 2:i + 2]
            out.append((np.ascontiguousarray(s), int(c.actions[i]), float(c.rewards[i]), np.ascontiguousarray(s2), False))
            if len(out) >= limit:
                return out
    return out


def naive_head(data_q: Any, cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any) -> None:
    """The seed's head: a drain thread (queue -> locked deque) and a consumer (random.sample + np.stack)."""
    try:
        replay: deque[tuple[Any, ...]] = deque(maxlen=NAIVE_CAPACITY)
        lock = threading.Lock()
        base = naive_transitions()
        for i in range(PREFILL_TRANSITIONS):
            s, a, r, s2, d = base[i % len(base)]
            replay.append((s.copy(), a, r, s2.copy(), d))
        consumed = [0]
        stop = threading.Event()
        drain_tid: list[int] = []

        def drain() -> None:
            drain_tid.append(threading.get_native_id())
            naive_drain(data_q, replay, lock, consumed, stop)

        def sample_once() -> None:
            with lock:
                batch = random.sample(replay, SAMPLE_BATCH)
            for column in zip(*batch, strict=True):  # the seed's batching: one np.stack per field
                np.stack(column)

        drainer = threading.Thread(target=drain, name="naive-drain", daemon=True)
        drainer.start()
        consumer = Consumer(sample_once)
        consumer.start()
        ready_q.put(0)
        try:
            while (command := cmd_q.get()) is not None:
                kind = command[0]
                if kind == "measure":
                    _, seconds, pace = command
                    res = measure_window(consumer, lambda: consumed[0], seconds, pace,
                                         drain_tid[0] if drain_tid else None)
                    result_q.put({**res, "replay_len": len(replay)})
                elif kind == "settle":  # the backlog of the last row is not the next row's ingest
                    deadline = time.monotonic() + 30.0
                    last = -1
                    while time.monotonic() < deadline and consumed[0] != last:
                        last = consumed[0]
                        time.sleep(0.3)
                    result_q.put({"consumed": consumed[0]})
        finally:
            stop.set()
            consumer.stop_event.set()
            drainer.join(5.0)
            consumer.join(5.0)
    except Exception as exc:  # noqa: BLE001
        result_q.put({"error": f"{type(exc).__name__}: {exc}"})


def naive_senders(index: int, data_q: Any, cmd_q: Any, ready_q: Any, result_q: Any, stop_evt: Any) -> None:
    """Per command ("run", None, k, rate, start_at, seconds): k collectors putting one transition at a time."""
    try:
        base = naive_transitions()
        ready_q.put(index)
        while (command := cmd_q.get()) is not None:
            _, _, k, rate, start_at, seconds = command
            result_q.put({"index": index, "registered": k})
            while time.time() < start_at:
                time.sleep(0.005)
            now = time.monotonic()
            end = now + seconds
            period = 1.0 / rate if rate else 0.0
            due = [(now + (j / max(1, k)) * period, j) for j in range(k)]
            heapq.heapify(due)
            sent = blocked = 0
            cursor = index * 31
            while now < end:
                t_due, j = due[0]
                if t_due > now:
                    time.sleep(min(t_due - now, 0.05))
                    now = time.monotonic()
                    continue
                try:
                    data_q.put_nowait(base[cursor % len(base)])  # pickled by the queue's feeder thread
                except queue.Full:  # the head is behind: this collector falls behind
                    blocked += 1
                    time.sleep(0.001)
                    now = time.monotonic()
                    continue
                cursor += 1
                sent += 1
                heapq.heapreplace(due, (max(t_due + period, now - 2 * period), j))
                now = time.monotonic()
            result_q.put({"index": index, "sent_transitions": sent, "held_back": blocked, "seconds": seconds})
    except Exception as exc:  # noqa: BLE001
        result_q.put({"error": f"{type(exc).__name__}: {exc}"})
