"""envoyproxy/ratelimit configurations, checked against the cases its README
documents (examples 1-9 of its "Configuration" section)."""

from __future__ import annotations

import asyncio
import inspect
import textwrap
import typing
from pathlib import Path

import pytest

from ratewarden import AsyncMemoryStore, FakeClock, MemoryStore
from ratewarden.envoy import EnvoyConfigOptions
from ratewarden.envoy._files import parse_files
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
    return f"{limit.requests_per_unit}/{limit.unit}" + (" shadow" if limit.shadow else "")


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
    # as envoy's service does, every limit counted every request, denied or not:
    # 11 of the 100 per number are gone
    assert admitted(cfg, "messaging", [[number]], 100) == 89


def test_counting_atomically_a_denied_request_counts_nowhere(store: MemoryStore) -> None:
    cfg = EnvoyConfig.loads(textwrap.dedent(MESSAGING), store=store, count_denied=False)
    number = ("to_number", "2061111111")
    both = [[("message_type", "marketing"), number], [number]]
    assert admitted(cfg, "messaging", both, 10) == 5
    result = cfg.check("messaging", both)
    assert result.decision is not None
    assert result.decision.rule == "messaging.message_type_marketing.to_number"
    # the denied requests counted nowhere: 95 of the 100 per number are left
    assert admitted(cfg, "messaging", [[number]], 100) == 95


def test_a_denied_request_still_counts_with_envoys_counting(store: MemoryStore) -> None:
    """100 a day; 50 used; a request of 60 is denied. Envoy's service has counted
    it all the same (110), so one more is denied too; counting atomically, it
    counted nowhere, and one more passes."""
    text = textwrap.dedent(MESSAGING)
    number = [[("to_number", "1")]]
    results = []
    for count_denied in (True, False):
        cfg = EnvoyConfig.loads(
            text, store=MemoryStore(clock=store.clock), count_denied=count_denied
        )
        assert cfg.check("messaging", number, hits_addend=50).overall_ok
        assert not cfg.check("messaging", number, hits_addend=60).overall_ok
        results.append(cfg.check("messaging", number).overall_ok)
    assert results == [False, True]


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
    assert (limits[1].requests_per_unit, limits[1].unit) == (10, "second")
    assert admitted(cfg, "example7", [first, second], 15) == 10
    # ... and the replaced limit was not touched: 5 of 5 left for the first alone
    assert admitted(cfg, "example7", [first], 10) == 5


def test_example_8_detailed_metric(store: MemoryStore) -> None:
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


@pytest.mark.parametrize("count_denied", [True, False])
def test_hits_addend_is_the_cost(store: MemoryStore, count_denied: bool) -> None:
    cfg = EnvoyConfig.loads(textwrap.dedent(MESSAGING), store=store, count_denied=count_denied)
    number = [[("to_number", "1")]]
    assert cfg.check("messaging", number, hits_addend=60).overall_ok
    assert not cfg.check("messaging", number, hits_addend=41).overall_ok
    # counted although denied (101 of 100), or not counted (60 of 100)
    assert cfg.check("messaging", number, hits_addend=40).overall_ok is not count_denied


def test_an_unknown_domain_has_no_limits(store: MemoryStore) -> None:
    cfg = config(MESSAGING, store)
    assert cfg.limits_for("nope", [[("to_number", "1")]]) == [None]
    result = cfg.check("nope", [[("to_number", "1")], [("a", "b")]])
    assert result.overall_ok
    assert result.decision is None
    assert cfg.stats.not_found == {"nope": 3}  # one a descriptor, as envoy's service counts
    assert len(store) == 0


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (A + "    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", 4,
         "invalid rate limit unit 'fortnight'"),
        (A + "  - key: a\n", 4, "duplicate descriptor composite key 'd.a'"),
        (A + "    rate_limit: {unlimited: true, unit: second}\n", 4,
         "should not specify rate limit unit when unlimited"),
        (A + "    valeu: x\n", 4, "config error, unknown key 'valeu'"),
        ("descriptors: []\n", 1, "config file cannot have empty domain"),
        (A + "    rate_limit: {name: me, unit: second, requests_per_unit: 1,"
             " replaces: [{name: me}]}\n", 4,
         "replaces should not contain name of same descriptor"),
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
    with pytest.raises(RuleFileError, match="duplicate domain 'messaging' in config file"):
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


