"""Replay micro-benchmark: insert rate, PER sample latency vs a copy floor and the naive deque.

Single-threaded (OMP 1, torch 1 thread), 84x84 uint8 frames, chunks of 128 transitions with
3 context + 3 lookahead frames, stack 4, n = 3. Inserts are measured as the head makes them,
INSERT_BATCH chunks per `add_chunks` call, and one chunk per `add_chunk` beside it. Sample latencies are medians over interleaved
repetitions (ours, naive, copy floor in turn) so a noisy shared machine biases all alike.
The copy floor is one contiguous `np.copyto` of exactly the bytes a 512-batch returns (both
stacks), i.e. what any gather must at least move.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from bench.naive_replay import NaiveReplay
from ingest.consolidation import INSERT_BATCH
from replay.buffer import ReplayBuffer
from shared.chunk import FLAG_FIRST, NO_ACTION, TransitionChunk

OBS = (84, 84)
STACK, N_STEP, CHUNK = 4, 3, 128
INSERT_ROUNDS = 6


def bench_chunks(count: int, rng: np.random.Generator) -> list[TransitionChunk]:
    """One long episode cut like a collector would: 3 context frames, 128 new, 3 lookahead."""
    frames_per = (STACK - 1) + CHUNK + N_STEP
    out = []
    for k in range(count):
        frames = rng.integers(0, 256, size=(frames_per, *OBS), dtype=np.uint8)
        actions = rng.integers(0, 7, size=frames_per).astype(np.int32)
        actions[-1] = NO_ACTION
        flags = np.zeros(frames_per, dtype=np.uint8)
        if k == 0:
            flags[0] = FLAG_FIRST
        out.append(TransitionChunk(0, STACK - 1, frames, actions, rng.random(frames_per).astype(np.float32),
                                   flags, rng.random(frames_per).astype(np.float32)))
    return out


def _added(results: list[int | ValueError]) -> int:
    """Transitions a batch added; the bench's chunks are all valid, so a refusal is a bug: raise it."""
    for r in results:
        if isinstance(r, ValueError):
            raise r
    return sum(results)  # type: ignore[arg-type]


def _median_ms(times: list[float]) -> float:
    return float(np.median(times) * 1e3)


class _CopyFloor:
    """The memory-bandwidth floor for inserts: the same frames copied into successive slots of a
    plain ring, nothing else (same bytes, same fresh destinations as the buffer's writes)."""

    def __init__(self, capacity: int) -> None:
        self.ring = np.zeros((capacity, *OBS), dtype=np.uint8)
        self.ring[:] = 1  # touch every page first, as the buffer's storage is
        self.pos = 0

    def copy(self, frames: np.ndarray) -> None:
        if self.pos + len(frames) > len(self.ring):
            self.pos = 0
        np.copyto(self.ring[self.pos:self.pos + len(frames)], frames)
        self.pos += len(frames)


