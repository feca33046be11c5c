"""envoyproxy/ratelimit as a drop-in: its configuration format (files named one
by one or a runtime directory), its matching and semantics, its statistics and
its environment variables, applied on ratewarden's stores.

    config = EnvoyConfig.load("config.yaml", store=store)   # or AsyncEnvoyConfig
    result = config.check("domain", [[("key", "value")]])   # EnvoyResult

``_files`` reads the files, ``_tree`` finds a descriptor's limit, ``_config`` applies
them, ``_answer`` says what a check answers and counts, ``_runtime`` holds
``ratewarden serve``'s envoy options and the directory watcher, ``shown`` what
the service shows (dynamic metadata, statsd-named metrics: the ``server`` extra).
It builds on `ratewarden.rules` (the YAML reader and its errors); the service's
RLS handler lives in `ratewarden.server`.
"""

from ._answer import OVERRIDE_UNITS, EnvoyLimit, EnvoyResult, EnvoyStats, Override
from ._config import AsyncEnvoyConfig, EnvoyConfig, EnvoyConfigOptions
from ._files import envoy_files
from ._runtime import EnvoyOptions, EnvoyWatcher, add_arguments, apply_environment, envoy_options

__all__ = [
    "OVERRIDE_UNITS",
    "AsyncEnvoyConfig",
    "EnvoyConfig",
    "EnvoyConfigOptions",
    "EnvoyLimit",
    "EnvoyOptions",
    "EnvoyResult",
    "EnvoyStats",
    "EnvoyWatcher",
    "Override",
    "add_arguments",
    "apply_environment",
    "envoy_files",
    "envoy_options",
]
