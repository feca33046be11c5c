"""AsyncRedisStore on one server sends its checks over a connection of its own
(stores/redis/_wire.py), not through redis-py's pipeline: what redis-py did for the
pipeline (AUTH, SELECT, TLS, reconnecting, timeouts, error replies) must hold on
it too."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.utils
import uvloop
from redis.asyncio.connection import Connection, ConnectionPool

from ratewarden import AsyncLimiter, Decision, Limiter, StoreUnavailable
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from ratewarden.stores.redis._async_wire import usable
from ratewarden.stores.redis.connection import QUIET
from tests.redis_server import LIVE, RedisServer, free_port, redis_server

Run = Callable[[Coroutine[Any, Any, None]], None]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Both loops: ``ratewarden serve`` runs on uvloop, whose transports differ."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


def name() -> str:
    return f"w{uuid.uuid4().hex[:8]}"


def no_pipelines(store: AsyncRedisStore) -> None:
    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError("a check went through redis-py's pipeline")

    store.client.pipeline = refuse


async def until_healthy(limiter: AsyncLimiter, key: str) -> tuple[list[Decision], Decision]:
    """Hit until a decision comes from Redis again (the breaker may hold calls back
    for its cooldown): the degraded decisions on the way, and the first good one."""
    degraded = []
    async with asyncio.timeout(30):
        while (decision := await limiter.hit(key)).degraded:
            degraded.append(decision)
            await asyncio.sleep(0.02)
    return degraded, decision


def test_a_url_store_on_one_server_bypasses_the_pipeline(
    redis_single: RedisServer, run: Run
) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            no_pipelines(store)
            limiter = AsyncLimiter("50/hour", store=store, name=name())
            decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(60)))
            assert sum(d.allowed for d in decisions) == 50
            assert "connected" in repr(store._batcher.wire)
            await store.client.script_flush()  # NOSCRIPT on the wire: loaded, sent again
            assert (await limiter.peek("k")).remaining == 0

    run(main())


def test_a_client_passed_in_keeps_its_pipelines(redis_single: RedisServer, run: Run) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(port=redis_single.port)
        async with AsyncRedisStore(client, timeout=LIVE) as store:
            assert store._batcher.wire is None  # the store opens no connection of its own
            assert (await AsyncLimiter("5/hour", store=store, name=name()).hit("k")).allowed
        await client.aclose()

    run(main())


def test_it_reconnects_after_the_server_drops_it(redis_single: RedisServer, run: Run) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            limiter = AsyncLimiter("10/hour", store=store, name=name(), on_failure="fail_closed")
            for _ in range(3):
                assert not (await limiter.hit("k")).degraded
            with redis_single.client() as admin:
                assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
            degraded, back = await until_healthy(limiter, "k")
            assert len(degraded) <= 1  # the call that met the closed connection
            assert all(not d.allowed for d in degraded)  # fail_closed, as on the pipeline
            assert back.remaining == 6  # nothing lost, nothing counted twice

    run(main())


def test_a_connection_closed_before_the_loop_says_so_is_replaced(
    redis_single: RedisServer, run: Run
) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            limiter = AsyncLimiter("10/hour", store=store, name=name())
            assert (await limiter.hit("k")).remaining == 9
            wire = store._batcher.wire
            assert wire is not None
            assert wire.link is not None
            hit = asyncio.ensure_future(limiter.hit("k"))
            await asyncio.sleep(0)  # the check is submitted, its batch about to go out
            wire.link.transport.abort()  # gone, and connection_lost not called yet
            assert (await hit).remaining == 8  # on a new connection, not an error

    run(main())


def test_a_hung_server_times_out_and_the_store_comes_back(run: Run) -> None:
    with redis_server() as server:

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=0.5) as store:
                limiter = AsyncLimiter("10/hour", store=store, name=name(), on_failure="fail_open")
                strict = AsyncLimiter("10/hour", store=store, name=name())
                assert not (await limiter.hit("k")).degraded
                assert server.process is not None
                os.kill(server.process.pid, signal.SIGSTOP)
                try:
                    hung = await asyncio.gather(*(limiter.hit("k") for _ in range(3)))
                    with pytest.raises(StoreUnavailable, match=r"Timeout|circuit open"):
                        await strict.hit("k")
                finally:
                    os.kill(server.process.pid, signal.SIGCONT)
                assert all(d.allowed and d.degraded for d in hung)
                _, back = await until_healthy(limiter, "k")
                assert back.allowed
                assert back.limit == 10

        run(main())


def test_a_killed_server_fails_by_policy_and_a_restart_is_picked_up(run: Run) -> None:
    with redis_server() as server:

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=LIVE) as store:
                limiter = AsyncLimiter("10/hour", store=store, name=name(), on_failure="fail_open")
                assert not (await limiter.hit("k")).degraded
                server.kill()
                down = await asyncio.gather(*(limiter.hit("k") for _ in range(5)))
                assert all(d.allowed and d.degraded for d in down)
                server.start()  # the same port: a fresh server, no scripts, no keys
                _, back = await until_healthy(limiter, "k")
                assert back.remaining == 9

        run(main())


def test_an_error_reply_fails_its_checks_and_the_connection_stays(
    redis_single: RedisServer, run: Run
) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            limiter = AsyncLimiter("5/hour", store=store, name=name())
            assert (await limiter.hit("good")).allowed
            link = store._batcher.wire.link  # type: ignore[union-attr]
            with redis_single.client() as admin:
                admin.lpush(limiter.key_prefix + "bad", "not a limit's state")
            with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
                await limiter.hit("bad")
            assert (await limiter.hit("good")).remaining == 3
            assert store._batcher.wire.link is link  # type: ignore[union-attr]

    run(main())


def test_auth_and_database_from_the_url(run: Run) -> None:
    with redis_server() as server:
        with server.client() as admin:
            admin.config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"

        ours = name()

        async def main() -> None:
            async with AsyncRedisStore(url, timeout=LIVE) as store:
                no_pipelines(store)
                limiter = AsyncLimiter("5/hour", store=store, name=ours)
                assert (await limiter.hit("k")).remaining == 4
            wrong = url.replace("s3cret", "wrong")
            async with AsyncRedisStore(wrong, timeout=LIVE) as store:
                limiter = AsyncLimiter("5/hour", store=store, name=name())
                with pytest.raises(StoreUnavailable):
                    await limiter.hit("k")

        run(main())
        # this test's own keys only: a store of another worker, still syncing to
        # the port this server got after that worker's server had it, once wrote
        # its keys into db 0 here
        with redis.Redis(port=server.port, password="s3cret", db=3) as db3:
            assert len(db3.keys(f"{ours}:*")) == 1
        with redis.Redis(port=server.port, password="s3cret", db=0) as db0:
            assert db0.keys(f"{ours}:*") == []


def test_tls_from_the_url(tmp_path: Path, run: Run) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed (Debian: apt-get install openssl)")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
         "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
         "subjectAltName=IP:127.0.0.1"],
        cwd=tmp_path, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    tls_port = free_port()
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    with redis_server("--tls-port", str(tls_port), "--tls-cert-file", str(cert),
                      "--tls-key-file", str(key), "--tls-auth-clients", "no"):  # fmt: skip
        url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}"

        async def main() -> None:
            async with AsyncRedisStore(url, timeout=LIVE) as store:
                no_pipelines(store)
                limiter = AsyncLimiter("5/hour", store=store, name=name())
                decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(7)))
                assert [d.allowed for d in decisions].count(True) == 5
                assert not any(d.degraded for d in decisions)

        run(main())


def test_a_redis_py_whose_connections_cannot_be_taken_over_keeps_the_pipeline(
    redis_single: RedisServer, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    class Opaque(Connection):  # keeps its streams where the store does not look
        async def connect(self) -> None:
            await super().connect()  # type: ignore[no-untyped-call]
            self.hidden, self._writer = self._writer, None

        async def disconnect(self, *args: Any, **kwargs: Any) -> None:
            self._writer = self.hidden
            await super().disconnect(*args, **kwargs)

    async def main() -> None:
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            wire = store._batcher.wire
            assert wire is not None
            wire.pool = ConnectionPool(connection_class=Opaque, port=redis_single.port)
            limiter = AsyncLimiter("5/hour", store=store, name=name())
            decisions = await asyncio.gather(*(limiter.hit("k") for _ in range(7)))
            assert [d.allowed for d in decisions].count(True) == 5
            assert not any(d.degraded for d in decisions)
            assert store._batcher.wire is None

    run(main())
    assert "go through redis-py's pipelines" in caplog.text


def admin(server: RedisServer) -> redis.Redis:
    """A client that sends nothing of its own on connecting, as the store's do."""
    return redis.Redis(port=server.port, **QUIET)


