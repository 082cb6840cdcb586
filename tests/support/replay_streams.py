"""A collector simulator for replay tests.

Each stream is a full frame sequence whose bytes encode (stream, episode, t) (the CountingEnv
header, decoded with envs.testing.decode_frame) and whose remaining bytes repeat a value
derived from the triple, so a torn (partly overwritten) frame is detected too. Chunks are cut
exactly as shared/chunk.py describes: a chunk starts (stack-1) frames before the first
incomplete transition, clipped at the episode's FIRST frame; the newest frame has no action
and no end flag yet. Expected targets come from a plain Python loop, independent of
shared.chunk.nstep_targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from envs.testing import decode_frame
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk

if TYPE_CHECKING:
    from replay.buffer import ReplayBuffer


def make_frame(shape: tuple[int, ...], stream: int, episode: int, t: int) -> np.ndarray:
    fill = (stream * 31 + episode * 7 + t * 3) % 251
    frame = np.full(shape, fill, dtype=np.uint8)
    header = np.array([stream, episode, t], dtype="<u8").view(np.uint8)
    frame.reshape(-1)[: header.size] = header
    return frame


def check_frame(frame: np.ndarray) -> tuple[int, int, int]:
    """Decode and verify the whole frame is consistent (not torn)."""
    s, e, t = decode_frame(frame)
    fill = (s * 31 + e * 7 + t * 3) % 251
    body = np.ascontiguousarray(frame).reshape(-1)[24:]
    if not np.all(body == fill):
        raise AssertionError(f"torn frame: header {(s, e, t)} but body mismatch")
    return s, e, t


@dataclass
class Stream:
    """One env stream's whole history: frames, actions, rewards, flags (global indices)."""

    stream: int
    shape: tuple[int, ...]
    ep_lengths: list[int]
    truncated: list[bool]
    frames: np.ndarray = field(init=False)
    episode: np.ndarray = field(init=False)
    t: np.ndarray = field(init=False)
    actions: np.ndarray = field(init=False)
    rewards: np.ndarray = field(init=False)
    flags: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        eps, ts, acts, rews, flags = [], [], [], [], []
        for e, (length, trunc) in enumerate(zip(self.ep_lengths, self.truncated, strict=True)):
            for t in range(length + 1):
                eps.append(e)
                ts.append(t)
                acts.append((self.stream + e + t) % 5 if t < length else NO_ACTION)
                rews.append(float((t % 7) + 0.5 * self.stream) if t < length else 0.0)
                f = FLAG_FIRST if t == 0 else 0
                if t == length - 1:
                    f |= FLAG_TRUNCATED if trunc else FLAG_TERMINATED
                flags.append(f)
        self.episode = np.array(eps, dtype=np.int64)
        self.t = np.array(ts, dtype=np.int64)
        self.actions = np.array(acts, dtype=np.int32)
        self.rewards = np.array(rews, dtype=np.float32)
        self.flags = np.array(flags, dtype=np.uint8)
        self.frames = np.stack([make_frame(self.shape, self.stream, e, t) for e, t in zip(eps, ts, strict=True)])

    def floor(self, i: int) -> int:
        return i - int(self.t[i])

    def expected(self, i: int, n: int, gamma: float) -> tuple[int, int, float, float]:
        """(action, bootstrap index, return, discount) of the transition starting at global frame i."""
        ret, disc, k = 0.0, 1.0, 0
        while k < n:
            ret += disc * float(self.rewards[i + k])
            disc *= gamma
            k += 1
            if self.flags[i + k - 1] & FLAG_TERMINATED:
                disc = 0.0
                break
            if self.flags[i + k - 1] & FLAG_TRUNCATED:
                break
        return int(self.actions[i]), i + k, ret, disc

    def window_end(self, i: int, n: int) -> int:
        """Global bootstrap index of transition i (the last frame its window needs)."""
        k = 0
        while k < n:
            k += 1
            if self.flags[i + k - 1] & (FLAG_TERMINATED | FLAG_TRUNCATED):
                break
        return i + k


def chunks_for(stream: Stream, stack: int, n: int, rng: np.random.Generator, max_new: int = 12, min_new: int = 1):
    """Yield (chunk, global_offset) cutting the stream like a collector would."""
    total = len(stream.actions)
    nxt = 0  # first unsent transition (global)
    pos = 1  # frames observed so far
    while pos < total:
        pos = min(total, pos + int(rng.integers(min_new, max_new + 1)))
        while nxt < pos and stream.actions[nxt] == NO_ACTION:
            nxt += 1
        if nxt >= pos:
            continue
        c0 = max(nxt - (stack - 1), stream.floor(nxt))
        c1 = pos
        actions = stream.actions[c0:c1].copy()
        flags = stream.flags[c0:c1].copy()
        actions[-1] = NO_ACTION  # newest frame: no action taken yet
        flags[-1] &= FLAG_FIRST
        prio = rng.random(c1 - c0).astype(np.float32) * 3
        chunk = TransitionChunk(stream.stream, nxt - c0, stream.frames[c0:c1].copy(), actions,
                                stream.rewards[c0:c1].copy(), flags, prio)
        yield chunk, c0
        # advance past complete transitions (completeness is a prefix of the candidates)
        while nxt < c1 - 1:
            if stream.actions[nxt] == NO_ACTION:
                nxt += 1
                continue
            if stream.window_end(nxt, n) <= c1 - 1:
                nxt += 1
            else:
                break


