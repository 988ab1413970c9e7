"""Which lanes file `tailguard up` runs with: the one given, else the packaged one sized for
the host (lanes-cpu.toml without a GPU, lanes.toml with one), and it says which and why."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from tailguard import cli, settings
from tailguard.lanes.table import cpu_lanes_path, default_lanes_path, lanes_file_for_host, load_lanes

ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_host_gets_the_cpu_sized_file_and_is_told_why():
    path, why = lanes_file_for_host("cpu", "")
    assert path == cpu_lanes_path() and path.name == "lanes-cpu.toml"
    assert "no GPU" in why and settings.LANES_FILE.env in why
    assert load_lanes(path)["short"].max_num_seqs < load_lanes(default_lanes_path())["short"].max_num_seqs


def test_a_gpu_host_gets_the_packaged_default():
    assert lanes_file_for_host("cuda", "")[0] == default_lanes_path()
    assert lanes_file_for_host("cuda", None)[0].name == "lanes.toml"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_given_file_wins_on_any_host(device, tmp_path):
    given = tmp_path / "mine.toml"
    path, why = lanes_file_for_host(device, str(given))
    assert path == given and "given" in why


def test_the_wheel_ships_every_lanes_file():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    shipped = data["tool"]["setuptools"]["package-data"]["tailguard.lanes"]
    assert sorted(p.name for p in (ROOT / "tailguard" / "lanes").glob("*.toml")) == sorted(shipped)


def test_up_lanes_option_is_what_every_process_reads(monkeypatch, tmp_path):
    import tailguard.launch.supervisor as supervisor

    lanes = tmp_path / "lanes.toml"
    lanes.write_text(default_lanes_path().read_text())
    seen = {}

    def fake_run_up(binds):
        seen["lanes"] = settings.LANES_FILE.get()
        return 0

    monkeypatch.setenv(settings.LANES_FILE.env, "")  # undone after the test, which the command sets
    monkeypatch.setattr(supervisor, "run_up", fake_run_up)
    monkeypatch.setattr(supervisor, "check_ports", lambda *_: None)
    result = CliRunner().invoke(cli.main, ["up", "--lanes", str(lanes)])
    assert result.exit_code == 0, result.output
    assert seen["lanes"] == str(lanes.resolve())
