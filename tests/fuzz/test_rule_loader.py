"""The rule loader under random input: random text, random YAML, the right field
names with values of any type, valid files broken by hand-like edits, bytes
that are not UTF-8. Each load either succeeds or raises a ConfigurationError
with a message; nothing else escapes. What loads also evaluates and checks
requests without an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from ratewarden import ConfigurationError, FakeClock, MemoryStore
from ratewarden.rules import EnvoyConfig, RuleEngine, RuleSet, load, loads
from tests.fuzz import strategies as fz

REQUESTS: list[dict[str, object]] = [
    {},
    {"method": "POST", "path": "/api/login", "ip": "203.0.113.7", "user": "u"},
    {"method": "get", "path": "/users/7/b", "ip": "10.0.0.1", "plan": "free", "org": "a",
     "headers": {"x-forwarded-for": "198.51.100.1, 10.0.0.2", "x-tenant": "t"},
     "api_key": "k", "tier": "b", "region": 3, "custom_attr": ["x"], "body_size": "12"},
]  # fmt: skip


def assert_message(exc: ConfigurationError, naming: str = "") -> None:
    """A message an operator can act on: not empty, naming the file if given."""
    assert str(exc).strip(), repr(exc)
    assert naming in str(exc), str(exc)


def loaded_or_refused(text: str) -> RuleSet | None:
    try:
        ruleset = loads(text, "fuzz.yaml")
    except ConfigurationError as exc:
        assert_message(exc, naming="fuzz.yaml")
        event("refused")
        return None
    event("loaded")
    return ruleset


def exercise(ruleset: RuleSet) -> None:
    """What a service does with rules it loaded: evaluate, explain, check."""
    engine = RuleEngine(ruleset, MemoryStore(clock=FakeClock(1_700_000_000)))
    for attributes in REQUESTS:
        ruleset.evaluate(attributes)
        ruleset.explain(attributes)
        engine.check(attributes)


@given(text=fz.rule_texts)
@example(text="")
@example(text="rules:\n" + "  " * 40 + "- x\n")
@example(text="[" * 100_000)
@example(text="rules: &a [*a]")
@example(text="rules:\n  - name: a\n    rate: 99999999999999999999999/second\n")
@example(text="rules:\n  - name: a\n    rate: 1/second\n    priority: 99999999999999999999999\n")
@example(text="rules:\n  - name: a\n    rate: 1/second\n    cost: 99999999999999999999999\n")
@example(
    text="rules:\n  - {name: a, rate: 1/second, algorithm: gcra, burst: 99999999999999999999}\n"
)
@example(text="rules:\n  - {name: a, rate: 1/second, match: {paths: '/a/{x}/{x}'}}\n")
@example(text="rules:\n  - {name: a, rate: 1/second, action: delay, max_wait: .nan}\n")
def test_rule_text(text: str) -> None:
    ruleset = loaded_or_refused(text)
    if ruleset is not None:
        exercise(ruleset)


@given(data=fz.rule_file_shapes())
def test_rule_shapes(data: dict[str, object]) -> None:
    """The right field names with values of any type: the schema and the checks
    behind it, where a wrong type is likeliest to slip through to a crash."""
    ruleset = loaded_or_refused(fz.to_yaml(data))
    if ruleset is not None:
        exercise(ruleset)


@given(text=st.one_of(fz.valid_rule_texts, fz.written_rule_texts).flatmap(fz.line_mutations))
def test_mutated_rule_files(text: str) -> None:
    ruleset = loaded_or_refused(text)
    if ruleset is not None:
        exercise(ruleset)


@given(data=fz.rule_bytes)
@example(data=b"\xff\xfe" + "rules: []".encode("utf-16-le"))
@example(data=b"rules:\n  - name: \xc3\n")
@example(data=b"\x00")
def test_rule_file_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path: Path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_bytes(data)
    try:
        ruleset = load(path)
    except ConfigurationError as exc:
        assert_message(exc, naming=str(path))
        event("refused")
        return
    event("loaded")
    exercise(ruleset)


@given(text=fz.envoy_texts)
@example(text="domain: edge\n")
@example(text="domain: edge\ndescriptors: [{key: a, value: 1.5, rate_limit: {unit: day}}]\n")
@example(text="domain: e\ndescriptors: [{key: a, rate_limit: {unit: hour, requests_per_unit: -1}}]")
@example(text="domain: e\ndescriptors: [{key: a, rate_limit: {unit: hour, "
         "requests_per_unit: 99999999999999999999999}}]")  # fmt: skip
def test_envoy_text(text: str) -> None:
    try:
        config = EnvoyConfig.loads(text, store=MemoryStore(clock=FakeClock(1_700_000_000)))
    except ConfigurationError as exc:
        assert_message(exc)
        event("refused")
        return
    event("loaded")
    for domain in config.domains:
        for entries in ([("remote_address", "1.2.3.4")], [("path", "/api/x"), ("user", "u")],
                        [("path", "/blocked")], [("k", "")]):  # fmt: skip
            try:
                config.check(domain, [entries])
            except ConfigurationError as exc:  # a request the config cannot check
                assert_message(exc)
