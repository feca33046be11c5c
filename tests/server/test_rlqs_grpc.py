"""StreamRateLimitQuotas over a real grpc.aio client and our HTTP/2 server: the
wire, the statuses for what a client gets wrong, and the bounds a hostile
client meets (floods of buckets, garbage, many streams)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from ratewarden import AsyncMemoryStore
from ratewarden.server import Service
from ratewarden.server._grpc_server import GrpcServer, messages
from ratewarden.server._rlqs import RLQS_METHOD
from tests.rlqs import ACME, API_RULES

M = messages()
Reports, Response = M["RateLimitQuotaUsageReports"], M["RateLimitQuotaResponse"]

RULES = API_RULES


@asynccontextmanager
async def served(tmp_path: Path, text: str = RULES) -> AsyncIterator[tuple[GrpcServer, Service]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    service = Service(rules, AsyncMemoryStore())
    server = GrpcServer(service, "127.0.0.1:0")
    await server.start()
    try:
        yield server, service
    finally:
        await server.stop(0)


def report(domain: str, *buckets: dict[str, str], allowed: int = 1, denied: int = 0) -> Any:
    message = Reports(domain=domain)
    for bucket in buckets:
        usage = message.bucket_quota_usages.add(
            num_requests_allowed=allowed, num_requests_denied=denied
        )
        usage.time_elapsed.seconds = 1
        for key, value in bucket.items():
            usage.bucket_id.bucket[key] = value
    return message


def stream(channel: grpc.aio.Channel, raw: bool = False) -> Any:
    return channel.stream_stream(
        RLQS_METHOD,
        request_serializer=(lambda b: b) if raw else Reports.SerializeToString,
        response_deserializer=Response.FromString,
    )


def test_a_report_gets_a_token_bucket_for_its_bucket_and_allow_all_elsewhere(
    tmp_path: Path,
) -> None:
    async def main() -> Any:
        async with (
            served(tmp_path) as (server, _),
            grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
        ):
            call = stream(channel)()
            await call.write(report("envoy", ACME, {"name": "web"}))
            answer = await call.read()
            await call.done_writing()
            return answer

    answer = asyncio.run(main())
    [limited, free] = answer.bucket_action
    assert dict(limited.bucket_id.bucket) == ACME
    assignment = limited.quota_assignment_action
    bucket = assignment.rate_limit_strategy.token_bucket
    # the first report asks for the whole total: alone, it gets it
    assert bucket.tokens_per_fill.value / bucket.fill_interval.seconds == 200
    assert bucket.fill_interval.seconds >= 1
    assert bucket.fill_interval.nanos == 0
    assert 1 <= bucket.max_tokens <= 10
    ttl = assignment.assignment_time_to_live
    assert 0 < ttl.seconds < 12
    assert ttl.nanos == 0
    assert dict(free.bucket_id.bucket) == {"name": "web"}
    assert free.quota_assignment_action.rate_limit_strategy.WhichOneof("strategy") == "blanket_rule"
    assert free.quota_assignment_action.rate_limit_strategy.blanket_rule == 0  # ALLOW_ALL


async def _status_of(server: GrpcServer, *messages: bytes) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = stream(channel, raw=True)()
        for message in messages:
            await call.write(message)
        await call.done_writing()
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return await call.code(), ""


@pytest.mark.parametrize(
    ("messages", "code", "says"),
    [
        ([b"\xff\xff\xff"], grpc.StatusCode.INVALID_ARGUMENT, "not a RateLimitQuotaUsageReports"),
        ([report("", ACME).SerializeToString()], grpc.StatusCode.INVALID_ARGUMENT, "domain"),
        (
            [report("envoy", ACME).SerializeToString(), report("other", ACME).SerializeToString()],
            grpc.StatusCode.INVALID_ARGUMENT,
            "new stream",
        ),
        (
            [report("envoy", {}).SerializeToString()],
            grpc.StatusCode.INVALID_ARGUMENT,
            "at least one",
        ),
        (
            [report("envoy", {f"k{i}": "v" for i in range(40)}).SerializeToString()],
            grpc.StatusCode.INVALID_ARGUMENT,
            "at most 32 entries",
        ),
        (
            [report("envoy", {"name": "api", "tenant": "x" * 2000}).SerializeToString()],
            grpc.StatusCode.INVALID_ARGUMENT,
            "at most 1024 characters",
        ),
    ],
    ids=["garbage", "no-domain", "domain-changes", "empty-bucket", "wide-bucket", "long-value"],
)
def test_what_a_client_gets_wrong_ends_the_stream_with_a_status(
    tmp_path: Path, messages: list[bytes], code: grpc.StatusCode, says: str
) -> None:
    async def main() -> tuple[grpc.StatusCode, str]:
        async with served(tmp_path) as (server, _):
            return await _status_of(server, *messages)

    got, details = asyncio.run(main())
    assert got == code
    assert says in details


def test_a_flood_of_buckets_on_one_stream_is_refused_past_its_share_of_the_bound(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[tuple[grpc.StatusCode, str], int, int]:
        async with served(tmp_path) as (server, service):
            flood = report("envoy", *({"name": "api", "tenant": f"t{i}"} for i in range(3000)))
            answer = await _status_of(server, flood.SerializeToString())
            stats = service.rules.quotas.stats
            return answer, stats.buckets, stats.streams

    (code, details), tracked, streams = asyncio.run(main())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 2500 buckets" in details
    assert streams == 0
    # what it held stays tracked until its assignments end, first to go past the bound
    assert tracked <= 2500


def test_a_stream_that_never_sends_holds_nothing_and_many_streams_stay_bounded(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[int, int, int]:
        async with served(tmp_path) as (server, service):
            quotas = service.rules.quotas
            # a channel of its own subchannel pool: one connection each
            own = [("grpc.use_local_subchannel_pool", 1)]
            target = f"127.0.0.1:{server.port}"
            channels = [grpc.aio.insecure_channel(target, options=own) for _ in range(64)]
            calls = [stream(ch)() for ch in channels for _ in range(16)]
            for call in calls[::2]:
                await call.write(report("envoy", ACME))
            answers = [await call.read() for call in calls[::2]]
            open_streams = quotas.stats.streams
            for call in calls:
                call.cancel()
            for ch in channels:
                await ch.close()
            for _ in range(100):
                if quotas.stats.streams == 0:
                    break
                await asyncio.sleep(0.02)
            return len(answers), open_streams, quotas.stats.streams

    answered, open_streams, left = asyncio.run(main())
    assert answered == 512
    assert open_streams == 1024
    assert left == 0  # every stream's state goes with it


def test_more_streams_on_one_connection_than_it_allows_are_refused(tmp_path: Path) -> None:
    """Made with grpc's sync client: grpc.aio reports a write that fails as the
    server ends the call as INTERNAL, overwriting the status the server sent
    (grpc/grpc#36066), and a refused call's first write races its refusal."""

    def calls(port: int) -> tuple[list[grpc.StatusCode], list[str]]:
        release = threading.Event()

        def requests() -> Iterator[Any]:
            yield report("envoy", ACME)
            release.wait(10)  # the stream stays open until every call is answered

        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            method = channel.stream_stream(
                RLQS_METHOD,
                request_serializer=Reports.SerializeToString,
                response_deserializer=Response.FromString,
            )
            answers = [method(requests()) for _ in range(20)]
            codes, said = [], []
            for answer in answers:
                try:
                    next(answer)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
                    said.append(f"{exc.code()}: {exc.details()}")
            release.set()
            for answer in answers:
                answer.cancel()
            return codes, said

    async def main() -> tuple[list[grpc.StatusCode], list[str]]:
        async with served(tmp_path) as (server, _):
            return await asyncio.to_thread(calls, server.port)

    codes, said = asyncio.run(main())
    assert codes.count(grpc.StatusCode.OK) == 16, said
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 4, said


def rate(answer: Any) -> float:
    [action] = answer.bucket_action
    strategy = action.quota_assignment_action.rate_limit_strategy
    if strategy.WhichOneof("strategy") == "blanket_rule":
        return 0.0 if strategy.blanket_rule == 1 else float("inf")
    bucket = strategy.token_bucket
    return float(bucket.tokens_per_fill.value / bucket.fill_interval.seconds)


def test_a_proxy_that_joins_is_given_its_share_at_once_by_the_first_giving_it_up(
    tmp_path: Path,
) -> None:
    """The first proxy holds the whole total; when a second reports, the first
    is sent a smaller assignment between its reports, and the second its share,
    without waiting for the first's next report (Envoy 1.40's are 5 s apart)."""

    async def main() -> tuple[list[float], list[float]]:
        async with served(tmp_path) as (server, _):
            own = [("grpc.use_local_subchannel_pool", 1)]
            target = f"127.0.0.1:{server.port}"
            async with (
                grpc.aio.insecure_channel(target, options=own) as one,
                grpc.aio.insecure_channel(target, options=own) as two,
            ):
                first, second = stream(one)(), stream(two)()
                await first.write(report("envoy", ACME))
                firsts = [rate(await first.read())]
                await second.write(report("envoy", ACME))
                seconds = [rate(await second.read())]
                firsts.append(rate(await asyncio.wait_for(first.read(), 5)))
                seconds.append(rate(await asyncio.wait_for(second.read(), 5)))
                first.cancel()
                second.cancel()
                return firsts, seconds

    firsts, seconds = asyncio.run(main())
    assert firsts == [200, 100]
    assert seconds == [0, 100]  # denied until the first gave up half, then its half


def test_the_outbox_sends_what_comes_while_it_sends_then_ends_when_closed() -> None:
    """What is put during a send goes out after it, the latest action a bucket;
    a close while a send is under way ends the drain once all is sent."""
    from ratewarden.rlqs import Action  # noqa: PLC0415
    from ratewarden.server._rlqs import _Outbox  # noqa: PLC0415

    sent: list[list[str]] = []
    outbox = _Outbox()

    class SlowCall:
        async def send(self, message: bytes) -> None:
            await asyncio.sleep(0.01)
            sent.append(message.decode().split(","))

    def encode(actions: list[Action]) -> bytes:
        return ",".join(f"{a.bucket[0][1]}:{a.kind}" for a in actions).encode()

    def action(tenant: str, kind: str = "assign") -> Action:
        return Action((("tenant", tenant),), kind)  # type: ignore[arg-type]

    async def main() -> None:
        drain = asyncio.ensure_future(outbox.drain(SlowCall(), encode))  # type: ignore[arg-type]
        outbox.put([action("a")])
        await asyncio.sleep(0.005)  # the first send is under way
        outbox.put([action("b"), action("c")])
        outbox.put([action("b", "abandon")])
        outbox.close()
        await asyncio.wait_for(drain, 1)

    asyncio.run(main())
    assert sent == [["a:assign"], ["c:assign", "b:abandon"]]
