"""Requests through real gateways in front of ``ratewarden serve`` get 200s, then
429s exactly as the rules say: Envoy (its rate-limit filter over gRPC), nginx
(auth_request) and Traefik (forwardAuth) with examples/gateways/rules.yaml (3 a
minute per client on /api/*), and Envoy with an envoyproxy/ratelimit config
served as a drop-in."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.server.process import Served, serving
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


PEER = Path(__file__).parent / "envoy_peer"


def test_envoy_in_front_of_an_envoy_ratelimit_config(backend: int, tmp_path: Path) -> None:
    """What envoyproxy/ratelimit answers for this config (envoy_peer/), from a
    real Envoy: nested descriptors, wildcards, share_threshold, shadow mode,
    unlimited, and paths no limit names."""
    with serving("--config", str(GATEWAYS / "rules.yaml"), "--envoy-config",
                 str(PEER / "config"), tmp=tmp_path) as served:  # fmt: skip
        port = free_port()
        config = rewrite((PEER / "envoy.yaml").read_text(),
                         {10000: port, BACKEND: backend, RW_GRPC: served.grpc})  # fmt: skip
        path = tmp_path / "envoy.yaml"
        path.write_text(config)
        command = [envoy_binary(), "-c", str(path), "--base-id", str(port), "-l", "warning",
                   "--disable-hot-restart"]  # fmt: skip
        with (
            gateway(command, port, tmp_path / "envoy.log", "envoy", tmp_path) as gw,
            httpx.Client(base_url=gw.url, timeout=10) as client,
        ):

            def codes(path: str, n: int, **headers: str) -> list[int]:
                return [client.get(path, headers=headers).status_code for _ in range(n)]

            # share_threshold: four different files, one counter of 3
            files = [client.get(f"/files/{name}").status_code for name in "abcd"]
            assert files == [200, 200, 200, 429]
            # a middle wildcard without share_threshold: a counter per path
            assert codes("/api/1/items", 3) == [200, 200, 429]
            assert codes("/api/2/items", 1) == [200]
            assert codes("/api/2/other", 3) == [200] * 3  # no match
            # nested: 2 per user; the path descriptor of /home has no limit
            assert codes("/home", 3, **{"x-user": "u1"}) == [200, 200, 429]
            assert codes("/home", 1, **{"x-user": "u2"}) == [200]
            assert codes("/shadow/x", 4) == [200] * 4  # over its limit, never denied
            assert codes("/health", 5) == [200] * 5  # unlimited
            assert codes("/elsewhere", 5) == [200] * 5
            denied = client.get("/files/e")
            assert denied.status_code == 429
            assert denied.headers["x-ratelimit-limit"] == "3"
            metrics = httpx.get(f"{served.url}/metrics").text
        served.terminate()
    shadow = 'ratelimit_service_rate_limit_shadow_mode{domain="edge",key="edge.path_/shadow*"'
    assert f'{shadow},key1="path_/shadow*",key2=""}} 3.0' in metrics
    files_key = 'domain="edge",key="edge.path_/files/*",key1="path_/files/*",key2=""'
    assert f"ratelimit_service_rate_limit_total_hits{{{files_key}}} 5.0" in metrics
