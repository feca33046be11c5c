"""Envoy domains through ShouldRateLimit as envoyproxy/ratelimit answers them:
unknown domains, per-descriptor statuses, limit overrides, unlimited limits,
statistics on /metrics, and the runtime directory reloaded when it changes."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from ratewarden import AsyncMemoryStore, ConfigurationError, FakeClock
from ratewarden.envoy._runtime import EnvoyOptions
from ratewarden.server import Service
from ratewarden.server._grpc_server import METHOD, GrpcServer, messages
from ratewarden.server._serve import no_rules

from .test_grpc import request

M = messages()

EDGE = textwrap.dedent("""
    domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: ldap
        rate_limit: {unlimited: true, requests_per_unit: 5}
      - key: tenant
        value: "t*prod"
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: path
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
        metadata: {team: core}
""")


def service_with(rules: Path, *envoy: Path, options: EnvoyOptions | None = None) -> Service:
    # 40 s into a minute: fixed windows do not turn during a test
    store = AsyncMemoryStore(clock=FakeClock(1_700_000_040))
    return Service(rules, store, envoy_files=envoy, envoy_options=options)


async def call_with(service: Service, *messages_: Any) -> list[Any]:
    server = GrpcServer(service, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.unary_unary(
                METHOD,
                request_serializer=M["RateLimitRequest"].SerializeToString,
                response_deserializer=M["RateLimitResponse"].FromString,
            )
            return [await call(m) for m in messages_]
    finally:
        await server.stop(0)


@pytest.fixture
def edge(tmp_path: Path) -> Path:
    path = tmp_path / "edge.yaml"
    path.write_text(EDGE)
    return path


def test_an_unknown_domain_is_ok(rules_file: Path, edge: Path) -> None:
    service = service_with(rules_file, edge)
    answers = asyncio.run(call_with(service, *[request("nowhere", [("a", "b")])] * 3))
    assert [a.overall_code for a in answers] == [1, 1, 1]
    assert [s.code for s in answers[0].statuses] == [1]
    assert service.envoy_stats.not_found == {"nowhere": 3}


def test_statuses_per_descriptor_as_the_peer(rules_file: Path, edge: Path) -> None:
    service = service_with(rules_file, edge)
    message = request("edge", [("remote_address", "10.0.0.1")], [("ldap", "x")], [("q", "r")])
    answers = asyncio.run(call_with(service, *[message] * 3))
    assert [a.overall_code for a in answers] == [1, 1, 2]
    first, third = answers[0].statuses, answers[2].statuses
    assert (first[0].code, first[0].current_limit.requests_per_unit) == (1, 2)
    assert first[0].current_limit.unit == 2  # MINUTE
    assert first[0].limit_remaining == 1
    assert 0 < first[0].duration_until_reset.seconds <= 60
    # unlimited: OK, the largest remaining, no limit; no limit at all: OK alone
    assert (first[1].code, first[1].limit_remaining, first[1].HasField("current_limit")) == (
        1, 2**32 - 1, False,
    )  # fmt: skip
    assert (first[2].code, first[2].HasField("current_limit")) == (1, False)
    assert (third[0].code, third[0].limit_remaining) == (2, 0)


def test_a_limit_override_is_honoured(rules_file: Path, edge: Path) -> None:
    service = service_with(rules_file, edge)
    message = request("edge", [("remote_address", "10.0.0.2")])
    message.descriptors[0].limit.requests_per_unit = 4
    message.descriptors[0].limit.unit = 3  # HOUR
    answers = asyncio.run(call_with(service, *[message] * 5))
    assert [a.overall_code for a in answers] == [1, 1, 1, 1, 2]
    assert answers[0].statuses[0].current_limit.requests_per_unit == 4
    assert answers[0].statuses[0].current_limit.unit == 3
    stats = service.envoy_stats
    assert stats.value("edge.remote_address_10_0_0_2", "total_hits") == 5  # the IP's dots go


def test_an_override_without_a_unit_is_an_invalid_argument(rules_file: Path, edge: Path) -> None:
    message = request("edge", [("remote_address", "10.0.0.2")])
    message.descriptors[0].limit.requests_per_unit = 4
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(call_with(service_with(rules_file, edge), message))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "needs a unit" in (caught.value.details() or "")


def test_share_threshold_values_share_one_counter(rules_file: Path, edge: Path) -> None:
    service = service_with(rules_file, edge)
    messages_ = [request("edge", [("tenant", f"t{i}prod")]) for i in range(5)]
    answers = asyncio.run(call_with(service, *messages_))
    assert [a.overall_code for a in answers] == [1, 1, 1, 2, 2]


def test_envoy_stats_on_metrics(rules_file: Path, edge: Path) -> None:
    service = service_with(rules_file, edge)
    messages_ = [request("edge", [("remote_address", "10.0.0.3")])] * 3
    messages_ += [request("edge", [("path", "/x")])]
    asyncio.run(call_with(service, *messages_))
    text = service.metrics.exposition().decode()
    labels = 'domain="edge",key="edge.remote_address",key1="remote_address",key2=""'
    assert f"ratelimit_service_rate_limit_total_hits{{{labels}}} 3.0" in text
    assert f"ratelimit_service_rate_limit_within_limit{{{labels}}} 2.0" in text
    assert f"ratelimit_service_rate_limit_near_limit{{{labels}}} 1.0" in text
    assert f"ratelimit_service_rate_limit_over_limit{{{labels}}} 1.0" in text
    detailed = 'domain="edge",key="edge.path_/x",key1="path_/x",key2=""'
    assert f"ratelimit_service_rate_limit_total_hits{{{detailed}}} 1.0" in text


def test_stats_keys_are_bounded(rules_file: Path, edge: Path) -> None:
    """detailed_metric puts every value a client sends into a key: past the
    bound, the counts go to the node's config path."""
    service = service_with(rules_file, edge)
    service.envoy_stats.max_keys = 3
    messages_ = [request("edge", [("path", f"/p{i}")]) for i in range(10)]
    asyncio.run(call_with(service, *messages_))
    counts = service.envoy_stats.counts
    assert len(counts) == 4  # three values, and the config path
    assert counts["edge.path"][0] == 7
    assert service.envoy_stats.folded == 7
    assert "ratewarden_envoy_stats_folded_total 7.0" in service.metrics.exposition().decode()


