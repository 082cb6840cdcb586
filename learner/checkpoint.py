"""Atomic checkpoints: write, find, verify and read them (no pickle of arbitrary objects).

Layout of ``run_dir/checkpoint/`` (only the latest is kept):

    meta.json       format version, geometry (obs_shape, obs_dtype, stack, num_actions, hidden,
                    dueling, encoder, encoder_width), counters, python/numpy RNG states, and size + sha256 of every
                    .pt file and every file under replay/; written last, so its presence marks
                    a complete checkpoint
    config.json     the run's Config (Config.to_json())
    model.pt        {"online": state_dict, "target": state_dict}
    optimizer.pt    Adam state_dict
    scaler.pt       GradScaler state_dict (empty dict when no scaler)
    rng.pt          {"torch": ByteTensor, "cuda": [ByteTensor, ...]}
    replay/         optional: ReplayBuffer.save() output (learner.save_replay): contents, priorities,
                    cursors and the sampler's generator state (state.json), so a resumed run draws
                    the batches the uninterrupted run would have drawn

Atomicity: everything is written into ``run_dir/.checkpoint.tmp-<pid>`` and fsynced; then
the old ``checkpoint/`` is renamed to ``checkpoint.old``, the temp dir to ``checkpoint/``,
and ``checkpoint.old`` removed. A crash between the two renames leaves ``checkpoint.old``,
which `find_checkpoint` falls back to. A ``checkpoint`` that is a symlink (to another disk) stays
one: the temp dir, the swap and the ``.old`` folder are beside the folder it points to (`swap_paths`). A writer killed mid-save leaves its temp dir (with a replay,
hundreds of MB): each save removes the temp dirs of writers that no longer run (a live pid's is kept,
whoever it is). Reading uses ``torch.load(weights_only=True)``: only
tensors and plain containers, never code. Every failure is a `CheckpointError` naming the
file and what is wrong (missing, truncated, hash mismatch, missing key, shape mismatch,
different geometry, a wrongly typed meta.json field).

Non-finite weights are never written and never loaded: `save_checkpoint` refuses a model or
optimizer state holding NaN/inf (a diverged learner must not overwrite the last good
checkpoint), and `load_checkpoint` refuses such a file, so `--resume` cannot restart from one.
The replay's values get the same treatment when it is restored (`ReplayBuffer.restore`: float
frames, returns, discounts and priorities, finite and within the run's value bounds), since a matching
sha256 says nothing about them.
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

from envs.spec import EnvSpec
from learner.checkpoint_checks import (  # noqa: F401  (re-exported: callers catch ckpt.CheckpointError)
    CheckpointError,
    check_geometry,
    check_meta,
    check_state_dict,
    check_torch_rng,
    nonfinite_report,
)
from shared.tempdirs import start_ticks

FORMAT_VERSION = 1
TMP_PREFIX = ".checkpoint.tmp-"  # + the writer's pid
DIR_NAME = "checkpoint"
OLD_NAME = "checkpoint.old"
TORCH_FILES = ("model.pt", "optimizer.pt", "scaler.pt", "rng.pt")
REPLAY_DIR = "replay"
# geometry keys added after the first checkpoints were written, and the value a meta.json without them means
GEOMETRY_DEFAULTS: dict[str, Any] = {"encoder": "nature", "encoder_width": 1, "quantiles": 0, "noisy": False}


def geometry_of(spec: EnvSpec, hidden: int, dueling: bool, encoder: str = "nature",
                encoder_width: int = 1, quantiles: int = 0, noisy: bool = False) -> dict[str, Any]:
    """meta.json's geometry record of a learner on `spec`: what a checkpoint must match to be loaded.

    Its keys and value types are fixed: obs_shape (list), obs_dtype (numpy's dtype.str, e.g. "|u1"),
    stack, num_actions, hidden, dueling (every checkpoint has them), encoder (str), encoder_width
    (int), quantiles (int) and noisy (bool: NoisyNet head layers) (a checkpoint without them holds a nature
    encoder and one plain value per action: GEOMETRY_DEFAULTS)."""
    return {
        "obs_shape": [int(d) for d in spec.obs_shape],
        "obs_dtype": np.dtype(spec.obs_dtype).str,
        "stack": int(spec.stack),
        "num_actions": int(spec.num_actions),
        "hidden": int(hidden),
        "dueling": bool(dueling),
        "encoder": str(encoder),
        "encoder_width": int(encoder_width),
        "quantiles": int(quantiles),
        "noisy": bool(noisy),
    }


@dataclass
class CheckpointData:
    """Everything in a checkpoint except the replay, in memory."""

    geometry: dict[str, Any]  # obs_shape (list), obs_dtype (str), stack, num_actions, hidden, dueling, encoder, ...
    model: dict[str, dict[str, torch.Tensor]]  # {"online": sd, "target": sd}
    optimizer: dict[str, Any]
    scaler: dict[str, Any]
    counters: dict[str, int | float] = field(default_factory=dict)
    config_json: str = "{}"
    rng: dict[str, Any] = field(default_factory=dict)  # python/numpy (JSON) + torch/cuda (tensors)
    has_replay: bool = False
    path: Path | None = None  # where it was read from


# ---------------------------------------------------------------------- RNG capture
def eval_only(data: CheckpointData) -> CheckpointData:
    """What playing needs and nothing else: the online network in fp32 (the target entry shares its
    tensors, so torch.save stores them once), no optimizer moments, scaler or RNG streams. Loads like
    any checkpoint; cannot be resumed from."""
    online = {k: v.detach().float().contiguous() for k, v in data.model["online"].items()}
    return CheckpointData(
        geometry=data.geometry, model={"online": online, "target": online},
        optimizer={"state": {}, "param_groups": []}, scaler={}, counters=dict(data.counters),
        config_json=data.config_json, rng={},
    )


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
    """Write `data` (and `replay.save()` when given) atomically to run_dir/checkpoint/; returns it.

    CheckpointError, before anything is written, when a model or optimizer tensor is non-finite.
    """
    run = Path(run_dir)
    for prefix in ("online", "target"):
        bad = nonfinite_report(data.model.get(prefix, {}), prefix)
        if bad:
            raise CheckpointError(f"{run / DIR_NAME}: not written, non-finite weights in {bad} "
                                  f"(the previous checkpoint is kept)")
    bad = nonfinite_report(data.optimizer, "optimizer")
    if bad:
        raise CheckpointError(f"{run / DIR_NAME}: not written, non-finite optimizer state in {bad} "
                              f"(the previous checkpoint is kept)")
    run.mkdir(parents=True, exist_ok=True)
    final, old = swap_paths(run)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_temps(run)
    if final.parent != run:
        remove_abandoned_temps(final.parent)
    tmp = final.parent / f"{TMP_PREFIX}{os.getpid()}"  # beside the folder it replaces: the rename stays on its disk
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
            replay.save(tmp / REPLAY_DIR)
            for path in sorted(p for p in (tmp / REPLAY_DIR).rglob("*") if p.is_file()):
                _fsync_file(path)
                files[path.relative_to(tmp).as_posix()] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
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
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return run / DIR_NAME


def swap_paths(run: Path) -> tuple[Path, Path]:
    """(the folder a save replaces, where the previous one waits meanwhile): run/checkpoint and
    run/checkpoint.old; when run/checkpoint is a symlink (the checkpoint on another disk, say), the folder it
    points to and its `.old` sibling, so the link stays and every rename stays on the target's file system."""
    link = run / DIR_NAME
    if not link.is_symlink():
        return link, run / OLD_NAME
    target = Path(os.path.realpath(link))  # also of a dangling link: where the folder goes
    return target, target.with_name(target.name + ".old")


def remove_abandoned_temps(run: Path) -> list[Path]:
    """Remove `run`'s `.checkpoint.tmp-<pid>` dirs whose writer no longer runs (gone or a zombie, as
    `shared.tempdirs` decides for its folders); returns them."""
    removed = []
    for path in run.glob(f"{TMP_PREFIX}*"):
        suffix = path.name[len(TMP_PREFIX):]
        if not suffix.isdigit() or int(suffix) == os.getpid() or start_ticks(int(suffix)) is not None:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


# ---------------------------------------------------------------------- reading
def find_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint dir for `path`: itself if it holds meta.json, else path/checkpoint (or .old)."""
    p = Path(path)
    if (p / "meta.json").is_file():
        return p
    for candidate in (p / DIR_NAME, p / OLD_NAME, *swap_paths(p)):
        if (candidate / "meta.json").is_file():
            return candidate
    raise CheckpointError(f"{p}: no checkpoint found (expected {p / DIR_NAME / 'meta.json'})")


def _verify_file(path: Path, info: Mapping[str, Any] | None) -> None:
    """The file exists and, when meta.json recorded it, has the recorded size and sha256."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file missing from the checkpoint")
    if info is not None:
        size = path.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes but meta.json records {info['bytes']} (truncated or replaced)")
        if _sha256(path) != info["sha256"]:
            raise CheckpointError(f"{path}: sha256 differs from meta.json (file is corrupt)")


