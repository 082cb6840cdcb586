"""What a checkpoint's contents must satisfy before anything is loaded from it.

Pure checks, each raising `CheckpointError` with one line naming the file or field, the value
and what is allowed: meta.json's fields and types, the RNG states, state dicts against the
learner's own (keys, shapes, dtypes), the optimizer and scaler states, the geometry, and the
finiteness of every floating tensor (a checkpoint is never written from, nor resumed with,
non-finite weights). `learner/checkpoint.py` does the reading and writing.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch

from shared.values import is_finite_number, is_int

# A counter (env steps, updates, samples, ...) is a count: an integer a float64, a JSON reader and an int64
# all hold exactly. -5 or 1e300 are finite numbers no run can reach (they ended a resume in a traceback).
MAX_COUNTER = 2**53
COUNT_ALLOWED = "a count (an integer in [0, 2**53])"


def is_count(value: Any) -> bool:
    """A checkpoint counter's value: an int (not a bool) in [0, MAX_COUNTER]."""
    return is_int(value) and 0 <= value <= MAX_COUNTER


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not match this learner; the message says which file/key."""


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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_meta(meta: Any, meta_path: Path, format_version: int, torch_files: tuple[str, ...],
               replay_dir: str) -> None:
    """Every field load_checkpoint and the learner read has the type they expect (CheckpointError naming it)."""

    def bad(name: str, value: Any, allowed: str) -> NoReturn:
        raise CheckpointError(f"{meta_path}: {name}={_short(value)} is invalid: allowed {allowed}")

    if not isinstance(meta, dict) or meta.get("format") != format_version:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointError(f"{meta_path}: format {got!r}, this code reads format {format_version}")
    for key in ("geometry", "counters", "files"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: missing key {key!r}")
    if not isinstance(meta["geometry"], dict):
        bad("geometry", meta["geometry"], "an object of obs_shape, obs_dtype, stack, num_actions, hidden, dueling, "
            "encoder, encoder_width, quantiles, noisy")
    encoder, width = meta["geometry"].get("encoder", "nature"), meta["geometry"].get("encoder_width", 1)
    quantiles = meta["geometry"].get("quantiles", 0)
    if not isinstance(meta["geometry"].get("noisy", False), bool):
        bad("geometry.noisy", meta["geometry"]["noisy"], "true or false (NoisyNet head layers)")
    if not is_int(quantiles) or quantiles < 0:
        bad("geometry.quantiles", quantiles, "a non-negative integer (0: one value per action)")
    if not isinstance(encoder, str):
        bad("geometry.encoder", encoder, "an encoder name such as 'nature' or 'impala'")
    if not is_int(width) or width < 1:
        bad("geometry.encoder_width", width, "a positive integer")
    counters = meta["counters"]
    if not isinstance(counters, dict):
        bad("counters", counters, "an object of counter name -> number")
    for key, value in counters.items():
        if not is_count(value):
            bad(f"counters.{key}", value, COUNT_ALLOWED)
    files = meta["files"]
    if not isinstance(files, dict):
        bad("files", files, "an object of file name -> {bytes, sha256}")
    for name, info in files.items():
        parts = name.split("/")
        if name not in torch_files and not (len(parts) > 1 and parts[0] == replay_dir and ".." not in parts
                                           and "" not in parts and "\\" not in name):
            bad(f"files[{name!r}]", info, f"only entries for {', '.join(torch_files)} and {replay_dir}/<file>")
        if not isinstance(info, dict):
            bad(f"files[{name!r}]", info, "an object {\"bytes\": int, \"sha256\": str}")
        size, digest = info.get("bytes"), info.get("sha256")
        if not is_int(size) or size < 0:
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
            if gauss is not None and not is_finite_number(gauss):
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


def check_torch_rng(rng_t: Any, path: Path) -> dict[str, Any]:
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


def check_geometry(expected: Mapping[str, Any], got: Mapping[str, Any], where: Path | str,
                   against: str = "learner") -> None:
    """Raise CheckpointError naming every geometry field that differs (obs shape, actions, ...);
    `against` names what `expected` belongs to in the message."""
    diffs = [f"{k}: checkpoint {got.get(k)!r} vs {against} {v!r}" for k, v in expected.items() if got.get(k) != v]
    if diffs:
        raise CheckpointError(f"{where}: checkpoint does not match this {against}: " + "; ".join(diffs))


def check_state_dict(expected: Mapping[str, torch.Tensor], got: Any, where: str, against: str = "learner") -> None:
    """Raise CheckpointError for a missing/unexpected key or a shape/dtype mismatch; `against` names what
    `expected` belongs to in the message."""
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
            raise CheckpointError(f"{where}: shape mismatch for {k}: checkpoint {tuple(t.shape)} vs {against} "
                                  f"{tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise CheckpointError(f"{where}: dtype mismatch for {k}: checkpoint {t.dtype} vs {against} {ref.dtype}")


def check_optimizer_state(opt_state: Any, params: list[torch.Tensor], where: str) -> None:
    """An optimizer state dict for exactly `params` (count and per-parameter shapes)."""
    if not isinstance(opt_state, Mapping) or "state" not in opt_state or "param_groups" not in opt_state:
        raise CheckpointError(f"{where}: not an optimizer state dict")
    groups, per_param = opt_state["param_groups"], opt_state["state"]
    if (not isinstance(groups, (list, tuple)) or not isinstance(per_param, Mapping)
            or not all(isinstance(g, Mapping) and isinstance(g.get("params", []), (list, tuple)) for g in groups)):
        raise CheckpointError(f"{where}: param_groups must be a list of dicts with a 'params' list and "
                                   f"state a dict")
    ids = [i for g in groups for i in g.get("params", [])]
    if len(ids) != len(params):
        raise CheckpointError(f"{where}: {len(ids)} parameters in checkpoint vs {len(params)} in learner")
    for pid, param in zip(ids, params, strict=True):
        entry = per_param.get(pid) if isinstance(pid, (int, str)) else None
        if entry is not None and not isinstance(entry, Mapping):
            raise CheckpointError(f"{where}: state[{pid}] is {type(entry).__name__}, expected a dict")
        for key, t in (entry or {}).items():
            if isinstance(t, torch.Tensor) and t.dim() > 0 and tuple(t.shape) != tuple(param.shape):
                raise CheckpointError(f"{where}: shape mismatch for state[{pid}][{key}]: checkpoint "
                                           f"{tuple(t.shape)} vs parameter {tuple(param.shape)}")


def check_scaler_state(scaler_state: Any, use_scaler: bool, where: str) -> None:
    """A GradScaler state of finite numbers (ignored when there is no scaler or none was saved)."""
    if not isinstance(scaler_state, Mapping):
        raise CheckpointError(f"{where}: expected a dict, got {type(scaler_state).__name__}")
    if not (use_scaler and scaler_state):
        return  # ignored: no scaler here, or none was saved
    for key in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"):
        value = scaler_state.get(key)
        if not is_finite_number(value):
            raise CheckpointError(f"{where}: {key}={value!r} is not a finite number")


def check_learner_state(state: Any, online: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor],
                        params: list[torch.Tensor], use_scaler: bool, where: str) -> None:
    """A learner's `state_dict()` (online/target/optimizer/scaler/counters) that fits a learner whose
    networks have the state dicts `online`/`target` and whose optimizer steps `params`."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{where}: expected a dict of online/target/optimizer/scaler/counters, "
                              f"got {type(state).__name__}")
    for name in ("online", "target", "optimizer", "scaler", "counters"):
        if name not in state:
            raise CheckpointError(f"{where}: missing {name!r}")
    check_state_dict(online, state["online"], f"{where}[online]")
    check_state_dict(target, state["target"], f"{where}[target]")
    for name in ("online", "target"):
        bad = nonfinite_report(state[name], name)
        if bad is not None:
            raise CheckpointError(f"{where}: non-finite weights in {bad}")
    check_optimizer_state(state["optimizer"], params, f"{where}[optimizer]")
    check_scaler_state(state["scaler"], use_scaler, f"{where}[scaler]")
    c = state["counters"]
    if not isinstance(c, Mapping):
        raise CheckpointError(f"{where}: counters is not a dict")
    bad_counter = next((k for k, v in c.items() if not is_count(v)), None)
    if bad_counter is not None:
        raise CheckpointError(f"{where}: counters[{bad_counter!r}]={_short(c[bad_counter])} is invalid: "
                              f"allowed {COUNT_ALLOWED}")
