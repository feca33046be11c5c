"""RedisStore on one server sends its scripts over connections of its own
(stores/redis/_sync_wire.py), not through redis-py's client: what redis-py did for them
(AUTH, SELECT, TLS, threads, fork, reconnecting, timeouts, error replies) must hold
on them too, and a server that misbehaves must not be trusted."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.connection import Connection, ConnectionPool

from ratewarden import Decision, Limiter, StoreUnavailable
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.redis._sync_wire import Wire, usable
from tests.redis_server import LIVE, RedisServer, free_port, redis_server


def name() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


def no_client(store: RedisStore) -> None:
    """Fail the test if a script goes through redis-py's client."""

    def refuse(*args: object, **kwargs: object) -> Any:
        raise AssertionError("a script went through redis-py's client")

    store.client.evalsha = refuse
    store.client.eval = refuse


def wire_of(store: RedisStore) -> Wire:
    assert store.scripts.wire is not None
    return store.scripts.wire


def until_healthy(limiter: Limiter, key: str) -> Decision:
    """Hit until a decision comes from Redis again (the breaker may hold calls back)."""
    deadline = time.monotonic() + 30
    while (decision := limiter.hit(key)).degraded:
        assert time.monotonic() < deadline, "the store did not come back"
        time.sleep(0.02)
    return decision


def test_a_url_store_on_one_server_bypasses_redis_py(redis_single: RedisServer) -> None:
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        no_client(store)
        limiter = Limiter("50/hour", store=store, name=name())
        assert sum(limiter.hit("k").allowed for _ in range(60)) == 50
        assert "1 idle" in repr(wire_of(store))
        with redis_single.client() as admin:
            admin.script_flush()  # NOSCRIPT on the wire: run from source, loaded again
        assert limiter.peek("k").remaining == 0


def test_a_client_passed_in_keeps_its_own_commands(redis_single: RedisServer) -> None:
    client = redis.Redis(port=redis_single.port)
    store = RedisStore(client)
    assert store.scripts.wire is None
    assert Limiter("5/hour", store=store, name=name()).hit("k").remaining == 4
    client.close()


def test_only_a_plain_resp2_client_goes_over_the_wire(redis_single: RedisServer) -> None:
    assert usable(redis.Redis(port=redis_single.port, protocol=2))
    assert not usable(redis.Redis(port=redis_single.port, protocol=3))
    assert not usable(redis.Redis(port=redis_single.port, protocol=2, encoding="latin-1"))
    with RedisStore(redis_single.url + "?protocol=3", timeout=LIVE) as store:
        assert store.scripts.wire is None
        assert Limiter("5/hour", store=store, name=name()).hit("k").allowed


def test_a_restarted_server_costs_no_failed_check() -> None:
    """The idle connection the restart closed is replaced before the next check goes
    out, as redis-py's pool does: the check is answered by the new server."""
    with redis_server() as server, RedisStore(server.url, timeout=LIVE) as store:
        limiter = Limiter("10/hour", store=store, name=name(), on_failure="fail_open")
        assert limiter.hit("k").remaining == 9
        server.stop()
        server.start()  # the same port: no scripts, no keys
        after = limiter.hit("k")
        assert not after.degraded
        assert after.remaining == 9


def test_a_killed_connection_is_replaced(redis_single: RedisServer) -> None:
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        limiter = Limiter("10/hour", store=store, name=name())
        assert limiter.hit("k").remaining == 9
        with redis_single.client() as admin:
            killed = admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        assert limiter.hit("k").remaining == 8


def test_a_killed_server_fails_by_policy_and_a_restart_is_picked_up() -> None:
    with redis_server() as server, RedisStore(server.url, timeout=LIVE) as store:
        limiter = Limiter("10/hour", store=store, name=name(), on_failure="fail_open")
        assert not limiter.hit("k").degraded
        server.kill()
        down = [limiter.hit("k") for _ in range(5)]
        assert all(d.allowed and d.degraded for d in down)
        server.start()
        assert until_healthy(limiter, "k").remaining == 9