def _torch_load(path: Path, info: Mapping[str, Any] | None) -> Any:
    _verify_file(path, info)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for unreadable/unsafe files
        raise CheckpointError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc


def _verify_replay(ckpt: Path, files: Mapping[str, Any]) -> None:
    """Every replay file exists with its recorded size and sha256, and no unrecorded file is there."""
    root = ckpt / REPLAY_DIR
    if not root.is_dir():
        raise CheckpointError(f"{root}: missing, but meta.json says the checkpoint includes the replay")
    recorded = {name: info for name, info in files.items() if name.startswith(REPLAY_DIR + "/")}
    if not recorded:
        return  # written before replay files were hashed: replay.restore still checks shapes and invariants
    for name, info in sorted(recorded.items()):
        _verify_file(ckpt / name, info)
    extra = sorted(p.relative_to(ckpt).as_posix() for p in root.rglob("*") if p.is_file()
                   and p.relative_to(ckpt).as_posix() not in recorded)
    if extra:
        raise CheckpointError(f"{ckpt / extra[0]}: not recorded in meta.json (the replay was modified after saving)")


def load_checkpoint(path: str | os.PathLike, verify_replay: bool = False) -> CheckpointData:
    """Read and verify a checkpoint; `path` is a run dir or a checkpoint dir.

    The replay is not read; with `verify_replay` its files are checked against meta.json (sizes
    and sha256: reads the whole replay once). CheckpointError for any missing, corrupt or wrongly
    typed part, and for non-finite weights or optimizer state.
    """
    ckpt = find_checkpoint(path)
    meta_path = ckpt / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{meta_path}: unreadable ({type(exc).__name__}: {str(exc)[:200]})") from exc
    check_meta(meta, meta_path, FORMAT_VERSION, TORCH_FILES, REPLAY_DIR)
    files = meta["files"]
    loaded = {name: _torch_load(ckpt / name, files.get(name)) for name in TORCH_FILES}
    model = loaded["model.pt"]
    if not isinstance(model, dict) or not isinstance(model.get("online"), dict) or not isinstance(
            model.get("target"), dict):
        raise CheckpointError(f"{ckpt / 'model.pt'}: expected a dict with 'online' and 'target' state dicts")
    for prefix in ("online", "target"):
        bad = nonfinite_report(model[prefix], prefix)
        if bad:
            raise CheckpointError(f"{ckpt / 'model.pt'}: non-finite weights in {bad}; refusing to resume from it")
    for name in ("optimizer.pt", "scaler.pt"):
        if not isinstance(loaded[name], dict):
            raise CheckpointError(f"{ckpt / name}: expected a state dict, got {type(loaded[name]).__name__}")
    bad = nonfinite_report(loaded["optimizer.pt"], "optimizer")
    if bad:
        raise CheckpointError(f"{ckpt / 'optimizer.pt'}: non-finite optimizer state in {bad}; refusing to resume")
    rng_t = check_torch_rng(loaded["rng.pt"], ckpt / "rng.pt")
    config_path = ckpt / "config.json"
    try:
        config_json = config_path.read_text() if config_path.is_file() else "{}"
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: unreadable ({type(exc).__name__}: {exc})") from exc
    has_replay = bool(meta.get("has_replay", False))
    if has_replay and verify_replay:
        _verify_replay(ckpt, files)
    rng = {**(meta.get("rng") or {}), **rng_t}
    rng = {k: v for k, v in rng.items() if v is not None}
    return CheckpointData(
        geometry={**GEOMETRY_DEFAULTS, **meta["geometry"]},  # a meta.json from before the encoder keys: nature
        model=model,
        optimizer=loaded["optimizer.pt"],
        scaler=loaded["scaler.pt"],
        counters=meta["counters"],
        config_json=config_json,
        rng=rng,
        has_replay=has_replay and (ckpt / REPLAY_DIR).is_dir(),
        path=ckpt,
    )
