"""Pure parts of issue 22: values vLLM would refuse are refused before queueing, waits per key are
bounded, and nothing printed or previewed carries a secret or a prompt."""

from __future__ import annotations

import math

import pytest

from tailguard.errors import InvalidField, TooManyWaits
from tailguard.gateway.wait_slots import WaitSlots
from tailguard.jobs.task_message import kwargs_repr
from tailguard.observe.metrics import GatewayMetrics
from tailguard.sampling import INT64_MAX, INT64_MIN, parse_sampling
from tailguard.settings import redact_url


@pytest.mark.parametrize("field,value", [
    ("temperature", math.nan), ("temperature", math.inf), ("top_p", math.nan),
    ("top_p", -math.inf), ("repetition_penalty", math.nan), ("frequency_penalty", math.nan),
    ("presence_penalty", math.inf), ("temperature", 10**400), ("seed", INT64_MAX + 1),
    ("seed", INT64_MIN - 1), ("seed", 2**64), ("top_k", INT64_MAX + 1), ("top_k", 10**30),
    ("min_tokens", INT64_MAX + 1),
])
def test_what_vllm_would_refuse_is_a_400_naming_the_field(field, value):
    with pytest.raises(InvalidField) as exc:
        parse_sampling({field: value}, "openai")
    assert exc.value.field == field
    assert len(exc.value.message) < 200  # a huge integer is not echoed back


@pytest.mark.parametrize("field,value", [
    ("seed", INT64_MIN), ("seed", INT64_MAX), ("top_k", INT64_MAX), ("top_k", -1),
    ("temperature", 0), ("min_tokens", INT64_MAX),
])
def test_vllms_own_bounds_are_accepted(field, value):
    assert parse_sampling({field: value}, "openai")[field] == value


def test_a_key_holds_at_most_its_waits_and_a_release_counts_once():
    slots = WaitSlots(2)
    first, second = slots.take("k", "team-a"), slots.take("k", "team-a")
    with pytest.raises(TooManyWaits) as exc:
        slots.take("k", "team-a")
    assert exc.value.http_status == 429 and exc.value.retry_after_s >= 1
    assert slots.take("other", "team-b")  # keys do not share slots
    first()
    first()  # twice: still one slot back, not two
    assert slots.held("k") == 1
    third = slots.take("k", "team-a")
    with pytest.raises(TooManyWaits):
        slots.take("k", "team-a")
    second(), third()
    assert slots.held("k") == 0


def test_no_limit_means_none():
    slots = WaitSlots(0)
    for _ in range(1000):
        slots.take("k", "k")
    assert slots.held("k") == 1000


@pytest.mark.parametrize("url,shown", [
    ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    ("redis://app:s3cret@redis:6379/0", "redis://app:***@redis:6379/0"),
    ("rediss://:s3cret@h:6380/0?ssl_cert_reqs=required", "rediss://:***@h:6380/0?ssl_cert_reqs=required"),
    ("sentinel://:s3cret@s1:26379/0;sentinel://:s3cret@s2:26379",
     "sentinel://:***@s1:26379/0;sentinel://:***@s2:26379"),
    ("redis://:p@ss@h/0", "redis://:***@h/0"),
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
])
def test_printed_urls_never_carry_the_password(url, shown):
    assert redact_url(url) == shown


def test_the_task_preview_shows_no_prompt_or_stop_text():
    kwargs = {"job_id": "a" * 32, "prompt": "the secret plan", "max_tokens": 16,
              "sampling": {"temperature": 0.5, "stop": ["classified"]}, "deadline_s": 30}
    shown = kwargs_repr(kwargs)
    assert "secret" not in shown and "classified" not in shown
    assert "<15 characters>" in shown and "'a" + "a" * 31 + "'" in shown and "0.5" in shown
    assert kwargs["prompt"] == "the secret plan"  # the message itself still carries it


def test_metrics_name_keys_only_when_asked():
    key_id = "0123456789ab" + "f" * 52
    assert GatewayMetrics(["short"]).key_label("team-a", key_id) == "0123456789ab"
    assert GatewayMetrics(["short"], key_names=True).key_label("team-a", key_id) == "team-a"
