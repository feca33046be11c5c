"""Requests through Envoy, nginx and Traefik get 200s, then 429s exactly as
examples/gateways/rules.yaml says (3 a minute per client on /api/*)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.server.process import Served
from tests.system.conftest import (
    BACKEND,
    GATEWAYS,
    RW_GRPC,
    RW_HTTP,
    Gateway,
    envoy_binary,
    free_port,
    gateway,
    nginx_binary,
    rewrite,
    traefik_binary,
)


def three_then_429(gw: Gateway, *, headers_on_429: bool = True) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as client:
        answers = [client.get("/api/hello") for _ in range(5)]
        elsewhere = [client.get("/public").status_code for _ in range(5)]
    codes = [a.status_code for a in answers]
    assert codes == [200, 200, 200, 429, 429], [(a.status_code, a.text) for a in answers]
    assert answers[0].text == "backend says hello\n"
    assert elsewhere == [200] * 5  # no rule applies there
    denied = answers[3]
    assert 1 <= int(denied.headers["retry-after"]) <= 60
    if headers_on_429:
        assert denied.headers["x-ratelimit-limit"] == "3"
        assert denied.headers["x-ratelimit-remaining"] == "0"


def test_envoy_ratelimit_filter_asks_our_grpc_service(
    ratewarden: Served, backend: int, tmp_path: Path
) -> None:
    port = free_port()
    config = rewrite((GATEWAYS / "envoy" / "envoy.yaml").read_text(),
                     {10000: port, BACKEND: backend, RW_GRPC: ratewarden.grpc})  # fmt: skip
    path = tmp_path / "envoy.yaml"
    path.write_text(config)
    command = [envoy_binary(), "-c", str(path), "--base-id", str(port), "-l", "warning",
               "--disable-hot-restart"]  # fmt: skip
    with gateway(command, port, tmp_path / "envoy.log", "envoy", tmp_path) as gw:
        three_then_429(gw)
        with httpx.Client(base_url=gw.url) as client:
            allowed = client.get("/public")
        assert allowed.status_code == 200


def test_nginx_auth_request_asks_our_auth_endpoint(
    ratewarden: Served, backend: int, tmp_path: Path
) -> None:
    port = free_port()
    config = rewrite((GATEWAYS / "nginx" / "nginx.conf").read_text(),
                     {10001: port, BACKEND: backend, RW_HTTP: ratewarden.http})  # fmt: skip
    path = tmp_path / "nginx.conf"
    path.write_text(config)
    globals_ = f"daemon off; master_process off; pid {tmp_path}/nginx.pid; error_log stderr warn;"
    command = [nginx_binary(), "-p", str(tmp_path), "-c", str(path), "-g", globals_]
    (tmp_path / "logs").mkdir()  # nginx opens its default log there before reading -g
    with gateway(command, port, tmp_path / "nginx.log", "nginx", tmp_path) as gw:
        three_then_429(gw)


def test_traefik_forward_auth_asks_our_auth_endpoint(
    ratewarden: Served, backend: int, tmp_path: Path
) -> None:
    port = free_port()
    ports = {10002: port, BACKEND: backend, RW_HTTP: ratewarden.http}
    for name in ("traefik.yml", "dynamic.yml"):
        (tmp_path / name).write_text(rewrite((GATEWAYS / "traefik" / name).read_text(), ports))
    command = [traefik_binary(), f"--configFile={tmp_path / 'traefik.yml'}"]
    with gateway(command, port, tmp_path / "traefik.log", "traefik", tmp_path) as gw:
        wait_for_router(gw)
        three_then_429(gw)


def wait_for_router(gw: Gateway) -> None:
    """Traefik listens before the file provider's routes are in: 404 until then.
    /healthcheck is no route of ours, so it probes without counting against /api/*."""
    import time  # noqa: PLC0415

    deadline = time.monotonic() + 20
    with httpx.Client(base_url=gw.url) as client:
        while client.get("/probe").status_code == 404:
            if time.monotonic() > deadline:
                raise AssertionError(f"traefik never routed:\n{gw.log.read_text()[-2000:]}")
            time.sleep(0.05)
