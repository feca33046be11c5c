"""Hypothesis generators for the fuzz tests, in one place: request bodies and
JSON shapes, headers, paths and methods for the HTTP API; rule and envoy files
(random YAML, structured nonsense, mutations of valid files); RateLimitRequest
messages for the gRPC service."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml
from hypothesis import assume
from hypothesis import strategies as st

from ratewarden.rules import dump
from tests.fuzz.protobuf import Descriptor, Request, length_delimited, tag, unsigned, varint
from tests.rules import strategies as rs
from tests.rules.strategies import rule_files
from tests.server.conftest import RULES

# -- weighting ----------------------------------------------------------------------

# sampled_from draws its index about evenly (st.integers favours its bounds), and
# shrinks towards the first item: a failing example shrinks towards the usual case
_one_in_20 = st.sampled_from([False] * 19 + [True])


def mostly(
    usual: st.SearchStrategy[Any], other: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[Any]:
    """``usual`` 19 times in 20, else ``other`` (anything YAML holds): input wrong
    in one or two places gets past the first check to the later ones."""
    return _one_in_20.flatmap(
        lambda odd: (yaml_values if other is None else other) if odd else usual
    )


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# -- JSON ------------------------------------------------------------------------

texts = st.text(max_size=20)
# numbers JSON can carry but no int64 or double holds, beside ordinary ones
huge_ints = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**400, -(10**400)])
numbers = st.one_of(
    st.integers(-(2**70), 2**70), huge_ints, st.floats(allow_nan=True, allow_infinity=True)
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)
    ),
    max_leaves=12,
)
# the names front ends give attributes, and some nobody gives
attribute_names = st.one_of(
    st.sampled_from(
        ["path", "method", "ip", "user", "api_key", "org", "plan", "headers", "body_size", "domain"]
    ),
    texts,
)


@st.composite
def check_shapes(draw: st.DrawFn) -> dict[str, Any]:
    """A check request, mostly of the right shape with odd values (so that it
    reaches the rules), now and then wrong anywhere."""
    check: dict[str, Any] = {}
    form = draw(
        mostly(st.sampled_from(["attributes", "descriptors"]), st.sampled_from(["both", "neither"]))
    )
    if form in ("attributes", "both"):
        values = mostly(
            st.one_of(texts, st.sampled_from(["/api/login", "POST", "10.0.0.1"])), json_values
        )
        headers = st.dictionaries(texts, values, max_size=3)
        check["attributes"] = draw(
            mostly(
                st.dictionaries(attribute_names, values, max_size=5)
                | st.fixed_dictionaries({"headers": headers}, optional={"ip": values}),
                json_values,
            )
        )
    if form in ("descriptors", "both"):
        check["domain"] = draw(mostly(st.sampled_from(["ratewarden", "edge"]), json_values))
        entry = st.fixed_dictionaries(
            {"key": mostly(attribute_names, json_values), "value": mostly(texts, json_values)}
        )
        descriptor = st.fixed_dictionaries(
            {"entries": mostly(st.lists(entry, max_size=3), json_values)}
        )
        check["descriptors"] = draw(mostly(st.lists(descriptor, max_size=3), json_values))
    if draw(st.booleans()):
        check["cost"] = draw(mostly(st.integers(1, 5), json_values))
    if draw(mostly(st.just(False), st.just(True))):
        check[draw(texts)] = draw(json_values)
    return check


def dumps(value: object) -> bytes:
    """JSON as a client would send it; NaN and Infinity come out as JSON does
    not allow them, which is one more way to be wrong."""
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with a few bytes deleted, inserted or changed."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(out)))
        how = draw(st.sampled_from(["delete", "insert", "replace"]))
        new = draw(st.binary(min_size=1, max_size=3))
        if how == "delete":
            del out[at : at + len(new)]
        elif how == "insert":
            out[at:at] = new
        else:
            out[at : at + len(new)] = new
    return bytes(out)


def _objects(value: object) -> int:
    """How many non-empty objects ``value`` holds, itself included."""
    if isinstance(value, dict):
        return bool(value) + sum(_objects(v) for v in value.values())
    if isinstance(value, list):
        return sum(_objects(v) for v in value)
    return 0


def _with_duplicate(value: object, target: int, seen: list[int]) -> str:
    """JSON of ``value`` in which the ``target``-th non-empty object (document
    order) has its first name written twice, the first time with null."""
    if isinstance(value, dict):
        parts = [f"{json.dumps(k, ensure_ascii=False)}: {_with_duplicate(v, target, seen)}"
                 for k, v in value.items()]  # fmt: skip
        if value:
            if seen[0] == target:
                parts.insert(0, f"{json.dumps(next(iter(value)), ensure_ascii=False)}: null")
            seen[0] += 1
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_with_duplicate(v, target, seen) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@st.composite
def duplicated(draw: st.DrawFn, value: Any) -> bytes:
    """``value`` as JSON with a name twice in one of its objects, any one."""
    count = _objects(value)
    if not count:
        value, count = {"attributes": value}, 1 + _objects(value)
    target = draw(st.integers(0, count - 1))
    return _with_duplicate(value, target, [0]).encode("utf-8", "surrogatepass")


def nested(depth: int, opener: bytes = b"[", closer: bytes = b"]") -> bytes:
    return opener * depth + closer * depth


checks = check_shapes().map(dumps)
batches = st.one_of(
    st.lists(check_shapes(), max_size=4).map(lambda c: dumps({"checks": c})),
    json_values.map(lambda v: dumps({"checks": v})),
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(dumps),
    checks,
    batches,
    checks.flatmap(mutated),
    batches.flatmap(mutated),
    check_shapes().flatmap(duplicated),
    st.integers(1, 3000).map(lambda depth: b'{"attributes": {"a": ' + nested(depth) + b"}}"),
    st.integers(1, 2000).map(
        lambda n: b'{"attributes": {"user": "u"}, "cost": 1' + b"0" * n + b"}"
    ),
)

# One class of wrong input each, for the properties the app's known defects break.
duplicate_bodies = st.one_of(
    check_shapes().flatmap(duplicated),
    st.lists(check_shapes(), min_size=1, max_size=3).flatmap(lambda c: duplicated({"checks": c})),
)
_MARK = "\ue000"  # a private-use character: where the bytes go


@st.composite
def not_utf8_bodies(draw: st.DrawFn) -> bytes:
    """A check whose JSON holds bytes that are not UTF-8: inside a string (where
    only a UTF-8 check can catch them) or anywhere."""
    user = draw(texts) + _MARK + draw(texts)
    body = dumps({"attributes": {"user": user, "path": draw(texts)}})
    bad = draw(
        st.one_of(
            st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]),
            st.binary(min_size=1, max_size=4).filter(lambda b: not _is_utf8(b)),
        )
    )
    if draw(st.booleans()):
        return body.replace(_MARK.encode(), bad)
    at = draw(st.integers(0, len(body)))
    out = body[:at] + bad + body[at:]
    assume(not _is_utf8(out))  # bytes put inside a character may complete it
    return out


@st.composite
def non_string_attributes(draw: st.DrawFn) -> dict[str, Any]:
    """A check with one attribute that is neither a string nor null (nor, for
    ``headers``, an object of strings)."""
    attributes = draw(st.dictionaries(attribute_names, texts, max_size=3))
    name = draw(attribute_names)
    value = draw(
        st.one_of(
            st.booleans(),
            numbers,
            st.lists(json_values, max_size=3),
            st.dictionaries(texts, json_values, max_size=3),
        )
    )
    if (
        name == "headers"
        and isinstance(value, dict)
        and all(isinstance(v, str) for v in value.values())
    ):
        value = [value]
    attributes[name] = value
    return {"attributes": attributes}


# -- HTTP: methods, paths, headers -------------------------------------------------

methods = mostly(
    st.sampled_from(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]),
    st.one_of(
        st.sampled_from(["CONNECT", "PROPFIND", "get"]),
        st.from_regex(r"[A-Z]{1,12}", fullmatch=True),
    ),
)
known_paths = st.sampled_from(
    [
        "/v1/check",
        "/v1/check/batch",
        "/v1/rules",
        "/v1/reload",
        "/v1/keys/",
        "/auth",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/",
        "",
    ]
)


@st.composite
def raw_paths(draw: st.DrawFn) -> bytes:
    """A request target as it comes on the wire (ASCII, %-escaped): a known path,
    maybe with a tail, or anything; escapes may hide bytes that are not UTF-8."""
    head = draw(known_paths)
    tail = draw(
        st.one_of(
            st.just(""),
            texts.map(lambda t: quote(t, safe="/?=&")),
            st.binary(max_size=8).map(lambda b: "".join(f"%{c:02X}" for c in b)),
        )
        if head in ("", "/", "/v1/keys/") or draw(st.booleans())
        else st.just("")
    )
    return (head + tail).encode("ascii")


header_names = st.one_of(
    st.sampled_from(
        [
            b"x-original-uri",
            b"x-forwarded-uri",
            b"x-original-method",
            b"x-forwarded-method",
            b"x-api-key",
            b"x-user",
            b"x-org",
            b"x-plan",
            b"x-forwarded-host",
            b"x-forwarded-for",
            b"forwarded",
            b"content-type",
            b"authorization",
        ]
    ),
    st.binary(min_size=1, max_size=12).map(bytes.lower),
)
header_values = st.one_of(
    st.binary(max_size=40),
    texts.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            b"/api/login",
            b"POST",
            b"203.0.113.7",
            b"1.2.3.4, 10.0.0.1",
            b"for=1.2.3.4",
            b"j\xc3\xbcrgen",
            b"j\xfcrgen",
            b"\xff\xfe",
        ]
    ),
)
headers = st.lists(st.tuples(header_names, header_values), max_size=8)

# -- rule files ------------------------------------------------------------------

yaml_scalars = st.one_of(
    st.none(),
    st.booleans(),
    numbers,
    texts,
    st.sampled_from(
        [
            "5/minute",
            "0/second",
            "-1/minute",
            "1e400/second",
            "5/0hours",
            "10 per second",
            "1/1000000000000years",
            "/api/*",
            "{id}",
            "[ab",
            "token_bucket",
            "gcra",
            "delay",
            "shadow_ban",
            "fail_open",
            "ip",
            "header:",
            "header:x-y",
            "::1",
            "10.0.0.0/33",
            "unix",
            "",
        ]
    ),
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(texts, children, max_size=4)
    ),
    max_leaves=6,
)
wild_rates = st.sampled_from(
    [
        "0/second",
        "-1/minute",
        "1e400/second",
        "5/0hours",
        "5/-2hours",
        "99999999999999999999/second",
        "1/99999999999999999999days",
        "1/0.000000001seconds",
        "nan/second",
        "5 per",
        "/",
        "5/",
    ]
)
wild_paths = st.sampled_from(
    [
        "/a/{x}/{x}",
        "/**",
        "[",
        "/a/*b*",
        "{",
        "}",
        "/a/{}",
        "/{x",
        "a",
        "",
        "/api/login?x",
        "/%zz",
        "/a//b",
        "/a/*/",
        "/\\",
    ]
)
big_ints = st.one_of(st.integers(-5, 5), st.integers(-(2**70), 2**70))
RULE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "description": texts,
    "group": st.one_of(rs.names, st.just("")),
    "priority": big_ints,
    "by": rs.one_or_many(st.one_of(rs.who, st.sampled_from(["header:", "header:a b", "9"]))),
    "match": st.fixed_dictionaries(
        {},
        optional={
            "paths": rs.one_or_many(st.one_of(rs.paths, wild_paths)),
            "methods": rs.one_or_many(st.one_of(rs.methods, st.sampled_from(["", "G E T"]))),
            "attributes": st.dictionaries(
                rs.attribute_names, rs.one_or_many(rs.values), max_size=2
            ),
        },
    ),
    "global": st.booleans(),
    "algorithm": st.sampled_from(
        [
            "fixed_window",
            "sliding_window_log",
            "token_bucket",
            "sliding_window_counter",
            "leaky_bucket",
            "gcra",
            "nope",
        ]
    ),
    "burst": big_ints,
    "refill": st.sampled_from(["continuous", "interval"]),
    "cost": st.one_of(
        big_ints,
        st.fixed_dictionaries({"attribute": rs.attribute_names}, optional={"default": big_ints}),
    ),
    "action": st.sampled_from(["reject", "log_only", "delay", "shadow_ban"]),
    "status": st.one_of(st.sampled_from([429, 503, 200, 99, 600]), big_ints),
    "max_wait": st.one_of(st.floats(), big_ints),
    "response": st.fixed_dictionaries(
        {},
        optional={
            "status": st.one_of(st.sampled_from([200, 202, 99, 600]), big_ints),
            "body": texts,
            "headers": st.dictionaries(texts, texts, max_size=2),
        },
    ),
    "on_failure": st.sampled_from(["fail_open", "fail_closed"]),
}


@st.composite
def rule_shapes(draw: st.DrawFn) -> dict[str, Any]:
    """A rule with the right field names, each value nearly always of the right
    kind and now and then of any type and size."""
    rule: dict[str, Any] = {
        "name": draw(mostly(rs.names)),
        "rate": draw(mostly(rs.one_or_many(st.one_of(rs.rates, wild_rates)))),
    }
    for name in draw(st.lists(st.sampled_from(sorted(RULE_FIELDS)), max_size=5, unique=True)):
        rule[name] = draw(mostly(RULE_FIELDS[name]))
    return rule


@st.composite
def rule_file_shapes(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {"rules": draw(mostly(st.lists(rule_shapes(), min_size=1, max_size=4)))}
    if draw(st.booleans()):
        data["defaults"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "algorithm": mostly(RULE_FIELDS["algorithm"]),
                    "on_failure": mostly(RULE_FIELDS["on_failure"]),
                },
            )
        )
    if draw(st.booleans()):
        data["client_ip"] = draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "trusted_proxies": mostly(
                        st.lists(
                            st.one_of(
                                rs.proxies,
                                st.sampled_from(["unix", "10.0.0.0/33", "::g", "1.2.3.4/8"]),
                            ),
                            max_size=3,
                        )
                    ),
                    "header": mostly(
                        st.sampled_from(["x-forwarded-for", "forwarded", "x-real-ip"])
                    ),
                },
            )
        )
    if draw(st.booleans()):
        data["version"] = draw(mostly(st.just(1)))
    return data


def to_yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


@st.composite
def line_mutations(draw: st.DrawFn, text: str) -> str:
    """A valid file broken the way hands break files: a line dropped, doubled,
    moved, re-indented or cut, a token replaced."""
    lines = text.splitlines(keepends=True) or [""]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(lines) - 1))
        how = draw(
            st.sampled_from(
                ["drop", "double", "swap", "indent", "dedent", "cut", "token", "insert"]
            )
        )
        line = lines[at]
        if how == "drop" and len(lines) > 1:
            del lines[at]
        elif how == "double":
            lines.insert(at, line)
        elif how == "swap":
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif how == "indent":
            lines[at] = " " * draw(st.integers(1, 4)) + line
        elif how == "dedent":
            lines[at] = line.lstrip(" ")
        elif how == "cut":
            lines[at] = line[: draw(st.integers(0, len(line)))]
        elif how == "token":
            key, sep, _ = line.partition(":")
            if sep:
                lines[at] = f"{key}: {to_yaml(draw(yaml_scalars)).splitlines()[0]}\n"
        else:
            lines.insert(at, draw(st.text(max_size=30)) + "\n")
    return "".join(lines)


valid_rule_texts = rule_files().map(dump)
# hand-written files, comments and flow style included (and cheaper to draw)
_ROOT = Path(__file__).resolve().parents[2]
written_rule_texts = st.sampled_from(
    [RULES, (_ROOT / "examples" / "rules.yaml").read_text(),
     (_ROOT / "examples" / "gateways" / "rules.yaml").read_text()]
)  # fmt: skip
rule_texts = st.one_of(
    st.text(max_size=200),
    yaml_values.map(to_yaml),
    rule_file_shapes().map(to_yaml),
    written_rule_texts.flatmap(line_mutations),
    written_rule_texts.flatmap(lambda t: mutated(t.encode()).map(lambda b: b.decode("latin-1"))),
)
rule_bytes = st.one_of(
    st.binary(max_size=200),
    written_rule_texts.flatmap(lambda t: mutated(t.encode())),
)


@st.composite
def envoy_shapes(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    """A node of an envoy config: the right field names, values mostly right."""
    units = st.sampled_from(
        ["second", "minute", "hour", "day", "month", "year", "week", "SECOND", "fortnight"]
    )
    rate_limit = st.fixed_dictionaries(
        {},
        optional={
            "unit": mostly(units),
            "requests_per_unit": mostly(st.integers(-5, 10**20)),
            "unlimited": mostly(st.booleans()),
            "name": mostly(texts),
            "replaces": mostly(st.lists(st.fixed_dictionaries({"name": texts}), max_size=2)),
        },
    )
    optional: dict[str, st.SearchStrategy[Any]] = {
        "value": mostly(
            st.one_of(
                texts,
                st.sampled_from(["/api*", "*", "a*b", ""]),
                st.integers(),
                st.booleans(),
                st.floats(),
            )
        ),
        "rate_limit": mostly(rate_limit),
        "shadow_mode": mostly(st.booleans()),
        "detailed_metric": mostly(st.booleans()),
    }
    if depth < 2:
        optional["descriptors"] = mostly(st.lists(envoy_shapes(depth + 1), max_size=3))
    key = mostly(st.sampled_from(["remote_address", "path", "user", "k", ""]))
    return draw(st.fixed_dictionaries({"key": key}, optional=optional))


VALID_ENVOY = """\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /blocked
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: path
    value: "/api*"
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5, name: per-user}
  - key: path
    value: /free
    rate_limit: {unlimited: true}
