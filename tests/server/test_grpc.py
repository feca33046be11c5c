"""ShouldRateLimit over a real grpc.aio server on a free loopback port, with the
health and reflection services."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ratewarden import AsyncMemoryStore
from ratewarden.server import Service
from ratewarden.server._grpc_server import METHOD, SERVICE_NAME, GrpcServer, messages

M = messages()
Call = Callable[..., Awaitable[Any]]


@asynccontextmanager
async def rls(
    rules: Path, envoy: Path | None = None, token: str | None = None
) -> AsyncIterator[tuple[Call, grpc.aio.Channel]]:
    service = Service(rules, AsyncMemoryStore(), envoy_files=() if envoy is None else (envoy,))
    server = GrpcServer(service, "127.0.0.1:0", token=token)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = channel.unary_unary(
                METHOD,
                request_serializer=M["RateLimitRequest"].SerializeToString,
                response_deserializer=M["RateLimitResponse"].FromString,
            )
            yield call, channel
    finally:
        await server.stop(0)


def request(domain: str, *descriptors: list[tuple[str, str]], hits: int = 0) -> Any:
    message = M["RateLimitRequest"](domain=domain, hits_addend=hits)
    for entries in descriptors:
        descriptor = message.descriptors.add()
        for key, value in entries:
            descriptor.entries.add(key=key, value=value)
    return message


LOGIN = [("remote_address", "203.0.113.7"), ("path", "/api/login"), ("method", "POST")]


def test_should_rate_limit_on_the_rules(rules_file: Path) -> None:
    async def main() -> None:
        async with rls(rules_file) as (call, _):
            answers = [await call(request("ratewarden", LOGIN)) for _ in range(4)]
        assert [a.overall_code for a in answers] == [1, 1, 1, 2]
        status = answers[3].statuses[0]
        assert status.code == 2
        assert status.current_limit.requests_per_unit == 3
        assert status.current_limit.unit == 2  # MINUTE
        assert status.current_limit.name == "login"
        assert status.limit_remaining == 0
        assert status.duration_until_reset.seconds >= 1
        headers = {h.key: h.value for h in answers[3].response_headers_to_add}
        assert headers["x-ratelimit-limit"] == "3"
        assert int(headers["retry-after"]) >= 1
        assert answers[0].statuses[0].limit_remaining == 2

    asyncio.run(main())


def test_hits_addend_and_per_descriptor_hits_addend(rules_file: Path) -> None:
    async def main() -> None:
        async with rls(rules_file) as (call, _):
            first = await call(request("ratewarden", LOGIN, hits=3))
            assert first.overall_code == 1
            assert first.statuses[0].limit_remaining == 0
            assert (await call(request("ratewarden", LOGIN))).overall_code == 2
            other = [("remote_address", "198.51.100.4"), *LOGIN[1:]]
            message = request("ratewarden", other)
            message.descriptors[0].hits_addend.value = 4
            assert (await call(message)).overall_code == 2  # 4 > 3: never admitted

    asyncio.run(main())


def test_envoy_config_domains(rules_file: Path, envoy_file: Path) -> None:
    async def main() -> None:
        async with rls(rules_file, envoy_file) as (call, _):
            ip = [("remote_address", "10.1.1.1")]
            answers = [await call(request("edge", ip, [("path", "/free")])) for _ in range(3)]
            assert [a.overall_code for a in answers] == [1, 1, 2]
            assert [s.code for s in answers[2].statuses] == [2, 1]
            assert answers[2].statuses[0].current_limit.requests_per_unit == 2
            blocked = await call(request("edge", [("path", "/blocked")]))
            assert blocked.overall_code == 2

    asyncio.run(main())


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (request("", LOGIN), "needs a domain"),
        (request("ratewarden"), "at least one descriptor"),
        (request("ratewarden", []), "at least one entry"),
        (request("ratewarden", *[LOGIN] * 65), "at most 64 descriptors"),
        (request("ratewarden", [("k", "v")] * 65), "at most 64 descriptors"),
    ],
)
def test_invalid_requests_get_invalid_argument(rules_file: Path, message: Any, words: str) -> None:
    async def main() -> None:
        async with rls(rules_file) as (call, _):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(message)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in (caught.value.details() or "")

    asyncio.run(main())


def test_different_per_descriptor_hits_addends_are_refused(rules_file: Path) -> None:
    async def main() -> None:
        message = request("ratewarden", LOGIN, [("user", "u")])
        message.descriptors[0].hits_addend.value = 2
        message.descriptors[1].hits_addend.value = 3
        async with rls(rules_file) as (call, _):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(message)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(main())


def test_bearer_token_in_metadata(rules_file: Path) -> None:
    async def main() -> None:
        async with rls(rules_file, token="t0k") as (call, _):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(request("ratewarden", LOGIN))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
            answer = await call(request("ratewarden", LOGIN),
                                metadata=(("authorization", "Bearer t0k"),))  # fmt: skip
            assert answer.overall_code == 1

    asyncio.run(main())


def test_health_and_reflection(rules_file: Path) -> None:
    async def main() -> None:
        async with rls(rules_file) as (_, channel):
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", SERVICE_NAME):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            asks = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME),
                # a method, which the descriptor pool does not index by itself
                reflection_pb2.ServerReflectionRequest(
                    file_containing_symbol=f"{SERVICE_NAME}.ShouldRateLimit"
                ),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.Such"),
            ]
            answers = [a async for a in stub.ServerReflectionInfo(iter(asks))]
        names = {s.name for s in answers[0].list_services_response.service}
        assert names >= {SERVICE_NAME, "grpc.health.v1.Health"}
        assert answers[1].file_descriptor_response.file_descriptor_proto
        assert answers[2].file_descriptor_response == answers[1].file_descriptor_response
        assert answers[3].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]

    asyncio.run(main())


def test_health_watchers_hear_the_drain_and_do_not_hold_it_up(rules_file: Path) -> None:
    async def main() -> None:
        server = GrpcServer(Service(rules_file, AsyncMemoryStore()), "127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            watch = health.Watch(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            first = await watch.read()
            loop = asyncio.get_running_loop()
            started = loop.time()
            stopping = asyncio.ensure_future(server.stop(10))
            rest = []
            while (answer := await watch.read()) is not grpc.aio.EOF:
                rest.append(answer)
            await asyncio.wait_for(stopping, 5)
            took = loop.time() - started
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        assert [a.status for a in rest] == [health_pb2.HealthCheckResponse.NOT_SERVING]
        assert took < 5  # not the 10 s grace: the watch ended with the drain

    asyncio.run(main())


def _openssl(*args: str, cwd: Path) -> None:
    import shutil  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    exe = shutil.which("openssl")
    if exe is None:
        pytest.fail("openssl is not installed (Debian: apt-get install openssl)")
    subprocess.run([exe, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_pki(tmp: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all ours."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.pem", "-days", "1", "-subj", "/CN=test-ca", cwd=tmp)  # fmt: skip
    (tmp / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", f"/CN={name}", cwd=tmp)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", "san.cnf",
                 cwd=tmp)  # fmt: skip


def test_mutual_tls(rules_file: Path, tmp_path: Path) -> None:
    from ratewarden.server._grpc_server import parse_tls  # noqa: PLC0415

    make_pki(tmp_path)
    tls = parse_tls(str(tmp_path / "server.pem"), str(tmp_path / "server.key"),
                    str(tmp_path / "ca.pem"))  # fmt: skip
    ca = (tmp_path / "ca.pem").read_bytes()

    async def main() -> None:
        server = GrpcServer(Service(rules_file, AsyncMemoryStore()), "127.0.0.1:0", tls=tls)
        await server.start()
        address = f"127.0.0.1:{server.port}"
        try:
            client = grpc.ssl_channel_credentials(
                ca, (tmp_path / "client.key").read_bytes(), (tmp_path / "client.pem").read_bytes()
            )
            async with grpc.aio.secure_channel(address, client) as channel:
                call = channel.unary_unary(
                    METHOD,
                    request_serializer=M["RateLimitRequest"].SerializeToString,
                    response_deserializer=M["RateLimitResponse"].FromString,
                )
                assert (await call(request("ratewarden", LOGIN))).overall_code == 1
            anonymous = grpc.ssl_channel_credentials(ca)  # no client certificate
            async with grpc.aio.secure_channel(address, anonymous) as channel:
                call = channel.unary_unary(
                    METHOD,
                    request_serializer=M["RateLimitRequest"].SerializeToString,
                    response_deserializer=M["RateLimitResponse"].FromString,
                )
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await call(request("ratewarden", LOGIN), timeout=5)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await server.stop(0)

    asyncio.run(main())


def test_tls_options_go_together() -> None:
    from ratewarden import ConfigurationError  # noqa: PLC0415
    from ratewarden.server._grpc_server import parse_tls  # noqa: PLC0415

    assert parse_tls(None, None, None) is None
    with pytest.raises(ConfigurationError, match="go together"):
        parse_tls("cert.pem", None, None)
    with pytest.raises(ConfigurationError, match="needs --grpc-cert"):
        parse_tls(None, None, "ca.pem")
