"""The HTTP API's handlers, in process, under random input: bodies of any bytes,
JSON of any shape, deep nesting, numbers no machine type holds, random headers
for /auth, random paths and methods. Every answer is below 500, every 4xx says
what was wrong in ``{"error": ...}``, and nothing escapes the app (a server
would answer that with a 500)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from ratewarden import AsyncMemoryStore, FakeClock
from ratewarden.server import App, Service
from tests.fuzz import strategies as fz
from tests.fuzz.asgi import Answer, call
from tests.server.conftest import ENVOY, RULES

TOKEN = "fuzz-token"
BEARER = (b"authorization", f"Bearer {TOKEN}".encode())


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("fuzz-http")
    (tmp / "rules.yaml").write_text(RULES)
    (tmp / "edge.yaml").write_text(ENVOY)
    return tmp / "rules.yaml", tmp / "edge.yaml"


@pytest.fixture(scope="module")
def app(files: tuple[Path, Path]) -> App:
    rules, envoy = files
    return App(Service(rules, AsyncMemoryStore(), envoy_files=(envoy,)))


@pytest.fixture
def counting(files: tuple[Path, Path]) -> App:
    """A fresh app on a clock that never moves: counts start at zero and no
    window ends between two requests."""
    rules, envoy = files
    store = AsyncMemoryStore(clock=FakeClock(1_700_000_000))
    return App(Service(rules, store, envoy_files=(envoy,)))


@pytest.fixture(scope="module")
def secured(files: tuple[Path, Path]) -> App:
    rules, envoy = files
    return App(Service(rules, AsyncMemoryStore(), envoy_files=(envoy,)), token=TOKEN)


def answer(app: App, method: str, path: bytes, body: bytes = b"",
           headers: list[tuple[bytes, bytes]] | None = None) -> Answer:  # fmt: skip
    """The app's answer, checked."""
    result = asyncio.run(call(app, method, path, body=body, headers=headers))
    event(f"status {result.status}")
    assert result.status < 500, (result.status, result.body)
    if result.status in (401, 405):
        name = b"www-authenticate" if result.status == 401 else b"allow"
        assert result.header(name), result
    is_canned = path.startswith(b"/auth") and result.status == 429
    target = unquote(path.partition(b"?")[0].decode("ascii"))  # the scope's path
    if method == "HEAD" and target != "/auth":  # GET's answer without its body (/auth: its own)
        assert result.body == b"", result
    elif result.status >= 400 and not is_canned:  # a shadow ban's own body is not a Problem
        result.problem()
    return result


def _checked_decision(result: Answer) -> None:
    if result.status == 200:
        decision = json.loads(result.body)
        assert isinstance(decision["allowed"], bool), decision


@given(body=fz.bodies)
@example(body=b"")
@example(body=b"null")
@example(body=b'{"attributes": {}, "cost": 1e400}')
@example(body=b'{"attributes": {"user": "u"}, "cost": 18446744073709551616}')
@example(body=b'{"domain": "edge", "descriptors": [{"entries": []}]}')
def test_check_bodies(app: App, body: bytes) -> None:
    _checked_decision(answer(app, "POST", b"/v1/check", body))


@given(body=fz.bodies)
@example(body=b'{"checks": []}')
@example(body=b'{"checks": [' + b'{"attributes": {"user": "u"}},' * 1000 + b"{}]}")
def test_batch_bodies(app: App, body: bytes) -> None:
    result = answer(app, "POST", b"/v1/check/batch", body)
    if result.status == 200:
        assert isinstance(json.loads(result.body)["results"], list)


@given(body=fz.bodies, chunks=st.integers(1, 5))
def test_bodies_in_pieces(app: App, body: bytes, chunks: int) -> None:
    """A body in several messages, as a slow client sends it, reads as one."""
    whole = asyncio.run(call(app, "POST", b"/v1/check", body=body))
    pieces = asyncio.run(call(app, "POST", b"/v1/check", body=body, chunks=chunks))
    assert pieces.status == whole.status, (whole, pieces)


@given(method=fz.methods, headers=fz.headers)
@example(method="GET", headers=[(b"x-original-uri", b"/api/login?x=1"),
                                (b"x-original-method", b"POST")])  # fmt: skip
@example(method="GET", headers=[(b"x-forwarded-for", b"\xff, 10.0.0.1")])
def test_auth_headers(app: App, method: str, headers: list[tuple[bytes, bytes]]) -> None:
    result = answer(app, method, b"/auth", headers=headers)
    assert result.status in (200, 202, 400, 405, 429, 503) or 400 <= result.status < 500


