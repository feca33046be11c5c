"""Helpers that drive real Envoys for measurements of quotas shared between
proxies: N Envoys started from one shipped config with its ports rewritten, an
upstream that counts the requests reaching it per aligned wall-clock second, and
an open-loop load generator that offers each Envoy its own rate on keep-alive
connections and tallies per Envoy what was allowed (2xx) and denied (429).

``rls_comparison`` runs the same load through Envoy's classic ratelimit filter
(one gRPC call per request) against ``ratewarden serve``, the baseline the Rate
Limit Quota Service (RLQS, examples/rlqs/envoy.yaml) is compared with.

    python -m tests.system.rlqs_harness rls [--duration 30]   # prints the comparison
    python -m tests.system.rlqs_harness rlqs --grpc 8081      # the same through RLQS
    python -m tests.system.rlqs_harness upstream PORT         # the counting upstream alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.server.process import serving
from tests.system.conftest import (
    BACKEND,
    GATEWAYS,
    RW_GRPC,
    Gateway,
    envoy_binary,
    free_port,
    gateway,
    rewrite,
    wait_for_port,
)

__all__ = ["LISTEN", "RLQS_CONFIG", "RLS_CONFIG", "Comparison", "Tally", "Upstream", "envoys",
           "rlqs_run", "rls_comparison", "run_load", "skewed_load", "summary"]  # fmt: skip

ROOT = Path(__file__).parent.parent.parent
RLQS_CONFIG = ROOT / "examples" / "rlqs" / "envoy.yaml"
RLS_CONFIG = GATEWAYS / "envoy" / "envoy.yaml"
LISTEN = 10000  # the port the shipped Envoy configs listen on
COUNTS = "/__counts"  # the upstream's own page: its counts, not counted
_OK = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\n\r\nok\n"


# -- the upstream --------------------------------------------------------------


async def _serve_upstream(port: int) -> None:
    """Answers every request 200 and counts it under the wall-clock second it
    arrived in; GET /__counts answers those counts as JSON."""
    counts: Counter[int] = Counter()

    async def one_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET " + COUNTS.encode()):
                    body = json.dumps(counts).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
                else:
                    counts[int(time.time())] += 1
                    length = _content_length(head)
                    if length:
                        await reader.readexactly(length)
                    writer.write(_OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(one_client, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class Upstream:
    """The counting upstream in a process of its own (so that it does not share
    a core's interpreter with the load generator)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self._log = tmp / f"upstream-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Upstream:
        command = [sys.executable, "-m", "tests.system.rlqs_harness", "upstream", str(self.port)]
        with self._log.open("wb") as out:
            self._process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=out)
        wait_for_port(self.port, self._process, self._log, "the counting upstream")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)

    def counts(self) -> dict[int, int]:
        """Requests received per wall-clock second (epoch seconds)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{COUNTS}", timeout=10) as got:
            return {int(second): n for second, n in json.load(got).items()}


# -- the Envoys ----------------------------------------------------------------


@contextmanager
def envoys(n: int, config: Path, *, upstream: int, grpc: int, tmp: Path) -> Iterator[list[Gateway]]:
    """``n`` Envoys from ``config`` (listening on 10000, backend 9000, ratewarden's
    gRPC on 8081 as shipped), each on a free port of its own, one worker thread
    each: the machine they share has few cores."""
    binary = envoy_binary()
    with ExitStack() as stack:
        started = []
        for i in range(n):
            port = free_port()
            text = rewrite(config.read_text(), {LISTEN: port, BACKEND: upstream, RW_GRPC: grpc})
            path = tmp / f"envoy-{i}.yaml"
            path.write_text(text)
            command = [binary, "-c", str(path), "--base-id", str(port), "--concurrency", "1",
                       "-l", "warning", "--disable-hot-restart"]  # fmt: skip
            log = tmp / f"envoy-{i}.log"
            started.append(stack.enter_context(gateway(command, port, log, f"envoy {i}", tmp)))
        yield started


# -- the load ------------------------------------------------------------------


@dataclass
class Tally:
    """What one Envoy answered. ``seconds``: per wall-clock second in which a
    request was due, [allowed, denied]. ``behind``: the latest any request left
    after its due time (seconds): the load was open-loop only while it stays
    small."""

    sent: int = 0
    allowed: int = 0
    denied: int = 0
    other: Counter[int] = field(default_factory=Counter)
    errors: int = 0
    behind: float = 0.0
    seconds: dict[int, list[int]] = field(default_factory=dict)

    @property
    def denied_share(self) -> float:
        return self.denied / self.sent if self.sent else 0.0


class _Client:
    """Requests to one Envoy over a pool of keep-alive connections: a request
    takes an idle one or opens another, so a slow answer never delays the next
    request's departure."""

    def __init__(self, port: int, path: str, headers: Mapping[str, str], tally: Tally) -> None:
        self.port = port
        fields = [f"{name}: {value}" for name, value in headers.items()]
        lines = [f"GET {path} HTTP/1.1", "host: 127.0.0.1", *fields]
        self.request = ("\r\n".join(lines) + "\r\n\r\n").encode()
        self.tally = tally
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened: list[asyncio.StreamWriter] = []

    async def one(self, second: int) -> None:
        self.tally.sent += 1
        if self.idle:
            reader, writer = self.idle.pop()
        else:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                self.tally.errors += 1
                return
            self.opened.append(writer)
        try:
            writer.write(self.request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            status = int(head[9:12])
            await reader.readexactly(_content_length(head))
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError,
                asyncio.LimitOverrunError):  # fmt: skip
            self.tally.errors += 1
            writer.close()
            return
        if b"connection: close" not in head.lower():
            self.idle.append((reader, writer))
        counts = self.tally.seconds.setdefault(second, [0, 0])
        if 200 <= status < 300:
            self.tally.allowed += 1
            counts[0] += 1
        elif status == 429:
            self.tally.denied += 1
            counts[1] += 1
        else:
            self.tally.other[status] += 1

    def close(self) -> None:
        for writer in self.opened:
            writer.close()


