"""The coordinator in Python: what ``fleet.lua`` does, on a dict instead of Redis.

It runs simulations without a Redis (``ratewarden simulate --model``), and the
parity suite drives it and the Lua script with one clock and demands identical
replies. It keeps the script's data layout (the configuration as the same
strings, the member records as the same packed doubles) and its order of
operations, so that the two read side by side; every call takes an explicit time
in milliseconds.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from ._alloc import allocate

__all__ = ["Model"]


@dataclass
class _Member:
    id: str
    seq: int
    expires: int = 0
    wants: int = 0
    has: int = 0
    used: int = 0


_RECORD = struct.Struct(">5d")  # as fleet.lua packs a member: five big-endian doubles


def _record(m: _Member) -> bytes:
    return _RECORD.pack(m.seq, m.expires, m.wants, m.has, m.used)


@dataclass
class Model:
    """One resource's coordination state, and what it published."""

    cfg: dict[str, str] = field(default_factory=dict)
    members: dict[str, bytes] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)

    def _num(self, name: str) -> int:
        try:
            return int(self.cfg.get(name, "0"))
        except ValueError:
            return 0

    def _live(self, now: int) -> list[_Member]:
        live = []
        for member_id, record in list(self.members.items()):
            try:
                seq, expires, wants, has, used = (int(x) for x in _RECORD.unpack(record))
            except struct.error:  # unreadable: dropped, as the script drops it
                del self.members[member_id]
                continue
            if expires > now:
                live.append(_Member(member_id, seq, expires, wants, has, used))
            else:
                del self.members[member_id]
        live.sort(key=lambda m: m.seq)
        return live

    def _save(self, m: _Member) -> None:
        self.members[m.id] = _record(m)

    def _cut(self, new_eff: int, members: list[_Member]) -> None:
        old = self._num("eff_m")
        self.cfg["eff_m"] = str(new_eff)
        if new_eff < old:
            for m in members:
                m.has = m.has * new_eff // old
                self._save(m)
        self.published.append(f"{self.cfg.get('version', '0')} {new_eff} {old}")

    def show(self, now: int) -> list[Any]:
        if not self.cfg:
            return [0]
        out: list[Any] = [1, now, _flat(self.cfg)]
        out.extend([m.id, m.seq, m.expires, m.wants, m.has, m.used] for m in self._live(now))
        return out

    def set(self, now: int, fields: dict[str, str]) -> list[int]:
        found = bool(self.cfg)
        members = self._live(now)
        old_eff = self._num("eff_m")
        self.cfg.update(fields)
        version = self._num("version") + 1
        self.cfg["version"] = str(version)
        eff = self._num("total") * 1000
        if found:
            self.cfg["eff_m"] = str(old_eff)
            self._cut(eff, members)
        else:
            self.cfg["eff_m"] = str(eff)
            self.cfg["seq"] = "0"
        return [1, version, eff, old_eff]

    def leave(self, member_id: str) -> list[int]:
        self.members.pop(member_id, None)
        return [1]

    def refresh(
        self,
        now: int,
        member_id: str,
        *,
        wants: int,
        reported: int,
        used: int,
        throttled: int,
        restore: dict[str, str] | None = None,
    ) -> list[Any]:
        cfg = self.cfg
        if not cfg:
            if not restore:
                return [0]
            cfg.update(restore)
            cfg["rebuild_ms"] = str(now + self._num("lease_ms"))
            cfg["seq"] = "0"
        members = self._live(now)
        me = next((m for m in members if m.id == member_id), None)
        if me is None:
            seq = self._num("seq") + 1
            cfg["seq"] = str(seq)
            me = _Member(member_id, seq)
            members.append(me)
            members.sort(key=lambda m: m.seq)
        me.expires = now + self._num("lease_ms")
        me.wants, me.used = wants, used

        refresh_ms = self._num("refresh_ms")
        if cfg.get("adaptive") == "1":
            ceiling = self._num("total") * 1000
            eff = self._num("eff_m")
            calm = now - self._num("cut_ms") >= 2 * refresh_ms
            if throttled > 0 and calm:
                cfg["cut_ms"] = cfg["raise_ms"] = str(now)
                self._cut(max(self._num("floor_m"), eff * 3 // 4), members)
            elif (
                throttled == 0
                and calm
                and eff < ceiling
                and now - self._num("raise_ms") >= refresh_ms
            ):
                cfg["eff_m"] = str(min(ceiling, eff + max(1000, ceiling // 50)))
                cfg["raise_ms"] = str(now)

        total = self._num("eff_m")
        mine = members.index(me)
        others = sum(m.has for m in members if m is not me)
        target = allocate(
            cfg.get("algorithm", ""), total, [m.wants for m in members], self._num("cap_m")
        )[mine]
        grant = max(0, min(target, total - others))
        if now < self._num("rebuild_ms"):
            grant = min(grant, reported)
        me.has = grant
        self._save(me)
        held = sum(m.has for m in members)
        before = sum(m.has for m in members[:mine])
        return [1, grant, held, before, len(members), now, _flat(cfg)]


def _flat(cfg: dict[str, str]) -> list[str]:
    return [part for pair in cfg.items() for part in pair]
