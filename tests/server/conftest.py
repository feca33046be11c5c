"""The service's tests: the ASGI app in process through httpx, the gRPC server on
a free loopback port, and ``ratewarden serve`` as a real process."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from ratewarden import AsyncMemoryStore
from ratewarden.server import App, Service

# Sliding logs, not fixed windows: the service runs on the wall clock, and a fixed
# window's edge falls on the minute, so a test whose checks straddle it would see a
# fresh window (seen: a fourth login allowed out of 3/minute). A log counts the last
# minute whenever the test runs. ENVOY's descriptors are fixed windows by Envoy's own
# meaning: an hour's, whose edge a test straddles sixty times less often.
RULES = textwrap.dedent("""
    version: 1
    client_ip:
      trusted_proxies: [127.0.0.0/8]
    rules:
      - name: login
        rate: 3/minute
        algorithm: sliding_window_log
        by: ip
        match: {paths: /api/login, methods: POST}
      - name: per-user
        rate: 10/minute
        algorithm: sliding_window_log
        by: user
      - name: search
        rate: 2/minute
        algorithm: sliding_window_log
        by: user
        status: 503
        match: {paths: /api/search}
      - name: comments
        rate: 1/hour
        algorithm: sliding_window_log
        by: user
        action: shadow_ban
        response: {status: 202, body: queued, headers: {x-queued: "yes"}}
        match: {paths: /api/comments, methods: POST}
      - name: watched
        rate: 4/minute
        algorithm: sliding_window_log
        action: log_only
        match: {paths: /api/watched}
""")

ENVOY = textwrap.dedent("""
    domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: path
        value: /blocked
        rate_limit: {unit: hour, requests_per_unit: 0}
      - key: path
        value: /free
        rate_limit: {unlimited: true}
""")


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


@pytest.fixture
def envoy_file(tmp_path: Path) -> Path:
    path = tmp_path / "edge.yaml"
    path.write_text(ENVOY)
    return path


Client = Callable[..., "AsyncIterator[httpx.AsyncClient]"]


@asynccontextmanager
async def client_for(app: App) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
    # a loopback name: without a token, the admin endpoints answer no other
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as client:
        yield client


def make_app(rules: Path, envoy: Path | None = None, **options: object) -> App:
    service = Service(rules, AsyncMemoryStore(), envoy_files=() if envoy is None else (envoy,))
    return App(service, **options)  # type: ignore[arg-type]
