"""The wire format between collectors and the head (see docs/PROTOCOL.md, byte by byte).

Every message is a ZeroMQ multipart message whose first frame is a fixed 64-byte little-endian
header; array payloads follow as raw frames (no pickle anywhere: a peer can only make us
parse numbers, never run code). Decoding validates everything a hostile or buggy peer could
get wrong and raises `ProtocolError(reason)` with a short, stable reason string that the
consolidation thread counts and logs once.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.bounds import UNKNOWN_BOUND
from envs.spec import EnvSpec
from shared.chunk import FLAG_END, FLAG_FIRST, FLAG_TERMINATED, FLAG_TRUNCATED, NO_ACTION, TransitionChunk
from shared.values import is_int

MAGIC = b"MAPX"
VERSION = 3  # 3: data sockets are ROUTER (head) <- DEALER with the WELCOME's routing id; 2: DEALER <-> DEALER

HELLO = 1
WELCOME = 2
TRANSITION_CHUNK = 3
EPISODE_SUMMARY = 4
HEARTBEAT = 5
WEIGHTS = 6
HEAD_HEARTBEAT = 7
BYE = 8
STOP = 9
CREDIT = 10
MESSAGE_TYPES = {HELLO, WELCOME, TRANSITION_CHUNK, EPISODE_SUMMARY, HEARTBEAT, WEIGHTS, HEAD_HEARTBEAT, BYE, STOP,
                 CREDIT}
TYPE_NAMES = {
    HELLO: "HELLO", WELCOME: "WELCOME", TRANSITION_CHUNK: "TRANSITION_CHUNK", EPISODE_SUMMARY: "EPISODE_SUMMARY",
    HEARTBEAT: "HEARTBEAT", WEIGHTS: "WEIGHTS", HEAD_HEARTBEAT: "HEAD_HEARTBEAT", BYE: "BYE", STOP: "STOP",
    CREDIT: "CREDIT",
}

# magic, version, type, ndim, collector, seq, count, dtype code, flags(reserved), reserved,
# shape[4], weight version, stream, first_start, reserved
HEADER = struct.Struct("<4sHBBIQIBBH4IQIII")
HEADER_SIZE = HEADER.size  # 64
# stream, length, return, x_pos, flag_get, world, stage, pad
EPISODE = struct.Struct("<IIdiBBBx")

DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8), 2: np.dtype(np.int8), 3: np.dtype("<u2"), 4: np.dtype("<i2"),
    5: np.dtype("<i4"), 6: np.dtype("<f2"), 7: np.dtype("<f4"), 8: np.dtype("<f8"),
}
CODE_OF_DTYPE = {dt: code for code, dt in DTYPE_CODES.items()}

MAX_FRAMES = 65_536  # frames per chunk
MAX_DIM = 4096  # per observation axis
MAX_NDIM = 4
MAX_STREAMS = 65_536
MAX_PAYLOAD_BYTES = 512 * 2**20  # one chunk's frames
MAX_JSON_BYTES = 1 * 2**20
MAX_JSON_DEPTH = 32  # nested objects/arrays in a JSON frame; HELLO needs 1, deeper is an attack or a bug
# Value bounds. n-step returns are summed in float64 and stored as float32 (shared/chunk.py): with
# |r| <= 1e6, gamma <= 1 and n <= 64 (config limits) a return stays below 6.4e7, far from float32's
# 3.4e38, and so do the TD errors and priorities computed from it. ObsSpec carries the head's bounds
# (the run's EnvSpec: the env's own, envs/bounds.py, or env.max_abs_*); these are a bare ObsSpec's.
DEFAULT_MAX_ABS_REWARD = UNKNOWN_BOUND  # per-step reward as sent (already multiplied by env.reward_scale)
DEFAULT_MAX_ABS_OBS = UNKNOWN_BOUND  # float observations only; integer frames (uint8 Mario) cannot overflow
MAX_ABS_EPISODE_RETURN = 1e15  # EPISODE_SUMMARY return (float64, unscaled; only averaged for logs)
MAX_HELLO_STRING = 256  # HELLO "host"
MAX_HELLO_NONCE = 64  # HELLO "nonce" (collectors send a 32-character uuid4 hex)
MAX_HELLO_INT = 2**31 - 1  # HELLO "pid" / "slot" / "envs" upper bound
KNOWN_FLAGS = FLAG_FIRST | FLAG_TERMINATED | FLAG_TRUNCATED
ZERO_COPY_MIN_BYTES = 64 * 1024  # pyzmq: copying small frames is cheaper than tracking them


class ProtocolError(ValueError):
    """A message failed validation; `reason` is a short stable token (e.g. 'bad_magic')."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Header:
    msg_type: int
    collector: int = 0
    seq: int = 0
    count: int = 0
    dtype_code: int = 0
    shape: tuple[int, ...] = ()
    weight_version: int = 0
    stream: int = 0
    first_start: int = 0

    def pack(self) -> bytes:
        dims = tuple(self.shape) + (0,) * (MAX_NDIM - len(self.shape))
        return HEADER.pack(MAGIC, VERSION, self.msg_type, len(self.shape), self.collector, self.seq, self.count,
                           self.dtype_code, 0, 0, *dims, self.weight_version, self.stream, self.first_start, 0)


