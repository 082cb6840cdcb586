"""Chunks recorded once from the real Mario 1-1 env, replayed by the scale simulation's collectors.

The file (bench/data/mario_1_1_chunks.npz, written by `make record-scale-chunks`) holds what
a real collector sent: 84x84 frames, actions, scaled rewards, flags and the initial priorities
its network computed, one chunk after another. Stored as plain arrays (np.savez_compressed, read
with allow_pickle=False): the chunks' frames are concatenated and `frame_offsets` cuts them apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.chunk import TransitionChunk

RECORDED_CHUNKS = Path(__file__).resolve().parent / "data" / "mario_1_1_chunks.npz"
_FIELDS = ("frames", "actions", "rewards", "flags", "priorities")


def save_chunks(path: str | Path, chunks: list[TransitionChunk], transitions: list[int], meta: dict[str, str]) -> None:
    """Concatenate the chunks' arrays; per-chunk stream, first_start, transitions and frame offsets beside them."""
    offsets = np.cumsum([0] + [c.num_frames for c in chunks]).astype(np.int64)
    arrays = {f: np.concatenate([getattr(c, f) for c in chunks]) for f in _FIELDS}
    np.savez_compressed(
        path, frame_offsets=offsets, streams=np.array([c.stream for c in chunks], np.int64),
        first_starts=np.array([c.first_start for c in chunks], np.int64),
        transitions=np.array(transitions, np.int64),
        meta_keys=np.array(list(meta), dtype=np.str_), meta_values=np.array(list(meta.values()), dtype=np.str_),
        **arrays)


def load_chunks(path: str | Path = RECORDED_CHUNKS) -> tuple[list[TransitionChunk], list[int]]:
    """(chunks in recording order, complete transitions each carries, as the collector's stream
    counted them); FileNotFoundError names the script that writes the file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: record it with `make record-scale-chunks`")
    with np.load(path, allow_pickle=False) as data:
        off = data["frame_offsets"]
        arrays = {f: data[f] for f in _FIELDS}
        streams, firsts, counts = data["streams"], data["first_starts"], data["transitions"]
    chunks = [TransitionChunk(int(streams[i]), int(firsts[i]), *(np.ascontiguousarray(arrays[f][off[i]:off[i + 1]])
                                                                for f in _FIELDS))
              for i in range(len(streams))]
    return chunks, [int(c) for c in counts]
