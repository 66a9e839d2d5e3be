"""The package layering of docs/architecture.md, checked on the source: who may import whom.

The one-way rule: experiments (``sim``) may import the core; the core (dso, storage, scoring, neurons) never
imports them.  Inside the core, each package may import only the packages below it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from repo import ROOT

PROJECT = {"dso", "storage", "scoring", "neurons", "sim"}
ALLOWED = {
    "dso": {"dso"},
    "storage": {"storage", "dso"},
    "scoring": {"scoring", "dso"},
    "neurons": {"neurons", "dso", "storage", "scoring"},
    "sim": {"sim", "neurons", "dso", "storage", "scoring"},
}


def project_imports(path: Path) -> set[str]:
    """Top-level project packages a module imports (at any depth: lazy imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name.split(".")[0] for name in names} & PROJECT
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_the_layering_allows(package):
    assert modules(package), f"no modules found in {package}/"
    wrong = {str(p.relative_to(ROOT)): sorted(project_imports(p) - ALLOWED[package]) for p in modules(package)}
    assert not {k: v for k, v in wrong.items() if v}


def test_the_core_never_imports_the_experiments():
    core = [p for package in ("dso", "storage", "scoring", "neurons") for p in modules(package)]
    assert [str(p.relative_to(ROOT)) for p in core if "sim" in project_imports(p)] == []


def test_the_checker_sees_lazy_and_dotted_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nimport sim.behaviours as b\n\ndef f():\n    from storage.keys import gradient\n")
    assert project_imports(probe) == {"sim", "storage"}