@dataclass(frozen=True)
class ObsSpec:
    """What the receiver expects of chunks: one observation's shape/dtype, the action count, and
    the value bounds (|reward| <= max_abs_reward; float observations finite and |x| <= max_abs_obs).

    The wire's own view of the run's env: the head builds it from the EnvSpec with `ObsSpec.of`.
    Chunks carry rewards multiplied by `reward_scale`, EPISODE_SUMMARY returns are unscaled."""

    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    max_streams: int = MAX_STREAMS
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD
    max_abs_obs: float = DEFAULT_MAX_ABS_OBS
    reward_scale: float = 1.0
    max_episode_steps: int | None = None  # the env's time limit: no EPISODE_SUMMARY is longer (None: unbounded)

    @classmethod
    def of(cls, env: EnvSpec, max_streams: int = MAX_STREAMS, max_episode_steps: int | None = None) -> ObsSpec:
        """What the head expects of chunks for a run on `env` (whose episodes env.max_episode_steps truncates)."""
        return cls(env.obs_shape, env.obs_dtype, env.num_actions, max_streams=max_streams,
                   max_abs_reward=env.max_abs_reward, max_abs_obs=env.max_abs_obs, reward_scale=env.reward_scale,
                   max_episode_steps=max_episode_steps)

    @property
    def frame_bytes(self) -> int:
        """Bytes of one observation as a chunk carries it."""
        return np.dtype(self.obs_dtype).itemsize * math.prod(int(d) for d in self.obs_shape)


@dataclass(frozen=True)
class EpisodeSummary:
    stream: int
    length: int
    episode_return: float
    x_pos: int = 0
    flag_get: bool = False
    world: int = 0
    stage: int = 0


@dataclass(frozen=True)
class Message:
    """A decoded message: the header plus the type's payload (chunk, summary, dict or None)."""

    header: Header
    payload: Any = None


# ---------------------------------------------------------------------------- helpers
def _buf(part: Any) -> memoryview:
    buf = getattr(part, "buffer", None)  # zmq.Frame
    view = buf if buf is not None else memoryview(part)
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def send_parts(sock: Any, parts: Sequence[Any], flags: int = 0) -> None:
    """Send a multipart message: big frames zero-copy, small ones copied (pyzmq's advice)."""
    import zmq

    last = len(parts) - 1
    for i, part in enumerate(parts):
        nbytes = part.nbytes if isinstance(part, (np.ndarray, memoryview)) else len(part)
        more = zmq.SNDMORE if i < last else 0
        sock.send(part, flags | more, copy=nbytes < ZERO_COPY_MIN_BYTES)


def encode_json(msg_type: int, data: dict[str, Any], collector: int = 0, seq: int = 0) -> list[bytes]:
    """HELLO / WELCOME: header plus one UTF-8 JSON object frame."""
    return [Header(msg_type, collector=collector, seq=seq).pack(), json.dumps(data, sort_keys=True).encode()]


