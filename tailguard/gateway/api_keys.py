"""API keys: who may submit, how much, at what priority.

Keys live in Redis (one hash, ``keys.API_KEYS``), stored only as their sha256,
so whoever reads Redis cannot call the API with them; a key is shown once, when
``tailguard keys add`` makes it. Authentication is on as soon as one key exists:
with none, the API serves anyone but binds to loopback only (tailguard/cli.py).

Each key may carry a requests/min and a tokens/min limit (token buckets in one
Lua script, so every API process draws from the same ones; tokens are the
request's cost, prompt + max_tokens), a priority ceiling (a ``batch`` key's
interactive requests are placed as batch) and a name, which the request log and
the ``tailguard_api_key_requests_total`` metric carry.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from dataclasses import asdict, dataclass

import redis

from tailguard.errors import ConfigError, RateLimited, Unauthenticated
from tailguard.lanes.table import PRIORITY_CLASSES
from tailguard.redis import keys, lua

#: what every key starts with, so a leaked one is recognisable (and greppable)
KEY_PREFIX = "tg-"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    name: str
    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    max_priority: str = PRIORITY_CLASSES[0]  # the highest class this key may use
    id: str = ""  # the key's sha256: where it is stored (never part of the stored record)

    def record(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if k != "id"})

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
        if not _NAME_RE.match(key.name):
            raise ConfigError(f"key name {key.name!r} must match {_NAME_RE.pattern}", field="name")
        if key.max_priority not in PRIORITY_CLASSES:
            raise ConfigError(f"max priority must be one of {PRIORITY_CLASSES}", field="max_priority")
        for limit in (key.requests_per_min, key.tokens_per_min):
            if limit is not None and limit <= 0:
                raise ConfigError("limits must be > 0 (omit for none)", field="limit")
        if any(k.name == key.name for k in self.list()):
            raise ConfigError(f"a key named {key.name!r} exists: revoke it first", field="name")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        self.redis.hset(keys.API_KEYS, digest(secret), key.record())
        return secret

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
        """Whether authentication is on: at least one key exists."""
        return self.redis.hlen(keys.API_KEYS) > 0

    def lookup(self, secret: str) -> ApiKey | None:
        h = digest(secret)
        raw = self.redis.hget(keys.API_KEYS, h)
        return ApiKey(**json.loads(raw), id=h) if raw is not None else None

    def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The key an ``Authorization: Bearer <key>`` header names; None while no key exists
        (authentication off: whatever an OpenAI client sends is ignored).

        A known key costs one Redis call, the lookup: whether any key exists is asked only
        when there is none to look up, or it is unknown. Every /v1/ request comes here."""
        scheme, _, secret = (authorization or "").partition(" ")
        secret = secret.strip() if scheme.lower() == "bearer" else ""
        key = self.lookup(secret) if secret else None
        if key is not None:
            return key
        if not self.any():
            return None
        if not secret:
            raise Unauthenticated("send an API key: Authorization: Bearer <key> "
                                  "(`tailguard keys add NAME` makes one)")
        raise Unauthenticated("unknown API key (revoked, or mistyped)")

    def take(self, key: ApiKey, cost: int) -> None:
        """Charge one request of `cost` tokens to the key's limits, or raise RateLimited."""
        buckets = [{"name": name, "capacity": limit, "per_s": limit / 60.0, "take": take}
                   for name, limit, take in (("requests", key.requests_per_min, 1),
                                             ("tokens", key.tokens_per_min, cost))
                   if limit is not None]
        if not buckets:
            return
        if key.tokens_per_min is not None and cost > key.tokens_per_min:
            raise RateLimited(f"this request's cost ({cost} tokens) exceeds key {key.name!r}'s "
                              f"{key.tokens_per_min} tokens per minute", retry_after_s=60)
        taken, wait = self._take([keys.api_key_bucket_key(key.id)], buckets=buckets)
        if not taken:
            raise RateLimited(f"key {key.name!r} is over its per-minute limit",
                              retry_after_s=math.ceil(float(wait)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


_LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    """Whether a bind address only this machine can reach."""
    import ipaddress

    host = host.strip("[]")
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def check_bind(host: str, *, have_keys: bool, open_api: bool) -> str:
    """What `tailguard api` says at start; ConfigError for a non-loopback bind without keys."""
    if have_keys:
        return f"API keys required (Authorization: Bearer <key>); listening on {host}"
    if is_loopback(host):
        return (f"no API key exists: authentication is off and the API listens on {host} only; "
                "`tailguard keys add NAME` turns it on")
    if open_api:
        return (f"no API key exists and TAILGUARD_API_OPEN is set: serving {host} without "
                "authentication")
    raise ConfigError(f"refusing to serve {host} without API keys: anyone who can reach it could "
                      "submit work. Make one (`tailguard keys add NAME`), bind 127.0.0.1, or set "
                      "TAILGUARD_API_OPEN=1 if something else guards the port", field="bind")
