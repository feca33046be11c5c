"""A flood of distinct keys at the memory store, through the library and through
``ratewarden serve``: memory stays under the ``max_keys`` bound, and legitimate
keys interleaved with the flood are limited exactly, or not.

    .venv/bin/python bench/flood.py library --keys 10000000 --max-keys 1000000
    .venv/bin/python bench/flood.py service --keys 10000000 --max-keys 1000000 [--via grpc]

Each flood key is hit once, in a limit of 5 per day per key (token bucket: the
first token comes back after 4.8 hours, so within any run a key is admitted
exactly 5 times, whatever the clock does, unless the store forgets it). Between
``--legit-every`` flood keys (default: a tenth of the bound, so every legitimate
key is far more recent than most flood keys) the legitimate clients ask once:

- ``same-limit``: one key in the flood's own limit (the flood's users);
- ``other-limit``: three keys in a second limit of the same store (a login
  limit by ip), which the flood never touches;
- ``sparse``: one key in the flood's limit asked only every 1.2 x ``max_keys``
  flood keys: outside the store's documented sizing (``max_keys`` above the
  keys active within one period), shown for what it costs.

Every legitimate key should be admitted exactly 5 times; anything above is
over-admission. Memory: the resident set size (RSS) of the process holding the
store (this one for ``library``, the server for ``service``) before the flood,
once ``max_keys`` keys have come in (the bound is reached), at its peak
(VmHWM) and at the end. ``service`` floods over HTTP with ``POST
/v1/check/batch`` of 1,000 checks (``--via grpc``: ShouldRateLimit calls of 64
descriptors of an envoy domain), one connection: the server, one process on one
core, is the bottleneck (it runs at 90%+ of its core). The legitimate checks go
as requests of their own, between the flood's.

Measured on the project's 2-CPU VM (CPython 3.11.7), 10,000,000 keys,
``--max-keys 1000000``, at commit bbe4ce8 (RSS in MiB):

    mode            time     keys/s   RSS before  at bound  peak  end   over-admitted
    library          31 s   318,000          26       224    312   254  same-limit 0,
    service, gRPC   322 s    31,100          48       260    349   291  other-limit 90 and 89
    service, HTTP   452 s    22,100          36       235    323   264  (of 5), sparse 4

RSS sampled every 100,000 keys is flat from 1.5-1.8 million keys on (the peak is
a moment of a dict resizing); about 300 bytes per key of the bound. Two of the
three other-limit keys are over-admitted: the store's eviction takes at least
one key from every limit with two or more per round, whatever their recency
(stores/memory.py ``_make_room``); the third is its limit's most recent key,
which eviction always spares.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
RATEWARDEN = Path(sys.executable).parent / "ratewarden"
LIMIT = 5
RATE = f"{LIMIT}/day"
OTHER_KEYS = ("203.0.113.1", "203.0.113.2", "203.0.113.3")
HTTP_BATCH = 1000  # the API's MAX_BATCH
GRPC_DESCRIPTORS = 64  # the RLS service's MAX_DESCRIPTORS
REPORT_EVERY = 100_000  # flood keys between RSS samples

RULES = f"""\
version: 1
rules:
  - name: per-user
    rate: {RATE}
    algorithm: token_bucket
    by: user
  - name: login
    rate: {RATE}
    algorithm: token_bucket
    by: ip
    match: {{paths: /login}}
"""
ENVOY = f"""\
domain: flood
descriptors:
  - key: user
    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}
  - key: remote_address
    rate_limit: {{unit: day, requests_per_unit: {LIMIT}}}
