"""The protocol's variants are strategy objects chosen once: no module outside the strategy modules compares the
name of an outer rule, a help gate or a codec (it calls methods on the object ``outer_rule(hp)``,
``help_gate(hp)`` or the run's codec instead)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from repo import ROOT

PACKAGES = ("dso", "storage", "scoring", "neurons", "sim")
# where the names are read: the config that validates them and the modules that map them to classes
STRATEGY_MODULES = {"dso/config/schema.py", "dso/training/outer_rules.py", "scoring/help_gate.py",
                    "dso/codec/codecs.py", "dso/codec/demo.py", "dso/codec/sketch.py"}
SETTINGS = ("outer.rule", "help_rule", "hp.codec", "hparams.codec")  # the settings that name a variant
NAMES = {"signed", "nesterov", "best_of_two", "mean_of_record", "mean_of_two", "demo", "sketch"}  # no other setting
# has these values ("sgd" is also an inner optimiser's name: it counts only beside a setting above)


def name_comparisons(path: Path) -> list[str]:
    """``line: source`` of every comparison (==, !=, in, not in, match) of a variant's setting or name."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Match):
            parts = [node.subject, *(case.pattern for case in node.cases)]
        else:
            continue
        text = ast.get_source_segment(source, node.subject if isinstance(node, ast.Match) else node) or ""
        constants = {c.value for part in parts for c in ast.walk(part)
                     if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        if constants & NAMES or any(setting in text for setting in SETTINGS):
            found.append(f"{node.lineno}: {text}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_compares_a_variant_name_outside_the_strategy_modules(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel not in STRATEGY_MODULES and (hits := name_comparisons(path)):
            wrong[rel] = hits
    assert wrong == {}


def test_the_checker_finds_each_kind_of_comparison(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "a = hp.outer.rule == 'sgd'\n"            # a setting, whatever the value
        "b = rule != 'signed'\n"                   # a variant's name, whatever the variable
        "c = hp.help_rule in ('x', 'y')\n"
        "d = cfg.hparams.codec == name\n"
        "match kind:\n    case 'sketch':\n        pass\n"
        "e = cfg.optimizer == 'sgd'\n"             # the inner optimiser: not a variant of these
        "f = outer_rule(hp).signs\n")              # asking the object: fine
    found = name_comparisons(probe)
    assert [line.split(":")[0] for line in found] == ["1", "2", "3", "4", "5"]
