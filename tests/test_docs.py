"""The documents keep to the tests and to the repository.

docs/semantics.md names, for each rule, the tests that prove it, as
``tests/PATH::NAME``; other documents name test files. These tests keep
every such name true, keep every link between documents on a heading that
exists, and keep every document free of references to the product
contract that lives outside the repository (a user does not have it).

The tests are found by parsing the test files with ``ast``, not by
collecting them, so this runs in well under a second: a test is a function
``test_*`` at the top of a ``tests/**/test_*.py`` file, a class ``Test*``
and its methods ``test_*``, or a top-level name ``test_*`` bound by an
assignment (a Hypothesis state machine's ``TestCase``).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEMANTICS = ROOT / "docs" / "semantics.md"

#: a cited test: ``tests/core/test_session_rules.py::test_name`` (a class's test has two parts)
CITED_TEST = re.compile(r"tests/[\w/]+\.py(?:::\w+)+")
#: a cited test file, with or without a test after it
CITED_FILE = re.compile(r"tests/[\w/]+\.py")
#: a Markdown link's target: ``](path)``, ``](path#anchor)`` or ``](#anchor)``
LINK = re.compile(r"\]\(([^)\s]*)\)")
#: the contract outside the repository, by any of the names the documents gave it
OUTSIDE = re.compile(r"\bSPEC\b")
#: a rule of docs/semantics.md: ``### S3. Reading after N``
RULE = re.compile(r"^### ([A-Z]\d+)\. ", re.MULTILINE)

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)

#: directories that hold no document of the project's own
SKIPPED = {"__pycache__", "build", "dist", "node_modules"}


def documents() -> list[Path]:
    """Every Markdown file of the repository, outside hidden and generated directories."""
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d not in SKIPPED and not d.endswith(".egg-info")
        ]
        found += [Path(top) / name for name in files if name.endswith(".md")]
    return sorted(found)


def where(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@cache
def collected_ids() -> frozenset[str]:
    """Every test id pytest would collect, without parameters: ``tests/PATH::NAME``."""
    ids = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        module = where(path)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, FUNCTIONS):
                if node.name.startswith("test_"):
                    ids.add(f"{module}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                ids.add(f"{module}::{node.name}")
                for item in node.body:
                    if isinstance(item, FUNCTIONS) and item.name.startswith("test_"):
                        ids.add(f"{module}::{node.name}::{item.name}")
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id.startswith("test_"):
                        ids.add(f"{module}::{target.id}")
    return frozenset(ids)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation gone, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a document's headings (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> Iterator[tuple[Path, str]]:
    """Each link from ``path`` to a document of the repository: the document and its anchor."""
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith("mailto:"):
            continue
        file, _, anchor = target.partition("#")
        yield (path.parent / file).resolve() if file else path, anchor


def test_every_test_a_document_cites_exists() -> None:
    known = collected_ids()
    missing = [
        f"{where(doc)}: {cited}"
        for doc in documents()
        for cited in sorted(set(CITED_TEST.findall(doc.read_text())))
        if cited not in known
    ]
    assert not missing, "cited tests that do not exist:\n" + "\n".join(missing)


def test_every_test_file_a_document_names_exists() -> None:
    missing = [
        f"{where(doc)}: {cited}"
        for doc in documents()
        for cited in sorted(set(CITED_FILE.findall(doc.read_text())))
        if not (ROOT / cited).is_file()
    ]
    assert not missing, "named test files that do not exist:\n" + "\n".join(missing)


def test_every_link_between_documents_lands_on_a_heading() -> None:
    broken = []
    for doc in documents():
        for target, anchor in links(doc):
            if not target.exists():
                broken.append(f"{where(doc)}: {os.path.relpath(target, ROOT)} does not exist")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                broken.append(f"{where(doc)}: no heading #{anchor} in {where(target)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_document_refers_to_the_contract_outside_the_repository() -> None:
    referring = [
        f"{where(doc)}:{number}: {line.strip()}"
        for doc in documents()
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not referring, "link to docs/semantics.md instead:\n" + "\n".join(referring)


def test_every_rule_names_a_test() -> None:
    text = SEMANTICS.read_text()
    starts = [(m.group(1), m.start()) for m in RULE.finditer(text)]
    assert len(starts) > 30, "docs/semantics.md has lost its rules"
    ends = [start for _, start in starts[1:]] + [text.index("\n## ", starts[-1][1])]
    untested = [
        rule
        for (rule, start), end in zip(starts, ends, strict=True)
        if not CITED_TEST.search(text, start, end)
    ]
    assert not untested, f"rules that name no test: {untested}"


def test_the_parser_finds_what_pytest_collects() -> None:
    """The parser's view of a few kinds of test, so that a citation check means something."""
    known = collected_ids()
    assert "tests/test_docs.py::test_every_test_a_document_cites_exists" in known
    # a Hypothesis state machine's TestCase, bound by assignment
    stateful = "tests/core/test_session_stateful.py::"
    assert stateful + "test_a_session_keeps_every_rule_under_random_operations" in known
    # a parametrized test is cited by its name alone
    assert "tests/daemon/test_engine.py::test_a_refused_wait_acks_nothing_on_any_session" in known
    assert not any("conftest" in test or "helpers" in test for test in known)
