"""envoyproxy/ratelimit configurations, checked against the cases its README
documents (examples 1-9 of its "Configuration" section)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.rules import AsyncEnvoyConfig, EnvoyConfig, RuleFileError

Descriptors = list[list[tuple[str, str]]]
A = "domain: d\ndescriptors:\n  - key: a\n"


def config(text: str, store: MemoryStore) -> EnvoyConfig:
    return EnvoyConfig.loads(textwrap.dedent(text), store=store)


def limit_of(cfg: EnvoyConfig, domain: str, *entries: tuple[str, str]) -> str | None:
    (limit,) = cfg.limits_for(domain, [list(entries)])
    if limit is None:
        return None
    if limit.unlimited:
        return "unlimited"
    if limit.blocked:
        return "blocked"
    assert limit.limiter is not None
    return f"{limit.limiter.rate}" + (" shadow" if limit.shadow else "")


def admitted(
    cfg: EnvoyConfig, domain: str, descriptors: list[list[tuple[str, str]]], n: int
) -> int:
    return sum(cfg.check(domain, descriptors).overall_ok for _ in range(n))


def test_example_1_exact_values(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: mongo_cps
        descriptors:
          - key: database
            value: users
            rate_limit: {unit: second, requests_per_unit: 500}
          - key: database
            value: default
            rate_limit: {unit: second, requests_per_unit: 500}
        """,
        store,
    )
    assert limit_of(cfg, "mongo_cps", ("database", "users")) == "500/second"
    assert limit_of(cfg, "mongo_cps", ("database", "other")) is None


MESSAGING = """
    domain: messaging
    descriptors:
      - key: message_type
        value: marketing
        descriptors:
          - key: to_number
            rate_limit: {unit: day, requests_per_unit: 5}
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 100}
"""


def test_example_2_nested_and_any_value(store: MemoryStore) -> None:
    cfg = config(MESSAGING, store)
    marketing = [("message_type", "marketing"), ("to_number", "2061111111")]
    assert limit_of(cfg, "messaging", *marketing) == "5/day"
    assert limit_of(cfg, "messaging", ("to_number", "2061111111")) == "100/day"
    # the placeholder level has no limit of its own
    assert limit_of(cfg, "messaging", ("message_type", "marketing")) is None
    # a key without value counts per value: two numbers, 5 each
    one = [marketing]
    other = [[("message_type", "marketing"), ("to_number", "2062222222")]]
    assert admitted(cfg, "messaging", one, 7) == 5
    assert admitted(cfg, "messaging", other, 7) == 5


def test_example_2_several_descriptors_are_all_checked(store: MemoryStore) -> None:
    cfg = config(MESSAGING, store)
    number = ("to_number", "2061111111")
    both = [[("message_type", "marketing"), number], [number]]
    assert admitted(cfg, "messaging", both, 10) == 5  # the marketing limit denies
    result = cfg.check("messaging", both)
    assert not result.overall_ok
    assert result.decision is not None
    assert result.decision.rule == "messaging.message_type_marketing.to_number"
    # the denied requests counted nowhere: 95 of the 100 per number are left
    assert admitted(cfg, "messaging", [[number]], 100) == 95


def test_example_3_key_value_beats_key(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: edge_proxy_per_ip
        descriptors:
          - key: remote_address
            rate_limit: {unit: second, requests_per_unit: 10}
          - key: remote_address
            value: 50.0.0.5
            rate_limit: {unit: second, requests_per_unit: 0}
        """,
        store,
    )
    assert limit_of(cfg, "edge_proxy_per_ip", ("remote_address", "50.0.0.1")) == "10/second"
    assert limit_of(cfg, "edge_proxy_per_ip", ("remote_address", "50.0.0.5")) == "blocked"
    result = cfg.check("edge_proxy_per_ip", [[("remote_address", "50.0.0.5")]])
    assert not result.overall_ok
    assert result.decision is not None
    assert result.decision.retry_after == 1.0


def test_example_4_the_descriptor_length_must_match_the_nesting(store: MemoryStore) -> None:
    flat = config(
        """
        domain: example4
        descriptors:
          - key: key
            value: value
            rate_limit: {requests_per_unit: 300, unit: second}
        """,
        store,
    )
    assert limit_of(flat, "example4", ("key", "value"), ("subkey", "subvalue")) is None
    nested = EnvoyConfig.loads(
        textwrap.dedent("""
        domain: example4
        descriptors:
          - key: key
            value: value
            descriptors:
              - key: subkey
                rate_limit: {requests_per_unit: 300, unit: second}
        """),
        store=store,
    )
    assert limit_of(nested, "example4", ("key", "value"), ("subkey", "subvalue")) == "300/second"
    assert limit_of(nested, "example4", ("key", "value")) is None


def test_example_5_unlimited_never_counts(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: internal
        descriptors:
          - key: ldap
            rate_limit: {unlimited: true}
          - key: azure
            rate_limit: {unit: minute, requests_per_unit: 100}
        """,
        store,
    )
    assert limit_of(cfg, "internal", ("ldap", "x")) == "unlimited"
    assert admitted(cfg, "internal", [[("ldap", "x")]], 1000) == 1000
    assert cfg.check("internal", [[("ldap", "x")]]).decision is None
    assert len(store) == 0


