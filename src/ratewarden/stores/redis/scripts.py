"""The Lua scripts and what they are sent: loading by SHA, and the limit packed.

The scripts (package data under ``stores/redis/lua/``) mirror the pure Python steps
exactly, in integer ticks (Lua numbers are doubles, exact below 2^53).
"""

from __future__ import annotations

import hashlib
import logging
import struct
from functools import partial
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from ...algorithms import Params
from ...primitives import ConfigurationError, Rate, StoreUnavailable
from ._async_wire import Unsupported
from ._sync_wire import Wire
from .connection import FAILURES

__all__ = [
    "BATCH", "CALENDAR", "EXACT", "LEASES", "MANY", "REFUND", "RESERVE", "STEP_IDS", "SYNC",
    "Scripts",
    "pack",
    "redis_params", "script_args",
]  # fmt: skip

# The step functions by the number _many.lua dispatches on.
STEP_IDS = {
    name: number
    for number, name in enumerate(
        ("fixed_window", "sliding_window_counter", "sliding_window_log", "bucket",
         "token_bucket_interval", "calendar_window"),
        1,
    )
}  # fmt: skip
MANY, REFUND, BATCH, SYNC = "_many", "_refund", "_batch", "_sync"
LEASES = "_leases"  # a concurrency limit's lease table, on its own (see stores/leases.py)
CALENDAR = "calendar_window"  # joined to fixed_window.lua, whose step it wraps
RESERVE = "_reserve:"  # + a step's name: that algorithm's reservation script
log = logging.getLogger("ratewarden.stores")


def _source(name: str) -> str:
    """A script's text: the shared head, then one algorithm and _one.lua (``name``
    is the algorithm's step), every algorithm and _many.lua, or _refund.lua;
    _leases.lua (`LEASES`) stands alone."""
    lua = resources.files("ratewarden.stores.redis") / "lua"

    def read(part: str) -> str:
        text = (lua / f"{part}.lua").read_text()
        if part == CALENDAR:  # the fixed window's step counts inside a calendar period
            return "\n".join([read("fixed_window"), text])
        return text

    if name in (MANY, BATCH, SYNC):
        steps = [f"{read(step)}STEPS[{number}] = step\n" for step, number in STEP_IDS.items()]
        return "\n".join([read("_common"), *steps, read(name)])
    if name == LEASES:
        return read(LEASES)
    if name == REFUND:
        return "\n".join([read("_common"), read(REFUND)])
    if name.startswith(RESERVE):  # a reservation's script: see reservations.py
        step = name[len(RESERVE) :]
        parts = [read("_common"), read(step), read("_settle"), f"local ALGORITHM = {step!r}\n"]
        return "\n".join([*parts, read("_reserve")])
    return "\n".join([read("_common"), read(name), read("_one")])


class Scripts:
    """The scripts of one client, by name (an algorithm's step name, `MANY`,
    `REFUND`, `LEASES`): called by SHA, computed here rather than asked of the server. On
    NOSCRIPT (first use, or after a server restart or SCRIPT FLUSH) `call` runs
    the script's source, which loads it as it runs; the async store sends SCRIPT
    LOAD ahead of the retried calls in one round trip. ``wire``: the sync store's
    own connections (see ``_sync_wire``), which carry the calls instead of the
    client while they can."""

    def __init__(self, client: Any, wire: Wire | None = None) -> None:
        self.client = client
        self._sources: dict[str, str] = {}
        self._shas: dict[str, str] = {}
        self.wire = wire
        self._evalsha: Any = client.evalsha
        self._eval: Any = client.eval
        if wire is not None:
            self._evalsha = partial(wire.call, b"EVALSHA")
            self._eval = partial(wire.call, b"EVAL")

    def source(self, name: str) -> str:
        return self._sources.get(name) or self._sources.setdefault(name, _source(name))

    def sha(self, name: str) -> str:
        sha = self._shas.get(name)
        if sha is None:  # Redis names a script by the SHA1 of its text
            text = self.source(name).encode()
            sha = self._shas[name] = hashlib.sha1(text, usedforsecurity=False).hexdigest()
        return sha

    def call(self, name: str, numkeys: int, args: list[Any]) -> Any:
        """EVALSHA script ``name`` with ``args``: its ``numkeys`` keys, then its
        arguments. On NOSCRIPT, EVAL: one round trip more, where SCRIPT LOAD and
        EVALSHA again would be two (each may cost up to the timeout)."""
        try:
            try:
                return self._evalsha(self.sha(name), numkeys, *args)
            except NoScriptError:
                return self._eval(self.source(name), numkeys, *args)
        except FAILURES as exc:
            raise StoreUnavailable(f"redis: {exc}") from exc
        except Unsupported as exc:  # this redis-py's connections cannot be taken over
            log.warning("redis: the store's own connections are off, redis-py's carry on: %s", exc)
            self._evalsha, self._eval, self.wire = self.client.evalsha, self.client.eval, None
            return self.call(name, numkeys, args)


EXACT = 2**53  # Lua numbers are doubles: integers are exact below this
TICKS_US = (1, 1_000, 1_000_000)  # microseconds, milliseconds, seconds


def pack(params: Params, tick_us: int = 1) -> bytes:
    """The limit's constants as the scripts read them: 8 big-endian doubles."""
    return struct.pack(
        ">8d", tick_us, params.limit, params.period, params.burst, params.scale,
        params.unit, params.capacity, params.span,
    )  # fmt: skip


def script_args(key: str, packed: bytes, now_us: int | None, cost: int, mode: str) -> list[Any]:
    """The arguments of an algorithm's script (see _one.lua), its key first."""
    return [key, "" if now_us is None else now_us, cost, packed, mode]


def redis_params(rate: Rate, burst: int | None, rule: str | None) -> tuple[Params, int]:
    """The limit in the finest tick (us, ms or s) at which the scripts count exactly:
    every constant, and a window's worth of request-ticks, below 2^53."""
    period_us, odd = divmod(rate.period_ns, 1000)
    if odd:
        raise ConfigurationError(
            f"the Redis store counts in microseconds: period {rate.period}s is not whole"
        )
    for tick_us in TICKS_US:
        if period_us % tick_us:
            continue
        params = Params.build(
            rate.limit, period_us // tick_us, burst=burst, tick=tick_us * 1e-6, rule=rule
        )
        if max(params.span, params.capacity, params.burst * params.period) < EXACT:
            return params, tick_us
    raise ConfigurationError(
        f"{rate} is too large for the Redis store to count exactly (limit x period must"
        " stay below 2^53 seconds)"
    )
