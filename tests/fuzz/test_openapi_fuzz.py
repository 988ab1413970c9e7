"""Property-based fuzzing of every route from its OpenAPI description (schemathesis), then of the
bodies no description describes.

At least FUZZ_REQUESTS generated requests, valid and invalid ones, against the
app from the factory on a real Redis, with no worker: not one 5xx; every
response with a documented status, content type, headers and body, so every
4xx with the error body of its API (native or OpenAI: the description gives
each route's 4xx that body, tests/unit/test_openapi.py). Queue TTLs are short
and long-polls bounded, so an accepted request ends (expired) without waiting.

Then MALFORMED_BODIES raw bodies that JSON Schema cannot even express, into every POST route:
NaN and Infinity (Python's JSON reads them), integers past 64 bits and past Python's digit
limit, nesting hundreds of thousands deep, lone surrogate escapes, prompts past the byte bound
and bodies past the size bound: each a 4xx with its API's error body, or accepted; never a 5xx.
"""

from __future__ import annotations

import json
from collections import Counter

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st
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

#: generated requests in the whole run, at least; each operation and mode with something to
#: vary asks for an equal share of what is still missing (parameterless ones take one), so the
#: run is no longer than the bound asks however many routes there are
FUZZ_REQUESTS = 10_000

LANES = """
[lanes.short]
priority = "interactive"
max_cost = 256
max_tokens = 64
deadline_s = 1
queue_ttl_s = 0.02

[lanes.batch]
priority = "batch"
max_tokens = 512
deadline_s = 1
queue_ttl_s = 0.02

[[workers]]
name = "w"
lanes = ["short", "batch"]
"""


@pytest.fixture(scope="module")
def fuzz_app(tiny_model, redis_server, tmp_path_factory):
    from app import create_app

    lanes = tmp_path_factory.mktemp("fuzz") / "lanes.toml"
    lanes.write_text(LANES)
    app = create_app({"TESTING": True, "TAILGUARD_CONSUME_FINISHED": False,
                       "TAILGUARD_REAP_RUNNING": False,
                       settings.MODEL.env: tiny_model, settings.REDIS_URL.env: redis_server,
                       settings.LANES_FILE.env: str(lanes), settings.MAX_WAIT_S.env: 0.2,
                       settings.ADMIT_WITHOUT_WORKER.env: True,
                       settings.API_AUTH.env: settings.AUTH_OPEN})
    from app.gateway_ext import get_gateway

    with app.app_context():
        # an accepted call waits for its job to expire unserved (no worker here): it reads the
        # record every poll interval, which at its default would make the run waits, not requests
        get_gateway().poll_interval_s = 0.01
    return app


@pytest.fixture(scope="module")
def api_schema(fuzz_app):
    return schemathesis.openapi.from_wsgi("/openapi.json", fuzz_app)


#: The 5xx that only say "no worker runs here", each documented: /healthz is degraded, and an
#: OpenAI call that was accepted (hypothesis finds the served model's name in our source) waits
#: for its result until its job expires in the queue.
NO_WORKER = {("/healthz", None), ("/v1/completions", "expired"), ("/v1/chat/completions", "expired"),
             ("/v1/responses", "expired")}


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
    operations = [result.ok() for result in api_schema.get_all_operations()]
    varied = {op.label for op in operations
              if {"parameters", "requestBody"} & set(op.definition.raw)}
    runs = [(mode, op) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
            for op in operations
            # a negative request needs something in it to make invalid
            if mode == GenerationMode.POSITIVE or op.label in varied]
    for done, (mode, operation) in enumerate(runs):
        left = sum(op.label in varied for _, op in runs[done:])
        examples = (-(-(FUZZ_REQUESTS - sum(sent.values())) // left)
                    if operation.label in varied else 1)

        @given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(max_examples=max(examples, 1), deadline=None,
                             database=None, suppress_health_check=list(HealthCheck),
                             phases=[Phase.generate])
        def one(case) -> None:
            sent[operation.label] += 1
            case.call_and_validate(checks=CHECKS)

        one()
    print(f"fuzz: {sum(sent.values())} requests over {len(runs)} operation-modes")
    assert sum(sent.values()) >= FUZZ_REQUESTS, dict(sent)


#: raw bodies sent by test_malformed_bodies_never_reach_a_server_error
MALFORMED_BODIES = 3_000



def json_post_routes(app) -> list[str]:
    """Every POST route whose body is JSON, as the app's description lists them (a new route
    is fuzzed without being named here; /v1/files is multipart)."""
    paths = app.test_client().get("/openapi.json").get_json()["paths"]
    return sorted(path for path, ops in paths.items()
                  if "application/json" in ops.get("post", {}).get("requestBody", {}).get(
                      "content", {}) and "{" not in path)

#: fragments of JSON text the JSON encoder would never write
NON_FINITE = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1e-999"])
HUGE_INTS = st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30,
                             -(10**30)]).map(str) | st.sampled_from(
    [19, 40, 400, 4300, 4301, 6000]).map(lambda n: "9" * n)
