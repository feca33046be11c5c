"""``ratewarden simulate``: a fleet of up to 200 members on a virtual clock,
against the coordinator's Python model or the real ``fleet.lua`` in a Redis,
and what the provider at the other end would see (``pip install
ratewarden[simulate]`` for the plots).

``_scenarios`` says what runs, ``_plans`` what a scenario's pattern makes
happen, ``_run`` runs it (its members, ``_node``, and their callers),
``_measure`` records what the provider and the invariant see in a ``_result``,
``_checks`` holds the documented figures to their targets, ``_backend`` holds
the clocks and coordinators, ``_plots`` draws, ``_command`` is the command.
It builds on `ratewarden.fleet`'s pure parts (`ratewarden.fleet.model`,
`ratewarden.fleet.member`); nothing in the library imports it.
"""

from ._command import (
    Backend,
    ModelBackend,
    RedisBackend,
    add_arguments,
    documented,
    main,
    run,
    simulate,
)

__all__ = [
    "Backend",
    "ModelBackend",
    "RedisBackend",
    "add_arguments",
    "documented",
    "main",
    "run",
    "simulate",
]
