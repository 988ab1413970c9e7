"""API keys: who may call, how much, at what priority, and whose jobs they see.

Keys live in Redis (one hash, ``keys.API_KEYS``), stored only as their sha256,
so whoever reads Redis cannot call the API with them; a key is shown once, when
``tailguard keys add`` makes it. Whether the API asks for one is configuration
(TAILGUARD_API_AUTH, ``resolve_auth``), never a side effect of what Redis holds: in
keys mode an empty key set means every /v1/ call is a 401 saying how to make a key.

Each key may carry a requests/min and a tokens/min limit (token buckets in one
Lua script, so every API process draws from the same ones; every /v1/ call takes
one request, a submission also its cost in tokens, prompt + max_tokens; Batch API lines
draw on a tokens bucket of their own of the same size), a priority
ceiling (a ``batch`` key's interactive requests are placed as batch), the admin
flag (an admin key sees and cancels every key's jobs; any other key only its own),
a weight (its share of a lane against the other keys' when the lane is contended:
tailguard/lanes/fair_share.py), the bounds of the latency targets and vLLM priority its
requests may ask for (tailguard/lanes/latency_targets.py) and a name, which the request
log carries. `tailguard keys edit` changes any of them but the admin flag in place.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import redis

from tailguard import settings
from tailguard.errors import ConfigError, OverKeyLimit, RateLimited, Unauthenticated
from tailguard.lanes.latency_targets import TargetBounds
from tailguard.lanes.table import PRIORITY_CLASSES
from tailguard.redis import keys, lua

#: the token buckets a submission draws on: every request's, and the Batch API lines' own (each
#: of the key's tokens/min: a day's batch leaves the key's interactive tokens/min whole)
TOKENS, BATCH_TOKENS = "tokens", "batch_tokens"
#: what every key starts with, so a leaked one is recognisable (and greppable)
KEY_PREFIX = "tg-"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: the largest weight a key may have (NaN and infinity never pass the check)
MAX_WEIGHT = 1000.0


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    name: str
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    max_priority: str = PRIORITY_CLASSES[0]  # the highest class this key may use
    admin: bool = False  # sees and cancels every key's jobs
    weight: float = 1.0  # its share of a contended lane against other keys' (fair share)
    min_ttft_ms: int | None = None  # the latency targets it may ask for (TargetBounds)
    max_ttft_ms: int | None = None
    min_tpot_ms: int | None = None
    max_tpot_ms: int | None = None
    min_vllm_priority: int | None = None
    id: str = ""  # the key's sha256: where it is stored (never part of the stored record)

    def record(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "id"})

    def may_see(self, owner: str | None) -> bool:
        """Whether this key may read or cancel a job whose record names `owner` (a key's id)."""
        return self.admin or owner == self.id

    @property
    def bounds(self) -> TargetBounds:
        return TargetBounds(**{f.name: getattr(self, f.name) for f in fields(TargetBounds)})

    def priority_for(self, wanted: str) -> str:
        """The class a request asking for `wanted` runs at: never above the key's ceiling."""
        rank = PRIORITY_CLASSES.index
        return wanted if rank(wanted) >= rank(self.max_priority) else self.max_priority


class ApiKeyStore:
    """The keys of one Redis; stateless apart from the client."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self._take = lua.Script(client, "clock", "take_tokens")

    def add(self, key: ApiKey) -> str:
        """Store a new key and return it: the only time it is ever seen."""
        check_key(key)
        if any(k.name == key.name for k in self.list()):
            raise ConfigError(f"a key named {key.name!r} exists: revoke it first", field="name")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        self.redis.hset(keys.API_KEYS, digest(secret), key.record())
        return secret

    def edit(self, name: str, **changes: Any) -> ApiKey:
        """Change the key named `name` in place (its secret stays): any field but its name, id
        and admin flag (revoke and add for those). ConfigError for no such key or a bad value."""
        fixed = {"name", "id", "admin"} & changes.keys()
        if fixed:
            raise ConfigError(f"a key's {', '.join(sorted(fixed))} cannot be edited: revoke it "
                              "and add it again", field=sorted(fixed)[0])
        found = next((k for k in self.list() if k.name == name), None)
        if found is None:
            raise ConfigError(f"no key named {name!r}", field="name")
        edited = replace(found, **changes)
        check_key(edited)

        def rewrite(pipe: Any) -> None:  # never brings back a key revoked meanwhile
            if not pipe.hexists(keys.API_KEYS, found.id):
                raise ConfigError(f"key {name!r} was revoked meanwhile", field="name")
            pipe.multi()
            pipe.hset(keys.API_KEYS, found.id, edited.record())

        self.redis.transaction(rewrite, keys.API_KEYS)
        return edited

    def list(self) -> list[ApiKey]:
        return sorted((ApiKey(**json.loads(v), id=_text(h))
                       for h, v in self.redis.hgetall(keys.API_KEYS).items()), key=lambda k: k.name)

    def revoke(self, name: str) -> bool:
        """Remove the key named `name`; False when there is none."""
        for key in self.list():
            if key.name == name:
                self.redis.hdel(keys.API_KEYS, key.id)
                self.redis.delete(keys.api_key_bucket_key(key.id))
                return True
        return False

    def any(self) -> bool:
        """Whether at least one key exists (what a 401 says how to fix; it turns nothing on)."""
        return self.redis.hlen(keys.API_KEYS) > 0

    def record_mode(self, mode: str) -> None:
        """Write the authentication mode this API process serves (TAILGUARD_API_AUTH resolved),
        when it starts: what `served_mode` reads."""
        self.redis.set(keys.API_AUTH_MODE, mode)

    def served_mode(self) -> str | None:
        """The authentication mode of the API that started last on this Redis (open or keys),
        None when none has: whether a key made now is asked for at all."""
        raw = self.redis.get(keys.API_AUTH_MODE)
        return _text(raw) if raw is not None else None

    def lookup(self, secret: str) -> ApiKey | None:
        h = digest(secret)
        raw = self.redis.hget(keys.API_KEYS, h)
        return ApiKey(**json.loads(raw), id=h) if raw is not None else None

    def by_id(self, key_id: str) -> ApiKey | None:
        """The key whose id (its sha256) is `key_id`; None once it was revoked."""
        raw = self.redis.hget(keys.API_KEYS, key_id)
        return ApiKey(**json.loads(raw), id=key_id) if raw is not None else None

    def authenticate(self, authorization: str | None) -> ApiKey:
        """The key an ``Authorization: Bearer <key>`` header names, or Unauthenticated.

        A known key costs one Redis call, the lookup; a refusal asks whether any key exists,
        to say how to make one when none does (keys mode stays on all the same)."""
        scheme, _, secret = (authorization or "").partition(" ")
        secret = secret.strip() if scheme.lower() == "bearer" else ""
        key = self.lookup(secret) if secret else None
        if key is not None:
            return key
        if not self.any():
            raise Unauthenticated("this API requires an API key and none exists yet: make one with "
                                  "`tailguard keys add NAME`, then send Authorization: Bearer <key>")
        if not secret:
            raise Unauthenticated("send an API key: Authorization: Bearer <key> "
                                  "(`tailguard keys add NAME` makes one)")
        raise Unauthenticated("unknown API key (revoked, or mistyped)")

    def take_request(self, key: ApiKey) -> None:
        """Charge one call to the key's requests per minute, or raise RateLimited: every /v1/ call,
        before anything costly is done for it."""
        if key.requests_per_min is not None:
            self._draw(key, "requests", key.requests_per_min, 1)

    def take_tokens(self, key: ApiKey, cost: int, bucket: str = TOKENS) -> None:
        """Charge a submission of `cost` tokens to the key's tokens per minute (`check_cost`
        first), or raise RateLimited when the bucket is short now. `bucket`: TOKENS, or
        BATCH_TOKENS for a Batch API line, a bucket of the same size of its own."""
        if key.tokens_per_min is not None:
            check_cost(key, cost)
            self._draw(key, bucket, key.tokens_per_min, cost)

    def _draw(self, key: ApiKey, bucket: str, per_min: int, take: int) -> None:
        taken, wait = self._take([keys.api_key_bucket_key(key.id)], buckets=[
            {"name": bucket, "capacity": per_min, "per_s": per_min / 60.0, "take": take}])
        if not taken:
            raise RateLimited(f"key {key.name!r} is over its {bucket} per minute",
                              retry_after_s=math.ceil(float(wait)))


def check_key(key: ApiKey) -> None:
    """ConfigError naming what a key to be stored has wrong."""
    if not _NAME_RE.match(key.name):
        raise ConfigError(f"key name {key.name!r} must match {_NAME_RE.pattern}", field="name")
    if key.max_priority not in PRIORITY_CLASSES:
        raise ConfigError(f"max priority must be one of {PRIORITY_CLASSES}", field="max_priority")
    for limit in (key.requests_per_min, key.tokens_per_min):
        if limit is not None and limit <= 0:
            raise ConfigError("limits must be > 0 (omit for none)", field="limit")
    if not 0 < key.weight <= MAX_WEIGHT:
        raise ConfigError(f"weight must be > 0 and at most {MAX_WEIGHT:g}", field="weight")
    key.bounds.check()


def check_cost(key: ApiKey, cost: int) -> None:
    """OverKeyLimit (a 400, not a 429: no wait makes room for it) when a submission of `cost`
    tokens exceeds the key's whole tokens per minute."""
    if key.tokens_per_min is not None and cost > key.tokens_per_min:
        raise OverKeyLimit(f"this request's cost ({cost} tokens: prompt + max_tokens) exceeds key "
                           f"{key.name!r}'s {key.tokens_per_min} tokens per minute: send a shorter "
                           "prompt or a lower max_tokens", field="max_tokens")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_LOOPBACK_NAMES = {"localhost", "ip6-localhost"}

