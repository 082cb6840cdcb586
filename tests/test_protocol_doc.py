"""docs/PROTOCOL.md against the code: the contract a third-party collector is written from must not drift.

Checked: the version, the header table (offsets, sizes, types and which field sits where, by
packing a real header), the message type and dtype codes, every reason string the head can
produce, the config keys named, the observation-spec rules, the network's state_dict table,
the weights-loading snippet, and the worked example (replayed through the reference
StreamRecorder, encoded and decoded with shared.protocol, derived with shared.chunk).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from actors.stream import StreamRecorder
from shared import protocol as P
from shared.chunk import TransitionChunk, nstep_targets, stack_floors, stack_indices
from shared.config import Config, EnvConfig
from shared.network import build_q_network
from shared.weights import DTYPES, cpu_state, encode_weights

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "PROTOCOL.md").read_text()
HEAD_SOURCES = [ROOT / "shared" / "protocol.py", ROOT / "ingest" / "consolidation.py", ROOT / "ingest" / "registration.py",
                ROOT / "ingest" / "peers.py"]


# ---------------------------------------------------------------------------- doc parsing
def section(heading: str) -> str:
    """The doc text under `heading` (exact heading line) up to the next heading of the same or a higher level."""
    lines = DOC.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    starts = [i for i, line in enumerate(lines) if line.strip() == heading]
    assert len(starts) == 1, f"heading {heading!r} found {len(starts)} times in docs/PROTOCOL.md"
    out = []
    in_code = False
    for line in lines[starts[0] + 1:]:
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if not in_code and line.startswith("#"):
            hashes = len(line) - len(line.lstrip("#"))
            if hashes <= level:
                break
        out.append(line)
    return "\n".join(out)


def table_rows(text: str, first_header_cell: str) -> list[list[str]]:
    """Body rows of the markdown table whose header row starts with `first_header_cell`."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header_cell:
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append([c.strip() for c in body.strip().strip("|").split("|")])
            assert rows, f"table {first_header_cell!r} has no rows"
            return rows
    raise AssertionError(f"no table with header {first_header_cell!r}")


def unquote(cell: str) -> str:
    return cell.strip().strip("`")


def example() -> dict[str, Any]:
    blocks = re.findall(r"```json protocol-example\n(.*?)\n```", DOC, flags=re.S)
    assert len(blocks) == 1, f"expected one ```json protocol-example block, found {len(blocks)}"
    return json.loads(blocks[0])


def code_reasons(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        text = path.read_text()
        found |= set(re.findall(r'(?:ProtocolError|_?reject)\(\s*"([a-z_]+)"', text))
        found |= set(re.findall(r'rejected(?:=\(|\.append\()\(\s*"([a-z_]+)"', text))  # ingest/peers.py verdicts
    return found


# ---------------------------------------------------------------------------- version and header
def test_doc_states_the_code_version() -> None:
    title = re.search(r"^# .*\(version (\d+)\)$", DOC, flags=re.M)
    assert title is not None, "the title must state the protocol version"
    assert int(title.group(1)) == P.VERSION
    row = {unquote(r[3]): r for r in table_rows(section("### Header (64 bytes, little-endian, `struct` format "
                                                         f"`{P.HEADER.format}`)"), "Offset")}["version"]
    stated = re.search(r"`(\d+)`", row[4])
    assert stated is not None and int(stated.group(1)) == P.VERSION
    assert re.search(rf"Version {P.VERSION} \(this document\)", DOC), "the version history must name this version"


def _struct_fields(fmt: str) -> list[tuple[int, int]]:
    """(offset, size) per struct item; a repeat count groups items ('4I' is one 16-byte field, '4s' one 4-byte)."""
    out, offset = [], 0
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt.lstrip("<>=!@")):
        n = int(count or 1)
        size = struct.calcsize("<" + code) * n  # '4s' is 4 bytes, '4I' 16
        out.append((offset, size))
        offset += size
    return out


