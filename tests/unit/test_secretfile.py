"""Generated secrets: made once, mode 600 from the moment the file exists."""

import stat

from tailguard.host.redis_server import DISABLED_COMMANDS, redis_command, redis_config
from tailguard.host.secrets import kept_secret, write_private


def test_a_secret_is_made_once_with_mode_600(tmp_path):
    path = tmp_path / "redis.password"
    first = kept_secret(path)
    assert len(first) >= 24 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert kept_secret(path, lambda: "other") == first  # kept, never remade


def test_an_existing_secret_is_read_not_replaced(tmp_path):
    path = tmp_path / "flower.auth"
    path.write_text("admin:given\n")
    assert kept_secret(path, lambda: "admin:new") == "admin:given"


def test_redis_config_disables_commands_bounds_memory_and_holds_the_password():
    text = redis_config("s3cret", "64mb")
    for name in ("CONFIG", "MODULE", "DEBUG"):
        assert name in DISABLED_COMMANDS and f'rename-command {name} ""' in text
    assert "maxmemory 64mb" in text and "maxmemory-policy noeviction" in text
    assert "requirepass s3cret" in text
    assert "requirepass" not in redis_config(None, "64mb")


def test_the_password_is_never_on_redis_servers_command_line(tmp_path):
    argv = redis_command(6390, tmp_path, password="s3cret")
    assert not any("s3cret" in a for a in argv)
    conf = tmp_path / "redis.conf"
    assert argv[1] == str(conf) and "requirepass s3cret" in conf.read_text()
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600


def test_redis_listens_on_loopback_unless_given_addresses(tmp_path):
    def bound(argv: list[str]) -> list[str]:
        i = argv.index("--bind")
        return argv[i + 1:argv.index("--dir")]

    assert bound(redis_command(6390, tmp_path)) == ["127.0.0.1"]
    assert bound(redis_command(6390, tmp_path, bind=("10.231.7.1", "10.231.7.5"))) == [
        "10.231.7.1", "10.231.7.5"]


def test_a_private_file_is_replaced_whole_with_mode_600(tmp_path):
    path = tmp_path / "redis.conf"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600
