"""Faults in a Redis Cluster of our own under load, for the sync and the async
cluster store: a master SIGKILLed (its replica takes over; what asynchronous
replication had not carried yet shows up as over-admission, measured), and the
slot of the key being hit migrated to another master (ASK while it moves, MOVED
after), which must cost nothing: no degraded decision, no count lost; and, counted
rather than timed, the round trips an async batch costs while its slot migrates."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.crc import key_slot

from ratewarden import AsyncLimiter, Decision, Limiter
from ratewarden.stores.redis import AsyncRedisStore, RedisStore
from ratewarden.stores.redis.connection import QUIET
from tests.faults.load import (
    TASKS,
    THREADS,
    TIMEOUT,
    Heal,
    Report,
    Target,
    arun_fault,
    name,
    run_fault,
)
from tests.redis_server import RedisCluster, RedisServer, redis_cluster

FAILOVER = 30.0  # cluster-node-timeout is 2 s: a replica takes over in 2-4 s
# Keys a failover may lose: the writes of the last moment before the kill, which
# replication had not carried to the replica yet (measured: a handful at most).
LOST_TO_FAILOVER = 50
FILLERS = 300  # other keys in the migrated slot, so that moving it takes a while
STEP = 10  # keys per MIGRATE
PACE = 0.02  # between MIGRATEs
# What a cluster client's measurements allow for (see Report): tracemalloc would
# slow its topology refresh, the decisions measured with it; the async client
# holds up to 2 connections a node (a pipeline's, and one it asks for the cluster's
# map on), measured bounded over 8 rounds of killed connections; a new map is new
# node objects (about 200 more after a failover, measured).
CLUSTER: dict[str, Any] = {"trace_memory": False, "spare_conns": 1, "objects_bound": 400}
WARM_ROUNDS = 20  # decisions by Redis per worker and master before the fault
# A cold client's first checks (the async client's map of the cluster, the scripts
# loaded on every master) may outlast the 50 ms timeout on a loaded machine: the
# warm-up tries a degraded one again, for up to this long.
WARM_LIMIT = 10.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A cluster for this module alone: its tests kill masters and move slots."""
    with redis_cluster() as made:
        yield made


def admin(node: RedisServer) -> redis.Redis:
    return redis.Redis(port=node.port, **QUIET)  # says nothing on connecting


def alive(cluster: RedisCluster) -> list[RedisServer]:
    return [n for n in cluster.nodes if n.process is not None and n.process.poll() is None]


def node_id(node: RedisServer) -> str:
    with admin(node) as client:
        return str(client.execute_command("CLUSTER MYID").decode())


def is_master(node: RedisServer) -> bool:
    with admin(node) as client:
        return bool(client.info("replication")["role"] == "master")


def owner(cluster: RedisCluster, key: str) -> RedisServer:
    """The live master that says it serves ``key``'s slot now (each node's CLUSTER
    SLOTS lists every owner, as far as gossip has told it)."""
    slot = key_slot(key.encode())
    for node in alive(cluster):
        with admin(node) as client:
            mine = client.execute_command("CLUSTER MYID").decode()
            for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end and master[2].decode() == mine:
                    return node
    raise AssertionError(f"no live master serves slot {slot}")


def replica_of(cluster: RedisCluster, master: RedisServer) -> RedisServer | None:
    for node in alive(cluster):
        with admin(node) as client:
            info = client.info("replication")
            if info["role"] == "slave" and info["master_port"] == master.port:
                return node
    return None


def tag_for(cluster: RedisCluster, wanted: Callable[[RedisServer], bool]) -> str:
    """A hash tag whose slot a master ``wanted`` serves."""
    for i in range(1000):
        tag = f"{{fault-{i}}}"
        if wanted(owner(cluster, tag)):
            return tag
    raise AssertionError("no hash tag lands on a suitable master")


def target(cluster: RedisCluster) -> Target:
    def servers() -> list[int]:
        return [node.process.pid for node in cluster.nodes if node.process is not None]

    return Target(lambda: {node.port for node in cluster.nodes}, servers=servers)


def promoted(replica: RedisServer) -> Heal:
    """Waits until ``replica`` is a master: the failover is over. Returns when it
    last saw it was not yet, the fault's surely-still-on moment."""

    def wait() -> float:
        last = time.monotonic()
        deadline = last + FAILOVER
        while True:
            asked = time.monotonic()
            if is_master(replica):
                return last
            last = asked
            if asked > deadline:
                raise AssertionError(f"no failover within {FAILOVER}s")
            time.sleep(0.02)

    return wait