"""


def rss(pid: int | str = "self") -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    now = re.search(r"VmRSS:\s+(\d+) kB", text)
    peak = re.search(r"VmHWM:\s+(\d+) kB", text)
    if now is None or peak is None:
        raise RuntimeError(f"no VmRSS/VmHWM in /proc/{pid}/status")
    return int(now[1]) * 1024, int(peak[1]) * 1024


@dataclass
class Legit:
    """One legitimate client: its key, the limit it is in, what it was told."""

    name: str
    key: str
    every: int
    attempts: int = 0
    admitted: int = 0

    @property
    def over(self) -> int:
        return max(0, self.admitted - LIMIT)


@dataclass
class Run:
    mode: str
    keys: int
    max_keys: int
    legit: list[Legit]
    seconds: float = 0.0
    rss_before: int = 0
    rss_at_bound: int = 0
    rss_peak: int = 0
    rss_end: int = 0
    samples: list[tuple[int, int]] = field(default_factory=list)  # (keys sent, RSS)
    answered: int = 0  # flood checks the server answered (service)
    admitted: int = 0  # flood checks admitted: each key is new or forgotten, so all

    def report(self) -> str:
        mb = 1024 * 1024
        growth = self.rss_peak - self.rss_before
        lines = [
            f"{self.mode}: {self.keys:,} distinct flood keys, max_keys {self.max_keys:,}",
            f"  time       {self.seconds:.1f} s ({self.keys / self.seconds:,.0f} keys/s)",
            f"  RSS        before {self.rss_before / mb:.0f} MB, at the bound "
            f"{self.rss_at_bound / mb:.0f} MB, peak {self.rss_peak / mb:.0f} MB, "
            f"end {self.rss_end / mb:.0f} MB",
            f"  peak above the start: {growth / mb:.0f} MB = "
            f"{growth / self.max_keys:.0f} B per key of the bound; after the bound: "
            f"{(self.rss_peak - self.rss_at_bound) / mb:+.0f} MB",
            f"  flood      {self.admitted:,} admitted of {self.keys:,}",
        ]
        lines += [
            f"  {c.name:<12} every {c.every:>10,} keys: {c.attempts:>4} asked, "
            f"{c.admitted:>4} admitted of {LIMIT}, over-admitted {c.over}"
            for c in self.legit
        ]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k not in ("legit", "samples")}
        out["legit"] = [{**vars(c), "over_admitted": c.over, "expected": LIMIT} for c in self.legit]
        out["samples"] = self.samples
        return out


def legit_clients(every: int, max_keys: int) -> list[Legit]:
    clients = [Legit("same-limit", "legit-user", every)]
    clients += [Legit(f"other-limit{n}", ip, every) for n, ip in enumerate(OTHER_KEYS, 1)]
    clients.append(Legit("sparse", "sparse-user", max_keys + max_keys // 5))
    return clients


def flood(run: Run, step: int, send: Callable[[int, int], None],
          ask: Callable[[Legit], bool], memory: Callable[[], tuple[int, int]]) -> None:  # fmt: skip
    """Send ``run.keys`` flood keys ``step`` at a time; between them, each
    legitimate client asks whenever its interval has passed."""
    run.rss_before = memory()[0]
    next_ask = {id(c): 0 for c in run.legit}
    next_sample = 0
    started = time.perf_counter()
    sent = 0
    while sent < run.keys:
        for client in run.legit:
            if sent >= next_ask[id(client)]:
                client.attempts += 1
                client.admitted += ask(client)
                next_ask[id(client)] += client.every
        count = min(step, run.keys - sent)
        send(sent, count)
        sent += count
        if run.rss_at_bound == 0 and sent >= run.max_keys:
            run.rss_at_bound = memory()[0]
        if sent >= next_sample:
            run.samples.append((sent, memory()[0]))
            next_sample += REPORT_EVERY
    run.seconds = time.perf_counter() - started
    run.rss_end, run.rss_peak = memory()
    run.samples.append((sent, run.rss_end))


def library(keys: int, max_keys: int, every: int) -> Run:
    from ratewarden import Limiter, MemoryStore  # noqa: PLC0415

    store = MemoryStore(max_keys=max_keys)
    per_user = Limiter(RATE, store=store, algorithm="token_bucket", name="per-user")
    login = Limiter(RATE, store=store, algorithm="token_bucket", name="login")
    run = Run("library", keys, max_keys, legit_clients(every, max_keys))
    hit = per_user.hit

    def send(start: int, count: int) -> None:
        admitted = 0
        for i in range(start, start + count):
            admitted += hit(f"f{i}").allowed
        run.admitted += admitted

    def ask(client: Legit) -> bool:
        limiter = login if client.name.startswith("other") else per_user
        return limiter.hit(client.key).allowed

    flood(run, 10_000, send, ask, rss)
    if len(store) > max_keys:
        raise AssertionError(f"the store holds {len(store)} keys, above max_keys {max_keys}")
    return run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def rls_request(domain: bytes, descriptors: list[tuple[bytes, bytes]]) -> bytes:
    """A RateLimitRequest, encoded by hand (as fast as it gets in Python): each
    descriptor one entry."""
    parts = [_field(1, domain)]
    for key, value in descriptors:
        parts.append(_field(2, _field(1, _field(1, key) + _field(2, value))))
    return b"".join(parts)


def service(keys: int, max_keys: int, every: int, via: str) -> Run:
    tmp = Path(tempfile.mkdtemp(prefix="ratewarden-flood-"))
    (tmp / "rules.yaml").write_text(RULES)
    (tmp / "flood.yaml").write_text(ENVOY)
    http_port, grpc_port = free_port(), free_port()
    command = [
        str(RATEWARDEN), "serve", "--config", str(tmp / "rules.yaml"),
        "--envoy-config", str(tmp / "flood.yaml"),
        "--http", f"127.0.0.1:{http_port}",
        "--grpc", f"127.0.0.1:{grpc_port}" if via == "grpc" else "off",
        "--max-keys", str(max_keys), "--max-body", str(1024 * 1024),
    ]  # fmt: skip
    log = (tmp / "serve.log").open("w")
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if "HTTP on" not in line:
            raise RuntimeError(f"ratewarden serve did not start: {line!r}, see {tmp}/serve.log")
        run = Run(f"service ({via})", keys, max_keys, legit_clients(every, max_keys))
        if via == "http":
            send, ask = _http_flood(run, http_port)
            step = HTTP_BATCH
        else:
            send, ask = _grpc_flood(run, grpc_port)
            step = GRPC_DESCRIPTORS
        flood(run, step, send, ask, lambda: rss(server.pid))
        errors = [x for x in (tmp / "serve.log").read_text().splitlines()
                  if "Traceback" in x or '"level": "error"' in x]  # fmt: skip
        if errors:
            raise RuntimeError(f"the server logged errors: {errors[:3]}")
        return run
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _http_flood(run: Run, port: int) -> tuple[Callable[[int, int], None], Callable[[Legit], bool]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"content-type": "application/json"}

    def post(path: str, body: bytes) -> bytes:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"{path}: {response.status} {data[:300]!r}")
        return data

    def send(start: int, count: int) -> None:
        checks = b",".join(
            b'{"attributes":{"user":"f%d"}}' % i for i in range(start, start + count)
        )
        data = post("/v1/check/batch", b'{"checks":[' + checks + b"]}")
        # every answer counted without decoding 350 kB of JSON
        run.answered += data.count(b'"allowed":')
        run.admitted += data.count(b'"allowed":true')

    def ask(client: Legit) -> bool:
        if client.name.startswith("other"):
            attributes = {"ip": client.key, "path": "/login"}
        else:
            attributes = {"user": client.key}
        answer = json.loads(post("/v1/check", json.dumps({"attributes": attributes}).encode()))
        return bool(answer["allowed"])

    return send, ask


def _grpc_flood(run: Run, port: int) -> tuple[Callable[[int, int], None], Callable[[Legit], bool]]:
    import grpc  # noqa: PLC0415 - only for --via grpc

    from ratewarden.server._grpc_server import METHOD, messages  # noqa: PLC0415

    response_type = messages()["RateLimitResponse"]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(METHOD, request_serializer=None,
                               response_deserializer=response_type.FromString)  # fmt: skip

    def send(start: int, count: int) -> None:
        descriptors = [(b"user", b"f%d" % i) for i in range(start, start + count)]
        answer = call(rls_request(b"flood", descriptors), timeout=60)
        run.answered += len(answer.statuses)
        run.admitted += count if answer.overall_code == 1 else 0

    def ask(client: Legit) -> bool:
        key = b"remote_address" if client.name.startswith("other") else b"user"
        answer = call(rls_request(b"flood", [(key, client.key.encode())]), timeout=60)
        return bool(answer.overall_code == 1)

    return send, ask


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("library", "service"))
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--max-keys", type=int, default=1_000_000)
    parser.add_argument("--legit-every", type=int, default=None,
                        help="flood keys between two asks of a legitimate client "
                        "(default: max_keys / 10)")  # fmt: skip
    parser.add_argument("--via", choices=("http", "grpc"), default="http")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    every = args.legit_every or max(1, args.max_keys // 10)
    print(f"{platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M')}", flush=True)  # fmt: skip
    if args.mode == "library":
        run = library(args.keys, args.max_keys, every)
    else:
        run = service(args.keys, args.max_keys, every, args.via)
        if run.answered != args.keys:
            raise RuntimeError(f"{run.answered:,} flood checks answered of {args.keys:,}")
    print(run.report())
    if args.json:
        Path(args.json).write_text(json.dumps(run.as_dict(), indent=1))
    return 1 if any(c.over for c in run.legit if c.name != "sparse") else 0


if __name__ == "__main__":
    sys.exit(main())
