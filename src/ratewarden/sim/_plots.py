"""The plots of ``ratewarden simulate --plots DIR``, drawn with matplotlib (Agg).

matplotlib is imported when a plot is drawn, never before, and through
`importlib` so that neither the package nor its type check needs it installed:
``pip install matplotlib`` to draw. Each plot is a small PNG (90 dpi):

- ``fleet-pacing.png``: admitted requests per 10 ms inside a second, averaged
  over the saturated seconds, paced and unpaced (the same run twice);
- ``fleet-grants.png``: each member's grant over time, coloured by its role;
- ``fleet-admitted.png``: admitted per second against the provider's limit, and
  the grants' sum as the coordinator and the members count it;
- ``fleet-utilisation.png``: utilisation per algorithm, per scenario.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..fleet.alloc import ALLOCATORS

if TYPE_CHECKING:
    from ._result import Result

__all__ = ["admitted", "documented", "grants", "pacing", "plots", "utilisation"]

DPI = 90
ROLES = {"member": "tab:blue", "joins late": "tab:green", "leaves": "tab:orange",
         "dies": "tab:red"}  # fmt: skip


def _pyplot() -> Any:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def _title(r: Result) -> str:
    s = r.scenario
    skew = f", clocks ±{s.skew:g} ms" if s.skew else ""
    return f"{s.rate} over {s.members} members, {s.pattern}, {s.algorithm}{skew}"


def pacing(paced: Result, unpaced: Result, path: Path) -> Path:
    """Admitted per 10 ms inside a second, paced against unpaced."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = [i * 10 for i in range(100)]
    for r, colour, name in ((unpaced, "tab:red", "unpaced"), (paced, "tab:blue", "paced")):
        profile = r.profile()
        ax.step(x, profile, where="post", color=colour,
                label=f"{name}: fullest 10 ms = {r.bin_peak:.2f}x its second's mean")  # fmt: skip
    mean = sum(paced.profile()) / 100
    ax.axhline(mean, color="grey", linestyle="--", linewidth=1, label=f"mean ({mean:.0f})")
    ax.axhline(1.5 * mean, color="black", linestyle=":", linewidth=1, label="1.5x the mean")
    ax.set_yscale("log")
    ax.set_xlim(0, 1000)
    ax.set_xlabel("ms into the provider's second")
    ax.set_ylabel("admitted per 10 ms (log)")
    ax.set_title(f"Pacing, saturated: {_title(paced)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, path)


def grants(r: Result, path: Path) -> Path:
    """Each member's grant over time (a step at every change), coloured by role."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    seen: set[str] = set()
    end = r.scenario.seconds
    for member, points in sorted(r.grants.items()):
        role = r.roles.get(member, "member")
        gone = r.departed.get(member, end)  # a line ends where its member left or died
        kept = [(t, g) for t, g in points if t <= gone]
        xs = [t for t, _ in kept] + [gone]
        ys = [g for _, g in kept] + [kept[-1][1]]
        ax.step(xs, ys, where="post", color=ROLES.get(role, "tab:blue"), linewidth=0.7,
                alpha=0.6, label=None if role in seen else role)  # fmt: skip
        seen.add(role)
    settled = [g for points in r.grants.values() for t, g in points if t >= 3 * r.scenario.refresh]
    ax.set_xlim(0, end)
    ax.set_ylim(0, 1.3 * max(settled, default=1.0))  # the first joiner's whole total, cut off
    ax.set_xlabel("seconds")
    ax.set_ylabel("grant, permits a second")
    ax.set_title(f"Grants: {_title(r)}", fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    return _save(fig, path)


def admitted(r: Result, path: Path) -> Path:
    """Admitted per provider second against the limit; the grants' sums."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    seconds = list(range(len(r.admitted)))
    ax.bar(seconds, r.admitted, width=1.0, align="edge", color="tab:blue", alpha=0.5,
           label="admitted (provider's count)")  # fmt: skip
    ax.step([*seconds, len(seconds)], [*r.limits, r.limits[-1]], where="post", color="black",
            label="limit (the total)")  # fmt: skip
    ticks = list(range(1, len(r.held) + 1))
    ax.plot(ticks, [c for c, _ in r.held], color="tab:green", linewidth=1,
            label="grants held, coordinator (at each second)")  # fmt: skip
    ax.plot(ticks, [m for _, m in r.held], color="tab:orange", linewidth=1, linestyle="--",
            label="grants spent, members (at each second)")  # fmt: skip
    ax.set_title(f"Admitted: {_title(r)}\n{len(r.over)} second(s) over the limit, worst"
                 f" +{r.max_excess:.2f}%", fontsize=10)  # fmt: skip
    ax.set_xlim(0, len(seconds))
    ax.set_ylim(0, max(r.limits) * 1.25)
    ax.set_xlabel("provider second")
    ax.set_ylabel("requests a second")
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    return _save(fig, path)


def utilisation(groups: dict[str, list[Result]], path: Path) -> Path:
    """Bars: utilisation of each algorithm, one group per scenario."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    names = list(groups)
    width = 0.8 / len(ALLOCATORS)
    colours = ("tab:grey", "tab:orange", "tab:blue", "tab:purple")
    for j, algorithm in enumerate(ALLOCATORS):
        xs, ys = [], []
        for i, name in enumerate(names):
            for r in groups[name]:
                if r.scenario.algorithm == algorithm:
                    xs.append(i + (j - (len(ALLOCATORS) - 1) / 2) * width)
                    ys.append(100 * r.utilisation)
        if xs:
            bars = ax.bar(xs, ys, width=width, color=colours[j], label=algorithm)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("utilisation, % of min(total, offered)")
    ax.set_title("Utilisation per algorithm", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def plots(results: list[Result], pair: tuple[Result, Result], directory: Path) -> list[Path]:
    """The four plots of a run of ``ratewarden simulate`` (``pair``: the first
    run and its twin with pacing the other way)."""
    first, twin = pair
    paced, unpaced = (first, twin) if first.scenario.pace else (twin, first)
    return [
        pacing(paced, unpaced, directory / "fleet-pacing.png"),
        grants(first, directory / "fleet-grants.png"),
        admitted(first, directory / "fleet-admitted.png"),
        utilisation({_title(first): results}, directory / "fleet-utilisation.png"),
    ]


def documented(results: dict[str, Result], directory: Path) -> list[Path]:
    """The plots of docs/fleet-simulation.md from `_scenarios.documented`'s runs."""
    labels = {
        "a/": "(a) 10/s, 96 members,\n5 with demand",
        "a-poisson/": "(a) callers at random\n(static: a fixed split)",
        "b/": "(b) 2,000/s, 8 members,\n10:1, ±100 ms",
        "b-poisson/": "(b) callers at random",
    }
    groups = {
        label: [v for k, v in results.items() if k.startswith(prefix)]
        for prefix, label in labels.items()
    }
    return [
        pacing(results["c/paced"], results["c/unpaced"], directory / "fleet-pacing.png"),
        grants(results["e/churn-16"], directory / "fleet-grants.png"),
        admitted(results["d/cut"], directory / "fleet-admitted.png"),
        utilisation(groups, directory / "fleet-utilisation.png"),
    ]
