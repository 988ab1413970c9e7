"""The OpenAPI description lists exactly the fields the request parsers take."""

from __future__ import annotations

import pytest

from app.openapi import build_spec
from tailguard.gateway.openai_protocol import known_fields
from tailguard.sampling import field_names


@pytest.fixture(scope="module")
def spec():
    from app import create_app

    return build_spec(create_app({"TESTING": True}))


def test_request_bodies_list_what_the_parsers_accept(spec):
    schemas = spec["components"]["schemas"]
    assert set(schemas["JobRequest"]["properties"]) == {"prompt", "priority", *field_names("native")}
    assert set(schemas["CompletionRequest"]["properties"]) == known_fields("completion")
    assert set(schemas["ChatRequest"]["properties"]) == known_fields("chat")


def test_every_v1_operation_needs_a_key_and_documents_401(spec):
    for path, ops in spec["paths"].items():
        for op in ops.values():
            assert ("security" in op) == path.startswith("/v1/"), path
            assert ("401" in op["responses"]) == path.startswith("/v1/"), path


def test_429_carries_retry_after(spec):
    for family in ("Native", "OpenAI"):
        assert spec["components"]["responses"][f"{family}429"]["headers"]["Retry-After"]["required"]


def test_every_4xx_is_the_error_body_of_its_api(spec):
    """What the fuzz tier checks responses against: a 4xx is always the API's error shape."""
    for path, ops in spec["paths"].items():
        family = "OpenAI" if path.startswith(("/v1/completions", "/v1/chat/", "/v1/models")) \
            else "Native"
        for op in ops.values():
            for status, response in op["responses"].items():
                if status.startswith("4"):
                    assert response == {"$ref": f"#/components/responses/{family}{status}"}, path