@given(method=fz.methods, path=fz.raw_paths(), headers=fz.headers, body=st.binary(max_size=64))
def test_any_method_and_path(
    app: App, method: str, path: bytes, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    answer(app, method, path, body, headers)


@given(method=fz.methods, path=fz.raw_paths(), headers=fz.headers, bearer=st.booleans())
def test_any_request_with_a_token(
    secured: App, method: str, path: bytes, headers: list[tuple[bytes, bytes]], bearer: bool
) -> None:
    """With a token, every route but health answers 401 to a request without it;
    never an error."""
    answer(secured, method, path, b"", [*headers, BEARER] if bearer else headers)


@given(key=st.binary(min_size=1, max_size=30), query=st.binary(max_size=20))
@example(key=b"%ff%fe", query=b"rule=%ff")
@example(key=b"a/b", query=b"rule=nope")
def test_delete_any_key(app: App, key: bytes, query: bytes) -> None:
    escaped = "".join(f"%{b:02X}" for b in key).encode()
    result = answer(app, "DELETE", b"/v1/keys/" + escaped + b"?" + _escape(query))
    assert result.status in (200, 400, 404), result


def _escape(data: bytes) -> bytes:
    return "".join(chr(b) if chr(b).isalnum() or chr(b) in "=&" else f"%{b:02X}"
                   for b in data).encode()  # fmt: skip


# -- one input of each class that must be refused or counted apart ----------------


def _status(app: App, body: bytes, path: bytes = b"/v1/check") -> Answer:
    return asyncio.run(call(app, "POST", path, body=body))


DEEP = b"[" * 5000 + b"]" * 5000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (b"/v1/check", b'{"attributes": {"a": ' + DEEP + b"}}"),
        (b"/v1/check/batch", b'{"checks": [{"attributes": {"a": ' + DEEP + b"}}]}"),
    ],
    ids=["check", "batch"],
)
def test_deep_nesting_is_refused(app: App, path: bytes, body: bytes) -> None:
    result = _status(app, body, path)
    assert 400 <= result.status < 500
    result.problem()


def test_a_body_that_is_not_utf8_is_refused(app: App) -> None:
    result = _status(app, b'{"attributes": {"user": "\xff\xfe"}}')
    assert result.status == 400
    result.problem()


@pytest.mark.parametrize(
    "body",
    [
        b'{"attributes": {"user": "a", "user": "b"}}',
        b'{"attributes": {"user": "a"}, "attributes": {"user": "b"}}',
    ],
    ids=["attribute", "field"],
)
def test_duplicate_keys_are_refused(app: App, body: bytes) -> None:
    result = _status(app, body)
    assert 400 <= result.status < 500, result
    result.problem()


@pytest.mark.parametrize("value", [1, {"x": 1}, [1], True])
def test_a_non_string_attribute_is_not_the_string_key(counting: App, value: object) -> None:
    """``{"user": 1}`` is refused or counted apart from ``{"user": "1"}``."""
    text = str(value)
    for _ in range(10):  # per-user: 10/minute, spent by the string
        assert _status(counting, fz.dumps({"attributes": {"user": text}})).status == 200
    result = _status(counting, fz.dumps({"attributes": {"user": value}}))
    if result.status == 200:
        assert json.loads(result.body)["allowed"], f"{value!r} was counted as {text!r}"
    else:
        assert 400 <= result.status < 500
        result.problem()


def test_auth_reads_utf8_headers_as_the_api_does(counting: App) -> None:
    """X-User: jürgen (UTF-8, as gateways pass it) is the user "jürgen" of /v1/check."""
    for _ in range(10):  # per-user: 10/minute
        assert _status(counting, fz.dumps({"attributes": {"user": "jürgen"}})).status == 200
    headers = [(b"x-user", "jürgen".encode())]
    result = asyncio.run(call(counting, "GET", b"/auth", headers=headers))
    assert result.status == 429, result


# -- the same as properties: any input of the class -------------------------------


@given(body=fz.duplicate_bodies)
def test_any_duplicate_name_is_refused(app: App, body: bytes) -> None:
    path = b"/v1/check/batch" if body.startswith(b'{"checks"') else b"/v1/check"
    result = asyncio.run(call(app, "POST", path, body=body))
    assert 400 <= result.status < 500, (result.status, result.body[:200])
    result.problem()


@given(body=fz.not_utf8_bodies())
def test_any_body_that_is_not_utf8_is_refused(app: App, body: bytes) -> None:
    result = asyncio.run(call(app, "POST", b"/v1/check", body=body))
    # 400, or 422 when the decoder meets a wrong type before the bad bytes
    assert 400 <= result.status < 500, (result.status, result.body[:200])
    result.problem()


@given(check=fz.non_string_attributes())
def test_any_non_string_attribute_is_refused(app: App, check: dict[str, object]) -> None:
    result = asyncio.run(call(app, "POST", b"/v1/check", body=fz.dumps(check)))
    assert 400 <= result.status < 500, (result.status, result.body[:200])
    result.problem()


@pytest.fixture(autouse=True)
def _no_server_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Nothing the app logs at error level: an error it handled is still a defect."""
    yield
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors]
