"""envoyproxy/ratelimit's own config tests (``test/config/config_test.go``),
case by case, against `EnvoyConfig`, on that project's fixtures (copied into
``envoy_peer/``; its README names the source).

There, ``GetLimit`` returns a limit whose ``Stats`` the test increments by hand;
here a limit is found with ``limits_for`` and its statistics move when a request
is checked, so each "stat X is 1" of the original is "after one check, the
counter named X moved". Configs the original writes as Go structs are YAML here.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ratewarden import FakeClock, MemoryStore
from ratewarden.rules import EnvoyConfig, EnvoyLimit, RuleFileError

FIXTURES = Path(__file__).parent / "envoy_peer"
Entries = tuple[tuple[str, str], ...]


def load(*names: str, merge: bool = False) -> EnvoyConfig:
    store = MemoryStore(clock=FakeClock(1_700_000_040))  # a minute's start: no edge crossed
    return EnvoyConfig.load(*(FIXTURES / n for n in names), store=store, merge=merge)


def inline(text: str, *, merge: bool = False) -> EnvoyConfig:
    store = MemoryStore(clock=FakeClock(1_700_000_040))
    return EnvoyConfig.loads(textwrap.dedent(text), store=store, merge=merge)


def get(
    cfg: EnvoyConfig,
    domain: str,
    *entries: tuple[str, str],
    override: tuple[int, str] | None = None,
) -> EnvoyLimit | None:
    (limit,) = cfg.limits_for(domain, [list(entries)], [override])
    return limit


def stats_after_check(cfg: EnvoyConfig, domain: str, *entries: tuple[str, str]) -> dict[str, int]:
    """The counters of the descriptor's stats key, after one more check of it."""
    limit = get(cfg, domain, *entries)
    assert limit is not None
    cfg.check(domain, [list(entries)])
    stats = ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode")
    return {s: cfg.stats.value(limit.stats_key, s) for s in stats}


def refused(*names: str, merge: bool = False) -> str:
    with pytest.raises(RuleFileError) as info:
        load(*names, merge=merge)
    (problem,) = info.value.problems
    assert Path(problem.file).name == names[-1]  # the file to blame, as there
    return problem.reason


# -- TestBasicConfig ------------------------------------------------------------


def test_basic_config() -> None:
    cfg = load("basic_config.yaml")
    assert cfg.domains
    assert cfg.stats.not_found.get("foo_domain", 0) == 0
    assert cfg.limits_for("foo_domain", [[]]) == [None]
    assert cfg.stats.not_found["foo_domain"] == 1
    assert cfg.limits_for("test-domain", [[]]) == [None]
    assert "test-domain" not in cfg.stats.not_found

    assert get(cfg, "test-domain", ("key1", "something")) is None
    assert get(cfg, "test-domain", ("key1", "value1")) is None
    assert get(cfg, "test-domain", ("key2", "value2"), ("subkey", "subvalue")) is None
    assert get(cfg, "test-domain", ("key5", "value5"), ("subkey5", "subvalue")) is None

    cases: list[tuple[Entries, int, str, str]] = [
        ((("key1", "value1"), ("subkey1", "something")), 5, "second",
         "test-domain.key1_value1.subkey1"),
        ((("key1", "value1"), ("subkey1", "subvalue1")), 10, "second",
         "test-domain.key1_value1.subkey1_subvalue1"),
        ((("key2", "something"),), 20, "minute", "test-domain.key2"),
        ((("key2", "value2"),), 30, "minute", "test-domain.key2_value2"),
        ((("key3", "foo"),), 1, "hour", "test-domain.key3"),
        ((("key4", "foo"),), 1, "day", "test-domain.key4"),
        # detailed_metric: the value is in the stat's name
        ((("key7", "unspecified_value"),), 70, "minute", "test-domain.key7_unspecified_value"),
        ((("key7", "another_value"),), 70, "minute", "test-domain.key7_another_value"),
    ]  # fmt: skip
    for entries, per_unit, unit, stats_key in cases:
        limit = get(cfg, "test-domain", *entries)
        assert limit is not None, entries
        assert (limit.requests_per_unit, limit.unit, limit.stats_key) == (per_unit, unit, stats_key)
        counts = stats_after_check(cfg, "test-domain", *entries)
        assert counts["total_hits"] == 1
        assert counts["within_limit"] + counts["over_limit"] == 1

    assert get(cfg, "test-domain", ("key2", "value3")) is None  # a value with no limit
    key3 = get(cfg, "test-domain", ("key3", "foo"))
    key4 = get(cfg, "test-domain", ("key4", "foo"))
    assert key3 is not None
    assert key3.name is None
    assert key4 is not None
    assert key4.name == "key4_rate_limit"
    key6 = get(cfg, "test-domain", ("key6", "foo"))
    assert key6 is not None
    assert key6.unlimited


