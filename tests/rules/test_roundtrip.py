"""A rule set survives load -> dump -> load unchanged."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given

from ratewarden.rules import RuleFile, dump, load, loads
from tests.rules.strategies import rule_files


@given(rule_files())
def test_load_dump_load_is_unchanged(rule_file: RuleFile) -> None:
    first = loads(dump(rule_file))
    assert first.file == rule_file
    second = loads(dump(first.file))
    assert second.file == first.file
    assert [r.limits for r in second.rules] == [r.limits for r in first.rules]
    assert [r.rank for r in second.rules] == [r.rank for r in first.rules]


def test_the_example_file_round_trips() -> None:
    path = Path(__file__).parent.parent.parent / "examples" / "rules.yaml"
    ruleset = load(path)
    assert ruleset.warnings == ()
    assert loads(dump(ruleset.file)).file == ruleset.file
