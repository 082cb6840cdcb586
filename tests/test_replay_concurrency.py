"""One writer thread inserting continuously while the reader samples thousands of batches.

The ring is small, so the writer laps the reader constantly and overwrites segments while
they are being gathered; every sampled stack, next stack and target is checked against the
ground truth (whole frames, so a torn frame fails too).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from replay.buffer import ReplayBuffer
from tests.support.replay_streams import check_stacks, chunks_for, expected_table, headers, make_streams

SHAPE = (84, 84)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (frames stored on the GPU)")


@pytest.mark.parametrize("batches, device", [
    (300, "cpu"),
    pytest.param(3000, "cpu", marks=pytest.mark.slow),
    pytest.param(3000, "cuda", marks=CUDA),
])
def test_writer_thread_and_reader_thread_without_lock(batches: int, device: str) -> None:
    rng = np.random.default_rng(2024)
    stack, n, gamma = 4, 3, 0.97
    streams = make_streams(6, SHAPE, rng, episodes=6, max_len=60)
    table = expected_table(streams, n, gamma)
    gens = [chunks_for(s, stack, n, rng, max_new=40, min_new=8) for s in streams]
    chunks = []
    while gens:  # a fixed interleaving of the 6 streams, replayed in a loop by the writer
        k = int(rng.integers(len(gens)))
        try:
            chunks.append(next(gens[k])[0])
        except StopIteration:
            gens.pop(k)
    buf = ReplayBuffer(400, SHAPE, np.uint8, stack, n, gamma, max_chunk_frames=64, seed=3, device=device)
    for c in chunks[:10]:
        buf.add_chunk(c)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            k = 10
            while not stop.is_set():
                buf.add_chunk(chunks[k % len(chunks)])
                k += 1
                # paced so it laps the 400-slot ring about once per sample: overwrites mid-gather stay
                # frequent, but an unpaced writer on a quiet machine laps it during every redraw
                time.sleep(0.001)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    bsz = 32
    try:
        for it in range(batches):
            b = buf.sample(bsz, beta=0.6)
            assert b.obs.device.type == device and b.next_obs.device.type == device
            obs, nxt = headers(b.obs.cpu().numpy()), headers(b.next_obs.cpu().numpy())
            check_stacks(obs, obs[:, -1, 2], stack)
            check_stacks(nxt, nxt[:, -1, 2], stack)
            if not np.array_equal(obs[:, -1, :2], nxt[:, -1, :2]):
                raise AssertionError("next stack from another stream or episode")
            for r in range(bsz):
                a, tb, ret, disc = table[tuple(int(x) for x in obs[r, -1])]
                if (a, tb) != (int(b.actions[r]), int(nxt[r, -1, 2])) or not np.isclose(ret, float(b.returns[r]), 1e-5) \
                        or not np.isclose(disc, float(b.discounts[r])):
                    raise AssertionError(f"row {r} of batch {it}: targets do not match {obs[r, -1].tolist()}")
            buf.update_priorities(b.indices, rng.random(bsz) * 2)
            if errors:
                break
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert buf.transitions_added > 5 * 400  # the writer lapped the ring many times
    buf.check_valid()
    print(f"stale rows resampled: {buf._reader.stale_rows_resampled}, transitions added {buf.transitions_added}")


@CUDA
def test_build_puts_frames_on_the_learner_gpu_when_they_fit() -> None:
    from config_optimized import load_profile
    from envs.spec import EnvSpec

    cfg = load_profile("gpu-server", ["replay.capacity=20000", "replay.storage_device=auto"])
    spec = EnvSpec(SHAPE, np.dtype(np.uint8), 4, 4)
    buf = ReplayBuffer.build(cfg.replay, spec, torch.device("cuda"))
    rng = np.random.default_rng(1)
    streams = make_streams(2, SHAPE, rng, episodes=2, max_len=40)
    for st in streams:
        for chunk, *_ in chunks_for(st, 4, cfg.replay.n_step, rng, max_new=20, min_new=5):
            buf.add_chunk(chunk)
    batch = buf.sample(64, beta=0.5)
    assert batch.obs.is_cuda and batch.next_obs.is_cuda and batch.obs.dtype == torch.uint8
    buf.check_valid()
    cpu = ReplayBuffer.build(load_profile("gpu-server", ["replay.capacity=20000", "replay.storage_device=cpu"]).replay,
                             spec, torch.device("cuda"))
    cpu.add_chunk(next(chunks_for(streams[0], 4, cfg.replay.n_step, rng, max_new=20, min_new=5))[0])
    assert not cpu.sample(8, beta=0.5).obs.is_cuda
