"""Faults between the limiter and one Redis server, for both stores: `RedisStore`
(redis-py's connections) and `AsyncRedisStore` (its own connection, see
stores/redis/_async_wire.py). Each runs under load and is checked by `Report.check`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from tests.faults.load import TIMEOUT, Report, Target, arun_fault, run_fault
from tests.faults.proxy import Proxy, proxy
from tests.redis_server import RedisServer, redis_server

LATENCY = 0.1  # each way: a round trip takes 4 timeouts


@dataclass
class Fault:
    url: str
    target: Target
    inject: Callable[[], None]
    heal: Callable[[], None]
    keys_lost: bool = False


def redis_clients(server: RedisServer) -> Callable[[], int]:
    def count() -> int:
        with server.client() as admin:
            return int(admin.info("clients")["connected_clients"]) - 1  # not the admin

    return count


def pids(*processes: Callable[[], subprocess.Popen[Any] | None]) -> Callable[[], list[int]]:
    """The ids of the processes, each read when asked (a restart replaces one)."""
    return lambda: [p.pid for p in (get() for get in processes) if p is not None]


def _through(px: Proxy, server: RedisServer, mode: str, delay: float = 0.0) -> Fault:
    def inject() -> None:
        px.set(mode, delay)

    def heal() -> None:
        px.set("pass")

    target = Target(lambda: {px.port}, redis_clients(server), lambda: int(px.stats()["open"]),
                    pids(lambda: server.process, lambda: px.process))  # fmt: skip
    return Fault(px.url, target, inject, heal)


@contextlib.contextmanager
def fault(kind: str) -> Iterator[Fault]:
    with redis_server() as server, contextlib.ExitStack() as stack:

        def signal_server(number: int) -> None:
            assert server.process is not None  # read each time: a restart replaces it
            os.kill(server.process.pid, number)

        if kind in ("latency", "blackhole", "reset"):
            px = stack.enter_context(proxy(server.port))
            yield _through(px, server, kind, LATENCY if kind == "latency" else 0.0)
        elif kind == "restart":  # SIGKILL, down for the fault's length, back on its port
            target = Target(lambda: {server.port}, redis_clients(server),
                            servers=pids(lambda: server.process))  # fmt: skip
            yield Fault(server.url, target, server.kill, server.start, keys_lost=True)
        elif kind == "hang":  # SIGSTOP: connections accepted by the kernel, no answers
            stop = functools.partial(signal_server, signal.SIGSTOP)
            cont = functools.partial(signal_server, signal.SIGCONT)
            try:
                target = Target(lambda: {server.port}, redis_clients(server),
                                servers=pids(lambda: server.process))  # fmt: skip
                yield Fault(server.url, target, stop, cont)
            finally:
                if server.process is not None and server.process.poll() is None:
                    cont()
        else:
            raise ValueError(kind)


FAULTS = ["latency", "blackhole", "reset", "restart", "hang"]


@pytest.mark.parametrize("kind", FAULTS)
def test_sync_store(kind: str) -> None:
    with fault(kind) as f, RedisStore(f.url, timeout=TIMEOUT) as store:
        report = Report("sync", kind, keys_lost=f.keys_lost)
        run_fault(store, report, f.target, f.inject, f.heal)
    print("\n" + report.line())
    report.check()


@pytest.mark.parametrize("kind", FAULTS)
def test_async_store(kind: str) -> None:
    async def main(f: Fault) -> Report:
        async with AsyncRedisStore(f.url, timeout=TIMEOUT) as store:
            assert store._batcher.wire is not None  # its own connection is under test
            report = Report("async", kind, keys_lost=f.keys_lost)
            return await arun_fault(store, report, f.target, f.inject, f.heal)

    with fault(kind) as f:
        report = asyncio.run(main(f))
    print("\n" + report.line())
    report.check()
