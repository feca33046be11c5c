"""Where runtime overrides live: `LocalOverrides` in this process (a memory
store), `RedisOverrides` / `AsyncRedisOverrides` in Redis for every process
sharing the store.

In Redis, under one hash tag (one cluster slot):

    {<namespace>:overrides}:active   hash: rule -> OverrideRecord (JSON)
    {<namespace>:overrides}:audit    list: StoredChange (JSON), newest first, trimmed
    channel <namespace>:overrides    the rule's name, published on every change

A change is one script: it reads Redis's clock, so that every process agrees
on when an override started and ends whatever its own clock says, finds the
override it replaces, writes, appends to the audit trail and publishes. Readers
get Redis's clock with the records and turn "expires at" into "expires in".
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from ..primitives import Clock, ConfigurationError, StoreUnavailable, default_clock
from .overrides import AUDIT_KEPT, OverrideRecord, StoredChange

__all__ = ["AsyncRedisOverrides", "LocalOverrides", "RedisOverrides", "Snapshot"]

log = logging.getLogger("ratewarden.rules")

# (Redis's or this process's clock in ms, the records in force by rule)
Snapshot = tuple[int, dict[str, OverrideRecord]]

_decode_record = msgspec.json.Decoder(OverrideRecord).decode
_decode_change = msgspec.json.Decoder(StoredChange).decode
_encode = msgspec.json.Encoder().encode

# KEYS: active, audit. ARGV: "set" | "clear", rule, record JSON (no times),
# duration ms, audit entries kept, channel.
# Returns {now ms, stored record or "", previous live record or ""}.
_CHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- an override in force: ours (a record's fields, of their types) and not ended;
-- anything else in the hash (not JSON, another program's) is no override
local function live(text)
  if not text then return nil end
  local ok, r = pcall(cjson.decode, text)
  if not ok or type(r) ~= 'table' or type(r.expires_at) ~= 'number' or
     type(r.set_at) ~= 'number' or type(r.rule) ~= 'string' or
     type(r.limits) ~= 'table' or type(r.file_limits) ~= 'table' or
     type(r.reason) ~= 'string' or type(r.by) ~= 'string' then
    return nil
  end
  if r.expires_at > now then return text end
  return nil
end
-- forget what has expired, and what is not ours (one entry per rule: a short walk)
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if not live(all[i + 1]) then redis.call('HDEL', KEYS[1], all[i]) end
end
local previous = live(redis.call('HGET', KEYS[1], ARGV[2]))
local record
if ARGV[1] == 'set' then
  record = '{"set_at":' .. now .. ',"expires_at":' .. (now + tonumber(ARGV[4])) ..
           ',' .. string.sub(ARGV[3], 2)
  redis.call('HSET', KEYS[1], ARGV[2], record)
else
  if not previous then return {now, '', ''} end
  redis.call('HDEL', KEYS[1], ARGV[2])
  record = '{"set_at":' .. now .. ',"expires_at":' .. now .. ',' .. string.sub(ARGV[3], 2)
end
redis.call('LPUSH', KEYS[2], '{"action":"' .. ARGV[1] .. '","at":' .. now ..
           ',"record":' .. record .. ',"previous":' .. (previous or 'null') .. '}')
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
redis.call('PUBLISH', ARGV[6], ARGV[2])
return {now, record, previous or ''}
"""

# KEYS: active. Returns {now ms, rule, record, rule, record, ...}
_READ = """
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
"""


def _bare(record: OverrideRecord) -> bytes:
    """The record without its times, which the script writes first."""
    return _encode({"rule": record.rule, "limits": record.limits, "file_limits": record.file_limits,
                    "reason": record.reason, "by": record.by})  # fmt: skip


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _record(rule: object, value: bytes | str) -> OverrideRecord | None:
    """A stored record, or None (and a warning) for a value that is not one:
    one bad value must not stop the others, nor a change (the next change drops it)."""
    try:
        return _decode_record(value)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        _warn_once(f"overrides: the value for {rule!r} is not an override, ignored: {exc}")
        return None


def _snapshot(reply: list[Any]) -> Snapshot:
    now = int(reply[0])
    active: dict[str, OverrideRecord] = {}
    for i in range(1, len(reply) - 1, 2):
        try:
            rule = _text(reply[i])
        except UnicodeDecodeError:
            _warn_once(f"overrides: a rule name that is not UTF-8, ignored: {reply[i]!r}")
            continue
        record = _record(rule, reply[i + 1])
        if record is not None and record.expires_at > now:
            active[rule] = record
    return now, active


def _changed(reply: list[Any]) -> tuple[int, OverrideRecord | None, OverrideRecord | None]:
    now = int(reply[0])
    record = _decode_record(reply[1]) if reply[1] else None  # the script's own: it decodes
    previous = _record("previous", reply[2]) if reply[2] else None
    return now, record, previous


_warned: dict[str, None] = {}  # what was said, so that a read every 2 s does not repeat it


def _warn_once(message: str) -> None:
    if message in _warned:
        return
    if len(_warned) >= 100:  # bounded whatever the hash holds
        _warned.pop(next(iter(_warned)))
    _warned[message] = None
    log.warning("%s", message)


