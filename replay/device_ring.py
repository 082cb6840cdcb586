"""The reader's side of the replay mirrored on the storage device, for a step that samples there.

`replay/sampler.py` keeps the reader's state on the host (the sum-tree's leaves, each slot's
segment start) and reads the per-slot metadata from numpy. A device-resident learner step needs all
of it beside the frames, so `DeviceRing` keeps one float64 table on the frames' device, one row per
quantity and one column per ring slot:

    MASS     sampling mass (the tree's leaf; the step writes new priorities here)
    SEG_ABS  absolute start of the slot's segment as the reader knows it (-1: none)
    ACTION, RET, DISC, BOOT, FLOOR   the slot's transition (replay/storage.py)

(float64 holds every one of these exactly: slots and absolute positions stay far below 2**53.)

Who writes what. The writer thread writes frames and numpy metadata, then publishes records
(replay/writer.py). The reader thread -- the learner's, which also launches the step -- calls
`drain()`: it applies the records to the host reader exactly as `SegmentReader.drain` does (so the
tree, `seg_abs` and `count` stay the reader's), then copies the columns the records touched into the
table, one host-to-device copy per contiguous run of slots (usually one per drain). Between drains
the table changes only inside the step (its MASS row), so the step never sees a half-applied record.

Freshness is the writer's claim, as in the host reader: before touching a slot the writer raises
`claimed_end`, which lives in `writer.claim_tensor` (host memory, pinned for a GPU ring). The step
reads it twice on the device: before drawing (slots of a segment already claimed are not drawn) and
inside the gather op, after the gather (replay/device_batch.py), so a row whose segment was claimed
while it was being read is never trained on. Metadata copied by a drain may be newer than the record
it came with (the writer may already be rewriting those slots); such slots were claimed first, so
the same check excludes them.

Priorities live in the table while the step trains; `push()` writes them into the host tree (before
a checkpoint saves it) and `pull()` copies the whole reader state back (after a restore).

Uniforms. A draw needs one uniform per stratum. They come from the reader's own numpy generator
(`reader.rng`, checkpointed with the replay), `uniform_rows` draws at a time, copied to the device
in one transfer: the stream of uniforms is the one `sample()` would have consumed, so the device
sampler draws the host sampler's slots; `rewind_uniforms` puts the generator back over the rows not
used yet before a checkpoint saves it, so a resumed run draws what an uninterrupted one draws.
"""

from __future__ import annotations

import numpy as np
import torch

MASS, SEG_ABS, ACTION, RET, DISC, BOOT, FLOOR = range(7)
ROWS = 7


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping, non-adjacent [start, stop) ranges covering `ranges` (empty ones dropped)."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


