"""The reader side: owns the sum-tree, drains the writer's records, samples, updates priorities.

Only the reader thread touches the tree and `seg_abs` (the absolute start of the segment each
slot belongs to, as far as the reader knows; -1 for slots that hold no live segment). Every
public entry point first drains the writer's deque, applying records in order: set the new
segment's leaves, zero a retired tail, zero the remainder of an older segment the new one cut.

Freshness. Rows are drawn from the tree, so from segments whose copy had finished. The
writer may overwrite such a segment while we gather it; it always raises `claimed_end`
before touching a slot, so after the gather (and a CUDA sync) the reader re-reads it and
resamples every row whose segment satisfies ``abs_start + capacity < claimed_end``, until
all rows are fresh. Rows already known to be stale are rejected before the gather too.
A row is judged by the segment absolute start (and probability) captured *when it was
drawn*: a drain during a resampling round may put a newer segment into an already drawn
slot, and judging the row by that newer segment would accept a gather that read the old one
(tests/test_replay_concurrency.py exercises this interleaving). Rows from a just-retired tail stay valid: the
writer skipped those slots, their bytes are untouched, and their weight uses the
probability they were drawn with.

Sample indices handed to the learner are *absolute positions* (slot = index % capacity). A
position is never reused, so `update_priorities` can tell an update for a slot that has been
overwritten since it was sampled and ignore it: a stale update never resurrects a slot.

Outputs: actions/returns/discounts/weights are fresh tensors every call. Frames: on CUDA
fresh tensors (the caching allocator makes that free). On CPU a fresh 29 MB tensor per
512-batch can cost page faults (up to 2x the copy into a reused buffer; BENCHMARKS.md, "Design
measurements"), so the reader rotates a pool of `out_pool` (default 4, >= 3) preallocated
buffers per batch size: a returned batch's obs/next_obs stay valid until `out_pool - 1`
further samples of the same size have been made -- enough for the learner's one-batch
prefetch (batch being trained + batch prefetched + the one being gathered). `out_pool=0`
returns fresh tensors on CPU too.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from replay.storage import FrameStorage
from replay.sum_tree import SumTree
from replay.writer import SegmentRecord, SegmentWriter
from shared.batch import SampleBatch
from shared.chunk import stack_indices

MAX_REDRAW_ROUNDS = 10_000  # consecutive stale redraws before sample() gives up
# Largest |TD| that becomes a priority: (1e30 + eps) ** alpha summed over 2**31 leaves stays far inside
# float64, so the tree's total (and every sampling probability) stays finite whatever the learner reports.
MAX_PRIORITY_TD = 1e30


def generator_from_state(state: object, where: str) -> np.random.Generator:
    """A numpy Generator continuing `state` (a `bit_generator.state` read back from JSON).

    ValueError (one line naming `where`) unless `state` is exactly what a PCG64 generator reports:
    numpy's setter accepts and silently wraps negative, fractional or oversized values, so the state
    must also read back unchanged.
    """
    bit_gen = np.random.PCG64()
    try:
        if not isinstance(state, dict) or state.get("bit_generator") != "PCG64":
            raise ValueError("not a PCG64 state")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # numpy warns (not raises) when it wraps an out-of-range integer
            bit_gen.state = state
        if bit_gen.state != state:
            raise ValueError("does not read back unchanged")
    except (TypeError, ValueError, KeyError, OverflowError, Warning) as exc:
        text, why = repr(state), " ".join(str(exc).split())
        text = text if len(text) <= 80 else text[:77] + "..."
        why = why if len(why) <= 80 else why[:77] + "..."
        raise ValueError(f"{where}: sampler_rng={text} is invalid ({why}): allowed numpy.random.PCG64().state, "
                         f"as {{\"bit_generator\": \"PCG64\", \"state\": {{\"state\": int, \"inc\": int}}, "
                         f"\"has_uint32\": 0|1, \"uinteger\": int}}") from None
    return np.random.Generator(bit_gen)


class SegmentReader:
    """Call every method from exactly one thread (the learner's sampling thread)."""

    def __init__(self, storage: FrameStorage, writer: SegmentWriter, stack: int, prioritized: bool, alpha: float,
                 priority_eps: float, seed: int | None = None, out_pool: int = 4) -> None:
        if out_pool not in (0,) and out_pool < 3:
            raise ValueError(f"out_pool={out_pool}: use 0 (fresh tensors) or >= 3 rotating buffers")
        self.storage, self.writer = storage, writer
        self.stack, self.prioritized = int(stack), bool(prioritized)
        self.alpha, self.priority_eps = float(alpha), float(priority_eps)
        self.tree = SumTree(storage.capacity)
        self.seg_abs = np.full(storage.capacity, -1, dtype=np.int64)
        self.count = 0  # slots with a positive leaf (sampleable transitions)
        self.stale_rows_resampled = 0  # rows redrawn because the writer overwrote them mid-gather
        self.nonfinite_priorities_skipped = 0  # |TD| values that were NaN/inf: those rows keep their priority
        self.rng = np.random.default_rng(seed)
        self.out_pool = int(out_pool)
        self._pools: dict[int, list[torch.Tensor]] = {}
        self._pool_next: dict[int, int] = {}

    # ------------------------------------------------------------------ records
    def drain(self) -> None:
        """Apply the segments published so far. Bounded by the count at entry: a writer that
        publishes faster than the reader applies must not keep the reader here forever."""
        records = self.writer.records
        for _ in range(len(records)):
            self.apply(records.popleft())

    def apply(self, rec: SegmentRecord) -> None:
        tree, cap = self.tree, self.storage.capacity
        if rec.retired_tail >= 0:
            self._clear(rec.retired_tail, cap)
        r0, r1 = rec.ring_start, rec.ring_start + rec.length
        self._clear(r1, rec.stale_end)
        self.count -= int(np.count_nonzero(tree.leaves(slice(r0, r1))))
        tree.set_range(r0, rec.leaves)
        self.count += int(np.count_nonzero(rec.leaves))
        self.seg_abs[r0:r1] = rec.abs_start

    def _clear(self, start: int, stop: int) -> None:
        if stop <= start:
            return
        self.count -= int(np.count_nonzero(self.tree.leaves(slice(start, stop))))
        self.tree.set_range(start, 0.0, stop)
        self.seg_abs[start:stop] = -1

    def __len__(self) -> int:
        self.drain()
        return self.count

    # ------------------------------------------------------------------ sampling
    def _stale(self, row_abs: np.ndarray) -> np.ndarray:
        """Rows whose segment (absolute start captured at draw time) the writer may have touched."""
        return row_abs + self.storage.capacity < self.writer.claimed_end

    def _draw(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, segment absolute starts, probabilities), all captured when each row was drawn.

        A row is judged by the segment it was drawn from, never by whatever a later drain
        put in its slot, so a row gathered from an overwritten segment is always caught.
        Rows already known to be stale are redrawn here, before any gather.
        """
        tree = self.tree
        slots = tree.sample_stratified(count, self.rng)
        row_abs = self.seg_abs[slots]
        probs = tree.leaves(slots) / tree.total
        stale = self._stale(row_abs)
        rounds = 0
        while stale.any():
            rounds = self._count_round(rounds)
            time.sleep(0)  # the writer is copying over these rows; let it finish and publish
            self.drain()
            if self.count == 0:
                raise ValueError("replay became empty while sampling")
            redo = np.flatnonzero(stale)
            slots[redo] = tree.sample_stratified(redo.size, self.rng)
            row_abs[redo] = self.seg_abs[slots[redo]]
            probs[redo] = tree.leaves(slots[redo]) / tree.total
            stale = self._stale(row_abs)
        return slots, row_abs, probs

    def _count_round(self, rounds: int) -> int:
        """Bound the redraw loop: if the writer laps the whole ring during every redraw, no row can
        ever be fresh, so fail loudly instead of spinning (the ring is far too small for the rate)."""
        if rounds >= MAX_REDRAW_ROUNDS:
            raise RuntimeError(
                f"replay capacity {self.storage.capacity} is overwritten by the writer faster than one batch "
                f"can be gathered ({MAX_REDRAW_ROUNDS} redraws in a row were stale); increase replay.capacity"
            )
        return rounds + 1

    def _out(self, rows: int) -> torch.Tensor | None:
        st = self.storage
        if self.out_pool == 0 or st.device.type == "cuda":
            return None
        pool = self._pools.get(rows)
        if pool is None:
            pool = [torch.empty((rows, *st.obs_shape), dtype=st.frames.dtype) for _ in range(self.out_pool)]
            self._pools[rows] = pool
            self._pool_next[rows] = 0
        k = self._pool_next[rows]
        self._pool_next[rows] = (k + 1) % len(pool)
        return pool[k]

    def _frame_slots(self, slots: np.ndarray) -> np.ndarray:
        """[2, len(slots), S] ring slots of each row's state stack and next-state stack."""
        st = self.storage
        boots = st.boot[slots].astype(np.int64)
        obs = stack_indices(slots, st.floor[slots].astype(np.int64), self.stack)
        nxt = stack_indices(boots, st.floor[boots].astype(np.int64), self.stack)
        return np.stack((obs, nxt))

    def _gather_stacks(self, slots: np.ndarray, out: torch.Tensor | None) -> torch.Tensor:
        """[2 * B * S, *obs] frames: the B obs stacks, then the B next-state stacks.

        CPU storage: a stack not padded by its episode start is S consecutive ring slots
        (segments never wrap), so it is gathered as one run; the few padded stacks (an
        episode's first S-1 transitions) are then overwritten with a per-frame gather. CUDA
        storage keeps the per-frame gather (the run gather is measured on CPU only).
        """
        st, s = self.storage, self.stack
        if st.device.type == "cuda" or out is None:
            return st.gather(torch.from_numpy(self._frame_slots(slots).reshape(-1)).to(st.device), out)
        newest = np.concatenate((slots, st.boot[slots].astype(np.int64)))
        floors = st.floor[newest].astype(np.int64)
        firsts = newest - (s - 1)
        padded = np.flatnonzero(firsts < floors)
        stacks = st.gather_windows(torch.from_numpy(np.clip(firsts, 0, st.capacity - s)), s, out)
        if padded.size:
            idx = stack_indices(newest[padded], floors[padded], s)
            stacks[torch.from_numpy(padded)] = st.gather(torch.from_numpy(idx.reshape(-1))).view(
                padded.size, s, *st.obs_shape)
        return out

    def sample(self, batch_size: int, beta: float = 0.4) -> SampleBatch:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be >= 1")
        self.drain()
        if self.count == 0:
            raise ValueError("cannot sample from an empty replay buffer (no complete transition inserted yet)")
        st, b, s = self.storage, int(batch_size), self.stack
        cuda = st.device.type == "cuda"
        slots, row_abs, probs = self._draw(b)
        # rows of `frames`: the B obs stacks, then the B next stacks -> view [2, B, S, *obs]
        frames = self._gather_stacks(slots, self._out(2 * b * s))
        actions, returns, discounts = st.action[slots], st.ret[slots], st.disc[slots]
        rounds = 0
        while True:
            if cuda:
                torch.cuda.current_stream(st.device).synchronize()
            stale_rows = np.flatnonzero(self._stale(row_abs))  # re-reads claimed_end after the gather
            if stale_rows.size == 0:
                break
            rounds = self._count_round(rounds)
            self.stale_rows_resampled += int(stale_rows.size)
            self.drain()
            new_slots, new_abs, new_probs = self._draw(stale_rows.size)
            slots[stale_rows], row_abs[stale_rows], probs[stale_rows] = new_slots, new_abs, new_probs
            fs = self._frame_slots(new_slots)  # [2, k, S]
            dst_rows = (np.array([0, b])[:, None, None] + stale_rows[None, :, None]) * s + np.arange(s)
            fresh = st.gather(torch.from_numpy(fs.reshape(-1)).to(st.device))
            flat = frames.view(2 * b * s, -1)
            flat[torch.from_numpy(dst_rows.reshape(-1)).to(st.device)] = fresh.view(fresh.shape[0], -1)
            actions[stale_rows] = st.action[new_slots]
            returns[stale_rows] = st.ret[new_slots]
            discounts[stale_rows] = st.disc[new_slots]
        frames = frames.view(2, b, s, *st.obs_shape)
        if self.prioritized:
            w = (self.count * probs) ** (-float(beta))
            weights = (w / w.max()).astype(np.float32)
        else:
            weights = np.ones(b, dtype=np.float32)
        positions = row_abs + (slots - row_abs % st.capacity)
        dev = st.device
        return SampleBatch(
            obs=frames[0], actions=torch.from_numpy(actions.astype(np.int64)).to(dev),
            returns=torch.from_numpy(returns).to(dev), discounts=torch.from_numpy(discounts).to(dev),
            next_obs=frames[1], weights=torch.from_numpy(weights).to(dev), indices=positions,
        )

    # ------------------------------------------------------------------ priorities
    def update_priorities(self, indices: np.ndarray, td_abs: np.ndarray) -> None:
        if isinstance(td_abs, torch.Tensor):  # accept the learner's |TD| tensor on any device
            td_abs = td_abs.detach().to("cpu", torch.float64).numpy()
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        td = np.asarray(td_abs, dtype=np.float64).reshape(-1)
        if indices.shape != td.shape:
            raise ValueError(f"update_priorities: {indices.size} indices but {td.size} td values")
        if not self.prioritized or indices.size == 0:
            return
        # A NaN/inf |TD| (a diverged or poisoned batch) must never reach the tree: one NaN leaf makes the
        # total NaN and every later sample() fail. Those rows keep their old priority and are counted.
        finite = np.isfinite(td)
        if not finite.all():
            self.nonfinite_priorities_skipped += int(td.size - np.count_nonzero(finite))
            indices, td = indices[finite], td[finite]
        self.drain()
        cap = self.storage.capacity
        slots = indices % cap
        seg = self.seg_abs[slots]
        current = (seg >= 0) & (seg + (slots - seg % cap) == indices) & (self.tree.leaves(slots) > 0.0)
        if not current.all():
            slots, td = slots[current], td[current]
        td = np.minimum(np.abs(td), MAX_PRIORITY_TD)
        self.tree.set(slots, (td + self.priority_eps) ** self.alpha)
