"""The HTTP API through its ASGI app: checks, batches, admin, /auth, bad input."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.server import auth_attributes
from ratewarden.server._shapes import BAD_COST
from tests.server.conftest import client_for, make_app

LOGIN = {"attributes": {"method": "POST", "path": "/api/login", "ip": "203.0.113.7"}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_check_allows_then_rejects_exactly_at_the_limit(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answers = [(await client.post("/v1/check", json=LOGIN)).json() for _ in range(4)]
        assert [a["allowed"] for a in answers] == [True, True, True, False]
        assert [a["remaining"] for a in answers[:3]] == [2, 1, 0]
        denied = answers[3]
        assert denied["action"] == "reject"
        assert denied["status"] == 429
        assert denied["rule"] == "login"
        assert denied["retry_after"] > 0
        assert denied["headers"]["X-RateLimit-Limit"] == "3"
        assert int(denied["headers"]["Retry-After"]) >= 1

    run(main())


def test_cost_counts_one_check_as_several(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            first = (await client.post("/v1/check", json={**LOGIN, "cost": 3})).json()
            second = (await client.post("/v1/check", json=LOGIN)).json()
            too_big = (await client.post("/v1/check", json={**LOGIN, "cost": 4})).json()
        assert first["allowed"]
        assert first["remaining"] == 0
        assert not second["allowed"]
        assert too_big["allowed"] is False

    run(main())


def test_a_rule_status_shadow_ban_and_log_only(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            search = {"attributes": {"path": "/api/search", "user": "u"}}
            answers = [(await client.post("/v1/check", json=search)).json() for _ in range(3)]
            assert answers[2]["status"] == 503
            comment = {"attributes": {"path": "/api/comments", "method": "POST", "user": "u"}}
            await client.post("/v1/check", json=comment)
            banned = (await client.post("/v1/check", json=comment)).json()
            assert banned["action"] == "shadow_ban"
            assert banned["status"] == 202
            assert banned["body"] == "queued"
            assert banned["headers"]["x-queued"] == "yes"
            watched = {"attributes": {"path": "/api/watched"}}
            shadows = [(await client.post("/v1/check", json=watched)).json() for _ in range(5)]
            assert all(s["allowed"] for s in shadows)  # log_only never denies
            assert shadows[4]["shadow"] == {"allowed": False, "rule": shadows[4]["shadow"]["rule"]}

    run(main())


def test_descriptors_of_the_rules_domain_become_attributes(rules_file: Path) -> None:
    async def main() -> None:
        request = {
            "domain": "ratewarden",
            "descriptors": [
                {"entries": [{"key": "remote_address", "value": "198.51.100.1"}]},
                {"entries": [{"key": "path", "value": "/api/login"},
                             {"key": "method", "value": "POST"}]},
            ],
        }  # fmt: skip
        async with client_for(make_app(rules_file)) as client:
            answers = [(await client.post("/v1/check", json=request)).json() for _ in range(4)]
        assert [a["allowed"] for a in answers] == [True, True, True, False]
        statuses = answers[3]["statuses"]
        assert len(statuses) == 2
        assert statuses[0]["code"] == "OVER_LIMIT"
        assert statuses[0]["requests_per_unit"] == 3
        assert statuses[0]["unit_seconds"] == 60

    run(main())


def test_descriptors_of_an_envoy_domain(rules_file: Path, envoy_file: Path) -> None:
    def request(*entries: tuple[str, str]) -> dict[str, Any]:
        items = [{"entries": [{"key": k, "value": v}]} for k, v in entries]
        return {"domain": "edge", "descriptors": items}

    async def main() -> None:
        async with client_for(make_app(rules_file, envoy_file)) as client:
            ip = request(("remote_address", "10.0.0.1"), ("path", "/free"))
            answers = [(await client.post("/v1/check", json=ip)).json() for _ in range(3)]
            assert [a["allowed"] for a in answers] == [True, True, False]
            assert [s["code"] for s in answers[2]["statuses"]] == ["OVER_LIMIT", "OK"]
            assert answers[2]["statuses"][0]["limit"] == "edge.remote_address"
            blocked = (await client.post("/v1/check", json=request(("path", "/blocked")))).json()
            assert blocked["allowed"] is False
            # a domain no file names has no limits, as with envoy's service
            for _ in range(3):
                unknown = await client.post("/v1/check", json={**ip, "domain": "nowhere"})
                assert unknown.status_code == 200
                assert unknown.json()["allowed"] is True
                assert [s["code"] for s in unknown.json()["statuses"]] == ["OK", "OK"]

    run(main())


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"", 400, "needs a JSON body"),
        (b"[]", 422, "Expected `object`"),
        # one message for a bad cost, whatever refuses it
        (b'{"attributes": {}, "cost": "x"}', 422, f'{BAD_COST}, got "x"'),
        (b'{"attributes": {}, "cost": 2.5}', 422, f"{BAD_COST}, got 2.5"),
        (b'{"attributes": {}, "cost": 0}', 422, f"{BAD_COST}, got 0"),
        (b'{"attributes": {}, "cost": true}', 422, f"{BAD_COST}, got true"),
        (b'{"attributes": {}, "cost": 4294967296}', 422, f"{BAD_COST}, got 4294967296"),
        (b'{"attributes": {}, "cost": 1e400}', 422, BAD_COST),
        (b'{"attributes": {}, "surprise": 1}', 422, "unknown field"),
        (b"{}", 400, "give attributes, or a domain"),
        (b'{"domain": "ratewarden"}', 400, "give attributes, or a domain"),
        (b'{"domain": "ratewarden", "descriptors": []}', 422, "length >= 1"),
        (b'{"domain": "ratewarden", "descriptors": [{"entries": []}]}', 422, "length >= 1"),
        (b'{"attributes": {}, "domain": "x", "descriptors": [{"entries": [{"key": "a", '
         b'"value": "b"}]}]}', 400, "not both"),
    ],
)  # fmt: skip
def test_bad_input_is_a_4xx_with_a_message(
    rules_file: Path, body: bytes, status: int, words: str
) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.post("/v1/check", content=body)
        assert answer.status_code == status, answer.text
        assert words in answer.json()["error"]

    run(main())


@pytest.mark.parametrize(
    ("attributes", "words"),
    [
        ({"user": 42}, "attribute 'user' must be a string (or null), got a number"),
        ({"user": ["a"]}, "attribute 'user' must be a string (or null), got an array"),
        ({"method": 7}, "attribute 'method' must be a string (or null), got a number"),
        ({"plan": True}, "attribute 'plan' must be a string (or null), got a boolean"),
        ({"user": {"a": "b"}}, "attribute 'user' must be a string (or null), not an object"),
        ({"user": {"a": 1}}, "attribute 'user' must be a string (or null), got an object"),
        ({"headers": "no"}, "attribute 'headers' must be an object of strings"),
        ({"headers": {"x-a": 1}}, "attribute 'headers': 'x-a' must be a string, got a number"),
    ],
)
def test_attributes_other_than_strings_are_refused_by_name(
    rules_file: Path, attributes: dict[str, Any], words: str
) -> None:
    """Turned into text for a key, 42 would count with "42" and ["a"] with "['a']"."""

    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.post("/v1/check", json={"attributes": attributes})
            batch = await client.post("/v1/check/batch", json={"checks": [
                LOGIN, {"attributes": attributes}]})  # fmt: skip
        assert answer.status_code == 422, answer.text
        assert words in answer.json()["error"]
        assert batch.status_code == 422, batch.text
        assert f"checks[1]: {words}" in batch.json()["error"]

    run(main())


def test_a_number_and_its_text_never_share_a_counter(rules_file: Path) -> None:
    async def main() -> None:
        search: dict[str, object] = {"path": "/api/search"}
        async with client_for(make_app(rules_file)) as client:
            for _ in range(2):  # search: 2/minute by user
                text = await client.post("/v1/check", json={"attributes": {**search, "user": "42"}})
                assert text.json()["allowed"]
            number = await client.post("/v1/check", json={"attributes": {**search, "user": 42}})
            text = await client.post("/v1/check", json={"attributes": {**search, "user": "42"}})
            null = await client.post("/v1/check", json={"attributes": {**search, "user": None}})
        assert number.status_code == 422
        assert text.json()["allowed"] is False
        assert null.status_code == 200  # null: no user, so the per-user rules do not apply
        assert null.json()["rule"] is None

    run(main())


@pytest.mark.parametrize(
    ("body", "name"),
    [
        (b'{"attributes": {"user": "a", "user": "b"}}', "user"),
        (b'{"attributes": {"user": "a"}, "attributes": {"user": "b"}}', "attributes"),
        (b'{"attributes": {"user": "a", "\\u0075ser": "b"}}', "user"),  # an escaped twin
        (b'{"attributes": {"ip": "::1", "ip": "::2"}}', "ip"),  # colons in the values
        (b'{"attributes": {"headers": {"x-a": "1", "x-a": "2"}}}', "x-a"),
        (b'{"attributes": {"user": "a"}, "cost": 1, "cost": 3}', "cost"),
        (b'{"domain": "ratewarden", "descriptors": [{"entries": [{"key": "a", "value": "b",'
         b' "value": "c"}]}]}', "value"),
    ],
)  # fmt: skip
def test_a_name_twice_in_one_object_is_refused(rules_file: Path, body: bytes, name: str) -> None:
    """A proxy in front that reads the first of two names would judge another
    request than the one counted here, which (msgspec) would read the last."""

    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.post("/v1/check", content=body)
            batch = await client.post("/v1/check/batch", content=b'{"checks": [' + body + b"]}")
            one = b'{"attributes": {"user": "u"}}'
            twice = await client.post(
                "/v1/check/batch", content=b'{"checks": [' + one + b'], "checks": [' + one + b"]}"
            )
        for refused in (answer, batch):
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"] == (
                f"malformed JSON: the name {name!r} appears twice in one object"
            )
        assert twice.json()["error"].endswith("the name 'checks' appears twice in one object")

    run(main())


@pytest.mark.parametrize(
    "body",
    [
        b'{"attributes": {"ip": "::1", "path": "/a:b"}}',  # colons inside strings
        b'{"attributes": {"ip": "1.2.3.4"}, "cost": 1}',  # a default, sent
        b'{"attributes": {"user": "a\\"b:c"}, "domain": null}',  # escapes and a null
        b'{"domain": "ratewarden", "descriptors": [{"entries": [{"key": "a", "value": "b"}]},'
        b' {"entries": [{"key": "a", "value": "b"}]}]}',  # the same names in other objects
    ],
)  # fmt: skip
def test_the_same_name_in_different_objects_is_fine(rules_file: Path, body: bytes) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.post("/v1/check", content=body)
            batch = await client.post(
                "/v1/check/batch", content=b'{"checks": [' + body + b", " + body + b"]}"
            )
        assert answer.status_code == 200, answer.text
        assert batch.status_code == 200, batch.text

    run(main())


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"attributes": {"user": ' + b"[" * 1000 + b"]" * 1000 + b"}}", 422,
         "got `array` - at `$.attributes[...]`"),
        (b'{"attributes": {"user": ' + b'{"a":' * 10_000 + b'"x"' + b"}" * 10_000 + b"}}", 422,
         "Expected `str`"),
        (b'{"attributes": {"headers": ' + b'{"a":' * 10_000 + b'"x"' + b"}" * 10_000 + b"}}", 422,
         "Expected `str`"),
        (b"[" * 100_000 + b"]" * 100_000, 422, "Expected `object`"),
        (b'{"attributes": {"user": "\xff\xfe"}}', 400, "malformed JSON: not UTF-8"),
        (b'{"attributes": {"\xc3": "x"}}', 400, "malformed JSON: not UTF-8"),
        (b'{"\xff": 1}', 400, "malformed JSON: not UTF-8"),
    ],
)  # fmt: skip
def test_deep_nesting_and_bad_utf8_are_4xx_never_5xx(
    rules_file: Path, body: bytes, status: int, words: str
) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, max_body=1 << 20)) as client:
            answer = await client.post("/v1/check", content=body)
            batch = await client.post("/v1/check/batch", content=b'{"checks": [' + body + b"]}")
        assert answer.status_code == status, answer.text
        assert words in answer.json()["error"]
        assert batch.status_code == status, batch.text

    run(main())


def test_huge_bodies_are_refused_before_they_are_read(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, max_body=2048)) as client:
            answer = await client.post("/v1/check", content=b" " * 4096)
            assert answer.status_code == 413
            batch = {"checks": [LOGIN] * 2000}
            answer = await client.post("/v1/check/batch", json=batch)
            assert answer.status_code == 413

    run(main())


def test_unknown_routes_and_methods(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            assert (await client.get("/nope")).status_code == 404
            assert (await client.get("/v1/check")).status_code == 405
            assert (await client.get("/v1/keys/abc")).status_code == 405

    run(main())


def test_batch_checks_in_order(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.post("/v1/check/batch", json={"checks": [LOGIN] * 4})
            assert answer.status_code == 200
            results = answer.json()["results"]
            assert [r["allowed"] for r in results] == [True, True, True, False]
            bad = {"checks": [LOGIN, {"attributes": {"path": "/"}, "cost": 2.5}]}
            answer = await client.post("/v1/check/batch", json=bad)
            assert answer.status_code == 422
            assert answer.json()["error"] == f"checks[1]: {BAD_COST}, got 2.5"
            too_many = await client.post("/v1/check/batch", json={"checks": [{}] * 1001})
            assert too_many.status_code in (413, 422)

    run(main())


def test_rules_reload_and_key_reset(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            rules = (await client.get("/v1/rules")).json()
            assert [r["name"] for r in rules["rules"]][:2] == ["login", "per-user"]
            for _ in range(3):
                await client.post("/v1/check", json=LOGIN)
            assert not (await client.post("/v1/check", json=LOGIN)).json()["allowed"]
            reset = await client.delete("/v1/keys/203.0.113.7", params={"rule": "login"})
            assert reset.json() == {"key": "203.0.113.7", "limits_reset": 1}
            assert (await client.post("/v1/check", json=LOGIN)).json()["allowed"]
            nope = await client.delete("/v1/keys/x", params={"rule": "nope"})
            assert nope.status_code == 404
            escaped = await client.delete("/v1/keys/a%252Fb%2Fu", params={"rule": "login"})
            assert escaped.json()["key"] == "a%2Fb/u"  # decoded once, as sent

            rules_file.write_text(rules_file.read_text().replace("3/minute", "5/minute"))
            reloaded = await client.post("/v1/reload")
            assert reloaded.status_code == 200
            assert reloaded.json()["rules"] == 5
            answer = (await client.post("/v1/check", json=LOGIN)).json()
            assert answer["limit"] == 5

            rules_file.write_text("rules: [{name: broken}]")
            failed = await client.post("/v1/reload")
            assert failed.status_code == 422
            assert "the rules in force stay" in failed.json()["error"]
            assert (await client.post("/v1/check", json=LOGIN)).json()["limit"] == 5

    run(main())


def test_auth_endpoint_for_gateways(rules_file: Path) -> None:
    headers = {"X-Original-URI": "/api/login?next=/", "X-Original-Method": "POST",
               "X-Forwarded-For": "192.0.2.9"}  # fmt: skip

    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answers = [await client.get("/auth", headers=headers) for _ in range(4)]
            other = await client.get("/auth", headers={**headers, "X-Forwarded-For": "192.0.2.10"})
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        assert answers[0].headers["x-ratelimit-remaining"] == "2"
        assert int(answers[3].headers["retry-after"]) >= 1
        assert answers[3].headers["x-ratelimit-remaining"] == "0"
        assert "login" in answers[3].json()["error"]
        assert other.status_code == 200  # the trusted proxy's X-Forwarded-For is the key

    run(main())


def test_auth_attributes_from_traefik_headers() -> None:
    headers = [(b"x-forwarded-uri", b"/a/b?c=d"), (b"x-forwarded-method", b"PUT"),
               (b"x-api-key", b"k1"), (b"x-forwarded-for", b"1.2.3.4")]  # fmt: skip
    attributes = auth_attributes(headers, "127.0.0.1")
    assert attributes["path"] == "/a/b"
    assert attributes["method"] == "PUT"
    assert attributes["api_key"] == "k1"
    assert attributes["ip"] == "127.0.0.1"
    assert attributes["headers"] == {
        "x-forwarded-uri": "/a/b?c=d", "x-forwarded-method": "PUT", "x-api-key": "k1",
        "x-forwarded-for": "1.2.3.4",
    }  # fmt: skip


def test_bearer_token(rules_file: Path) -> None:
    async def main() -> None:
        good = {"Authorization": "Bearer s3cret"}
        async with client_for(make_app(rules_file, token="s3cret")) as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
            refused = await client.post("/v1/check", json=LOGIN)
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"].startswith("Bearer")
            wrong = {"Authorization": "Bearer nope"}
            assert (await client.post("/v1/check", json=LOGIN, headers=wrong)).status_code == 401
            assert (await client.post("/v1/check", json=LOGIN, headers=good)).status_code == 200
            lower = {"Authorization": "bearer s3cret"}  # the scheme is case-insensitive
            assert (await client.post("/v1/check", json=LOGIN, headers=lower)).status_code == 200
            other = {"Authorization": "Basic s3cret"}
            assert (await client.post("/v1/check", json=LOGIN, headers=other)).status_code == 401
            assert (await client.get("/metrics")).status_code == 401
            assert (await client.get("/auth")).status_code == 401
            assert (await client.post("/v1/reload", headers=good)).status_code == 200
        async with client_for(make_app(rules_file, token="s3cret", open_checks=True)) as client:
            assert (await client.post("/v1/check", json=LOGIN)).status_code == 200
            assert (await client.get("/auth")).status_code == 200
            assert (await client.post("/v1/reload")).status_code == 401
            assert (await client.delete("/v1/keys/a")).status_code == 401

    run(main())


def test_metrics_per_rule_with_bounded_labels(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            for _ in range(4):
                await client.post("/v1/check", json=LOGIN)
            for _ in range(5):
                await client.post("/v1/check", json={"attributes": {"path": "/api/watched"}})
            await client.post("/v1/reload")
            text = (await client.get("/metrics")).text
        assert 'ratewarden_checks_total{rule="login"} 4.0' in text
        assert 'ratewarden_over_limit_total{rule="login"} 1.0' in text
        # 3/minute: 80% used from the third admitted request on (remaining 0)
        assert 'ratewarden_near_limit_total{rule="login"} 1.0' in text
        assert 'ratewarden_shadow_over_limit_total{rule="watched"} 1.0' in text
        assert 'ratewarden_config_reloads_total{result="ok"} 1.0' in text
        assert 'ratewarden_request_duration_seconds_count{endpoint="check"} 9.0' in text
        assert "203.0.113.7" not in text  # never a key in a label

    run(main())


def test_readyz_says_when_the_store_is_unreachable(rules_file: Path) -> None:
    from ratewarden.server import App, Service  # noqa: PLC0415
    from ratewarden.stores.redis import AsyncRedisStore  # noqa: PLC0415
    from tests.redis_server import free_port  # noqa: PLC0415

    async def main() -> None:
        store = AsyncRedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout=0.2)
        async with client_for(App(Service(rules_file, store))) as client:
            answer = await client.get("/readyz")
            assert answer.status_code == 503
            assert "store unreachable" in answer.json()["status"]
            checked = await client.post("/v1/check", json=LOGIN)  # login fails open
            assert checked.json()["degraded"] is True
        await store.aclose()

    run(main())


def test_openapi_lists_every_route(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            document = (await client.get("/openapi.json")).json()
        assert set(document["paths"]) == {
            "/v1/check", "/v1/check/batch", "/v1/rules", "/v1/reload", "/v1/keys/{key}",
            "/v1/quotas", "/v1/quotas/{name}", "/v1/overrides", "/v1/overrides/{rule}",
            "/v1/events", "/auth", "/healthz", "/readyz", "/metrics", "/openapi.json", "/",
            "/v1/load/{signal}", "/v1/acquire", "/v1/release", "/v1/renew", "/v1/settle",
        }  # fmt: skip
        json.dumps(document)
        # and every API route the app has, with its method, so none goes undocumented
        app = make_app(rules_file)
        paths = document["paths"]
        for method, path in app._routes:
            if path.startswith("/v1/"):
                assert method.lower() in paths[path], (method, path)
        for prefix, method, *_ in app._prefixed:
            assert any(p.startswith(prefix) and method.lower() in paths[p] for p in paths), prefix

    run(main())


def test_the_app_ignores_other_scopes(rules_file: Path) -> None:
    app = make_app(rules_file)
    sent: list[Any] = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> Any:
        return next(messages)

    async def send(message: Any) -> None:
        sent.append(message)

    run(app({"type": "lifespan"}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    _ = httpx


def test_a_store_error_is_a_503_not_a_crash(rules_file: Path) -> None:
    """Rule limits fail open or closed, but a store error that reaches the app
    anyway (a bug, a store of someone else's) is answered, counted and logged."""
    from ratewarden import AsyncMemoryStore, StoreUnavailable  # noqa: PLC0415
    from ratewarden.server import App, Service  # noqa: PLC0415

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis: connection refused")

    async def main() -> None:
        service = Service(rules_file, AsyncMemoryStore())
        service.checker.check_attributes = broken  # type: ignore[method-assign]
        app = App(service)
        async with client_for(app) as client:
            answer = await client.post("/v1/check", json=LOGIN)
            assert answer.status_code == 503
            assert answer.json()["error"] == "store unavailable: redis: connection refused"
            assert (await client.get("/auth")).status_code == 503
            metrics = (await client.get("/metrics")).text
        assert "ratewarden_store_errors_total 2.0" in metrics

    run(main())


def test_auth_shadow_ban_never_lets_the_request_through(rules_file: Path) -> None:
    """A gateway sends any 2xx from /auth on to the backend: a shadow-banned
    request is answered 429 with the rule's body, no rate-limit headers."""
    headers = {"X-Original-URI": "/api/comments", "X-Original-Method": "POST", "X-User": "u"}

    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answers = [await client.get("/auth", headers=headers) for _ in range(2)]
        assert answers[0].status_code == 200
        assert answers[1].status_code == 429
        assert answers[1].text == "queued"
        assert answers[1].headers["x-queued"] == "yes"
        assert not any(name.startswith(("x-ratelimit", "ratelimit", "retry-after"))
                       for name in answers[1].headers)  # fmt: skip

    run(main())


def test_a_batch_with_a_bad_check_counts_nothing(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            bad = {"checks": [LOGIN, LOGIN, {"attributes": {"path": "/"}, "cost": 2.5}]}
            assert (await client.post("/v1/check/batch", json=bad)).status_code == 422
            first = (await client.post("/v1/check", json=LOGIN)).json()
            assert first["remaining"] == first["limit"] - 1  # the batch counted nothing

    run(main())


def test_auth_reads_identity_headers_as_utf8_as_json_is_read(rules_file: Path) -> None:
    """One name is one counter, whether a gateway sends it to /auth or a client
    to /v1/check (Latin-1 would make "José" two)."""

    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            sent = await client.get("/auth", headers={b"X-User": "José".encode()})
            checked = await client.post("/v1/check", json={"attributes": {"user": "José"}})
            reset = await client.delete("/v1/keys/Jos%C3%A9", params={"rule": "per-user"})
            again = await client.post("/v1/check", json={"attributes": {"user": "José"}})
        assert sent.status_code == 200
        assert sent.headers["x-ratelimit-remaining"] == "9"
        assert checked.json()["remaining"] == 8  # the same counter as /auth's
        assert reset.json() == {"key": "José", "limits_reset": 1}
        assert again.json()["remaining"] == 9

    run(main())


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ([(b"x-user", b"\xe9")], "X-User is not valid UTF-8"),
        ([(b"x-api-key", b"\xff\xfe")], "X-Api-Key is not valid UTF-8"),
        ([(b"x-original-uri", b"/a\xc3")], "X-Original-Uri is not valid UTF-8"),
        ([(b"x-user", b"a"), (b"x-user", b"b")], "X-User is given more than once"),
    ],
)
def test_auth_refuses_identity_headers_it_cannot_read_one_way(
    rules_file: Path, headers: list[tuple[bytes, bytes]], words: str
) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.get("/auth", headers=headers)
            other = await client.get(
                "/auth", headers=[(b"x-something", b"\xe9"), (b"x-user", b"u")]
            )
        assert answer.status_code == 400
        assert answer.json()["error"] == words
        assert other.status_code == 200  # a header no attribute comes from: as it is

    run(main())


