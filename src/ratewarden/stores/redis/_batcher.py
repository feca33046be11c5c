"""Concurrent async checks coalesced into pipelines, and a cluster's redirections
followed a batch at a time."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from typing import Any, TypeAlias

from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...primitives import StoreError, StoreUnavailable
from ._async_wire import AsyncWire, Unsupported
from .connection import FAILURES
from .scripts import BATCH, Scripts

__all__ = ["Batcher"]

log = logging.getLogger("ratewarden.stores")

# a check for Batcher: script, numkeys, arguments, its caller's future, when it came
_Item: TypeAlias = tuple[str, int, list[Any], asyncio.Future[Any], float]
# a cluster node's answer that says the client's map of the cluster may be wrong
_MAP_FAILURES = (RedisConnectionError, RedisTimeoutError, ClusterDownError, SlotNotCoveredError)
# a cluster node's answer that says where to send a command instead (MovedError is an
# AskError), or to send it again
_REDIRECTS = (AskError, TryAgainError)
REDIRECT_ROUNDS = 3  # a stale map's MOVED, then the new owner's ASK, and one spare
# Batches on the store's own connection at once: while Redis runs one, the next is
# packed and sent, and the one before answered. More than a few adds round trips of
# fewer checks each without keeping Redis any busier.
IN_FLIGHT = 4
# A turn of at least this many checks that finds no round trip out goes in two
# halves (see Batcher). Below it a second script call costs Redis and the client
# more than the overlap gives back: 2 to 8 callers in a closed loop ran 0-12%
# slower and used 20-24% more Redis CPU a check split, 16 ran 37% faster for 12%.
SPLIT_AT = 16


async def _move_slot(manager: Any, error: MovedError) -> None:
    """Points ``error``'s slot at its new owner in a cluster client's map, as
    redis-py does on a MOVED: redis-py 8 awaits ``move_slot``, 7.2 to 7.4 call it,
    older ones apply the error at their next lookup of a slot."""
    move = getattr(manager, "move_slot", None)
    if move is None:
        manager._moved_exception = error
        return
    done = move(error)
    if inspect.isawaitable(done):
        await done


class Batcher:
    """Coalesces concurrent checks into pipelines: every check submitted in one turn
    of the event loop goes out in one round trip (at most ``max_batch`` a time). On
    the store's own connection (``wire``) up to `IN_FLIGHT` round trips are out at
    once, pipelined (Redis answers them in order), and checks submitted while they
    are go in the next; through redis-py (a cluster, Sentinel), one at a time. No
    timer: the batching window is the loop's own turn, microseconds.

    A turn of `SPLIT_AT` checks or more that finds no round trip out sends them
    in two halves, one after the other: Redis answers the first while it runs
    the second, and the first half's callers make their next checks meanwhile,
    which go out while the second half is answered. Sent whole, a closed loop of
    callers (each waiting for its answer to make its next check) leaves Redis
    idle while the client works and the client idle while Redis does: 64 such
    callers made 100,000 checks a second sent whole and 165,000 in halves
    (bench/RESULTS.md).

    With a ``timeout``, each check is answered or failed within it of its
    submission: a batch must be over by its oldest check's deadline, connecting
    and reloading scripts included, so a check that waited behind a hung batch
    does not then wait a whole timeout more. (The first batch on a cluster
    client first waits for its map of the cluster, under the client's own
    timeouts, as the sync store's constructor does.)

    redis-py's cluster pipeline puts a node's connection error in its
    commands' places and keeps its map of the cluster as it was: after a
    failover it would send to the dead master for good. So after such an error,
    or a batch that ran out of time, the next batch (the breaker's probe) first
    asks the cluster for its map again.

    A cluster node's redirections (a slot migrating: ASK; moved: MOVED) are
    followed here, all of a batch's in one more pipeline (see `_redirect`), not
    by redis-py's pipeline, which follows each alone, one after the other."""

    def __init__(
        self,
        client: Any,
        scripts: Scripts,
        max_batch: int,
        wire: AsyncWire | None,
        timeout: float | None,
    ) -> None:
        self.client, self.scripts, self.max_batch = client, scripts, max_batch
        self.wire = wire  # one server: its own connection, else redis-py's pipelines
        self.timeout = timeout
        self.cluster = isinstance(client, AsyncRedisCluster)
        self.mapped = False  # a cluster client has its first map of the cluster
        self.remap = False  # and must ask for it again
        self.pending: list[_Item] = []
        self.draining = False
        self.drainer: asyncio.Task[None] | None = None
        self.sending: set[asyncio.Task[None]] = set()  # round trips out on the wire
        self.slot: asyncio.Future[None] | None = None  # the drainer waits for one to end

    def submit(self, script: str, numkeys: int, args: list[Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self.pending.append((script, numkeys, args, future, loop.time()))
        if not self.draining:
            self.draining = True
            self.drainer = loop.create_task(self._drain())  # the loop keeps weak ones
        return future

    async def _drain(self) -> None:
        try:
            while self.pending:
                if self.wire is None:
                    await self._send(self._next_batch(split=False))
                    continue
                while len(self.sending) >= IN_FLIGHT:
                    self.slot = asyncio.get_running_loop().create_future()
                    await self.slot
                batch = self._next_batch(split=not self.sending)
                task = asyncio.get_running_loop().create_task(self._send(batch))
                self.sending.add(task)
                task.add_done_callback(self._sent)
        finally:
            self.draining = False

    def _next_batch(self, *, split: bool) -> list[_Item]:
        """At most ``max_batch`` of the checks waiting; with ``split`` (a turn
        that finds no round trip out), half of them if they are `SPLIT_AT` or more."""
        size = len(self.pending)
        if split and size >= SPLIT_AT:
            size = (size + 1) // 2
        size = min(size, self.max_batch)
        batch = self.pending[:size]
        del self.pending[:size]
        return batch

    def _sent(self, task: asyncio.Task[None]) -> None:
        self.sending.discard(task)
        slot = self.slot
        if slot is not None and not slot.done():
            slot.set_result(None)

    async def _pipeline(
        self, batch: list[_Item], deadline: float | None, load: Sequence[str] = ()
    ) -> list[Any]:
        """One round trip for ``batch``, after SCRIPT LOAD of the scripts named in
        ``load``; its results in the batch's order, an error as an exception in its
        place. Checks submitted as `BATCH` go out together as one call of
        _batch.lua. Over by ``deadline`` (the loop's clock), or TimeoutError."""
        scripts = self.scripts
        sha = scripts.sha
        commands: list[list[Any]] = [["SCRIPT", "LOAD", scripts.source(name)] for name in load]
        merged = [item[2] for item in batch if item[0] == BATCH]
        if len(merged) < len(batch):
            for script, numkeys, args, _, _ in batch:
                if script != BATCH:
                    commands.append(["EVALSHA", sha(script), numkeys, *args])
        if merged:
            keys = [args[0] for args in merged]
            checks = b"".join([args[1] for args in merged])
            commands.append(["EVALSHA", sha(BATCH), len(keys), *keys, checks])
        results = None
        if self.wire is not None:
            try:
                results = (await self.wire.call(commands, deadline))[len(load) :]
            except Unsupported as exc:
                log.warning("redis: %s; the checks go through redis-py's pipelines", exc)
                self.wire = None
        if results is None:
            if self.cluster and not self.mapped:
                await self.client.initialize()
                self.mapped = True
            async with asyncio.timeout_at(deadline):
                if self.remap:
                    await self.client.nodes_manager.initialize()
                    self.remap = False
                for name in load:  # to every primary of a cluster, not one node
                    await self.client.script_load(scripts.source(name))
                pipe = self.client.pipeline(transaction=False)
                for command in commands[len(load) :]:
                    # not pipe.evalsha, which redis-py's cluster pipeline refuses (it
                    # routes EVALSHA by its keys all the same)
                    pipe.execute_command(*command)
                if self.cluster:
                    results = await pipe.execute(raise_on_error=False, allow_redirections=False)
                    await self._redirect(commands[len(load) :], results)
                else:
                    results = await pipe.execute(raise_on_error=False)
            if self.cluster and any(isinstance(r, _MAP_FAILURES) for r in results):
                self.remap = True
        if not merged:
            return results
        together = results[-1]
        # the usual batch: single checks only, four integers each
        if len(merged) == len(batch) and type(together) is list and len(together) == 4 * len(batch):
            return [together[at : at + 4] for at in range(0, len(together), 4)]
        spread, rest, at = [], iter(results), 0
        for script, *_ in batch:
            if script != BATCH:
                spread.append(next(rest))
            elif isinstance(together, Exception):
                spread.append(together)
            else:
                spread.append(together[at : at + 4])
                at += 4
        return spread

    async def _redirect(self, commands: list[list[Any]], results: list[Any]) -> None:
        """Sends ``commands`` that a cluster node redirected again, their answers
        put in ``results`` in place: an ASK's (its slot is migrating and the key
        has left) to the node it names, each after an ASKING on the same
        connection; a MOVED's (the slot has moved) to the new owner, once the
        client's map says so; a TRYAGAIN's as it was. A round is one pipeline, to
        every node at once, and a batch has at most `REDIRECT_ROUNDS`; redis-py's
        pipeline would send each alone, one after the other, an ASK's to the old
        owner first: three round trips a check in a row, for as long as the
        migration lasts, which under load outlasted the timeout. An ASK to a node
        the map does not know stays a failure and asks for a new map."""
        client = self.client
        for _ in range(REDIRECT_ROUNDS):
            again = [i for i, result in enumerate(results) if isinstance(result, _REDIRECTS)]
            if not again:
                return
            pipe = client.pipeline(transaction=False)
            sent: list[tuple[int, bool]] = []  # a command's index, and whether ASKING leads it
            moved: set[int] = set()
            for i in again:
                error = results[i]
                if isinstance(error, MovedError):
                    if error.slot_id not in moved:
                        moved.add(error.slot_id)
                        await _move_slot(client.nodes_manager, error)
                    pipe.execute_command(*commands[i])
                    sent.append((i, False))
                elif isinstance(error, AskError):
                    node = client.get_node(host=error.host, port=error.port)
                    if node is None:
                        self.remap = True
                        continue
                    pipe.execute_command("ASKING", target_nodes=node)
                    pipe.execute_command(*commands[i], target_nodes=node)
                    sent.append((i, True))
                else:
                    pipe.execute_command(*commands[i])
                    sent.append((i, False))
            if not sent:
                return
            answers = iter(await pipe.execute(raise_on_error=False, allow_redirections=False))
            for i, asking in sent:
                if asking:
                    next(answers)  # ASKING's OK; had it failed, so did the command
                results[i] = next(answers)

    async def _send(self, batch: list[_Item]) -> None:
        deadline = None if self.timeout is None else batch[0][4] + self.timeout
        try:
            if deadline is not None and asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError  # it waited its whole timeout behind other batches
            results = await self._pipeline(batch, deadline)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
            if missing:  # first use, or the server lost its scripts: load, send again
                scripts = sorted({batch[i][0] for i in missing})
                again = await self._pipeline([batch[i] for i in missing], deadline, scripts)
                for i, result in zip(missing, again, strict=True):
                    results[i] = result
        except TimeoutError as exc:  # the deadline's; redis-py's is a RedisError
            error = StoreUnavailable(f"redis: no answer within the timeout ({self.timeout}s)")
            error.__cause__ = exc
            results = [error] * len(batch)
            self.remap = self.cluster
        except (*FAILURES, OSError) as exc:
            error = StoreUnavailable(f"redis: {exc}")
            error.__cause__ = exc
            results = [error] * len(batch)
            self.remap = self.cluster
        except BaseException as exc:  # a bug, or the loop shutting down: no caller hangs
            for *_, future, _ in batch:
                if not future.done():
                    future.set_exception(exc) if isinstance(exc, Exception) else future.cancel()
            if isinstance(exc, Exception):
                return  # each caller has it; the drain goes on with the next batch
            raise
        for item, result in zip(batch, results, strict=True):
            future = item[3]
            if future.done():  # its caller was cancelled
                continue
            if type(result) is list:  # a script's answer: the usual case first
                future.set_result(result)
            elif isinstance(result, StoreError):
                future.set_exception(result)
            elif isinstance(result, Exception):
                error = StoreUnavailable(f"redis: {result}")
                error.__cause__ = result
                future.set_exception(error)
            else:
                future.set_result(result)
