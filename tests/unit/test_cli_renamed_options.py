"""One name per meaning on the command line: the address is `--host` for `tailguard api`,
`flower` and `up` alike; `--bind` and `--address`, its old names, still work for one release,
hidden from --help and with a note."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from tailguard import cli


@pytest.mark.parametrize("command", ["api", "flower", "up"])
def test_every_command_names_the_address_host(command):
    out = CliRunner().invoke(cli.main, [command, "--help"]).output
    assert "--host" in out and "--bind" not in out and "--address" not in out


def test_flowers_old_address_option_still_sets_it_with_a_note(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setenv("TAILGUARD_HOME", str(tmp_path))
    monkeypatch.setattr(cli, "become", lambda argv, env=None, **_: seen.setdefault("argv", argv))
    result = CliRunner().invoke(cli.main, ["flower", "--address", "10.1.2.3"])
    assert "--address is now --host" in result.output
    assert "--address=10.1.2.3" in seen["argv"]


def test_the_apis_old_bind_option_still_sets_it_with_a_note(monkeypatch):
    """Open mode on a non-loopback address refuses to start: the address was taken."""
    monkeypatch.setenv("TAILGUARD_API_AUTH", "open")
    monkeypatch.delenv("TAILGUARD_API_OPEN", raising=False)
    result = CliRunner().invoke(cli.main, ["api", "--bind", "10.1.2.3"])
    assert "--bind is now --host" in result.output
    assert result.exit_code != 0 and "10.1.2.3" in result.output
