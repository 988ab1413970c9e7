"""The OpenAPI description lists exactly the fields the native parser takes, and names the
key, error and retry rules of every route from their one owner."""

from __future__ import annotations

import pytest

from app.auth import needs_api_key
from app.errors import speaks_openai
from app.openapi import build_spec
from tailguard.sampling import field_names


@pytest.fixture(scope="module")
def spec():
    from app import create_app

    return build_spec(create_app({"TESTING": True}))


def test_request_bodies_list_what_the_parsers_accept(spec):
    schemas = spec["components"]["schemas"]
    assert set(schemas["JobRequest"]["properties"]) == {"prompt", "priority", *field_names("native")}
    # the OpenAI bodies are vLLM's request models (tests/integration/test_openai_routes.py
    # checks the properties named here are theirs); nothing refuses the fields left out
    for name in ("CompletionRequest", "ChatRequest"):
        assert schemas[name].get("additionalProperties", True) is True


def test_every_keyed_operation_needs_a_key_and_documents_401(spec):
    keyed = [path for path in spec["paths"] if needs_api_key(path)]
    assert "/tokenize" in keyed and "/detokenize" in keyed and "/health" not in keyed
    for path, ops in spec["paths"].items():
        for op in ops.values():
            assert ("security" in op) == needs_api_key(path), path
            assert ("401" in op["responses"]) == needs_api_key(path), path


def test_429_carries_retry_after(spec):
    for family in ("Native", "OpenAI"):
        assert spec["components"]["responses"][f"{family}429"]["headers"]["Retry-After"]["required"]


def test_every_4xx_is_the_error_body_of_its_api(spec):
    """What the fuzz tier checks responses against: a 4xx is always the API's error shape."""
    for path, ops in spec["paths"].items():
        family = "OpenAI" if speaks_openai(path) else "Native"
        for op in ops.values():
            for status, response in op["responses"].items():
                if status.startswith("4"):
                    assert response == {"$ref": f"#/components/responses/{family}{status}"}, path


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/completions", "/v1/chat/completions"])
def test_the_submitting_routes_document_the_latency_target_headers(spec, path):
    params = {p["name"]: p for p in spec["paths"][path]["post"]["parameters"]}
    assert set(params) == {"x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms"}
    assert all(p["in"] == "header" for p in params.values())
    assert "wait_past_target" in params["x-llm-d-slo-ttft-ms"]["description"]
    assert "x-slo-tpot-ms" in params["x-llm-d-slo-tpot-ms"]["description"]