def kill_plan(cluster: RedisCluster, store: str) -> tuple[Report, Callable[[], None], Heal]:
    """A tag on a master that still has a replica; kill the master, wait for it."""
    tag = tag_for(cluster, lambda master: replica_of(cluster, master) is not None)
    victim = owner(cluster, tag)
    replica = replica_of(cluster, victim)
    assert replica is not None
    report = Report(store, "master SIGKILL", key=tag, hold=0.0, max_over=LOST_TO_FAILOVER,
                    **CLUSTER)  # fmt: skip
    return report, victim.kill, promoted(replica)


def masters_tags(cluster: RedisCluster) -> list[str]:
    """A hash tag on each live master."""
    tags: dict[int, str] = {}
    for i in range(1000):
        tag = f"{{warm-{i}}}"
        tags.setdefault(owner(cluster, tag).port, tag)
        if len(tags) == sum(is_master(n) for n in alive(cluster)):
            return list(tags.values())
    raise AssertionError("no hash tags for every master")


def warm(store: RedisStore, cluster: RedisCluster) -> None:
    """Connections to every master, as many as the load will use (a connection
    the client opens later to a master it had not used, a failover's new one or a
    migration's destination, is no leak). A check that timed out is tried again
    (see WARM_LIMIT): the warm-up is not what is measured."""
    limiter = Limiter("1000000/year", store=store, name=name(), on_failure="fail_open")
    tags = masters_tags(cluster)
    deadline = time.monotonic() + WARM_LIMIT

    def work() -> None:
        for _ in range(WARM_ROUNDS):
            for tag in tags:
                while limiter.hit(tag).degraded:
                    assert time.monotonic() < deadline, f"no decision by Redis in {WARM_LIMIT}s"
                    time.sleep(0.01)

    workers = [threading.Thread(target=work) for _ in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)


async def awarm(store: AsyncRedisStore, cluster: RedisCluster) -> None:
    """As `warm`, with TASKS tasks."""
    limiter = AsyncLimiter("1000000/year", store=store, name=name(), on_failure="fail_open")
    tags = masters_tags(cluster)
    deadline = time.monotonic() + WARM_LIMIT

    async def work() -> None:
        for _ in range(WARM_ROUNDS):
            for tag in tags:
                while (await limiter.hit(tag)).degraded:
                    assert time.monotonic() < deadline, f"no decision by Redis in {WARM_LIMIT}s"
                    await asyncio.sleep(0.01)

    await asyncio.gather(*(work() for _ in range(TASKS)))


def test_sync_master_killed(cluster: RedisCluster) -> None:
    report, kill, failover = kill_plan(cluster, "cluster-sync")
    with RedisStore(cluster.url, timeout=TIMEOUT) as store:
        warm(store, cluster)
        run_fault(store, report, target(cluster), kill, failover, recover=10.0)
    print("\n" + report.line())
    report.check()


def test_async_master_killed(cluster: RedisCluster) -> None:
    report, kill, failover = kill_plan(cluster, "cluster-async")

    async def main() -> None:
        async with AsyncRedisStore(cluster.url, timeout=TIMEOUT) as store:
            await awarm(store, cluster)
            await arun_fault(store, report, target(cluster), kill, failover, recover=10.0)

    asyncio.run(main())
    print("\n" + report.line())
    report.check()


def migrate(cluster: RedisCluster, tag: str, source: RedisServer, dest: RedisServer) -> None:
    """Move ``tag``'s slot from ``source`` to ``dest`` as redis-cli --cluster
    reshard does: IMPORTING and MIGRATING, MIGRATE the keys a few at a time,
    then tell every master the slot's new owner."""
    slot = key_slot(tag.encode())
    source_id, dest_id = node_id(source), node_id(dest)
    with admin(source) as src, admin(dest) as dst:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dest_id)
        while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, STEP):
            src.execute_command("MIGRATE", "127.0.0.1", dest.port, "", 0, 5000, "KEYS", *keys)
            time.sleep(PACE)
        dst.execute_command("CLUSTER SETSLOT", slot, "NODE", dest_id)
        src.execute_command("CLUSTER SETSLOT", slot, "NODE", dest_id)
    for node in alive(cluster):
        if node not in (source, dest) and is_master(node):
            with admin(node) as client:
                client.execute_command("CLUSTER SETSLOT", slot, "NODE", dest_id)


def migration_plan(cluster: RedisCluster, store: str) -> tuple[Report, Callable[[], None]]:
    tag = tag_for(cluster, lambda master: True)
    source = owner(cluster, tag)
    dest = next(n for n in alive(cluster) if n is not source and is_master(n))
    with admin(source) as client:  # other keys in the slot: the move takes a while
        client.mset({f"{tag}:filler:{i}": i for i in range(FILLERS)})
    report = Report(store, "slot migration", key=tag, hold=0.0, expect_degraded=False,
                    **CLUSTER)  # fmt: skip

    def move() -> None:
        migrate(cluster, tag, source, dest)
        assert owner(cluster, tag) is dest, "the slot did not move"

    return report, move