def test_basic_config_counts_over_and_near_as_the_peer() -> None:
    cfg = load("basic_config.yaml")
    entries = (("key1", "value1"), ("subkey1", "something"))  # 5 a second
    for _ in range(7):
        counts = stats_after_check(cfg, "test-domain", *entries)
    # near: floor(5 * 0.8) = 4, so the 5th is near; the 6th and 7th over
    assert counts == {
        "total_hits": 7, "over_limit": 2, "near_limit": 1, "within_limit": 5, "shadow_mode": 0,
    }  # fmt: skip


# -- TestDomainMerge, TestDuplicateKeyDomainMerge ---------------------------------


def test_domain_merge() -> None:
    cfg = load("merge_domain_key1.yaml", "merge_domain_key2.yaml", merge=True)
    assert cfg.limits_for("foo_domain", [[]]) == [None]
    assert cfg.limits_for("test-domain", [[]]) == [None]
    one = get(cfg, "test-domain", ("key1", "value1"))
    two = get(cfg, "test-domain", ("key2", "value2"))
    assert one is not None
    assert one.requests_per_unit == 10
    assert two is not None
    assert two.requests_per_unit == 20


def test_duplicate_key_domain_merge() -> None:
    reason = refused("merge_domain_key1.yaml", "merge_domain_key1.yaml", merge=True)
    assert reason == "duplicate descriptor composite key 'test-domain.key1_value1'"


def test_without_merge_a_second_file_of_a_domain_is_refused() -> None:
    reason = refused("merge_domain_key1.yaml", "merge_domain_key2.yaml")
    assert reason == "duplicate domain 'test-domain' in config file"


# -- TestConfigLimitOverride ------------------------------------------------------


def test_config_limit_override() -> None:
    cfg = load("basic_config.yaml")
    assert get(cfg, "foo_domain", override=(10, "day")) is None  # no such domain
    entries = (("key1", "value1"), ("subkey1", "something"))
    limit = get(cfg, "test-domain", *entries, override=(10, "day"))
    assert limit is not None
    assert limit.stats_key == "test-domain.key1_value1.subkey1_something"
    assert (limit.requests_per_unit, limit.unit, limit.name) == (10, "day", None)
    assert not limit.shadow
    key = limit.stats_key
    cfg.check("test-domain", [list(entries)], overrides=[(10, "day")])
    assert cfg.stats.value(key, "total_hits") == 1
    # a change in the override's value keeps the stats
    limit = get(cfg, "test-domain", *entries, override=(42, "hour"))
    assert limit is not None
    assert (limit.stats_key, limit.requests_per_unit, limit.unit) == (key, 42, "hour")
    cfg.check("test-domain", [list(entries)], overrides=[(42, "hour")])
    assert cfg.stats.value(key, "total_hits") == 2
    # another value, another counter
    other = (("key1", "value1"), ("subkey1", "something_else"))
    limit = get(cfg, "test-domain", *other, override=(42, "hour"))
    assert limit is not None
    assert limit.stats_key == "test-domain.key1_value1.subkey1_something_else"
    cfg.check("test-domain", [list(other)], overrides=[(42, "hour")])
    assert cfg.stats.value(limit.stats_key, "total_hits") == 1