QUOTAS = """
    domain: q
    descriptors:
      - key: plan
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: team
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: ip
        rate_limit: {unit: minute, requests_per_unit: 10}
"""


def test_quota_mode_denies_only_when_every_quota_is_spent(store: MemoryStore) -> None:
    cfg = config(QUOTAS, store)
    both = [[("plan", "free")], [("team", "a")], [("ip", "1")]]
    answers = [cfg.check("q", both) for _ in range(4)]
    # plan is spent after 1, team after 3: only then is the request denied
    assert [a.overall_ok for a in answers] == [True, True, True, False]
    assert answers[1].statuses[0] is not None
    assert not answers[1].statuses[0].allowed  # the plan's own status says over
    alone = [[("plan", "pro")]]
    assert [cfg.check("q", alone).overall_ok for _ in range(2)] == [True, False]


def test_a_rate_limit_beside_quotas_still_denies(store: MemoryStore) -> None:
    cfg = config(QUOTAS, store)
    request = [[("team", "b")], [("ip", "2")]]
    for _ in range(10):
        cfg.check("q", [[("ip", "2")]])
    assert not cfg.check("q", request).overall_ok  # the ip limit is spent


def test_global_quota_and_shadow_modes(store: MemoryStore) -> None:
    parsed = parse_files((), [textwrap.dedent(QUOTAS)])
    quota = EnvoyConfig(parsed, store, quota_mode=True)
    request = [[("ip", "3")], [("team", "c")]]
    answers = [quota.check("q", request).overall_ok for _ in range(11)]
    assert answers == [True] * 10 + [False]  # ip is a quota too: denied once both are spent
    shadow = EnvoyConfig(parsed, MemoryStore(clock=store.clock), shadow_mode=True)
    assert all(shadow.check("q", [[("plan", "x")]]).overall_ok for _ in range(5))
    assert shadow.stats.value("q.plan", "over_limit") == 4  # counted all the same


def test_loading_files_takes_every_option(clock: FakeClock, tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text(textwrap.dedent(QUOTAS))
    request = [[("ip", "3")], [("team", "c")]]
    quota = EnvoyConfig.load(tmp_path / "q.yaml", store=MemoryStore(clock=clock), quota_mode=True)
    assert [quota.check("q", request).overall_ok for _ in range(11)] == [True] * 10 + [False]
    shadow = EnvoyConfig.load(tmp_path / "q.yaml", shadow_mode=True)
    assert all(shadow.check("q", [[("plan", "x")]]).overall_ok for _ in range(5))


def test_the_async_twin_loads_texts_too() -> None:
    request = [[("ip", "3")], [("team", "c")]]

    async def main() -> list[bool]:
        cfg = AsyncEnvoyConfig.loads(textwrap.dedent(QUOTAS), quota_mode=True,
                                     store=AsyncMemoryStore(clock=FakeClock()))  # fmt: skip
        return [(await cfg.acheck("q", request)).overall_ok for _ in range(11)]

    assert asyncio.run(main()) == [True] * 10 + [False]


@pytest.mark.parametrize("twin", [EnvoyConfig, AsyncEnvoyConfig])
def test_the_twins_and_their_loaders_take_one_set_of_options(
    twin: type[EnvoyConfig] | type[AsyncEnvoyConfig],
) -> None:
    made = inspect.signature(twin).parameters.values()
    assert {p.name for p in made if p.kind is p.KEYWORD_ONLY} == set(
        EnvoyConfigOptions.__annotations__
    )
    for loader in (twin.load, twin.loads):  # **options: Unpack[EnvoyConfigOptions]
        options = typing.get_type_hints(loader, include_extras=True)["options"]
        assert typing.get_args(options) == (EnvoyConfigOptions,)


def test_what_the_peer_accepts_and_refuses(store: MemoryStore) -> None:
    cfg = config(
        """
        domain: d
        descriptors:
          - key: ldap
            rate_limit: {unlimited: true, requests_per_unit: 25}
          - key: empty
            descriptors:
        """,
        store,
    )
    assert limit_of(cfg, "d", ("ldap", "x")) == "unlimited"
    assert limit_of(cfg, "d", ("empty", "x")) is None
    assert list(EnvoyConfig.loads("domain: d\ndescriptors:\n").domains) == ["d"]
    with pytest.raises(RuleFileError, match="config file cannot have empty domain"):
        EnvoyConfig.loads('domain: ""\ndescriptors: []\n')
