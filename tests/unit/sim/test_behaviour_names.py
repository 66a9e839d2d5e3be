"""Behaviours are classes: no module outside sim/behaviours/ compares a behaviour's name (``behaviour.name ==
"gamer"``, ``role == "sybil"``); what a behaviour does differently is a method or attribute of its class
(``plan(window, foresight)``, ``follows``, ``shares_update``, ``forges``, ``simulated_rejection``...)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from repo import ROOT
from sim import behaviours

PACKAGES = ("dso", "storage", "scoring", "neurons", "sim", "scripts")
REGISTRY_PACKAGE = "sim/behaviours"  # where the names are defined and mapped to classes
# a report groups its rows under each behaviour's label: what it prints, not what a behaviour does
REPORTS = {"sim/report.py"}
NAMES = set(behaviours.BEHAVIOURS) | set(behaviours.VALIDATOR_BEHAVIOURS)
SUBJECTS = ("behaviour", "role")  # what a comparison of a name is about


def behaviour_comparisons(path: Path) -> list[str]:
    """``line: source`` of every comparison (==, !=, in, not in, match) of a behaviour's name: a ``.name`` of
    something called a behaviour, or a behaviour's name beside a behaviour or role."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            parts, segment = [node.left, *node.comparators], node
        elif isinstance(node, ast.Match):
            parts, segment = [node.subject, *(case.pattern for case in node.cases)], node.subject
        else:
            continue
        text = ast.get_source_segment(source, segment) or ""
        names_of_behaviours = any(isinstance(a, ast.Attribute) and a.attr == "name"
                                  and any(s in ast.unparse(a.value) for s in SUBJECTS)
                                  for part in parts for a in ast.walk(part))
        constants = {c.value for part in parts for c in ast.walk(part)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if names_of_behaviours or (constants & NAMES and any(s in text for s in SUBJECTS)):
            found.append(f"{node.lineno}: {text}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_compares_a_behaviour_name(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if not rel.startswith(REGISTRY_PACKAGE) and rel not in REPORTS and (hits := behaviour_comparisons(path)):
            wrong[rel] = hits
    assert wrong == {}


def test_the_checker_finds_each_kind_of_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "a = peer.behaviour.name == 'gamer'\n"          # a behaviour's name, whatever the value
        "b = self.behaviour != 'sybil'\n"                # a behaviour's name held as a string
        "c = role in ('honest', 'diligent')\n"
        "match node.behaviour:\n    case 'copier':\n        pass\n"
        "d = peer.behaviour.shares_update\n"           # asking the object: fine
        "e = n.name == 'validator0'\n"                  # another name
        "f = kind == 'noise'\n")                         # a behaviour's name, but about something else
    found = behaviour_comparisons(probe)
    assert [line.split(":")[0] for line in found] == ["1", "2", "3", "4"]