def test_a_hung_server_times_out_within_the_timeout() -> None:
    with redis_server() as server, RedisStore(server.url, timeout=0.3) as store:
        strict = Limiter("10/hour", store=store, name=name())
        limiter = Limiter("10/hour", store=store, name=name(), on_failure="fail_open")
        assert not strict.hit("k").degraded
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="Timeout"):
                strict.hit("k")
            assert time.monotonic() - started < 0.3 + 0.25
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        # the late reply would answer the next check: that connection is gone
        assert "0 idle" in repr(wire_of(store))
        assert until_healthy(limiter, "k").remaining == 9
        # the check that timed out ran once the server woke (as through redis-py);
        # its reply went to the closed connection, not to this check
        assert strict.hit("k").remaining == 7


def test_an_error_reply_fails_its_check_and_the_connection_stays(
    redis_single: RedisServer,
) -> None:
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        limiter = Limiter("5/hour", store=store, name=name())
        assert limiter.hit("good").allowed
        link = wire_of(store)._idle[-1]
        with redis_single.client() as admin:
            admin.lpush(limiter.key_prefix + "bad", "not a limit's state")
        with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
            limiter.hit("bad")
        assert limiter.hit("good").remaining == 3
        assert wire_of(store)._idle == [link]


def test_auth_and_database_from_the_url() -> None:
    with redis_server() as server:
        with server.client() as admin:
            admin.config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{server.port}/3"
        ours = name()
        with RedisStore(url, timeout=LIVE) as store:
            no_client(store)
            assert Limiter("5/hour", store=store, name=ours).hit("k").remaining == 4
        with (
            RedisStore(url.replace("s3cret", "wrong"), timeout=LIVE) as store,
            pytest.raises(StoreUnavailable),
        ):
            Limiter("5/hour", store=store, name=name()).hit("k")
        # this test's own keys only: a client of another test, connected to this
        # port before the password was set, once wrote into db 0 of the async twin's
        with redis.Redis(port=server.port, password="s3cret", db=3) as db3:
            assert len(db3.keys(f"{ours}:*")) == 1
        with redis.Redis(port=server.port, password="s3cret", db=0) as db0:
            assert db0.keys(f"{ours}:*") == []


def test_tls_from_the_url(tmp_path: Path) -> None:
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
        with RedisStore(url, timeout=LIVE) as store:
            no_client(store)
            limiter = Limiter("5/hour", store=store, name=name())
            decisions = [limiter.hit("k") for _ in range(7)]
            assert [d.allowed for d in decisions].count(True) == 5
            assert not any(d.degraded for d in decisions)


def test_threads_never_share_a_connection(redis_single: RedisServer) -> None:
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        limiter = Limiter("1000/hour", store=store, name=name())
        start = threading.Barrier(8)
        allowed: list[int] = []

        def worker() -> None:
            start.wait()
            allowed.append(sum(limiter.hit("k").allowed for _ in range(200)))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(allowed) == 1000  # of 1,600: a mixed-up reply would miscount
        assert 1 <= len(wire_of(store)._idle) <= 8


def test_a_forked_child_makes_its_own_connections(redis_single: RedisServer) -> None:
    with RedisStore(redis_single.url, timeout=LIVE) as store:
        limiter = Limiter("100/hour", store=store, name=name())
        assert limiter.hit("k").remaining == 99
        parent_link = wire_of(store)._idle[-1]
        context = multiprocessing.get_context("fork")
        results = context.Queue()

        def child() -> None:
            store_idle = len(wire_of(store)._idle)
            results.put((store_idle, [limiter.hit("k").remaining for _ in range(10)]))

        process = context.Process(target=child)
        process.start()
        idle_in_child, remaining = results.get(timeout=30)
        process.join(30)
        assert process.exitcode == 0
        assert idle_in_child == 0  # the parent's connection was dropped, not shared
        assert remaining == list(range(98, 88, -1))
        assert limiter.hit("k").remaining == 88  # the parent's connection still works
        assert wire_of(store)._idle == [parent_link]