def test_an_override_is_enforced() -> None:
    cfg = load("basic_config.yaml")
    entries = [[("key3", "foo")]]  # 1 an hour in the file
    passed = [
        cfg.check("test-domain", entries, overrides=[(3, "hour")]).overall_ok for _ in range(5)
    ]
    assert passed == [True, True, True, False, False]


# -- the files that are refused ---------------------------------------------------


@pytest.mark.parametrize(
    ("names", "reason"),
    [
        (("empty_domain.yaml",), "config file cannot have empty domain"),
        (("basic_config.yaml", "duplicate_domain.yaml"),
         "duplicate domain 'test-domain' in config file"),
        (("empty_key.yaml",), "descriptor has empty key"),
        (("duplicate_key.yaml",), "duplicate descriptor composite key 'test-domain.key1_value1'"),
        (("replaces_self.yaml",), "replaces should not contain name of same descriptor"),
        (("replaces_empty.yaml",), "should not have an empty replaces entry"),
        (("misspelled_key.yaml",), "config error, unknown key 'ratelimit'"),
        (("misspelled_key2.yaml",), "config error, unknown key 'requestsperunit'"),
        (("non_string_key.yaml",), "config error, key is not of type string: 0.25"),
        (("non_map_list.yaml",),
         "config error, yaml file contains list of type other than map: a"),
        (("unlimited_with_unit.yaml",), "should not specify rate limit unit when unlimited"),
    ],
)  # fmt: skip
def test_refused_files(names: tuple[str, ...], reason: str) -> None:
    assert refused(*names) == reason


def test_bad_limit_unit() -> None:
    assert refused("bad_limit_unit.yaml").startswith("invalid rate limit unit 'foo'")


def test_bad_yaml() -> None:
    with pytest.raises(RuleFileError) as info:
        load("bad_yaml.yaml")
    (problem,) = info.value.problems
    assert Path(problem.file).name == "bad_yaml.yaml"
    assert problem.line is not None


# -- TestShadowModeConfig ---------------------------------------------------------


def test_shadow_mode_config() -> None:
    cfg = load("shadowmode_config.yaml")
    cases: list[tuple[Entries, bool, int, str, str]] = [
        ((("key1", "value1"), ("subkey1", "something")), False, 5, "second",
         "test-domain.key1_value1.subkey1"),
        ((("key1", "value1"), ("subkey1", "subvalue1")), True, 10, "second",
         "test-domain.key1_value1.subkey1_subvalue1"),
        ((("key2", "something"),), True, 20, "minute", "test-domain.key2"),
        ((("key2", "value2"),), False, 30, "minute", "test-domain.key2_value2"),
    ]  # fmt: skip
    for entries, shadow, per_unit, unit, key in cases:
        limit = get(cfg, "test-domain", *entries)
        assert limit is not None
        assert (limit.shadow, limit.requests_per_unit, limit.unit, limit.stats_key) == (
            shadow, per_unit, unit, key,
        )  # fmt: skip
        for _ in range(per_unit + 1):
            result = cfg.check("test-domain", [list(entries)])
        assert result.overall_ok is shadow  # over the limit: only a shadow limit passes
        assert cfg.stats.value(key, "over_limit") == 1
        assert cfg.stats.value(key, "shadow_mode") == (1 if shadow else 0)


# -- TestWildcardConfig -----------------------------------------------------------