def encode_chunk(chunk: TransitionChunk, collector: int, seq: int, weight_version: int) -> list[Any]:
    """TRANSITION_CHUNK: header + frames, actions int32, rewards f32, flags u8, priorities f32."""
    frames = np.ascontiguousarray(chunk.frames)
    code = CODE_OF_DTYPE.get(frames.dtype.newbyteorder("<") if frames.dtype.byteorder == ">" else frames.dtype)
    if code is None:
        raise ProtocolError("bad_dtype", str(frames.dtype))
    header = Header(TRANSITION_CHUNK, collector, seq, chunk.num_frames, code, tuple(frames.shape[1:]),
                    weight_version, chunk.stream, chunk.first_start)
    return [
        header.pack(),
        frames,
        np.ascontiguousarray(chunk.actions, dtype="<i4"),
        np.ascontiguousarray(chunk.rewards, dtype="<f4"),
        np.ascontiguousarray(chunk.flags, dtype=np.uint8),
        np.ascontiguousarray(chunk.priorities, dtype="<f4"),
    ]


def encode_episode(summary: EpisodeSummary, collector: int, seq: int, weight_version: int) -> list[bytes]:
    body = EPISODE.pack(summary.stream, summary.length, summary.episode_return, summary.x_pos,
                        int(bool(summary.flag_get)), summary.world, summary.stage)
    return [Header(EPISODE_SUMMARY, collector, seq, weight_version=weight_version).pack(), body]


def encode_simple(msg_type: int, collector: int = 0, seq: int = 0, weight_version: int = 0,
                  count: int = 0) -> list[bytes]:
    """HEARTBEAT / HEAD_HEARTBEAT / BYE / STOP / CREDIT: the header alone (HEARTBEAT count 1 = waiting)."""
    return [Header(msg_type, collector, seq, count, weight_version=weight_version).pack()]


# ---------------------------------------------------------------------------- decoding
def decode_header(part: Any) -> Header:
    buf = _buf(part)
    if len(buf) != HEADER_SIZE:
        raise ProtocolError("bad_header_size", f"{len(buf)} bytes")
    (magic, version, msg_type, ndim, collector, seq, count, code, flags, reserved,
     d0, d1, d2, d3, weight_version, stream, first_start, reserved2) = HEADER.unpack(buf)
    if magic != MAGIC:
        raise ProtocolError("bad_magic")
    if version != VERSION:
        raise ProtocolError("bad_version", str(version))
    if msg_type not in MESSAGE_TYPES:
        raise ProtocolError("bad_type", str(msg_type))
    if flags or reserved or reserved2:
        raise ProtocolError("nonzero_reserved")
    if ndim > MAX_NDIM:
        raise ProtocolError("bad_shape", f"ndim {ndim}")
    dims = (d0, d1, d2, d3)
    if any(dims[ndim:]):
        raise ProtocolError("bad_shape", "dims past ndim")
    return Header(msg_type, collector, seq, count, code, tuple(dims[:ndim]), weight_version, stream, first_start)