def test_example_6_shadow_mode_counts_but_never_denies(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: example6
        descriptors:
          - key: service
            descriptors:
              - key: user
                value: user-a
                rate_limit: {requests_per_unit: 10, unit: second}
                shadow_mode: true
              - key: user
                value: user-b
                rate_limit: {requests_per_unit: 20, unit: second}
        """,
        store,
    )
    user_a = [[("service", "auth-service"), ("user", "user-a")]]
    user_b = [[("service", "auth-service"), ("user", "user-b")]]
    assert admitted(cfg, "example6", user_a, 30) == 30
    result = cfg.check("example6", user_a)
    assert result.overall_ok
    assert result.shadow is not None
    assert not result.shadow.allowed  # reported: the shadow limit is breached
    assert admitted(cfg, "example6", user_b, 30) == 20


EXAMPLE_7 = """
    domain: example7
    descriptors:
      - key: key_1
        value: value_1
        descriptors:
          - key: user
            value: bkthomps
            rate_limit:
              name: specific_limit
              requests_per_unit: 5
              unit: second
      - key: key_2
        value: value_2
        descriptors:
          - key: user
            value: bkthomps
            rate_limit:
              replaces:
                - name: specific_limit
              requests_per_unit: 10
              unit: second
"""


def test_example_7_replaces_drops_the_named_limit(store: MemoryStore) -> None:
    cfg = config(EXAMPLE_7, store)
    first = [("key_1", "value_1"), ("user", "bkthomps")]
    second = [("key_2", "value_2"), ("user", "bkthomps")]
    assert [limit_of(cfg, "example7", *d) for d in (first, second)] == ["5/second", "10/second"]
    limits = cfg.limits_for("example7", [first, second])
    assert limits[0] is None  # replaced
    assert limits[1] is not None
    assert limits[1].limiter is not None
    assert str(limits[1].limiter.rate) == "10/second"
    assert admitted(cfg, "example7", [first, second], 15) == 10
    # ... and the replaced limit was not touched: 5 of 5 left for the first alone
    assert admitted(cfg, "example7", [first], 10) == 5


def test_example_8_detailed_metric_is_accepted(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: example8
        descriptors:
          - key: key1
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 10}
          - key: key1
            value: value1
            rate_limit: {unit: minute, requests_per_unit: 20}
        """,
        store,
    )
    assert limit_of(cfg, "example8", ("key1", "unspecified_value")) == "10/minute"
    assert limit_of(cfg, "example8", ("key1", "value1")) == "20/minute"


def test_example_9_wildcard_values_count_per_value(store: MemoryStore, clock: FakeClock) -> None:
    cfg = config(
        """
        domain: example9
        descriptors:
          - key: key1
            value: value*
            rate_limit: {unit: minute, requests_per_unit: 20}
          - key: key1
            value: value_special
            rate_limit: {unit: minute, requests_per_unit: 1}
          - key: key1
            rate_limit: {unit: minute, requests_per_unit: 2}
        """,
        store,
    )
    assert limit_of(cfg, "example9", ("key1", "value_1")) == "20/minute"
    assert limit_of(cfg, "example9", ("key1", "value_special")) == "1/minute"  # exact first
    assert limit_of(cfg, "example9", ("key1", "other")) == "2/minute"  # then the bare key
    clock.set(1_700_000_040)  # the start of a minute: no window edge in between
    assert admitted(cfg, "example9", [[("key1", "value_1")]], 25) == 20
    assert admitted(cfg, "example9", [[("key1", "value_2")]], 25) == 20


