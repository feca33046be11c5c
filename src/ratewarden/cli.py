"""The ``ratewarden`` command: ``serve``, ``demo``, ``check-config FILE``,
``explain FILE --attr k=v``, ``quota set|show|list``, ``simulate``.

The rule commands import ``ratewarden.rules`` (and so PyYAML) only when they run,
``serve`` the server packages only when it runs, ``quota`` the fleet quotas (and
so the Redis client) only when it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence

from . import __version__
from ._cliquota import add_quota, quota
from ._clirules import check_config, explain
from ._clock import FakeClock
from ._errors import RateLimitTimeout, RatewardenError
from ._limiter import AsyncLimiter, Limiter
from .algorithms import ALGORITHMS
from .stores import MemoryStore


def demo() -> None:
    print(f"ratewarden {__version__}: every algorithm, 5 per second, a burst of 8 requests")
    print("at t=0 then one request every 100 ms (simulated time).\n")
    print(f"{'algorithm':<24}{'burst':<10}then at t = 0.1 s, 0.2 s, ... 2.0 s")
    print(f"{'':<34}" + "".join(f"{t:>5}" for t in ("0.5s", "1.0s", "1.5s", "2.0s")))
    for name in ALGORITHMS:
        clock = FakeClock()
        limiter = Limiter("5/second", algorithm=name, store=MemoryStore(clock=clock))
        burst = "".join("#" if limiter.hit("demo").allowed else "." for _ in range(8))
        marks = []
        for _ in range(20):
            clock.advance(0.1)
            marks.append("#" if limiter.hit("demo").allowed else ".")
        print(f"{name:<24}{burst:<10}{''.join(marks)}")
    print("\n# admitted   . denied\n")

    print("acquire(): 4 async workers share one '10/second' gcra limit, burst 1 (real time)")
    shared = AsyncLimiter("10/second", algorithm="gcra", burst=1)

    async def worker(n: int, start: float) -> None:
        for _ in range(3):
            await shared.acquire("downstream-api", max_wait=2.0)
            print(f"  {time.monotonic() - start:5.2f}s  worker {n} got a permit")

    async def main() -> None:
        start = time.monotonic()
        await asyncio.gather(*(worker(n, start) for n in range(4)))

    asyncio.run(main())
    once = Limiter("1/minute", algorithm="token_bucket")
    once.acquire("k", max_wait=0)
    try:
        once.acquire("k", max_wait=0.5)
    except RateLimitTimeout as exc:
        print(f"\nwhen no permit can come in time: RateLimitTimeout: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ratewarden {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service: HTTP API, Envoy RLS gRPC, /auth")
    try:
        from .server import add_arguments  # noqa: PLC0415 - the server extra, if installed
    except ImportError:
        serve_missing = True
    else:
        serve_missing = False
        add_arguments(serve)
    sub.add_parser("demo", help="show every algorithm and acquire() at work")
    check = sub.add_parser("check-config", help="check a rule file; print its compiled rules")
    check.add_argument("file")
    check.add_argument("--strict", action="store_true", help="warnings fail the check too")
    why = sub.add_parser("explain", help="show which rules apply to a request, and why")
    why.add_argument("file")
    why.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a request attribute (method, path, ip, user, plan, ...)",
    )
    why.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                     help="a request header")  # fmt: skip
    add_quota(sub)
    simulate = sub.add_parser(
        "simulate", help="a fleet quota's members on a virtual clock: figures and plots"
    )
    # its options need the fleet package (and so the Redis client): imported only
    # when the command is simulate, as quota's and serve's packages are
    words = sys.argv[1:] if argv is None else list(argv)
    simulate_missing = True
    if words[:1] == ["simulate"]:
        try:
            from .fleet import _simulate  # noqa: PLC0415 - the Redis client, if installed
        except ImportError:
            pass
        else:
            simulate_missing = False
            _simulate.add_arguments(simulate)
    args = parser.parse_args(argv)
    try:
        if args.command == "quota":
            return quota(args)
        if args.command == "simulate":
            if simulate_missing:
                print("ratewarden simulate needs: pip install 'ratewarden[simulate]'",
                      file=sys.stderr)  # fmt: skip
                return 1
            return _simulate.main(args)
        if args.command == "serve":
            if serve_missing:
                print("ratewarden serve needs: pip install 'ratewarden[server,grpc]'",
                      file=sys.stderr)  # fmt: skip
                return 1
            from .server import options_from, run  # noqa: PLC0415

            return run(options_from(args))
        if args.command == "demo":
            demo()
        elif args.command == "check-config":
            return check_config(args.file, strict=args.strict)
        elif args.command == "explain":
            return explain(args.file, args.attr, args.header)
    except RatewardenError as exc:
        print(f"ratewarden: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
