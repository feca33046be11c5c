"""Properties over random rule files: load -> dump -> load is unchanged, and the
index finds exactly what a linear scan with the slow matcher finds."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from ratewarden.rules import RuleFile, RuleSet, dump, load, loads
from ratewarden.rules._compile import _mismatch
from ratewarden.rules._paths import normalize_path
from ratewarden.rules._rule import normal_method
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


REQUEST_PATHS = ["/api/login", "/api/v1/orders", "/api/v1/orders/7", "/users/5", "/users/",
                 "/a/x/b", "/a//b", "/f/xa", "/f/xc", "/other", "/api/v1/ordersX?q=1"]  # fmt: skip


@st.composite
def requests(draw: st.DrawFn) -> dict[str, object]:
    attributes: dict[str, object] = {
        "method": draw(st.sampled_from(["GET", "POST", "delete", "PUT"])),
        "path": draw(st.sampled_from(REQUEST_PATHS)),
    }
    for name in ("user", "api_key", "ip", "org", "custom_attr", "plan", "tier", "region"):
        if draw(st.booleans()):
            attributes[name] = draw(st.sampled_from(["", "a", "b", "free", "1.2.3.4"]))
    if draw(st.booleans()):
        attributes["headers"] = {"x-tenant": draw(st.sampled_from(["t1", ""]))}
    return attributes


def naive(ruleset: RuleSet, attributes: dict[str, object]) -> set[tuple[str, str, int]]:
    """Every rule in rank order, checked with the slow matcher; first of each group."""
    taken: set[str] = set()
    out = set()
    method = normal_method(attributes.get("method"))
    path = attributes.get("path")
    path = normalize_path(path) if isinstance(path, str) else path  # as a server routes it
    for rule in sorted(ruleset.rules, key=lambda r: r.rank):
        if rule.group_key in taken:
            continue
        if _mismatch(rule, attributes, method, path) is not None:
            continue
        key = rule.key(attributes)
        if key is None:
            continue
        taken.add(rule.group_key)
        out |= {(rule.name, key, slot) for slot in rule.slots}
    return out


@given(rule_files(), st.lists(requests(), min_size=1, max_size=8))
def test_the_index_agrees_with_a_linear_scan(
    rule_file: RuleFile, batch: list[dict[str, object]]
) -> None:
    ruleset = loads(dump(rule_file))
    for attributes in batch:
        fast = {(a.rule.name, a.key, a.slot) for a in ruleset.evaluate(attributes)}
        assert fast == naive(ruleset, attributes), attributes