TYPE_FORMATS = {"bytes": "s", "u8": "B", "u16": "H", "u32": "I", "u64": "Q"}


def test_header_table_matches_the_struct() -> None:
    heading = next(line for line in DOC.splitlines() if line.startswith("### Header"))
    fmt = re.search(r"`struct` format `([^`]+)`", heading)
    assert fmt is not None and fmt.group(1) == P.HEADER.format
    size = re.search(r"\((\d+) bytes", heading)
    assert size is not None and int(size.group(1)) == P.HEADER.size == P.HEADER_SIZE
    rows = table_rows(section(heading), "Offset")
    layout = [(int(r[0]), int(r[1])) for r in rows]
    assert layout == _struct_fields(P.HEADER.format), "offsets/sizes in the doc differ from shared.protocol.HEADER"
    assert sum(s for _, s in layout) == P.HEADER.size

    # which field sits where: pack a real header with distinct values and read each row back by its doc type
    h = P.Header(P.TRANSITION_CHUNK, collector=0x01020304, seq=0x0A0B0C0D0E0F1011, count=777, dtype_code=7,
                 shape=(5, 6), weight_version=0x1122334455, stream=4242, first_start=99)
    expected = {"magic": P.MAGIC, "version": P.VERSION, "type": P.TRANSITION_CHUNK, "ndim": 2, "collector": 0x01020304,
                "seq": 0x0A0B0C0D0E0F1011, "count": 777, "dtype": 7, "flags": 0, "reserved": 0, "shape": (5, 6, 0, 0),
                "weight_version": 0x1122334455, "stream": 4242, "first_start": 99}
    raw = h.pack()
    seen = set()
    for offset, size, typ, name in ((int(r[0]), int(r[1]), r[2], unquote(r[3])) for r in rows):
        assert name in expected, f"header field {name!r} is not a field of shared.protocol.Header"
        seen.add(name)
        m = re.fullmatch(r"(?:(\d+) x )?(\w+)", typ)
        assert m is not None and m.group(2) in TYPE_FORMATS, f"unknown type {typ!r} in the header table"
        n, code = int(m.group(1) or 1), TYPE_FORMATS[m.group(2)]
        item = f"<{size}s" if code == "s" else f"<{n}{code}"
        assert struct.calcsize(item) == size, f"{name}: type {typ} is not {size} bytes"
        value = struct.unpack_from(item, raw, offset)
        assert (value[0] if len(value) == 1 else value) == expected[name], f"header field {name} is not at {offset}"
    assert seen == set(expected), f"fields missing from the header table: {set(expected) - seen}"


def test_message_type_codes() -> None:
    rows = table_rows(section("### Message types"), "Code")
    assert {int(r[0]): r[1] for r in rows} == P.TYPE_NAMES
    for code, name in P.TYPE_NAMES.items():
        assert getattr(P, name) == code


def test_dtype_codes() -> None:
    line = re.search(r"Dtype codes: (.*?)\n\(all little-endian\)", DOC, flags=re.S)
    assert line is not None
    stated = {int(c): name for c, name in re.findall(r"(\d+) (\w+)", line.group(1))}
    assert stated == {code: dt.name for code, dt in P.DTYPE_CODES.items()}


# ---------------------------------------------------------------------------- reasons
def test_every_head_reason_is_documented_and_no_other() -> None:
    in_code = code_reasons(HEAD_SOURCES)
    assert {"bad_magic", "foreign_peer", "stale_seq", "replay_rejected", "episode_mismatch"} <= in_code, \
        "the reason grep broke"
    rows = table_rows(section("## Validation (head) and reason strings"), "Reason")
    in_doc = [unquote(r[0]) for r in rows]
    assert len(in_doc) == len(set(in_doc)), "a reason is listed twice"
    assert set(in_doc) - in_code == set(), "the doc lists reasons the head never produces"
    assert in_code - set(in_doc) == set(), "reasons the head produces are missing from the doc"


