"""Bit-exact stacks end to end: the real collector recorder + CountingEnv -> replay -> sample.

Every sampled obs / next_obs must equal, byte for byte, the rolling stack the collector fed
its network at that step (reset pads with copies of the first frame). Skipped while the
collector module is not importable (it is written in parallel).
"""

from __future__ import annotations

import collections

import numpy as np

import actors.stream as stream_mod
from envs.testing import CountingEnv, decode_frame
from replay.buffer import ReplayBuffer

SHAPE, STACK, N, GAMMA = (4, 8), 4, 3, 0.99


def test_sampled_stacks_equal_the_collectors_rolling_stacks() -> None:
    rng = np.random.default_rng(0)
    streams = 6
    envs = [CountingEnv(frame_shape=SHAPE, episode_length=int(9 + 4 * s), truncate_every=2) for s in range(streams)]
    recs = [stream_mod.StreamRecorder(s, STACK, N, GAMMA, 16, 4) for s in range(streams)]
    seen: dict[tuple[int, int, int], np.ndarray] = {}
    rolling = []
    for s, (env, rec) in enumerate(zip(envs, recs, strict=True)):
        obs, _ = env.reset(seed=s)
        rec.begin_episode(obs)
        rolling.append(collections.deque([obs] * STACK, maxlen=STACK))
    buf = ReplayBuffer(900, SHAPE, np.uint8, STACK, N, GAMMA, max_chunk_frames=128, seed=0)
    for _ in range(400):
        for s, (env, rec) in enumerate(zip(envs, recs, strict=True)):
            stack = np.stack(rolling[s])
            seen[decode_frame(stack[-1])] = stack
            rec.set_q(rng.random(4).astype(np.float32))
            if rec.ready():
                chunk = rec.build_chunk()
                if chunk is not None:
                    buf.add_chunk(chunk)
            a = int(rng.integers(4))
            obs, _, term, trunc, _ = env.step(a)
            rec.record_step(a, 0.0, obs, term, trunc)
            rolling[s].append(obs)
            if term or trunc:
                stack = np.stack(rolling[s])  # the final observation's stack (bootstrap target)
                seen[decode_frame(stack[-1])] = stack
                obs, _ = env.reset()
                rec.begin_episode(obs)
                rolling[s] = collections.deque([obs] * STACK, maxlen=STACK)
    buf.check_valid()
    assert len(buf) > 200
    for _ in range(20):
        b = buf.sample(64)
        for r in range(64):
            obs, nxt = b.obs[r].numpy(), b.next_obs[r].numpy()
            np.testing.assert_array_equal(obs, seen[decode_frame(obs[-1])])
            np.testing.assert_array_equal(nxt, seen[decode_frame(nxt[-1])])
