"""The writer side: place each chunk as one segment, copy it, publish it.

Validation and n-step planning live in replay/chunk_plan.py (one chunk, the reference) and
replay/batch_plan.py (a batch at once, the same results); the writer places what they planned.

Concurrency protocol (no lock on the hot path). The writer is one thread and
owns the cursor; the reader is one thread and owns the sum-tree. They share:

1. ``claimed_end`` -- absolute frame position (monotonic; ring slot = position % capacity)
   up to which the writer may be writing. It is raised *before* any byte of the new segment
   (frames or metadata) is touched. A reader that gathered a row and then re-reads
   ``claimed_end`` knows the row's segment was untouched during its gather iff
   ``segment_abs_start + capacity >= claimed_end``. Its value lives in `claim_tensor`, one int64
   in host memory (pinned when the frames live on a GPU), so a device-resident reader can read it
   inside its step, after its gather (replay/device_ring.py).
2. ``records`` -- a ``collections.deque`` of `SegmentRecord` appended only *after* the copy
   finished (after a CUDA stream sync on GPU storage). The reader learns of a segment only
   from its record, so it can never sample a half-written segment. ``extend``/``popleft``
   are atomic under the GIL, which also orders the writes before the publication.

A segment never wraps: if it does not fit before the end of the ring, the cursor jumps to
slot 0 and the tail is retired (the record says so). The absolute position jumps with it to
the next multiple of capacity, keeping ``slot == position % capacity``.

Batches. `write_batch` places several chunks exactly as successive `write` calls would (`write`
is a batch of one), but writes each *run* (chunks placed back to back with no cursor jump
between them) with one claim, one set of bookkeeping and metadata stores, then the frame copies,
then one record per chunk. Records stay per chunk (each with its own absolute start, and
`seg_end` per chunk in storage) so the reader's freshness check and a later partial overwrite
judge every chunk on its own, exactly as if it had been written alone.

Only the frames actually needed are stored: from the oldest stack frame of the first
complete transition to the last bootstrap frame. Context and lookahead frames beyond that
are re-sent by the collector in its next chunk anyway.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from replay.batch_plan import BatchPlan, plan_batch
from replay.storage import FrameStorage
from shared.chunk import NO_ACTION, TransitionChunk


class SegmentRecord(NamedTuple):
    """What the reader applies to its tree once a segment's copy is complete (a NamedTuple: the
    writer builds one per chunk on its hot path, ~3x cheaper than a frozen dataclass)."""

    ring_start: int  # first slot of the new segment
    abs_start: int  # its absolute position (ring_start == abs_start % capacity)
    leaves: np.ndarray  # float64 [length] sampling mass per slot (0 where no transition starts)
    retired_tail: int  # slots [retired_tail, capacity) are retired (the cursor jumped); -1 if not
    stale_end: int  # slots [ring_start + length, stale_end) held the rest of a partly overwritten segment

    @property
    def length(self) -> int:
        return int(len(self.leaves))


class SegmentWriter:
    """Owns the write cursor; call `write` / `write_batch` from exactly one thread."""

    def __init__(self, storage: FrameStorage, stack: int, n_step: int, gamma: float, prioritized: bool,
                 alpha: float, priority_eps: float, max_chunk_frames: int) -> None:
        self.storage = storage
        self.stack, self.n_step, self.gamma = int(stack), int(n_step), float(gamma)
        self.prioritized, self.alpha, self.priority_eps = bool(prioritized), float(alpha), float(priority_eps)
        self.max_chunk_frames = int(min(max_chunk_frames, storage.capacity))
        self.records: collections.deque[SegmentRecord] = collections.deque()
        self.cursor = 0  # ring slot of the next segment
        self.abs_cursor = 0  # its absolute position
        self.claim_tensor = torch.zeros(1, dtype=torch.int64, pin_memory=storage.device.type == "cuda")
        self._claim = self.claim_tensor.numpy()  # claimed_end's storage
        self.transitions_added = 0
        self.frames_stored = 0
        # writer-only mirror of "slot starts a live transition": lets len() be answered from any
        # thread without draining (the reader's tree says the same once it has drained)
        self.live_starts = np.zeros(storage.capacity, dtype=bool)
        self.live_transitions = 0

    @property
    def claimed_end(self) -> int:
        """Published before each copy (read by the reader)."""
        return int(self._claim[0])

    @claimed_end.setter
    def claimed_end(self, value: int) -> None:
        self._claim[0] = value

    def write(self, chunk: TransitionChunk) -> int:
        """Store the chunk's complete transitions; return how many. ValueError for a bad chunk."""
        added = self.write_batch((chunk,))[0]
        if isinstance(added, ValueError):
            raise added
        return added

    def write_batch(self, chunks: Sequence[TransitionChunk]) -> list[int | ValueError]:
        """Store several chunks exactly as `write` would, one after the other, in order.

        Result i is the number of transitions chunk i added, or the ValueError `write` would have
        raised for it (that chunk is skipped, the others are written). Any other exception (a
        failed frame copy) propagates: the run being written is then published as dead, as
        `write` does with its one segment; earlier runs stay written, later chunks are not."""
        st = self.storage
        plan, errors = plan_batch(list(chunks), st.obs_shape, st.obs_dtype, self.max_chunk_frames, self.stack,
                                  self.n_step, self.gamma)
        leaves = self._leaves(plan)
        k = 0
        while k < len(plan.index):
            k = self._write_run(plan, leaves, k)
        results: list[int | ValueError] = [0 if e is None else e for e in errors]
        for k, i in enumerate(plan.index):
            results[i] = plan.rows[k + 1] - plan.rows[k]
        return results

    def _leaves(self, plan: BatchPlan) -> np.ndarray:
        """Sampling mass per tape position of the plan (0 where no transition starts)."""
        leaves = np.zeros(plan.tape[-1], dtype=np.float64)
        if self.prioritized:  # (p + eps) ** alpha, in place in a scratch copy
            mass = plan.priorities + self.priority_eps
            leaves[plan.starts] = np.power(mass, self.alpha, out=mass)
        else:
            leaves[plan.starts] = 1.0
        return leaves

    def _write_run(self, plan: BatchPlan, leaves: np.ndarray, first: int) -> int:
        """Place planned chunks first, first+1, ... back to back at the cursor (jumping to slot 0 first
        if chunk `first` does not fit before the ring end); return the chunk after the run."""
        st, cap, tape = self.storage, self.storage.capacity, plan.tape
        retired_tail = -1
        if self.cursor + tape[first + 1] - tape[first] > cap:
            retired_tail = self.cursor
            self.abs_cursor += cap - self.cursor
            self.cursor = 0
        r0, a0 = self.cursor, self.abs_cursor
        stop = first + 1
        while stop < len(plan.index) and r0 + tape[stop + 1] - tape[first] <= cap:
            stop += 1
        shift = r0 - tape[first]  # ring slot = tape position + shift, for the whole run
        r1 = tape[stop] + shift
        self.claimed_end = a0 + (r1 - r0)  # publish the claim BEFORE touching the range
        stale_ends = self._cut(r0, [tape[k] + shift for k in range(first + 1, stop + 1)], retired_tail)
        np.add(plan.seg_ends[tape[first] : tape[stop]], shift, out=st.seg_end[r0:r1])
        self.frames_stored += r1 - r0
        # everything but the frame copies first: the copies stream megabytes through the caches
        try:
            starts = self._store_metadata(plan, shift, first, stop)
            self.live_starts[starts] = True  # writer-only; len() reads the counter, raised at publication
            records = self._records(plan, leaves, shift, a0 - r0, first, stop, retired_tail, stale_ends)
            for k in range(first, stop):
                st.write_frames(tape[k] + shift, plan.frames[k])
        except BaseException:
            # the range is claimed and partly written: publish it as dead so nothing is sampled
            # from it, and move on (claimed_end stays monotonic, the cursor matches it)
            st.action[r0:r1] = NO_ACTION
            st.seg_end[r0:r1] = -1
            self.live_starts[r0:r1] = False
            self.frames_stored -= r1 - r0
            self.records.extend(self._records(plan, np.zeros(tape[stop]), shift, a0 - r0, first, stop, retired_tail,
                                              stale_ends))
            self.cursor, self.abs_cursor = r1, a0 + (r1 - r0)
            raise
        self.records.extend(records)  # publication
        self.cursor, self.abs_cursor = r1, a0 + (r1 - r0)
        added = starts.size
        self.live_transitions += added
        self.transitions_added += added
        return stop

    def _cut(self, r0: int, ends: list[int], retired_tail: int) -> list[int]:
        """Writer-side bookkeeping of live slots for new segments [r0, ends[0]), [ends[0], ends[1]), ...:
        retire the tail if the cursor jumped, drop the old segments the new ones cover or cut into.
        Returns each new segment's stale_end, the value `write` would have computed for it alone."""
        seg_end, live = self.storage.seg_end, self.live_starts
        if retired_tail >= 0:
            self.frames_stored -= int(np.count_nonzero(seg_end[retired_tail:] >= 0))
            self.live_transitions -= int(np.count_nonzero(live[retired_tail:]))
            seg_end[retired_tail:] = -1
            live[retired_tail:] = False
        stale_ends, reach = [], -1
        for end in ends:
            # the old segment under a new segment's last slot ends where the stale part after the new
            # segment ends, unless an earlier segment of the run has already dropped that old one
            old = int(seg_end[end - 1]) if end - 1 >= reach else -1
            stale_ends.append(max(old, end))
            reach = max(reach, stale_ends[-1])
        r1 = ends[-1]
        self.frames_stored -= int(np.count_nonzero(seg_end[r0:reach] >= 0))
        self.live_transitions -= int(np.count_nonzero(live[r0:reach]))
        seg_end[r1:reach] = -1
        live[r0:reach] = False
        return stale_ends

    def _store_metadata(self, plan: BatchPlan, shift: int, first: int, stop: int) -> np.ndarray:
        """Per-slot metadata of planned chunks [first, stop), their tape shifted by `shift` onto the
        ring; returns the ring slots where their transitions start."""
        st = self.storage
        rows = slice(plan.rows[first], plan.rows[stop])
        starts = plan.starts[rows] + shift
        st.action[plan.tape[first] + shift : plan.tape[stop] + shift] = NO_ACTION
        st.action[starts] = plan.actions[rows]
        st.ret[starts] = plan.returns[rows]
        st.disc[starts] = plan.discounts if plan.discounts.ndim == 0 else plan.discounts[rows]
        st.boot[starts] = starts + self.n_step if plan.boots is None else plan.boots[rows] + shift
        np.add(plan.floors[plan.tape[first] : plan.tape[stop]], shift,
               out=st.floor[plan.tape[first] + shift : plan.tape[stop] + shift])
        return starts

    def _records(self, plan: BatchPlan, leaves: np.ndarray, shift: int, abs_shift: int, first: int, stop: int,
                 retired_tail: int, stale_ends: list[int]) -> list[SegmentRecord]:
        """One record per chunk of the run, in order (only the first carries the retired tail);
        `leaves` is indexed by tape position."""
        tape = plan.tape
        return [
            SegmentRecord(tape[k] + shift, tape[k] + shift + abs_shift, leaves[tape[k] : tape[k + 1]],
                          retired_tail if k == first else -1, stale_ends[k - first])
            for k in range(first, stop)
        ]
