"""The repository's docs stand alone: no file cites a document a clone does not have, and every `docs/<page>.md#anchor`
the code cites names a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("model", "plugins", "export", "runtime", "app", "tests", "bench", "docs", "engines")
OUTSIDE = re.compile(r"DESIGN\.md|DESIGN §|\breference/\w+\.md|\.\./shared")
CITED = re.compile(r"docs/(\w+)\.md((?:#[\w-]+|, #[\w-]+)+)")


def _files() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    for folder in FOLDERS:
        out += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".sh") and p.is_file()]
    return [p for p in out if p.resolve() != Path(__file__).resolve()]


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_no_citation_of_documents_outside_the_repository():
    bad = [f"{p.relative_to(ROOT)}:{n}" for p in _files() for n, line in enumerate(p.read_text().splitlines(), 1)
           if OUTSIDE.search(line)]
    assert not bad, f"citations of documents a clone does not have: {bad}"


def test_cited_doc_sections_exist():
    cited = 0
    for p in _files():
        for page, anchors in CITED.findall(p.read_text()):
            doc = ROOT / "docs" / f"{page}.md"
            assert doc.is_file(), f"{p.relative_to(ROOT)} cites docs/{page}.md, which does not exist"
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", doc.read_text(), re.M)}
            for a in re.findall(r"#([\w-]+)", anchors):
                cited += 1
                assert a in slugs, f"{p.relative_to(ROOT)} cites docs/{page}.md#{a}; headings: {sorted(slugs)}"
    assert cited >= 10  # the code does cite the math page