"""
envoy_texts = st.one_of(
    st.text(max_size=200),
    yaml_values.map(to_yaml),
    st.fixed_dictionaries(
        {
            "domain": mostly(st.sampled_from(["edge", "e.f", ""])),
            "descriptors": mostly(st.lists(envoy_shapes(), max_size=4)),
        }
    ).map(to_yaml),
    line_mutations(VALID_ENVOY),
)

# -- gRPC: RateLimitRequest bytes --------------------------------------------------

utf8_texts = st.text(st.characters(codec="utf-8"), max_size=20).map(str.encode)
not_utf8 = st.one_of(
    st.binary(min_size=1, max_size=12).filter(lambda b: not _is_utf8(b)),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3).map(
        lambda t: t.encode("utf-8", "surrogatepass")
    ),
)
descriptor_keys = mostly(
    st.one_of(
        st.sampled_from([b"remote_address", b"path", b"method", b"user", b"api_key", b"domain"]),
        utf8_texts,
    ),
    not_utf8,
)
descriptor_values = mostly(
    st.one_of(
        st.sampled_from([b"/api/login", b"POST", b"203.0.113.7", b"/blocked", b"/free", b""]),
        utf8_texts,
        # a big value costs nothing to draw: one letter repeated
        st.integers(1, 70_000).map(lambda n: b"v" * n),
    ),
    st.one_of(not_utf8, st.integers(1, 70_000).map(lambda n: b"\xff" * n)),
)
uint64s = st.one_of(st.integers(0, 10), st.integers(0, 2**64 - 1))


@st.composite
def descriptors(draw: st.DrawFn) -> Descriptor:
    entries = draw(
        mostly(
            st.lists(st.tuples(descriptor_keys, descriptor_values), min_size=1, max_size=6),
            # none, or far more than allowed
            st.one_of(st.just([]), st.integers(60, 1000).map(lambda n: [(b"user", b"u")] * n)),
        )
    )
    return Descriptor(
        entries,
        hits_addend=draw(mostly(st.none(), uint64s)),
        override=draw(st.one_of(st.none(), st.tuples(uint64s, st.integers(0, 10)))),
    )


garbage = st.one_of(
    st.binary(min_size=1, max_size=16),
    st.tuples(st.integers(4, 40), st.binary(max_size=8)).map(
        lambda nb: length_delimited(nb[0], nb[1])
    ),
    st.tuples(st.integers(4, 40), uint64s).map(lambda nv: unsigned(*nv)),
    st.integers(1, 5).map(lambda n: tag(n, 2) + varint(2**31)),  # a length past the end
)


@st.composite
def rls_requests(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """A RateLimitRequest's bytes, and how many descriptors it holds (None when
    garbage was added or the message cut short, and nobody can say). Mostly a
    request of the right shape with odd content, so that most reach the rules."""
    request = Request(
        domain=draw(mostly(st.sampled_from([b"ratewarden", b"edge"]), descriptor_keys)),
        descriptors=draw(
            mostly(
                st.lists(descriptors(), min_size=1, max_size=5),
                # none, or more than allowed
                st.one_of(
                    st.just([]),
                    st.integers(60, 200).map(lambda n: [Descriptor([(b"path", b"/")])] * n),
                ),
            )
        ),
        hits_addend=draw(mostly(st.integers(0, 3), uint64s.map(lambda n: n % 2**32))),
        extra=draw(mostly(st.just(b""), garbage)),
    )
    data = request.encode()
    count: int | None = len(request.descriptors) if not request.extra else None
    if draw(mostly(st.just(False), st.just(True))):  # a message cut short
        data = data[: draw(st.integers(0, len(data)))]
        count = None
    return data, count
