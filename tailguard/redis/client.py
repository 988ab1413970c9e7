"""A redis.Redis from TAILGUARD_REDIS_URL: the one place tailguard's own clients are built.

Three spellings, the same ones Celery's broker and result backend (kombu) accept, so one
URL serves every process:

* ``redis://:PASSWORD@host:6379/0``: one Redis.
* ``rediss://…?ssl_cert_reqs=required&ssl_ca_certs=/path/ca.pem``: the same over TLS; redis-py
  reads the ``ssl_*`` query options as kombu and Celery do.
* ``sentinel://:PASSWORD@s1:26379/0;sentinel://:PASSWORD@s2:26379``: Redis Sentinels, as kombu
  spells them (``;`` between them). The Sentinels are asked for the master named by
  TAILGUARD_REDIS_SENTINEL_MASTER; the password, user and database in the first URL are the
  master's; a Sentinel that wants a password of its own gets TAILGUARD_REDIS_SENTINEL_PASSWORD.
  After a failover the client finds the new master by itself (on its next connection).

``celery_transport_options`` says the same to Celery, so the broker, the result backend and
tailguard's client follow the same master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.sentinel import Sentinel

from tailguard import settings
from tailguard.errors import ConfigError

SENTINEL_SCHEME = "sentinel"
_SEPARATOR = ";"
_DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelUrl:
    """A kombu-style ``sentinel://`` list: where the Sentinels are, and how to log in to the master."""

    sentinels: tuple[tuple[str, int], ...]
    db: int = 0
    username: str | None = None
    password: str | None = None

    def master_kwargs(self) -> dict[str, Any]:
        """Connection arguments of the master (kombu and Celery take them from the first URL too)."""
        return {"db": self.db, "username": self.username, "password": self.password}


def is_sentinel(url: str) -> bool:
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str) -> SentinelUrl:
    """The Sentinels of ``sentinel://…;sentinel://…`` (ConfigError on anything else; the
    message names the entry by its place in the list, never echoing the password)."""
    parts = [p for p in (s.strip() for s in url.split(_SEPARATOR)) if p]
    sentinels: list[tuple[str, int]] = []
    for i, part in enumerate(parts, 1):
        split = urlsplit(part)
        where = f"{settings.REDIS_URL.env}, Sentinel {i}"
        if split.scheme.lower() != SENTINEL_SCHEME or not split.hostname:
            raise ConfigError(f"{where}: every entry of a Sentinel list reads "
                              f"sentinel://[:password@]host[:port][/db]", field=settings.REDIS_URL.env)
        if split.query:
            raise ConfigError(f"{where}: a sentinel:// URL takes no ?options (TLS to the Sentinels "
                              f"or the master is not supported)", field=settings.REDIS_URL.env)
        try:
            port = split.port or _DEFAULT_SENTINEL_PORT
        except ValueError:
            raise ConfigError(f"{where}: the port is not a number", field=settings.REDIS_URL.env) from None
        sentinels.append((split.hostname, port))
    if not sentinels:
        raise ConfigError(f"{settings.REDIS_URL.env} lists no Sentinel", field=settings.REDIS_URL.env)
    first = urlsplit(parts[0])
    db_text = first.path.strip("/")
    if db_text and not db_text.isdigit():
        raise ConfigError(f"{settings.REDIS_URL.env}, Sentinel 1: the database is not a number",
                          field=settings.REDIS_URL.env)
    return SentinelUrl(sentinels=tuple(sentinels), db=int(db_text or 0),
                       username=unquote(first.username) if first.username else None,
                       password=unquote(first.password) if first.password else None)


def master_name(config: Mapping[str, Any] | None = None) -> str:
    """The monitored master's name, required with a sentinel:// URL."""
    name = settings.REDIS_SENTINEL_MASTER.get(config)
    if not name:
        raise ConfigError(f"{settings.REDIS_URL.env} names Redis Sentinels: set "
                          f"{settings.REDIS_SENTINEL_MASTER.env} to the master's name (the name "
                          f"in the Sentinels' `sentinel monitor` line)",
                          field=settings.REDIS_SENTINEL_MASTER.env)
    return name


def _sentinel_kwargs(socket_timeout: float | None, socket_connect_timeout: float | None,
                     config: Mapping[str, Any] | None) -> dict[str, Any]:
    """How to talk to the Sentinels themselves: bounded like the master, with their own
    password, and asked once each: the list is the retry, and redis-py's default retries
    (with backoff) would hold every master lookup ~4 s per Sentinel that is down. (`retry`
    None means no retry to redis-py; unlike a Retry object it is plain data, which Celery
    must be able to send in reply to `inspect conf`, as Flower asks.)"""
    kwargs: dict[str, Any] = {"retry": None}
    kwargs.update((k, v) for k, v in (("socket_timeout", socket_timeout),
                                      ("socket_connect_timeout", socket_connect_timeout))
                  if v is not None)
    password = settings.REDIS_SENTINEL_PASSWORD.get(config)
    if password:
        kwargs["password"] = password
    return kwargs


def connect(url: str, *, socket_timeout: float | None = None,
            socket_connect_timeout: float | None = None, config: Mapping[str, Any] | None = None,
            **kwargs: Any) -> redis.Redis:
    """A client of the Redis `url` names (plain, TLS or through Sentinels); `kwargs` are
    redis-py's (retry, health_check_interval, max_connections…); `config` is where the
    Sentinel settings are read (a Flask app's config), else the environment. Connects lazily."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                    socket_connect_timeout=socket_connect_timeout, **kwargs)
    parsed = parse_sentinel_url(url)
    sentinel = Sentinel(list(parsed.sentinels),
                        sentinel_kwargs=_sentinel_kwargs(socket_timeout, socket_connect_timeout, config),
                        socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout)
    return sentinel.master_for(master_name(config), redis_class=redis.Redis,
                               **parsed.master_kwargs(), **kwargs)


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is Redis refusing a write past its maxmemory (noeviction): as OOM from a
    plain command, inside a script's error reply from one of tailguard's Lua scripts."""
    return isinstance(exc, redis.OutOfMemoryError) or (
        isinstance(exc, redis.ResponseError) and "OOM command not allowed" in str(exc))


def celery_transport_options(url: str, timeout_s: float,
                             config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What Celery's broker and result backend transport options need for `url`: for a
    Sentinel list, the master's name and how to reach the Sentinels; nothing otherwise."""
    if not is_sentinel(url):
        return {}
    return {"master_name": master_name(config),
            "sentinel_kwargs": _sentinel_kwargs(timeout_s, timeout_s, config)}

