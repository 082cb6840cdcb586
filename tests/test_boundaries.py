"""The package boundary of the design: collectors never import the head's code, the learner never
imports the collectors', the launcher's or the wire's, the replay is pure storage (it knows only
shared/ and the env's description, and no socket or wire format), and ingest/ -- the head's side of
the collector protocol -- writes into the replay and knows nothing else of the head (so a collector
machine needs only actors/ + envs/ + shared/, and each room can change alone). envs/ (the env
factory, EnvSpec and its bounds, Mario, Atari, the counting test env) stands on shared/ alone and
needs no torch; the sides that build envs import any of it, those that only size something by the
env its description. The tools stand above the product: bench/ (`make bench`) may import any product package,
experiments/ (the research tools) any product package and bench/, and no product package nor bench/ imports
experiments/ or the tests (tests/, the chaos harness in tests/hostile/ included). Checked on the source's import
statements, lazy imports inside functions included; shared/ and envs/ together also have no import cycle at import
time."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAD_SIDE = {"learner", "replay", "ingest", "launcher", "bench", "evaluate"}
# The research tools (one-off measurements, each feeding one experiment record) and the tests stand above everything:
# neither the product nor bench/ imports them.
ABOVE = {"experiments", "tests"}
FORBIDDEN = {
    "actors": HEAD_SIDE | ABOVE,  # a collector machine needs only actors/ + envs/ + shared/
    "shared": HEAD_SIDE | {"actors"} | ABOVE,  # what both sides import imports neither
    # the envs stand on shared/ alone, and run where torch is not installed (make test-env: Python 3.13)
    "envs": HEAD_SIDE | {"actors", "torch"} | ABOVE,
    # training only: no process wiring, no tools, no sockets to collectors (it meets the data in the replay)
    "learner": {"actors", "ingest", "launcher", "bench", "evaluate"} | ABOVE,
    # pure storage: knows only shared/
    "replay": {"actors", "learner", "ingest", "launcher", "bench", "evaluate"} | ABOVE,
    # the head's side of the wire: registration, data sockets, validation, parking, CREDIT; it writes into
    # the replay (replay/) and speaks the protocol (shared/), and is wired up by the launcher, not the reverse
    "ingest": {"actors", "learner", "launcher", "bench", "evaluate"} | ABOVE,
    "evaluate": {"actors", "ingest", "launcher", "bench"} | ABOVE,  # reads checkpoints (learner/) and plays envs (shared/)
    # launcher/ wires everything; it imports actors/ only for the in-process mode (collectors as threads)
    "launcher": {"bench", "evaluate"} | ABOVE,
    # make bench measures the product: any product package, never a research tool nor the tests (nor their harness)
    "bench": ABOVE,
    # the research tools: any product package and bench/ (its measurements, e.g. bench.learner's), never the tests
    "experiments": {"tests"},
}
# The replay is storage: no sockets and no wire format (both belong to ingest/), so it can be tested,
# benched and reused without ZeroMQ and cannot grow a second data plane.
REPLAY_NEVER_IMPORTS = ("zmq", "shared.protocol")
# Who imports what of envs/. actors/, launcher/, evaluate/ and bench/ build envs: any of it. The others only size
# something by the env (a network, a replay, a checkpoint's geometry, the wire's ObsSpec), so they read its
# description (EnvSpec and its bounds: no emulator, no gymnasium); shared/ also runs the config rules that need to
# know the envs (envs/checks.py, from Config.check_valid), never the factory, an emulator or the test env.
ENV_DESCRIPTION = {"envs.spec", "envs.bounds"}
ENVS_ALLOWED = {
    "shared": ENV_DESCRIPTION | {"envs.checks"},
    "learner": ENV_DESCRIPTION,
    "replay": ENV_DESCRIPTION,
    "ingest": ENV_DESCRIPTION,
}

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
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}


def _imported_envs_modules(path: Path) -> set[str]:
    """The modules of envs/ an import statement names (`from envs import bounds` names envs.bounds)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.split(".")[0] == "envs")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "envs":
                names.update(f"envs.{alias.name}" for alias in node.names)
            elif node.module.startswith("envs."):
                names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(ENVS_ALLOWED))
def test_sides_that_only_size_by_the_env_import_its_description(package):
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported_envs_modules(path) - ENVS_ALLOWED[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_time_imports(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` importing `path` imports at once: its statements outside function bodies (imports
    inside a function run when it is called), each named module with the packages above it (`from a import b`
    names a.b where that is a module, else a)."""
    out: set[str] = set()

    def add(name: str) -> None:
        parts = name.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known)

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                add(node.module)
                for alias in node.names:
                    add(f"{node.module}.{alias.name}")
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(ast.parse(path.read_text(), filename=str(path)).body)
    return out - {_module_name(path)}


def test_shared_and_envs_have_no_import_cycle():
    """Walks the import-time graph of shared/ and envs/ (what both sides of the wire import): no module reaches
    itself, so each can be imported first, alone (the config rules that need the envs are called lazily)."""
    paths = {_module_name(p): p for package in ("shared", "envs") for p in sorted((ROOT / package).rglob("*.py"))}
    graph = {name: _import_time_imports(path, set(paths)) for name, path in paths.items()}
    assert "envs.spec" in graph["shared.network"] and "shared.config" in graph["envs.spec"]  # the walk sees both ways
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(name: str, trail: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, [*trail, nxt])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, " ; ".join(" -> ".join(c) for c in cycles)


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
