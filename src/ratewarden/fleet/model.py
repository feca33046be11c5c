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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._coordinator_calls import Report
from .alloc import MAX_PIECES, Piece, allocate, grant, place, scaled, with_spare, within

__all__ = ["Model"]


@dataclass
class _Member:
    id: str
    seq: int
    expires: int = 0
    wants: int = 0
    has: int = 0
    used: int = 0
    safe: int = 0
    pieces: list[Piece] = field(default_factory=list)


# as fleet.lua packs a member: seven big-endian doubles (the seventh: how many
# pieces), then each piece's start and length
_RECORD = struct.Struct(">7d")


def _record(m: _Member) -> bytes:
    flat = [x for piece in m.pieces for x in piece]
    head = _RECORD.pack(m.seq, m.expires, m.wants, m.has, m.used, m.safe, len(m.pieces))
    return head + struct.pack(f">{len(flat)}d", *flat)


def _unpack(record: bytes) -> tuple[list[int], list[Piece]]:
    head = [int(x) for x in _RECORD.unpack_from(record)]
    if len(record) != _RECORD.size + 16 * head[6]:
        raise struct.error("a record of another layout")
    flat = [int(x) for x in struct.unpack_from(f">{2 * head[6]}d", record, _RECORD.size)]
    return head[:6], list(zip(flat[::2], flat[1::2], strict=True))


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
        lapsed = False
        for member_id, record in list(self.members.items()):
            try:
                (seq, expires, wants, has, used, safe), pieces = _unpack(record)
            except struct.error:  # unreadable: dropped, as the script drops it
                del self.members[member_id]
                lapsed = True
                continue
            if expires > now:
                live.append(_Member(member_id, seq, expires, wants, has, used, safe, pieces))
            else:
                del self.members[member_id]
                lapsed = lapsed or has > 0 or safe > 0
        if lapsed:  # it may still be spending (see fleet.lua)
            self._rebuild(now)
        live.sort(key=lambda m: m.seq)
        return live

    def _freed(self, now: int, paced: bool = False) -> None:
        """Space of the line was given up now; ``paced``: by a paced member at
        its refresh, which ``hard_ms`` leaves out for older members (see
        fleet.lua)."""
        self.cfg["freed_ms"] = str(now)
        if not paced:
            self.cfg["hard_ms"] = str(now)

    def _adapt(self, now: int, throttled: int, members: list[_Member]) -> None:
        """The adaptive total: cut by a quarter on a refusal, else raised slowly."""
        cfg, refresh_ms = self.cfg, self._num("refresh_ms")
        ceiling = self._num("total") * 1000
        eff = self._num("eff_m")
        calm = now - self._num("cut_ms") >= 2 * refresh_ms
        if throttled > 0 and calm:
            cfg["cut_ms"] = cfg["raise_ms"] = str(now)
            self._cut(now, max(self._num("floor_m"), eff * 3 // 4), members)
        elif (
            throttled == 0 and calm and eff < ceiling and now - self._num("raise_ms") >= refresh_ms
        ):
            cfg["eff_m"] = str(min(ceiling, eff + max(1000, ceiling // 50)))
            cfg["raise_ms"] = str(now)

    def _rebuild_span(self) -> int:
        """How long a rebuild lasts (see fleet.lua): two refresh intervals, at most a lease."""
        return min(self._num("lease_ms"), 2 * self._num("refresh_ms"))

    def _rebuild(self, now: int) -> None:
        """Members spend space the model forgot: until they have all reported,
        nobody gets more than it says it holds (see fleet.lua)."""
        rebuild = max(self._num("rebuild_ms"), now + self._rebuild_span())
        self.cfg["rebuild_ms"] = str(rebuild)
        self._freed(now)

    def _save(self, m: _Member) -> None:
        self.members[m.id] = _record(m)

    def _cut(self, now: int, new_eff: int, members: list[_Member]) -> None:
        old = self._num("eff_m")
        self.cfg["eff_m"] = str(new_eff)
        if new_eff < old:
            self._freed(now)
            for m in members:
                m.pieces = scaled(m.pieces, new_eff, old)
                m.has = sum(length for _, length in m.pieces)
                m.safe = m.safe * new_eff // old
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
            self._cut(now, eff, members)
        else:
            self.cfg["eff_m"] = str(eff)
            self.cfg["seq"] = "0"
        return [1, version, eff, old_eff]

    def leave(self, now: int, member_id: str) -> list[int]:
        if self.members.pop(member_id, None) is not None and self.cfg:
            self._freed(now)
        return [1]

    def _create(self, now: int, fields: dict[str, str]) -> None:
        """The resource is missing: made from the configuration a member sent
        (see fleet.lua)."""
        cfg = self.cfg
        cfg.update(fields)
        cfg["seq"] = "0"
        if "version" in cfg:
            self._rebuild(now)  # one it saw stored: where the members spend is not known
        else:  # one it was given, never stored: created as `set` creates it
            cfg["version"] = "1"
            cfg["eff_m"] = str(self._num("total") * 1000)

    def refresh(self, now: int, member_id: str, report: Report) -> list[Any]:
        wants, reported = report.wants, report.has
        cfg = self.cfg
        if not cfg:
            if not report.restore:
                return [0]
            self._create(now, report.restore)
        members = self._live(now)
        me = next((m for m in members if m.id == member_id), None)
        if me is None:
            seq = self._num("seq") + 1
            cfg["seq"] = str(seq)
            me = _Member(member_id, seq)
            members.append(me)
            members.sort(key=lambda m: m.seq)
            if reported > 0:  # its record ended while it spent (see fleet.lua)
                self._rebuild(now)
        me.expires = now + self._num("lease_ms")
        fell = me.wants - wants  # how far its demand fell (see fleet.lua)
        me.wants, me.used = wants, report.used

        if cfg.get("adaptive") == "1":
            self._adapt(now, report.throttled, members)

        total = self._num("eff_m")
        mine = members.index(me)
        others = sum(m.has for m in members if m is not me)
        algorithm, demands = cfg.get("algorithm", ""), [m.wants for m in members]
        if algorithm == "static":
            target = allocate(algorithm, total, demands, self._num("cap_m"))[mine]
        else:
            target = with_spare(algorithm, total, demands)[mine]
        granted = grant(target, total, others)
        taken = [piece for m in members if m is not me for piece in m.pieces]
        self._nudge(now, granted, target, fell * 10 >= self._num("eff_m"))
        if now < self._num("rebuild_ms"):
            granted = min(granted, reported)
            said = report.pieces
            if not me.pieces and _sound(said, total) and not _overlaps(said, taken):
                me.pieces = list(said)  # where it says it spends
        had = me.pieces
        me.pieces = place(total, had, granted, taken)
        if not within(had, me.pieces):
            self._freed(now, report.paced)
        me.has = sum(length for _, length in me.pieces)
        me.safe = self._safe(now, me, members, total)
        self._save(me)
        held = sum(m.has for m in members)
        flat = [x for piece in me.pieces for x in piece]
        return [1, me.has, held, flat, len(members), now, _flat(cfg), me.safe, target]

    def _nudge(self, now: int, granted: int, target: int, fell: bool) -> None:
        """Others hold what this member is due, or may take what its fall in
        demand gives up: ask them to refresh now (see fleet.lua)."""
        cfg = self.cfg
        if (
            (granted * 2 < target or fell)
            and now >= self._num("rebuild_ms")
            and now - self._num("nudge_ms") >= self._num("refresh_ms") // 16
        ):
            cfg["nudge_ms"] = str(now)
            eff = self._num("eff_m")
            self.published.append(f"{cfg.get('version', '0')} {eff} {eff}")

    def _safe(self, now: int, me: _Member, members: list[_Member], total: int) -> int:
        """What it falls back to without Redis (see fleet.lua)."""
        safe = min(self._num("safe") * 1000, total)
        if self.cfg.get("safe") == "equal":
            safe = total // len(members)
        others = sum(m.safe for m in members if m is not me)
        safe = max(0, min(safe, total - others))
        if now < self._num("rebuild_ms"):
            safe = min(safe, me.safe)
        return safe


def _sound(pieces: Sequence[Piece], total: int) -> bool:
    """Pieces a member may claim: at most MAX_PIECES, none empty, all inside the
    line, none overlapping another."""
    if len(pieces) > MAX_PIECES:
        return False
    if any(start < 0 or length <= 0 or start + length > total for start, length in pieces):
        return False
    return not any(
        i != j and s < start + length and start < s + n
        for i, (start, length) in enumerate(pieces)
        for j, (s, n) in enumerate(pieces)
    )


def _overlaps(pieces: Sequence[Piece], taken: list[Piece]) -> bool:
    return any(s < start + length and start < s + n for start, length in pieces for s, n in taken)


def _flat(cfg: dict[str, str]) -> list[str]:
    return [part for pair in cfg.items() for part in pair]