def _expect_parts(parts: Sequence[Any], n: int) -> None:
    if len(parts) != n:
        raise ProtocolError("bad_frame_count", f"{len(parts)} != {n}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads accepts NaN/Infinity by default


def _json_depth_exceeds(data: Any, limit: int) -> bool:
    """True if `data` nests objects/arrays deeper than `limit` (iterative: no recursion to exhaust)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _decode_json(part: Any) -> dict[str, Any]:
    """One UTF-8 JSON object: at most MAX_JSON_BYTES, MAX_JSON_DEPTH levels deep, no NaN/Infinity."""
    buf = _buf(part)
    if len(buf) > MAX_JSON_BYTES:
        raise ProtocolError("json_too_large")
    try:
        data = json.loads(bytes(buf).decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:  # the C scanner recurses per nesting level; 1 MiB of "[" exhausts the stack
        raise ProtocolError("bad_json", f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("bad_json") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_json", "not an object")
    if _json_depth_exceeds(data, MAX_JSON_DEPTH):  # shallower than the stack limit, still too deep
        raise ProtocolError("bad_json", f"nested deeper than {MAX_JSON_DEPTH} levels")
    return data


def validate_hello(payload: Any) -> dict[str, Any]:
    """The HELLO fields a collector may send, checked and with defaults filled in.

    Returns exactly {"host": str, "pid": int, "slot": int, "nonce": str, "envs": int}; missing
    keys get "", 0, -1, "", 0; unknown keys are ignored. Raises ProtocolError("bad_hello", detail)
    naming the field for: host not a printable str of at most MAX_HELLO_STRING characters, nonce
    not a printable str of at most MAX_HELLO_NONCE, pid/envs not an int in [0, MAX_HELLO_INT],
    slot not an int in [-1, MAX_HELLO_INT] (bools are not ints here). Printable: a peer's
    strings end up in log lines, so no newlines or escape sequences.
    """
    if not isinstance(payload, dict):
        raise ProtocolError("bad_hello", f"payload is {type(payload).__name__}, expected a JSON object")
    out: dict[str, Any] = {}
    for key, default, limit in (("host", "", MAX_HELLO_STRING), ("nonce", "", MAX_HELLO_NONCE)):
        value = payload.get(key, default)
        if not isinstance(value, str):
            raise ProtocolError("bad_hello", f"{key} is {type(value).__name__}, expected a string")
        if len(value) > limit:
            raise ProtocolError("bad_hello", f"{key} has {len(value)} characters, allowed at most {limit}")
        if not value.isprintable():
            raise ProtocolError("bad_hello", f"{key}={value[:40]!r} has non-printable characters")
        out[key] = value
    for key, default, lo in (("pid", 0, 0), ("slot", -1, -1), ("envs", 0, 0)):
        value = payload.get(key, default)
        if not is_int(value) or not lo <= value <= MAX_HELLO_INT:
            shown = repr(value) if isinstance(value, (int, float, bool)) else type(value).__name__
            raise ProtocolError("bad_hello", f"{key}={shown[:40]}, allowed an integer in [{lo}, {MAX_HELLO_INT}]")
        out[key] = value
    return out


def _array(part: Any, dtype: np.dtype, count: int, name: str) -> np.ndarray:
    buf = _buf(part)
    if len(buf) != count * dtype.itemsize:
        raise ProtocolError("size_mismatch", f"{name}: {len(buf)} bytes for {count} x {dtype}")
    return np.frombuffer(buf, dtype=dtype)


def decode_chunk(header: Header, parts: Sequence[Any], spec: ObsSpec | None = None) -> TransitionChunk:
    """Validate sizes, codes, bounds and values; arrays are read-only views on the frames."""
    _expect_parts(parts, 6)
    count = header.count
    if count < 1 or count > MAX_FRAMES:
        raise ProtocolError("count_limit", str(count))
    dtype = DTYPE_CODES.get(header.dtype_code)
    if dtype is None:
        raise ProtocolError("bad_dtype", str(header.dtype_code))
    shape = header.shape
    if not shape or any(d < 1 or d > MAX_DIM for d in shape):
        raise ProtocolError("bad_shape", str(shape))
    per_frame = math.prod(shape) * dtype.itemsize
    if per_frame * count > MAX_PAYLOAD_BYTES:
        raise ProtocolError("count_limit", "payload too large")
    if spec is not None:
        if shape != tuple(spec.obs_shape) or dtype != np.dtype(spec.obs_dtype).newbyteorder("<"):
            raise ProtocolError("obs_spec_mismatch", f"{shape} {dtype}")
    max_streams = spec.max_streams if spec is not None else MAX_STREAMS
    if header.stream >= max_streams:
        raise ProtocolError("stream_range", str(header.stream))
    if header.first_start >= count:
        raise ProtocolError("first_start_range", str(header.first_start))
    fbuf = _buf(parts[1])
    if len(fbuf) != per_frame * count:
        raise ProtocolError("size_mismatch", f"frames: {len(fbuf)} bytes")
    frames = np.frombuffer(fbuf, dtype=dtype).reshape((count, *shape))
    actions = _array(parts[2], np.dtype("<i4"), count, "actions")
    rewards = _array(parts[3], np.dtype("<f4"), count, "rewards")
    flags = _array(parts[4], np.dtype(np.uint8), count, "flags")
    priorities = _array(parts[5], np.dtype("<f4"), count, "priorities")
    max_reward = spec.max_abs_reward if spec is not None else DEFAULT_MAX_ABS_REWARD
    if not (np.abs(rewards) <= max_reward).all():  # one pass; NaN compares False, so it fails here too
        _explain_rewards(rewards, max_reward)
    if dtype.kind == "f":  # one vectorized pass per bound, no temporaries; integer frames need none
        max_obs = spec.max_abs_obs if spec is not None else DEFAULT_MAX_ABS_OBS
        # NaN propagates through min/max and fails both tests; float() keeps numpy 2 from casting the bound
        # to float16 (1e6 -> inf)
        lo, hi = float(frames.min()), float(frames.max())
        if not (lo >= -max_obs and hi <= max_obs):
            _explain_obs(frames, max_obs)
    if not np.isfinite(priorities).all():
        raise ProtocolError("nonfinite_priority")
    if (priorities < 0).any():
        raise ProtocolError("negative_priority")
    if (flags & ~np.uint8(KNOWN_FLAGS)).any():
        raise ProtocolError("bad_flags")
    hi = spec.num_actions if spec is not None else 2**31 - 1
    if ((actions < NO_ACTION) | (actions >= hi)).any():
        raise ProtocolError("action_range")
    if ((flags & FLAG_END) == FLAG_END).any():
        raise ProtocolError("bad_flags", "TERMINATED and TRUNCATED")
    if (((flags & FLAG_END) != 0) & (actions < 0)).any():
        raise ProtocolError("end_without_action")
    if ((flags[1:] & FLAG_FIRST) != 0).any() and (actions[:-1][(flags[1:] & FLAG_FIRST) != 0] >= 0).any():
        raise ProtocolError("episode_crossing", "a step leads into a FIRST frame")
    return TransitionChunk(header.stream, header.first_start, frames, actions, rewards, flags, priorities)


def _explain_rewards(rewards: np.ndarray, bound: float) -> None:
    bad = np.flatnonzero(~np.isfinite(rewards))
    if bad.size:
        raise ProtocolError("nonfinite_reward", f"rewards[{bad[0]}]={rewards[bad[0]]}")
    bad = np.flatnonzero(np.abs(rewards) > bound)
    raise ProtocolError("reward_out_of_range", f"rewards[{bad[0]}]={rewards[bad[0]]:.6g}, allowed |r| <= {bound:g}")


def _explain_obs(frames: np.ndarray, bound: float) -> None:
    per_frame = frames.reshape(len(frames), -1)
    bad = np.flatnonzero(~np.isfinite(per_frame).all(axis=1))
    if bad.size:
        raise ProtocolError("nonfinite_obs", f"frame {bad[0]} has a NaN or infinite value")
    bad = np.flatnonzero((np.abs(per_frame) > bound).any(axis=1))
    value = per_frame[bad[0]][np.argmax(np.abs(per_frame[bad[0]]))]
    raise ProtocolError("obs_out_of_range", f"frame {bad[0]} has value {value:.6g}, allowed |x| <= {bound:g}")


def decode_episode(header: Header, parts: Sequence[Any]) -> EpisodeSummary:
    _expect_parts(parts, 2)
    buf = _buf(parts[1])
    if len(buf) != EPISODE.size:
        raise ProtocolError("size_mismatch", "episode summary")
    stream, length, ret, x_pos, flag_get, world, stage = EPISODE.unpack(buf)
    if not math.isfinite(ret):
        raise ProtocolError("nonfinite_reward", "episode return")
    if abs(ret) > MAX_ABS_EPISODE_RETURN:
        raise ProtocolError("reward_out_of_range", f"episode return {ret:.6g}, allowed |r| <= {MAX_ABS_EPISODE_RETURN:g}")
    if flag_get > 1:
        raise ProtocolError("bad_flags", "flag_get")
    return EpisodeSummary(stream, length, ret, x_pos, bool(flag_get), world, stage)


def decode(parts: Sequence[Any], spec: ObsSpec | None = None) -> Message:
    """Decode any collector<->head message except WEIGHTS (see shared.weights)."""
    if len(parts) < 1:
        raise ProtocolError("bad_frame_count", "empty")
    header = decode_header(parts[0])
    t = header.msg_type
    if t == TRANSITION_CHUNK:
        return Message(header, decode_chunk(header, parts, spec))
    if t == EPISODE_SUMMARY:
        return Message(header, decode_episode(header, parts))
    if t in (HELLO, WELCOME):
        _expect_parts(parts, 2)
        return Message(header, _decode_json(parts[1]))
    if t in (HEARTBEAT, HEAD_HEARTBEAT, BYE, STOP, CREDIT):
        _expect_parts(parts, 1)
        return Message(header)
    raise ProtocolError("unexpected_type", TYPE_NAMES.get(t, str(t)))
