"""API keys' pure parts: the priority ceiling, who sees whose jobs, the auth mode a bind gets,
the weight and the latency-target bounds a key may have."""

import dataclasses
import json

import pytest

from tailguard.errors import ConfigError, OverKeyLimit
from tailguard.gateway.api_keys import (
    ApiKey,
    check_cost,
    check_key,
    digest,
    is_loopback,
    resolve_auth,
)
from tailguard.lanes.latency_targets import TargetBounds


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


@pytest.mark.parametrize("host,configured,open_remote,mode,says", [
    # unset: decided by the bind alone, never by what Redis holds
    ("127.0.0.1", "", False, "open", "the default for a loopback bind"),
    ("0.0.0.0", "", False, "keys", "the default for a non-loopback bind"),
    ("0.0.0.0", "", True, "keys", "API keys required"),
    ("127.0.0.1", "keys", False, "keys", "TAILGUARD_API_AUTH=keys"),
    ("0.0.0.0", "keys", False, "keys", "API keys required"),
    ("127.0.0.1", "open", False, "open", "clients on this machine only"),
    ("0.0.0.0", "open", True, "open", "TAILGUARD_API_OPEN is set"),
])
def test_the_auth_mode_is_configuration(host, configured, open_remote, mode, says):
    got, said = resolve_auth(host, configured, open_remote=open_remote)
    assert got == mode and says in said


def test_open_mode_on_a_public_bind_refuses_to_start():
    with pytest.raises(ConfigError, match="tailguard keys add") as exc:
        resolve_auth("0.0.0.0", "open", open_remote=False)
    assert exc.value.field == "bind"


def test_a_key_sees_its_own_jobs_and_an_admin_key_every_job():
    mine, admin = ApiKey("a", id="1" * 64), ApiKey("root", admin=True, id="2" * 64)
    assert mine.may_see("1" * 64) and not mine.may_see("3" * 64) and not mine.may_see(None)
    assert admin.may_see("1" * 64) and admin.may_see(None)
    assert '"admin": true' in admin.record() and ApiKey(**{"name": "old"}).admin is False


def test_a_cost_above_the_whole_tokens_per_minute_is_a_400_not_a_429():
    key = ApiKey("k", tokens_per_min=100)
    check_cost(key, 100)
    check_cost(ApiKey("unlimited"), 10**9)
    with pytest.raises(OverKeyLimit, match="exceeds") as exc:
        check_cost(key, 101)
    assert exc.value.http_status == 400 and exc.value.field == "max_tokens"


def test_a_key_has_weight_one_and_no_bounds_unless_given_and_old_records_read_so():
    old = ApiKey(**{"name": "old", "requests_per_min": 5})
    assert old.weight == 1.0 and old.bounds == TargetBounds()
    key = ApiKey("k", weight=2.5, min_ttft_ms=200, max_tpot_ms=80, min_vllm_priority=0)
    assert key.bounds == TargetBounds(min_ttft_ms=200, max_tpot_ms=80, min_vllm_priority=0)
    assert ApiKey(**{**json.loads(key.record()), "id": key.id}) == key


@pytest.mark.parametrize("changes,field", [
    ({"weight": 0.0}, "weight"),
    ({"weight": -1.0}, "weight"),
    ({"weight": float("nan")}, "weight"),
    ({"weight": float("inf")}, "weight"),
    ({"weight": 1001.0}, "weight"),
    ({"min_ttft_ms": 0}, "min_ttft_ms"),
    ({"max_tpot_ms": -5}, "max_tpot_ms"),
    ({"min_ttft_ms": 500, "max_ttft_ms": 100}, "min_ttft_ms"),
    ({"min_tpot_ms": 50, "max_tpot_ms": 10}, "min_tpot_ms"),
    ({"requests_per_min": 0}, "limit"),
    ({"max_priority": "urgent"}, "max_priority"),
    ({"name": "no spaces"}, "name"),
])
def test_a_key_with_a_bad_weight_or_bound_is_refused(changes, field):
    with pytest.raises(ConfigError) as exc:
        check_key(dataclasses.replace(ApiKey("k"), **changes))
    assert exc.value.field == field


def test_a_key_within_its_bounds_passes():
    check_key(ApiKey("k", weight=0.25, min_ttft_ms=100, max_ttft_ms=100, min_tpot_ms=5,
                     min_vllm_priority=-10))