def resetstat(server: RedisServer) -> None:
    with admin(server) as client:
        client.config_resetstat()


def handshakes(server: RedisServer) -> dict[str, int]:
    """Since `resetstat`: calls of the commands a connection may send before its
    first one (HELLO, CLIENT ...), and errors but NOSCRIPT (CLIENT SETINFO on a
    Redis too old for it is one, not a command)."""
    with admin(server) as client:
        commands, errors = client.info("commandstats"), client.info("errorstats")
    counts = {
        name.removeprefix("cmdstat_"): int(stat["calls"])
        for name, stat in commands.items()
        if name in ("cmdstat_hello", "cmdstat_select", "cmdstat_auth")
        or name.startswith("cmdstat_client")
    }
    counts.update({name: int(stat["count"]) for name, stat in errors.items()
                   if name != "errorstat_NOSCRIPT"})  # fmt: skip
    return counts


def test_a_new_connection_asks_nothing_before_its_first_check(run: Run) -> None:
    """Each command a connection sends before its first check is a round trip that
    may cost the whole timeout, after every fault: no HELLO (RESP2), no CLIENT
    SETINFO or other CLIENT command, from either store."""
    with redis_server() as server:
        resetstat(server)
        with RedisStore(server.url, timeout=LIVE) as store:
            assert Limiter("5/hour", store=store, name=name()).hit("k").remaining == 4
        assert handshakes(server) == {}

        async def main() -> None:
            async with AsyncRedisStore(server.url, timeout=LIVE) as store:
                no_pipelines(store)
                assert (await AsyncLimiter("5/hour", store=store, name=name()).hit("k")).allowed

        run(main())
        assert handshakes(server) == {}


def test_only_a_resp2_client_goes_over_the_store_s_own_connection(
    redis_single: RedisServer, run: Run
) -> None:
    """RESP3 can push replies nobody asked for, which the store's own connection
    would take for the answer to a check. redis-py 8 speaks RESP3 unless told."""
    default = getattr(redis.utils, "DEFAULT_RESP_VERSION", 2)
    assert usable(redis.asyncio.Redis(port=redis_single.port, protocol=2))
    assert not usable(redis.asyncio.Redis(port=redis_single.port, protocol=3))
    assert usable(redis.asyncio.Redis(port=redis_single.port)) == (default == 2)

    async def main() -> None:
        async with AsyncRedisStore(redis_single.url + "?protocol=3", timeout=LIVE) as store:
            assert store._batcher.wire is None  # the URL asked for RESP3: the pipelines
            assert (await AsyncLimiter("5/hour", store=store, name=name()).hit("k")).allowed
        async with AsyncRedisStore(redis_single.url, timeout=LIVE) as store:
            assert store._batcher.wire is not None

    run(main())