class _Keys:
    def __init__(self, namespace: object) -> None:
        if not isinstance(namespace, str) or not namespace or "}" in namespace:
            raise ConfigurationError(f"bad overrides namespace {namespace!r}")
        tag = f"{{{namespace}:overrides}}"
        self.active = f"{tag}:active"
        self.audit = f"{tag}:audit"
        self.channel = f"{namespace}:overrides"
        self.namespace = namespace


class LocalOverrides:
    """Overrides of this process alone (the memory store's): times on ``clock``."""

    shared = False

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = default_clock() if clock is None else clock
        self._lock = threading.Lock()
        self._active: dict[str, OverrideRecord] = {}
        self._audit: deque[StoredChange] = deque(maxlen=AUDIT_KEPT)

    def _now(self) -> int:
        return self.clock.time_ns() // 1_000_000

    def forget(self) -> tuple[int, list[str]]:
        """Drop every override now (the pytest plugin's reset between tests, not
        an operator's change: no audit entry); the time and the rules they were on."""
        with self._lock:
            rules = list(self._active)
            self._active.clear()
        return self._now(), rules

    def change(
        self, action: str, record: OverrideRecord, seconds: float
    ) -> tuple[int, OverrideRecord | None, OverrideRecord | None]:
        with self._lock:
            now = self._now()
            previous = self._live(record.rule, now)
            if action == "set":
                stored = msgspec.structs.replace(
                    record, set_at=now, expires_at=now + round(seconds * 1000)
                )
                self._active[record.rule] = stored
            else:
                if previous is None:
                    return now, None, None
                del self._active[record.rule]
                stored = msgspec.structs.replace(record, set_at=now, expires_at=now)
            self._audit.appendleft(StoredChange(action, now, stored, previous))
            return now, stored, previous

    def _live(self, rule: str, now: int) -> OverrideRecord | None:
        record = self._active.get(rule)
        if record is not None and record.expires_at <= now:
            del self._active[rule]
            return None
        return record

    def read(self) -> Snapshot:
        with self._lock:
            now = self._now()
            for rule in list(self._active):
                self._live(rule, now)
            return now, dict(self._active)

    def audit(self, count: int = 100) -> list[StoredChange]:
        with self._lock:
            return list(self._audit)[:count]

    def __repr__(self) -> str:
        return f"<LocalOverrides {len(self._active)} in force>"


@contextlib.contextmanager
def _unavailable() -> Iterator[None]:
    """Redis's failures, for both clients, as `StoreUnavailable`."""
    from ..stores.redis.connection import FAILURES  # noqa: PLC0415 - redis stays optional

    try:
        yield
    except FAILURES as exc:
        raise StoreUnavailable(f"overrides: {exc}") from exc


class _InRedis:
    """What the twins share: the keys, the scripts, a change's arguments."""

    shared = True

    def __init__(self, client: Any, namespace: str = "ratewarden") -> None:
        self.client = client
        self.keys = _Keys(namespace)
        self._change = client.register_script(_CHANGE)
        self._read = client.register_script(_READ)

    def _change_args(
        self, action: str, record: OverrideRecord, seconds: float
    ) -> tuple[list[str], list[Any]]:
        keys = [self.keys.active, self.keys.audit]
        args = [action, record.rule, _bare(record), round(seconds * 1000), AUDIT_KEPT,
                self.keys.channel]  # fmt: skip
        return keys, args

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.keys.namespace!r}>"


class RedisOverrides(_InRedis):
    """Overrides in Redis (a sync redis-py client, single node or cluster)."""

    def change(
        self, action: str, record: OverrideRecord, seconds: float
    ) -> tuple[int, OverrideRecord | None, OverrideRecord | None]:
        return _changed(self._call(self._change, *self._change_args(action, record, seconds)))

    def read(self) -> Snapshot:
        return _snapshot(self._call(self._read, [self.keys.active], []))

    def audit(self, count: int = 100) -> list[StoredChange]:
        raw = self._call(lambda keys, args: self.client.lrange(keys[0], 0, count - 1),
                         [self.keys.audit], [])  # fmt: skip
        return _changes(raw)

    def _call(self, script: Callable[..., Any], keys: list[str], args: list[Any]) -> Any:
        with _unavailable():
            return script(keys=keys, args=args)

    def subscribe(self) -> Any:
        pubsub = self.client.pubsub()
        pubsub.subscribe(self.keys.channel)
        return pubsub


class AsyncRedisOverrides(_InRedis):
    """The asyncio twin of `RedisOverrides` (a redis.asyncio client)."""

    async def change(
        self, action: str, record: OverrideRecord, seconds: float
    ) -> tuple[int, OverrideRecord | None, OverrideRecord | None]:
        keys, args = self._change_args(action, record, seconds)
        return _changed(await self._call(self._change(keys=keys, args=args)))

    async def read(self) -> Snapshot:
        return _snapshot(await self._call(self._read(keys=[self.keys.active], args=[])))

    async def audit(self, count: int = 100) -> list[StoredChange]:
        return _changes(await self._call(self.client.lrange(self.keys.audit, 0, count - 1)))

    async def _call(self, pending: Any) -> Any:
        with _unavailable():
            return await pending

    async def subscribe(self) -> Any:
        pubsub = self.client.pubsub()
        await pubsub.subscribe(self.keys.channel)
        return pubsub


def _changes(raw: list[Any]) -> list[StoredChange]:
    out = []
    for item in raw:
        try:
            out.append(_decode_change(item))
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            _warn_once(f"overrides: an audit entry that is not one, left out: {exc}")
    return out
