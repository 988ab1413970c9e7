"""API keys' pure parts: the priority ceiling and which binds need a key."""

import pytest

from tailguard.errors import ConfigError
from tailguard.gateway.api_keys import ApiKey, check_bind, digest, is_loopback


@pytest.mark.parametrize("ceiling,wanted,runs_as", [
    ("interactive", "interactive", "interactive"),
    ("interactive", "batch", "batch"),
    ("batch", "interactive", "batch"),
    ("batch", "batch", "batch"),
])
def test_a_key_never_runs_above_its_priority_ceiling(ceiling, wanted, runs_as):
    assert ApiKey("k", max_priority=ceiling).priority_for(wanted) == runs_as


def test_the_stored_record_never_holds_the_key_or_its_digest():
    key = ApiKey("team-a", requests_per_min=5, id=digest("tg-secret"))
    assert "tg-secret" not in key.record() and key.id not in key.record()
    assert len(key.id) == 64


@pytest.mark.parametrize("host,loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.1.2.3", False),
    ("api.example.com", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host,have_keys,open_api,says", [
    ("127.0.0.1", False, False, "authentication is off"),
    ("0.0.0.0", True, False, "API keys required"),
    ("0.0.0.0", False, True, "without authentication"),
    ("127.0.0.1", True, False, "API keys required"),
])
def test_bind_policy_says_what_it_does(host, have_keys, open_api, says):
    assert says in check_bind(host, have_keys=have_keys, open_api=open_api)


def test_a_public_bind_without_keys_refuses_to_start():
    with pytest.raises(ConfigError, match="tailguard keys add") as exc:
        check_bind("0.0.0.0", have_keys=False, open_api=False)
    assert exc.value.field == "bind"
