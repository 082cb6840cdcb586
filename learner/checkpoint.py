"""Atomic checkpoints: write, find, verify and read them (no pickle of arbitrary objects).

Layout of ``run_dir/checkpoint/`` (only the latest is kept):

    meta.json       format version, geometry (obs_shape, obs_dtype, stack, num_actions, hidden,
                    dueling), counters, python/numpy RNG states, and size + sha256 of every
                    file below; written last, so its presence marks a complete checkpoint
    config.json     the run's Config (Config.to_json())
    model.pt        {"online": state_dict, "target": state_dict}
    optimizer.pt    Adam state_dict
    scaler.pt       GradScaler state_dict (empty dict when no scaler)
    rng.pt          {"torch": ByteTensor, "cuda": [ByteTensor, ...]}
    replay/         optional: ReplayBuffer.save() output (learner.save_replay)

Atomicity: everything is written into ``run_dir/.checkpoint.tmp-<pid>`` and fsynced; then
the old ``checkpoint/`` is renamed to ``checkpoint.old``, the temp dir to ``checkpoint/``,
and ``checkpoint.old`` removed. A crash between the two renames leaves ``checkpoint.old``,
which `find_checkpoint` falls back to. Reading uses ``torch.load(weights_only=True)``: only
tensors and plain containers, never code. Every failure is a `CheckpointError` naming the
file and what is wrong (missing, truncated, hash mismatch, missing key, shape mismatch,
different geometry).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 1
DIR_NAME = "checkpoint"
OLD_NAME = "checkpoint.old"
TORCH_FILES = ("model.pt", "optimizer.pt", "scaler.pt", "rng.pt")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not match this learner; the message says which file/key."""


@dataclass
class CheckpointData:
    """Everything in a checkpoint except the replay, in memory."""

    geometry: dict[str, Any]  # obs_shape (list), obs_dtype (str), stack, num_actions, hidden, dueling
    model: dict[str, dict[str, torch.Tensor]]  # {"online": sd, "target": sd}
    optimizer: dict[str, Any]
    scaler: dict[str, Any]
    counters: dict[str, int | float] = field(default_factory=dict)
    config_json: str = "{}"
    rng: dict[str, Any] = field(default_factory=dict)  # python/numpy (JSON) + torch/cuda (tensors)
    has_replay: bool = False
    path: Path | None = None  # where it was read from


# ---------------------------------------------------------------------- RNG capture
def capture_rng() -> dict[str, Any]:
    """Python, numpy (legacy global) and torch CPU/CUDA generator states."""
    py = random.getstate()
    np_state = np.random.get_state()
    rng: dict[str, Any] = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    if "python" in rng:
        v, state, gauss = rng["python"]
        random.setstate((int(v), tuple(int(x) for x in state), gauss))
    if "numpy" in rng:
        name, keys, pos, has_gauss, cached = rng["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    cuda = rng.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# ---------------------------------------------------------------------- writing
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | os.PathLike, data: CheckpointData, replay: Any = None) -> Path:
    """Write `data` (and `replay.save()` when given) atomically to run_dir/checkpoint/; returns it."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    tmp = run / f".checkpoint.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        payloads = {
            "model.pt": data.model,
            "optimizer.pt": data.optimizer,
            "scaler.pt": data.scaler,
            "rng.pt": {"torch": data.rng.get("torch", torch.get_rng_state()), "cuda": list(data.rng.get("cuda", []))},
        }
        files: dict[str, dict[str, Any]] = {}
        for name, obj in payloads.items():
            torch.save(obj, tmp / name)
            _fsync_file(tmp / name)
            files[name] = {"bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)}
        (tmp / "config.json").write_text(data.config_json)
        if replay is not None:
            replay.save(tmp / "replay")
        meta = {
            "format": FORMAT_VERSION,
            "created_unix": time.time(),
            "geometry": data.geometry,
            "counters": data.counters,
            "rng": {"python": data.rng.get("python"), "numpy": data.rng.get("numpy")},
            "files": files,
            "has_replay": replay is not None,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, sort_keys=True))
        _fsync_file(tmp / "meta.json")
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final, old = run / DIR_NAME, run / OLD_NAME
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(run)
    shutil.rmtree(old, ignore_errors=True)
    return final


# ---------------------------------------------------------------------- reading
def find_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint dir for `path`: itself if it holds meta.json, else path/checkpoint (or .old)."""
    p = Path(path)
    if (p / "meta.json").is_file():
        return p
    for name in (DIR_NAME, OLD_NAME):
        if (p / name / "meta.json").is_file():
            return p / name
    raise CheckpointError(f"{p}: no checkpoint found (expected {p / DIR_NAME / 'meta.json'})")