def test_episode_and_sequence_bounds_are_the_code_s() -> None:
    from ingest import consolidation, peers

    text = section("## EPISODE_SUMMARY")
    assert (f"most {peers.PENDING_SUMMARIES_PER_STREAM} per stream and {peers.PENDING_SUMMARIES_TOTAL} per "
            "registration wait") in " ".join(text.split())
    assert f"keeps the {peers.ENDS_KEPT_PER_STREAM} newest episode ends" in " ".join(text.split())
    assert f"and below {peers.MAX_TRACKED_STREAMS} (`stream_range`" in " ".join(text.split())
    tolerance = re.search(r"relative ([0-9.e-]+) of the sum of their absolute values, plus ([0-9.e-]+)\)",
                          " ".join(text.split()))
    assert tolerance is not None
    assert (float(tolerance.group(1)), float(tolerance.group(2))) == (peers.RETURN_RTOL, peers.RETURN_ATOL)
    rows = {unquote(r[0]): r[1] for r in table_rows(section("## Validation (head) and reason strings"), "Reason")}
    assert f"{peers.PENDING_SUMMARIES_PER_STREAM} per stream, {peers.PENDING_SUMMARIES_TOTAL} per registration" \
        in rows["summary_backlog"]
    stated = re.search(r"more than 2\^(\d+) past", rows["seq_jump"])
    assert stated is not None and 2 ** int(stated.group(1)) == consolidation.MAX_SEQ_JUMP
    assert f"more than 2^{stated.group(1)} past the newest one read" in " ".join(section("## Sequence numbers").split())


def test_collector_side_weight_reasons_are_documented() -> None:
    in_code = code_reasons([ROOT / "shared" / "weights.py"])
    assert {"weights_mismatch", "bad_manifest"} <= in_code, "the reason grep broke"
    text = section("## WEIGHTS and the Q-network")
    listed = set(re.findall(r"`([a-z_]+)`", text.split("collector-side reasons", 1)[1].split(")", 1)[0]))
    assert in_code - listed == set()


# ---------------------------------------------------------------------------- config, spec, network
def test_config_keys_named_in_the_doc_exist() -> None:
    sections = {f.name: {sf.name for sf in fields(getattr(Config(), f.name))} for f in fields(Config)}
    named = set(re.findall(r"(?<![\w./])(env|collectors|replay|learner|transport|logging)\.([a-z_]+)", DOC))
    assert len(named) > 20, "the config-key grep broke"
    unknown = sorted(f"{s}.{k}" for s, k in named if k not in sections[s])
    assert unknown == [], f"docs/PROTOCOL.md names config keys that do not exist: {unknown}"
    table = {unquote(key) for r in table_rows(section("## Observations, `stack` and the configuration"), "Key")
             for key in r[0].split(",")}
    needed = {"collectors.chunk_steps", "replay.n_step", "replay.gamma", "env.reward_scale", "collectors.heartbeat_s",
              "collectors.send_hwm", "transport.max_chunks_in_flight", "transport.head_timeout_s",
              "collectors.eps_decay_updates", "learner.hidden", "learner.dueling", "env.frame_stack", "env.frame_size"}
    assert needed - table == set(), "config keys a collector needs are missing from the doc's table"


def test_the_welcome_carries_exactly_the_config_keys_of_the_doc_s_table() -> None:
    from ingest.registration import WELCOME_CONFIG

    table = {unquote(key) for r in table_rows(section("## Observations, `stack` and the configuration"), "Key")
             for key in r[0].split(",")}
    sent = {f"{section}.{name}" for section, names in WELCOME_CONFIG.items()
            for name in (names if names is not None else [f.name for f in fields(getattr(Config(), section))])}
    assert table == sent, f"documented, not sent: {sorted(table - sent)}; sent, not documented: {sorted(sent - table)}"
    assert WELCOME_CONFIG["env"] is None and "logging" not in WELCOME_CONFIG


