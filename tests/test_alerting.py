"""examples/alerting: the Prometheus rules pass promtool's checks and unit tests,
and the rules and the Grafana dashboard ask only for series that a running
``ratewarden serve`` exports, by the names and labels it gives them.

promtool comes with Debian's ``prometheus`` package, which ``./dev test`` installs;
without it these tests fail, they never skip."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.server.process import serving

ALERTING = Path(__file__).parent.parent / "examples" / "alerting"
ALERTS = ALERTING / "ratewarden-alerts.yml"
ALERT_TESTS = ALERTING / "ratewarden-alerts.test.yml"
DASHBOARD = ALERTING / "ratewarden-dashboard.json"

# Labels Prometheus gives every scraped series; `up` is its own series per target.
TARGET_LABELS = frozenset({"job", "instance"})
PROMETHEUS_SERIES = {"up": TARGET_LABELS}


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail(
            "promtool is not installed: `./dev test` installs it (Debian's prometheus package, "
            "its ensure_promtool)"
        )
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", ())


def dashboard_exprs(board: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every query."""
    return [(panel["title"], target["expr"], target.get("legendFormat", ""))
            for panel in panels(board) for target in panel.get("targets", ())]  # fmt: skip


def as_promql(expr: str) -> str:
    """A dashboard's expression with Grafana's variables put in: the interval
    ones as a duration, the others (only ever inside label matchers) as a regex."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


# -- what a live service exports --------------------------------------------

RULES = textwrap.dedent("""
    version: 1
    defaults:
      algorithm: fixed_window
    rules:
      - name: login
        rate: 4/minute
        by: ip
        match: {paths: /api/login}
      - name: watched
        rate: 1/minute
        action: log_only
        match: {paths: /api/watched}
""")

EDGE = textwrap.dedent("""
    domain: edge
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
""")

Exported = dict[str, dict[str, set[str]]]  # series name -> label -> values seen


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """Scrape a real ``ratewarden serve`` after traffic that makes every
    labelled series appear: denials, near-limit, shadow denials, envoy
    descriptors (of a known domain and an unknown one) and both reload results."""
    tmp = tmp_path_factory.mktemp("alerting")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    (tmp / "edge.yaml").write_text(EDGE)
    args = ["--config", str(rules), "--envoy-config", str(tmp / "edge.yaml"),
            "--envoy-reload-interval", "0"]  # fmt: skip
    with serving(*args, tmp=tmp) as served, httpx.Client(base_url=served.url) as client:

        def check(body: dict[str, Any]) -> None:
            answer = client.post("/v1/check", json=body)
            assert answer.status_code == 200, answer.text

        for _ in range(6):
            check({"attributes": {"path": "/api/login", "ip": "192.0.2.1"}})
        for _ in range(3):
            check({"attributes": {"path": "/api/watched", "ip": "192.0.2.1"}})
        for domain in ("edge", "edge", "nowhere"):
            check({"domain": domain, "descriptors": [{"entries": [{"key": "user", "value": "a"}]}]})
        assert client.post("/v1/reload").status_code == 200
        rules.write_text("rules: [oops]\n")
        assert client.post("/v1/reload").is_client_error
        text = client.get("/metrics").text
    series: Exported = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = series.setdefault(sample.name, {})
            for label, value in sample.labels.items():
                labels.setdefault(label, set()).add(value)
    return series


# -- a small reader of PromQL: the series an expression selects --------------

_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<range>\[[^\]]*\])
      | (?P<number>\d[\w.]*)
      | (?P<ident>[A-Za-z_:][\w:]*)
      | (?P<space>\s+)
      | (?P<op>=~|!~|!=|==|<=|>=|.)""",
    re.VERBOSE,
)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
                 "quantile", "count_values", "group"}  # fmt: skip


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]]  # label, operator, value


@dataclass
class Query:
    selectors: list[Selector] = field(default_factory=list)
    groupings: list[tuple[str, list[str]]] = field(default_factory=list)  # keyword, labels
    aggregates: bool = False


def parse(expr: str) -> Query:
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr) if m.lastgroup != "space"]
    query = Query()
    i = 0

    def upto(closing: str) -> list[tuple[str | None, str]]:
        nonlocal i
        inside = []
        i += 1
        while tokens[i][1] != closing:
            inside.append(tokens[i])
            i += 1
        return inside

    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if kind == "ident" and text in _GROUPING and following == "(":
            i += 1
            labels = [t for k, t in upto(")") if k == "ident"]
            query.groupings.append((text, labels))
        elif kind == "ident" and (following == "(" or text in _AGGREGATIONS):
            query.aggregates |= text in _AGGREGATIONS  # `sum by (x) (...)` or a function
        elif kind == "ident" and text not in _KEYWORDS:
            selector = Selector(text, [])
            if following == "{":
                i += 1
                inside = [t for t in upto("}") if t[1] != ","]
                for j in range(0, len(inside), 3):
                    (_, label), (_, op), (_, value) = inside[j : j + 3]
                    selector.matchers.append((label, op, value[1:-1]))
            query.selectors.append(selector)
        i += 1
    return query


def output_labels(query: Query) -> set[str]:
    """The labels an expression's result keeps, roughly: those of its ``by``
    clauses, none after an aggregation without one, else its series' labels."""
    by = [set(labels) for keyword, labels in query.groupings if keyword == "by"]
    if by:
        return set.intersection(*by) - {"le"}
    if query.aggregates:
        return set()
    return set(TARGET_LABELS).union(*(m[0] for s in query.selectors for m in s.matchers))


