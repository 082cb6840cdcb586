"""The scale simulation's stand-in for a GPU learner, and the steady window a head measures.

`Consumer` samples batches of SAMPLE_BATCH from a head's replay as fast as it can (or at a set
pace) and keeps each sample's latency; `measure_window` reads, in the head's process, what was
ingested and sampled over one window and the CPU the head, its ingest thread and ZeroMQ's I/O threads used.
Both designs of bench/scale.py (ours, the naive one in bench/scale_naive.py) use them.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np

from bench import cpu_time

SAMPLE_BATCH = 512
PREFILL_TRANSITIONS = 4096  # written before any window so the consumer samples from the first second
STACK = 4  # frames per state (the Mario geometry of the recorded chunks)
ZMQ_IO_THREADS = "ZMQbg/IO/"  # how libzmq names its I/O threads (ZMQbg/IO/0, ...)


class Consumer(threading.Thread):
    """Samples batches as fast as it can (or at `pace` batches/s) and keeps each sample's latency."""

    def __init__(self, sample_once: Any) -> None:
        super().__init__(name="scale-consumer", daemon=True)
        self.sample_once = sample_once  # () -> None: one batch, priorities written back where the design has them
        self.pace: float | None = None
        self.batches = 0
        self.latencies: list[float] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        next_at = time.perf_counter()
        while not self.stop_event.is_set():
            if self.pace:
                now = time.perf_counter()
                if now < next_at:
                    time.sleep(next_at - now)
                next_at = max(next_at + 1.0 / self.pace, time.perf_counter() - 1.0 / self.pace)
            t0 = time.perf_counter()
            self.sample_once()
            self.latencies.append(time.perf_counter() - t0)
            self.batches += 1


def measure_window(consumer: Consumer, ingested: Any, seconds: float, pace: float | None,
            ingest_tid: int | None) -> dict[str, Any]:
    """Measure one steady window in the head process: ingest, sampling, CPU of the head and its ingest thread."""
    consumer.pace = pace
    time.sleep(0.2)  # the consumer's pace changed: let it settle
    pid = os.getpid()
    b0, n0, l0 = consumer.batches, ingested(), len(consumer.latencies)
    z0 = cpu_time.named_threads_cpu_s(ZMQ_IO_THREADS)
    c0, i0, t0 = cpu_time.process_cpu_s(pid), cpu_time.thread_cpu_s(ingest_tid) if ingest_tid else None, time.perf_counter()
    time.sleep(seconds)
    b1, n1, lat = consumer.batches, ingested(), consumer.latencies[l0:]
    c1, i1, t1 = cpu_time.process_cpu_s(pid), cpu_time.thread_cpu_s(ingest_tid) if ingest_tid else None, time.perf_counter()
    z1 = cpu_time.named_threads_cpu_s(ZMQ_IO_THREADS)
    dt = t1 - t0
    del consumer.latencies[:]
    return {
        "ingested_tps": (n1 - n0) / dt, "sample_batches_per_s": (b1 - b0) / dt, "window_s": dt,
        "sample_p50_ms": float(np.percentile(lat, 50) * 1e3) if lat else None,
        "sample_p99_ms": float(np.percentile(lat, 99) * 1e3) if lat else None,
        "head_cpu_frac": (c1 - c0) / dt if c0 is not None and c1 is not None else None,
        "ingest_thread_cpu_frac": (i1 - i0) / dt if i0 is not None and i1 is not None else None,
        # ZeroMQ's I/O threads: the sockets' reads and writes, CURVE's encryption and decryption where it is on
        "zmq_io_cpu_frac": (z1 - z0) / dt if z0 is not None and z1 is not None else None,
    }