def make_streams(count: int, shape: tuple[int, ...], rng: np.random.Generator, episodes: int = 6,
                 max_len: int = 20) -> list[Stream]:
    out = []
    for s in range(count):
        lengths = [int(x) for x in rng.integers(1, max_len + 1, size=episodes)]
        trunc = [bool(x) for x in rng.random(episodes) < 0.4]
        out.append(Stream(s, shape, lengths, trunc))
    return out


def interleaved_chunks(streams: list[Stream], stack: int, n: int, rng: np.random.Generator, max_new: int = 12,
                       min_new: int = 1):
    """Chunks of all streams in a random interleaving (each stream's own order kept)."""
    gens = [chunks_for(s, stack, n, rng, max_new, min_new) for s in streams]
    while gens:
        k = int(rng.integers(len(gens)))
        try:
            yield next(gens[k])
        except StopIteration:
            gens.pop(k)


def verify_row(streams: dict[int, Stream], obs: np.ndarray, next_obs: np.ndarray, action: int, ret: float,
               disc: float, stack: int, n: int, gamma: float) -> tuple[int, int, int]:
    """Check one sampled row against the ground truth; return its (stream, episode, t)."""
    decoded = [check_frame(f) for f in obs]
    s, e, t = decoded[-1]
    for k, (s2, e2, t2) in enumerate(decoded):
        want = max(t - (stack - 1) + k, 0)
        if (s2, e2, t2) != (s, e, want):
            raise AssertionError(f"obs stack {decoded} is not the padded stack of {(s, e, t)}")
    st = streams[s]
    i = st.floor(int(np.flatnonzero(st.episode == e)[0])) + t
    want_action, boot, want_ret, want_disc = st.expected(i, n, gamma)
    if action != want_action or not np.isclose(ret, want_ret, rtol=1e-5, atol=1e-5) or not np.isclose(disc, want_disc):
        raise AssertionError(f"{(s, e, t)}: got a={action} R={ret} d={disc}, want {want_action} {want_ret} {want_disc}")
    nxt = [check_frame(f) for f in next_obs]
    tb = int(st.t[boot])
    for k, (s2, e2, t2) in enumerate(nxt):
        want = max(tb - (stack - 1) + k, 0)
        if (s2, e2, t2) != (s, e, want):
            raise AssertionError(f"next stack {nxt} is not the padded stack of {(s, e, tb)} for {(s, e, t)}")
    return s, e, t


def complete_transitions(streams: list[Stream], n: int) -> set[tuple[int, int, int]]:
    """Every transition whose n-step window completes within its stream's history."""
    out = set()
    for st in streams:
        last = len(st.actions) - 1
        for i in np.flatnonzero(st.actions >= 0):
            if st.window_end(int(i), n) <= last:
                out.add((st.stream, int(st.episode[i]), int(st.t[i])))
    return out


# ---------------------------------------------------------------------- simulator self-checks


def live_keys(buf: ReplayBuffer) -> set[tuple[int, int, int]]:
    """(stream, episode, t) of every sampleable transition, read from the buffer's internals."""
    buf.reader.drain()
    slots = np.flatnonzero(buf.reader.tree.leaves() > 0)
    frames = buf.storage.frames.cpu().numpy()
    return {check_frame(frames[s]) for s in slots}


def expected_table(streams: list[Stream], n: int, gamma: float) -> dict:
    """(stream, episode, t) of every start -> (action, t of its bootstrap frame, n-step return, discount)."""
    table = {}
    for st in streams:
        last = len(st.actions) - 1
        for i in np.flatnonzero(st.actions >= 0):
            i = int(i)
            if st.window_end(i, n) <= last:
                a, boot, ret, disc = st.expected(i, n, gamma)
                table[(st.stream, int(st.episode[i]), int(st.t[i]))] = (a, int(st.t[boot]), ret, disc)
    return table


def headers(stacks: np.ndarray) -> np.ndarray:
    """[B, S, 3] (stream, episode, t) of every frame, after checking each frame's body."""
    b, s = stacks.shape[:2]
    flat = stacks.reshape(b, s, -1)
    head = np.ascontiguousarray(flat[:, :, :24]).view("<u8").astype(np.int64)
    fill = (head[:, :, 0] * 31 + head[:, :, 1] * 7 + head[:, :, 2] * 3) % 251
    if not np.all(flat[:, :, 24:] == fill[:, :, None].astype(np.uint8)):
        raise AssertionError("torn frame in a sampled stack")
    return head


def check_stacks(head: np.ndarray, t_last: np.ndarray, stack: int) -> None:
    """Each sampled stack is one episode's frames t-stack+1..t (floored at its first frame), from `headers`."""
    want_t = np.maximum(t_last[:, None] - (stack - 1) + np.arange(stack)[None, :], 0)
    same = (head[:, :, 0] == head[:, -1:, 0]) & (head[:, :, 1] == head[:, -1:, 1])
    if not (same.all() and np.array_equal(head[:, :, 2], want_t)):
        bad = int(np.flatnonzero(~(same.all(1) & (head[:, :, 2] == want_t).all(1)))[0])
        raise AssertionError(f"bad stack {head[bad].tolist()}")