def test_wildcard_config() -> None:
    cfg = load("wildcard.yaml")
    d = "test-domain"
    no_value_1, no_value_2 = get(cfg, d, ("noVal", "foo1")), get(cfg, d, ("noVal", "foo2"))
    assert no_value_1 is not None
    assert no_value_2 is not None
    assert no_value_1.stats_key == no_value_2.stats_key == "test-domain.noVal"

    wild_1, wild_2 = get(cfg, d, ("wild", "foo1")), get(cfg, d, ("wild", "foo2"))
    nested = get(cfg, d, ("nestedWild", "val1"), ("wild", "goo2"))
    assert wild_1 is not None
    assert wild_2 is not None
    assert nested is not None
    assert wild_1.stats_key == wild_2.stats_key == "test-domain.wild_foo*"
    assert wild_1.path == wild_2.path
    assert nested.stats_key == "test-domain.nestedWild_val1.wild_goo*"

    assert get(cfg, d, ("wild", "bar")) is None
    assert get(cfg, d, ("noWild", "foo1")) is None  # no eager match without *

    for value in ("barab", "bar123b", "barb"):  # bar*b; * matches nothing too
        limit = get(cfg, d, ("midWild", value))
        assert limit is not None, value
        assert limit.stats_key == "test-domain.midWild_bar*b"
    for value in ("bara", "xbarb"):
        assert get(cfg, d, ("midWild", value)) is None, value
    for value in ("foo123bar456baz", "foobarbaz"):
        limit = get(cfg, d, ("multiWild", value))
        assert limit is not None
        assert limit.stats_key == "test-domain.multiWild_foo*bar*baz"
    for value in ("foo123baz", "bar456baz"):
        assert get(cfg, d, ("multiWild", value)) is None, value


def test_wildcard_values_count_per_value_without_share_threshold() -> None:
    cfg = load("wildcard.yaml")
    one, two = [[("wild", "foo1")]], [[("wild", "foo2")]]  # 20 a minute each
    assert sum(cfg.check("test-domain", one).overall_ok for _ in range(25)) == 20
    assert sum(cfg.check("test-domain", two).overall_ok for _ in range(25)) == 20


# -- TestDetailedMetric -------------------------------------------------------------

REALISTIC = """
    domain: nested
    descriptors:
      - key: key_1
        rate_limit: {requests_per_unit: 500, unit: minute}
        detailed_metric: true
      - key: key_1
        value: some-value-for-key-1
        rate_limit: {requests_per_unit: 500, unit: minute}
      - key: key_2
        rate_limit: {requests_per_unit: 5000, unit: minute}
        detailed_metric: true
        descriptors:
          - key: key_3
            detailed_metric: true
          - key: key_3
            value: requested-key3-value
            rate_limit: {requests_per_unit: 5, unit: minute}
            detailed_metric: true
      - key: key_2
        value: specific-id
        rate_limit: {requests_per_unit: 50000, unit: minute}
        detailed_metric: true
        descriptors:
          - key: key_3
            detailed_metric: true
          - key: key_3
            value: requested-key3-value
            rate_limit: {requests_per_unit: 100, unit: minute}
            detailed_metric: true
"""


def _two_levels(top: bool, bottom: bool) -> str:
    return f"""
    domain: nested
    descriptors:
      - key: key-1
        rate_limit: {{requests_per_unit: 100, unit: minute}}
        detailed_metric: {str(top).lower()}
        descriptors:
          - key: key-2
            rate_limit: {{requests_per_unit: 5, unit: minute}}
            detailed_metric: {str(bottom).lower()}
    """


@pytest.mark.parametrize(
    ("text", "entries", "stats_key"),
    [
        (_two_levels(True, False), (("key-1", "value-1"),), "nested.key-1_value-1"),
        (_two_levels(False, False), (("key-1", "value-1"),), "nested.key-1"),
        (_two_levels(True, True), (("key-1", "value-1"), ("key-2", "value-2")),
         "nested.key-1_value-1.key-2_value-2"),
        (_two_levels(False, False), (("key-1", "value-1"), ("key-2", "value-2")),
         "nested.key-1.key-2"),
        (REALISTIC, (("key_1", "value-for-key-1"),), "nested.key_1_value-for-key-1"),
        (REALISTIC, (("key_2", "key-2-value"),), "nested.key_2_key-2-value"),
        (REALISTIC, (("key_2", "key-2-value"), ("key_3", "requested-key3-value")),
         "nested.key_2_key-2-value.key_3_requested-key3-value"),
    ],
    ids=["top-only-detailed", "top-only-plain", "nested-detailed", "nested-plain",
         "realistic-simple", "realistic-second-not-nested", "realistic-nested"],
)  # fmt: skip
def test_detailed_metric(text: str, entries: Entries, stats_key: str) -> None:
    cfg = inline(text, merge=True)
    limit = get(cfg, "nested", *entries)
    assert limit is not None
    assert limit.stats_key == stats_key
    assert stats_after_check(cfg, "nested", *entries)["total_hits"] == 1


