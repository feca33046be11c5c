"""The figures of docs/fleet-simulation.md, checked: `check` reads the results
of `documented`'s runs and holds each figure to its target."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._result import Result

__all__ = ["Check", "check"]


@dataclass(frozen=True)
class Check:
    """One figure of docs/fleet-simulation.md: measured, against its target
    (``ok`` None: shown beside the others, no target)."""

    figure: str
    what: str
    measured: str
    target: str
    ok: bool | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "figure": self.figure,
            "what": self.what,
            "measured": self.measured,
            "target": self.target,
            "ok": self.ok,
        }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def check(results: dict[str, Result]) -> list[Check]:
    """The figures (a)-(g) from the runs of `documented` (missing runs are skipped)."""
    out: list[Check] = []
    for key, r in results.items():
        if key.startswith(("a/", "b/", "a-poisson/", "b-poisson/")):
            figure, algorithm = key.split("/")
            # judged: the demand-based algorithms, callers as in the judging run
            strict = algorithm in ("fair_share", "proportional_share") and "-" not in figure
            worst = max(r.admitted)
            if figure.startswith("a"):
                out.append(
                    Check(figure, f"{algorithm}: busiest provider second", f"{worst}",
                          f"<= {r.limits[0]}", (worst <= r.limits[0]) if strict else None)
                )  # fmt: skip
                least = 0.95
            else:
                out.append(
                    Check("b", f"{algorithm}: worst provider second over the limit",
                          f"{r.max_excess:.2f}% ({worst}/{r.limits[0]})", "<= 1%",
                          (r.max_excess <= 1.0) if strict else None)
                )  # fmt: skip
                least = 0.97
            out.append(
                Check(figure, f"{algorithm}: utilisation", _pct(r.utilisation),
                      f">= {_pct(least)}", (r.utilisation >= least) if strict else None)
            )  # fmt: skip
    if "c/paced" in results:
        r = results["c/paced"]
        out.append(
            Check("c", "paced: fullest 10 ms over its second's mean (worst second)",
                  f"{r.bin_peak:.2f}x (averaged second: {r.profile_peak:.2f}x)", "<= 1.5x",
                  r.bin_peak <= 1.5)
        )  # fmt: skip
    if "c/unpaced" in results:
        r = results["c/unpaced"]
        out.append(
            Check("c", "unpaced: fullest 10 ms over its second's mean (worst second)",
                  f"{r.bin_peak:.1f}x (averaged second: {r.profile_peak:.1f}x)", "(spike)", None)
        )  # fmt: skip
    if results:
        coord = max(r.coord_max for r in results.values())
        local = max(r.local_max for r in results.values())
        over = sum(r.coord_violations + r.local_violations for r in results.values())
        out.append(
            Check("d", f"every run ({len(results)}): grants' sum / total, coordinator",
                  f"{coord:.4f}", "<= 1", coord <= 1)
        )  # fmt: skip
        out.append(
            Check("d", "every run: grants' sum / total, members (everyone informed)",
                  f"{local:.4f} ({over} steps over)", "<= 1", local <= 1 and over == 0)
        )  # fmt: skip
        for key in ("d/cut", "d/cut-no-pubsub"):
            if key in results:
                r = results[key]
                out.append(
                    Check("d", f"{key}: members' grants / new total before they heard",
                          f"{r.local_max_cut:.3f} for {r.cut_unheard_ms:.0f} ms",
                          "(reported)", None)
                )  # fmt: skip
                out.append(
                    Check("d", f"{key}: provider seconds over the limit",
                          f"{len(r.over)} (worst {r.max_excess:.2f}%)", "(reported)", None)
                )  # fmt: skip
    for key in ("e/churn", "e/churn-16"):
        if key not in results:
            continue
        r = results[key]
        out.append(_joined(key, r))
        reclaim = r.reclaim_max
        past = max(
            (x["after_last_refresh"] - x["lease"] for x in r.reclaims if x["after_death"]),
            default=0.0,
        )
        out.append(
            Check("e", f"{key}: a dead member dropped, seconds after it died"
                  f" ({len(r.reclaims)} died)",
                  "never" if reclaim is None or math.isinf(reclaim)
                  else f"{reclaim:.2f} ({1000 * past:.0f} ms past its lease)",
                  f"<= lease ({r.scenario.lease:g})",
                  reclaim is not None and reclaim <= r.scenario.lease)
        )  # fmt: skip
    for key in ("d/cut", "d/cut-no-pubsub"):
        if key in results:
            r = results[key]
            reach = r.reach_max
            limit = "<= 1 refresh"
            ok = reach is not None and reach[1] <= 1
            if r.scenario.pubsub:  # by the message, unless the member's refresh came first
                limit += f", <= {r.scenario.pubsub_ms:g} ms"
                ok = ok and reach is not None and reach[0] * 1000 <= r.scenario.pubsub_ms + 1e-6
            out.append(
                Check("e", f"{key}: a change of the total reaches every member",
                      "never" if reach is None else f"{1000 * reach[0]:.0f} ms, {reach[1]} refresh",
                      limit, ok)
            )  # fmt: skip
    out.extend(_pools(results))
    out.extend(_starts(results))
    return out


def _starts(results: dict[str, Result]) -> list[Check]:
    """(g): a low total over many members, and a skewed fleet's first seconds."""
    out: list[Check] = []
    if "g/low-rate" in results:
        r = results["g/low-rate"]
        worst = max(r.admitted)
        out.append(
            Check("g", "g/low-rate: busiest provider second", f"{worst} ({len(r.over)} over)",
                  f"<= {r.limits[0]}", worst <= r.limits[0])
        )  # fmt: skip
        out.append(
            Check("g", "g/low-rate: utilisation", _pct(r.utilisation), ">= 95.0%",
                  r.utilisation >= 0.95)
        )  # fmt: skip
    if "g/skewed-start" in results:
        r = results["g/skewed-start"]
        out.append(
            Check("g", "g/skewed-start: utilisation after a 3 s warm-up", _pct(r.utilisation),
                  ">= 98.0%", r.utilisation >= 0.98)
        )  # fmt: skip
        out.append(
            Check("g", "g/skewed-start: provider seconds over the limit",
                  f"{len(r.over)} (worst {r.max_excess:.2f}%)", "0", not r.over)
        )  # fmt: skip
    return out


