"""schemathesis against the ASGI app in this process, configured as
tests/server/test_openapi.py's real server is not: the checks and /auth open,
the admin operations behind a token, the envoy domain configured. Every
operation of the document the app serves, with valid and invalid inputs; each
answer checked for a 5xx and against the document (status, content type,
schema, headers), and an admin operation called without its token must refuse."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import schemathesis
from hypothesis import settings

from ratewarden import AsyncMemoryStore
from ratewarden.server import App, Service
from tests.server.conftest import ENVOY, RULES

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase

# 413: a body over the size limit is refused before it is read, which no schema says
CHECKS = {
    "negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 413, 422]},
    "positive_data_acceptance": {"expected-statuses": ["2xx", 401, 404, 413]},
}
TOKEN = "admin-token"
# Every operation runs this many examples in each of schemathesis's phases: an
# eighth of the profile's count, since one call costs a few milliseconds here.
EXAMPLES = max(5, settings().max_examples // 8)

# Built at import, since schemathesis parametrizes from it: the files go in a
# directory removed when the process ends (reload reads the rule file again).
_files = tempfile.TemporaryDirectory(prefix="ratewarden-openapi-")
RULES_FILE, ENVOY_FILE = Path(_files.name) / "rules.yaml", Path(_files.name) / "edge.yaml"
RULES_FILE.write_text(RULES)
ENVOY_FILE.write_text(ENVOY)
_service = Service(RULES_FILE, AsyncMemoryStore(), envoy_files=(ENVOY_FILE,))
# The event stream sends a snapshot a sample and ends only when its client goes:
# schemathesis reads two events, which come 50 ms apart here rather than a second
_service.dashboard.interval = 0.05
_app = App(_service, token=TOKEN, open_checks=True)
schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    _app,
    config=schemathesis.config.SchemathesisConfig.from_dict(
        {
            "checks": CHECKS,
            "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
            "max-stream-events": 2,
        }
    ),
).exclude(path_regex="^/v1/overrides/")
# A schema-valid override can still be refused (rates that do not fit the rule's
# windows, a reason with a control character in it): a 422, which no schema says.
OVERRIDE_CHECKS = {
    **CHECKS,
    "positive_data_acceptance": {"expected-statuses": ["2xx", 401, 404, 413, 422]},
}
overrides = schemathesis.openapi.from_asgi(
    "/openapi.json",
    _app,
    config=schemathesis.config.SchemathesisConfig.from_dict(
        {"checks": OVERRIDE_CHECKS, "auth": {"openapi": {"bearer": {"bearer": TOKEN}}}}
    ),
).include(path_regex="^/v1/overrides/")


@schema.parametrize()
@settings(max_examples=EXAMPLES)
def test_api_conforms(case: OpenApiCase) -> None:
    case.call_and_validate()


@overrides.parametrize()
@settings(max_examples=EXAMPLES)
def test_override_api_conforms(case: OpenApiCase) -> None:
    case.call_and_validate()