def test_auth_attributes_join_a_header_sent_on_several_lines() -> None:
    headers = [(b"x-forwarded-for", b"203.0.113.1"), (b"x-forwarded-for", b"198.51.100.2"),
               (b"x-other", b"\xe9t\xe9")]  # fmt: skip
    attributes = auth_attributes(headers, "127.0.0.1")
    assert attributes["headers"] == {
        "x-forwarded-for": "203.0.113.1, 198.51.100.2",  # RFC 9110: one list, every hop
        "x-other": "été",  # not UTF-8, and no attribute: kept as Latin-1
    }


def test_a_key_to_reset_is_utf8(rules_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file)) as client:
            answer = await client.delete("/v1/keys/%FF")
        assert answer.status_code == 400
        assert "UTF-8" in answer.json()["error"]

    run(main())


def test_a_limit_override_over_http(rules_file: Path, envoy_file: Path) -> None:
    async def main() -> None:
        async with client_for(make_app(rules_file, envoy_file)) as client:
            body = {"domain": "edge", "descriptors": [{
                "entries": [{"key": "remote_address", "value": "10.7.0.1"}],
                "limit": {"requests_per_unit": 4, "unit": "hour"}}]}  # fmt: skip
            answers = [(await client.post("/v1/check", json=body)).json() for _ in range(5)]
            assert [a["allowed"] for a in answers] == [True] * 4 + [False]
            assert answers[0]["statuses"][0]["requests_per_unit"] == 4
            assert answers[0]["statuses"][0]["unit_seconds"] == 3600
            body["descriptors"][0]["limit"]["unit"] = "fortnight"  # type: ignore[index]
            assert (await client.post("/v1/check", json=body)).status_code == 422
            body["descriptors"][0]["limit"] = {"requests_per_unit": 2.5, "unit": "hour"}  # type: ignore[index]
            half = await client.post("/v1/check", json=body)
            assert half.status_code == 400
            assert "whole number" in half.json()["error"]

    run(main())
