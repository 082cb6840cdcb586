"""Atomic checkpoints: write, find, verify and read them (no pickle of arbitrary objects).

Layout of ``run_dir/checkpoint/`` (only the latest is kept):

    meta.json       format version, geometry (obs_shape, obs_dtype, stack, num_actions, hidden,
                    dueling), counters, python/numpy RNG states, and size + sha256 of every
                    .pt file and every file under replay/; written last, so its presence marks
                    a complete checkpoint
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
different geometry, a wrongly typed meta.json field).

Non-finite weights are never written and never loaded: `save_checkpoint` refuses a model or
optimizer state holding NaN/inf (a diverged learner must not overwrite the last good
checkpoint), and `load_checkpoint` refuses such a file, so `--resume` cannot restart from one.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

FORMAT_VERSION = 1
DIR_NAME = "checkpoint"
OLD_NAME = "checkpoint.old"
TORCH_FILES = ("model.pt", "optimizer.pt", "scaler.pt", "rng.pt")
REPLAY_DIR = "replay"


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


# ---------------------------------------------------------------------- finiteness
def _floating_tensors(obj: Any, prefix: str) -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every floating tensor in nested dicts/lists, e.g. 'optimizer/state/3/exp_avg'."""
    out: list[tuple[str, torch.Tensor]] = []
    stack: list[tuple[str, Any]] = [(prefix, obj)]
    while stack:
        name, node = stack.pop()
        if isinstance(node, torch.Tensor):
            if node.is_floating_point() or node.is_complex():
                out.append((name, node))
        elif isinstance(node, Mapping):
            stack.extend((f"{name}/{k}", v) for k, v in reversed(list(node.items())))
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{name}/{i}", v) for i, v in reversed(list(enumerate(node))))
    return out


def nonfinite_report(obj: Any, prefix: str) -> str | None:
    """None when every floating tensor in `obj` (a state dict, or nested dicts/lists of tensors) is
    finite; else '<prefix>/<name>: N of M values' for the first one holding NaN/inf, plus how many
    more do. One host sync per device the tensors live on."""
    named = _floating_tensors(obj, prefix)
    counts: list[int] = [0] * len(named)
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, t) in enumerate(named):
        by_device.setdefault(t.device, []).append(i)
    for idx in by_device.values():
        per = torch.stack([(~torch.isfinite(named[i][1].detach())).sum() for i in idx]).tolist()
        for i, n in zip(idx, per, strict=True):
            counts[i] = int(n)
    bad = [i for i, n in enumerate(counts) if n]
    if not bad:
        return None
    name, t = named[bad[0]]
    more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
    return f"{name}: {counts[bad[0]]} of {t.numel()} values{more}"


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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_meta(meta: Any, meta_path: Path) -> None:
    """Every field load_checkpoint and the learner read has the type they expect (CheckpointError naming it)."""

    def bad(name: str, value: Any, allowed: str) -> NoReturn:
        raise CheckpointError(f"{meta_path}: {name}={_short(value)} is invalid: allowed {allowed}")

    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{meta_path}: format {got!r}, this code reads format {FORMAT_VERSION}")
    for key in ("geometry", "counters", "files"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: missing key {key!r}")
    if not isinstance(meta["geometry"], dict):
        bad("geometry", meta["geometry"], "an object of obs_shape, obs_dtype, stack, num_actions, hidden, dueling")
    counters = meta["counters"]
    if not isinstance(counters, dict):
        bad("counters", counters, "an object of counter name -> number")
    for key, value in counters.items():
        if not _is_number(value) or not math.isfinite(value):
            bad(f"counters.{key}", value, "a finite number")
    files = meta["files"]
    if not isinstance(files, dict):
        bad("files", files, "an object of file name -> {bytes, sha256}")
    for name, info in files.items():
        parts = name.split("/")
        if name not in TORCH_FILES and not (len(parts) > 1 and parts[0] == REPLAY_DIR and ".." not in parts
                                           and "" not in parts and "\\" not in name):
            bad(f"files[{name!r}]", info, f"only entries for {', '.join(TORCH_FILES)} and {REPLAY_DIR}/<file>")
        if not isinstance(info, dict):
            bad(f"files[{name!r}]", info, "an object {\"bytes\": int, \"sha256\": str}")
        size, digest = info.get("bytes"), info.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            bad(f"files[{name!r}].bytes", size, "a non-negative integer")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            bad(f"files[{name!r}].sha256", digest, "64 lowercase hex digits")
    if not isinstance(meta.get("has_replay", False), bool):
        bad("has_replay", meta["has_replay"], "true or false")
    rng = meta.get("rng")
    if rng is None:
        return
    if not isinstance(rng, dict):
        bad("rng", rng, "an object with python and numpy generator states")
    if rng.get("python") is not None:
        try:
            version, state, gauss = rng["python"]
            if gauss is not None and not _is_number(gauss):
                raise TypeError("gauss")
            random.Random().setstate((int(version), tuple(int(x) for x in state), gauss))
        except (TypeError, ValueError, OverflowError):
            bad("rng.python", rng["python"], "random.getstate() as [version, [625 ints], gauss]")
    if rng.get("numpy") is not None:
        try:
            name, keys, pos, has_gauss, cached = rng["numpy"]
            np.random.RandomState().set_state((str(name), np.asarray(keys, dtype=np.uint32), int(pos),
                                               int(has_gauss), float(cached)))
        except (TypeError, ValueError, OverflowError):
            bad("rng.numpy", rng["numpy"], "numpy.random.get_state() as [name, [624 ints], pos, has_gauss, cached]")


def _check_torch_rng(rng_t: Any, path: Path) -> dict[str, Any]:
    """rng.pt's {"torch": ByteTensor, "cuda": [ByteTensor, ...]}, validated so restore_rng cannot fail."""
    if not isinstance(rng_t, dict):
        raise CheckpointError(f"{path}: expected a dict with 'torch' and 'cuda' generator states")
    state, cuda = rng_t.get("torch"), rng_t.get("cuda", [])
    if state is not None:
        try:
            torch.Generator().set_state(state)
        except (TypeError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"{path}: 'torch' is not a CPU generator state ({exc})") from exc
    if not isinstance(cuda, (list, tuple)) or not all(
            isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda):
        raise CheckpointError(f"{path}: 'cuda' must be a list of uint8 generator states")
    return {"torch": state, "cuda": list(cuda)}


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
    _check_meta(meta, meta_path)
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
    rng_t = _check_torch_rng(loaded["rng.pt"], ckpt / "rng.pt")
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
        geometry=meta["geometry"],
        model=model,
        optimizer=loaded["optimizer.pt"],
        scaler=loaded["scaler.pt"],
        counters=meta["counters"],
        config_json=config_json,
        rng=rng,
        has_replay=has_replay and (ckpt / REPLAY_DIR).is_dir(),
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