LONE = st.sampled_from(["\\ud800", "\\udfff", "a\\ud83d", "\\udc00b", "\\ud83d\\ude00"]).map(
    lambda esc: f'"{esc}"')  # the last is a valid pair: accepted


def nested(depth: int, kind: str) -> str:
    return ("[" * depth + "]" * depth) if kind == "list" else ('{"a":' * depth + "1" + "}" * depth)


DEEP = st.builds(nested, st.sampled_from([10, 900, 1000, 5_000, 100_000, 400_000]),
                 st.sampled_from(["list", "dict"]))
PLAIN = st.recursive(st.none() | st.booleans() | st.integers(-5, 2000) | st.floats(-3, 3)
                     | st.text(max_size=20), lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=6).map(json.dumps)


def long_text(size: int, char: str) -> str:
    return json.dumps(char * size, ensure_ascii=False)


def fuzz_fields(model: str):
    """A JSON object of some of the routes' own fields (a model that is served, mostly), each with
    a nasty value or an ordinary one."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    from tailguard.sampling import FIELDS

    names = sorted({*ChatCompletionRequest.model_fields, *CompletionRequest.model_fields,
                    *ResponsesRequest.model_fields, *(f.name for f in FIELDS), "priority",
                    "store", "metadata"})
    big = st.builds(long_text, st.sampled_from([1_000, 65_537, 300_000, 1_048_000, 1_100_000]),
                    st.sampled_from(["x", "语"]))
    value = NON_FINITE | HUGE_INTS | LONE | DEEP | PLAIN | big
    message = st.builds(lambda content: f'{{"role": "user", "content": {content}}}',
                        LONE | DEEP | PLAIN | big | st.just('"hi"'))
    fields = st.dictionaries(st.sampled_from(names), value, max_size=4)

    def body(chosen: dict, prompt: str, messages: list[str]) -> str:
        # `input` is /v1/responses' prompt: a text, or a list of messages
        parts = {"model": json.dumps(model), "prompt": prompt,
                 "messages": "[" + ",".join(messages) + "]",
                 "input": prompt if len(messages) == 1 else "[" + ",".join(messages) + "]",
                 **chosen}
        return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in parts.items()) + "}"

    return st.builds(body, fields, value | st.just('"hi"'), st.lists(message, min_size=1, max_size=2))


def test_malformed_bodies_never_reach_a_server_error(fuzz_app, tiny_model):
    from tailguard.errors import error_classes

    client = fuzz_app.test_client()
    known = {c.code for c in error_classes()} | {"bad_request", "method_not_allowed"}
    sent: Counter[int] = Counter()
    routes: Counter[str] = Counter()
    post_routes = json_post_routes(fuzz_app)
    assert "/v1/responses" in post_routes, post_routes
    whole = NON_FINITE | HUGE_INTS | LONE | DEEP | st.just("") | st.just("{") | st.just('{"prompt": "hi"')

    @given(route=st.sampled_from(post_routes), text=fuzz_fields(tiny_model) | whole)
    @hypothesis.settings(max_examples=MALFORMED_BODIES, deadline=None, database=None,
                         suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    def one(route: str, text: str) -> None:
        with client.post(route, data=text.encode("utf-8"), content_type="application/json") as resp:
            sent[resp.status_code] += 1
            routes[route] += 1
            body = resp.get_json(silent=True) or {}
            code = body.get("error", {}).get("code")
            if resp.status_code >= 500:  # only an accepted OpenAI call whose job expired unserved
                assert (route, code) in NO_WORKER, (route, text[:300], body)
            elif resp.status_code >= 400:
                assert code in known, (route, text[:300], body)

    one()
    print(f"malformed bodies: {sum(sent.values())} sent, by status {dict(sorted(sent.items()))}, "
          f"by route {dict(sorted(routes.items()))}")
    assert set(routes) == set(post_routes), dict(routes)
    assert sum(sent.values()) >= MALFORMED_BODIES and sent[400] > MALFORMED_BODIES // 2, dict(sent)