def test_a_redis_py_whose_connections_cannot_be_taken_over_keeps_redis_py(
    redis_single: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    class Opaque(Connection):  # keeps its socket where the store does not look
        def connect(self) -> None:
            super().connect()  # type: ignore[no-untyped-call]
            self.hidden, self._sock = self._sock, None

        def disconnect(self, *args: Any, **kwargs: Any) -> None:
            self._sock = getattr(self, "hidden", None)
            super().disconnect(*args, **kwargs)  # type: ignore[no-untyped-call]

    with RedisStore(redis_single.url, timeout=LIVE) as store:
        wire_of(store).pool = ConnectionPool(connection_class=Opaque, port=redis_single.port)
        limiter = Limiter("5/hour", store=store, name=name())
        decisions = [limiter.hit("k") for _ in range(7)]
        assert [d.allowed for d in decisions].count(True) == 5
        assert not any(d.degraded for d in decisions)
        assert store.scripts.wire is None
    assert "redis-py's carry on" in caplog.text


# A server of our own that answers every command with what the test says, to see
# what the store does with replies no Redis sends.


@contextlib.contextmanager
def fake_server(answer: Callable[[socket.socket, int], None]) -> Iterator[tuple[str, list[int]]]:
    """A loopback server that calls ``answer(connection, n)`` for the n-th command
    (counted over all connections; any bytes received count as one command), and a
    list of how many connections it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = [0]
    commands = [0]
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                commands[0] += 1
                try:
                    answer(conn, commands[0])
                except OSError:
                    return

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted[0] += 1
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{port}/0", accepted
    finally:
        stop.set()
        thread.join(5)
        listener.close()


ALLOWED = b"*4\r\n:1\r\n:4\r\n:100\r\n:0\r\n"  # allowed, 4 left, reset 100 ticks, retry 0


@pytest.mark.parametrize(
    "gaps",
    [
        [0.03] * len(ALLOWED),  # a byte every 30 ms: no read waits the timeout
        [0.3, 2.0],  # a byte, another after 0.3 s, then silence
    ],
    ids=["trickle", "pause"],
)
def test_a_reply_that_trickles_in_is_bounded_as_a_whole(gaps: list[float]) -> None:
    """Each read is shorter than the socket timeout, the reply is not: the round trip
    is timed as a whole, not per read."""

    def trickle(conn: socket.socket, n: int) -> None:
        for byte, gap in zip(ALLOWED, gaps, strict=False):
            conn.sendall(bytes([byte]))
            time.sleep(gap)

    with fake_server(trickle) as (url, _), RedisStore(url, timeout=0.4) as store:
        limiter = Limiter("5/hour", store=store, name=name())
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="Timeout"):
            limiter.hit("k")
        assert time.monotonic() - started < 0.4 + 0.15  # per read: 0.7 s or more


def test_garbage_from_the_server_drops_the_connection() -> None:
    def answer(conn: socket.socket, n: int) -> None:
        conn.sendall(b"?what\r\n" if n == 1 else ALLOWED)

    with fake_server(answer) as (url, accepted), RedisStore(url, timeout=LIVE) as store:
        limiter = Limiter("5/hour", store=store, name=name(), on_failure="fail_closed")
        first = limiter.hit("k")
        assert first.degraded
        assert not first.allowed
        store.breaker.succeeded()  # no cooldown: the next check goes out at once
        second = limiter.hit("k")
        assert not second.degraded
        assert second.remaining == 4
        assert accepted[0] == 2


def test_a_reply_nobody_asked_for_is_not_taken_for_the_next_answer() -> None:
    """Two replies to one command: the first answers it, and the connection that
    holds the second is not used again (it would answer the next check)."""
    denied = b"*4\r\n:0\r\n:0\r\n:100\r\n:100\r\n"

    def answer(conn: socket.socket, n: int) -> None:
        conn.sendall(ALLOWED + denied if n == 1 else ALLOWED)

    with fake_server(answer) as (url, accepted), RedisStore(url, timeout=LIVE) as store:
        limiter = Limiter("5/hour", store=store, name=name())
        assert limiter.hit("k").allowed
        assert limiter.hit("k").allowed  # not the stray denial
        assert accepted[0] == 2


def test_a_server_that_closes_mid_reply_fails_the_check() -> None:
    def answer(conn: socket.socket, n: int) -> None:
        if n == 1:
            conn.sendall(ALLOWED[:7])
            conn.shutdown(socket.SHUT_RDWR)
        else:
            conn.sendall(ALLOWED)

    with fake_server(answer) as (url, accepted), RedisStore(url, timeout=LIVE) as store:
        limiter = Limiter("5/hour", store=store, name=name())
        with pytest.raises(StoreUnavailable, match="closed"):
            limiter.hit("k")
        store.breaker.succeeded()
        assert limiter.hit("k").remaining == 4
        assert accepted[0] == 2
