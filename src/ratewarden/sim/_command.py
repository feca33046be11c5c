"""`ratewarden simulate`: a fleet of up to 200 members on a virtual clock, against
the coordinator's Python model or the real ``fleet.lua`` in a Redis, and what the
provider at the other end would see.

The simulation is event-driven (a heap of integer-nanosecond events); nothing
sleeps. Each member is a real `Member` (its `Share` included) on a clock of its
own, offset from the true time by its skew; the coordinator reads the true time
(the model is called with it, the script gets it through `Coordinator`'s clock).

- Refreshes: a member joins as `FleetQuota.start` does (one refresh, one more
  with an equal share's demand), then refreshes every interval jittered by ±10%,
  at the instant it is due: a refresh takes no time.
- The coordinator's messages (a change of the total): what it published (the
  model's ``published``; on Redis, the message read from a real subscription)
  reaches every live member ``pubsub_ms`` later; the member scales its grant and
  refreshes at once, as `FleetQuota`'s loop does. ``pubsub=False``: nobody hears,
  members learn at their next refresh.
- Requests: open-loop arrivals per member (Poisson, or evenly spaced), or a pool
  of closed-loop workers (``workers``) that each ask again ``think_ms`` after
  their last call returned, served or not. Each one
  is `acquire(max_wait)`: ``asked`` counted once, one `take`; if told to wait
  and the wait fits in ``max_wait`` the caller waits and tries
  again when told. A member's waiting callers are served first come, first
  served: only the oldest tries again, the others behind it (real threads all
  wake and race; the permits spent and the give-ups are the same, and it keeps
  the events to about one per permit). A caller whose next try falls after its
  deadline gives up, as `acquire` raises `RateLimitTimeout`.
- The truth is the provider's: admitted requests counted per aligned window
  (second) of the true clock, and per hundredth of it (10 ms).

The figures each run reports (`Result`): the largest ratio of the grants' sum to
the total, the coordinator's (every reply's ``held``) and the members' (the
grants they spend, a larger one from the window edge it applies at), checked at
every change, the moments after a cut of the total while some member has not
heard of it told apart; provider windows over the limit; utilisation (admitted
over min(total, offered) in the windows after the warm-up); how many refreshes a
member that joined late needs to come within 5% of its target (the allocation of
the total over the true demands); when the coordinator drops a dead member;
when a change of the total has reached every member.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from redis.exceptions import RedisError

from ..fleet.alloc import ALLOCATORS
from ..primitives import ConfigurationError, RatewardenError, StoreUnavailable
from ._backend import Backend, BackendFactory, ModelBackend, RedisBackend, TrueClock
from ._checks import check
from ._result import Result
from ._run import Run
from ._scenarios import PATTERNS, Scenario, documented

__all__ = [
    "Backend",
    "ModelBackend",
    "RedisBackend",
    "add_arguments",
    "documented",
    "main",
    "run",
    "simulate",
]


def simulate(
    scenario: Scenario,
    backend: BackendFactory | None = None,
    progress: _Progress | None = None,
) -> Result:
    """Run one scenario; on the coordinator's model unless ``backend`` says otherwise."""
    return Run(scenario, backend or ModelBackend, progress).run()


# -- output ---------------------------------------------------------------------------


class _Progress:
    """A progress bar on stderr, drawn only when it is a terminal."""

    def __init__(self, total: float, stream: TextIO) -> None:
        self.total = max(total, 1e-9)
        self.stream = stream
        self.enabled = stream.isatty()
        self.done = 0.0
        self.label = ""
        self._drawn = 0.0

    def advance(self, seconds: float) -> None:
        self.done += seconds
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            filled = min(30, int(30 * self.done / self.total))
            self.stream.write(
                f"\r[{'#' * filled}{'.' * (30 - filled)}] {100 * self.done / self.total:3.0f}%"
                f" {self.label[:40]:<40}"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 80 + "\r")
            self.stream.flush()


def _row(key: str, r: Result) -> list[str]:
    conv = r.convergence_max
    reclaim = r.reclaim_max
    reach = r.reach_max
    answered = r.answered_max
    return [
        key,
        r.scenario.algorithm,
        "yes" if r.scenario.pace else "no",
        f"{100 * r.utilisation:.1f}%",
        f"{len(r.over)}" + (f" ({r.max_excess:.1f}%)" if r.over else ""),
        f"{r.coord_max:.3f}",
        f"{r.local_max:.3f}",
        f"{r.local_max_cut:.3f}" if r.local_max_cut else "-",
        f"{r.bin_peak:.2f}",
        "-" if conv is None else ("never" if conv < 0 else str(conv)),
        "-" if reclaim is None else f"{reclaim:.2f}",
        "-" if reach is None else f"{reach[0] * 1000:.0f}ms/{reach[1]}",
        "-" if answered is None else ("never" if answered[1] < 0 else f"{answered[0]:.2f}"),
        f"{r.wall:.1f}",
    ]