# -- TestValueToMetric_* --------------------------------------------------------------

ROUTE_METHOD_SUBJECT = """
    domain: domain
    descriptors:
      - key: route
        value_to_metric: true
        descriptors:
          - key: http_method
            value_to_metric: true
            descriptors:
              - key: subject_id
                rate_limit: {requests_per_unit: 60, unit: minute}
"""


def test_value_to_metric_uses_runtime_values_in_stats() -> None:
    cfg = inline(ROUTE_METHOD_SUBJECT)
    entries = (("route", "draw"), ("http_method", "GET"), ("subject_id", "123"))
    limit = get(cfg, "domain", *entries)
    assert limit is not None
    assert limit.stats_key == "domain.route_draw.http_method_GET.subject_id"
    counts = stats_after_check(cfg, "domain", *entries)
    assert (counts["total_hits"], counts["within_limit"]) == (1, 1)


def test_value_to_metric_default_key_includes_value_at_that_level() -> None:
    cfg = inline("""
        domain: d
        descriptors:
          - key: k1
            value_to_metric: true
            descriptors:
              - {key: k2, rate_limit: {requests_per_unit: 1, unit: second}}
    """)
    limit = get(cfg, "d", ("k1", "A"), ("k2", "foo"))
    assert limit is not None
    assert limit.stats_key == "d.k1_A.k2"


def test_value_to_metric_mid_level_only() -> None:
    cfg = inline("""
        domain: d
        descriptors:
          - key: k1
            descriptors:
              - key: k2
                value_to_metric: true
                descriptors:
                  - {key: k3, rate_limit: {requests_per_unit: 1, unit: second}}
    """)
    limit = get(cfg, "d", ("k1", "X"), ("k2", "Y"), ("k3", "Z"))
    assert limit is not None
    assert limit.stats_key == "d.k1.k2_Y.k3"


def test_value_to_metric_no_flag_unchanged() -> None:
    cfg = inline("""
        domain: d
        descriptors:
          - key: k1
            descriptors:
              - {key: k2, rate_limit: {requests_per_unit: 1, unit: second}}
    """)
    limit = get(cfg, "d", ("k1", "X"), ("k2", "Y"))
    assert limit is not None
    assert limit.stats_key == "d.k1.k2"


def test_value_to_metric_does_not_override_detailed_metric() -> None:
    cfg = inline(
        ROUTE_METHOD_SUBJECT.replace(
            "- key: subject_id\n", "- key: subject_id\n                detailed_metric: true\n"
        )
    )
    entries = (("route", "draw"), ("http_method", "GET"), ("subject_id", "123"))
    limit = get(cfg, "domain", *entries)
    key = "domain.route_draw.http_method_GET.subject_id_123"
    assert limit is not None
    assert limit.stats_key == key
    assert stats_after_check(cfg, "domain", *entries)["total_hits"] == 1


def test_value_to_metric_with_configured_values() -> None:
    cfg = inline("""
        domain: test-domain
        descriptors:
          - key: route
            value_to_metric: true
            descriptors:
              - key: http_method
                value: GET
                value_to_metric: true
                descriptors:
                  - {key: subject_id, rate_limit: {requests_per_unit: 60, unit: minute}}
              - key: http_method
                value: POST
                value_to_metric: true
                descriptors:
                  - {key: subject_id, rate_limit: {requests_per_unit: 30, unit: minute}}
    """)
    get_ = get(cfg, "test-domain", ("route", "api"), ("http_method", "GET"), ("subject_id", "u1"))
    post = get(cfg, "test-domain", ("route", "api"), ("http_method", "POST"), ("subject_id", "u"))
    assert get_ is not None
    assert post is not None
    assert (get_.requests_per_unit, get_.stats_key) == (
        60, "test-domain.route_api.http_method_GET.subject_id",
    )  # fmt: skip
    assert (post.requests_per_unit, post.stats_key) == (
        30, "test-domain.route_api.http_method_POST.subject_id",
    )  # fmt: skip


