"""tailguard.redis.client: which client each URL spelling builds, with nothing connected.
(tests/integration/test_sentinel_on_redis.py runs the Sentinel case against real servers.)"""

import json
import os
import ssl
import subprocess
import sys

import pytest
import redis
from conftest import ROOT
from redis.sentinel import SentinelConnectionPool

from tailguard import settings
from tailguard.errors import ConfigError
from tailguard.redis.client import (
    celery_transport_options,
    connect,
    is_sentinel,
    parse_sentinel_url,
)

SENTINELS = {settings.REDIS_SENTINEL_MASTER.env: "mymaster",
             settings.REDIS_SENTINEL_PASSWORD.env: "sentinel-pw"}


def test_a_kombu_sentinel_list_parses_to_its_sentinels_and_the_masters_login():
    parsed = parse_sentinel_url("sentinel://:p%40ss@10.0.0.1:26379/2; sentinel://:p%40ss@10.0.0.2;"
                                "sentinel://10.0.0.3:26380")
    assert parsed.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380))
    assert parsed.master_kwargs() == {"db": 2, "username": None, "password": "p@ss"}
    assert parse_sentinel_url("sentinel://user:pw@h").master_kwargs() == {
        "db": 0, "username": "user", "password": "pw"}


@pytest.mark.parametrize("url", ["sentinel://h:1;redis://h:2", "sentinel://", "sentinel://h:x",
                                 "sentinel://h/zero", ";", "sentinel://h:1?ssl_cert_reqs=required"])
def test_a_malformed_sentinel_list_is_a_config_error(url):
    with pytest.raises(ConfigError) as err:
        parse_sentinel_url(url.replace("sentinel://h", "sentinel://:s3cret@h"))
    assert err.value.field == settings.REDIS_URL.env
    assert "s3cret" not in err.value.message


@pytest.mark.parametrize("url, sentinel", [("sentinel://h:26379", True), ("SENTINEL://h", True),
                                           ("redis://h:6379/0", False), ("rediss://h", False)])
def test_is_sentinel(url, sentinel):
    assert is_sentinel(url) is sentinel


def test_redis_url_keeps_the_timeouts_it_is_given():
    client = connect("redis://:pw@10.0.0.1:6380/3", socket_timeout=2.5, socket_connect_timeout=1.5)
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.Connection
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("10.0.0.1", 6380, 3, "pw")
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.5, 1.5)


def test_rediss_url_reads_its_ssl_options():
    client = connect("rediss://:pw@redis.internal:6380/0?ssl_cert_reqs=required"
                     "&ssl_ca_certs=/etc/tailguard/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem",
                     socket_timeout=3, socket_connect_timeout=3)
    assert client.connection_pool.connection_class is redis.SSLConnection
    connection = client.connection_pool.make_connection()  # built, not connected
    assert connection.cert_reqs == ssl.CERT_REQUIRED
    assert (connection.ca_certs, connection.certfile, connection.keyfile) == (
        "/etc/tailguard/ca.pem", "/c.pem", "/k.pem")
    assert connection.socket_timeout == 3


def test_sentinel_url_builds_a_master_client_through_the_sentinels():
    client = connect("sentinel://:master-pw@10.0.0.1:26379/1;sentinel://:master-pw@10.0.0.2:26379",
                     socket_timeout=3, socket_connect_timeout=2, config=SENTINELS,
                     max_connections=50, health_check_interval=30)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "mymaster" and pool.max_connections == 50
    kwargs = pool.connection_kwargs
    assert (kwargs["password"], kwargs["db"], kwargs["socket_timeout"]) == ("master-pw", 1, 3)
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
            for s in sentinels] == [("10.0.0.1", 26379), ("10.0.0.2", 26379)]
    sentinel_kwargs = sentinels[0].connection_pool.connection_kwargs
    assert sentinel_kwargs["password"] == "sentinel-pw"
    assert (sentinel_kwargs["socket_timeout"], sentinel_kwargs["socket_connect_timeout"]) == (3, 2)
    # a dead Sentinel is skipped at once
    assert sentinels[0].connection_pool.make_connection().retry.get_retries() == 0


def test_a_sentinel_url_without_a_master_name_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        connect("sentinel://h:26379", config={settings.REDIS_SENTINEL_MASTER.env: ""})
    assert err.value.field == settings.REDIS_SENTINEL_MASTER.env


def test_celery_gets_the_master_name_only_for_a_sentinel_url():
    assert celery_transport_options("redis://h:6379/0", 3.0, SENTINELS) == {}
    assert celery_transport_options("rediss://h:6380/0?ssl_cert_reqs=required", 3.0, SENTINELS) == {}
    options = celery_transport_options("sentinel://h:26379", 3.0, SENTINELS)
    assert options["master_name"] == "mymaster"
    assert options["sentinel_kwargs"]["password"] == "sentinel-pw"
    assert options["sentinel_kwargs"]["socket_timeout"] == 3.0
    json.dumps(options)  # plain data: a worker sends its settings to `celery inspect conf` (Flower)


def test_celeryconfig_gives_broker_and_backend_the_master_name():
    """celeryconfig reads the environment at import: a fresh process with a Sentinel URL."""
    env = {**os.environ, settings.REDIS_URL.env: "sentinel://:pw@h1:26379;sentinel://:pw@h2:26379",
           **SENTINELS}
    out = subprocess.run(
        [sys.executable, "-c", ("import json, celeryconfig as c; print(json.dumps(["
                                "c.broker_url, c.result_backend, "
                                "c.broker_transport_options['master_name'], "
                                "c.result_backend_transport_options['master_name'], "
                                "c.broker_transport_options['visibility_timeout']]))")],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    broker, backend, broker_master, backend_master, visibility = json.loads(out)
    assert broker == backend == env[settings.REDIS_URL.env]
    assert broker_master == backend_master == "mymaster"
    assert visibility > 0  # the Sentinel options join the others, replace none