def test_observation_spec_rules() -> None:
    from envs.factory import env_spec

    assert "CartPole-v1 `(4,)` float32" in DOC
    spec = env_spec(EnvConfig(env_id="CartPole-v1", frame_stack=4))
    assert (spec.obs_shape, spec.obs_dtype, spec.stack) == ((4,), np.dtype(np.float32), 1), \
        "vectors: stack 1 whatever frame_stack"
    assert "`ApeXCounting-v0` `(84, 84)` uint8" in DOC
    spec = env_spec(EnvConfig(env_id="ApeXCounting-v0", frame_stack=3))
    assert (spec.obs_shape, spec.obs_dtype, spec.stack) == ((84, 84), np.dtype(np.uint8), 3), \
        "2-D frames: stack = frame_stack"
    assert "`(env.frame_size, env.frame_size)` uint8 grayscale" in DOC
    stated = dict(re.findall(r"`(right_only|simple|complex)` (\d+)", DOC))
    for action_set, n in stated.items():
        spec = env_spec(EnvConfig(env_id="SuperMarioBros-1-1-v0", frame_size=48, frame_stack=2, action_set=action_set))
        assert (spec.obs_shape, spec.obs_dtype, spec.num_actions, spec.stack) == ((48, 48), np.dtype(np.uint8), int(n), 2)
    assert set(stated) == {"right_only", "simple", "complex"}


def _shape_of(expr: str, symbols: dict[str, int]) -> tuple[int, ...]:
    dims = []
    for dim in expr.strip().strip("[]").split(","):
        dims.append(math.prod(int(t) if t.strip().isdigit() else symbols[t.strip()] for t in dim.split("*")))
    return tuple(dims)


