"""The package boundary of the design: collectors never import the head's code, the learner never
imports the collectors' or the launcher's, and the replay knows only shared/ (so a collector machine
needs only actors/ + shared/, and each room can change alone). Checked on the source's import statements, lazy imports inside functions included."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAD_SIDE = {"learner", "replay", "launcher", "bench", "evaluate"}
FORBIDDEN = {
    "actors": HEAD_SIDE,  # a collector machine needs only actors/ + shared/
    "shared": HEAD_SIDE | {"actors"},  # what both sides import imports neither
    "learner": {"actors", "launcher", "bench", "evaluate"},  # training only: no process wiring, no tools
    "replay": {"actors", "learner", "launcher", "bench", "evaluate"},  # the data plane knows only shared/
    "evaluate": {"actors", "launcher", "bench"},  # reads checkpoints (learner/) and plays envs (shared/)
    # launcher/ wires everything; it imports actors/ only for the in-process mode (collectors as threads)
    "launcher": {"bench", "evaluate"},
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
        for path in sorted((ROOT / package).glob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}
