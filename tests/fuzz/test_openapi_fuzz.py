"""Property-based fuzzing of every route from its OpenAPI description (schemathesis).

At least FUZZ_REQUESTS generated requests, valid and invalid ones, against the
app from the factory on a real Redis, with no worker: not one 5xx; every
response with a documented status, content type, headers and body, so every
4xx with the error body of its API (native or OpenAI: the description gives
each route's 4xx that body, tests/unit/test_openapi.py). Queue TTLs are short
and long-polls bounded, so an accepted request ends (expired) without waiting.
"""

from __future__ import annotations

from collections import Counter

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tailguard import settings

pytestmark = pytest.mark.fuzz

#: generated requests in the whole run, at least
FUZZ_REQUESTS = 10_000
#: examples per operation: parameterless operations take one, the others make up the total
EXAMPLES_PER_OPERATION = 750

LANES = """
[lanes.short]
priority = "interactive"
max_cost = 256
max_tokens = 64
deadline_s = 1
queue_ttl_s = 0.1

[lanes.batch]
priority = "batch"
max_tokens = 512
deadline_s = 1
queue_ttl_s = 0.1

[[workers]]
name = "w"
lanes = ["short", "batch"]
"""


@pytest.fixture(scope="module")
def fuzz_app(tiny_model, redis_server, tmp_path_factory):
    from app import create_app

    lanes = tmp_path_factory.mktemp("fuzz") / "lanes.toml"
    lanes.write_text(LANES)
    return create_app({"TESTING": True, "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_REAP_RUNNING": False,
                       settings.MODEL.env: tiny_model, settings.REDIS_URL.env: redis_server,
                       settings.LANES_FILE.env: str(lanes), settings.MAX_WAIT_S.env: 0.2,
                       settings.ADMIT_WITHOUT_WORKER.env: True})


@pytest.fixture(scope="module")
def api_schema(fuzz_app):
    return schemathesis.openapi.from_wsgi("/openapi.json", fuzz_app)


#: The 5xx that only say "no worker runs here", each documented: /healthz is degraded, and an
#: OpenAI call that was accepted (hypothesis finds the served model's name in our source) waits
#: for its result until its job expires in the queue.
NO_WORKER = {("/healthz", None), ("/v1/completions", "expired"), ("/v1/chat/completions", "expired")}


def no_server_error(ctx, response, case) -> None:
    """No 5xx but those of NO_WORKER."""
    code = response.json().get("error", {}).get("code") if response.status_code == 503 else None
    if (case.path, code) not in NO_WORKER:
        not_a_server_error(ctx, response, case)


CHECKS = [no_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


def test_every_route(api_schema):
    """Each operation in turn: requests that fit its description (positive), then ones that do
    not (negative), each checked against the description; FUZZ_REQUESTS of them at least."""
    sent: Counter[str] = Counter()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for result in api_schema.get_all_operations():
            operation = result.ok()
            if mode == GenerationMode.NEGATIVE and not {"parameters", "requestBody"} & set(
                    operation.definition.raw):
                continue  # nothing in the request to make invalid

            @given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None,
                                 database=None, suppress_health_check=list(HealthCheck),
                                 phases=[Phase.generate])
            def one(case) -> None:
                sent[operation.label] += 1
                case.call_and_validate(checks=CHECKS)

            one()
    assert sum(sent.values()) >= FUZZ_REQUESTS, dict(sent)