def test_sync_slot_migrated_under_load(cluster: RedisCluster) -> None:
    report, move = migration_plan(cluster, "cluster-sync")
    with RedisStore(cluster.url, timeout=TIMEOUT) as store:
        warm(store, cluster)
        run_fault(store, report, target(cluster), move, lambda: None)
    print("\n" + report.line())
    report.check()


def test_async_slot_migrated_under_load(cluster: RedisCluster) -> None:
    report, move = migration_plan(cluster, "cluster-async")

    async def main() -> None:
        async with AsyncRedisStore(cluster.url, timeout=TIMEOUT) as store:
            await awarm(store, cluster)
            await arun_fault(store, report, target(cluster), move, lambda: None)

    asyncio.run(main())
    print("\n" + report.line())
    report.check()


def test_async_redirects_go_out_pipelined(cluster: RedisCluster, monkeypatch: Any) -> None:
    """While a slot migrates and the key has left, each batch of checks costs two
    round trips: the pipeline to the old owner (ASK), then one to the new owner,
    an ASKING before each check; once the slot has moved, the first batch two
    (MOVED), the next one. Never a command at a time: redis-py's pipeline follows
    each redirection alone, an ASK's by way of the old owner again (three round
    trips a check, one after another), which under load outlasted the timeout for
    as long as a migration lasted. Counted, not timed: it holds on a busy machine."""
    tag = "{redirects}"
    slot = key_slot(tag.encode())
    source = owner(cluster, tag)
    dest = next(n for n in alive(cluster) if n is not source and is_master(n))
    source_id, dest_id = node_id(source), node_id(dest)
    sent = {"pipelines": 0, "commands": 0}
    pipeline, command = AsyncClusterNode.execute_pipeline, AsyncClusterNode.execute_command

    async def counted_pipeline(node: AsyncClusterNode, commands: Any) -> Any:
        sent["pipelines"] += 1
        return await pipeline(node, commands)

    async def counted_command(node: AsyncClusterNode, *args: Any, **kwargs: Any) -> Any:
        sent["commands"] += 1
        return await command(node, *args, **kwargs)

    async def checks(limiter: AsyncLimiter) -> list[Decision]:
        # one loop turn: one batch (a redirection may add another round trip)
        return list(await asyncio.gather(*(limiter.hit(tag) for _ in range(TASKS))))

    async def main() -> None:
        async with AsyncRedisStore(cluster.url, timeout=1.0) as store:  # counted, not timed
            limiter = AsyncLimiter("1000000/year", store=store, name=name())
            await checks(limiter)  # the map, the scripts, the key on its owner
            await asyncio.to_thread(start_migration)
            costs["first ASK"] = await counted(checks(limiter))
            costs["ASK"] = await counted(checks(limiter))
            await asyncio.to_thread(end_migration)
            costs["MOVED"] = await counted(checks(limiter))
            costs["moved"] = await counted(checks(limiter))
            assert owner(cluster, tag) is dest

    async def counted(batch: Any) -> dict[str, int]:
        sent.update(pipelines=0, commands=0)
        decisions = await batch
        assert not any(d.degraded for d in decisions), decisions
        return dict(sent)

    def start_migration() -> None:
        with admin(source) as src, admin(dest) as dst:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dest_id)
            keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
            assert keys, "no key in the slot to move"
            src.execute_command("MIGRATE", "127.0.0.1", dest.port, "", 0, 5000, "KEYS", *keys)

    def end_migration() -> None:
        for node in [dest, source, *(n for n in alive(cluster) if is_master(n))]:
            with admin(node) as client:
                client.execute_command("CLUSTER SETSLOT", slot, "NODE", dest_id)

    costs: dict[str, dict[str, int]] = {}
    monkeypatch.setattr(AsyncClusterNode, "execute_pipeline", counted_pipeline)
    monkeypatch.setattr(AsyncClusterNode, "execute_command", counted_command)
    asyncio.run(main())
    print(f"\nREDIRECTS round trips of a batch of {TASKS} checks: {costs}")
    assert costs == {
        "first ASK": {"pipelines": 2, "commands": 0},
        "ASK": {"pipelines": 2, "commands": 0},
        "MOVED": {"pipelines": 2, "commands": 0},
        "moved": {"pipelines": 1, "commands": 0},
    }
