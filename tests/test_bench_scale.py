"""The scale simulation and CPU accounting: structure and that data really moves, never speed.

The real-process test drives both designs' heads with a few synthetic collectors for half a
second and checks counts (registrations, ingested transitions, sampled batches, no rejected
message, no sequence gap), not rates: figures depend on the machine and its load.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from bench import cpu_time, scale
from bench.recorded import RECORDED_CHUNKS, load_chunks
from bench.workers import WorkerGroup
from shared.chunk import nstep_targets


def _burn(seconds: float) -> None:
    import time

    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _answers_twice(index, after, done, cmd_q, ready_q, result_q, stop_evt) -> None:
    """A WorkerGroup target that answers each command twice; `after` holds it back until another worker is done."""
    ready_q.put(index)
    while cmd_q.get() is not None:
        if after is not None:
            after.wait(60)
        result_q.put({"index": index, "registered": 1})
        result_q.put({"index": index, "held_back": 0})
        done.set()


def test_worker_results_by_key_survive_one_workers_answers_arriving_before_anothers():
    # worker 1 answers only after worker 0 has answered twice: the queue holds 0's "registered", 0's "held_back",
    # then 1's; two answers per command taken by count alone would give the harness 0's two answers
    ctx = mp.get_context("spawn")
    first_done, second_done = ctx.Event(), ctx.Event()
    with WorkerGroup(_answers_twice, [(0, None, first_done), (1, first_done, second_done)]) as group:
        group.send([0, 1], "go")
        registered = group.results(2, key="registered")
        held = group.results(2, key="held_back")
    assert sorted(r["index"] for r in registered) == [0, 1] and all("registered" in r for r in registered)
    assert sorted(r["index"] for r in held) == [0, 1] and all("held_back" in r for r in held)


def test_tree_cpu_counts_children_and_their_work():
    before = cpu_time.tree_cpu()
    assert os.getpid() in before and all(v >= 0 for v in before.values())
    child = mp.get_context("fork").Process(target=_burn, args=(0.3,))
    child.start()
    seen = cpu_time.descendants(os.getpid())
    child.join()
    assert child.pid in seen
    assert cpu_time.process_cpu_s(child.pid) is None  # exited: no figure, never a made-up one
    assert cpu_time.cpu_between({1: 5.0}, {1: 7.5, 2: 1.0}) == pytest.approx(3.5)
    assert cpu_time.per_1k(2.0, 500) == pytest.approx(4.0) and cpu_time.per_1k(2.0, 0) is None


def test_recorded_chunks_are_real_and_complete():
    chunks, counts = load_chunks(RECORDED_CHUNKS)
    assert RECORDED_CHUNKS.stat().st_size < 2 * 2**20 and len(chunks) == len(counts) >= 16
    for chunk, count in zip(chunks, counts, strict=True):
        assert chunk.frames.shape[1:] == (84, 84) and chunk.frames.dtype == np.uint8
        assert len(nstep_targets(chunk.actions, chunk.rewards, chunk.flags, chunk.first_start, 3, 0.9).starts) == count
    assert len({c.frames.tobytes() for c in chunks}) == len(chunks)  # distinct frames, not one chunk repeated


def test_capacity_is_the_highest_step_that_kept_sampling():
    ladder = [{"ingested_tps": 8000.0, "sample_batches_per_s": 100.0},
              {"ingested_tps": 30000.0, "sample_batches_per_s": 97.0},
              {"ingested_tps": 50000.0, "sample_batches_per_s": 70.0}]  # starved the learner: not sustainable
    assert scale.capacity_tps(ladder) == (30000.0, None)
    value, why = scale.capacity_tps(ladder[2:])
    assert value is None and "70 batches/s" in why
    assert scale.ingest_cpu_us([{"ingested_tps": 1000.0, "ingest_thread_cpu_frac": 0.01}]) == pytest.approx(10.0)
    assert scale._split(5, 2) == [3, 2] and scale._split(1, 1) == [1]


def test_windows_hold_whole_send_periods():
    """1 collector sending 128 transitions at 120/s: 8 s would hold 7 or 8 of its chunks (112 or 128/s)."""
    period = 128 / 120
    assert scale.whole_periods(8.0, 120.0, 128.0) == pytest.approx(8 * period)  # 7.5 periods rounds to 8
    assert scale.whole_periods(8.0, 120.0, 128.0) * 120.0 / 128.0 == pytest.approx(8.0)
    assert scale.whole_periods(0.3, 120.0, 128.0) == pytest.approx(period)  # at least one period
    assert scale.whole_periods(2.5, 120.0 * 24, 128.0) == pytest.approx(56 * 128 / 2880)
    assert scale.whole_periods(2.5, None, 128.0) == 2.5  # unthrottled senders: no period


def test_plot_is_written(tmp_path):
    rows = [{"design": d, "collectors": n, "offered_tps": 120.0 * n, "ingested_tps": 120.0 * n * f}
            for d, f in (("ours", 1.0), ("naive", 0.5)) for n in (1, 4, 16)]
    path = scale.plot_scale(rows, tmp_path / "scale.png", 9000.0, None)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.parametrize("design", ["ours", "naive"])
def test_harness_moves_recorded_chunks_through_each_head(design):
    from config_optimized import load_profile

    cfg = load_profile("cpu", [])
    out = scale.run_design(design, cfg, counts=(3,), window_s=0.5, steps=(None,))
    row, cap = out["rows"][0], out["capacity"][0]
    assert row["collectors"] == 3 and row["offered_tps"] == pytest.approx(3 * scale.RATE_PER_COLLECTOR)
    assert row["ingested_tps"] > 0 and row["sample_batches_per_s"] > 0 and row["sample_p99_ms"] >= row["sample_p50_ms"]
    assert cap["collectors"] == scale.CAPACITY_COLLECTORS and cap["ingested_tps"] > 0
    if design == "ours":  # every collector registered over the real protocol; nothing refused, nothing lost
        assert row["open_registrations"] == 3 and cap["open_registrations"] == scale.CAPACITY_COLLECTORS
        assert row["rejected"] == 0 and cap["rejected"] == 0 and cap["gaps"] == 0
