"""Bounded frame recording and GIF/MP4 writing for evaluation episodes.

Why bounded: a Mario episode may last 4,500 agent steps and one RGB screen is 180 KB, so
recording everything could take ~800 MB. `FrameRecorder` keeps at most `max_frames` frames
by doubling its stride (dropping every other frame kept so far) whenever it fills up, so
memory stays fixed and the clip still spans the whole episode at an even pace.
GIF goes through Pillow (always available here); MP4 through OpenCV's bundled FFmpeg when
that build has it (best effort: no downloads, no new dependency).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

GRAY_UPSCALE = 3  # an 84x84 observation becomes 252x252: big enough to watch


def to_rgb(frame: np.ndarray, upscale: int = 1) -> np.ndarray | None:
    """An (H, W, 3) uint8 picture from an RGB screen or a grayscale observation; None for vectors."""
    arr = np.asarray(frame)
    if arr.ndim == 3 and arr.shape[-1] in (3, 4):
        rgb = arr[..., :3]
    elif arr.ndim == 2:
        rgb = np.repeat(arr[..., None], 3, axis=2)
    else:
        return None
    if rgb.dtype != np.uint8:
        rgb = np.clip(rgb, 0, 255).astype(np.uint8)
    if upscale > 1:
        rgb = rgb.repeat(upscale, axis=0).repeat(upscale, axis=1)
    return np.ascontiguousarray(rgb)


class FrameRecorder:
    """Keeps every `stride`-th frame of one episode, never more than `max_frames`."""

    def __init__(self, max_frames: int = 400) -> None:
        if max_frames < 2:
            raise ValueError(f"max_frames={max_frames!r} is invalid: allowed an integer >= 2")
        self.max_frames = int(max_frames)
        self.frames: list[np.ndarray] = []
        self.stride = 1
        self._seen = 0

    def add(self, frame: np.ndarray) -> None:
        if self._seen % self.stride == 0:
            self.frames.append(frame)
            if len(self.frames) >= self.max_frames:
                self.frames = self.frames[::2]
                self.stride *= 2
        self._seen += 1


def write_gif(frames: Sequence[np.ndarray], path: str | Path, fps: float) -> Path:
    """Animated GIF (loops forever); `fps` is the playback rate of the kept frames."""
    from PIL import Image

    if not frames:
        raise ValueError(f"{path}: no frames to write")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    images = [Image.fromarray(f) for f in frames]
    duration_ms = max(20, int(round(1000.0 / max(fps, 1e-3))))  # browsers clamp below 20 ms
    images[0].save(out, save_all=True, append_images=images[1:], duration=duration_ms, loop=0, optimize=False)
    return out


def write_mp4(frames: Sequence[np.ndarray], path: str | Path, fps: float) -> Path | None:
    """MP4 (mp4v) via OpenCV when its FFmpeg backend can open a writer; None otherwise."""
    try:
        import cv2
    except ImportError:
        return None
    if not frames:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"), max(1.0, float(fps)), (w, h))
    if not writer.isOpened():
        out.unlink(missing_ok=True)
        return None
    try:
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    finally:
        writer.release()
    if not out.is_file() or out.stat().st_size == 0:
        out.unlink(missing_ok=True)
        return None
    return out
