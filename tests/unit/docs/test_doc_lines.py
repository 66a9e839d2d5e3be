"""The reference docs stay a map: scripts/doc_lines.py holds README.md and docs/*.md to 2,500 lines, with no issue
numbers or placeholders anywhere in the docs; decision records are not counted."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from repo import ROOT


def load_doc_lines() -> ModuleType:
    spec = importlib.util.spec_from_file_location("doc_lines", ROOT / "scripts" / "doc_lines.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_repository_docs_pass(capsys):
    doc_lines = load_doc_lines()
    status = doc_lines.main(["--root", str(ROOT)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert sum(doc_lines.line_counts(ROOT).values()) <= doc_lines.LIMIT


def write_docs(root: Path, readme: str, page: str, decision: str = "") -> None:
    (root / "docs" / "decisions").mkdir(parents=True)
    (root / "README.md").write_text(readme)
    (root / "docs" / "page.md").write_text(page)
    (root / "docs" / "decisions" / "0001-x.md").write_text(decision)


def test_it_counts_reference_pages_but_not_decisions(tmp_path):
    doc_lines = load_doc_lines()
    write_docs(tmp_path, "a\nb\n", "c\n", decision="d\n" * 5000)
    assert doc_lines.line_counts(tmp_path) == {"README.md": 2, "docs/page.md": 1}
    assert doc_lines.main(["--root", str(tmp_path)]) == 0
    assert doc_lines.main(["--root", str(tmp_path), "--limit", "2"]) == 1


def test_it_finds_issue_numbers_and_placeholders_everywhere(tmp_path):
    doc_lines = load_doc_lines()
    page = "The gate (#21) holds.\nSee [pay](scoring.md#2-pay), colour #1f77b4.\n"
    write_docs(tmp_path, "Fixed in issue 13.\n", page, decision="Figures: GAMER_TABLE and OPEN.\n")
    found = doc_lines.findings(tmp_path)
    assert found == ["README.md:1: issue reference: issue 13",
                     "docs/decisions/0001-x.md:1: placeholder: GAMER_TABLE",
                     "docs/decisions/0001-x.md:1: placeholder: OPEN",
                     "docs/page.md:1: issue reference: #21"]
    assert doc_lines.main(["--root", str(tmp_path)]) == 1