async def _offer(client: _Client, rate: float, start: float, wall: float, duration: float) -> None:
    """Requests due at ``start + i / rate`` (loop time) for ``duration`` seconds,
    each sent when due whatever the earlier ones are waiting for."""
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()
    total = int(rate * duration)
    for i in range(total):
        offset = i / rate
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            client.tally.behind = max(client.tally.behind, -delay)
        task = asyncio.create_task(client.one(int(wall + offset)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=15)


async def _load(ports: Sequence[int], rates: Sequence[float], duration: float, path: str,
                headers: Sequence[Mapping[str, str]]) -> list[Tally]:  # fmt: skip
    loop = asyncio.get_running_loop()
    # start on a whole wall-clock second, so that the counted seconds are whole
    wall = math.floor(time.time()) + 1.0
    start = loop.time() + (wall - time.time())
    clients = [_Client(port, path, headers[i], Tally()) for i, port in enumerate(ports)]
    try:
        await asyncio.gather(*(_offer(c, rate, start, wall, duration)
                               for c, rate in zip(clients, rates, strict=True)))  # fmt: skip
    finally:
        for client in clients:
            client.close()
    return [client.tally for client in clients]


def run_load(ports: Sequence[int], rates: Sequence[float], duration: float, *, path: str = "/",
             headers: Sequence[Mapping[str, str]] | None = None) -> list[Tally]:  # fmt: skip
    """Offer ``rates[i]`` requests a second to the Envoy on ``ports[i]`` for
    ``duration`` seconds, evenly spaced, starting on the next whole wall-clock
    second; the tally of each Envoy's answers, in the same order."""
    if len(ports) != len(rates):
        raise ValueError(f"{len(ports)} ports but {len(rates)} rates: give one rate per Envoy")
    chosen = list(headers) if headers is not None else [{} for _ in ports]
    if len(chosen) != len(ports):
        raise ValueError(f"{len(ports)} ports but {len(chosen)} header sets: one per Envoy")
    return asyncio.run(_load(ports, rates, duration, path, chosen))


# -- skewed load through N Envoys ----------------------------------------------


@dataclass
class Comparison:
    rates: list[float]
    tallies: list[Tally]
    upstream: dict[int, int]  # requests per wall-clock second that reached the upstream
    first: int  # the first counted second (after the settling ones)
    duration: int  # counted seconds
    load_cpu: float  # CPU seconds the load generator spent (this process)

    def window(self, tally: Tally) -> tuple[int, int]:
        """A tally's allowed and denied requests within the counted seconds."""
        counted = [
            tally.seconds.get(s, [0, 0]) for s in range(self.first, self.first + self.duration)
        ]
        return sum(c[0] for c in counted), sum(c[1] for c in counted)


def skewed_load(tmp: Path, config: Path, *, grpc: int, weights: Sequence[float], limit: int,
                load: float, duration: int, settle: int = 0, path: str = "/",
                headers: Mapping[str, str] | None = None) -> Comparison:  # fmt: skip
    """``len(weights)`` Envoys from ``config`` asking the gRPC service on
    ``grpc``, offered ``load`` times ``limit`` requests a second between them,
    split by ``weights``; the first ``settle`` seconds are load but not counted
    (a quota service needs a few reports to learn the demand)."""
    rates = [limit * load * w / sum(weights) for w in weights]
    with (
        Upstream(tmp) as upstream,
        envoys(len(weights), config, upstream=upstream.port, grpc=grpc, tmp=tmp) as gws,
    ):
        # one request through each opens its gRPC stream before the count
        for gw in gws:
            warm_up = urllib.request.Request(f"{gw.url}/warm-up", headers=dict(headers or {}))
            try:
                with urllib.request.urlopen(warm_up, timeout=10) as answer:
                    answer.read()
            except urllib.error.HTTPError as exc:  # a 429 opened it all the same
                exc.close()
        cpu = time.process_time()
        tallies = run_load([gw.port for gw in gws], rates, settle + duration, path=path,
                           headers=[headers or {}] * len(gws))  # fmt: skip
        cpu = time.process_time() - cpu
        time.sleep(0.5)
        counts = upstream.counts()
    first = min(s for t in tallies for s in t.seconds) + settle
    return Comparison(rates=rates, tallies=tallies, upstream=counts, first=first,
                      duration=duration, load_cpu=cpu)  # fmt: skip


_RLS_RULES = """\
version: 1
rules:
  - name: fleet
    rate: {limit}/second
    algorithm: fixed_window
    match: {{paths: "/api/*"}}
"""


def rls_comparison(tmp: Path, *, weights: Sequence[float] = (10, 1, 1), limit: int = 200,
                   load: float = 1.5, duration: int = 30) -> Comparison:  # fmt: skip
    """The classic ratelimit filter (examples/gateways/envoy) asking one
    ``ratewarden serve`` per request, which allows ``limit`` requests a second
    to all the Envoys together (one fixed-window counter)."""
    rules = tmp / "rls-rules.yaml"
    rules.write_text(_RLS_RULES.format(limit=limit))
    with serving("--config", str(rules), tmp=tmp) as served:
        result = skewed_load(tmp, RLS_CONFIG, grpc=served.grpc, weights=weights, limit=limit,
                             load=load, duration=duration, path="/api/hello")  # fmt: skip
        served.terminate()
    return result


def rlqs_run(tmp: Path, grpc: int, *, weights: Sequence[float] = (10, 1, 1), limit: int = 200,
             load: float = 1.5, duration: int = 30, settle: int = 10,
             tenant: str = "acme") -> Comparison:  # fmt: skip
    """The same load through examples/rlqs/envoy.yaml, every request in tenant
    ``tenant``'s bucket, against the quota service on ``grpc`` (``ratewarden
    serve`` with a rule of ``limit`` a second for that bucket, or a fake)."""
    return skewed_load(tmp, RLQS_CONFIG, grpc=grpc, weights=weights, limit=limit, load=load,
                       duration=duration, settle=settle, headers={"x-tenant": tenant})  # fmt: skip


def summary(result: Comparison) -> str:
    seconds = range(result.first, result.first + result.duration)
    per_second = [result.upstream.get(s, 0) for s in seconds]
    median = sorted(per_second)[len(per_second) // 2]
    lines = [f"upstream per second: {per_second}",
             f"upstream min/median/max: {min(per_second)}/{median}/{max(per_second)}, "
             f"total {sum(per_second)} in {result.duration} s",
             f"load generator: {result.load_cpu:.1f} s of CPU"]  # fmt: skip
    for i, (rate, t) in enumerate(zip(result.rates, result.tallies, strict=True)):
        allowed, denied = result.window(t)
        share = denied / (allowed + denied) if allowed + denied else 0.0
        lines.append(f"envoy {i}: offered {rate:.0f}/s, allowed {allowed}, denied {denied} "
                     f"({share:.1%}); whole run: sent {t.sent}, other {dict(t.other)}, "
                     f"errors {t.errors}, behind at most {t.behind * 1000:.0f} ms")  # fmt: skip
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.system.rlqs_harness")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("upstream").add_argument("port", type=int)
    rls = commands.add_parser(
        "rls", help="the classic filter against a ratewarden serve of its own"
    )
    rls.add_argument("--duration", type=int, default=30)
    rlqs = commands.add_parser("rlqs", help="examples/rlqs/envoy.yaml against a running service")
    rlqs.add_argument("--grpc", type=int, required=True, help="the quota service's gRPC port")
    rlqs.add_argument("--duration", type=int, default=30)
    rlqs.add_argument("--settle", type=int, default=10)
    rlqs.add_argument("--tenant", default="acme")
    args = parser.parse_args(argv)
    if args.command == "upstream":
        asyncio.run(_serve_upstream(args.port))
        return
    with tempfile.TemporaryDirectory(prefix="rlqs-harness-") as tmp:
        if args.command == "rls":
            result = rls_comparison(Path(tmp), duration=args.duration)
        else:
            result = rlqs_run(Path(tmp), args.grpc, duration=args.duration, settle=args.settle,
                              tenant=args.tenant)  # fmt: skip
        print(summary(result))


if __name__ == "__main__":
    main()
