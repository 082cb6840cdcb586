"""The package boundary of the design: collectors never import the head's code, and the head never
imports the collectors' (so a collector machine needs only actors/ + shared/, and each side can
change alone). Checked on the source's import statements, lazy imports inside functions included."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"actors": {"learner", "replay"}, "learner": {"actors"}, "replay": {"actors"}, "shared": {"actors", "learner", "replay"}}

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
