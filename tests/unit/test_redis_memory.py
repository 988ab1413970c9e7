"""Bounded storage's pure parts: the high-water mark, the record without its text, what counts
as Redis being full, the share setting."""

import pytest
import redis

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.jobs.redis_memory import Memory, high_water_bytes
from tailguard.jobs.store import JobStore, without_text
from tailguard.redis.client import out_of_memory


@pytest.mark.parametrize("max_bytes, share, mark", [
    (1 << 30, 0.8, int(0.8 * (1 << 30))),
    (1 << 30, 0.0, 0),   # 0: never refuse
    (0, 0.8, 0),         # a Redis without maxmemory is never judged full
    (100, 1.0, 100),
])
def test_the_mark_is_a_share_of_maxmemory(max_bytes, share, mark):
    assert high_water_bytes(max_bytes, share) == mark


@pytest.mark.parametrize("used, mark, full", [(79, 80, False), (80, 80, True), (10**9, 0, False)])
def test_full_from_the_mark_on(used, mark, full):
    assert Memory(used, 100, mark).full is full


def test_the_record_keeps_the_result_without_its_text():
    fields = {"result": {"text": "Hello", "completion_tokens": 1, "finish_reason": "stop"},
              "completion_tokens": 1}
    assert without_text(fields) == {"result": {"completion_tokens": 1, "finish_reason": "stop"},
                                    "completion_tokens": 1}
    assert fields["result"]["text"] == "Hello"  # the caller's dict is left as it was
    assert without_text({"error": {"code": "x"}}) == {"error": {"code": "x"}}


@pytest.mark.parametrize("exc, full", [
    (redis.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
    # the same refusal from inside one of tailguard's Lua scripts (Redis 6.2's wording)
    (redis.ResponseError("Error running script (call to f_x): @user_script:1: @user_script: 1: "
                         "-OOM command not allowed when used memory > 'maxmemory'."), True),
    (redis.ResponseError("The ID specified in XADD is equal or smaller than the target stream "
                         "top item"), False),
    (redis.ConnectionError("Connection refused"), False),
])
def test_what_counts_as_redis_being_full(exc, full):
    assert out_of_memory(exc) is full


def test_the_high_water_setting_is_a_share(monkeypatch):
    monkeypatch.setenv(settings.REDIS_HIGH_WATER.env, "0.9")
    assert settings.REDIS_HIGH_WATER.get() == 0.9
    monkeypatch.setenv(settings.REDIS_HIGH_WATER.env, "80")
    with pytest.raises(ConfigError, match="between 0 and 1"):
        settings.REDIS_HIGH_WATER.get()


def test_text_may_not_outlive_its_record():
    client = redis.Redis()  # connects lazily: never here
    with pytest.raises(ConfigError, match=settings.OUTPUT_TTL_S.env):
        JobStore(client, record_ttl_s=60, output_ttl_s=120)
    assert JobStore(client, record_ttl_s=60, output_ttl_s=60).output_ttl_s == 60
