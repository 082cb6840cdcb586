"""Pre-allocated frame ring and per-slot metadata, shared by the writer and the reader.

Layout: one global ring of `capacity` frame slots. Every chunk becomes one
contiguous *segment* at the write cursor and never wraps, so a stack is always a run of slot
indices inside one segment and never mixes streams or episodes. Each frame is stored once;
stacks are rebuilt at sample time from per-slot floors with `shared.chunk.stack_indices`.

Per slot (numpy, CPU; written by the writer, read by the reader only for sampled rows):

- ``action``   action of the transition starting here, NO_ACTION if none starts here;
- ``ret``/``disc``  its n-step return and bootstrap discount;
- ``boot``     ring slot of the frame the target bootstraps from (same segment);
- ``floor``    ring slot of the episode's first frame or the segment start (stack padding);
- ``seg_end``  ring end (exclusive) of the live segment holding the slot, -1 if none
               (writer-only bookkeeping: which old segment a new one partially overwrites).

Frames live in one uint8 torch tensor on the storage device (the learner's GPU when it fits,
else CPU), so a sample is a device-side ``index_select`` of both stacks: per frame on the GPU, per
run of stack-many consecutive slots on CPU (`gather_windows`). ``torch.index_select(out=...)`` into a
preallocated buffer is near the copy floor on CPU and ~3x faster than ``np.take(..., out=)``, whose
out= path buffers (BENCHMARKS.md, "Design measurements"). A large CPU ring is its own private
mapping, advised to use huge pages.
"""

from __future__ import annotations

import mmap
import warnings

import numpy as np
import torch

from shared.chunk import NO_ACTION

# numpy dtypes with a torch equivalent (frames are stored as a torch tensor)
_TORCH_DTYPES = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}


def torch_dtype(obs_dtype) -> torch.dtype:
    dt = np.dtype(obs_dtype)
    if dt not in _TORCH_DTYPES:
        raise ValueError(f"obs_dtype {dt} is not storable; allowed: {', '.join(str(d) for d in _TORCH_DTYPES)}")
    return _TORCH_DTYPES[dt]


def resolve_storage_device(storage_device: str, learner_device, frame_bytes: int, capacity: int,
                           gpu_memory_fraction: float) -> torch.device:
    """Where frames live: 'cpu'; 'learner' (must fit); 'auto' (learner's GPU if it fits, else CPU)."""
    learner = torch.device(learner_device)
    if storage_device == "cpu" or learner.type != "cuda":
        if storage_device not in ("cpu", "learner", "auto"):
            raise ValueError(f"replay.storage_device={storage_device!r}: allowed auto, cpu, learner")
        return torch.device("cpu")
    index = learner.index if learner.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    needed = frame_bytes * capacity
    fits = needed <= gpu_memory_fraction * total
    if storage_device == "learner":
        if not fits:
            raise ValueError(
                f"replay.storage_device='learner': {capacity} frames need {needed} bytes but "
                f"replay.gpu_memory_fraction={gpu_memory_fraction} of cuda:{index} allows "
                f"{int(gpu_memory_fraction * total)} bytes; lower replay.capacity or use storage_device=auto/cpu"
            )
        return torch.device("cuda", index)
    if storage_device == "auto":
        return torch.device("cuda", index) if fits else torch.device("cpu")
    raise ValueError(f"replay.storage_device={storage_device!r}: allowed auto, cpu, learner")