def unknown_series(expr: str, exported: Exported) -> list[str]:
    """What in ``expr`` names a series, label or label value the service does not export."""
    query = parse(expr)
    problems = []
    known_labels = set(TARGET_LABELS)
    for selector in query.selectors:
        labels = exported.get(selector.name)
        own = PROMETHEUS_SERIES.get(selector.name)
        if labels is None and own is None:
            problems.append(f"no series {selector.name!r} on /metrics")
            continue
        names = set(own or ()) | set(labels or {}) | TARGET_LABELS
        known_labels |= names
        for label, op, value in selector.matchers:
            if label not in names:
                problems.append(f"{selector.name} has no label {label!r}")
            elif op == "=" and label in (labels or {}) and value not in (labels or {})[label]:
                problems.append(f"{selector.name} never has {label}={value!r}")
    problems += [f"{keyword} ({label}): no series here has that label"
                 for keyword, grouping in query.groupings
                 for label in sorted(set(grouping) - known_labels)]  # fmt: skip
    if not query.selectors:
        problems.append("selects no series")
    return problems


# -- promtool ---------------------------------------------------------------


def test_promtool_accepts_the_alert_rules() -> None:
    done = promtool("check", "rules", ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_the_alert_rules_unit_tests_pass() -> None:
    done = promtool("test", "rules", ALERT_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_dashboard_queries_are_promql(tmp_path: Path) -> None:
    """promtool parses each query, given as a recording rule."""
    exprs = dashboard_exprs(dashboard())
    records = [{"record": f"dashboard:query_{n}", "expr": as_promql(expr)}
               for n, (_, expr, _) in enumerate(exprs)]  # fmt: skip
    rules = tmp_path / "dashboard.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    done = promtool("check", "rules", rules)
    assert done.returncode == 0, done.stdout + done.stderr


# -- against what the service exports --------------------------------------


def test_every_alert_is_complete() -> None:
    rules = alert_rules()
    assert {"RatewardenRuleDenyingMuch", "RatewardenStoreErrors", "RatewardenRuleNearLimit",
            "RatewardenDown"} <= {r["alert"] for r in rules}  # fmt: skip
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_the_alert_rules_use_only_exported_series(exported: Exported) -> None:
    problems = []
    for rule in alert_rules():
        name, expr = rule["alert"], rule["expr"]
        problems += [f"{name}: {p}" for p in unknown_series(expr, exported)]
        keeps = output_labels(parse(expr))
        for text in rule["annotations"].values():
            for label in set(re.findall(r"\$labels\.(\w+)", text)) - keeps:
                problems.append(f"{name}: annotations use $labels.{label}, the result has {keeps}")
    assert not problems, "\n".join(problems)


def test_the_dashboard_uses_only_exported_series(exported: Exported) -> None:
    board = dashboard()
    problems = []
    for title, expr, legend in dashboard_exprs(board):
        query = as_promql(expr)
        problems += [f"{title}: {p}" for p in unknown_series(query, exported)]
        keeps = output_labels(parse(query))
        for label in set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)) - keeps:
            problems.append(f"{title}: legend uses {{{{{label}}}}}, the result has {keeps}")
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
        assert found is not None, variable["definition"]
        selector, label = found.groups()
        name = variable["name"]
        problems += [f"${name}: {p}" for p in unknown_series(as_promql(selector), exported)]
        if label not in TARGET_LABELS | set(exported[parse(selector).selectors[0].name]):
            problems.append(f"${name}: no label {label!r}")
    assert not problems, "\n".join(problems)


def test_the_dashboard_is_importable() -> None:
    board = dashboard()
    assert board["schemaVersion"] >= 36
    assert board["uid"]
    assert board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    queried = [panel for panel in panels(board) if panel["type"] != "row"]
    assert len(queried) >= 10
    for panel in queried:
        assert panel["targets"], panel["title"]
        for source in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
            assert source == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    exprs = " ".join(expr for _, expr, _ in dashboard_exprs(board))
    shown = (
        "ratewarden_checks_total",
        "ratewarden_over_limit_total",
        "ratewarden_shadow_over_limit_total",
        "ratewarden_near_limit_total",
        "ratewarden_store_errors_total",
        "ratewarden_request_duration_seconds_bucket",
    )
    for name in shown:
        assert name in exprs, f"no panel shows {name}"


def test_the_reader_finds_a_wrong_name(exported: Exported) -> None:
    """The checks above are only as good as `unknown_series`: it must see a
    misspelt metric, label and label value, and a grouping by a missing label."""
    assert unknown_series("sum by (rule) (rate(ratewarden_check_total[5m]))", exported) == [
        "no series 'ratewarden_check_total' on /metrics",
        "by (rule): no series here has that label",
    ]
    assert unknown_series('rate(ratewarden_checks_total{rules="login"}[5m])', exported) == [
        "ratewarden_checks_total has no label 'rules'"
    ]
    assert unknown_series('ratewarden_config_reloads_total{result="fail"}', exported) == [
        "ratewarden_config_reloads_total never has result='fail'"
    ]
    assert unknown_series("sum by (endpoint) (ratewarden_store_errors_total)", exported) == [
        "by (endpoint): no series here has that label"
    ]
    assert unknown_series('up{job="ratewarden"} == 0', exported) == []
