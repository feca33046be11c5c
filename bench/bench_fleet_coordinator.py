"""The fleet quota's coordinator in Redis: what a refresh costs, and how fast a change
of the total reaches a running member.

    .venv/bin/python bench/bench_fleet_coordinator.py [--rounds N]

Starts its own redis-server on a free loopback port (never the machine's shared one).

- Refresh cost: a resource with 8, 96 and 200 members, every member refreshing in
  turn with changing wants (fair_share, so the allocation sorts and water-fills);
  Redis's own CPU per refresh from ``INFO commandstats`` (``usec_per_call`` of
  EVALSHA), and the wall time of the round trip as the client sees it. Each member
  refreshes once a second by default, so a fleet of N costs Redis N times this a
  second.
- Reach of a change: a member on a thread of its own with a refresh interval of
  10 s; ``set_quota`` lowers (then restores) the total, and the time until the
  member's grant shows the new total is taken, ``--rounds`` times: pub/sub's reach,
  since the next refresh is seconds away.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_server import redis_server

from ratewarden.fleet import Coordinator, FleetQuota, QuotaConfig, set_quota


def refresh_cost(url: str, client: object, members: int, rounds: int) -> tuple[float, float]:
    name = f"bench-{members}"
    coordinator = Coordinator(client, name)
    coordinator.set(QuotaConfig("2000000/second", "fair_share", lease=60.0))
    ids = [f"member-{i:04d}" for i in range(members)]
    for i, member in enumerate(ids):
        coordinator.refresh(member, wants=i * 1000, has=0, used=0)
    client.config_resetstat()  # type: ignore[attr-defined]
    started = time.perf_counter()
    for r in range(rounds):
        for i, member in enumerate(ids):
            wants = (i * 7919 + r * 104_729) % 50_000 * 1000
            coordinator.refresh(member, wants=wants, has=0, used=0)
    wall = (time.perf_counter() - started) / (rounds * members) * 1e6
    stats = client.info("commandstats")  # type: ignore[attr-defined]
    return float(stats["cmdstat_evalsha"]["usec_per_call"]), wall


def reach(url: str, client: object, rounds: int) -> list[float]:
    config = QuotaConfig("1000/second", "equal", refresh=10.0, lease=30.0)
    times = []
    with FleetQuota("bench-reach", url, config=config) as quota:
        time.sleep(0.3)  # the refresh thread subscribes
        for r in range(rounds):
            total = 400 if r % 2 == 0 else 1000
            started = time.perf_counter()
            set_quota(client, "bench-reach", config.but(rate=f"{total}/second"))
            while quota.grant != total:
                time.sleep(0.0002)
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.05)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with redis_server() as server, server.client() as client:
        print(f"{'members':>8} {'redis CPU us/refresh':>22} {'wall us/refresh':>16}")
        for members in (8, 96, 200):
            cpu, wall = refresh_cost(server.url, client, members, max(2, args.rounds // 4))
            print(f"{members:>8} {cpu:>22.1f} {wall:>16.1f}")
        times = reach(server.url, client, args.rounds)
        print(
            f"a change of the total reaches a member (pub/sub), ms over {args.rounds} changes:"
            f" median {statistics.median(times):.2f}, max {max(times):.2f}"
        )


if __name__ == "__main__":
    main()
