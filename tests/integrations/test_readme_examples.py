"""The README's FastAPI and Flask examples (which tests/test_readme.py runs)
really limit: 100 requests pass, then they are refused.

They run on the wall clock, and the sliding window counter may admit one more
request when a minute boundary falls within the burst (its estimate of the
previous window rounds down), so the check is on the 102nd, refused either way."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from flask import Flask

from tests.test_readme import BLOCKS


def run_block(marker: str) -> dict[str, Any]:
    (block,) = [b for b in BLOCKS if marker in b]
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(block, f"README.md {marker} block", "exec"), namespace)
    return namespace


def test_the_fastapi_example_limits() -> None:
    app: FastAPI = run_block("FastAPI()")["app"]

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    with TestClient(app) as client:
        responses = [client.get("/hello") for _ in range(102)]
    assert [r.status_code for r in responses[:100]] == [200] * 100
    assert responses[-1].status_code == 429
    assert responses[0].headers["RateLimit-Policy"] == '"per-ip";q=100;w=60'


def test_the_flask_example_limits() -> None:
    app: Flask = run_block("Flask(__name__)")["app"]

    @app.get("/hello")
    def hello() -> dict[str, str]:
        return {"hello": "world"}

    client = app.test_client()
    responses = [client.get("/hello") for _ in range(102)]
    assert [r.status_code for r in responses[:100]] == [200] * 100
    assert responses[-1].status_code == 429
    assert responses[-1].headers["Content-Type"] == "application/problem+json"
