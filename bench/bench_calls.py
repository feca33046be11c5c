"""Python calls per check in the service, from the app's entry to its answer:
the length of a check's path (docs/architecture.md walks it), counted with
``sys.setprofile`` over one check after a warm-up, on examples/rules.yaml and
the memory store, with the requests of bench_service.py.

    .venv/bin/python bench/bench_calls.py [--show]
    PYTHONPATH=/path/to/other/checkout/src .venv/bin/python bench/bench_calls.py

"ours" counts the functions of ratewarden's own code (what the issue's "calls
from the app's entry to the store and back" counts); "all" adds every other
Python function run (msgspec and protobuf are C). The ASGI app is called
directly for ``POST /v1/check`` and ``RateLimitService.should_rate_limit`` for
``ShouldRateLimit``: the socket, HTTP and HTTP/2 layers are not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

RULES = str(Path(__file__).parent.parent / "examples" / "rules.yaml")
WARM = 50


def attributes(i: int) -> dict[str, str]:  # bench_service.py's users
    return {"method": "GET", "path": f"/api/v1/orders/{i}", "user": f"user-{i}",
            "ip": f"10.0.{i // 256 % 256}.{i % 256}", "org": f"org-{i % 500}",
            "plan": "pro"}  # fmt: skip


async def callers() -> dict[str, Callable[[int], Awaitable[Any]]]:
    from ratewarden.server._app import App  # noqa: PLC0415
    from ratewarden.server._rls import RateLimitService  # noqa: PLC0415

    try:
        from ratewarden.server._protos import messages  # noqa: PLC0415
    except ImportError:  # a checkout from before the service's parts
        from ratewarden.server._grpc_server import messages  # type: ignore[attr-defined,no-redef]  # noqa: PLC0415
    from ratewarden.server._service import Service  # noqa: PLC0415
    from ratewarden.stores import AsyncMemoryStore  # noqa: PLC0415

    service = Service(RULES, AsyncMemoryStore())
    await service.start()
    app = App(service)
    if hasattr(service, "checker"):
        rls = RateLimitService(service.checker, service.metrics)
    else:  # a checkout from before the service's parts took the whole service
        rls = RateLimitService(service)  # type: ignore[call-arg]
    request_type = messages()["RateLimitRequest"]

    async def send(message: dict[str, Any]) -> None:
        pass

    async def http(i: int) -> None:
        body = json.dumps({"attributes": attributes(i)}).encode()
        scope = {"type": "http", "method": "POST", "path": "/v1/check",
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}  # fmt: skip
        messages_ = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return messages_.pop()

        await app(scope, receive, send)

    async def grpc(i: int) -> None:
        request = request_type(domain="ratewarden")
        d = request.descriptors.add()
        a = attributes(i)
        for key, value in (("remote_address", a.pop("ip")), *a.items()):
            d.entries.add(key=key, value=value)
        await rls.should_rate_limit(request.SerializeToString(), ())

    return {"HTTP /v1/check": http, "gRPC ShouldRateLimit": grpc}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--show", action="store_true", help="list ours, in order")
    args = parser.parse_args()
    import ratewarden  # noqa: PLC0415

    print(f"ratewarden from {Path(ratewarden.__file__).parent}")
    for name, call in (await callers()).items():
        for i in range(WARM):
            await call(i)
        seen: list[tuple[str, str]] = []

        def profile(frame: Any, event: str, arg: Any, seen: list[tuple[str, str]] = seen) -> None:
            if event == "call":
                seen.append((frame.f_code.co_filename, frame.f_code.co_name))

        sys.setprofile(profile)
        await call(WARM + 27)
        sys.setprofile(None)
        ours = [(f.split("/ratewarden/", 1)[1], n) for f, n in seen if "/ratewarden/" in f]
        modules = len({f for f, _ in ours})
        print(f"{name:24} ours {len(ours):3} calls over {modules} modules, all {len(seen)}")
        if args.show:
            for path, function in ours:
                print(f"    {path}:{function}")


if __name__ == "__main__":
    asyncio.run(main())