def _pools(results: dict[str, Result]) -> list[Check]:
    """(f): members whose workers block in acquire, by what the provider served each."""
    out: list[Check] = []
    for key in ("f/pools", "f/mixed"):
        if key not in results:
            continue
        r = results[key]
        closed = r.scenario.closed_count
        seconds = max(1, len(r.admitted) - r.warmup)
        rates = [sum(w[r.warmup :]) / seconds for w in r.member_windows]
        shares = r.fairness(list(range(closed)))
        worst = max(abs(share - 1) for share in shares)
        served = ", ".join(f"{rate:.1f}" for rate in rates)
        out.append(
            Check("f", f"{key}: each pool's share over the pools' mean, after the warm-up",
                  f"within {_pct(worst)} ({served} a second)", "within 10%", worst <= 0.1)
        )  # fmt: skip
        judged = closed == r.scenario.members  # pools alone: the run beside is reported
        out.append(
            Check("f", f"{key}: utilisation", _pct(r.utilisation), ">= 97.0%",
                  r.utilisation >= 0.97 if judged else None)
        )  # fmt: skip
        out.append(
            Check("f", f"{key}: provider seconds over the limit",
                  f"{len(r.over)} (worst {r.max_excess:.2f}%)", "<= 1%",
                  r.max_excess <= 1.0 if judged else None)
        )  # fmt: skip
    return out


def _median(values: list[Any]) -> str:
    known = sorted(v for v in values if v is not None)
    return str(known[len(known) // 2]) if known else "-"


def _joined(key: str, r: Result) -> Check:
    """(e): how soon late joiners reach their share."""
    # in refresh intervals of time: a member left behind refreshes again
    # sooner, so its count of refreshes overstates the time it took
    conv = r.convergence_max
    seconds = [c["seconds"] for c in r.convergence]
    interval = r.scenario.refresh
    slowest: float | None = None
    if conv is not None and conv != -1:
        slowest = max(seconds) / interval
    return Check("e", f"{key}: refresh intervals until a new member is within 5% of its"
                 f" target ({len(seconds)} joined)",
                 "never" if conv == -1 else f"{slowest or 0:.2f} (median"
                 f" {_median([round(x / interval, 2) for x in seconds])};"
                 f" {conv} refreshes at most)",
                 "<= 2", slowest is not None and slowest <= 2)  # fmt: skip
