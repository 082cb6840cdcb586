"""Where a batched replay insert spends its time: wall time per batch of chunks, by phase.

    python -m experiments.profile_insert [--batches 200] [--batch-chunks 64]

Writes the replay bench's chunks (bench/replay_bench.py: 128 transitions, 84x84 uint8 frames) into a
100k-slot prioritized buffer through `ReplayBuffer.add_chunks`, as the consolidation thread does,
with every phase function of replay/batch_plan.py and replay/writer.py wrapped in a timer.
Nested phases are included in their callers (`_assemble` holds `_common_rows`, which holds
`window_returns`; `_write_run` holds `write_frames`, the frame copies). The wrappers add ~0.3 us
per call. Compare `write_frames` with the copy floor (bench.replay_bench's insert_copy_floor_tps):
insert / floor = copies / total when the copies run at the floor's speed. Figures are medians
over batches, the phases' each on its own (they need not add up).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.replay_bench import bench_chunks  # noqa: E402
from ingest.consolidation import INSERT_BATCH  # noqa: E402
from replay import batch_plan, storage, writer  # noqa: E402
from replay.buffer import ReplayBuffer  # noqa: E402

PHASES = {
    writer.SegmentWriter: ("_leaves", "_write_run", "_cut", "_store_metadata", "_records"),
    storage.FrameStorage: ("write_frames",),
    batch_plan: ("_structure", "_checked", "_common_chunks", "_assemble", "_common_rows", "window_returns"),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.profile_insert", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-chunks", type=int, default=INSERT_BATCH, help="chunks per add_chunks call")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    spent: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    for owner, names in PHASES.items():
        for name in names:
            setattr(owner, name, timed(name, getattr(owner, name)))
    writer.plan_batch = timed("plan_batch", writer.plan_batch)

    chunks = bench_chunks(16, np.random.default_rng(0))
    buf = ReplayBuffer(100_000, (84, 84), np.uint8, 4, 3, 0.99, prioritized=True, seed=0)
    buf.add_chunks(chunks[:2])  # the episode's first chunk, then steady state
    size = args.batch_chunks
    for _ in range(20):
        buf.add_chunks([chunks[1 + j % 15] for j in range(size)])
    # medians over batches: a rare full pass of Python's cyclic collector inside one batch (~100 ms
    # over torch's objects) would otherwise dominate the means
    per_batch: list[dict[str, float]] = []
    totals = []
    for b in range(args.batches):
        block = [chunks[1 + (b * size + j) % 15] for j in range(size)]
        spent.clear()
        t = time.perf_counter()
        buf.add_chunks(block)
        totals.append(time.perf_counter() - t)
        per_batch.append(dict(spent))
    whole = float(np.median(totals)) * 1e6
    print(f"{size} chunks per batch: {whole:.0f} us per batch (median of {args.batches}), {whole / size:.1f} us per chunk")
    medians = {name: float(np.median([p.get(name, 0.0) for p in per_batch])) * 1e6 for name in per_batch[0]}
    for name, us in sorted(medians.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<16} {us:7.1f} us")


if __name__ == "__main__":
    main()
