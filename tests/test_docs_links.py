"""Every relative link in the Markdown docs resolves, every in-page anchor names a heading, every repository file a
doc names in backticks exists, and every `python -m` tool of ours a doc runs is there.

A doc that links a moved raw file, a renamed section or a deleted module misleads the reader who follows it;
this keeps README.md, BENCHMARKS.md and docs/**/*.md pointing at what the checkout holds. Fast: text only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "BENCHMARKS.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# Top-level folders whose files a doc may name by path; runs/, keys/ and wheelhouse/ are written on each machine, and
# scripts/ is named only by the record, for tools since moved into bench/ and experiments/ (git keeps them).
TRACKED_TOPS = ("actors", "bench", "docs", "evaluate", "experiments", "ingest", "launcher", "learner", "replay", "results",
                "shared", "tests", ".ci")
_TOPS = "|".join(re.escape(t) for t in TRACKED_TOPS)
NAMED_PATH = re.compile(rf"^(?:{_TOPS})/[\w./-]*[\w/]$")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", doc.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _rel(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{_rel(doc)}: broken links {broken}"


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_file_a_doc_names_exists(doc: Path) -> None:
    missing = []
    for span in CODE_SPAN.findall(doc.read_text()):
        for word in span.split():
            word = word.strip("\"'(),;:")
            if NAMED_PATH.match(word) and not any(c in word for c in "<>*{}$") and not (ROOT / word).exists():
                missing.append(word)
    assert not missing, f"{_rel(doc)}: names files that do not exist {sorted(set(missing))}"


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    """The patterns above match what they are meant to: a broken link, a missing anchor, a named missing file."""
    doc = tmp_path / "page.md"
    doc.write_text("# A heading\n\n[ok](#a-heading) [gone](missing.md) [bad](#nowhere) `shared/no_such.py`\n")
    links = LINK.findall(doc.read_text())
    assert links == ["#a-heading", "missing.md", "#nowhere"]
    assert _anchors(doc) == {"a-heading"}
    assert _slug("Robust 1-1 with an epsilon-0.05 stage: three seeds") == "robust-1-1-with-an-epsilon-005-stage-three-seeds"
    named = [w for s in CODE_SPAN.findall(doc.read_text()) for w in s.split() if NAMED_PATH.match(w)]
    assert named == ["shared/no_such.py"] and not (ROOT / named[0]).exists()


PACKAGES = ("actors", "bench", "evaluate", "experiments", "ingest", "launcher", "learner", "replay", "shared", "tests")
_PACKAGES = "|".join(PACKAGES)
MODULE_RUN = re.compile(rf"python3? -m ((?:{_PACKAGES})(?:\.\w+)*)")


def _runnable(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_every_module_a_doc_runs_exists(doc: Path) -> None:
    """`python -m pkg.tool` in a doc names a module of this repository that can run (a moved tool fails here)."""
    missing = sorted({m for m in MODULE_RUN.findall(doc.read_text()) if not _runnable(m)})
    assert not missing, f"{_rel(doc)}: runs modules that do not exist {missing}"


def test_the_module_check_sees_a_moved_tool() -> None:
    assert MODULE_RUN.findall("`python -m replay.bench` then `python -m bench.replay_bench`") == ["replay.bench",
                                                                                                    "bench.replay_bench"]
    assert not _runnable("replay.bench") and _runnable("bench.replay_bench") and _runnable("launcher")