def run_replay_bench(quick: bool) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    capacity = 32_768 if quick else 100_000
    naive_capacity = 4_096 if quick else 12_000
    reps = 50 if quick else 150

    buf = ReplayBuffer(capacity, OBS, np.uint8, STACK, N_STEP, 0.99, prioritized=True, seed=0)
    chunks = bench_chunks(16, rng)
    for c in chunks[:2]:  # warm-up (and the FIRST chunk)
        buf.add_chunk(c)
    # Batched inserts (what the consolidation thread writes: up to INSERT_BATCH parked chunks per
    # call), one-chunk inserts and the copy floor alternate in INSERT_ROUNDS blocks of the same
    # chunks, so a shared machine's drift hits all alike; the figures are medians over the rounds.
    n_insert = max(2 * capacity // CHUNK, 64)
    per_round = max(INSERT_BATCH, n_insert // INSERT_ROUNDS // INSERT_BATCH * INSERT_BATCH)
    floor = _CopyFloor(capacity)
    insert_rates, single_rates, floor_rates = [], [], []
    k = 0
    for _ in range(INSERT_ROUNDS):
        block = [chunks[1 + (k + j) % (len(chunks) - 1)] for j in range(per_round)]
        k += per_round
        t0 = time.perf_counter()
        added = sum(_added(buf.add_chunks(block[i:i + INSERT_BATCH])) for i in range(0, per_round, INSERT_BATCH))
        insert_rates.append(added / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        single = sum(buf.add_chunk(c) for c in block)
        single_rates.append(single / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for c in block:
            floor.copy(c.frames)
        floor_rates.append(added / (time.perf_counter() - t0))
    insert_tps, insert_floor_tps = float(np.median(insert_rates)), float(np.median(floor_rates))
    held = len(buf)
    b = buf.sample(512)
    buf.update_priorities(b.indices, rng.random(512) * 3)  # a non-uniform tree

    naive = NaiveReplay(naive_capacity, seed=0)
    for _ in range(naive_capacity):
        naive.add(rng.integers(0, 256, size=(STACK, *OBS), dtype=np.uint8), 1, 0.5,
                  rng.integers(0, 256, size=(STACK, *OBS), dtype=np.uint8), False)

    out_bytes = 2 * 512 * STACK * OBS[0] * OBS[1]
    src = np.ones(out_bytes, dtype=np.uint8)
    dst = np.zeros(out_bytes, dtype=np.uint8)

    t32, t512, tnaive, tcopy = [], [], [], []
    for _ in range(3):  # warm every path (pools, allocator)
        buf.sample(32), buf.sample(512), naive.sample(512), np.copyto(dst, src)
    for _ in range(reps):
        t = time.perf_counter()
        batch = buf.sample(32)
        t32.append(time.perf_counter() - t)
        t = time.perf_counter()
        batch = buf.sample(512)
        t512.append(time.perf_counter() - t)
        t = time.perf_counter()
        s, a, r, ns, d = naive.sample(512)
        torch.from_numpy(s), torch.from_numpy(ns)
        tnaive.append(time.perf_counter() - t)
        t = time.perf_counter()
        np.copyto(dst, src)
        tcopy.append(time.perf_counter() - t)
    if not (batch.obs.is_contiguous() and batch.next_obs.is_contiguous()):
        raise RuntimeError("sampled stacks are not contiguous")

    try:
        import torchrl  # noqa: F401

        torchrl_ms = _torchrl_sample512_ms(reps)
    except ImportError:
        torchrl_ms = None

    return {
        "replay_insert_tps": round(insert_tps),
        "insert_copy_floor_tps": round(insert_floor_tps),
        "insert_vs_copy_floor_rounds": [round(i / f, 3) for i, f in zip(insert_rates, floor_rates, strict=True)],
        "insert_batch_chunks": INSERT_BATCH,
        "replay_insert_single_chunk_tps": round(float(np.median(single_rates))),
        "replay_sample32_ms": round(_median_ms(t32), 3),
        "replay_sample512_ms": round(_median_ms(t512), 3),
        "naive_replay_sample512_ms": round(_median_ms(tnaive), 3),
        "copy_floor_sample512_ms": round(_median_ms(tcopy), 3),
        "bytes_per_transition": round(buf.bytes_per_transition(), 1),
        "naive_bytes_per_transition": round(naive.bytes_per_transition(), 1),
        "torchrl_sample512_ms": torchrl_ms,
        "frames_per_transition": round(buf.frames_stored / held, 4),
        "stale_rows_resampled": buf._reader.stale_rows_resampled,
    }


def _torchrl_sample512_ms(reps: int) -> float:  # pragma: no cover - torchrl is not installed here
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage
    from torchrl.data import ReplayBuffer as TorchRLBuffer

    rb = TorchRLBuffer(storage=LazyMemmapStorage(4096), batch_size=512)
    data = TensorDict({"obs": torch.zeros(4096, STACK, *OBS, dtype=torch.uint8),
                       "next_obs": torch.zeros(4096, STACK, *OBS, dtype=torch.uint8)}, batch_size=[4096])
    rb.extend(data)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        rb.sample()
        times.append(time.perf_counter() - t)
    return _median_ms(times)


if __name__ == "__main__":
    import sys

    print(run_replay_bench(quick="--full" not in sys.argv))
