"""Wire format: a round trip for every message type, and every validation reason."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared import protocol as P
from shared.chunk import FLAG_FIRST, FLAG_TERMINATED, NO_ACTION, TransitionChunk
from shared.network import build_q_network
from shared.weights import cpu_state, decode_weights, encode_weights

SPEC = P.ObsSpec((84, 84), np.dtype(np.uint8), 4, max_streams=8)


def make_chunk(f: int = 6, stream: int = 2, first_start: int = 1) -> TransitionChunk:
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 4, size=f).astype(np.int32)
    actions[-1] = NO_ACTION
    flags = np.zeros(f, np.uint8)
    flags[0] = FLAG_FIRST
    return TransitionChunk(stream, first_start, rng.integers(0, 256, size=(f, 84, 84), dtype=np.uint8), actions,
                           rng.random(f).astype(np.float32), flags, rng.random(f).astype(np.float32))


def as_bytes(parts) -> list[bytes]:
    return [bytes(memoryview(p).cast("B")) if isinstance(p, np.ndarray) else bytes(p) for p in parts]


def test_header_is_64_bytes_little_endian() -> None:
    raw = P.Header(P.HEARTBEAT, collector=3, seq=7, weight_version=9).pack()
    assert len(raw) == 64 and raw[:4] == b"MAPX"
    assert struct.unpack_from("<H", raw, 4)[0] == P.VERSION and raw[6] == P.HEARTBEAT
    assert struct.unpack_from("<I", raw, 8)[0] == 3 and struct.unpack_from("<Q", raw, 12)[0] == 7
    assert struct.unpack_from("<Q", raw, 44)[0] == 9


def test_chunk_round_trip() -> None:
    chunk = make_chunk()
    msg = P.decode(as_bytes(P.encode_chunk(chunk, collector=5, seq=11, weight_version=3)), SPEC)
    h, got = msg.header, msg.payload
    assert (h.msg_type, h.collector, h.seq, h.weight_version, h.count, h.shape) == (P.TRANSITION_CHUNK, 5, 11, 3, 6, (84, 84))
    assert (got.stream, got.first_start) == (2, 1)
    for name in ("frames", "actions", "rewards", "flags", "priorities"):
        np.testing.assert_array_equal(getattr(got, name), getattr(chunk, name))


@pytest.mark.parametrize("msg_type", [P.HELLO, P.WELCOME])
def test_json_round_trip(msg_type: int) -> None:
    data = {"collector_id": 4, "config": {"a": [1, 2]}, "epsilon": 0.25}
    msg = P.decode(P.encode_json(msg_type, data, collector=4))
    assert msg.header.msg_type == msg_type and msg.payload == data


@pytest.mark.parametrize("msg_type", [P.HEARTBEAT, P.HEAD_HEARTBEAT, P.BYE, P.STOP])
def test_simple_round_trip(msg_type: int) -> None:
    msg = P.decode(P.encode_simple(msg_type, collector=2, seq=5, weight_version=8))
    assert (msg.header.msg_type, msg.header.collector, msg.header.seq, msg.header.weight_version) == (msg_type, 2, 5, 8)


def test_episode_round_trip() -> None:
    s = P.EpisodeSummary(stream=3, length=120, episode_return=812.5, x_pos=1024, flag_get=True, world=1, stage=2)
    msg = P.decode(P.encode_episode(s, collector=1, seq=2, weight_version=0))
    assert msg.payload == s


def test_weights_round_trip_and_mismatch() -> None:
    net = build_q_network((84, 84), 4, 5, hidden=32)
    parts = as_bytes(encode_weights(7, cpu_state(net.state_dict())))
    other = build_q_network((84, 84), 4, 5, hidden=32)
    version, state = decode_weights(parts, other.state_dict())
    other.load_state_dict(state)
    assert version == 7
    for name, t in net.state_dict().items():
        assert torch.equal(t, other.state_dict()[name])
    wrong = build_q_network((84, 84), 4, 6, hidden=32)  # one more action: head shapes differ
    with pytest.raises(P.ProtocolError) as exc:
        decode_weights(parts, wrong.state_dict())
    assert exc.value.reason == "weights_mismatch"
    with pytest.raises(P.ProtocolError) as exc:
        decode_weights(parts[:-1], other.state_dict())
    assert exc.value.reason == "bad_frame_count"


def test_weights_bfloat16_and_nonfinite() -> None:
    state = {"w": torch.randn(3, 2).to(torch.bfloat16), "b": torch.zeros(0)}
    version, got = decode_weights(as_bytes(encode_weights(1, state)), state)
    assert torch.equal(got["w"], state["w"]) and got["b"].shape == (0,)
    bad = {"w": torch.full((3, 2), float("nan")).to(torch.bfloat16), "b": torch.zeros(0)}
    with pytest.raises(P.ProtocolError, match="nonfinite_weights"):
        decode_weights(as_bytes(encode_weights(2, bad)), state)


def _mutate_header(parts: list[bytes], offset: int, fmt: str, value) -> list[bytes]:
    head = bytearray(parts[0])
    struct.pack_into(fmt, head, offset, value)
    return [bytes(head), *parts[1:]]


def _reason(parts, spec=SPEC) -> str:
    with pytest.raises(P.ProtocolError) as exc:
        P.decode(parts, spec)
    return exc.value.reason


def test_chunk_validation_reasons() -> None:
    good = as_bytes(P.encode_chunk(make_chunk(), 1, 1, 0))
    assert _reason([good[0][:10], *good[1:]]) == "bad_header_size"
    assert _reason(_mutate_header(good, 0, "4s", b"XXXX")) == "bad_magic"
    assert _reason(_mutate_header(good, 4, "<H", 99)) == "bad_version"
    assert _reason(_mutate_header(good, 6, "<B", 77)) == "bad_type"
    assert _reason(good[:-1]) == "bad_frame_count"
    assert _reason(_mutate_header(good, 20, "<I", 10**9)) == "count_limit"
    assert _reason(_mutate_header(good, 20, "<I", 7)) == "size_mismatch"
    assert _reason(_mutate_header(good, 24, "<B", 42)) == "bad_dtype"
    assert _reason(_mutate_header(good, 32, "<I", 83)) == "obs_spec_mismatch"
    assert _reason(_mutate_header(good, 32, "<I", 0)) == "bad_shape"
    assert _reason(_mutate_header(good, 36, "<I", 5000)) == "bad_shape"
    assert _reason(_mutate_header(good, 40, "<I", 3)) == "bad_shape"  # a dim past ndim
    assert _reason(_mutate_header(good, 52, "<I", 8)) == "stream_range"
    assert _reason(_mutate_header(good, 56, "<I", 6)) == "first_start_range"
    assert _reason(_mutate_header(good, 25, "<B", 1)) == "nonzero_reserved"
    assert _reason(_mutate_header(good, 60, "<I", 1)) == "nonzero_reserved"

    def with_array(index: int, arr: np.ndarray) -> list[bytes]:
        return [*good[:index], arr.tobytes(), *good[index + 1:]]

    base = make_chunk()
    assert _reason(with_array(3, np.array([0, np.nan, 0, 0, 0, 0], np.float32))) == "nonfinite_reward"
    assert _reason(with_array(3, np.array([0, np.inf, 0, 0, 0, 0], np.float32))) == "nonfinite_reward"
    assert _reason(with_array(5, np.full(6, np.nan, np.float32))) == "nonfinite_priority"
    assert _reason(with_array(5, np.full(6, -1.0, np.float32))) == "negative_priority"
    assert _reason(with_array(4, np.array([1, 0, 0, 64, 0, 0], np.uint8))) == "bad_flags"
    assert _reason(with_array(2, np.array([0, 4, 0, 0, 0, -1], np.int32))) == "action_range"
    assert _reason(with_array(2, np.array([0, -2, 0, 0, 0, -1], np.int32))) == "action_range"
    flags = base.flags.copy()
    flags[-1] |= FLAG_TERMINATED
    assert _reason(with_array(4, flags)) == "end_without_action"
    assert _reason(with_array(1, np.zeros(10, np.uint8))) == "size_mismatch"


def test_json_and_episode_validation() -> None:
    hello = P.encode_json(P.HELLO, {"a": 1})
    assert _reason([hello[0], b"\xff\xfe"]) == "bad_json"
    assert _reason([hello[0], b"[1, 2]"]) == "bad_json"
    ep = P.encode_episode(P.EpisodeSummary(0, 1, float("nan")), 1, 1, 0)
    assert _reason(ep) == "nonfinite_reward"
    assert _reason([ep[0], ep[1][:-1]]) == "size_mismatch"
    assert _reason([]) == "bad_frame_count"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=0, max_size=8))
def test_random_bytes_only_raise_protocol_error(parts: list[bytes]) -> None:
    try:
        P.decode(parts, SPEC)
    except P.ProtocolError as exc:
        assert exc.reason and " " not in exc.reason


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 63), st.integers(0, 255), st.integers(1, 5))
def test_corrupted_header_bytes_only_raise_protocol_error(offset: int, value: int, drop: int) -> None:
    good = as_bytes(P.encode_chunk(make_chunk(), 1, 1, 0))
    head = bytearray(good[0])
    head[offset] = value
    for parts in ([bytes(head), *good[1:]], [bytes(head), *good[1:-drop]], [good[0], *[p[:-1] for p in good[1:]]]):
        try:
            P.decode(parts, SPEC)
        except P.ProtocolError:
            pass


FLOAT_SPEC = P.ObsSpec((4,), np.dtype(np.float32), 2)  # as the head builds it: default value bounds


def float_chunk(frames: np.ndarray | None = None, rewards: np.ndarray | None = None,
                dtype: str = "<f4") -> TransitionChunk:
    f = 6
    actions = np.zeros(f, np.int32)
    actions[-1] = NO_ACTION
    flags = np.zeros(f, np.uint8)
    flags[0] = FLAG_FIRST
    obs = np.linspace(-1, 1, f * 4).reshape(f, 4).astype(dtype) if frames is None else frames.astype(dtype)
    rew = np.ones(f, np.float32) if rewards is None else rewards.astype(np.float32)
    return TransitionChunk(0, 0, obs, actions, rew, flags, np.ones(f, np.float32))


def _obs_with(value: float, at: tuple[int, int] = (3, 2)) -> np.ndarray:
    frames = np.zeros((6, 4), np.float64)
    frames[at] = value
    return frames


@pytest.mark.parametrize("frames,rewards,spec,reason", [
    (_obs_with(np.nan), None, FLOAT_SPEC, "nonfinite_obs"),
    (_obs_with(np.inf), None, FLOAT_SPEC, "nonfinite_obs"),
    (_obs_with(-np.inf), None, FLOAT_SPEC, "nonfinite_obs"),
    (_obs_with(3e38), None, FLOAT_SPEC, "obs_out_of_range"),
    (_obs_with(-1.5e6), None, FLOAT_SPEC, "obs_out_of_range"),
    (_obs_with(11.0), None, P.ObsSpec((4,), np.dtype(np.float32), 2, max_abs_obs=10.0), "obs_out_of_range"),
    (None, np.array([0, 3.4e38, 0, 0, 0, 0]), FLOAT_SPEC, "reward_out_of_range"),
    (None, np.array([0, 0, -2e6, 0, 0, 0]), FLOAT_SPEC, "reward_out_of_range"),
    (None, np.array([0, 0, 0, 0, 11, 0]), P.ObsSpec((4,), np.dtype(np.float32), 2, max_abs_reward=10.0),
     "reward_out_of_range"),
    (None, np.array([0, 0, np.nan, 0, 0, 0]), FLOAT_SPEC, "nonfinite_reward"),
    (_obs_with(3e38), None, None, "obs_out_of_range"),  # no spec: the default bounds still apply
    (None, np.array([0, 3.4e38, 0, 0, 0, 0]), None, "reward_out_of_range"),
])
def test_chunk_value_bounds(frames, rewards, spec, reason) -> None:
    """The reproduced crash: NaN / ~3e38 observations or a 3.4e38 reward must never reach the replay."""
    parts = as_bytes(P.encode_chunk(float_chunk(frames, rewards), 1, 1, 0))
    assert _reason(parts, spec) == reason


def test_chunk_value_bounds_accept_the_limits_and_skip_integer_frames() -> None:
    at_limit = float_chunk(_obs_with(1e6), np.array([1e6, -1e6, 0, 0, 0, 0]))
    got = P.decode(as_bytes(P.encode_chunk(at_limit, 1, 1, 0)), FLOAT_SPEC).payload
    assert got.frames.max() == np.float32(1e6) and got.rewards.min() == np.float32(-1e6)
    half = float_chunk(_obs_with(65504.0), dtype="<f2")  # float16's largest finite value
    assert P.decode(as_bytes(P.encode_chunk(half, 1, 1, 0)), P.ObsSpec((4,), np.dtype("<f2"), 2)).payload
    assert _reason(as_bytes(P.encode_chunk(float_chunk(_obs_with(np.inf), dtype="<f2"), 1, 1, 0)),
                   P.ObsSpec((4,), np.dtype("<f2"), 2)) == "nonfinite_obs"
    full = make_chunk()  # uint8 frames of 255 everywhere: no value bound applies to integer observations
    full = TransitionChunk(full.stream, full.first_start, np.full_like(full.frames, 255), full.actions, full.rewards,
                           full.flags, full.priorities)
    assert P.decode(as_bytes(P.encode_chunk(full, 1, 1, 0)), SPEC).payload.frames.min() == 255


def test_value_errors_name_the_frame_and_value() -> None:
    with pytest.raises(P.ProtocolError) as exc:
        P.decode(as_bytes(P.encode_chunk(float_chunk(_obs_with(3e38)), 1, 1, 0)), FLOAT_SPEC)
    assert exc.value.detail == "frame 3 has value 3e+38, allowed |x| <= 1e+06"
    with pytest.raises(P.ProtocolError) as exc:
        P.decode(as_bytes(P.encode_chunk(float_chunk(rewards=np.array([0, 0, 5e6, 0, 0, 0])), 1, 1, 0)),
                 FLOAT_SPEC)
    assert exc.value.detail == "rewards[2]=5e+06, allowed |r| <= 1e+06"


def test_episode_return_bounds() -> None:
    ok = P.EpisodeSummary(0, 1, -P.MAX_ABS_EPISODE_RETURN)
    assert P.decode(P.encode_episode(ok, 1, 1, 0)).payload == ok
    assert _reason(P.encode_episode(P.EpisodeSummary(0, 1, 3.4e38), 1, 1, 0)) == "reward_out_of_range"
    assert _reason(P.encode_episode(P.EpisodeSummary(0, 1, float("-inf")), 1, 1, 0)) == "nonfinite_reward"


def _nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def test_json_nesting_depth_is_bounded() -> None:
    head = P.encode_json(P.HELLO, {})[0]
    assert P.decode([head, _nested(P.MAX_JSON_DEPTH)]).payload["a"]  # exactly the limit: accepted
    assert _reason([head, _nested(P.MAX_JSON_DEPTH + 1)]) == "bad_json"
    assert _reason([head, b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]) == "bad_json"  # RecursionError
    assert _reason([head, b'{"a": ' + b"[" * (P.MAX_JSON_BYTES - 8)]) == "bad_json"  # unterminated, 1 MiB deep
    assert _reason([head, b'{"pid": NaN}']) == "bad_json"
    assert _reason([head, b'{"pid": -Infinity}']) == "bad_json"
    brackets_in_strings = b'{"host": "' + b"[{" * 1000 + b'"}'  # brackets inside a string are not nesting
    assert P.decode([head, brackets_in_strings]).payload["host"] == "[{" * 1000


GOOD_HELLO = {"host": "mario-box", "pid": 4242, "slot": 3, "nonce": "0123456789abcdef0123456789abcdef", "envs": 8}


def test_validate_hello_accepts_the_collector_hello_and_fills_defaults() -> None:
    msg = P.decode(P.encode_json(P.HELLO, {**GOOD_HELLO, "future_field": [1]}))
    assert P.validate_hello(msg.payload) == GOOD_HELLO
    assert P.validate_hello({}) == {"host": "", "pid": 0, "slot": -1, "nonce": "", "envs": 0}
    edge = {"host": "h" * P.MAX_HELLO_STRING, "nonce": "n" * P.MAX_HELLO_NONCE, "pid": P.MAX_HELLO_INT, "slot": -1}
    assert P.validate_hello(edge)["host"] == "h" * 256


@pytest.mark.parametrize("field,value,detail", [
    ("host", "h" * 257, "host has 257 characters, allowed at most 256"),
    ("host", 7, "host is int, expected a string"),
    ("host", "evil\nFAKE LOG LINE", "non-printable"),
    ("nonce", "n" * 65, "nonce has 65 characters, allowed at most 64"),
    ("nonce", ["x"], "nonce is list, expected a string"),
    ("pid", "12", "pid=str, allowed an integer in [0, 2147483647]"),
    ("pid", 1.5, "pid=1.5, allowed an integer in [0, 2147483647]"),
    ("pid", True, "pid=True, allowed"),
    ("pid", -5, "pid=-5, allowed"),
    ("slot", -2, "slot=-2, allowed an integer in [-1, 2147483647]"),
    ("slot", 10**30, "slot=1000000000000000000000000000000, allowed"),
    ("slot", None, "slot=NoneType, allowed"),
    ("envs", {"a": 1}, "envs=dict, allowed"),
])
def test_validate_hello_rejects_each_bad_field(field, value, detail) -> None:
    with pytest.raises(P.ProtocolError) as exc:
        P.validate_hello({**GOOD_HELLO, field: value})
    assert exc.value.reason == "bad_hello" and detail in exc.value.detail


def test_validate_hello_rejects_a_non_object() -> None:
    with pytest.raises(P.ProtocolError, match="bad_hello: payload is list"):
        P.validate_hello([GOOD_HELLO])


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                         max_size=4), max_leaves=40),
       st.sampled_from(["host", "pid", "slot", "nonce", "envs"]))
def test_validate_hello_only_raises_protocol_error(value, field) -> None:
    try:
        out = P.validate_hello({**GOOD_HELLO, field: value})
    except P.ProtocolError as exc:
        assert exc.reason == "bad_hello"
    else:
        assert set(out) == set(GOOD_HELLO) and isinstance(out[field], (int, str))
