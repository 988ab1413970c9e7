"""Where `tailguard up` listens (tailguard/launch/supervisor.py's Binds), and the check of
every port before anything starts: a port given twice, or held by another server, is one
ConfigError naming the server, the setting and the option that move it."""

from __future__ import annotations

import socket

import pytest

from tailguard.errors import ConfigError
from tailguard.host.redis_server import free_port, port_in_use
from tailguard.launch.supervisor import Binds, check_ports


@pytest.fixture
def listening():
    """A server of someone else's: a socket listening on a port of loopback."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_binds_come_from_the_settings_and_options_override_them(monkeypatch):
    for env, value in {"TAILGUARD_HOST": "0.0.0.0", "TAILGUARD_API_PORT": "8100",
                       "TAILGUARD_FLOWER_PORT": "5600", "TAILGUARD_REDIS_PORT": "6400",
                       "TAILGUARD_WORKER_METRICS_PORT": ""}.items():
        monkeypatch.setenv(env, value)
    assert Binds.from_settings() == Binds("0.0.0.0", 8100, 5600, 6400, 9101)
    assert Binds.from_settings(port=8200, host=None) == Binds("0.0.0.0", 8200, 5600, 6400, 9101)
    monkeypatch.setenv("TAILGUARD_WORKER_METRICS_PORT", "9300")
    assert Binds.from_settings().metrics_base == 9300


def test_metrics_port_0_is_off_under_up_as_for_a_worker(monkeypatch):
    """0 means off everywhere: `tailguard up` then checks no metrics port and tells each worker
    `--metrics-port 0`, which the worker reads as off (empty: 9101 + i under up)."""
    monkeypatch.setenv("TAILGUARD_WORKER_METRICS_PORT", "0")
    binds = Binds.from_settings()
    assert binds.metrics_base is None
    assert [it.what for it in binds.listeners(2, redis=False)] == ["the API", "Flower"]


def test_every_server_up_starts_is_checked_redis_only_when_embedded():
    binds = Binds("127.0.0.1", 8100, 5600, 6400, 9300)
    assert [(it.what, it.port) for it in binds.listeners(2, redis=True)] == [
        ("the API", 8100), ("Flower", 5600), ("the embedded redis-server", 6400),
        ("worker 0's metrics", 9300), ("worker 1's metrics", 9301)]
    assert "the embedded redis-server" not in [it.what for it in binds.listeners(2, redis=False)]


def test_a_port_given_twice_is_refused_naming_both():
    port = free_port()
    with pytest.raises(ConfigError, match=f"Flower and the API are both given port {port}"):
        check_ports(Binds("127.0.0.1", port, port, free_port()).listeners(0, redis=False))


def test_a_held_port_is_refused_naming_the_server_and_how_to_move_it(listening):
    assert port_in_use(listening) and not port_in_use(free_port())
    with pytest.raises(ConfigError) as err:
        check_ports(Binds("127.0.0.1", free_port(), free_port(), listening).listeners(0, redis=True))
    assert err.value.message == (
        f"the embedded redis-server cannot listen on 127.0.0.1:{listening}: another server holds "
        "that port. Choose a free one with TAILGUARD_REDIS_PORT (--redis-port), or set "
        "TAILGUARD_REDIS_URL to use that Redis instead.")
    assert err.value.field == "TAILGUARD_REDIS_PORT"


def test_free_ports_pass():
    check_ports(Binds("127.0.0.1", free_port(), free_port(), free_port(), free_port())
                .listeners(2, redis=True))