def test_value_to_metric_with_wildcard() -> None:
    cfg = inline("""
        domain: domain
        descriptors:
          - key: user
            value_to_metric: true
            descriptors:
              - key: action
                value: read*
                value_to_metric: true
                descriptors:
                  - {key: resource, rate_limit: {requests_per_unit: 100, unit: minute}}
    """)
    alice = get(cfg, "domain", ("user", "alice"), ("action", "readfile"), ("resource", "docs"))
    bob = get(cfg, "domain", ("user", "bob"), ("action", "readdata"), ("resource", "db"))
    assert alice is not None
    assert bob is not None
    assert alice.requests_per_unit == 100
    assert alice.stats_key == "domain.user_alice.action_readfile.resource"
    assert bob.stats_key == "domain.user_bob.action_readdata.resource"


@pytest.mark.parametrize(
    ("route", "method", "stats_key"),
    [
        ("", "GET", "domain.route.http_method_GET.subject_id"),
        ("draw", "", "domain.route_draw.http_method.subject_id"),
        ("", "", "domain.route.http_method.subject_id"),
    ],
)
def test_value_to_metric_with_empty_value(route: str, method: str, stats_key: str) -> None:
    cfg = inline(ROUTE_METHOD_SUBJECT)
    entries = (("route", route), ("http_method", method), ("subject_id", "123"))
    limit = get(cfg, "domain", *entries)
    assert limit is not None
    assert limit.stats_key == stats_key
    counts = stats_after_check(cfg, "domain", *entries)
    assert (counts["total_hits"], counts["within_limit"]) == (1, 1)


def test_value_to_metric_full_key_matches_stats_key() -> None:
    """There, FullKey and Stats.Key must agree; here a limit has one stats key,
    so what is left to check is each configuration's key."""
    entries = (("route", "api"), ("http_method", "GET"), ("subject_id", "user123"))
    cfg = inline(ROUTE_METHOD_SUBJECT)
    limit = get(cfg, "domain", *entries)
    assert limit is not None
    assert limit.stats_key == "domain.route_api.http_method_GET.subject_id"
    plain = inline(ROUTE_METHOD_SUBJECT.replace("value_to_metric: true", "value_to_metric: false"))
    limit = get(plain, "domain", *entries)
    assert limit is not None
    assert limit.stats_key == "domain.route.http_method.subject_id"
    detailed = inline(
        ROUTE_METHOD_SUBJECT.replace("value_to_metric: true", "value_to_metric: false").replace(
            "- key: subject_id\n", "- key: subject_id\n                detailed_metric: true\n"
        )
    )
    limit = get(detailed, "domain", *entries)
    assert limit is not None
    assert limit.stats_key == "domain.route_api.http_method_GET.subject_id_user123"


# -- TestShareThreshold -----------------------------------------------------------------


def shared_limit(cfg: EnvoyConfig, *entries: tuple[str, str]) -> EnvoyLimit:
    limit = get(cfg, "test-domain", *entries)
    assert limit is not None, entries
    return limit


def test_share_threshold_basic() -> None:
    cfg = load("share_threshold.yaml")
    limits = [
        shared_limit(cfg, ("files", v)) for v in ("files/a.pdf", "files/b.csv", "files/c.txt")
    ]
    assert {lim.requests_per_unit for lim in limits} == {100}
    assert {lim.stats_key for lim in limits} == {"test-domain.files_files/*"}
    assert {lim.key for lim in limits} == {"test-domain|files=files/*"}  # one counter
    # ... which is what sharing means: 100 for all of them together
    d = [[("files", f"files/{i}.txt")] for i in range(150)]
    assert sum(cfg.check("test-domain", [x]).overall_ok for x in d) == 100


