"""The package boundary of the design: collectors never import the head's code, the learner never
imports the collectors', the launcher's or the wire's, the replay is pure storage (it knows only
shared/, and no socket or wire format), and ingest/ -- the head's side of the collector protocol
-- writes into the replay and knows nothing else of the head (so a collector machine needs only
actors/ + shared/, and each room can change alone). Checked on the source's import statements,
lazy imports inside functions included."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAD_SIDE = {"learner", "replay", "ingest", "launcher", "bench", "evaluate"}
FORBIDDEN = {
    "actors": HEAD_SIDE,  # a collector machine needs only actors/ + shared/
    "shared": HEAD_SIDE | {"actors"},  # what both sides import imports neither
    # training only: no process wiring, no tools, no sockets to collectors (it meets the data in the replay)
    "learner": {"actors", "ingest", "launcher", "bench", "evaluate"},
    "replay": {"actors", "learner", "ingest", "launcher", "bench", "evaluate"},  # pure storage: knows only shared/
    # the head's side of the wire: registration, data sockets, validation, parking, CREDIT; it writes into
    # the replay (replay/) and speaks the protocol (shared/), and is wired up by the launcher, not the reverse
    "ingest": {"actors", "learner", "launcher", "bench", "evaluate"},
    "evaluate": {"actors", "ingest", "launcher", "bench"},  # reads checkpoints (learner/) and plays envs (shared/)
    # launcher/ wires everything; it imports actors/ only for the in-process mode (collectors as threads)
    "launcher": {"bench", "evaluate"},
}
# The replay is storage: no sockets and no wire format (both belong to ingest/), so it can be tested,
# benched and reused without ZeroMQ and cannot grow a second data plane.
REPLAY_NEVER_IMPORTS = ("zmq", "shared.protocol")

pytestmark = pytest.mark.envonly


def _imported_top_levels(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_on_their_side(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_top_levels(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).glob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}


def _imported_modules(path: Path) -> set[str]:
    """Every dotted module name an import statement names: `from a import b` counts as `a` and `a.b`."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_replay_imports_no_sockets_and_no_wire_format():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            banned for banned in REPLAY_NEVER_IMPORTS
            if any(name == banned or name.startswith(banned + ".") for name in _imported_modules(path))
        )
        for path in sorted((ROOT / "replay").glob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}