_HEADER = ["run", "algorithm", "paced", "util", "over", "coord", "members", "at cut",
           "10ms peak", "conv", "reclaim s", "reach", "answered s", "wall s"]  # fmt: skip


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _explain(out: TextIO) -> None:
    print(
        "util: admitted / min(total, offered) after the warm-up; over: provider seconds over"
        " the limit (worst excess);\ncoord, members: the largest sum of grants / total (the"
        " coordinator's, the members' own); at cut: the members' while some had not heard of"
        " a cut;\n10ms peak: the fullest 10 ms of a saturated second over its mean; conv:"
        " refreshes until a late joiner is within 5% of its target;\nreclaim: seconds from a"
        " death to the coordinator dropping the member; reach: a change of the total to every"
        " member (time/refreshes);\nanswered: seconds from a coordinator that answered late"
        " (--unreachable) to every member holding its share",
        file=out,
    )


# -- the command --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ratewarden simulate``."""
    parser.description = (
        "Simulate a fleet of members sharing one quota on a virtual clock and report"
        " what the provider sees."
    )
    add = parser.add_argument
    add("--pattern", choices=PATTERNS, default="uniform",
        help="the demand: uniform, skewed (10:1), bursts (on/off), churn (join/leave/die),"
             " total-change (cut and raised), skew (clocks +-100 ms)")  # fmt: skip
    add("--members", type=int, default=8, help="members, 1-200 (default 8)")
    add("--total", default="2000/second",
        help="the fleet's total: a rate, or permits a second (default 2000/second)")  # fmt: skip
    add("--algorithm", choices=(*ALLOCATORS, "all"), default="fair_share",
        help="how the total is split; all: run each and compare")  # fmt: skip
    add("--seconds", type=float, default=60.0, help="simulated seconds (default 60)")
    add("--demand", type=float, default=1.5,
        help="the callers' offered load, a multiple of the total (default 1.5)")  # fmt: skip
    add("--pace", action=argparse.BooleanOptionalAction, default=True,
        help="spread each window's permits evenly (default: paced)")  # fmt: skip
    add("--skew-ms", type=float, default=None,
        help="clocks spread over +-this many ms (default 0; 100 for --pattern skew)")  # fmt: skip
    add("--seed", type=int, default=1,
        help="the seed of the demand's and clocks' randomness: the same seed, the same run "
        "(default 1)")  # fmt: skip
    add("--refresh", type=float, default=1.0, help="seconds between refreshes (default 1)")
    add("--lease", type=float, default=5.0, help="seconds a lease lasts (default 5)")
    add("--max-wait", type=float, default=None,
        help="a caller's max_wait, seconds (default one window)")  # fmt: skip
    add("--active", type=int, default=None, help="only the first N members have demand")
    add("--pubsub", action=argparse.BooleanOptionalAction, default=True,
        help="deliver the coordinator's messages (default yes)")  # fmt: skip
    add("--pubsub-ms", type=float, default=1.0, help="their delay (default 1 ms)")
    add(
        "--arrivals",
        choices=("poisson", "even"),
        default="poisson",
        help="open-loop callers arrive at random (poisson, the default) or evenly spaced",
    )
    add("--workers", type=int, default=0,
        help="closed-loop callers per member, each blocking in acquire and asking again"
             " when served or timed out (default 0: open-loop arrivals)")  # fmt: skip
    add("--think-ms", type=float, default=0.0,
        help="a worker's pause between being served and asking again (default 0)")  # fmt: skip
    add("--closed", type=int, default=None,
        help="only the first N members with demand have workers; the others arrive"
             " open-loop")  # fmt: skip
    add("--sliding", action="store_true",
        help="the resource's sliding mode: no stretch of one window, wherever it starts,"
             " over the total (see rolling_max)")  # fmt: skip
    add("--safe", type=_safe, default="equal",
        help="the resource's safe share: equal, or permits a window (default equal)")  # fmt: skip
    add("--unreachable", type=float, default=0.0, metavar="SECONDS",
        help="the coordinator does not answer for the first SECONDS (at most a quarter of"
             " the run): the members start before their Redis and create the resource from"
             " their config when it answers (default 0)")  # fmt: skip
    add("--warmup", type=float, default=5.0,
        help="seconds left out of utilisation (default 5)")  # fmt: skip
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", action="store_true",
                       help="the coordinator's Python model (the default)")  # fmt: skip
    where.add_argument("--store", "--redis", dest="redis", metavar="URL",
                       help="fleet.lua on this Redis")  # fmt: skip
    where.add_argument("--start-redis", action="store_true",
                       help="start a redis-server of our own on a free loopback port")  # fmt: skip
    add("--scenarios", action="store_true",
        help="run the documented scenarios (a)-(g) and check their figures")  # fmt: skip
    add("--plots", metavar="DIR", type=Path, help="write fleet-*.png plots into DIR")
    add("--json", action="store_true", help="print the results as JSON")


def _safe(text: str) -> str | int:
    return text if text == "equal" else int(text)


def _rate(text: str) -> str:
    return f"{text}/second" if text.strip().isdigit() else text