class _Staging:
    """A host buffer for host-to-device copies: pinned, and reused only once its last copy finished,
    when the target is a GPU; a plain tensor on the CPU. `take(shape)` is a contiguous view of its start
    (a pinned source must be contiguous for the copy to stay asynchronous)."""

    def __init__(self, numel: int, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.flat = torch.zeros(numel, dtype=torch.float64, pin_memory=self.cuda)
        self._done = None

    def take(self, shape: tuple[int, ...]) -> torch.Tensor:
        if self._done is not None:
            self._done.synchronize()
        return self.flat[: int(np.prod(shape))].view(shape)

    def copy_to(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=self.cuda)
        if self.cuda:
            self._done = torch.cuda.Event()
            self._done.record(torch.cuda.current_stream(dst.device))


class DeviceRing:
    """The table, the frames and the claim a device step reads; call every method from the reader thread."""

    def __init__(self, replay, device: torch.device | str, batch: int, uniform_rows: int = 64) -> None:
        storage = replay.storage
        device, where = torch.device(device), storage.frames.device  # the frames' device has its index
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if where != device:
            raise ValueError(f"a device-resident step needs the replay frames on the learner's device {device}; they "
                             f"are on {where} (replay.storage_device decides; frames must fit on the GPU)")
        if batch < 1 or uniform_rows < 1:
            raise ValueError(f"batch={batch}, uniform_rows={uniform_rows}: both must be >= 1")
        self.storage, self.reader, self.writer = storage, replay.reader, replay.writer
        self.device, self.capacity, self.batch, self.uniform_rows = where, storage.capacity, batch, uniform_rows
        self.prioritized = bool(self.reader.prioritized)
        self.table = torch.zeros((ROWS, self.capacity), dtype=torch.float64, device=self.device)
        self.frames = storage.frames
        self.claim = self.writer.claim_tensor
        self.uniforms = torch.zeros((uniform_rows, batch), dtype=torch.float64, device=self.device)
        self._uniform_staging = [_Staging(uniform_rows * batch, self.device) for _ in range(2)]
        self._next_staging = 0
        self._filled_for = -1  # the update count the uniforms were last filled for (-1: never)
        self._block_state: dict = {}  # the generator's state before that fill
        self._table_staging: _Staging | None = None
        self.pull()

    # ------------------------------------------------------------------ reader state -> device
    def drain(self) -> int:
        """Apply the writer's published records (host reader and table); returns how many."""
        records, reader, cap = self.writer.records, self.reader, self.capacity
        touched: list[tuple[int, int]] = []
        count = len(records)  # bounded, as in SegmentReader.drain: a fast writer cannot keep us here
        for _ in range(count):
            rec = records.popleft()
            reader.apply(rec)
            touched.append((rec.ring_start, max(rec.ring_start + rec.length, rec.stale_end)))
            if rec.retired_tail >= 0:
                touched.append((rec.retired_tail, cap))
        for start, stop in merge_ranges(touched):
            self._copy_columns(start, stop)
        return count

    def pull(self) -> None:
        """Copy the whole reader state (leaves, segment starts, metadata) into the table."""
        self.reader.drain()
        self._copy_columns(0, self.capacity)

    def _copy_columns(self, start: int, stop: int) -> None:
        n = stop - start
        if self._table_staging is None or self._table_staging.flat.numel() < ROWS * n:
            self._table_staging = _Staging(ROWS * max(n, 1024), self.device)
        staging = self._table_staging
        host = staging.take((ROWS, n))
        rows = host.numpy()
        st = self.storage
        rows[MASS] = self.reader.tree.leaves(slice(start, stop))
        rows[SEG_ABS] = self.reader.seg_abs[start:stop]
        rows[ACTION] = st.action[start:stop]
        rows[RET] = st.ret[start:stop]
        rows[DISC] = st.disc[start:stop]
        rows[BOOT] = st.boot[start:stop]
        rows[FLOOR] = st.floor[start:stop]
        staging.copy_to(self.table[:, start:stop], host)

    # ------------------------------------------------------------------ device -> reader state
    def push(self) -> None:
        """Write the table's priorities into the host tree (its positive leaves only), e.g. before a save."""
        self.drain()
        mass = self.table[MASS].to("cpu", copy=True).numpy()
        leaves = self.reader.tree.leaves()
        self.reader.tree.set_range(0, np.where(leaves > 0.0, mass, 0.0))

    # ------------------------------------------------------------------ uniforms
    def refill_uniforms(self, updates: int, force: bool = False) -> bool:
        """Before the step of update number `updates`: if its uniforms are used up (or `force`), draw the
        next `uniform_rows` batches' uniforms from the reader's generator; row r serves the updates u with
        u % uniform_rows == r (the step picks its row by its own update counter). True if refilled."""
        rows = self.uniform_rows
        if not force and 0 <= self._filled_for <= updates < self._filled_for + rows:
            return False
        staging = self._uniform_staging[self._next_staging]
        self._next_staging = 1 - self._next_staging
        self._block_state = self.reader.rng.bit_generator.state
        draws = self.reader.rng.random((rows, self.batch))  # the order sample() would consume them in
        host = staging.take((rows, self.batch))
        np.copyto(host.numpy(), np.roll(draws, updates % rows, axis=0))
        staging.copy_to(self.uniforms, host)
        self._filled_for = updates
        return True

    def discard_uniforms(self) -> None:
        """Forget the uniforms drawn ahead (e.g. after the generator was restored): the next step refills."""
        self._filled_for = -1

    def rewind_uniforms(self, next_update: int) -> None:
        """Put the reader's generator where `sample()` would have left it before update `next_update`:
        back over the uniforms drawn ahead but not used yet (so a checkpoint saves that state and a resumed
        run draws what an uninterrupted one draws); the next step refills from there."""
        if self._filled_for < 0:
            return
        used = next_update - self._filled_for
        if not 0 <= used <= self.uniform_rows:
            raise ValueError(f"rewind_uniforms({next_update}): the uniforms were drawn for updates "
                             f"{self._filled_for}..{self._filled_for + self.uniform_rows - 1}")
        self.reader.rng.bit_generator.state = self._block_state
        self.reader.rng.random((used, self.batch))
        self._filled_for = -1
