"""WEIGHTS messages: a state_dict as header + JSON manifest + one raw frame per tensor.

No pickle and no torch.load: the receiver checks the manifest against its own network's
state_dict (names, shapes, dtypes) before it reads a byte, so a bad or mismatched message can
only raise `ProtocolError`, never load garbage or run code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envs.spec import EnvSpec
from shared.config import LearnerConfig
from shared.protocol import (
    MAX_JSON_BYTES,
    WEIGHTS,
    Header,
    ProtocolError,
    _buf,
    decode_header,
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool,
}
NAME_OF_DTYPE = {dt: name for name, dt in DTYPES.items()}
MAX_TENSORS = 4096


def cpu_state(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached CPU contiguous copies: safe to send zero-copy while the learner keeps training."""
    return {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state_dict.items()}


def encode_weights(version: int, state: Mapping[str, torch.Tensor]) -> list[Any]:
    """Header(count = tensors, weight_version = version), manifest JSON, raw little-endian frames.

    `state` must already be CPU and contiguous (see cpu_state); frames are views on its memory.
    """
    manifest = []
    frames: list[Any] = []
    for name, t in state.items():
        dtype_name = NAME_OF_DTYPE.get(t.dtype)
        if dtype_name is None:
            raise ProtocolError("bad_dtype", f"{name}: {t.dtype}")
        manifest.append({"name": name, "dtype": dtype_name, "shape": list(t.shape)})
        # a uint8 view of the tensor's bytes works for every dtype, bfloat16 included
        frames.append(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")
    header = Header(WEIGHTS, count=len(manifest), weight_version=version).pack()
    return [header, json.dumps(manifest).encode(), *frames]


def decode_weights(parts: Sequence[Any], reference: Mapping[str, torch.Tensor]) -> tuple[int, dict[str, torch.Tensor]]:
    """(version, state_dict) validated against `reference` (the receiver's own state_dict)."""
    if len(parts) < 2:
        raise ProtocolError("bad_frame_count", str(len(parts)))
    header = decode_header(parts[0])
    if header.msg_type != WEIGHTS:
        raise ProtocolError("unexpected_type", str(header.msg_type))
    if header.count > MAX_TENSORS or len(parts) != header.count + 2:
        raise ProtocolError("bad_frame_count", f"{len(parts)} for {header.count} tensors")
    raw = _buf(parts[1])
    if len(raw) > MAX_JSON_BYTES:
        raise ProtocolError("json_too_large")
    try:
        manifest = json.loads(bytes(raw).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("bad_json") from None
    if not isinstance(manifest, list) or len(manifest) != header.count:
        raise ProtocolError("bad_manifest", "length")
    names = [e.get("name") if isinstance(e, dict) else None for e in manifest]
    if set(names) != set(reference.keys()) or len(names) != len(reference):
        raise ProtocolError("weights_mismatch", "tensor names differ")
    out: dict[str, torch.Tensor] = {}
    for entry, part in zip(manifest, parts[2:], strict=True):
        name = entry["name"]
        ref = reference[name]
        dtype = DTYPES.get(entry.get("dtype"))
        shape = entry.get("shape")
        if dtype != ref.dtype or not isinstance(shape, list) or tuple(shape) != tuple(ref.shape):
            raise ProtocolError("weights_mismatch", f"{name}: {entry.get('dtype')} {shape}")
        buf = _buf(part)
        if len(buf) != math.prod(shape) * ref.element_size():
            raise ProtocolError("size_mismatch", name)
        if len(buf) == 0:
            tensor = torch.empty(shape, dtype=dtype)
        else:
            tensor = torch.from_numpy(np.frombuffer(buf, dtype=np.uint8).copy()).view(dtype).reshape(shape)
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ProtocolError("nonfinite_weights", name)
        out[name] = tensor
    return header.weight_version, out


def network_template(spec: EnvSpec, learner: LearnerConfig) -> dict[str, torch.Tensor]:
    """The state_dict layout (names, shapes, dtypes) WEIGHTS must match for a run whose env has `spec`
    (envs/factory.py `env_spec` of its config's env section) and whose network is `learner`'s.

    Built on the meta device (shapes only, no memory), so it is cheap."""
    from shared.network import build_q_network_for

    with torch.device("meta"):
        net = build_q_network_for(spec, learner)
    return dict(net.state_dict())


def weights_frame_limit(template: Mapping[str, torch.Tensor]) -> int:
    """Largest WEIGHTS frame to accept for `template`: its biggest tensor (or the JSON manifest)."""
    largest = max(t.numel() * t.element_size() for t in template.values())
    return int(largest) + MAX_JSON_BYTES
