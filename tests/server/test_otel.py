"""``ratewarden serve --otel`` as a real process, exporting to a real OTLP/HTTP
receiver started here on a free loopback port: the receiver decodes each body
as the protocol's ExportMetricsServiceRequest; the counts that arrive are those
``/metrics`` shows, labelled by rule, and no key is anywhere in them."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from ratewarden.fleet import Coordinator, QuotaConfig, set_quota
from ratewarden.primitives import ConfigurationError
from ratewarden.rules import LATENCY_BUCKETS
from ratewarden.server._otel import STOP_TIMEOUT, check_environment
from tests.redis_server import RedisServer, free_port
from tests.server.process import serving

KEY = "alice@example.com"  # the rule counts by it: it must never leave the process
QUOTA_DB = 10  # the Redis database of the fleet quotas' test, emptied first

RULES = """\
rules:
  - name: login
    rate: 2/minute
    algorithm: sliding_window_log  # no minute's edge among the checks: exact on the wall clock
    by: user
    match: {paths: /login}
"""


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP metrics endpoint: each POST /v1/metrics body, kept raw and decoded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[bytes] = []
        self.requests: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def points(self, name: str) -> list[tuple[dict[str, str], Any]]:
        """Every data point of the instrument ``name`` received so far, with its
        attributes, oldest first."""
        found = []
        with self.lock:
            requests = list(self.requests)
        for request in requests:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        if metric.name != name:
                            continue
                        kind = metric.WhichOneof("data")
                        assert kind is not None
                        data = getattr(metric, kind)
                        for point in data.data_points:
                            attributes = {a.key: a.value.string_value for a in point.attributes}
                            found.append((attributes, point))
        return found

    def last_by_rule(self, name: str) -> dict[str, int]:
        return {attributes["rule"]: point.as_int for attributes, point in self.points(name)}


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportMetricsServiceRequest.FromString(body)
        with self.server.lock:
            self.server.paths.append(self.path)
            self.server.bodies.append(body)
            self.server.requests.append(request)
        answer = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def check(url: str, user: str) -> bool:
    body = json.dumps({"attributes": {"path": "/login", "user": user}}).encode()
    with urllib.request.urlopen(f"{url}/v1/check", body, timeout=5) as answer:
        return bool(json.load(answer)["allowed"])


def until(condition: Any, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "no export arrived with the counts"
        time.sleep(0.05)


def test_serve_exports_the_counts_by_rule_to_an_otlp_receiver(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")  # milliseconds
    monkeypatch.setenv("OTEL_SERVICE_NAME", "warden-under-test")
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    with serving("--config", str(rules), "--otel", "--grpc", "off", tmp=tmp_path) as served:
        assert [check(served.url, KEY) for _ in range(5)] == [True, True, False, False, False]
        until(lambda: receiver.last_by_rule("ratewarden.over_limit") == {"login": 3})
        assert receiver.last_by_rule("ratewarden.checks") == {"login": 5}
        assert receiver.last_by_rule("ratewarden.near_limit") == {"login": 1}
        # the same numbers /metrics serves, which keeps working
        with urllib.request.urlopen(f"{served.url}/metrics", timeout=5) as answer:
            scraped = answer.read().decode()
        assert 'ratewarden_checks_total{rule="login"} 5.0' in scraped
        assert 'ratewarden_over_limit_total{rule="login"} 3.0' in scraped
        durations = [point for attributes, point in receiver.points("ratewarden.request.duration")
                     if attributes == {"endpoint": "check"}]  # fmt: skip
        assert durations
        # the histogram /metrics keeps, its bounds and counts, no minimum or maximum
        assert 'ratewarden_request_duration_seconds_count{endpoint="check"} 5.0' in scraped
        assert durations[-1].count == sum(durations[-1].bucket_counts) == 5
        assert tuple(durations[-1].explicit_bounds) == LATENCY_BUCKETS
        assert not durations[-1].HasField("min")
        assert served.terminate() == 0
    assert set(receiver.paths) == {"/v1/metrics"}
    resource = receiver.requests[-1].resource_metrics[0].resource
    names = {a.key: a.value.string_value for a in resource.attributes}
    assert names["service.name"] == "warden-under-test"
    # the key in no attribute, nor anywhere else in what left the process
    assert not any(KEY.encode() in body or b"alice" in body for body in receiver.bodies)


def test_serve_otel_without_the_extra_says_which_to_install(tmp_path: Path) -> None:
    """A finder that refuses opentelemetry stands for an installation without
    the otel extra: one line naming it, exit code 4, no traceback."""
    code = (
        "import sys\n"
        "class NoOtel:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, NoOtel())\n"
        "from ratewarden.cli import main\n"
        "sys.exit(main(['serve', '--demo', '--otel']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, check=False)  # fmt: skip
    assert done.returncode == 4
    assert done.stderr == ("ratewarden serve: --otel needs: pip install 'ratewarden[otel]'\n")


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "OTEL_METRICS_EXPORTER=prometheus"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}, "http/protobuf only"),
    ],
)
def test_an_exporter_the_extra_does_not_ship_is_refused(environ: dict[str, str], said: str) -> None:
    with pytest.raises(ConfigurationError, match=said):
        check_environment(environ)


def test_the_exporters_it_ships_are_taken() -> None:
    assert check_environment({}) == "otlp"
    assert check_environment({"OTEL_METRICS_EXPORTER": "console"}) == "console"
    assert check_environment({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) == "otlp"


def test_a_collector_that_does_not_answer_holds_the_stop_only_a_little(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    with serving("--demo", "--otel", "--grpc", "off", "--drain", "0", tmp=tmp_path) as served:
        assert check(served.url, KEY)
        time.sleep(0.5)  # an export or two refused meanwhile
        started = time.monotonic()
        assert served.terminate() == 0
        # the exporter alone would retry for 10 s (OTEL_EXPORTER_OTLP_TIMEOUT)
        assert time.monotonic() - started < 8 > STOP_TIMEOUT + 2


def value_of(point: Any) -> float:
    return float(point.as_double if point.HasField("as_double") else point.as_int)


def test_serve_exports_the_fleet_quotas_in_its_redis(
    tmp_path: Path, receiver: Receiver, redis_single: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gauges read what a task on the event loop last read from Redis."""
    with redis.Redis(port=redis_single.port, db=QUOTA_DB) as client:
        client.flushdb()
        set_quota(client, "push-api", QuotaConfig("2000/second", "equal", lease=30))
        coordinator = Coordinator(client, "push-api")
        coordinator.refresh("host-a", wants=1_200_000, has=0, used=0)
        coordinator.refresh("host-b", wants=300_000, has=0, used=250_000)
        coordinator.refresh("host-a", wants=1_200_000, has=1_000_000, used=990_000)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
    monkeypatch.delenv("OTEL_METRICS_EXPORTER", raising=False)
    store = f"redis://127.0.0.1:{redis_single.port}/{QUOTA_DB}"
    with serving("--config", str(rules), "--otel", "--grpc", "off", "--store", store,
                 "--store-timeout", "2", tmp=tmp_path) as served:  # fmt: skip

        def gauges(name: str) -> dict[str, float]:
            return {a["resource"]: value_of(p) for a, p in receiver.points(name)}

        until(lambda: gauges("ratewarden.quota.total") == {"push-api": 2000.0})
        assert gauges("ratewarden.quota.members") == {"push-api": 2.0}
        assert gauges("ratewarden.quota.granted") == {"push-api": 1000.0}
        assert gauges("ratewarden.quota.wants") == {"push-api": 1500.0}
        assert served.terminate() == 0
