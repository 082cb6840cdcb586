"""ReplayBuffer: the public face of the replay (one writer thread, one reader thread, no lock).

Why this design (details in the module docstrings):

- replay/storage.py  -- one pre-allocated ring of single frames on the learner's device plus
  per-slot metadata; each chunk is one contiguous, never-wrapping segment, so stacks are
  rebuilt by index inside a segment and never mix streams or episodes (~1.05 stored frames
  per transition vs 8 for (state, next_state) stacks).
- replay/chunk_plan.py -- validation and n-step targets (shared.chunk) of one chunk;
  replay/batch_plan.py the same for a batch of chunks at once, vectorized.
- replay/writer.py   -- placement, the claim / copy / publish protocol.
- replay/sampler.py  -- the reader-owned sum-tree, draining, stratified PER sampling, the
  freshness re-check, stale-safe priority updates.

Thread roles: `add_chunk` / `add_chunks` from the writer thread only; `sample`,
`update_priorities` and `check_valid` from the reader thread only (they drain the writer's
records into the tree). `len()`, `transitions_added` and `frames_stored` may be read from any
thread: they are writer-maintained counters and never touch the tree (the consolidation
thread's stats call len(); if len() drained, two threads would mutate the reader-owned tree).
`save` and `restore` need a quiescent writer (the checkpointer pauses consolidation around them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from envs.spec import EnvSpec
from replay.chunk_plan import max_chunk_frames
from replay.sampler import SegmentReader, generator_from_state
from replay.storage import FrameStorage, resolve_storage_device
from replay.sum_tree import ReplayInvariantError
from replay.value_bounds import ValueBounds, check_ints, check_values
from replay.writer import SegmentWriter
from shared.batch import SampleBatch
from shared.chunk import NO_ACTION, TransitionChunk
from shared.config import ReplayConfig
from shared.values import is_int

__all__ = ["ReplayBuffer", "ReplayInvariantError"]

_FORMAT_VERSION = 1


class ReplayBuffer:
    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype, stack: int, n_step: int, gamma: float,
                 prioritized: bool = True, alpha: float = 0.6, priority_eps: float = 1e-6,
                 device: str | torch.device = "cpu", max_chunk_frames: int = 4096, *,
                 seed: int | None = None, out_pool: int = 4, bounds: ValueBounds = ValueBounds()) -> None:
        if int(capacity) < 2:
            raise ValueError(f"capacity={capacity}: need at least 2 frame slots")
        if int(stack) < 1 or int(n_step) < 1:
            raise ValueError(f"stack={stack}, n_step={n_step}: both must be >= 1")
        if not 0.0 <= float(gamma) <= 1.0 or not 0.0 <= float(alpha) <= 1.0 or not float(priority_eps) > 0.0:
            raise ValueError(f"gamma={gamma}, alpha={alpha} must lie in [0, 1] and priority_eps={priority_eps} be > 0")
        if int(max_chunk_frames) < 2:
            raise ValueError(f"max_chunk_frames={max_chunk_frames}: need at least 2")
        self.capacity, self.obs_shape, self.obs_dtype = int(capacity), tuple(obs_shape), np.dtype(obs_dtype)
        self.stack, self.n_step, self.gamma = int(stack), int(n_step), float(gamma)
        self.prioritized, self.alpha, self.priority_eps = bool(prioritized), float(alpha), float(priority_eps)
        self.bounds = bounds  # what `restore` admits
        self.storage = FrameStorage(self.capacity, self.obs_shape, self.obs_dtype, device)
        self.device = self.storage.device
        self._writer = SegmentWriter(self.storage, self.stack, self.n_step, self.gamma, self.prioritized,
                                     self.alpha, self.priority_eps, max_chunk_frames)
        self._reader = SegmentReader(self.storage, self._writer, self.stack, self.prioritized, self.alpha,
                                     self.priority_eps, seed=seed, out_pool=out_pool)

    @classmethod
    def build(cls, section: ReplayConfig, spec: EnvSpec, device, *, seed: int | None = None) -> ReplayBuffer:
        """The run's replay from its section (`cfg.replay`) and the run's EnvSpec: the frames' shape, dtype and
        stack, and the value bounds `restore` admits (the spec's and the learner's |TD| cap). Frames go to the
        learner's GPU per storage_device / gpu_memory_fraction; `seed` seeds the sampler (None: fresh entropy)."""
        r = section
        bounds = ValueBounds.of_head(spec.max_abs_obs, spec.max_abs_reward, spec.num_actions)
        frame_bytes = int(np.prod(spec.obs_shape)) * np.dtype(spec.obs_dtype).itemsize
        where = resolve_storage_device(r.storage_device, device, frame_bytes, r.capacity, r.gpu_memory_fraction)
        return cls(r.capacity, tuple(spec.obs_shape), spec.obs_dtype, spec.stack, r.n_step, r.gamma,
                   prioritized=r.prioritized, alpha=r.alpha, priority_eps=r.priority_eps, device=where,
                   max_chunk_frames=max_chunk_frames(r.capacity), seed=seed, bounds=bounds)

    # ------------------------------------------------------------------ hot path
    def add_chunk(self, chunk: TransitionChunk) -> int:
        """WRITER thread. Store the chunk's complete transitions; ValueError on inconsistent arrays."""
        return self._writer.write(chunk)

    def add_chunks(self, chunks: Sequence[TransitionChunk]) -> list[int | ValueError]:
        """WRITER thread. Store several chunks exactly as `add_chunk` would one after the other, at a
        fraction of the per-chunk cost (validation and n-step targets vectorized over the batch).
        Item i is the number of transitions chunk i added, or the ValueError `add_chunk` would have
        raised for it: that chunk is skipped, the others are stored."""
        return self._writer.write_batch(chunks)

    def sample(self, batch_size: int, beta: float = 0.4) -> SampleBatch:
        """READER thread. A PER (or uniform) batch on the storage device; see sampler.py for buffer reuse."""
        return self._reader.sample(batch_size, beta)

    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        """READER thread. priority = (|td| + eps) ** alpha; rows overwritten since sampling are ignored."""
        self._reader.update_priorities(indices, td_abs)

    def sync(self) -> None:
        """READER thread. Apply published segments to the sum-tree without sampling; a head that
        does not sample (drain-only benchmarks) calls it so the publication queue stays short."""
        self._reader.drain()

    def __len__(self) -> int:
        """Any thread. Transitions published and sampleable now (the writer's count; never drains)."""
        return self._writer.live_transitions

    @property
    def reader(self) -> SegmentReader:
        """The reader thread's side (priority tree, segment table, sampling generator): what a sampler over the
        same storage on another device mirrors (replay/device_ring.py). Touch it from the reader thread only."""
        return self._reader

    @property
    def writer(self) -> SegmentWriter:
        """The writer's side, for a reader-thread mirror: its published records and its claim (read only)."""
        return self._writer

    @property
    def transitions_added(self) -> int:
        return self._writer.transitions_added

    @property
    def frames_stored(self) -> int:
        return self._writer.frames_stored

    def nbytes(self) -> int:
        return (self.storage.nbytes() + self._reader.tree.nbytes() + self._reader.seg_abs.nbytes
                + self._writer.live_starts.nbytes)

    def bytes_per_transition(self) -> float:
        """All storage (frames, metadata, tree) divided by the transitions held; at capacity if empty."""
        held = self._reader.count or max(1, self.capacity)
        return self.nbytes() / held

    # ------------------------------------------------------------------ persistence
    def _state(self) -> dict:
        w = self._writer
        return {
            "version": _FORMAT_VERSION, "capacity": self.capacity, "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype.str, "stack": self.stack, "n_step": self.n_step, "gamma": self.gamma,
            "prioritized": self.prioritized, "alpha": self.alpha, "priority_eps": self.priority_eps,
            "max_chunk_frames": w.max_chunk_frames, "cursor": w.cursor, "abs_cursor": w.abs_cursor,
            "transitions_added": w.transitions_added, "frames_stored": w.frames_stored,
            "count": self._reader.count, "sampler_rng": self._reader.rng.bit_generator.state,
        }

    def save(self, directory) -> None:
        """Write contents and state as plain .npy/.json (no pickle). Needs a quiescent writer."""
        self._reader.drain()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        frames = self.storage.frames.cpu().numpy() if self.device.type != "cpu" else self.storage.frames.numpy()
        np.save(path / "frames.npy", frames, allow_pickle=False)
        for name, arr in self.storage.metadata_arrays().items():
            np.save(path / f"{name}.npy", arr, allow_pickle=False)
        np.save(path / "leaves.npy", self._reader.tree.leaves(), allow_pickle=False)
        np.save(path / "seg_abs.npy", self._reader.seg_abs, allow_pickle=False)
        tmp = path / "state.json.tmp"
        tmp.write_text(json.dumps(self._state(), sort_keys=True))
        os.replace(tmp, path / "state.json")  # written last: its presence marks a complete save

    @classmethod
    def load(cls, directory, device: str | torch.device = "cpu", *, seed: int | None = None) -> ReplayBuffer:
        """A new buffer with the saved contents, on `device`. The sampler continues the saved random
        stream; an explicit `seed` replaces it (a deliberately different sample sequence)."""
        state = json.loads((Path(directory) / "state.json").read_text())
        buf = cls(state["capacity"], tuple(state["obs_shape"]), np.dtype(state["obs_dtype"]), state["stack"],
                  state["n_step"], state["gamma"], prioritized=state["prioritized"], alpha=state["alpha"],
                  priority_eps=state["priority_eps"], device=device, max_chunk_frames=state["max_chunk_frames"],
                  seed=seed)
        buf.restore(directory)
        if seed is not None:
            buf._reader.rng = np.random.default_rng(seed)
        return buf

    def restore(self, directory) -> None:
        """Load saved contents into this (already allocated, same geometry) buffer. Needs a quiescent writer.

        Everything is read and checked before anything changes: the geometry, every array's shape and
        dtype, the sampler's generator state, and the values a resumed run would train on -- float frames,
        returns and discounts finite (discounts in [0, 1]), priorities finite and >= 0, and all of them
        within `self.bounds` (float frames |x| <= max_abs_obs, returns within the n-step sum of
        max_abs_reward, priorities within the |TD| cap's). A NaN or 1e30 let in here would be sampled,
        trained on and written into every later checkpoint. ValueError naming the file and slot.
        A save without `sampler_rng` (written before it was part of the state) keeps this buffer's stream.
        """
        path = Path(directory)
        state = json.loads((path / "state.json").read_text())
        if not isinstance(state, dict) or state.get("version") != _FORMAT_VERSION:
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"{path}: replay save format {got!r}, expected {_FORMAT_VERSION}")
        mine = self._state()
        for key in ("capacity", "obs_shape", "obs_dtype", "stack", "n_step", "gamma", "prioritized", "alpha",
                    "priority_eps"):
            if state[key] != mine[key]:
                raise ValueError(f"{path}: saved {key}={state[key]!r} but this buffer has {key}={mine[key]!r}")
        saved_rng = state.get("sampler_rng")
        rng = None if saved_rng is None else generator_from_state(saved_rng, str(path / "state.json"))
        frames = np.load(path / "frames.npy", mmap_mode="r", allow_pickle=False)
        if frames.shape != (self.capacity, *self.obs_shape) or frames.dtype != self.obs_dtype:
            raise ValueError(f"{path}/frames.npy has shape {frames.shape} {frames.dtype}; expected "
                             f"{(self.capacity, *self.obs_shape)} {self.obs_dtype}")
        block = max(1, (64 << 20) // max(1, self.storage.frame_bytes))  # bounded host memory while loading
        bounds = self.bounds
        if np.issubdtype(self.obs_dtype, np.floating):
            for i in range(0, self.capacity, block):
                check_values(path / "frames.npy", np.asarray(frames[i : i + block]), first_slot=i,
                             max_abs=bounds.max_abs_obs, why=" (env.max_abs_obs)")
        meta = {name: _load_exact(path / f"{name}.npy", arr) for name, arr in self.storage.metadata_arrays().items()}
        reader, writer = self._reader, self._writer
        seg_abs = _load_exact(path / "seg_abs.npy", reader.seg_abs)
        leaves = _load_exact(path / "leaves.npy", reader.tree.leaves())
        check_values(path / "ret.npy", meta["ret"], max_abs=bounds.max_abs_return(self.n_step, self.gamma),
                     why=f" (max_abs_reward {bounds.max_abs_reward:g} over {self.n_step} steps at gamma {self.gamma:g})")
        check_values(path / "disc.npy", meta["disc"], low=0.0, high=1.0)
        check_values(path / "leaves.npy", leaves, low=0.0,
                     max_abs=bounds.max_leaf(self.prioritized, self.alpha, self.priority_eps),
                     why=f" ((|TD| cap + priority_eps) ** alpha {self.alpha:g})" if self.prioritized else
                     " (uniform mode)")
        counters = _check_indices(path, state, meta, seg_abs, self.capacity, bounds.num_actions)
        for i in range(0, self.capacity, block):
            self.storage.frames[i : i + block].copy_(torch.from_numpy(np.array(frames[i : i + block])))
        for name, arr in self.storage.metadata_arrays().items():
            arr[...] = meta[name]
        reader.writer.records.clear()
        reader.seg_abs[...] = seg_abs
        reader.tree.set_range(0, leaves)
        reader.count = int(np.count_nonzero(reader.tree.leaves()))
        if rng is not None:
            reader.rng = rng
        writer.cursor, writer.abs_cursor = counters["cursor"], counters["abs_cursor"]
        writer.claimed_end = writer.abs_cursor
        writer.transitions_added, writer.frames_stored = counters["transitions_added"], counters["frames_stored"]
        writer.live_starts[...] = reader.tree.leaves() > 0
        writer.live_transitions = reader.count
        self.check_valid()

    # ------------------------------------------------------------------ validation
    def check_valid(self) -> None:
        """READER thread, writer quiescent. Raise ReplayInvariantError naming any broken invariant."""
        _check_buffer(self)


def _load_exact(path: Path, like: np.ndarray) -> np.ndarray:
    arr = np.load(path, allow_pickle=False)
    if arr.shape != like.shape or arr.dtype != like.dtype:
        raise ValueError(f"{path} has shape {arr.shape} {arr.dtype}; expected {like.shape} {like.dtype}")
    return arr


def _check_indices(path: Path, state: dict, meta: dict[str, np.ndarray], seg_abs: np.ndarray, capacity: int,
                   num_actions: int | None) -> dict[str, int]:
    """The integer parts of a save hold what the writer can produce, slot by slot (live or not: a dead
    slot's seg_end steers a later overwrite): actions -1 or 0 .. num_actions - 1, boots and floors ring
    slots, a segment end -1 or past its slot and at most the capacity, a segment start -1 or before the
    write cursor; and state.json's cursors and counts non-negative integers the ring can hold. Returns
    the counts, read once. ValueError naming the file and slot (or key)."""
    counters: dict[str, int] = {}
    for key, high in (("cursor", capacity), ("abs_cursor", None), ("transitions_added", None),
                      ("frames_stored", capacity)):
        value = state.get(key)
        if not is_int(value) or value < 0 or (high is not None and value > high):
            raise ValueError(f"{path / 'state.json'}: {key}={value!r} is invalid: allowed an integer in "
                             f"[0, {'any' if high is None else high}]; refusing to restore it")
        counters[key] = int(value)
    most = np.iinfo(np.int32).max if num_actions is None else int(num_actions) - 1
    check_ints(path / "action.npy", meta["action"], low=0, high=most, also=NO_ACTION,
               allowed=f"{NO_ACTION} (no action) or 0 .. {most}"
               + ("" if num_actions is None else f" (the env's {num_actions} actions)"))
    for name in ("boot", "floor"):
        check_ints(path / f"{name}.npy", meta[name], low=0, high=capacity - 1,
                   allowed=f"a ring slot 0 .. {capacity - 1}")
    check_ints(path / "seg_end.npy", meta["seg_end"], low=1, high=capacity, also=-1,
               allowed=f"-1 (no segment) or a slot's segment end, past the slot and <= {capacity}")
    past_slot = meta["seg_end"] > np.arange(capacity)
    if not np.all(past_slot | (meta["seg_end"] == -1)):
        slot = int(np.flatnonzero(~past_slot & (meta["seg_end"] != -1))[0])
        raise ValueError(f"{path / 'seg_end.npy'}: slot {slot} holds {int(meta['seg_end'][slot])}, a segment "
                         f"ending at or before its own slot; refusing to restore it")
    check_ints(path / "seg_abs.npy", seg_abs, low=0, high=counters["abs_cursor"] - 1, also=-1,
               allowed=f"-1 (no segment) or a segment start before the write cursor {counters['abs_cursor']}")
    return counters


def _fail(msg: str) -> None:
    raise ReplayInvariantError(msg)


def _check_buffer(buf: ReplayBuffer) -> None:
    reader, writer, st = buf._reader, buf._writer, buf.storage
    reader.drain()
    cap = buf.capacity
    reader.tree.check()
    leaves = reader.tree.leaves()
    live = np.flatnonzero(leaves > 0.0)
    if live.size != reader.count:
        _fail(f"reader count {reader.count} != {live.size} positive leaves")
    if writer.live_transitions != reader.count or not np.array_equal(np.flatnonzero(writer.live_starts), live):
        _fail(f"writer's live transitions ({writer.live_transitions}) differ from the tree's ({reader.count} slots)")
    if not buf.prioritized and np.any(leaves[live] != 1.0):
        _fail(f"uniform mode but slot {int(live[leaves[live] != 1.0][0])} has mass {leaves[live][leaves[live] != 1.0][0]}")
    if writer.claimed_end != writer.abs_cursor:
        _fail(f"claimed_end {writer.claimed_end} != abs_cursor {writer.abs_cursor}: a write is in progress")
    if writer.cursor != writer.abs_cursor % cap and not (writer.cursor == cap and writer.abs_cursor % cap == 0):
        _fail(f"write cursor {writer.cursor} inconsistent with absolute cursor {writer.abs_cursor} (capacity {cap})")
    seg = reader.seg_abs[live]
    no_seg = live[seg < 0]
    if no_seg.size:
        _fail(f"slot {int(no_seg[0])} has positive mass but belongs to no live segment")
    first = seg % cap
    end = st.seg_end[live]
    bad = (first > live) | (end <= live) | (end > cap)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        _fail(f"slot {int(live[k])} outside its segment [{int(first[k])}, {int(end[k])})")
    retired = seg + cap < writer.claimed_end
    if retired.any():
        k = int(np.flatnonzero(retired)[0])
        _fail(f"slot {int(live[k])} has positive mass but its segment (abs {int(seg[k])}) was overwritten")
    if np.any(st.action[live] == NO_ACTION):
        _fail(f"slot {int(live[st.action[live] == NO_ACTION][0])} has positive mass but starts no transition")
    boot, floor = st.boot[live], st.floor[live]
    bad = (boot <= live) | (boot >= end) | (floor < first) | (floor > live) | (st.floor[boot] != floor)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        _fail(f"slot {int(live[k])}: bootstrap {int(boot[k])} / floor {int(floor[k])} not within its segment "
              f"[{int(first[k])}, {int(end[k])}) or floors differ")
    disc, ret = st.disc[live], st.ret[live]
    if np.any(~np.isfinite(ret)) or np.any((disc < 0) | (disc > 1)):
        _fail("a live transition has a non-finite return or a discount outside [0, 1]")
    live_slots = int(np.count_nonzero(st.seg_end >= 0))
    if live_slots != writer.frames_stored:
        _fail(f"frames_stored {writer.frames_stored} != {live_slots} slots in live segments")
    if reader.count > writer.transitions_added:
        _fail(f"{reader.count} sampleable transitions but only {writer.transitions_added} were ever added")