def _nature_side(side: int) -> int:
    """The doc's formula for the Nature CNN's output side."""
    return ((side - 8) // 4 + 1 - 4) // 2 + 1 - 2


@pytest.mark.parametrize("obs_shape,stack", [((84, 84), 4), ((36, 40), 2), ((4,), 1), ((3, 5, 2), 1)])
@pytest.mark.parametrize("dueling", [True, False])
def test_network_state_dict_table(obs_shape: tuple[int, ...], stack: int, dueling: bool) -> None:
    hidden, actions = 24, 3
    net = build_q_network(obs_shape, stack, actions, hidden, dueling)
    frames = len(obs_shape) == 2
    features = 64 * _nature_side(obs_shape[0]) * _nature_side(obs_shape[1]) if frames else hidden
    if obs_shape == (84, 84):
        assert features == 3136 and "3136 for 84 x 84" in DOC
    symbols = {"S": stack, "D": math.prod(obs_shape), "H": hidden, "A": actions, "F": features}
    rows = table_rows(section("## WEIGHTS and the Q-network"), "Name")
    wanted = {"always", "frames" if frames else "vectors"} | ({"dueling"} if dueling else set())
    assert {r[2] for r in rows} == {"always", "frames", "vectors", "dueling"}
    documented = {unquote(r[0]): _shape_of(r[1], symbols) for r in rows if r[2] in wanted}
    actual = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert documented == actual
    assert all(t.dtype == torch.float32 for t in net.state_dict().values())
    assert net(torch.zeros(2, stack, *obs_shape)).shape == (2, actions)


def _impala_side(side: int) -> int:
    """The doc's formula for the IMPALA CNN's output side: three halvings, each rounded up."""
    return math.ceil(math.ceil(math.ceil(side / 2) / 2) / 2)


@pytest.mark.parametrize("obs_shape,stack,width", [((84, 84), 4, 1), ((84, 84), 4, 2), ((17, 30), 2, 3)])
@pytest.mark.parametrize("dueling", [True, False])
def test_impala_state_dict_table(obs_shape: tuple[int, int], stack: int, width: int, dueling: bool) -> None:
    """The IMPALA table replaces the `frames` rows; with the head's rows it names the built network exactly."""
    hidden, actions = 24, 3
    net = build_q_network(obs_shape, stack, actions, hidden, dueling, "impala", width)
    features = 32 * width * _impala_side(obs_shape[0]) * _impala_side(obs_shape[1])
    if (obs_shape, width) == ((84, 84), 1):
        assert features == 3872 and "3872 for 84 x 84 at W = 1" in DOC
    symbols = {"S": stack, "H": hidden, "A": actions, "F": features, "W": width}
    text = section("## WEIGHTS and the Q-network")
    head_rows = table_rows(text, "Name")
    wanted = {"always"} | ({"dueling"} if dueling else set())
    documented = {unquote(r[0]): _shape_of(r[1], symbols) for r in head_rows if r[2] in wanted}
    for name, shape in table_rows(text, "IMPALA name"):
        name = unquote(name)
        if "{i}" not in name:
            documented[name] = _shape_of(shape, symbols)
            continue
        for i, channels in enumerate((16 * width, 32 * width, 32 * width)):
            for j in (0, 1):
                for k in (0, 1):
                    documented[name.format(i=i, j=j, k=k)] = _shape_of(shape, symbols | {"C": channels})
    actual = {name: tuple(t.shape) for name, t in net.state_dict().items()}
    assert documented == actual
    assert net(torch.zeros(2, stack, *obs_shape, dtype=torch.uint8)).shape == (2, actions)


def test_weights_dtype_list_and_loading_snippet() -> None:
    text = section("## WEIGHTS and the Q-network")
    listed = re.search(r"dtypes `([a-z0-9 ]+)`", text)
    assert listed is not None and set(listed.group(1).split()) == set(DTYPES)
    snippets = re.findall(r"```python\n(.*?)\n\s*```", DOC, flags=re.S)
    assert len(snippets) == 1, "expected one python snippet (loading WEIGHTS)"
    source = build_q_network((4,), 1, 2, 16, True)
    with torch.no_grad():
        for p in source.parameters():
            p.normal_()
    parts = [bytes(memoryview(p)) for p in encode_weights(12, cpu_state(source.state_dict()))]
    header = P.decode_header(parts[0])
    assert header.msg_type == P.WEIGHTS and header.count == len(parts) - 2 and header.weight_version == 12
    net = build_q_network((4,), 1, 2, 16, True)
    exec(compile("\n".join(line.strip() for line in snippets[0].splitlines()), "PROTOCOL.md", "exec"),
         {"json": json, "torch": torch, "parts": parts, "net": net})
    x = torch.randn(5, 1, 4)
    assert torch.equal(net(x), source(x))


def test_the_numpy_weights_snippet_reads_every_dtype_as_torch_does() -> None:
    """The doc's torch-free loader, run on a WEIGHTS message holding one tensor of each dtype the manifest may name
    (bfloat16 included), gives the values torch holds."""
    snippets = re.findall(r"```python numpy-weights\n(.*?)\n\s*```", DOC, flags=re.S)
    assert len(snippets) == 1, "expected one python numpy-weights snippet"
    values = torch.tensor([[-1.5, 0.0], [3.25, 1e3]])
    state = {name: (values > 0 if name == "bool" else values.to(dtype)) for name, dtype in DTYPES.items()}
    parts = [bytes(memoryview(p)) for p in encode_weights(3, cpu_state(state))]
    scope = {"json": json, "np": np, "parts": parts}
    exec(compile("\n".join(line[3:] if line.startswith("   ") else line for line in snippets[0].splitlines()),
                 "PROTOCOL.md", "exec"), scope)
    arrays = scope["arrays"]
    assert set(arrays) == set(DTYPES)
    for name, tensor in state.items():
        expected = tensor.float().numpy() if name == "bfloat16" else tensor.numpy()
        np.testing.assert_array_equal(arrays[name], expected, err_msg=name)
        assert arrays[name].shape == (2, 2)


# ---------------------------------------------------------------------------- worked example
def _replay_through_recorder(ex: dict[str, Any], stack: int, end: str) -> list[tuple[str, Any]]:
    """Drive the reference StreamRecorder the way actors/collector.py does; returns the messages in send order."""
    s = ex["setup"]
    dtype = np.dtype(s["obs_dtype"])
    q = np.asarray(s["q_values"], dtype=np.float32)
    rec = StreamRecorder(s["stream"], stack, s["n_step"], s["gamma"], s["chunk_steps"], s["num_actions"])
    out: list[tuple[str, Any]] = []
    for episode in ex["episodes"]:
        rec.begin_episode(np.asarray(episode["reset"], dtype=dtype))
        length, ret = 0, 0.0
        for step in episode["steps"]:
            rec.set_q(q)
            if rec.ready():
                chunk = rec.build_chunk()
                assert chunk is not None
                out.append(("TRANSITION_CHUNK", chunk))
            kind = end if step.get("end") else None
            index = rec.record_step(step["action"], step["reward"] * s["reward_scale"],
                                    np.asarray(step["obs"], dtype=dtype), kind == "terminated", kind == "truncated")
            length, ret = length + 1, ret + step["reward"]
            if kind == "truncated":
                rec.set_q(q, index)
            if kind:
                out.append(("EPISODE_SUMMARY", P.EpisodeSummary(s["stream"], length, ret)))
    rec.set_q(q)
    if rec.ready():
        chunk = rec.build_chunk()
        assert chunk is not None
        out.append(("TRANSITION_CHUNK", chunk))
    return out


def _wire(parts: list[Any]) -> list[bytes]:
    return [p.tobytes() if isinstance(p, np.ndarray) else bytes(p) for p in parts]


def _spec(ex: dict[str, Any]) -> P.ObsSpec:
    s = ex["setup"]
    return P.ObsSpec(tuple(s["obs_shape"]), np.dtype(s["obs_dtype"]), s["num_actions"])


def _check_chunk(ex: dict[str, Any], doc: dict[str, Any], chunk: TransitionChunk, seq: int, stack: int) -> None:
    """`chunk` (the recorder's) equals the doc's arrays; on the wire and through nstep_targets too."""
    s = ex["setup"]
    dtype = np.dtype(s["obs_dtype"])
    expected = {"frames": np.asarray(doc["frames"], dtype=dtype), "actions": np.asarray(doc["actions"], np.int32),
                "rewards": np.asarray(doc["rewards"], np.float32), "flags": np.asarray(doc["flags"], np.uint8),
                "priorities": np.asarray(doc["priorities"], np.float32)}
    for name, want in expected.items():
        np.testing.assert_array_equal(getattr(chunk, name), want, err_msg=f"{doc.get('name', 'chunk')}: {name}")
    assert chunk.first_start == doc["first_start"] and chunk.stream == s["stream"]

    # what a collector writing from the doc sends, byte for byte, and what the head decodes
    doc_chunk = TransitionChunk(s["stream"], doc["first_start"], *expected.values())
    parts = _wire(P.encode_chunk(doc_chunk, s["collector_id"], seq, s["weight_version"]))
    assert parts == _wire(P.encode_chunk(chunk, s["collector_id"], seq, s["weight_version"]))
    msg = P.decode(parts, _spec(ex))
    h = msg.header
    assert (h.msg_type, h.collector, h.seq, h.count, h.dtype_code, h.shape, h.weight_version, h.stream,
            h.first_start) == (P.TRANSITION_CHUNK, s["collector_id"], seq, len(doc["frames"]), s["dtype_code"],
                               tuple(s["obs_shape"]), s["weight_version"], s["stream"], doc["first_start"])
    assert P.CODE_OF_DTYPE[dtype] == s["dtype_code"]
    got = msg.payload
    for name, want in expected.items():
        np.testing.assert_array_equal(getattr(got, name), want)

    t = nstep_targets(got.actions, got.rewards, got.flags, got.first_start, s["n_step"], s["gamma"])
    trs = doc["transitions"]
    assert t.starts.tolist() == [tr["start"] for tr in trs]
    assert got.actions[t.starts].tolist() == [tr["action"] for tr in trs]
    assert t.steps.tolist() == [tr["steps"] for tr in trs]
    assert t.bootstrap.tolist() == [tr["bootstrap"] for tr in trs]
    np.testing.assert_array_equal(t.returns, np.asarray([tr["return"] for tr in trs], np.float32))
    np.testing.assert_array_equal(t.discounts, np.asarray([tr["discount"] for tr in trs], np.float32))

    # the doc's priority formula: |R + discount * max_a Q - Q(s, a)| at transition starts
    q = np.asarray(s["q_values"], np.float64)
    for tr in trs:
        assert doc["priorities"][tr["start"]] == abs(tr["return"] + tr["discount"] * q.max() - q[tr["action"]])

    floors = stack_floors(got.flags)
    for tr in trs:
        if "stacks" in tr:
            for key, pos in (("state", tr["start"]), ("bootstrap", tr["bootstrap"])):
                idx = stack_indices(np.asarray([pos]), floors[[pos]], stack)[0]
                assert idx.tolist() == tr["stacks"][key], f"{key} stack of transition {tr['start']}"


def test_worked_example_setup() -> None:
    s = example()["setup"]
    assert len(s["obs_shape"]) != 2 and s["stack"] == 1, "a vector observation has stack 1"
    assert P.CODE_OF_DTYPE[np.dtype(s["obs_dtype"])] == s["dtype_code"]
    first = example()["messages"][0]
    assert len(first["actions"]) - 1 == s["chunk_steps"] + s["n_step"] - 1, "the first chunk is cut at this size"


def test_worked_example_messages() -> None:
    ex = example()
    s = ex["setup"]
    sent = _replay_through_recorder(ex, s["stack"], "terminated")
    docs = ex["messages"]
    assert [kind for kind, _ in sent] == [m["type"] for m in docs]
    assert [m["seq"] for m in docs] == list(range(1, len(docs) + 1)), "one per-socket counter starting at 1"
    chunks = 0
    for (kind, payload), doc in zip(sent, docs, strict=True):
        if kind == "TRANSITION_CHUNK":
            _check_chunk(ex, doc, payload, doc["seq"], s["stack"])
            chunks += 1
            continue
        assert (payload.stream, payload.length, payload.episode_return) == (doc["stream"], doc["length"], doc["return"])
        msg = P.decode(_wire(P.encode_episode(payload, s["collector_id"], doc["seq"], s["weight_version"])))
        assert msg.header.msg_type == P.EPISODE_SUMMARY and msg.header.seq == doc["seq"]
        assert (msg.payload.stream, msg.payload.length, msg.payload.episode_return) == (
            doc["stream"], doc["length"], doc["return"])
        # unscaled in the summary, scaled in the chunks
        episode = ex["episodes"][0]
        assert doc["return"] == sum(step["reward"] for step in episode["steps"])
    assert chunks == 2
    scaled = docs[0]["rewards"][:3] + docs[2]["rewards"][1:2]
    assert scaled == [step["reward"] * s["reward_scale"] for step in ex["episodes"][0]["steps"]]


@pytest.mark.parametrize("name", ["truncated", "stack 3"])
def test_worked_example_variants(name: str) -> None:
    ex = example()
    variant = next(v for v in ex["variants"] if v["name"] == name)
    sent = _replay_through_recorder(ex, variant["stack"], variant["end"])
    kind, chunk = sent[variant["message"]]
    assert kind == "TRANSITION_CHUNK"
    _check_chunk(ex, variant, chunk, ex["messages"][variant["message"]]["seq"], variant["stack"])