def test_hits_addend_is_the_cost(store: MemoryStore) -> None:
    cfg = config(MESSAGING, store)
    number = [[("to_number", "1")]]
    assert cfg.check("messaging", number, hits_addend=60).overall_ok
    assert not cfg.check("messaging", number, hits_addend=41).overall_ok
    assert cfg.check("messaging", number, hits_addend=40).overall_ok


def test_an_unknown_domain(store: MemoryStore) -> None:
    cfg = config(MESSAGING, store)
    with pytest.raises(Exception, match="no configuration for domain 'nope'"):
        cfg.limits_for("nope", [])


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (A + "    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", 4, "unit must be one of"),
        (A + "  - key: a\n", 4, "duplicate descriptor composite key 'd.a'"),
        (A + "    rate_limit: {unlimited: true, unit: second}\n", 4, "an unlimited limit has no"),
        (A + "    valeu: x\n", 4, "unknown field `valeu`"),
        ("descriptors: []\n", 1, "missing required field `domain`"),
        (A + "    rate_limit: {name: me, unit: second, requests_per_unit: 1,"
             " replaces: [{name: me}]}\n", 4, "limit 'me' replaces itself"),
    ],
)  # fmt: skip
def test_bad_envoy_files(text: str, line: int, words: str) -> None:
    with pytest.raises(RuleFileError) as info:
        EnvoyConfig.loads(text)
    (problem,) = info.value.problems
    assert problem.line == line
    assert words in problem.reason


def test_two_files_one_domain_each(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(textwrap.dedent(MESSAGING))
    (tmp_path / "b.yaml").write_text("domain: other\ndescriptors: []\n")
    cfg = EnvoyConfig.load(tmp_path / "a.yaml", tmp_path / "b.yaml")
    assert set(cfg.domains) == {"messaging", "other"}
    with pytest.raises(RuleFileError, match="configured twice"):
        EnvoyConfig.load(tmp_path / "a.yaml", tmp_path / "a.yaml")


def test_the_async_twin(clock: FakeClock, tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(textwrap.dedent(MESSAGING))

    async def main() -> int:
        cfg = AsyncEnvoyConfig.load(tmp_path / "a.yaml", store=AsyncMemoryStore(clock=clock))
        d = [[("message_type", "marketing"), ("to_number", "1")]]
        return sum([(await cfg.acheck("messaging", d)).overall_ok for _ in range(8)])

    assert asyncio.run(main()) == 5


def test_unquoted_numbers_and_booleans_are_values_as_written(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: d
        descriptors:
          - key: status
            value: 429
            rate_limit: {unit: second, requests_per_unit: 1}
          - key: internal
            value: true
            rate_limit: {unlimited: true}
        """,
        store,
    )
    assert limit_of(cfg, "d", ("status", "429")) == "1/second"
    assert limit_of(cfg, "d", ("internal", "true")) == "unlimited"


def test_values_keep_their_spelling_and_empty_means_any(store: MemoryStore) -> None:
    """YAML 1.1 would read 01234 as octal 668, 12:30 as 750 and yes as true;
    envoy's loader keeps the text. An empty value matches any value."""
    cfg = config(
        """
        domain: d
        descriptors:
          - {key: zip, value: 01234, rate_limit: {unit: second, requests_per_unit: 1}}
          - {key: at, value: 12:30, rate_limit: {unit: second, requests_per_unit: 2}}
          - {key: flag, value: yes, rate_limit: {unit: second, requests_per_unit: 3}}
          - {key: ratio, value: 1.50, rate_limit: {unit: second, requests_per_unit: 4}}
          - {key: anything, value: "", rate_limit: {unit: second, requests_per_unit: 5}}
        """,
        store,
    )
    assert limit_of(cfg, "d", ("zip", "01234")) == "1/second"
    assert limit_of(cfg, "d", ("at", "12:30")) == "2/second"
    assert limit_of(cfg, "d", ("flag", "yes")) == "3/second"
    assert limit_of(cfg, "d", ("ratio", "1.50")) == "4/second"
    assert limit_of(cfg, "d", ("anything", "whatever")) == "5/second"