def _torch_load(path: Path, info: Mapping[str, Any] | None) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: file missing from the checkpoint")
    if info is not None:
        size = path.stat().st_size
        if size != info.get("bytes"):
            raise CheckpointError(f"{path}: {size} bytes but meta.json records {info.get('bytes')} (truncated or replaced)")
        if _sha256(path) != info.get("sha256"):
            raise CheckpointError(f"{path}: sha256 differs from meta.json (file is corrupt)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for unreadable/unsafe files
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc


def load_checkpoint(path: str | os.PathLike) -> CheckpointData:
    """Read and verify a checkpoint (not the replay); `path` is a run dir or a checkpoint dir."""
    ckpt = find_checkpoint(path)
    meta_path = ckpt / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{meta_path}: unreadable ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{meta_path}: format {got!r}, this code reads format {FORMAT_VERSION}")
    for key in ("geometry", "counters", "files"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: missing key {key!r}")
    files = meta["files"]
    loaded = {name: _torch_load(ckpt / name, files.get(name)) for name in TORCH_FILES}
    model = loaded["model.pt"]
    if not isinstance(model, dict) or "online" not in model or "target" not in model:
        raise CheckpointError(f"{ckpt / 'model.pt'}: expected a dict with 'online' and 'target' state dicts")
    config_path = ckpt / "config.json"
    config_json = config_path.read_text() if config_path.is_file() else "{}"
    rng_t = loaded["rng.pt"] if isinstance(loaded["rng.pt"], dict) else {}
    rng = {**(meta.get("rng") or {}), "torch": rng_t.get("torch"), "cuda": rng_t.get("cuda", [])}
    rng = {k: v for k, v in rng.items() if v is not None}
    return CheckpointData(
        geometry=meta["geometry"],
        model=model,
        optimizer=loaded["optimizer.pt"],
        scaler=loaded["scaler.pt"],
        counters=meta["counters"],
        config_json=config_json,
        rng=rng,
        has_replay=bool(meta.get("has_replay")) and (ckpt / "replay").is_dir(),
        path=ckpt,
    )


def check_geometry(expected: Mapping[str, Any], got: Mapping[str, Any], where: Path | str) -> None:
    """Raise CheckpointError naming every geometry field that differs (obs shape, actions, ...)."""
    diffs = [f"{k}: checkpoint {got.get(k)!r} vs learner {v!r}" for k, v in expected.items() if got.get(k) != v]
    if diffs:
        raise CheckpointError(f"{where}: checkpoint does not match this learner: " + "; ".join(diffs))


def check_state_dict(expected: Mapping[str, torch.Tensor], got: Any, where: str) -> None:
    """Raise CheckpointError for a missing/unexpected key or a shape/dtype mismatch."""
    if not isinstance(got, Mapping):
        raise CheckpointError(f"{where}: expected a state dict, got {type(got).__name__}")
    missing = [k for k in expected if k not in got]
    if missing:
        raise CheckpointError(f"{where}: missing key(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    extra = [k for k in got if k not in expected]
    if extra:
        raise CheckpointError(f"{where}: unexpected key(s) {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    for k, ref in expected.items():
        t = got[k]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{where}: {k} is {type(t).__name__}, expected a tensor")
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{where}: shape mismatch for {k}: checkpoint {tuple(t.shape)} vs learner {tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise CheckpointError(f"{where}: dtype mismatch for {k}: checkpoint {t.dtype} vs learner {ref.dtype}")