#: the Host header names open mode answers by default (TAILGUARD_API_TRUSTED_HOSTS)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1")


def is_loopback(host: str) -> bool:
    """Whether a bind address (or a peer's) only this machine can reach."""
    import ipaddress

    host = host.strip("[]")
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def resolve_auth(host: str, configured: str, *, open_remote: bool) -> tuple[str, str]:
    """The authentication mode `tailguard api` serves `host` with, and what it says at start.

    `configured` is TAILGUARD_API_AUTH: keys, open, or empty (open on a loopback bind, keys
    on any other); `open_remote` is TAILGUARD_API_OPEN. ConfigError for open mode on a
    non-loopback bind without it."""
    auth = settings.API_AUTH.env
    if configured == settings.AUTH_KEYS or (not configured and not is_loopback(host)):
        why = f"{auth}=keys" if configured else f"the default for a non-loopback bind; {auth}"
        return settings.AUTH_KEYS, (
            f"API keys required on {host} ({why}): every /v1/ call sends Authorization: Bearer "
            f"<key>; `tailguard keys add NAME` makes one")
    if is_loopback(host) or open_remote:
        why = f"{auth}=open" if configured else (f"the default for a loopback bind; {auth}=keys "
                                                 "requires keys")
        reach = (f"anyone who reaches {host} ({settings.API_OPEN.env} is set)" if open_remote
                 else f"clients on this machine only ({host}, loopback Host headers)")
        return settings.AUTH_OPEN, f"no API key needed ({why}): serving {reach}"
    raise ConfigError(f"refusing to serve {host} without API keys ({auth}=open): anyone who can "
                      f"reach it could submit work. Use {auth}=keys (and `tailguard keys add "
                      f"NAME`), bind 127.0.0.1, or set {settings.API_OPEN.env}=1 if something "
                      "else guards the port", field="bind")