def test_share_threshold_with_metrics() -> None:
    cfg = load("share_threshold.yaml")
    route = shared_limit(cfg, ("route", "api/v1"), ("method", "GET"))
    assert route.key == "test-domain|route=api/*|method=GET"
    assert (
        route.stats_key == "test-domain.route_api/*.method"
    )  # share_threshold beats value_to_metric
    service = shared_limit(cfg, ("service", "svc/user"), ("endpoint", "get"))
    assert service.key == "test-domain|service=svc/*|endpoint=get"
    assert service.stats_key == "test-domain.service_svc/*.endpoint_get"  # ... and detailed_metric


def test_share_threshold_nested_wildcards() -> None:
    cfg = load("share_threshold.yaml")
    nested = shared_limit(cfg, ("nested", "parent"), ("files", "nested/file1.txt"))
    assert nested.requests_per_unit == 200
    assert nested.key == "test-domain|nested=parent|files=nested/*"
    assert nested.stats_key == "test-domain.nested_parent.files_nested/*"
    both = shared_limit(cfg, ("files", "top/file1.txt"), ("files", "nested/file1.txt"))
    assert both.key == "test-domain|files=top/*|files=nested/*"
    assert both.stats_key == "test-domain.files_top/*.files_nested/*"
    mixed = shared_limit(cfg, ("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf"))
    assert mixed.key == "test-domain|path=path/*|file=file/doc1|type=pdf"  # file/* not shared
    assert mixed.stats_key == "test-domain.path_path/*.file_file/*.type"
    deep = shared_limit(cfg, ("user", "user/alice"), ("resource", "res/file1"), ("action", "read"))
    assert deep.key == "test-domain|user=user/*|resource=res/*|action=read"
    assert deep.stats_key == "test-domain.user_user/*.resource_res/*.action"


def test_share_threshold_explicit_value_beats_wildcard() -> None:
    cfg = load("share_threshold.yaml")
    test1 = shared_limit(cfg, ("file", "test1"))
    assert test1.requests_per_unit == 50
    assert test1.key == "test-domain|file=test1"
    assert test1.stats_key == "test-domain.file_test1"
    shared = [shared_limit(cfg, ("file", v)) for v in ("test2", "test23", "test123")]
    assert {s.requests_per_unit for s in shared} == {100}
    assert {s.key for s in shared} == {"test-domain|file=test*"}
    assert {s.stats_key for s in shared} == {"test-domain.file_test*"}
    for value in ("test2", "test23", "test123"):
        cfg.check("test-domain", [[("file", value)]])
    cfg.check("test-domain", [[("file", "test1")]])
    assert cfg.stats.value("test-domain.file_test*", "total_hits") == 3
    assert cfg.stats.value("test-domain.file_test1", "total_hits") == 1


@pytest.mark.parametrize(
    ("key", "values", "pattern", "per_unit", "miss"),
    [
        ("midpath", ("/api/v1", "/api-beta-v1", "/apiXYZv1"), "/api*v1", 100, "/api/v2"),
        ("multiroute", ("svcAepBrpc", "svcXXXepYYYrpc", "svceprpc"), "svc*ep*rpc", 50,
         "svcABCrpc"),
        ("midroute", ("/api/v2", "/api-beta-v2"), "/api*v2", 80, "/api/v3"),
    ],
    ids=["middle-wildcard", "multi-wildcard", "beats-value-to-metric"],
)  # fmt: skip
def test_share_threshold_middle_and_multi_wildcards(
    key: str, values: tuple[str, ...], pattern: str, per_unit: int, miss: str
) -> None:
    cfg = load("share_threshold.yaml")
    limits = [shared_limit(cfg, (key, v)) for v in values]
    assert {lim.requests_per_unit for lim in limits} == {per_unit}
    assert {lim.key for lim in limits} == {f"test-domain|{key}={pattern}"}
    assert {lim.stats_key for lim in limits} == {f"test-domain.{key}_{pattern}"}
    assert get(cfg, "test-domain", (key, miss)) is None


