"""The repository's docs stand alone: no file cites a document a clone does not have, and every `docs/<page>.md#anchor`
the code cites names a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("model", "plugins", "export", "runtime", "app", "tests", "bench", "docs", "engines")
# the citations a clone cannot follow: the design notes, the reference folder, the sibling folder of the checkout
# (each name is joined here from two halves so that this file does not match its own pattern)
_DESIGN, _REF, _SIBLING = "DES" + "IGN", "refer" + "ence", "../" + "sha" + "red"
OUTSIDE = re.compile(rf"{_DESIGN}\.md|{_DESIGN} §|\b{_REF}/\w+\.md|{re.escape(_SIBLING)}")
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


def test_readme_runtime_snippets_run_as_written(tmp_path, monkeypatch, capsys):
    """The README's real-model section runs as written: its python blocks in order, in one namespace."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## The runtime in a real model", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the snippet is the test's subject
    assert capsys.readouterr().out.startswith("4 4\n")
    assert namespace["y"].shape == (2, namespace["stack"].cfg.hidden_size)
