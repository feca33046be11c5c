"""schemathesis against the real server: every operation of /openapi.json, with
generated (bounded) inputs, answers as the document says and never with a 5xx."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from ratewarden.server import openapi
from tests.server.conftest import RULES
from tests.server.process import Served, serving

if TYPE_CHECKING:
    from schemathesis.specs.openapi.schemas import OpenApiCase

TOKEN = "schemathesis-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A body over the size limit is refused with 413 before it is read: a
# rejection too, which schemathesis's default lists leave out.
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "checks": {
            "negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 413, 422]},
            # a valid batch can still be bigger than --max-body, which no schema can say;
            # a valid acquire over a limit is refused with 429
            "positive_data_acceptance": {"expected-statuses": ["2xx", 401, 404, 413, 429]},
        },
        "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
    }
)
# /v1/events streams until the client goes: tests/server/test_dashboard_stream.py reads it
schema = (
    schemathesis.openapi.from_dict(openapi(secured=True), config=CONFIG)
    .exclude(path="/v1/events")
    .exclude(path_regex="^/v1/overrides/")
)
# A schema-valid override can still be refused: rates that do not fit the rule's
# windows, a rule this service does not have. Their answer is a 422 or a 404.
OVERRIDES = schemathesis.openapi.from_dict(
    openapi(secured=True),
    config=schemathesis.config.SchemathesisConfig.from_dict(
        {
            "checks": {
                "negative_data_rejection": {"expected-statuses": [400, 401, 404, 405, 413, 422]},
                "positive_data_acceptance": {"expected-statuses": ["2xx", 401, 404, 413, 422]},
            },
            "auth": {"openapi": {"bearer": {"bearer": TOKEN}}},
        }
    ),
).include(path_regex="^/v1/overrides/")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("openapi")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    token = tmp / "token"
    token.write_text(TOKEN)
    args = ("--config", str(rules), "--grpc", "off", "--token-file", str(token))
    with serving(*args, tmp=tmp) as served:
        yield served
        served.terminate()


def test_the_document_is_what_the_server_serves(served: Served) -> None:
    import httpx  # noqa: PLC0415

    served_document = httpx.get(f"{served.url}/openapi.json", headers=AUTH).json()
    assert served_document == openapi(secured=True)


@schema.parametrize()
# derandomized: the same examples every run, so the suite cannot flake on a new one
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_api_conforms(case: OpenApiCase, served: Served) -> None:
    case.call_and_validate(base_url=served.url)


@OVERRIDES.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_override_api_conforms(case: OpenApiCase, served: Served) -> None:
    case.call_and_validate(base_url=served.url)
