"""The dynamic metadata envoyproxy/ratelimit adds to its answer when
RESPONSE_DYNAMIC_METADATA is on (``--envoy-dynamic-metadata``), in its shape:

    {"domain": ..., "descriptors": [{"entries": ["key=value", ...],
     "limit": "requests_per_unit:10 unit:MINUTE", "hitsAddend": 2}, ...],
     "hitsAddend": 3, "metadata": {...}}

``metadata`` merges the ``metadata`` of the limits of every descriptor that
passed (not over its limit, not unlimited): mappings merge key by key, and for
anything else the first descriptor's value stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..rules import EnvoyResult, Override

__all__ = ["dynamic_metadata"]


def dynamic_metadata(
    domain: str,
    descriptors: Sequence[Sequence[tuple[str, str]]],
    overrides: Sequence[Override | None] | None,
    answer: EnvoyResult,
    *,
    addends: Sequence[int | None],
    hits_addend: int,
) -> dict[str, object]:
    described: list[object] = []
    for i, entries in enumerate(descriptors):
        one: dict[str, object] = {"entries": [f"{k}={v}" for k, v in entries]}
        override = overrides[i] if overrides is not None else None
        if override is not None:
            one["limit"] = f"requests_per_unit:{override[0]} unit:{override[1].upper()}"
        if addends[i] is not None:
            one["hitsAddend"] = addends[i]
        described.append(one)
    out: dict[str, object] = {"domain": domain, "descriptors": described}
    if hits_addend:
        out["hitsAddend"] = hits_addend
    merged: dict[str, object] = {}
    for limit, status in zip(answer.limits, answer.statuses or [None] * len(answer.limits),
                             strict=True):  # fmt: skip
        if limit is None or limit.unlimited or limit.metadata is None:
            continue
        if status is not None and not status.allowed and not limit.shadow:
            continue
        if status is None and not answer.overall_ok:
            continue  # counted at once and denied: no descriptor is known to have passed
        _merge(merged, limit.metadata)
    if merged:
        out["metadata"] = merged
    return out


def _merge(into: dict[str, object], source: dict[str, object]) -> None:
    for key, value in source.items():
        if key not in into:
            into[key] = value
            continue
        mine = into[key]
        if isinstance(mine, dict) and isinstance(value, dict):
            copy = dict(mine)
            _merge(copy, value)
            into[key] = copy
