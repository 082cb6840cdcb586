"""Checks of the collector simulator the replay tests use (tests/support/replay_streams.py)."""

from __future__ import annotations

import numpy as np

from tests.support.replay_streams import (
    check_frame,
    interleaved_chunks,
    make_streams,
)


def test_sim_chunks_are_self_contained() -> None:
    rng = np.random.default_rng(0)
    streams = make_streams(2, (4, 8), rng)
    for chunk, c0 in interleaved_chunks(streams, stack=4, n=3, rng=rng):
        st = streams[chunk.stream]
        fs = c0 + chunk.first_start
        assert st.actions[fs] >= 0
        assert c0 >= st.floor(fs) and fs - c0 <= 3
        for f, g in zip(chunk.frames, range(c0, c0 + chunk.num_frames), strict=True):
            assert check_frame(f) == (st.stream, int(st.episode[g]), int(st.t[g]))