def test_stop_counting_when_over(rules_file: Path, edge: Path) -> None:
    options = EnvoyOptions(count_denied=False)
    service = service_with(rules_file, edge, options=options)
    ip = request("edge", [("remote_address", "10.0.0.4")])
    heavy = request("edge", [("remote_address", "10.0.0.4")], hits=5)
    answers = asyncio.run(call_with(service, ip, heavy, ip))
    # the heavy one is denied and counts nowhere, so the next one passes
    assert [a.overall_code for a in answers] == [1, 2, 1]


def test_a_runtime_directory_reloads_on_a_configmap_swap(rules_file: Path, tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume: visible names are symlinks into ``..data``,
    itself a symlink to a timestamped directory swapped on each update."""
    root = tmp_path / "runtime"
    root.mkdir()

    def publish(stamp: str, per_minute: int) -> None:
        version = root / f"..{stamp}"
        version.mkdir()
        text = EDGE.replace("requests_per_unit: 2}", f"requests_per_unit: {per_minute}}}")
        (version / "edge.yaml").write_text(text)
        (version / "notes.txt").write_text("not config")
        tmp = root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, root / "..data")  # the atomic swap kubelet does

    publish("2024_01_01", 2)
    for name in ("edge.yaml", "notes.txt"):
        (root / name).symlink_to(f"..data/{name}")
    service = service_with(rules_file, root)
    assert service.envoy is not None
    ip = [("remote_address", "10.0.0.5")]

    async def main() -> list[bool]:
        watcher = service.envoy_watcher(interval=3600)  # polled by hand here
        assert await watcher.apoll() is None  # nothing changed yet
        first = [(await service.check_descriptors("edge", [ip])).allowed for _ in range(3)]
        publish("2024_01_02", 5)
        assert await watcher.apoll() is True
        assert await watcher.apoll() is None
        return first + [(await service.check_descriptors("edge", [ip])).allowed for _ in range(3)]

    # 2 a minute, then 5 a minute on the same counter: 3 used, 2 more pass
    assert asyncio.run(main()) == [True, True, False, True, True, False]


def test_dynamic_metadata_as_the_peer_sends_it(rules_file: Path, edge: Path) -> None:
    service = service_with(rules_file, edge, options=EnvoyOptions(dynamic_metadata=True))
    message = request("edge", [("path", "/x")], [("ldap", "y")], hits=2)
    message.descriptors[1].hits_addend.value = 2
    (answer,) = asyncio.run(call_with(service, message))
    shown = MessageToDict(answer.dynamic_metadata)
    assert shown == {
        "domain": "edge",
        "descriptors": [{"entries": ["path=/x"]}, {"entries": ["ldap=y"], "hitsAddend": 2.0}],
        "hitsAddend": 2.0,
        "metadata": {"team": "core"},  # the passed /x limit's; ldap is unlimited
    }


def test_no_dynamic_metadata_unless_asked(rules_file: Path, edge: Path) -> None:
    (answer,) = asyncio.run(
        call_with(service_with(rules_file, edge), request("edge", [("path", "/x")]))
    )
    assert not answer.HasField("dynamic_metadata")


def test_a_denied_descriptors_metadata_is_left_out(rules_file: Path, tmp_path: Path) -> None:
    path = tmp_path / "meta.yaml"
    path.write_text(
        textwrap.dedent("""
        domain: m
        descriptors:
          - key: a
            rate_limit: {unit: day, requests_per_unit: 1}
            metadata: {owner: {team: a, pager: one}}
          - key: b
            rate_limit: {unit: day, requests_per_unit: 5}
            metadata: {owner: {team: b, site: x}, plan: gold}
    """)
    )
    service = service_with(rules_file, path, options=EnvoyOptions(dynamic_metadata=True))
    both = request("m", [("a", "1")], [("b", "1")])
    first, second = asyncio.run(call_with(service, both, both))
    merged = MessageToDict(first.dynamic_metadata)["metadata"]
    assert merged == {"owner": {"team": "a", "pager": "one", "site": "x"}, "plan": "gold"}
    assert MessageToDict(second.dynamic_metadata)["metadata"] == {
        "owner": {"team": "b", "site": "x"}, "plan": "gold",
    }  # fmt: skip


def test_overrides_do_not_grow_the_metric_labels(rules_file: Path, edge: Path) -> None:
    """An override's values reach only the bounded stats keys, never the
    per-rule counters' labels."""
    service = service_with(rules_file, edge)
    messages_ = []
    for i in range(20):
        message = request("edge", [("remote_address", f"10.9.0.{i}")])
        message.descriptors[0].limit.requests_per_unit = 4
        message.descriptors[0].limit.unit = 3
        messages_.append(message)
    asyncio.run(call_with(service, *messages_))
    text = service.metrics.exposition().decode()
    checks = [line for line in text.splitlines() if line.startswith("ratewarden_checks_total{")]
    assert checks == ['ratewarden_checks_total{rule="edge.override"} 20.0']


def test_an_empty_descriptor_of_an_envoy_domain_is_ok(rules_file: Path, edge: Path) -> None:
    message = request("edge", [], [("remote_address", "10.8.0.1")])
    (answer,) = asyncio.run(call_with(service_with(rules_file, edge), message))
    assert answer.overall_code == 1
    assert [s.code for s in answer.statuses] == [1, 1]
    assert answer.statuses[1].current_limit.requests_per_unit == 2


def test_a_reload_says_what_it_loaded(rules_file: Path, tmp_path: Path) -> None:
    """The rule file and the envoy files; without a rule file (rules given in
    memory) the envoy files alone; with neither, nothing, and a clear error."""
    edge = tmp_path / "edge.yaml"
    edge.write_text(EDGE)

    async def main() -> None:
        both = await service_with(rules_file, edge).reload()
        assert both["loaded"] == ["rules", "envoy"]
        assert both["envoy_domains"] == ["edge"]
        assert both["rules"] == 5

        service = Service(no_rules(), AsyncMemoryStore(), envoy_files=(edge,))
        edge.write_text(EDGE.replace("domain: edge", "domain: edge2"))
        alone = await service.reload()
        assert alone == {"reloaded": True, "loaded": ["envoy"], "rules": 0, "warnings": [],
                         "envoy_domains": ["edge2"]}  # fmt: skip
        assert service.envoy is not None
        assert set(service.envoy.domains) == {"edge2"}

        nothing = Service(no_rules(), AsyncMemoryStore())
        with pytest.raises(ConfigurationError, match="no file to reload, and no envoy config"):
            await nothing.reload()

    asyncio.run(main())
