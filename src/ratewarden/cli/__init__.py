"""The ``ratewarden`` command: one module per command (``_check``, ``_bench``,
``_rules`` for ``check-config`` and ``explain``, ``_override``, ``_quota_command``,
``_demo``), what they share in ``_common`` and ``_remote``, and the parser and
dispatch in ``_main``. ``serve`` lives in `ratewarden.server`, ``simulate`` in
`ratewarden.sim`. Nothing imports this package but the console script.
"""

from ._main import build_parser, help_texts, main

__all__ = ["build_parser", "help_texts", "main"]