def _huge_page_zeros(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """A zeroed CPU tensor in its own private anonymous mapping, advised to use transparent huge
    pages where the kernel offers them (THP "madvise" mode, the common default): a sample reads
    ~1,000 runs of ~28 KB scattered over a ring of hundreds of MB, and 2 MB pages spare most of
    its TLB misses (BENCHMARKS.md, "Replay against the copy floor"). Small rings and kernels without the advice get
    ordinary pages; the mapping lives as long as the tensor (numpy's buffer owns it)."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes < 2**22 or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.zeros(shape, dtype=torch_dtype(dtype))
    region = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # THP disabled or unsupported here: ordinary pages
        pass
    frames = torch.from_numpy(np.frombuffer(region, dtype=dtype).reshape(shape))
    frames.zero_()  # fault every page in now, as torch.zeros does: inserts never pay the first touch
    return frames


class FrameStorage:
    """The ring: frames on `device` plus numpy metadata, all allocated once here."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], obs_dtype, device) -> None:
        self.capacity = int(capacity)
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self.device = torch.device(device)
        shape = (self.capacity, *self.obs_shape)
        if self.device.type == "cpu":
            self.frames = _huge_page_zeros(shape, self.obs_dtype)
        else:
            self.frames = torch.zeros(shape, dtype=torch_dtype(obs_dtype), device=self.device)
        self.action = np.full(self.capacity, NO_ACTION, dtype=np.int32)
        self.ret = np.zeros(self.capacity, dtype=np.float32)
        self.disc = np.zeros(self.capacity, dtype=np.float32)
        self.boot = np.zeros(self.capacity, dtype=np.int32)
        self.floor = np.zeros(self.capacity, dtype=np.int32)
        self.seg_end = np.full(self.capacity, -1, dtype=np.int32)
        self._write_stream = None  # CUDA stream of the writer thread (created on first write)
        self._frames_np = self.frames.numpy() if self.device.type == "cpu" else None
        self._windows: dict[int, torch.Tensor] = {}  # width -> overlapping [slots, width frames] view

    @property
    def frame_bytes(self) -> int:
        return int(self.frames[0].numel() * self.frames.element_size()) if self.capacity else 0

    def metadata_arrays(self) -> dict[str, np.ndarray]:
        return {"action": self.action, "ret": self.ret, "disc": self.disc, "boot": self.boot,
                "floor": self.floor, "seg_end": self.seg_end}

    def nbytes(self) -> int:
        return self.frame_bytes * self.capacity + sum(a.nbytes for a in self.metadata_arrays().values())

    def write_frames(self, ring_start: int, frames: np.ndarray) -> None:
        """Copy a segment's frames in; on CUDA wait for the copy so publication follows it.

        Sources may be read-only (views of a received message): on CPU numpy copies into the
        ring's numpy view (no torch wrapper needed); on CUDA the read-only wrapper is only read.
        """
        stop = ring_start + len(frames)
        if self.device.type != "cuda":
            np.copyto(self._frames_np[ring_start:stop], frames, casting="no")
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "non-writable array": we only read it
            src = torch.from_numpy(np.ascontiguousarray(frames))
        # a private stream: the writer waits for its own copy only, not for the learner's kernels
        if self._write_stream is None:
            self._write_stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self._write_stream):
            self.frames[ring_start:stop].copy_(src)
        self._write_stream.synchronize()  # complete before the record is published

    def gather(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Frames at `slots` (int64 tensor on the storage device) -> [len(slots), *obs_shape]."""
        if out is None:
            return torch.index_select(self.frames, 0, slots)
        return torch.index_select(self.frames, 0, slots, out=out)

    def gather_windows(self, firsts: torch.Tensor, width: int, out: torch.Tensor) -> torch.Tensor:
        """Runs of `width` consecutive slots starting at each of `firsts` (each <= capacity - width)
        -> `out` viewed as [len(firsts), width, *obs_shape].

        One index_select row per run instead of one per frame: on CPU, 1,024 runs of 4 frames
        gather ~20% faster than the same 4,096 single frames (BENCHMARKS.md, replay section), because
        each run is one contiguous read of the ring.
        """
        windows = self._windows.get(width)
        if windows is None:
            per_frame = int(self.frames[0].numel()) if self.capacity else 0
            windows = self.frames.view(self.capacity, -1).as_strided(
                (self.capacity - width + 1, width * per_frame), (per_frame, 1))
            self._windows[width] = windows
        torch.index_select(windows, 0, firsts, out=out.view(len(firsts), -1))
        return out.view(len(firsts), width, *self.obs_shape)