def test_share_threshold_nested_middle_wildcards() -> None:
    cfg = load("share_threshold.yaml")
    one = shared_limit(cfg, ("tenant", "t1prod"), ("resource", "resAv2"))
    two = shared_limit(cfg, ("tenant", "t99prod"), ("resource", "resBBBv2"))
    assert one.key == two.key == "test-domain|tenant=t*prod|resource=res*v2"
    assert one.stats_key == two.stats_key == "test-domain.tenant_t*prod.resource_res*v2"


def test_share_threshold_needs_a_wildcard() -> None:
    with pytest.raises(RuleFileError, match="share_threshold can only be used with wildcard"):
        inline("""
            domain: d
            descriptors:
              - {key: k, value: v, share_threshold: true}
        """)


# -- TestWildcardStatsBehavior ------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "flags", "value", "stats_key"),
    [
        ("foo*", "", "foo1", "test-domain.wild_foo*"),
        ("foo*", "value_to_metric: true", "foo1", "test-domain.wild_foo1"),
        ("foo*", "share_threshold: true", "foo1", "test-domain.wild_foo*"),
        ("foo*", "{share_threshold: true, value_to_metric: true}", "foo1",
         "test-domain.wild_foo*"),
        ("foo*bar*", "", "foo123bar456", "test-domain.wild_foo*bar*"),
        ("foo*bar*", "", "fooXbarY", "test-domain.wild_foo*bar*"),
        ("foo*bar*", "value_to_metric: true", "foo123bar456", "test-domain.wild_foo123bar456"),
    ],
)  # fmt: skip
def test_wildcard_stats_behavior(pattern: str, flags: str, value: str, stats_key: str) -> None:
    extra = ""
    if flags.startswith("{"):
        extra = "".join(f"    {f.strip()}\n" for f in flags.strip("{}").split(","))
    elif flags:
        extra = f"    {flags}\n"
    cfg = EnvoyConfig.loads(
        "domain: test-domain\ndescriptors:\n"
        f"  - key: wild\n    value: '{pattern}'\n{extra}"
        "    rate_limit: {requests_per_unit: 20, unit: minute}\n"
    )
    limit = get(cfg, "test-domain", ("wild", value))
    assert limit is not None
    assert limit.stats_key == stats_key


def test_wildcard_stats_value_to_metric_elsewhere_keeps_the_pattern() -> None:
    cfg = inline("""
        domain: test-domain
        descriptors:
          - key: wild
            value: foo*
            descriptors:
              - key: other
                value_to_metric: true
                descriptors:
                  - {key: limit, rate_limit: {requests_per_unit: 20, unit: minute}}
    """)
    limit = get(cfg, "test-domain", ("wild", "foo1"), ("other", "bar"), ("limit", "X"))
    assert limit is not None
    assert limit.stats_key == "test-domain.wild_foo*.other_bar.limit"


# -- TestMetadata ------------------------------------------------------------------------


def test_metadata() -> None:
    cfg = load("metadata.yaml")
    assert cfg.limits_for("test-domain", [[]]) == [None]
    assert "test-domain" not in cfg.stats.not_found
    one = get(cfg, "test-domain", ("key1", "value1"), ("subkey1", "something"))
    assert one is not None
    assert (one.requests_per_unit, one.unit, one.stats_key) == (
        5, "second", "test-domain.key1_value1.subkey1",
    )  # fmt: skip
    assert one.metadata == {"name": "service_1"}
    two = get(cfg, "test-domain", ("key2", "something"))
    assert two is not None
    assert (two.requests_per_unit, two.unit, two.stats_key) == (20, "minute", "test-domain.key2")
    assert two.metadata == {"service_with_quota": {"name": "service_2"}}
    assert stats_after_check(cfg, "test-domain", ("key2", "something"))["total_hits"] == 1
