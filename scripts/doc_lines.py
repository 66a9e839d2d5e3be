#!/usr/bin/env python
"""Keep the reference docs a map: count their lines, find issue-number references and placeholders.

    python scripts/doc_lines.py [--root DIR] [--limit 2500]

Reference pages are README.md and docs/*.md (not docs/decisions/, where decisions and their measurements live).
Issue-number references ("issue 13", "(#21)") and placeholder words are looked for in every Markdown file under
docs/ and in README.md: the docs say what and why instead.  Exit status 1 when the reference pages hold more than
the limit or any such reference or placeholder is found, else 0.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

LIMIT = 2500
ISSUE_REFERENCE = re.compile(r"\b(?:issue|pull request|PR)s?\s+#?\d+|(?<![\w&/])#\d+(?![\w-])", re.IGNORECASE)
PLACEHOLDER = re.compile(r"\b(?:TODO|TBD|FIXME|XXX|OPEN|PLACEHOLDER|[A-Z]+_TABLE)\b")


def reference_pages(root: Path) -> list[Path]:
    """README.md and the top-level pages of docs/, in name order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def scanned_files(root: Path) -> list[Path]:
    """Every Markdown file that must hold no issue number or placeholder."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def line_counts(root: Path) -> dict[str, int]:
    return {str(page.relative_to(root)): len(page.read_text().splitlines()) for page in reference_pages(root)}


def findings(root: Path) -> list[str]:
    """One line `path:line: kind: text` per issue reference or placeholder."""
    found = []
    for path in scanned_files(root):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            for kind, pattern in (("issue reference", ISSUE_REFERENCE), ("placeholder", PLACEHOLDER)):
                for match in pattern.finditer(line):
                    found.append(f"{path.relative_to(root)}:{number}: {kind}: {match.group(0)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--limit", type=int, default=LIMIT)
    args = parser.parse_args(argv)
    counts = line_counts(args.root)
    for page, lines in sorted(counts.items(), key=lambda item: -item[1]):
        print(f"{lines:6d}  {page}")
    total = sum(counts.values())
    print(f"{total:6d}  reference lines in all (limit {args.limit})")
    problems = findings(args.root)
    for problem in problems:
        print(problem)
    if total > args.limit:
        print(f"over the limit by {total - args.limit} lines", file=sys.stderr)
    return 1 if total > args.limit or problems else 0


if __name__ == "__main__":
    sys.exit(main())