def scenarios_from(args: argparse.Namespace) -> list[Scenario]:
    """The runs the options ask for (one per algorithm with ``--algorithm all``)."""
    algorithms = ALLOCATORS if args.algorithm == "all" else (args.algorithm,)
    return [
        Scenario(
            pattern=args.pattern,
            members=args.members,
            rate=_rate(args.total),
            algorithm=algorithm,
            seconds=args.seconds,
            demand=args.demand,
            pace=args.pace,
            skew_ms=args.skew_ms,
            seed=args.seed,
            refresh=args.refresh,
            lease=args.lease,
            max_wait=args.max_wait,
            active=args.active,
            pubsub=args.pubsub,
            pubsub_ms=args.pubsub_ms,
            warmup=args.warmup,
            arrivals=args.arrivals,
            workers=args.workers,
            think_ms=args.think_ms,
            closed=args.closed,
            sliding=args.sliding,
            safe=args.safe,
            unreachable=args.unreachable,
        )
        for algorithm in algorithms
    ]


@contextmanager
def redis_server() -> Iterator[str]:
    """A redis-server of our own on a free loopback port (never 6379); its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise ConfigurationError("--start-redis needs redis-server on the PATH")
    with tempfile.TemporaryDirectory(prefix="rw-simulate-") as workdir:
        port = 6379
        while port == 6379:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
        process = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                        sock.sendall(b"PING\r\n")
                        if sock.recv(16).startswith(b"+PONG"):
                            break
                except OSError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    raise StoreUnavailable(f"redis-server on port {port} did not start")
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def coordinator(args: argparse.Namespace) -> Iterator[BackendFactory]:
    """The coordinator the options name: the model, a Redis, or one started here."""
    if not (args.redis or args.start_redis):
        yield ModelBackend
        return
    from ..stores.redis.connection import connect  # noqa: PLC0415 - only with a Redis

    with _redis_url(args) as url:
        client = connect(url, 5.0)
        try:

            def factory(clock: TrueClock) -> Backend:
                return RedisBackend(client, clock, f"simulate-{uuid.uuid4().hex[:10]}")

            yield factory
        finally:
            client.close()


@contextmanager
def _redis_url(args: argparse.Namespace) -> Iterator[str]:
    if args.start_redis:
        with redis_server() as url:
            yield url
    else:
        yield str(args.redis)


@contextmanager
def _members_quiet() -> Iterator[None]:
    """The simulated members' warnings (the coordinator they cannot reach, with
    ``--unreachable``) are the scenario, not news: one pair a member would bury
    the table."""
    fleet = logging.getLogger("ratewarden.fleet")
    level = fleet.level
    fleet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        fleet.setLevel(level)


def main(args: argparse.Namespace) -> int:
    """``ratewarden simulate``: 0, or 1 when a documented figure missed or an
    option was wrong."""
    try:
        return run(args, sys.stdout, sys.stderr)
    except (RatewardenError, RedisError, OSError) as exc:
        print(f"ratewarden simulate: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.scenarios:
        runs = documented(args.seconds, args.seed)
    else:
        runs = {f"{s.pattern}/{s.algorithm}": s for s in scenarios_from(args)}
    twin: Scenario | None = None
    if args.plots is not None and not args.scenarios:
        first = next(iter(runs.values()))
        twin = first.but(pace=not first.pace)  # the pacing plot: the same run, both ways
    progress = _Progress(
        sum(s.seconds for s in runs.values()) + (twin.seconds if twin else 0.0), err
    )
    results: dict[str, Result] = {}
    try:
        with coordinator(args) as backend, _members_quiet():
            for key, scenario in runs.items():
                progress.label = key
                results[key] = simulate(scenario, backend, progress)
            twin_result = simulate(twin, backend, progress) if twin is not None else None
    finally:
        progress.close()
    checks = check(results) if args.scenarios else []
    if args.json:
        json.dump(
            {
                "runs": {key: r.summary() for key, r in results.items()},
                "checks": [c.as_dict() for c in checks],
            },
            out,
            indent=1,
        )
        out.write("\n")
    else:
        first_result = next(iter(results.values()))
        print(f"{first_result.backend}: {len(results)} run(s)", file=out)
        print(table([_HEADER, *(_row(k, r) for k, r in results.items())]), file=out)
        _explain(out)
        if checks:
            print(file=out)
            rows = [["fig", "what", "measured", "target", ""]]
            rows += [
                [c.figure, c.what, c.measured, c.target,
                 "-" if c.ok is None else ("met" if c.ok else "MISSED")]
                for c in checks
            ]  # fmt: skip
            print(table(rows), file=out)
    if args.plots is not None:
        from . import _plots  # noqa: PLC0415 - matplotlib only when plots are asked for

        if twin_result is None:
            written = _plots.documented(results, args.plots)
        else:
            pair = (next(iter(results.values())), twin_result)
            written = _plots.plots(list(results.values()), pair, args.plots)
        for path in written:
            print(f"wrote {path}", file=err)
    return 0 if all(c.ok is not False for c in checks) else 1


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="ratewarden simulate")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
